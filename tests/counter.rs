//! Every `SlotCounter` method, and every bad input: each refusal is checked
//! for its typed error AND for leaving the counter's state unchanged.

use std::collections::HashSet;
use std::error::Error;
use std::sync::Arc;

use kvslots::{ReleaseError, ReserveError, SlotCounter};

mod common;
use common::{counter_snap, CounterSnap};

/// Asserts that `try_reserve(n)` refuses with `expected` and that the
/// counter's state did not change.
fn assert_reserve_refused(c: &SlotCounter, n: usize, expected: ReserveError) {
    let before = counter_snap(c);
    assert_eq!(c.try_reserve(n).unwrap_err(), expected, "try_reserve({n})");
    assert_eq!(
        counter_snap(c),
        before,
        "a refused try_reserve({n}) changed the state"
    );
}

/// A counter of `capacity` with `used` slots taken (by `admit`) and a peak of
/// `peak` (reached by admitting `peak - used` more and releasing them).
fn counter_with(capacity: usize, used: usize, peak: usize) -> SlotCounter {
    assert!(used <= peak && peak <= capacity);
    let c = SlotCounter::new(capacity);
    if peak > 0 {
        assert_eq!(c.admit(peak as isize), peak);
    }
    c.release(peak - used).unwrap();
    assert_eq!((c.used(), c.peak_used()), (used, peak));
    c
}

// ---------------------------------------------------------------------------
// new, capacity, used, available, peak_used
// ---------------------------------------------------------------------------

#[test]
fn new_starts_empty_and_open() {
    for capacity in [0, 1, 2, 16, 4096, SlotCounter::MAX_CAPACITY] {
        let c = SlotCounter::new(capacity);
        assert_eq!(
            counter_snap(&c),
            CounterSnap {
                capacity,
                used: 0,
                available: capacity,
                peak_used: 0,
                closed: false,
            }
        );
    }
}

#[test]
fn max_capacity_is_one_bit_less_than_usize() {
    // Documented: the count shares its word with the closed flag.
    assert_eq!(SlotCounter::MAX_CAPACITY, usize::MAX >> 1);
    let c = SlotCounter::new(SlotCounter::MAX_CAPACITY);
    assert_eq!(c.capacity(), SlotCounter::MAX_CAPACITY);
}

#[test]
#[should_panic(expected = "exceeds MAX_CAPACITY")]
fn new_above_max_capacity_panics() {
    let _ = SlotCounter::new(SlotCounter::MAX_CAPACITY + 1);
}

#[test]
#[should_panic(expected = "SlotCounter capacity 18446744073709551615 exceeds MAX_CAPACITY")]
#[cfg(target_pointer_width = "64")]
fn new_usize_max_panics_with_the_capacity_in_the_message() {
    let _ = SlotCounter::new(usize::MAX);
}

#[test]
fn used_available_and_peak_track_admissions_and_releases() {
    let c = SlotCounter::new(10);
    assert_eq!(c.admit(4), 4);
    assert_eq!((c.used(), c.available(), c.peak_used()), (4, 6, 4));
    assert_eq!(c.admit(3), 3);
    assert_eq!((c.used(), c.available(), c.peak_used()), (7, 3, 7));
    c.release(5).unwrap();
    // The peak is a high-water mark: releasing does not lower it.
    assert_eq!((c.used(), c.available(), c.peak_used()), (2, 8, 7));
    assert_eq!(c.admit(2), 2);
    assert_eq!(c.peak_used(), 7);
    assert_eq!(c.admit(6), 6);
    assert_eq!((c.used(), c.available(), c.peak_used()), (10, 0, 10));
    c.release(10).unwrap();
    assert_eq!(counter_snap(&c).used, 0);
    assert_eq!(c.peak_used(), 10);
}

#[test]
fn peak_follows_guards_too() {
    let c = SlotCounter::new(10);
    let a = c.try_reserve(3).unwrap();
    let mut b = c.try_reserve_with_headroom(2, 1).unwrap();
    assert_eq!(c.peak_used(), 5);
    b.try_grow(4).unwrap();
    assert_eq!(c.peak_used(), 9);
    drop((a, b));
    assert_eq!((c.used(), c.peak_used()), (0, 9));
}

// ---------------------------------------------------------------------------
// admit
// ---------------------------------------------------------------------------

