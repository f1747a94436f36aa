//! Loom models that attack the prefix cache's publish protocol: rivals
//! that are reclaimed, killed or deferred to while a publisher rescans,
//! and a sole holder's store claim (key words first) under a matcher.
//!
//! Run with `scripts/loom prefix_publish_attack`.

use std::sync::Arc;

use crate::loom_tests::pool_world::{
    check, holder_gone_then_publish, ARMED_CLAIM, RELAXED_PUBLISH, SOUND,
};
use crate::sync::{AtomicUsize, Faults, Ordering};
use crate::{BlockHash, BlockPool, Sequence};
use loom::thread;

/// Three one-token blocks: holder `c`, rival `r` and publisher `p`, with
/// `r < p`. The holder publishes key `K` while the rival does; the rival's
/// publish of `K` loses to the holder (or wins), and the rival then
/// publishes another key `K2` on the same block (its tokens were
/// rewritten: a legitimate second publish of an uncached block). The
/// holder goes (its key reset), and only then does `p` publish `K`. `p`
/// must not lose to the rival's claim of `K2`: the key ends on a block.
/// The rival holds its block alone (its claims are a sole holder's store)
/// or, with `rival_forked`, shares it with a fork (a CAS).
fn rival_reclaimed_for_another_key(faults: Faults, rival_forked: bool) {
    holder_gone_then_publish(faults, Some(BlockHash([2; 32])), rival_forked);
}

#[test]
fn a_rival_reclaimed_for_another_key_is_no_reason_to_lose() {
    rival_reclaimed_for_another_key(SOUND, false);
}

/// A claim that is a rival before its key words are written: the rescan
/// of `p` finds the entry the rival's claim of `K` left, reads the state
/// of its claim of `K2` with the key words of `K`, and defers to it (or
/// loses to its commit). Here the sole holder's claim is stored before its
/// key words are written.
#[test]
#[should_panic(expected = "nobody holds the key")]
fn a_rival_reclaimed_for_another_key_armed_claim_is_caught() {
    rival_reclaimed_for_another_key(ARMED_CLAIM, false);
}

#[test]
fn a_shared_rival_reclaimed_for_another_key_is_no_reason_to_lose() {
    rival_reclaimed_for_another_key(SOUND, true);
}

/// As [`a_rival_reclaimed_for_another_key_armed_claim_is_caught`], for
/// the CAS claim of a shared block: the claim is not `KILLED` until the
/// arm.
#[test]
#[should_panic(expected = "nobody holds the key")]
fn a_shared_rival_reclaimed_for_another_key_armed_claim_is_caught() {
    rival_reclaimed_for_another_key(ARMED_CLAIM, true);
}

/// Key number `n`.
fn key(n: u8) -> BlockHash {
    BlockHash([n; 32])
}

/// A pool of two-token blocks with a content tag a block: the key number
/// whose content the block holds.
struct Tagged {
    pool: Arc<BlockPool>,
    tags: Box<[AtomicUsize]>,
}

impl Tagged {
    /// Tags `seq`'s last block with key `n`'s content.
    fn write(&self, seq: &Sequence, n: u8) {
        let id = *seq.blocks().last().expect("a block");
        // Relaxed: the tag is checked against the pool's own ordering.
        self.tags[id.index()].store(usize::from(n), Ordering::Relaxed);
    }

    /// Matches key `n` and checks the block's content if it hit.
    fn matched(&self, n: u8) -> Sequence {
        let mut seq = Sequence::new(Arc::clone(&self.pool));
        if seq.try_match_prefix(&[key(n)]) == 1 {
            let id = seq.blocks()[0];
            // Relaxed: see `write`.
            let tag = self.tags[id.index()].load(Ordering::Relaxed);
            assert_eq!(
                tag,
                usize::from(n),
                "stale hit: key {n} matched {id} holding {tag}"
            );
        }
        seq
    }
}

/// A sole holder's block, published under key 1, is truncated into (its
/// key dropped), written with key 2's content and republished under key 2:
/// the republish writes its key words before its claim, a `Release`
/// store (or, if the matcher holds the block by then, the append copies it
/// and key 2 goes on the copy). A matcher of key 1 and then of key 2 races
/// it: each hit must hold the content of the key it matched; after both,
/// key 2 is cached. The control takes the publish's releases away: a
/// match of key 2 can then read the block's content from before.
fn match_vs_sole_republish(faults: Faults) {
    check(move || {
        let tagged = Arc::new(Tagged {
            pool: Arc::new(BlockPool::with_faults(2, 2, 1, faults)),
            tags: (0..2).map(|_| AtomicUsize::new(0)).collect(),
        });
        let mut seq = Sequence::new(Arc::clone(&tagged.pool));
        seq.try_append(2).expect("a free block");
        tagged.write(&seq, 1);
        assert_eq!(seq.publish(&[key(1)]), 1);
        let matcher = {
            let tagged = Arc::clone(&tagged);
            thread::spawn(move || (tagged.matched(1), tagged.matched(2)))
        };
        seq.truncate(1);
        let (_, copy) = seq.try_append_cow(1).expect("room for a copy");
        tagged.write(&seq, 2);
        let republished = seq.publish(&[key(2)]);
        let (first, second) = matcher.join().unwrap();
        // A matcher that held the block made the append copy it first.
        let _ = copy;
        assert_eq!(republished, 1, "key 2 published");
        drop((first, second));
        let after = tagged.matched(2);
        assert_eq!(after.blocks().len(), 1, "key 2 cached");
        drop((after, seq));
        assert_eq!(tagged.pool.used_blocks(), 0);
    });
}

#[test]
fn match_vs_sole_republish_sound() {
    match_vs_sole_republish(SOUND);
}

#[test]
#[should_panic(expected = "stale hit")]
fn match_vs_sole_republish_relaxed_publish_is_caught() {
    match_vs_sole_republish(RELAXED_PUBLISH);
}
