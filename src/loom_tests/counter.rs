//! Loom models of `SlotCounter`'s admission, release and close, with their
//! negative controls.
//!
//! Each model shape is a generic function of the capacity, run at
//! capacities 1 to 5 against the real `SlotCounter` (which must pass), and
//! against the deliberately wrong allocators of `crate::loom_tests::wrong`, which
//! loom must catch: one `#[should_panic]` test per capacity (pinned to the
//! model's assertion message) running exactly the real model's shape and
//! requests. A capacity is left out of a control only where that wrong way
//! cannot show under the shape (token by token cannot take part of a
//! one-token request); each such gap is commented.
//!
//! Models of two threads (the model's main thread included) are checked
//! exhaustively; models of three threads with the environment's preemption
//! bound (`LOOM_MAX_PREEMPTIONS=2` in CI). See `crate::loom_tests::check_threads`.
//!
//! Run with `scripts/loom counter`.

use std::sync::Arc;

use crate::loom_tests::wrong::{
    AgainstCapacity, CheckThenAdd, RelaxedAdmission, RelaxedRelease, SeparateCloseFlag,
    TokenByToken,
};
use crate::loom_tests::{
    assert_drained, assert_full, assert_len, assert_whole, caught, check_threads, msg, spawn, sums,
    Guard, Shadow, Slots, CAPACITIES,
};
use crate::{ReleaseError, ReserveError, SlotCounter};
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

/// One appender: admits `requested` with `SlotCounter::admit`, holds it,
/// gives it back with `release`.
fn admit_once<S: Slots>(slots: &S, shadow: &Shadow, requested: isize) {
    let admitted = slots.admit(requested);
    assert_whole(requested, admitted);
    if admitted > 0 {
        shadow.enter(admitted);
        shadow.exit(admitted);
        slots.release(admitted).expect("release of admitted slots");
    }
}

// ---------------------------------------------------------------------------
// admit vs admit
// ---------------------------------------------------------------------------

/// One thread per request (the last on the model's main thread) admits its
/// request, holds it, and releases it; at the end nothing is in use.
fn admit_vs_admit<S: Slots>(capacity: usize, requests: Vec<isize>) {
    check_threads(requests.len(), move || {
        let slots = Arc::new(S::with_capacity(capacity));
        let shadow = Arc::new(Shadow::new(capacity));
        let (&last, others) = requests.split_last().expect("at least one request");
        let handles: Vec<_> = others
            .iter()
            .map(|&r| spawn(&slots, &shadow, move |s, sh| admit_once(&**s, sh, r)))
            .collect();
        admit_once(&*slots, &shadow, last);
        for h in handles {
            h.join().expect("model thread panicked");
        }
        assert_drained(&*slots);
    });
}

/// Two appenders whose requests each fit alone but not together (sum
/// `capacity + 1`: the seed's "one free short"), then a whole-counter
/// request against one that can never fit (`capacity + 1`).
fn admit_vs_admit_2<S: Slots>(c: usize) {
    let ci = c as isize;
    admit_vs_admit::<S>(c, vec![ci - ci / 2, ci / 2 + 1]);
    admit_vs_admit::<S>(c, vec![ci, ci + 1]);
}

/// Three appenders, `capacity + 2` in all, so at most two fit together,
/// then two oversized requests against a small one.
fn admit_vs_admit_3<S: Slots>(c: usize) {
    let ci = c as isize;
    admit_vs_admit::<S>(c, vec![(ci + 1) / 2, ci / 2 + 1, 1]);
    admit_vs_admit::<S>(c, vec![ci + 1, 1, ci + 1]);
}

#[test]
fn admit_vs_admit_2_threads() {
    CAPACITIES.for_each(admit_vs_admit_2::<SlotCounter>);
}

#[test]
fn admit_vs_admit_3_threads() {
    CAPACITIES.for_each(admit_vs_admit_3::<SlotCounter>);
}

caught!(admit_vs_admit_2_threads_token_by_token: admit_vs_admit_2::<TokenByToken>,
    "partial admission");