#[test]
fn admit_takes_whole_requests() {
    let c = SlotCounter::new(8);
    assert_eq!(c.admit(1), 1);
    assert_eq!(c.admit(7), 7);
    assert_eq!(c.used(), 8);
    c.release(8).unwrap();
}

#[test]
fn admit_bad_inputs_return_zero_and_change_nothing() {
    for request in [
        0,
        -1,
        -5,
        isize::MIN,
        9, // > capacity
        6, // > available (5 free), <= capacity
        isize::MAX,
    ] {
        let c = counter_with(8, 3, 6);
        let before = counter_snap(&c);
        assert_eq!(c.admit(request), 0, "admit({request})");
        assert_eq!(
            counter_snap(&c),
            before,
            "admit({request}) changed the state"
        );
    }
}

#[test]
fn admit_refuses_one_short_not_partially() {
    let c = counter_with(4, 2, 2);
    let before = counter_snap(&c);
    assert_eq!(c.admit(3), 0);
    assert_eq!(counter_snap(&c), before);
    assert_eq!(c.admit(2), 2);
}

// ---------------------------------------------------------------------------
// release
// ---------------------------------------------------------------------------

#[test]
fn release_gives_back() {
    let c = counter_with(8, 5, 5);
    c.release(2).unwrap();
    assert_eq!((c.used(), c.available()), (3, 5));
    c.release(3).unwrap();
    assert_eq!(c.used(), 0);
}

#[test]
fn release_zero_is_a_no_op() {
    let c = counter_with(8, 3, 6);
    let before = counter_snap(&c);
    assert_eq!(c.release(0), Ok(()));
    assert_eq!(counter_snap(&c), before);
    let empty = SlotCounter::new(0);
    assert_eq!(empty.release(0), Ok(()));
    assert_eq!(empty.used(), 0);
}

#[test]
fn over_release_is_refused_and_changes_nothing() {
    for n in [4, 5, 8, 9, usize::MAX, usize::MAX >> 1] {
        let c = counter_with(8, 3, 6);
        let before = counter_snap(&c);
        assert_eq!(
            c.release(n),
            Err(ReleaseError::ExceedsUsed {
                released: n,
                used: 3
            }),
            "release({n})"
        );
        assert_eq!(counter_snap(&c), before, "release({n}) changed the state");
    }
}

#[test]
fn release_on_empty_counter_is_refused() {
    let c = counter_with(8, 0, 4);
    let before = counter_snap(&c);
    assert_eq!(
        c.release(1),
        Err(ReleaseError::ExceedsUsed {
            released: 1,
            used: 0
        })
    );
    assert_eq!(counter_snap(&c), before);
}

#[test]
fn double_release_is_refused_and_changes_nothing() {
    let c = SlotCounter::new(8);
    let n = c.try_reserve(3).unwrap().forget();
    c.release(n).unwrap();
    let before = counter_snap(&c);
    assert_eq!(
        c.release(n),
        Err(ReleaseError::ExceedsUsed {
            released: 3,
            used: 0
        })
    );
    assert_eq!(counter_snap(&c), before);
}

#[test]
fn release_works_on_a_closed_counter() {
    let c = counter_with(8, 5, 5);
    c.close();
    c.release(2).unwrap();
    assert_eq!((c.used(), c.available()), (3, 5));
    assert!(c.is_closed());
    c.release(3).unwrap();
    assert_eq!(c.used(), 0);
    assert!(c.is_closed());
}

#[test]
fn over_release_on_a_closed_counter_is_refused_and_changes_nothing() {
    let c = counter_with(8, 3, 3);
    c.close();
    let before = counter_snap(&c);
    assert_eq!(
        c.release(4),
        Err(ReleaseError::ExceedsUsed {
            released: 4,
            used: 3
        })
    );
    assert_eq!(
        c.release(usize::MAX),
        Err(ReleaseError::ExceedsUsed {
            released: usize::MAX,
            used: 3
        })
    );
    assert_eq!(counter_snap(&c), before);
    assert!(c.is_closed());
}

// ---------------------------------------------------------------------------
// try_reserve
// ---------------------------------------------------------------------------

