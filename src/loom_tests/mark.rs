//! Loom models of `Sequence::publish`'s mark (`published`) against
//! concurrent publishes of the same blocks: a block a publish finds
//! claimed by another holder's publish is `Published::Not` to it, so its
//! mark stops there, and that matters when the claim then loses.
//!
//! Run with `scripts/loom mark`.
//!
//! The negative control, `claim_refused_as_cached`, reports a claim
//! refused because another holder's claim is in flight as
//! `Published::Already`, so the mark moves past the block:
//! [`a_fork_stops_its_mark_at_its_parents_claim_that_loses_claim_refused_as_cached_is_caught`]
//! must fail with "never offered again".

use std::sync::Arc;

use crate::sync::Faults;
use crate::{BlockHash, BlockPool, Sequence};

use crate::loom_tests::pool_world::{check_one_preemption, SOUND};

/// A rival's one-token block `r` (the lower id), and a parent's `a` that
/// the parent shares with its fork. The parent, the fork and the rival
/// publish key `K` at once: the fork may find `a` claimed by the parent,
/// whose claim then loses to the rival's on the lower id. Then the
/// parent and the rival go and the rival's key is reset: the fork, the
/// last holder of `a`, must offer it again and cache it (its mark must
/// not have moved past `a` on the parent's claim).
fn fork_stops_its_mark_at_its_parents_claim(faults: Faults) {
    // Three publishes at once: one preemption (see `check_one_preemption`).
    check_one_preemption(move || {
        let key = BlockHash([1; 32]);
        let pool = Arc::new(BlockPool::with_faults(2, 1, 1, faults));
        let one_block = || {
            let mut seq = Sequence::new(Arc::clone(&pool));
            seq.try_append(1).unwrap();
            seq
        };
        let mut rival = one_block();
        let mut parent = one_block();
        assert!(rival.blocks()[0] < parent.blocks()[0]);
        let (mut fork, copy) = parent.try_fork().unwrap();
        assert!(copy.is_none());
        let a = parent.blocks()[0];
        let p = loom::thread::spawn(move || {
            let n = parent.publish(&[key]);
            (parent, n)
        });
        let f = loom::thread::spawn(move || {
            let n = fork.publish(&[key]);
            (fork, n)
        });
        let theirs = rival.publish(&[key]);
        let (parent, mine) = p.join().unwrap();
        let (mut fork, forks) = f.join().unwrap();
        assert_eq!(mine + forks + theirs, 1, "the key cached once");
        drop(parent);
        drop(rival);
        pool.reset_prefix_cache();
        let again = fork.publish(&[key]);
        assert_eq!(
            again + mine + forks,
            1,
            "{a}, uncached, never offered again (fork's publishes: {forks}, then {again}; \
             parent's {mine}, rival's {theirs})"
        );
        assert_eq!(pool.cached_blocks(), 1, "{a} holds the key");
    });
}

#[test]
fn a_fork_stops_its_mark_at_its_parents_claim_that_loses() {
    fork_stops_its_mark_at_its_parents_claim(SOUND);
}

#[test]
#[should_panic(expected = "never offered again")]
fn a_fork_stops_its_mark_at_its_parents_claim_that_loses_claim_refused_as_cached_is_caught() {
    fork_stops_its_mark_at_its_parents_claim(Faults {
        claim_refused_as_cached: true,
        ..SOUND
    });
}