caught!(admit_vs_admit_2_threads_against_capacity: admit_vs_admit_2::<AgainstCapacity>,
    "overcommit");
caught!(admit_vs_admit_2_threads_check_then_add: admit_vs_admit_2::<CheckThenAdd>,
    "overcommit");
caught!(admit_vs_admit_3_threads_token_by_token: admit_vs_admit_3::<TokenByToken>,
    "partial admission");
caught!(admit_vs_admit_3_threads_against_capacity: admit_vs_admit_3::<AgainstCapacity>,
    "overcommit");
caught!(admit_vs_admit_3_threads_check_then_add: admit_vs_admit_3::<CheckThenAdd>,
    "overcommit");

// ---------------------------------------------------------------------------
// try_reserve vs release, and vs guard drop
// ---------------------------------------------------------------------------

/// How the slots held before the threads start are given back.
#[derive(Clone, Copy, Debug)]
enum Free {
    /// Dropping an `OwnedReservation` moved into the releasing thread.
    GuardDrop,
    /// `SlotCounter::release` of a count taken with `admit`.
    Release,
}

/// `held` slots are taken before the threads start; one thread gives them
/// back (by `free`) while one reserver per entry of `requests` calls
/// `try_reserve`. A refusal must report a free count the counter held.
fn reserve_vs_release<S: Slots>(capacity: usize, held: usize, requests: Vec<usize>, free: Free) {
    check_threads(1 + requests.len(), move || {
        let slots = Arc::new(S::with_capacity(capacity));
        let shadow = Arc::new(Shadow::new(capacity));
        let guard = match free {
            Free::GuardDrop => {
                let g = slots.try_reserve_owned(held).expect("empty counter");
                assert_len(held, g.len());
                Some(g)
            }
            Free::Release => {
                assert_eq!(slots.admit(held as isize), held, "empty counter");
                None
            }
        };
        shadow.enter(held);
        let releaser = spawn(&slots, &shadow, move |s, sh| {
            sh.exit(held);
            match guard {
                Some(g) => drop(g),
                None => s.release(held).expect("release of admitted slots"),
            }
        });
        // Everything another thread could hold at the moment of a refusal.
        let reserver = move |s: &Arc<S>, sh: &Shadow, me: usize, requests: &[usize]| {
            let n = requests[me];
            match s.try_reserve(n) {
                Ok(g) => {
                    assert_len(n, g.len());
                    sh.enter(n);
                    sh.exit(n);
                    drop(g);
                }
                Err(e) => {
                    let others: Vec<usize> = requests
                        .iter()
                        .enumerate()
                        .filter(|&(i, _)| i != me)
                        .map(|(_, &r)| r)
                        .collect();
                    let mut options = vec![held];
                    options.extend(others);
                    let opts: Vec<&[usize]> = options.iter().map(std::slice::from_ref).collect();
                    assert_full(e, n, capacity, &sums(&opts));
                }
            }
        };
        let reservers: Vec<_> = (1..requests.len())
            .map(|me| {
                let requests = requests.clone();
                spawn(&slots, &shadow, move |s, sh| reserver(s, sh, me, &requests))
            })
            .collect();
        reserver(&slots, &shadow, 0, &requests);
        releaser.join().expect("model thread panicked");
        for h in reservers {
            h.join().expect("model thread panicked");
        }
        assert_drained(&*slots);
    });
}

/// One slot is held and given back while another thread asks for the whole
/// counter (which fits only once the slot is back).
fn reserve_vs_release_2<S: Slots>(c: usize) {
    reserve_vs_release::<S>(c, 1, vec![c], Free::Release);
    reserve_vs_release::<S>(c, 1, vec![c], Free::GuardDrop);
}

/// One slot is held and given back while two reservers race for requests
/// that each fit alone but not together.
fn reserve_vs_release_3<S: Slots>(c: usize) {
    reserve_vs_release::<S>(c, 1, vec![c - c / 2, c / 2 + 1], Free::Release);
    reserve_vs_release::<S>(c, 1, vec![c - c / 2, c / 2 + 1], Free::GuardDrop);
}