#[test]
fn try_reserve_takes_whole_requests() {
    let c = SlotCounter::new(8);
    let a = c.try_reserve(5).unwrap();
    assert_eq!(a.len(), 5);
    assert_eq!(c.used(), 5);
    let b = c.try_reserve(3).unwrap();
    assert_eq!(b.len(), 3);
    assert_eq!((c.used(), c.available(), c.peak_used()), (8, 0, 8));
    drop(a);
    assert_eq!(c.used(), 3);
    drop(b);
    assert_eq!(c.used(), 0);
}

#[test]
fn try_reserve_zero_is_ok_and_empty() {
    let c = counter_with(8, 3, 6);
    let before = counter_snap(&c);
    let r = c.try_reserve(0).unwrap();
    assert!(r.is_empty());
    assert_eq!(r.len(), 0);
    assert_eq!(counter_snap(&c), before);
    drop(r);
    assert_eq!(counter_snap(&c), before);
    // Also on a full counter.
    let full = counter_with(4, 4, 4);
    let before = counter_snap(&full);
    assert!(full.try_reserve(0).unwrap().is_empty());
    assert_eq!(counter_snap(&full), before);
}

#[test]
fn try_reserve_full_reports_the_real_free_count() {
    let c = counter_with(8, 5, 6);
    assert_reserve_refused(
        &c,
        4,
        ReserveError::Full {
            requested: 4,
            available: 3,
        },
    );
    // One free short.
    let c = counter_with(4, 2, 2);
    assert_reserve_refused(
        &c,
        3,
        ReserveError::Full {
            requested: 3,
            available: 2,
        },
    );
    // Full cache.
    let c = counter_with(4, 4, 4);
    assert_reserve_refused(
        &c,
        1,
        ReserveError::Full {
            requested: 1,
            available: 0,
        },
    );
}

#[test]
fn try_reserve_above_capacity_never_fits_and_changes_nothing() {
    for n in [9, 100, usize::MAX >> 1, usize::MAX] {
        let c = counter_with(8, 3, 6);
        let before = counter_snap(&c);
        assert_eq!(
            c.try_reserve(n).unwrap_err(),
            ReserveError::NeverFits {
                requested: n,
                capacity: 8
            },
            "try_reserve({n})"
        );
        assert_eq!(
            counter_snap(&c),
            before,
            "try_reserve({n}) changed the state"
        );
    }
}

#[test]
fn try_reserve_exactly_capacity_on_empty_counter() {
    let c = SlotCounter::new(8);
    let r = c.try_reserve(8).unwrap();
    assert_eq!((r.len(), c.available()), (8, 0));
}

// ---------------------------------------------------------------------------
// try_reserve_owned
// ---------------------------------------------------------------------------

#[test]
fn try_reserve_owned_takes_whole_requests() {
    let c = Arc::new(SlotCounter::new(8));
    let a = c.try_reserve_owned(6).unwrap();
    assert_eq!(a.len(), 6);
    assert_eq!(c.used(), 6);
    assert!(std::ptr::eq(a.counter(), &*c));
    // The guard holds a strong reference to the counter.
    assert_eq!(Arc::strong_count(&c), 2);
    drop(a);
    assert_eq!(c.used(), 0);
    assert_eq!(Arc::strong_count(&c), 1);
}

#[test]
fn try_reserve_owned_zero_is_ok_and_empty() {
    let c = Arc::new(counter_with(8, 3, 6));
    let before = counter_snap(&c);
    let r = c.try_reserve_owned(0).unwrap();
    assert!(r.is_empty());
    assert_eq!(counter_snap(&c), before);
    drop(r);
    assert_eq!(counter_snap(&c), before);
}

#[test]
fn try_reserve_owned_bad_inputs_change_nothing() {
    let c = Arc::new(counter_with(8, 5, 6));
    let before = counter_snap(&c);
    assert_eq!(
        c.try_reserve_owned(4).unwrap_err(),
        ReserveError::Full {
            requested: 4,
            available: 3
        }
    );
    assert_eq!(
        c.try_reserve_owned(9).unwrap_err(),
        ReserveError::NeverFits {
            requested: 9,
            capacity: 8
        }
    );
    assert_eq!(
        c.try_reserve_owned(usize::MAX).unwrap_err(),
        ReserveError::NeverFits {
            requested: usize::MAX,
            capacity: 8
        }
    );
    assert_eq!(counter_snap(&c), before);
    // A refusal creates no guard, so no extra strong reference either.
    assert_eq!(Arc::strong_count(&c), 1);
}

