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
//! | [`fork_read_vs_sole_drop`]: a sequence reads its block and drops it, its fork drops it and retakes it | 2, 1 | `relaxed_sole_drop` (causality) |
use std::sync::Arc;

use crate::allocator::SequenceCall;
use crate::loom_tests::pool_world::{check, PoolWorld, DOUBLE, LOST, RELAXED_SOLE_DROP, SOUND};
use crate::sync::Faults;
use crate::{BlockAllocator, BlockId, BlockPool, Sequence};
use loom::thread;

/// A pool of two one-slot blocks, one shard.
fn pool() -> Arc<BlockPool> {
    Arc::new(BlockPool::with_faults(2, 1, 1, SOUND))
}

/// The pool after the race: `id` has no reference, nothing is used, the
/// admission counts are exact, and every block comes out once.
fn assert_whole(pool: &BlockPool, id: BlockId) {
    assert_books(pool, id);
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

/// The ordering of the sole drop. A one-token sequence in a one-block
/// pool and its fork share the block; this thread reads the block through
/// the sequence and drops it, while another drops the fork and then takes
/// the block back (raw) if it is free, and writes into it. If the
/// sequence's drop came first, the fork's drop is the sole drop: the read
/// happens-before the write only through the sequence's Release drop and
/// the sole drop's Acquire load (loom's causality check on the block's
/// payload); under `relaxed_sole_drop` it does not.
fn fork_read_vs_sole_drop(faults: Faults) {
    check(move || {
        let world = PoolWorld::new(1, 1, faults, "sequence");
        let mut seq = Sequence::new(Arc::clone(&world.pool));
        seq.try_append(1).expect("the pool's one block");
        let id = seq.blocks()[0];
        let (child, _) = seq.try_fork().expect("a full block is shared");
        let taker = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                drop(child);
                let mut got = Vec::new();
                if world.pool.try_alloc(1, &mut got).is_ok() {
                    assert_eq!(got, [id], "{DOUBLE}");
                    world.write(id);
                    world.pool.free(&got).expect("just taken");
                }
            })
        };
        world.read(id);
        drop(seq);
        taker.join().expect("the fork's drop does not panic");
        assert_books(&world.pool, id);
    });
}

/// The books after the race: `id` has no reference, nothing is used, and
/// the admission counts are exact.
fn assert_books(pool: &BlockPool, id: BlockId) {
    assert_eq!(pool.ref_count(id), Some(0), "{LOST}: {id}'s count");
    assert_eq!(pool.used_blocks(), 0, "{LOST}: used blocks");
    assert_eq!(
        pool.admission_free_uncapped(),
        pool.num_blocks(),
        "{LOST}: the admission counts"
    );
}

#[test]
fn fork_read_vs_sole_drop_sound() {
    fork_read_vs_sole_drop(SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn fork_read_vs_sole_drop_relaxed_sole_drop_is_caught() {
    fork_read_vs_sole_drop(RELAXED_SOLE_DROP);
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