#[test]
fn reserve_vs_release_2_threads() {
    CAPACITIES.for_each(reserve_vs_release_2::<SlotCounter>);
}

#[test]
fn reserve_vs_release_3_threads() {
    CAPACITIES.for_each(reserve_vs_release_3::<SlotCounter>);
}

// Token by token can only take part of the whole-counter request when one
// slot is held and at least one other is free: capacity 2 and up.
caught!(reserve_vs_release_2_threads_token_by_token: reserve_vs_release_2::<TokenByToken>,
    "partial admission", from 2);
caught!(reserve_vs_release_2_threads_against_capacity: reserve_vs_release_2::<AgainstCapacity>,
    "overcommit");
caught!(reserve_vs_release_3_threads_check_then_add: reserve_vs_release_3::<CheckThenAdd>,
    "overcommit");
caught!(reserve_vs_release_3_threads_token_by_token: reserve_vs_release_3::<TokenByToken>,
    "partial admission", from 2);

// ---------------------------------------------------------------------------
// try_grow vs admit
// ---------------------------------------------------------------------------

/// A running sequence reserves `start` and grows by `grow` (all or
/// nothing; on refusal the guard is unchanged) while one appender per
/// entry of `others` admits its request.
fn grow_vs_admit<S: Slots>(capacity: usize, start: usize, grow: usize, others: Vec<isize>) {
    check_threads(1 + others.len(), move || {
        let slots = Arc::new(S::with_capacity(capacity));
        let shadow = Arc::new(Shadow::new(capacity));
        let handles: Vec<_> = others
            .iter()
            .map(|&r| spawn(&slots, &shadow, move |s, sh| admit_once(&**s, sh, r)))
            .collect();
        let held: Vec<usize> = others.iter().map(|&r| r as usize).collect();
        let opts: Vec<&[usize]> = held.iter().map(std::slice::from_ref).collect();
        let possible = sums(&opts);
        match slots.try_reserve(start) {
            Ok(mut g) => {
                assert_len(start, g.len());
                shadow.enter(start);
                match g.try_grow(grow) {
                    Ok(()) => {
                        assert_len(start + grow, g.len());
                        shadow.enter(grow);
                    }
                    Err(e) => {
                        // A refused grow leaves the guard as it was.
                        assert_len(start, g.len());
                        let with_me: Vec<usize> = possible.iter().map(|u| u + start).collect();
                        assert_full(e, grow, capacity, &with_me);
                    }
                }
                shadow.exit(g.len());
                drop(g);
            }
            Err(e) => assert_full(e, start, capacity, &possible),
        }
        for h in handles {
            h.join().expect("model thread panicked");
        }
        assert_drained(&*slots);
    });
}

/// A sequence of 1 grows to the whole counter while another appender
/// takes 1; at capacity 1 the grow can never succeed.
fn grow_vs_admit_2<S: Slots>(c: usize) {
    grow_vs_admit::<S>(c, 1, (c - 1).max(1), vec![1]);
}

/// As with two threads, but two appenders race with the grow; then a
/// larger appender that only fits next to the sequence before it grows.
fn grow_vs_admit_3<S: Slots>(c: usize) {
    grow_vs_admit::<S>(c, 1, (c - 1).max(1), vec![1, 1]);
    if c >= 2 {
        let ci = c as isize;
        grow_vs_admit::<S>(c, 1, 1, vec![ci - 1, 1]);
    }
}

#[test]
fn grow_vs_admit_2_threads() {
    CAPACITIES.for_each(grow_vs_admit_2::<SlotCounter>);
}

#[test]
fn grow_vs_admit_3_threads() {
    CAPACITIES.for_each(grow_vs_admit_3::<SlotCounter>);
}

// Token by token grows partially when the appender holds 1 and at least
// one more slot is free: capacity 3 and up.
caught!(grow_vs_admit_2_threads_token_by_token: grow_vs_admit_2::<TokenByToken>,
    "partial admission", from 3);