// ---------------------------------------------------------------------------
// try_reserve_with_headroom
// ---------------------------------------------------------------------------

#[test]
fn headroom_admits_when_n_plus_headroom_fit() {
    let c = SlotCounter::new(10);
    let a = c.try_reserve_with_headroom(6, 4).unwrap(); // 0 + 6 + 4 <= 10
    assert_eq!(a.len(), 6);
    assert_eq!(c.used(), 6);
    let b = c.try_reserve_with_headroom(2, 2).unwrap(); // 6 + 2 + 2 <= 10
    assert_eq!(b.len(), 2);
    assert_eq!(c.used(), 8);
    drop((a, b));
    assert_eq!(c.used(), 0);
}

#[test]
fn headroom_zero_behaves_like_try_reserve() {
    let c = counter_with(8, 5, 5);
    let before = counter_snap(&c);
    assert_eq!(
        c.try_reserve_with_headroom(4, 0).unwrap_err(),
        c.try_reserve(4).unwrap_err()
    );
    assert_eq!(counter_snap(&c), before);
    let r = c.try_reserve_with_headroom(3, 0).unwrap();
    assert_eq!((r.len(), c.used()), (3, 8));
}

#[test]
fn headroom_full_reports_free_count_without_headroom() {
    let c = counter_with(10, 6, 6);
    let before = counter_snap(&c);
    // 4 free; 3 + 2 of headroom do not fit.
    assert_eq!(
        c.try_reserve_with_headroom(3, 2).unwrap_err(),
        ReserveError::Full {
            requested: 3,
            available: 4
        }
    );
    // Fits by one without headroom, refused with headroom 1.
    assert_eq!(
        c.try_reserve_with_headroom(4, 1).unwrap_err(),
        ReserveError::Full {
            requested: 4,
            available: 4
        }
    );
    assert_eq!(counter_snap(&c), before);
    // Plain try_reserve may use the headroom.
    let grow = c.try_reserve(4).unwrap();
    assert_eq!((grow.len(), c.used()), (4, 10));
}

#[test]
fn headroom_never_fits_when_n_plus_headroom_exceed_capacity() {
    for (n, headroom) in [
        (8, 3),
        (1, 10),
        (0, 11),
        (11, 0),
        (5, usize::MAX),
        (0, usize::MAX),
        (usize::MAX, 0),
        (usize::MAX, 1),
        (usize::MAX, usize::MAX),
        (usize::MAX >> 1, usize::MAX >> 1),
        ((usize::MAX >> 1) + 1, usize::MAX >> 1),
    ] {
        let c = counter_with(10, 2, 7);
        let before = counter_snap(&c);
        assert_eq!(
            c.try_reserve_with_headroom(n, headroom).unwrap_err(),
            ReserveError::NeverFits {
                requested: n,
                capacity: 10
            },
            "try_reserve_with_headroom({n}, {headroom})"
        );
        assert_eq!(
            counter_snap(&c),
            before,
            "try_reserve_with_headroom({n}, {headroom}) changed the state"
        );
    }
}

#[test]
fn headroom_never_fits_even_on_an_empty_counter() {
    // n + headroom == capacity + 1 on an empty counter: never admissible.
    let c = SlotCounter::new(10);
    let before = counter_snap(&c);
    assert_eq!(
        c.try_reserve_with_headroom(6, 5).unwrap_err(),
        ReserveError::NeverFits {
            requested: 6,
            capacity: 10
        }
    );
    assert_eq!(counter_snap(&c), before);
    // n + headroom == capacity exactly: admitted.
    let r = c.try_reserve_with_headroom(6, 4).unwrap();
    assert_eq!(r.len(), 6);
}

#[test]
fn headroom_with_zero_request() {
    let c = counter_with(10, 6, 6);
    let before = counter_snap(&c);
    // Nothing taken, but the watermark is still checked.
    assert!(c.try_reserve_with_headroom(0, 4).unwrap().is_empty());
    assert_eq!(counter_snap(&c), before);
    assert_eq!(
        c.try_reserve_with_headroom(0, 5).unwrap_err(),
        ReserveError::Full {
            requested: 0,
            available: 4
        }
    );
    assert_eq!(counter_snap(&c), before);
}

// ---------------------------------------------------------------------------
// close, is_closed, use after close
// ---------------------------------------------------------------------------

