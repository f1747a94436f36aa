//! Loom models of the reservation guards: split / merge / shrink_to racing
//! other threads' reservations and drops, and `OwnedReservation`s moved
//! across threads, each with its negative controls.
//!
//! As in `counter.rs`, every shape is generic over `crate::loom_tests::Slots` and
//! runs at capacities 1 to 5 against the real guards (`Reservation`,
//! `OwnedReservation`) and, as `#[should_panic]` controls, against the
//! wrong allocators of `crate::loom_tests::wrong` with their naive guards.
//!
//! Run with `scripts/loom guards`.

use std::sync::Arc;

use crate::loom_tests::wrong::{AgainstCapacity, CheckThenAdd, TokenByToken};
use crate::loom_tests::{
    assert_drained, assert_full, assert_len, caught, check_threads, spawn, sums, Guard, Shadow,
    Slots, CAPACITIES,
};
use crate::SlotCounter;

/// What others could hold at once, given each other thread's possible
/// holdings, shifted by `base` (what the asking thread holds itself).
fn possible(others: &[&[usize]], base: usize) -> Vec<usize> {
    sums(others).into_iter().map(|u| u + base).collect()
}

// ---------------------------------------------------------------------------
// split / merge / shrink_to vs reserve and drop
// ---------------------------------------------------------------------------

/// The sizes of the sequence in [`split_merge_shrink`] at capacity `c`:
/// it reserves all `c`, splits `k` off, shrinks the rest to `keep`, and
/// merges back to `keep + k`.
fn sequence_sizes(c: usize) -> (usize, usize, usize) {
    let k = c / 2;
    let keep = (c - k) / 2;
    (c, k, keep)
}

/// The sequence: reserves the whole counter, splits, shrinks (a speculative
/// rollback), merges and drops, checking every length on the way. While it
/// holds slots it accounts for them in the shadow.
fn sequence<S: Slots>(s: &S, sh: &Shadow, others: &[&[usize]]) {
    let c = s.capacity();
    let (all, k, keep) = sequence_sizes(c);
    match s.try_reserve(all) {
        Ok(mut g) => {
            assert_len(all, g.len());
            sh.enter(all);
            assert!(g.split(all + 1).is_none(), "split of more than held");
            assert_len(all, g.len());
            let part = g.split(k).expect("split of less than held");
            assert_len(k, part.len());
            assert_len(all - k, g.len());
            let rest = g.len();
            sh.exit(rest - keep);
            g.shrink_to(keep);
            assert_len(keep, g.len());
            g.shrink_to(keep + 1); // never grows
            assert_len(keep, g.len());
            g.merge(part);
            assert_len(keep + k, g.len());
            sh.exit(g.len());
            drop(g);
        }
        Err(e) => assert_full(e, all, c, &possible(others, 0)),
    }
}

/// A reserver of `n` that holds and drops.
fn reserver<S: Slots>(s: &S, sh: &Shadow, n: usize, others: &[&[usize]]) {
    match s.try_reserve(n) {
        Ok(g) => {
            assert_len(n, g.len());
            sh.enter(n);
            sh.exit(n);
            drop(g);
        }
        Err(e) => assert_full(e, n, s.capacity(), &possible(others, 0)),
    }
}

/// The sequence against one reserver (or two, with `three`) of what the
/// sequence leaves after its rollback: that fits exactly once it shrank.
fn split_merge_shrink<S: Slots>(c: usize, three: bool) {
    check_threads(2 + usize::from(three), move || {
        let slots = Arc::new(S::with_capacity(c));
        let shadow = Arc::new(Shadow::new(c));
        let (all, k, keep) = sequence_sizes(c);
        let after = keep + k;
        let other = c - after;
        let seq_holds = [all, after];
        let seq = spawn(&slots, &shadow, move |s, sh| {
            if three {
                sequence(&**s, sh, &[&[other], &[1]]);
            } else {
                sequence(&**s, sh, &[&[other]]);
            }
        });
        let third = three.then(|| {
            spawn(&slots, &shadow, move |s, sh| {
                reserver(&**s, sh, 1, &[&seq_holds, &[other]]);
            })
        });
        if three {
            reserver(&*slots, &shadow, other, &[&seq_holds, &[1]]);
        } else {
            reserver(&*slots, &shadow, other, &[&seq_holds]);
        }
        seq.join().expect("model thread panicked");
        if let Some(t) = third {
            t.join().expect("model thread panicked");
        }
        assert_drained(&*slots);
    });
}

fn split_merge_shrink_2<S: Slots>(c: usize) {
    split_merge_shrink::<S>(c, false);
}

fn split_merge_shrink_3<S: Slots>(c: usize) {
    split_merge_shrink::<S>(c, true);
}

#[test]
fn split_merge_shrink_vs_drop_2_threads() {
    CAPACITIES.for_each(split_merge_shrink_2::<SlotCounter>);
}

