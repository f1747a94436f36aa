//! `Reservation` and `OwnedReservation`: every method, every bad input, drop
//! (also while unwinding), and the `Send` / `'static` guarantees.
//!
//! The guard behaviour is the same for both types, so it is written once in
//! `guard_tests!` and instantiated for each; what differs (threads, `Arc`
//! lifetimes) has its own tests below.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc};
use std::thread;

use kvslots::{OwnedReservation, Reservation, ReserveError, SlotCounter};

mod common;
use common::{counter_snap, CounterSnap};

fn counter(capacity: usize) -> Arc<SlotCounter> {
    Arc::new(SlotCounter::new(capacity))
}

/// The shared guard tests; `$reserve` is `try_reserve` or
/// `try_reserve_owned`, `$name` the guard's type name as Debug prints it.
macro_rules! guard_tests {
    ($module:ident, $reserve:ident, $name:literal) => {
        mod $module {
            use super::*;

            #[test]
            fn len_is_empty_and_counter() {
                let c = counter(8);
                let r = c.$reserve(3).unwrap();
                assert_eq!(r.len(), 3);
                assert!(!r.is_empty());
                assert!(std::ptr::eq(r.counter(), &*c));
                assert_eq!(r.counter().used(), 3);
                let e = c.$reserve(0).unwrap();
                assert_eq!(e.len(), 0);
                assert!(e.is_empty());
                assert!(std::ptr::eq(e.counter(), &*c));
            }

            #[test]
            fn drop_returns_the_slots() {
                let c = counter(8);
                let a = c.$reserve(3).unwrap();
                let b = c.$reserve(5).unwrap();
                assert_eq!(c.used(), 8);
                drop(a);
                assert_eq!(c.used(), 5);
                drop(b);
                assert_eq!(c.used(), 0);
                assert_eq!(c.peak_used(), 8);
                // And the slots can be taken again, all of them.
                let again = c.$reserve(8).unwrap();
                assert_eq!(again.len(), 8);
            }

            #[test]
            fn split_moves_counts_only() {
                let c = counter(8);
                let mut r = c.$reserve(5).unwrap();
                let before = counter_snap(&c);
                let part = r.split(2).unwrap();
                assert_eq!((r.len(), part.len()), (3, 2));
                assert!(std::ptr::eq(part.counter(), &*c));
                assert_eq!(counter_snap(&c), before);
                drop(part);
                assert_eq!(c.used(), 3);
                drop(r);
                assert_eq!(c.used(), 0);
            }

            #[test]
            fn split_more_than_len_is_none_and_changes_nothing() {
                let c = counter(8);
                let mut r = c.$reserve(5).unwrap();
                let before = counter_snap(&c);
                for n in [6, 8, 9, usize::MAX] {
                    assert!(r.split(n).is_none(), "split({n})");
                    assert_eq!(r.len(), 5, "split({n}) changed the guard");
                    assert_eq!(counter_snap(&c), before, "split({n}) changed the counter");
                }
                let mut empty = c.$reserve(0).unwrap();
                assert!(empty.split(1).is_none());
                assert!(empty.is_empty());
                assert_eq!(counter_snap(&c), before);
            }

            #[test]
            fn split_zero_and_split_len() {
                let c = counter(8);
                let mut r = c.$reserve(5).unwrap();
                let before = counter_snap(&c);
                let none = r.split(0).unwrap();
                assert!(none.is_empty());
                assert_eq!(r.len(), 5);
                drop(none);
                assert_eq!(counter_snap(&c), before);

                let all = r.split(5).unwrap();
                assert_eq!((r.len(), all.len()), (0, 5));
                assert!(r.is_empty());
                assert_eq!(counter_snap(&c), before);
                drop(r);
                assert_eq!(c.used(), 5);
                drop(all);
                assert_eq!(c.used(), 0);
            }

            #[test]
            fn merge_moves_counts_only() {
                let c = counter(8);
                let mut a = c.$reserve(2).unwrap();
                let b = c.$reserve(3).unwrap();
                let before = counter_snap(&c);
                a.merge(b);
                assert_eq!(a.len(), 5);
                assert_eq!(counter_snap(&c), before);
                a.merge(c.$reserve(0).unwrap());
                assert_eq!(a.len(), 5);
                let mut empty = c.$reserve(0).unwrap();
                empty.merge(a);
                assert_eq!(empty.len(), 5);
                assert_eq!(counter_snap(&c), before);
                drop(empty);
                assert_eq!(c.used(), 0);
            }

            #[test]
            fn split_then_merge_round_trips() {
                let c = counter(16);
                let mut r = c.$reserve(10).unwrap();
                let mut parts: Vec<_> = (0..4).map(|_| r.split(2).unwrap()).collect();
                assert_eq!(r.len(), 2);
                assert_eq!(c.used(), 10);
                for p in parts.drain(..) {
                    r.merge(p);
                }
                assert_eq!(r.len(), 10);
                assert_eq!(c.used(), 10);
                drop(r);
                assert_eq!(c.used(), 0);
            }

            #[test]
            #[should_panic(expected = "cannot merge reservations from different counters")]
            fn merge_across_counters_panics() {
                let c1 = counter(8);
                let c2 = counter(8);
                let mut a = c1.$reserve(2).unwrap();
                let b = c2.$reserve(3).unwrap();
                a.merge(b);
            }

            #[test]
            fn merge_across_counters_panics_without_corrupting_either_counter() {
                let c1 = counter(8);
                let c2 = counter(8);
                let mut a = c1.$reserve(2).unwrap();
                let b = c2.$reserve(3).unwrap();
                let (before1, before2) = (counter_snap(&c1), counter_snap(&c2));
                assert_eq!((before1.used, before2.used), (2, 3));

                let result = catch_unwind(AssertUnwindSafe(|| a.merge(b)));
                let payload = result.unwrap_err();
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap();
                assert_eq!(msg, "cannot merge reservations from different counters");

                // `self` is untouched and still holds its slots.
                assert_eq!(a.len(), 2);
                assert!(std::ptr::eq(a.counter(), &*c1));
                assert_eq!(counter_snap(&c1), before1);
                // `other` was moved into `merge`, so the unwind dropped it:
                // its slots went back to its own counter exactly once.
                assert_eq!(
                    counter_snap(&c2),
                    CounterSnap {
                        used: 0,
                        available: 8,
                        ..before2
                    }
                );
                // `a` still drops cleanly, into its own counter only.
                drop(a);
                assert_eq!(c1.used(), 0);
                assert_eq!(c2.used(), 0);
                // Both counters are whole again.
                assert_eq!(c1.admit(8), 8);
                assert_eq!(c2.admit(8), 8);
                c1.release(8).unwrap();
                c2.release(8).unwrap();
            }

            #[test]
            fn shrink_to_gives_back_the_excess_and_never_grows() {
                let c = counter(8);
                let mut r = c.$reserve(5).unwrap();
                r.shrink_to(3);
                assert_eq!((r.len(), c.used()), (3, 3));
                let before = counter_snap(&c);
                for len in [3, 4, 8, 100, usize::MAX] {
                    r.shrink_to(len);
                    assert_eq!(r.len(), 3, "shrink_to({len}) grew the guard");
                    assert_eq!(
                        counter_snap(&c),
                        before,
                        "shrink_to({len}) changed the counter"
                    );
                }
                r.shrink_to(0);
                assert!(r.is_empty());
                assert_eq!(c.used(), 0);
                assert_eq!(c.peak_used(), 5);
                drop(r);
                assert_eq!(c.used(), 0);
            }

            #[test]
            fn shrink_frees_slots_for_others_at_once() {
                // Speculative rollback: 4 drafts rejected, another sequence
                // can take them immediately.
                let c = counter(8);
                let mut r = c.$reserve(8).unwrap();
                assert!(c.$reserve(4).is_err());
                r.shrink_to(4);
                let other = c.$reserve(4).unwrap();
                assert_eq!((r.len(), other.len(), c.used()), (4, 4, 8));
            }

            #[test]
            fn try_grow_is_all_or_nothing() {
                let c = counter(8);
                let mut r = c.$reserve(3).unwrap();
                r.try_grow(2).unwrap();
                assert_eq!((r.len(), c.used(), c.peak_used()), (5, 5, 5));
                assert_eq!(r.try_grow(0), Ok(()));
                assert_eq!((r.len(), c.used()), (5, 5));
                r.try_grow(3).unwrap();
                assert_eq!((r.len(), c.used(), c.available()), (8, 8, 0));
                drop(r);
                assert_eq!(c.used(), 0);
            }

            #[test]
            fn try_grow_full_changes_nothing() {
                let c = counter(8);
                let mut r = c.$reserve(3).unwrap();
                let _other = c.$reserve(2).unwrap();
                let before = counter_snap(&c);
                // 3 free: 4 do not fit, and nothing is taken.
                assert_eq!(
                    r.try_grow(4),
                    Err(ReserveError::Full {
                        requested: 4,
                        available: 3
                    })
                );
                assert_eq!(r.len(), 3);
                assert_eq!(counter_snap(&c), before);
                // 3 do.
                r.try_grow(3).unwrap();
                assert_eq!((r.len(), c.used()), (6, 8));
            }

            #[test]
            fn try_grow_never_fits_changes_nothing() {
                let c = counter(8);
                let mut r = c.$reserve(3).unwrap();
                let before = counter_snap(&c);
                for n in [9, 100, usize::MAX >> 1, usize::MAX] {
                    assert_eq!(
                        r.try_grow(n),
                        Err(ReserveError::NeverFits {
                            requested: n,
                            capacity: 8
                        }),
                        "try_grow({n})"
                    );
                    assert_eq!(r.len(), 3, "try_grow({n}) changed the guard");
                    assert_eq!(
                        counter_snap(&c),
                        before,
                        "try_grow({n}) changed the counter"
                    );
                }
            }

            #[test]
            fn try_grow_closed_changes_nothing() {
                let c = counter(8);
                let mut r = c.$reserve(3).unwrap();
                c.close();
                let before = counter_snap(&c);
                for n in [0, 1, 5] {
                    assert_eq!(r.try_grow(n), Err(ReserveError::Closed), "try_grow({n})");
                    assert_eq!(r.len(), 3);
                    assert_eq!(counter_snap(&c), before);
                }
                drop(r);
                assert_eq!(c.used(), 0);
            }

            #[test]
            fn try_grow_may_use_the_headroom() {
                let c = counter(10);
                let mut running = c.$reserve(4).unwrap();
                let _new = c.try_reserve_with_headroom(4, 2).unwrap();
                // New sequences are held off by the watermark...
                assert!(c.try_reserve_with_headroom(1, 2).is_err());
                // ...but a running one can still grow into it.
                running.try_grow(2).unwrap();
                assert_eq!(c.used(), 10);
            }

            #[test]
            fn forget_then_release() {
                let c = counter(8);
                let r = c.$reserve(3).unwrap();
                let n = r.forget();
                assert_eq!(n, 3);
                assert_eq!(c.used(), 3);
                c.release(n).unwrap();
                assert_eq!(c.used(), 0);
                // Forgetting an empty guard keeps nothing.
                assert_eq!(c.$reserve(0).unwrap().forget(), 0);
                assert_eq!(c.used(), 0);
            }

            #[test]
            fn forget_after_split_keeps_only_its_part() {
                let c = counter(8);
                let mut r = c.$reserve(6).unwrap();
                let part = r.split(2).unwrap();
                assert_eq!(part.forget(), 2);
                drop(r);
                assert_eq!(c.used(), 2);
                // Releasing more than was kept is refused.
                assert!(c.release(3).is_err());
                assert_eq!(c.used(), 2);
                c.release(2).unwrap();
                assert_eq!(c.used(), 0);
            }

            #[test]
            fn drop_while_unwinding_returns_the_slots() {
                let c = counter(8);
                let result = catch_unwind(AssertUnwindSafe(|| {
                    let mut r = c.$reserve(5).unwrap();
                    let part = r.split(2).unwrap();
                    let mut grown = c.$reserve(1).unwrap();
                    grown.try_grow(2).unwrap();
                    assert_eq!(c.used(), 8);
                    let _held = (r, part, grown);
                    panic!("worker crashed while holding slots");
                }));
                assert!(result.is_err());
                assert_eq!(c.used(), 0);
                assert_eq!(c.peak_used(), 8);
                assert_eq!(c.$reserve(8).unwrap().len(), 8);
            }

            #[test]
            fn debug_shows_len_and_counter() {
                let c = counter(8);
                let r = c.$reserve(3).unwrap();
                let s = format!("{r:?}");
                for part in [$name, "len: 3", "SlotCounter", "capacity: 8", "used: 3"] {
                    assert!(s.contains(part), "{s:?} lacks {part:?}");
                }
            }
        }
    };
}