caught!(grow_vs_admit_2_threads_against_capacity: grow_vs_admit_2::<AgainstCapacity>,
    "overcommit");
caught!(grow_vs_admit_2_threads_check_then_add: grow_vs_admit_2::<CheckThenAdd>,
    "overcommit");
caught!(grow_vs_admit_3_threads_check_then_add: grow_vs_admit_3::<CheckThenAdd>,
    "overcommit");

// ---------------------------------------------------------------------------
// try_reserve_with_headroom vs plain try_reserve
// ---------------------------------------------------------------------------

/// A new sequence asks for `n` with `headroom` kept free while a running
/// one asks for `m` with plain `try_reserve`. The sizes are such that
/// `n + m <= capacity < n + m + headroom`: the plain request may use the
/// headroom and so must always succeed, while the headroom request must be
/// refused whenever the plain one is held when it is admitted, reporting
/// that count. The running sequence announces that it holds its slots
/// (`holding`) and keeps them until the end; a headroom admission that
/// read the announcement first and still succeeded ignored the headroom.
fn headroom_vs_plain<S: Slots>(capacity: usize, n: usize, headroom: usize, m: usize) {
    assert!(n + m <= capacity && capacity < n + m + headroom);
    check_threads(2, move || {
        let slots = Arc::new(S::with_capacity(capacity));
        let shadow = Arc::new(Shadow::new(capacity));
        let holding = Arc::new(AtomicBool::new(false));
        let plain = {
            let slots = Arc::clone(&slots);
            let shadow = Arc::clone(&shadow);
            let holding = Arc::clone(&holding);
            thread::spawn(move || match slots.try_reserve_owned(m) {
                Ok(g) => {
                    assert_len(m, g.len());
                    shadow.enter(m);
                    // SeqCst: whoever reads `true` is ordered after our
                    // admission.
                    holding.store(true, Ordering::SeqCst);
                    g
                }
                Err(e) => panic!("{}: plain try_reserve({m}) got {e:?}", msg::REFUSED),
            })
        };
        // SeqCst: pairs with the store above.
        let seen = holding.load(Ordering::SeqCst);
        match slots.try_reserve_with_headroom(n, headroom) {
            Ok(g) => {
                assert!(
                    !seen,
                    "{}: try_reserve_with_headroom({n}, {headroom}) succeeded \
                     with {m} of {capacity} held",
                    msg::HEADROOM
                );
                assert_len(n, g.len());
                shadow.enter(n);
                shadow.exit(n);
                drop(g);
            }
            Err(e) => assert_full(e, n + headroom, capacity, &[m]),
        }
        let g = plain.join().expect("model thread panicked");
        shadow.exit(m);
        drop(g);
        assert_drained(&*slots);
    });
}

/// Two watermark shapes: a small headroom, and a headroom that leaves room
/// for the new sequence only on an empty counter.
fn headroom_vs_plain_2<S: Slots>(c: usize) {
    match c {
        1 => headroom_vs_plain::<S>(1, 0, 1, 1),
        2 => headroom_vs_plain::<S>(2, 1, 1, 1),
        _ => headroom_vs_plain::<S>(c, 2, 1, c - 2),
    }
    if c >= 2 {
        headroom_vs_plain::<S>(c, 1, c - 1, c - 1);
    }
}

#[test]
fn headroom_vs_plain_2_threads() {
    CAPACITIES.for_each(headroom_vs_plain_2::<SlotCounter>);
}

caught!(headroom_vs_plain_2_threads_token_by_token: headroom_vs_plain_2::<TokenByToken>,
    "partial admission", from 3);
caught!(headroom_vs_plain_2_threads_against_capacity: headroom_vs_plain_2::<AgainstCapacity>,
    "headroom ignored");

// ---------------------------------------------------------------------------
// close vs admit
// ---------------------------------------------------------------------------

