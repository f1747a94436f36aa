//! Double releases through the public [`BlockAllocator`] calls of a
//! `BlockPool`, with real threads.
//!
//! `BlockAllocator::release` is public, and `BlockPool::free`'s rules apply
//! to it (see `BlockAllocator`'s docs): listing a block the caller does not
//! hold is a logic error, yet "whatever races, the pool's own books stay
//! exact: no block is given back twice, the count of used blocks is given
//! back once per block" (`BlockPool::free`; the crate docs' guarantee
//! table: "a double free racing any give-back (... a sequence's drop ...)
//! gives no block back twice, gives the used count back once per block").
//!
//! * Two callers release the same blocks, taken through
//!   `BlockAllocator::try_alloc_with_headroom` (so carrying the sequence
//!   flag), at once.
//! * A caller releases a sequence's blocks (`Sequence::blocks`) while the
//!   sequence is dropped on another thread.
//!
//! Each round starts both threads at a barrier. After each round the
//! listed blocks have no reference, `used_blocks() == 0`, the admission
//! counts sum to `num_blocks()` exactly (a double give-back would leave
//! them one over per block, and a later allocation admitted for a block
//! that is not there spins forever), and taking every block hands each
//! out once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use kvslots::{BlockAllocator, BlockId, BlockPool, Sequence};

/// Blocks per round: one bitmap word, so that both releases walk the same
/// word in the same order (last listed first) and meet on some block.
const BLOCKS: usize = 64;

/// The pool is whole: the released `ids` have no reference, nothing is
/// used, the admission counts are exact, and every block can be taken once.
fn check_whole(pool: &BlockPool, ids: &[BlockId], round: usize) {
    for id in ids {
        assert_eq!(pool.ref_count(*id), Some(0), "round {round}: {id}");
    }
    assert_eq!(pool.used_blocks(), 0, "round {round}: used count");
    let mut all = Vec::new();
    pool.try_alloc(pool.num_blocks(), &mut all)
        .expect("every block can be taken");
    // With every block taken nothing is free; a used count given back
    // twice leaves the admission counts one over, which reads as a free
    // block here (and an allocation admitted for it would find none).
    assert_eq!(
        pool.free_blocks(),
        0,
        "round {round}: a block's used count was given back twice"
    );
    let mut distinct = all.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        pool.num_blocks(),
        "round {round}: a block twice"
    );
    pool.free(&all).expect("just taken");
}

/// Runs `a` and `b` at once: both threads spin until the other arrives,
/// then `b` waits `delay` spin hints, so that over the rounds its calls land
/// before, among and after `a`'s. Fails the test if either panicked (a
/// debug build asserts that no free block is returned twice).
fn together(a: impl FnOnce() + Send, b: impl FnOnce() + Send, delay: usize, round: usize) {
    let arrived = AtomicUsize::new(0);
    let meet = || {
        // SeqCst (both): a rendezvous, not the code under test.
        arrived.fetch_add(1, Ordering::SeqCst);
        while arrived.load(Ordering::SeqCst) < 2 {
            std::hint::spin_loop();
        }
    };
    thread::scope(|s| {
        let ha = s.spawn(|| {
            meet();
            a();
        });
        let hb = s.spawn(|| {
            meet();
            for _ in 0..delay {
                std::hint::spin_loop();
            }
            b();
        });
        let (ra, rb) = (ha.join(), hb.join());
        assert!(
            ra.is_ok() && rb.is_ok(),
            "round {round}: a release panicked (a block returned twice)"
        );
    });
}

#[test]
fn a_racing_double_release_gives_each_block_back_once() {
    let pool = Arc::new(BlockPool::with_shards(BLOCKS, 16, 1));
    for round in 0..2_000 {
        let mut ids: Vec<BlockId> = Vec::new();
        BlockAllocator::try_alloc_with_headroom(&*pool, BLOCKS, 0, &mut ids).unwrap();
        together(
            || BlockAllocator::release(&*pool, &ids),
            || BlockAllocator::release(&*pool, &ids),
            round % 97,
            round,
        );
        check_whole(&pool, &ids, round);
    }
}

#[test]
fn a_release_of_a_sequence_s_blocks_racing_its_drop_gives_each_back_once() {
    let pool = Arc::new(BlockPool::with_shards(BLOCKS, 1, 1));
    for round in 0..2_000 {
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(BLOCKS).unwrap();
        let ids = seq.blocks().to_vec();
        together(
            move || drop(seq),
            || BlockAllocator::release(&*pool, &ids),
            round % 97,
            round,
        );
        check_whole(&pool, &ids, round);
    }
}
