//! Loom models of a sequence's sole drop (a load and a plain store of the
//! block's state word) racing the drop of the block's other holder: two
//! releases of a block with two references (a fork's parent and child),
//! and a sequence's drop racing its fork's. A count of 1 read by one side
//! means the other side has dropped already, so its Release CAS
//! happens-before the plain store.
//!
//! Each model's negative control is the misuse that [`SequenceCall`] keeps
//! outside code from: the same two calls on a block with one reference (a
//! double release through `BlockAllocator::release`, or a release of a
//! sequence's block racing the sequence's drop). Inside the crate a model
//! can build the token and make those calls; both sides then read a count
//! of 1, store 0 and give the block back, and loom catches it.
//!
//! After both threads are done, every model checks that the block has no
//! reference, the used count is 0, the admission counts sum to the pool's
//! capacity (a count given back twice reads one over) and taking every
//! block hands each out once.
//!
//! | model | threads, blocks | negative control, caught |
//! |---|---|---|
//! | [`double_release`]: two releases of a block with two references | 2, 2 | `plain_sole_drop`: one reference, released twice |
//! | [`release_vs_seq_drop`]: a sequence's drop and its fork's | 2, 2 | `plain_sole_drop`: a release of the sequence's block instead of the fork |
use std::sync::Arc;

use crate::allocator::SequenceCall;
use crate::loom_tests::pool_world::{check, DOUBLE, LOST, SOUND};
use crate::{BlockAllocator, BlockId, BlockPool, Sequence};
use loom::thread;

/// A pool of two one-slot blocks, one shard.
fn pool() -> Arc<BlockPool> {
    Arc::new(BlockPool::with_faults(2, 1, 1, SOUND))
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

/// Two threads release the same block through the token, taken through
/// `BlockAllocator::try_alloc_with_headroom` (a sequence's flag). With
/// `shared`, a second reference is added through `BlockAllocator::add_refs`
/// first (a fork's), so each thread drops its own; without it (the
/// control), both drop the one reference.
fn double_release(shared: bool) {
    check(move || {
        let pool = pool();
        let mut ids = Vec::new();
        BlockAllocator::try_alloc_with_headroom(&*pool, &SequenceCall::new(), 1, 0, &mut ids)
            .expect("room");
        let id = ids[0];
        if shared {
            assert_eq!(
                BlockAllocator::add_refs(&*pool, &SequenceCall::new(), &[id]),
                1
            );
        }
        let other = Arc::clone(&pool);
        let t = thread::spawn(move || {
            BlockAllocator::release(&*other, &SequenceCall::new(), &[id]);
        });
        BlockAllocator::release(&*pool, &SequenceCall::new(), &[id]);
        t.join().expect("the release does not panic");
        assert_whole(&pool, id);
    });
}

/// A one-token sequence is dropped on one thread while this one drops its
/// fork, which shares the sequence's (full) block. The control releases
/// the sequence's block through the token instead of dropping a fork.
fn release_vs_seq_drop(fork: bool) {
    check(move || {
        let pool = pool();
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(1).expect("room for the sequence");
        let id = seq.blocks()[0];
        let child = fork.then(|| seq.try_fork().expect("a full block is shared"));
        let t = thread::spawn(move || drop(seq));
        match child {
            Some(child) => drop(child),
            None => BlockAllocator::release(&*pool, &SequenceCall::new(), &[id]),
        }
        t.join().expect("the drop does not panic");
        assert_whole(&pool, id);
    });
}

#[test]
fn double_release_sound() {
    double_release(true);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn double_release_plain_sole_drop_is_caught() {
    double_release(false);
}

#[test]
fn release_vs_seq_drop_sound() {
    release_vs_seq_drop(true);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn release_vs_seq_drop_plain_sole_drop_is_caught() {
    release_vs_seq_drop(false);
}