/// `held` slots are taken before the threads start. A closer closes the
/// counter, announces it (`observed`), and checks that `used()` never grows
/// afterwards and that its own admissions fail; one appender per entry of
/// `requests` first reads `observed`, then admits: an admission that
/// succeeds after the close was observed is not linearizable. The held
/// slots are drained after the close (by the closer with two threads, by a
/// third thread otherwise), and at the end nothing is in use, the counter
/// is still closed and admits nothing.
fn close_vs_admit<S: Slots>(capacity: usize, held: usize, requests: Vec<usize>, dropper: bool) {
    let threads = 1 + requests.len() + usize::from(dropper);
    check_threads(threads, move || {
        let slots = Arc::new(S::with_capacity(capacity));
        let shadow = Arc::new(Shadow::new(capacity));
        let observed = Arc::new(AtomicBool::new(false));
        let guard = slots.try_reserve_owned(held).expect("empty counter");
        assert_len(held, guard.len());
        shadow.enter(held);
        let (guard, drain) = if dropper {
            let d = spawn(&slots, &shadow, move |_, sh| {
                sh.exit(held);
                drop(guard);
            });
            (None, Some(d))
        } else {
            (Some(guard), None)
        };
        let closer = {
            let observed = Arc::clone(&observed);
            spawn(&slots, &shadow, move |s, sh| {
                s.close();
                // SeqCst: whoever reads `true` is ordered after the close.
                observed.store(true, Ordering::SeqCst);
                let before = s.used();
                assert!(
                    matches!(s.try_reserve(1), Err(ReserveError::Closed)),
                    "{}: try_reserve after close",
                    msg::AFTER_CLOSE
                );
                assert_eq!(s.admit(1), 0, "{}: admit after close", msg::AFTER_CLOSE);
                let after = s.used();
                assert!(
                    after <= before,
                    "{}: used grew from {before} to {after} after close returned",
                    msg::AFTER_CLOSE
                );
                if let Some(g) = guard {
                    sh.exit(held);
                    drop(g);
                }
            })
        };
        let count = requests.len();
        let requests = requests.clone();
        let appender = move |s: &Arc<S>, sh: &Shadow, observed: &AtomicBool, me: usize| {
            let n = requests[me];
            // SeqCst: pairs with the closer's store.
            let seen = observed.load(Ordering::SeqCst);
            match s.try_reserve(n) {
                Ok(g) => {
                    assert!(!seen, "{}: try_reserve({n}) succeeded", msg::AFTER_CLOSE);
                    assert_len(n, g.len());
                    sh.enter(n);
                    sh.exit(n);
                    drop(g); // releases work on a closed counter
                }
                Err(ReserveError::Closed) => {}
                Err(e) => {
                    // The held slots and the other appenders' requests.
                    let mut options = vec![held];
                    options.extend(
                        requests
                            .iter()
                            .enumerate()
                            .filter(|&(i, _)| i != me)
                            .map(|(_, &r)| r),
                    );
                    let opts: Vec<&[usize]> = options.iter().map(std::slice::from_ref).collect();
                    assert_full(e, n, capacity, &sums(&opts));
                }
            }
        };
        let appenders: Vec<_> = (1..count)
            .map(|me| {
                let observed = Arc::clone(&observed);
                let appender = appender.clone();
                spawn(&slots, &shadow, move |s, sh| appender(s, sh, &observed, me))
            })
            .collect();
        appender(&slots, &shadow, &observed, 0);
        closer.join().expect("model thread panicked");
        if let Some(d) = drain {
            d.join().expect("model thread panicked");
        }
        for h in appenders {
            h.join().expect("model thread panicked");
        }
        assert!(slots.is_closed(), "close did not stick");
        assert_eq!(slots.admit(1), 0, "{}: admit at the end", msg::AFTER_CLOSE);
        assert_drained(&*slots);
    });
}

/// Closer (which also drains one held slot, when there is room for it)
/// against one appender of what is free.
fn close_vs_admit_2<S: Slots>(c: usize) {
    let held = usize::from(c >= 2);
    close_vs_admit::<S>(c, held, vec![c - held], false);
}

/// Closer, drainer and appender; then closer against two appenders.
fn close_vs_admit_3<S: Slots>(c: usize) {
    close_vs_admit::<S>(c, 1, vec![c], true);
    close_vs_admit::<S>(c, 0, vec![1, c], false);
}