guard_tests!(borrowed, try_reserve, "Reservation");
guard_tests!(owned, try_reserve_owned, "OwnedReservation");

// ---------------------------------------------------------------------------
// Send, 'static, threads
// ---------------------------------------------------------------------------

fn assert_send<T: Send>() {}
fn assert_sync<T: Sync>() {}
fn assert_static<T: 'static>() {}

#[test]
fn guards_are_send_and_owned_is_static() {
    assert_send::<Reservation<'static>>();
    assert_send::<OwnedReservation>();
    assert_static::<OwnedReservation>();
    assert_send::<SlotCounter>();
    assert_sync::<SlotCounter>();
    assert_send::<Arc<SlotCounter>>();
}

#[test]
fn owned_reservation_moves_across_threads() {
    let c = counter(32);
    let (tx, rx) = mpsc::channel::<OwnedReservation>();
    // The consumer thread receives guards taken on this thread and drops
    // them there.
    let consumer = thread::spawn(move || {
        let mut total = 0;
        for mut r in rx {
            total += r.len();
            if r.len() > 1 {
                r.shrink_to(1);
            }
        }
        total
    });
    for n in 1..=6 {
        tx.send(c.try_reserve_owned(n).unwrap()).unwrap();
    }
    drop(tx);
    assert_eq!(consumer.join().unwrap(), 21);
    assert_eq!(c.used(), 0);
    assert_eq!(Arc::strong_count(&c), 1);
}