#[test]
fn close_sets_the_flag_and_is_idempotent() {
    let c = counter_with(8, 3, 5);
    assert!(!c.is_closed());
    c.close();
    assert!(c.is_closed());
    let after_first = counter_snap(&c);
    assert_eq!(
        after_first,
        CounterSnap {
            capacity: 8,
            used: 3,
            available: 5,
            peak_used: 5,
            closed: true
        }
    );
    c.close();
    assert_eq!(counter_snap(&c), after_first);
}

#[test]
fn admit_after_close_returns_zero_and_changes_nothing() {
    let c = counter_with(8, 3, 5);
    c.close();
    let before = counter_snap(&c);
    for request in [1, 5, 0, -1, 9, isize::MAX, isize::MIN] {
        assert_eq!(c.admit(request), 0, "admit({request}) after close");
    }
    assert_eq!(counter_snap(&c), before);
}

#[test]
fn reserve_after_close_is_closed_and_changes_nothing() {
    let c = Arc::new(counter_with(8, 3, 5));
    c.close();
    let before = counter_snap(&c);
    for n in [0, 1, 5, 6] {
        assert_eq!(
            c.try_reserve(n).unwrap_err(),
            ReserveError::Closed,
            "try_reserve({n})"
        );
        assert_eq!(
            c.try_reserve_owned(n).unwrap_err(),
            ReserveError::Closed,
            "try_reserve_owned({n})"
        );
        assert_eq!(
            c.try_reserve_with_headroom(n, 1).unwrap_err(),
            ReserveError::Closed,
            "try_reserve_with_headroom({n}, 1)"
        );
    }
    assert_eq!(counter_snap(&c), before);
    assert_eq!(Arc::strong_count(&c), 1);
}

#[test]
fn reserve_after_close_that_never_fits_is_refused_and_changes_nothing() {
    // After close every admission fails as Closed, even one that could
    // never fit; it is non-retryable and changes nothing.
    let c = counter_with(8, 3, 5);
    c.close();
    let before = counter_snap(&c);
    for (n, headroom) in [
        (9, 0),
        (usize::MAX, 0),
        (1, usize::MAX),
        (usize::MAX, usize::MAX),
    ] {
        let err = c.try_reserve_with_headroom(n, headroom).unwrap_err();
        assert_eq!(err, ReserveError::Closed, "({n}, {headroom})");
        assert!(!err.is_retryable());
    }
    assert!(!c.try_reserve(usize::MAX).unwrap_err().is_retryable());
    assert_eq!(counter_snap(&c), before);
}

#[test]
fn guards_work_after_close_except_growing() {
    let c = SlotCounter::new(8);
    let mut a = c.try_reserve(4).unwrap();
    let b = c.try_reserve(2).unwrap();
    c.close();
    let before = counter_snap(&c);

    // Growing is an admission: refused, nothing changes.
    assert_eq!(a.try_grow(1), Err(ReserveError::Closed));
    assert_eq!(a.len(), 4);
    assert_eq!(counter_snap(&c), before);

    // Split and merge only move counts.
    let mut part = a.split(1).unwrap();
    part.merge(b);
    assert_eq!((a.len(), part.len(), c.used()), (3, 3, 6));

    // Shrinking, dropping and forget + release drain the counter.
    a.shrink_to(1);
    assert_eq!(c.used(), 4);
    drop(a);
    assert_eq!(c.used(), 3);
    let n = part.forget();
    assert_eq!(c.used(), 3);
    c.release(n).unwrap();
    assert_eq!(c.used(), 0);
    assert!(c.is_closed());
    assert_eq!(c.peak_used(), 6);
}

#[test]
fn owned_guards_drain_after_close() {
    let c = Arc::new(SlotCounter::new(8));
    let mut a = c.try_reserve_owned(5).unwrap();
    c.close();
    assert_eq!(a.try_grow(1), Err(ReserveError::Closed));
    assert_eq!((a.len(), c.used()), (5, 5));
    a.shrink_to(2);
    assert_eq!(c.used(), 2);
    std::thread::spawn(move || drop(a)).join().unwrap();
    assert_eq!(c.used(), 0);
    assert!(c.is_closed());
}

// ---------------------------------------------------------------------------
// A counter of capacity 0
// ---------------------------------------------------------------------------