#[test]
fn close_vs_admit_2_threads() {
    CAPACITIES.for_each(close_vs_admit_2::<SlotCounter>);
}

#[test]
fn close_vs_admit_3_threads() {
    CAPACITIES.for_each(close_vs_admit_3::<SlotCounter>);
}

caught!(close_vs_admit_2_threads_separate_close_flag: close_vs_admit_2::<SeparateCloseFlag>,
    "admission after close");
caught!(close_vs_admit_3_threads_separate_close_flag: close_vs_admit_3::<SeparateCloseFlag>,
    "admission after close");

// ---------------------------------------------------------------------------
// forget + release
// ---------------------------------------------------------------------------

/// A holder reserves `n`, forgets the guard (the slots stay taken), tries
/// an over-release (refused, reporting a count that could be in use), and
/// gives its count back with `release`; an appender per entry of `others`
/// admits meanwhile.
fn forget_and_release<S: Slots>(capacity: usize, n: usize, others: Vec<isize>) {
    check_threads(1 + others.len(), move || {
        let slots = Arc::new(S::with_capacity(capacity));
        let shadow = Arc::new(Shadow::new(capacity));
        let handles: Vec<_> = others
            .iter()
            .map(|&r| spawn(&slots, &shadow, move |s, sh| admit_once(&**s, sh, r)))
            .collect();
        let held: Vec<usize> = others.iter().map(|&r| r as usize).collect();
        let opts: Vec<&[usize]> = held.iter().map(std::slice::from_ref).collect();
        let possible = sums(&opts);
        match slots.try_reserve(n) {
            Ok(g) => {
                let kept = g.forget();
                assert_len(n, kept);
                shadow.enter(kept);
                let too_much = capacity + 1;
                match slots.release(too_much) {
                    Err(ReleaseError::ExceedsUsed { released, used }) => {
                        assert_eq!(released, too_much, "ExceedsUsed misreports the request");
                        let with_me: Vec<usize> = possible.iter().map(|u| u + kept).collect();
                        assert!(
                            with_me.contains(&used),
                            "{}: ExceedsUsed {{ used: {used} }}, but only {with_me:?} could be in use",
                            msg::IMPOSSIBLE
                        );
                    }
                    Ok(()) => panic!("over-release of {too_much} accepted"),
                }
                shadow.exit(kept);
                slots.release(kept).expect("release of forgotten slots");
            }
            Err(e) => assert_full(e, n, capacity, &possible),
        }
        for h in handles {
            h.join().expect("model thread panicked");
        }
        assert_drained(&*slots);
    });
}

/// Requests that each fit alone but not together.
fn forget_and_release_2<S: Slots>(c: usize) {
    let ci = c as isize;
    forget_and_release::<S>(c, c - c / 2, vec![ci / 2 + 1]);
}

#[test]
fn forget_and_release_2_threads() {
    CAPACITIES.for_each(forget_and_release_2::<SlotCounter>);
}

caught!(forget_and_release_2_threads_against_capacity: forget_and_release_2::<AgainstCapacity>,
    "overcommit");
caught!(forget_and_release_2_threads_check_then_add: forget_and_release_2::<CheckThenAdd>,
    "overcommit");
caught!(forget_and_release_2_threads_token_by_token: forget_and_release_2::<TokenByToken>,
    "partial admission", from 2);

// ---------------------------------------------------------------------------
// Hand-off: the admission orderings
// ---------------------------------------------------------------------------