#[test]
fn split_merge_shrink_vs_drop_3_threads() {
    CAPACITIES.for_each(split_merge_shrink_3::<SlotCounter>);
}

// Token by token can only take part of the whole counter when the reserver
// holds some of it and leaves some free: capacity 2 and up.
caught!(split_merge_shrink_2_threads_token_by_token: split_merge_shrink_2::<TokenByToken>,
    "partial admission", from 2);
caught!(split_merge_shrink_2_threads_against_capacity: split_merge_shrink_2::<AgainstCapacity>,
    "overcommit");
caught!(split_merge_shrink_2_threads_check_then_add: split_merge_shrink_2::<CheckThenAdd>,
    "overcommit");
caught!(split_merge_shrink_3_threads_check_then_add: split_merge_shrink_3::<CheckThenAdd>,
    "overcommit");

// ---------------------------------------------------------------------------
// OwnedReservation across threads
// ---------------------------------------------------------------------------

/// One owned guard takes the whole counter and is split in two; each half
/// is moved to its own thread. The first half shrinks to nothing (giving
/// its slots back) and grows again by what it gave back; the second grows
/// by the same amount at the same time, so at most one of the two grows
/// fits. With `three`, the second half goes to a spawned thread and the
/// model's main thread also reserves one slot meanwhile.
fn owned_across_threads<S: Slots>(c: usize, three: bool) {
    check_threads(2 + usize::from(three), move || {
        let slots = Arc::new(S::with_capacity(c));
        let shadow = Arc::new(Shadow::new(c));
        let mut first = slots.try_reserve_owned(c).expect("empty counter");
        assert_len(c, first.len());
        shadow.enter(c);
        let second = first.split(c / 2).expect("split of less than held");
        let (n1, n2) = (first.len(), second.len());
        let grow = n1;
        // What each thread can hold at any moment (besides nothing).
        let first_holds = [n1];
        let second_holds = [n2, n2 + grow];
        let third_holds: &'static [usize] = if three { &[1] } else { &[] };

        let t1 = spawn(&slots, &shadow, move |s, sh| {
            let mut g = first;
            sh.exit(n1);
            g.shrink_to(0);
            assert!(g.is_empty(), "shrink_to(0) left {}", g.len());
            match g.try_grow(grow) {
                Ok(()) => {
                    assert_len(grow, g.len());
                    sh.enter(grow);
                    sh.exit(grow);
                }
                Err(e) => {
                    assert_len(0, g.len());
                    assert_full(
                        e,
                        grow,
                        s.capacity(),
                        &possible(&[&second_holds, third_holds], 0),
                    );
                }
            }
            drop(g);
        });
        let second_half = move |s: &S, sh: &Shadow, mut g: S::Owned| {
            match g.try_grow(grow) {
                Ok(()) => {
                    assert_len(n2 + grow, g.len());
                    sh.enter(grow);
                }
                Err(e) => {
                    assert_len(n2, g.len());
                    assert_full(
                        e,
                        grow,
                        s.capacity(),
                        &possible(&[&first_holds, third_holds], n2),
                    );
                }
            }
            sh.exit(g.len());
            drop(g);
        };
        if three {
            let t2 = spawn(&slots, &shadow, move |s, sh| second_half(s, sh, second));
            match slots.try_reserve(1) {
                Ok(g) => {
                    assert_len(1, g.len());
                    shadow.enter(1);
                    shadow.exit(1);
                    drop(g);
                }
                Err(e) => assert_full(e, 1, c, &possible(&[&first_holds, &second_holds], 0)),
            }
            t2.join().expect("model thread panicked");
        } else {
            second_half(&slots, &shadow, second);
        }
        t1.join().expect("model thread panicked");
        assert_drained(&*slots);
    });
}

fn owned_across_threads_2<S: Slots>(c: usize) {
    owned_across_threads::<S>(c, false);
}

fn owned_across_threads_3<S: Slots>(c: usize) {
    owned_across_threads::<S>(c, true);
}

#[test]
fn owned_reservation_across_threads_2_threads() {
    CAPACITIES.for_each(owned_across_threads_2::<SlotCounter>);
}

#[test]
fn owned_reservation_across_threads_3_threads() {
    CAPACITIES.for_each(owned_across_threads_3::<SlotCounter>);
}

// Token by token grows one half partially once the other half took some of
// the freed slots: needs a grow of at least 2, capacity 3 and up.
caught!(owned_across_threads_2_threads_token_by_token: owned_across_threads_2::<TokenByToken>,
    "partial admission", from 3);
caught!(owned_across_threads_2_threads_against_capacity: owned_across_threads_2::<AgainstCapacity>,
    "overcommit");
caught!(owned_across_threads_2_threads_check_then_add: owned_across_threads_2::<CheckThenAdd>,
    "overcommit");
caught!(owned_across_threads_3_threads_check_then_add: owned_across_threads_3::<CheckThenAdd>,
    "overcommit");
