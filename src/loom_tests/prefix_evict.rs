//! Loom models of the prefix cache's eviction ring: an evictor taking
//! its candidates while another evictor refills the ring, and a release
//! racing a refill of an overflowed ring, each with a negative control
//! that loom must catch.
//!
//! Run with `scripts/loom prefix_evict`.
//!
//! The second model's executions are long (two evictions, a refill and
//! the steps after the race): it raises loom's bound on an execution's
//! branches to 20,000 (`check_long`).
//!
//! # The models
//!
//! | model | threads, blocks | control (caught by) |
//! |---|---|---|
//! | [`refill_vs_claimed_candidate`] | 2, 3 | `claim_before_read` (evicted out of order) |
//! | [`release_vs_refill_keeps_overflowed`] | 2, 3 | `unchecked_overflow_clear` (evicted out of order) |
//!
//! A pool of 3 blocks has a ring of 3 slots. Its candidates' positions
//! only grow, position `p` in slot `p % 3`, and a refill writes the
//! positions after the ring's length, up to a whole ring past the next
//! candidate to take: the slots of positions already taken. An evictor
//! copies its candidates and then claims their positions; a refill that
//! reads the claim (`Acquire`, the claim's CAS is `Release`) may rewrite
//! those slots, after the copy. The control claims first and copies
//! after: a refill that begins in between rewrites the slot with the
//! youngest block, which the evictor then takes.
//!
//! The model also checks that every block comes back: free and
//! admissible, once every sequence is gone.
use std::sync::Arc;

use crate::loom_tests::pool_world::{
    check, check_long, CLAIM_BEFORE_READ, LOST, SOUND, UNCHECKED_OVERFLOW_CLEAR,
};
use crate::sync::Faults;
use crate::{BlockHash, BlockPool, Sequence};
use loom::thread;

/// An eviction took a younger block while an older one stayed cached.
const OUT_OF_ORDER: &str = "evicted out of order";

/// Key number `n`.
fn key(n: u8) -> BlockHash {
    BlockHash([n; 32])
}

/// A sequence of one block published under key `n` (one token a block).
fn published(pool: &Arc<BlockPool>, n: u8) -> Sequence {
    let mut seq = Sequence::new(Arc::clone(pool));
    seq.try_append(1).expect("a block for the key");
    assert_eq!(seq.publish(&[key(n)]), 1);
    seq
}

/// Whether key `n` is cached now (a match, let go at once).
fn cached(pool: &Arc<BlockPool>, n: u8) -> bool {
    Sequence::new(Arc::clone(pool)).try_match_prefix(&[key(n)]) == 1
}

/// Three cached blocks, all evictable: keys 4 and 5 (released in that
/// order), and key 3, released last, after a revival. The ring holds
/// key 3's first release (a stale candidate), then 4's and 5's, and is
/// overflowed (key 3's new release found it full). Two threads each
/// allocate a block: together they evict keys 4 and 5, the two least
/// recently released, and key 3 stays cached.
///
/// Each eviction that takes 4's or 5's candidate leaves at most one
/// candidate in the ring (a refill's threshold for a ring this small), so
/// either thread may refill it meanwhile: the refill puts
/// the evictable blocks that have no current candidate (key 3's, and
/// 4's or 5's if it is taken but not yet evicted) after the candidate
/// left, in the slots of the positions taken.
fn refill_vs_claimed_candidate(faults: Faults) {
    check(move || {
        let pool = Arc::new(BlockPool::with_faults(3, 1, 1, faults));
        // Keys 1, 2 and 3 cached and released in that order: the ring's
        // first three candidates.
        let first: Vec<Sequence> = [1, 2, 3].map(|n| published(&pool, n)).into();
        drop(first);
        // An allocation of two evicts keys 1 and 2; keys 4 and 5 go on
        // those blocks, and are released (the sequence's last block first).
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(2).expect("two evictable blocks");
        assert_eq!(seq.publish(&[key(5), key(4)]), 2);
        drop(seq);
        // Key 3 revived and released again: the youngest.
        assert!(cached(&pool, 3), "key 3 still cached");
        let evictors: Vec<_> = (0..2)
            .map(|_| {
                let pool = Arc::clone(&pool);
                thread::spawn(move || {
                    let mut seq = Sequence::new(pool);
                    seq.try_append(1).expect("an evictable block");
                    seq
                })
            })
            .collect();
        let held: Vec<Sequence> = evictors.into_iter().map(|e| e.join().unwrap()).collect();
        let kept = (3..=5).filter(|&n| cached(&pool, n)).collect::<Vec<_>>();
        assert_eq!(kept, [3], "{OUT_OF_ORDER}: keys {kept:?} cached");
        drop(held);
        assert_eq!(pool.free_blocks(), 3, "{LOST}");
        assert_eq!(pool.admission_free_uncapped(), 3, "{LOST}");
    });
}