#[test]
fn owned_reservation_outlives_the_callers_arc() {
    let c = counter(8);
    let weak = Arc::downgrade(&c);
    let mut r = c.try_reserve_owned(5).unwrap();
    drop(c);
    // The guard keeps the counter alive.
    assert_eq!(r.counter().used(), 5);
    r.try_grow(3).unwrap();
    let handle = thread::spawn(move || {
        assert_eq!(r.counter().used(), 8);
        r.shrink_to(2);
        assert_eq!(r.counter().used(), 2);
    });
    handle.join().unwrap();
    // Its last owner gone, the counter is freed.
    assert!(weak.upgrade().is_none());
}

#[test]
fn borrowed_reservation_moves_into_scoped_threads() {
    let c = SlotCounter::new(16);
    let mut whole = c.try_reserve(12).unwrap();
    let parts: Vec<Reservation<'_>> = (0..4).map(|_| whole.split(3).unwrap()).collect();
    assert!(whole.is_empty());
    thread::scope(|s| {
        for mut part in parts {
            s.spawn(move || {
                assert_eq!(part.len(), 3);
                part.shrink_to(1);
            });
        }
    });
    assert_eq!(c.used(), 0);
}

#[test]
fn thread_panicking_with_owned_guards_leaks_nothing() {
    let c = counter(16);
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let c = Arc::clone(&c);
            thread::spawn(move || {
                let mut r = c.try_reserve_owned(2).unwrap();
                r.try_grow(1).unwrap();
                let _part = r.split(1).unwrap();
                if i % 2 == 0 {
                    panic!("worker {i} crashed");
                }
                r.len()
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
    assert_eq!(results.iter().filter(|r| r.is_err()).count(), 2);
    assert!(results.iter().flatten().all(|&len| len == 2));
    assert_eq!(c.used(), 0);
    assert_eq!(Arc::strong_count(&c), 1);
}