#[test]
fn capacity_zero_counter_refuses_everything_non_empty() {
    let c = Arc::new(SlotCounter::new(0));
    let before = counter_snap(&c);
    assert_eq!(
        before,
        CounterSnap {
            capacity: 0,
            used: 0,
            available: 0,
            peak_used: 0,
            closed: false
        }
    );
    for request in [1, 0, -1, isize::MAX, isize::MIN] {
        assert_eq!(c.admit(request), 0);
    }
    for n in [1, usize::MAX] {
        let never = ReserveError::NeverFits {
            requested: n,
            capacity: 0,
        };
        assert_eq!(c.try_reserve(n).unwrap_err(), never);
        assert_eq!(c.try_reserve_owned(n).unwrap_err(), never);
        assert_eq!(c.try_reserve_with_headroom(n, 0).unwrap_err(), never);
    }
    assert_eq!(
        c.try_reserve_with_headroom(0, 1).unwrap_err(),
        ReserveError::NeverFits {
            requested: 0,
            capacity: 0
        }
    );
    assert_eq!(
        c.release(1),
        Err(ReleaseError::ExceedsUsed {
            released: 1,
            used: 0
        })
    );
    assert_eq!(counter_snap(&c), before);

    // Empty requests are fine.
    let mut r = c.try_reserve(0).unwrap();
    assert!(r.is_empty());
    assert!(c.try_reserve_owned(0).unwrap().is_empty());
    assert!(c.try_reserve_with_headroom(0, 0).unwrap().is_empty());
    assert_eq!(
        r.try_grow(1),
        Err(ReserveError::NeverFits {
            requested: 1,
            capacity: 0
        })
    );
    assert_eq!(r.try_grow(0), Ok(()));
    drop(r);
    assert_eq!(counter_snap(&c), before);
}

// ---------------------------------------------------------------------------
// Debug
// ---------------------------------------------------------------------------

#[test]
fn debug_shows_the_state() {
    let c = counter_with(8, 3, 5);
    let s = format!("{c:?}");
    for part in [
        "SlotCounter",
        "capacity: 8",
        "used: 3",
        "peak_used: 5",
        "closed: false",
    ] {
        assert!(s.contains(part), "{s:?} lacks {part:?}");
    }
    c.close();
    let s = format!("{c:?}");
    assert!(s.contains("closed: true"), "{s:?}");
    assert!(s.contains("used: 3"), "{s:?}");
}

#[test]
fn debug_of_a_wait_shows_what_it_asks_and_of_which_counter() {
    let c = Arc::new(counter_with(8, 3, 5));
    let borrowed = c.reserve(4);
    let owned = Arc::clone(&c).reserve_owned(6);
    for (s, name, n) in [
        (format!("{borrowed:?}"), "Reserve {", "n: 4"),
        (format!("{owned:?}"), "ReserveOwned {", "n: 6"),
    ] {
        for part in [name, n, "SlotCounter", "capacity: 8", "used: 3"] {
            assert!(s.contains(part), "{s:?} lacks {part:?}");
        }
    }
}

// ---------------------------------------------------------------------------
// The error types
// ---------------------------------------------------------------------------

#[test]
fn reserve_error_display_texts() {
    assert_eq!(
        ReserveError::Full {
            requested: 4,
            available: 3
        }
        .to_string(),
        "requested 4 but only 3 available"
    );
    assert_eq!(
        ReserveError::NeverFits {
            requested: 9,
            capacity: 8
        }
        .to_string(),
        "requested 9 can never fit in a capacity of 8"
    );
    assert_eq!(ReserveError::Closed.to_string(), "allocator is closed");
}

#[test]
fn reserve_error_display_names_the_headroom_where_the_numbers_do_not_explain_a_refusal() {
    // `requested` leaves out the headroom: a refusal whose request alone
    // would fit was refused for the headroom, and says so.
    let c = SlotCounter::new(8);
    let _held = c.try_reserve(4).unwrap();
    let full = c.try_reserve_with_headroom(1, 4).unwrap_err();
    assert_eq!(
        full,
        ReserveError::Full {
            requested: 1,
            available: 4
        }
    );
    assert_eq!(
        full.to_string(),
        "requested 1 (plus the headroom asked for) but only 4 available"
    );
    let never = c.try_reserve_with_headroom(1, 8).unwrap_err();
    assert_eq!(
        never,
        ReserveError::NeverFits {
            requested: 1,
            capacity: 8
        }
    );
    assert_eq!(
        never.to_string(),
        "requested 1 (plus the headroom asked for) can never fit in a capacity of 8"
    );
    assert_eq!(c.used(), 4, "the refusals took nothing");
}

