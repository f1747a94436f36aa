//! Loom models of a double release through the public
//! `BlockAllocator::release` of a `BlockPool` (misuse): two releases of the
//! same sequence-flagged block, and a release of a sequence's block racing
//! the sequence's drop. The sequence flag keeps a raw `BlockPool::free`
//! away from such a block, but not `release`, which is how sequences (and
//! callers of `BlockAllocator`'s allocations) give their blocks back; so a
//! sole holder's drop must be a read-modify-write too.
//!
//! After both threads are done, every model checks that the block has no
//! reference, the used count is 0, the admission counts sum to the pool's
//! capacity (a count given back twice reads one over) and taking every
//! block hands each out once.
//!
//! | model | threads, blocks | negative control, caught |
//! |---|---|---|
//! | [`double_release`]: two releases of one block | 2, 2 | `plain_sole_drop` |
//! | [`release_vs_seq_drop`]: a release of a sequence's block and its drop | 2, 2 | `plain_sole_drop` |
use std::sync::Arc;

use crate::loom_tests::pool_world::{check, DOUBLE, LOST, PLAIN_SOLE_DROP, SOUND};
use crate::sync::Faults;
use crate::{BlockAllocator, BlockId, BlockPool, Sequence};
use loom::thread;

/// A pool of two one-slot blocks, one shard, with `faults`.
fn pool(faults: Faults) -> Arc<BlockPool> {
    Arc::new(BlockPool::with_faults(2, 1, 1, faults))
}

/// The pool after the race: `id` has no reference, nothing is used, the
/// admission counts are exact, and every block comes out once.
fn assert_whole(pool: &BlockPool, id: BlockId) {
    assert_eq!(pool.ref_count(id), Some(0), "{LOST}: {id}'s count");
    assert_eq!(pool.used_blocks(), 0, "{LOST}: used blocks");
    assert_eq!(
        pool.admission_free_uncapped(),
        pool.num_blocks(),
        "{LOST}: the admission counts"
    );
    let mut all = Vec::new();
    pool.try_alloc(pool.num_blocks(), &mut all)
        .expect("every block can be taken");
    assert_ne!(all[0], all[1], "{DOUBLE}");
    pool.free(&all).expect("just taken");
}

/// Two threads release the same block, taken through
/// `BlockAllocator::try_alloc_with_headroom` (a sequence's flag).
fn double_release(faults: Faults) {
    check(move || {
        let pool = pool(faults);
        let mut ids = Vec::new();
        BlockAllocator::try_alloc_with_headroom(&*pool, 1, 0, &mut ids).expect("room");
        let id = ids[0];
        let other = Arc::clone(&pool);
        let t = thread::spawn(move || BlockAllocator::release(&*other, &[id]));
        BlockAllocator::release(&*pool, &[id]);
        t.join().expect("the release does not panic");
        assert_whole(&pool, id);
    });
}

/// A one-token sequence is dropped on one thread while this one releases
/// its block through `BlockAllocator::release`.
fn release_vs_seq_drop(faults: Faults) {
    check(move || {
        let pool = pool(faults);
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(1).expect("room for the sequence");
        let id = seq.blocks()[0];
        let t = thread::spawn(move || drop(seq));
        BlockAllocator::release(&*pool, &[id]);
        t.join().expect("the drop does not panic");
        assert_whole(&pool, id);
    });
}

#[test]
fn double_release_sound() {
    double_release(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn double_release_plain_sole_drop_is_caught() {
    double_release(PLAIN_SOLE_DROP);
}

#[test]
fn release_vs_seq_drop_sound() {
    release_vs_seq_drop(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn release_vs_seq_drop_plain_sole_drop_is_caught() {
    release_vs_seq_drop(PLAIN_SOLE_DROP);
}
