//! Outside code cannot change a sequence's block, with real threads.
//!
//! The calls that give a sequence's blocks back (`BlockAllocator::release`
//! and its kin) take a `SequenceCall`, which only the crate builds, so a
//! double release of a sequence's blocks cannot be written here (the
//! compile-fail examples of `SequenceCall` show it). What outside code has
//! are the raw calls, `BlockPool::free` and `BlockPool::add_refs`, which
//! refuse a sequence's block with `FreeError::HeldBySequence` and change
//! nothing.
//!
//! * The raw calls on a sequence's blocks (its own, a fork's shared ones,
//!   a matched prefix's): refused, every count unchanged.
//! * A caller frees or shares a sequence's blocks (`Sequence::blocks`)
//!   while the sequence is dropped on another thread (its sole drops are
//!   a load and a plain store): each call is refused, or finds the blocks
//!   free (`NotAllocated`), or races their give-back (`Raced`, for `free`:
//!   a block taken since); the blocks go back once.
//! * A fork's parent and child are dropped at once: one of them finds the
//!   shared blocks held alone and gives them back with the plain store.
//!
//! After each round the listed blocks have no reference,
//! `used_blocks() == 0`, the admission counts sum to `num_blocks()` exactly
//! (a double give-back would leave them one over per block, and a later
//! allocation admitted for a block that is not there spins forever), and
//! taking every block hands each out once.

mod common;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::thread;

use kvslots::{hash_blocks, BlockId, BlockPool, FreeError, Sequence};

/// Blocks per round: one bitmap word, so that the racing calls walk the
/// same word and meet on some block.
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

/// Runs `a` and `b` at once: both threads meet (`common::meet`), then `b`
/// waits `delay` spin hints, so that over the rounds its calls land
/// before, among and after `a`'s. Fails the test if either panicked (a
/// debug build asserts that no free block is returned twice).
fn together(a: impl FnOnce() + Send, b: impl FnOnce() + Send, delay: usize, round: usize) {
    let arrived = AtomicUsize::new(0);
    let meet = || common::meet(&arrived, 2);
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
            "round {round}: a call panicked (a block returned twice)"
        );
    });
}

/// Every block's count.
fn counts(pool: &BlockPool) -> Vec<Option<usize>> {
    (0..pool.num_blocks() as u32)
        .map(|i| pool.ref_count(BlockId::new(i)))
        .collect()
}

/// `free` and `add_refs` of `ids` (each held by sequences) are refused with
/// `HeldBySequence` naming the first, and change nothing.
fn assert_refused(pool: &BlockPool, ids: &[BlockId]) {
    let (before, used) = (counts(pool), pool.used_blocks());
    let expected = Err(FreeError::HeldBySequence { id: ids[0] });
    assert_eq!(pool.free(ids), expected);
    assert_eq!(pool.add_refs(ids), expected);
    assert_eq!(counts(pool), before, "a refused call changed a count");
    assert_eq!(pool.used_blocks(), used);
}

#[test]
fn raw_calls_on_a_sequence_s_blocks_are_refused_and_change_nothing() {
    let pool = Arc::new(
        BlockPool::builder(16, 4)
            .prefix_cache(true)
            .build()
            .unwrap(),
    );
    let tokens: Vec<u32> = (0..10).collect();
    let mut keys = Vec::new();
    hash_blocks(b"", &tokens, 4, &mut keys);
    // Its own blocks, the last partly filled.
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(10).unwrap();
    assert_refused(&pool, seq.blocks());
    assert_refused(&pool, &[seq.blocks()[2]]);
    // Shared with a fork (two references each).
    let (child, _) = seq.try_fork().unwrap();
    assert_eq!(pool.ref_count(seq.blocks()[0]), Some(2));
    assert_refused(&pool, &seq.blocks()[..2]);
    assert_refused(&pool, child.blocks());
    // Cached, and held by a match too.
    assert_eq!(seq.publish(&keys), 2);
    let mut other = Sequence::new(Arc::clone(&pool));
    assert_eq!(other.try_match_prefix(&keys), 2);
    assert_refused(&pool, other.blocks());
    // Listed twice, or after a raw block: still the sequence's block that
    // is named, and the raw block keeps its one reference.
    let mut raw = Vec::new();
    pool.try_alloc(1, &mut raw).unwrap();
    let id = other.blocks()[0];
    assert_eq!(
        pool.add_refs(&[raw[0], id, id]),
        Err(FreeError::HeldBySequence { id })
    );
    assert_eq!(
        pool.free(&[raw[0], id]),
        Err(FreeError::HeldBySequence { id })
    );
    assert_eq!(pool.ref_count(raw[0]), Some(1));
    // Retired under a fence: the fence's references are refused too.
    let retired = seq.blocks()[2];
    assert_eq!(seq.retire(1), 3);
    assert_refused(&pool, &[retired]);
    drop((child, other));
    assert_eq!(pool.complete(1), 3);
    pool.free(&raw).unwrap();
    assert_eq!(pool.used_blocks(), 0);
}

#[test]
fn a_raw_call_on_a_sequence_s_blocks_racing_its_drop_gives_each_back_once() {
    let pool = Arc::new(BlockPool::with_shards(BLOCKS, 1, 1));
    for round in 0..2_000 {
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(BLOCKS).unwrap();
        let ids = seq.blocks().to_vec();
        let share = round % 2 == 0;
        together(
            move || drop(seq),
            || {
                let r = if share {
                    pool.add_refs(&ids)
                } else {
                    pool.free(&ids)
                };
                // Refused while the sequence holds a listed block; once all
                // are back, not allocated. (A free whose checks pass
                // finds nothing held by the sequence: the drop is done.)
                assert!(
                    matches!(
                        r,
                        Err(FreeError::HeldBySequence { .. } | FreeError::NotAllocated { .. })
                    ),
                    "round {round}: {r:?}"
                );
            },
            round % 97,
            round,
        );
        check_whole(&pool, &ids, round);
    }
}

#[test]
fn a_fork_s_parent_and_child_dropped_at_once_give_each_block_back_once() {
    let pool = Arc::new(BlockPool::with_shards(BLOCKS, 1, 1));
    for round in 0..2_000 {
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(BLOCKS).unwrap();
        let ids = seq.blocks().to_vec();
        let (child, copy) = seq.try_fork().unwrap();
        assert!(copy.is_none(), "full blocks are shared");
        together(move || drop(seq), move || drop(child), round % 97, round);
        check_whole(&pool, &ids, round);
    }
}