#[test]
fn release_error_display_text() {
    assert_eq!(
        ReleaseError::ExceedsUsed {
            released: 3,
            used: 2
        }
        .to_string(),
        "cannot release 3: only 2 in use (over-release or double free)"
    );
}

fn assert_error<E: Error + Send + Sync + Copy + Eq + std::hash::Hash + 'static>() {}

#[test]
fn errors_implement_std_error() {
    assert_error::<ReserveError>();
    assert_error::<ReleaseError>();

    let c = counter_with(4, 4, 4);
    let boxed: Box<dyn Error + Send + Sync> = Box::new(c.try_reserve(1).unwrap_err());
    assert_eq!(boxed.to_string(), "requested 1 but only 0 available");
    assert!(boxed.source().is_none());
    assert_eq!(
        boxed.downcast_ref::<ReserveError>(),
        Some(&ReserveError::Full {
            requested: 1,
            available: 0
        })
    );

    let boxed: Box<dyn Error + Send + Sync> = Box::new(c.release(5).unwrap_err());
    assert_eq!(
        boxed.to_string(),
        "cannot release 5: only 4 in use (over-release or double free)"
    );
    assert!(boxed.source().is_none());

    // `?` converts both into a boxed error.
    fn use_question_mark(c: &SlotCounter) -> Result<(), Box<dyn Error>> {
        c.release(1)?;
        let _r = c.try_reserve(2)?;
        Ok(())
    }
    let err = use_question_mark(&SlotCounter::new(4)).unwrap_err();
    assert_eq!(
        err.downcast_ref::<ReleaseError>(),
        Some(&ReleaseError::ExceedsUsed {
            released: 1,
            used: 0
        })
    );
}

#[test]
fn error_values_are_distinct_and_copyable() {
    let all = [
        ReserveError::Full {
            requested: 1,
            available: 0,
        },
        ReserveError::Full {
            requested: 1,
            available: 2,
        },
        ReserveError::NeverFits {
            requested: 1,
            capacity: 0,
        },
        ReserveError::Closed,
    ];
    let set: HashSet<ReserveError> = all.iter().copied().collect();
    assert_eq!(set.len(), all.len());
    let copy = all[0];
    assert_eq!(copy, all[0]);
    assert_ne!(copy, all[1]);
    #[allow(clippy::clone_on_copy)]
    let cloned = all[2].clone();
    assert_eq!(cloned, all[2]);
    assert!(format!("{:?}", ReserveError::Closed).contains("Closed"));
    assert!(format!(
        "{:?}",
        ReleaseError::ExceedsUsed {
            released: 1,
            used: 0
        }
    )
    .contains("ExceedsUsed"));
}

#[test]
fn only_full_is_retryable() {
    assert!(ReserveError::Full {
        requested: 2,
        available: 1
    }
    .is_retryable());
    assert!(!ReserveError::NeverFits {
        requested: 9,
        capacity: 8
    }
    .is_retryable());
    assert!(!ReserveError::Closed.is_retryable());
}

/// `release` of slots a live guard still holds is a logic error: debug
/// builds catch it when the guard drops.
#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "guard released more than was used")]
fn releasing_a_guards_slots_panics_at_its_drop_in_debug_builds() {
    let counter = SlotCounter::new(4);
    let guard = counter.try_reserve(2).unwrap();
    counter.release(2).unwrap();
    drop(guard);
}

/// The same misuse wraps `used` when the guard drops (in debug builds the
/// assertion fires after the wrap); the counter then refuses every
/// admission rather than admit without bound. Runs in both builds.
#[test]
fn after_a_wrapping_misuse_the_counter_refuses_every_admission() {
    let counter = SlotCounter::new(4);
    let guard = counter.try_reserve(2).unwrap();
    counter.release(2).unwrap();
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(guard)));
    assert_eq!(dropped.is_err(), cfg!(debug_assertions));
    assert_eq!(counter.available(), 0);
    // `used` never exceeds the capacity, as documented, even wrapped.
    assert_eq!(counter.used(), counter.capacity());
    assert!(matches!(
        counter.try_reserve(1),
        Err(ReserveError::Full { available: 0, .. })
    ));
}