#[test]
fn refill_vs_claimed_candidate_sound() {
    refill_vs_claimed_candidate(SOUND);
}

#[test]
#[should_panic(expected = "evicted out of order")]
fn refill_vs_claimed_candidate_claim_before_read_is_caught() {
    refill_vs_claimed_candidate(CLAIM_BEFORE_READ);
}

/// A release that a refill's scan misses, while the ring is overflowed:
/// its append is skipped (the ring is overflowed) and the scan passed its
/// block while it was held (or read its old stamp, or placed blocks
/// after it became evictable); or a release whose append read the ring
/// not overflowed and wrote into the slots that the refill was filling,
/// so that the refill published the release's word in place of one of its
/// own, and the append's CAS then failed. Each is a miss, which the
/// refill's clearing CAS must not pass over; the control clears the
/// overflow whatever missed, so the block left out is outside the ring
/// while the ring says none is: blocks released later are appended and
/// evicted before it, even by one thread once the race is over.
///
/// Keys 1, 2 and 3 on the pool's three blocks, released 3, 2, 1; key 1
/// revived and released again (the ring is full: overflowed); key 2
/// revived and held by the releaser. The evictor allocates two blocks
/// (keys 3 and 1, the least recently released evictable ones; it
/// refills the ring once the candidate of key 3 is taken) while the
/// releaser lets key 2 go. Then, on one thread: a block published under
/// key 4 and released; an allocation of two blocks (one free, one
/// evicted) must evict key 2, released before key 4.
fn release_vs_refill_keeps_overflowed(faults: Faults) {
    check_long(20_000, move || {
        let pool = Arc::new(BlockPool::with_faults(3, 1, 1, faults));
        let mut first = Sequence::new(Arc::clone(&pool));
        first.try_append(3).expect("three blocks");
        assert_eq!(first.publish(&[key(1), key(2), key(3)]), 3);
        drop(first);
        assert!(cached(&pool, 1), "key 1 cached");
        let mut two = Sequence::new(Arc::clone(&pool));
        assert_eq!(two.try_match_prefix(&[key(2)]), 1);
        let evictor = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let mut seq = Sequence::new(pool);
                seq.try_append(2).expect("two evictable blocks");
                seq
            })
        };
        let releaser = thread::spawn(move || drop(two));
        releaser.join().unwrap();
        drop(evictor.join().unwrap());
        let mut young = Sequence::new(Arc::clone(&pool));
        young.try_append(1).expect("a free block");
        assert_eq!(young.publish(&[key(4)]), 1);
        drop(young);
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(2)
            .expect("a free block and an evictable one");
        drop(seq);
        let kept = [2, 4]
            .into_iter()
            .filter(|&n| cached(&pool, n))
            .collect::<Vec<_>>();
        assert_eq!(kept, [4], "{OUT_OF_ORDER}: keys {kept:?} cached");
        assert_eq!(pool.free_blocks(), 3, "{LOST}");
    });
}

#[test]
fn release_vs_refill_keeps_overflowed_sound() {
    release_vs_refill_keeps_overflowed(SOUND);
}

#[test]
#[should_panic(expected = "evicted out of order")]
fn release_vs_refill_keeps_overflowed_unchecked_overflow_clear_is_caught() {
    release_vs_refill_keeps_overflowed(UNCHECKED_OVERFLOW_CLEAR);
}