/// Each thread takes the whole counter (a guard from `try_reserve`, or a
/// count from `admit`, as `free` says), and while it holds it does an
/// unsynchronised read-modify-write (a `Relaxed` load, then a `Relaxed`
/// store) of a "slot content" word, then gives it back (dropping the guard,
/// or `release`). Only the counter orders the holders: if an admission does
/// not synchronise with the previous holder's give-back (`Acquire` /
/// `Release`), the new holder may read a stale value and an update is lost.
fn handoff<S: Slots>(capacity: usize, threads: usize, free: Free) {
    check_threads(threads, move || {
        let slots = Arc::new(S::with_capacity(capacity));
        let shadow = Arc::new(Shadow::new(capacity));
        let content = Arc::new(AtomicUsize::new(0));
        // Relaxed (both): on purpose; only the counter may order the
        // holders. (Before the shadow's SeqCst updates, which would
        // otherwise order them too and hide the bug.)
        let write = move |sh: &Shadow, content: &AtomicUsize| {
            let v = content.load(Ordering::Relaxed);
            content.store(v + 1, Ordering::Relaxed);
            sh.enter(capacity);
            sh.exit(capacity);
        };
        let holder = move |s: &S, sh: &Shadow, content: &AtomicUsize| -> usize {
            match free {
                Free::GuardDrop => match s.try_reserve(capacity) {
                    Ok(g) => {
                        assert_len(capacity, g.len());
                        write(sh, content);
                        drop(g);
                        1
                    }
                    Err(e) => {
                        assert_full(e, capacity, capacity, &[capacity]);
                        0
                    }
                },
                Free::Release => {
                    let admitted = s.admit(capacity as isize);
                    assert_whole(capacity as isize, admitted);
                    if admitted == 0 {
                        return 0;
                    }
                    write(sh, content);
                    s.release(admitted).expect("release of admitted slots");
                    1
                }
            }
        };
        let handles: Vec<_> = (1..threads)
            .map(|_| {
                let slots = Arc::clone(&slots);
                let shadow = Arc::clone(&shadow);
                let content = Arc::clone(&content);
                thread::spawn(move || holder(&slots, &shadow, &content))
            })
            .collect();
        let mut wins = holder(&slots, &shadow, &content);
        for h in handles {
            wins += h.join().expect("model thread panicked");
        }
        // Relaxed: the joins order every holder's store before this load.
        let content = content.load(Ordering::Relaxed);
        assert_eq!(
            content,
            wins,
            "{}: {wins} holders in turn, but the content counts {content}",
            msg::LOST_UPDATE
        );
        assert_drained(&*slots);
    });
}

fn handoff_2<S: Slots>(c: usize) {
    handoff::<S>(c, 2, Free::GuardDrop);
}

fn handoff_3<S: Slots>(c: usize) {
    handoff::<S>(c, 3, Free::GuardDrop);
}

fn handoff_release_2<S: Slots>(c: usize) {
    handoff::<S>(c, 2, Free::Release);
}

fn handoff_release_3<S: Slots>(c: usize) {
    handoff::<S>(c, 3, Free::Release);
}

#[test]
fn handoff_2_threads() {
    CAPACITIES.for_each(handoff_2::<SlotCounter>);
}

#[test]
fn handoff_3_threads() {
    CAPACITIES.for_each(handoff_3::<SlotCounter>);
}

#[test]
fn handoff_release_2_threads() {
    CAPACITIES.for_each(handoff_release_2::<SlotCounter>);
}

#[test]
fn handoff_release_3_threads() {
    CAPACITIES.for_each(handoff_release_3::<SlotCounter>);
}

caught!(handoff_2_threads_relaxed_admission: handoff_2::<RelaxedAdmission>,
    "lost update");
caught!(handoff_3_threads_relaxed_admission: handoff_3::<RelaxedAdmission>,
    "lost update");
caught!(handoff_2_threads_relaxed_release: handoff_2::<RelaxedRelease>,
    "lost update");
caught!(handoff_3_threads_relaxed_release: handoff_3::<RelaxedRelease>,
    "lost update");
caught!(handoff_release_2_threads_relaxed_admission: handoff_release_2::<RelaxedAdmission>,
    "lost update");
caught!(handoff_release_3_threads_relaxed_admission: handoff_release_3::<RelaxedAdmission>,
    "lost update");
caught!(handoff_release_2_threads_relaxed_release: handoff_release_2::<RelaxedRelease>,
    "lost update");
caught!(handoff_release_3_threads_relaxed_release: handoff_release_3::<RelaxedRelease>,
    "lost update");
