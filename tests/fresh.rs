//! Fresh blocks: a sequence that takes 8 blocks or more from one word of
//! the free list holds each through an uncounted reference (see `implementation`, "Reference counts").
//! Every public answer about such a block is the one a counted block
//! gives: `ref_count` reads 1, a raw `free` or `add_refs` is refused as
//! `HeldBySequence` and changes nothing, a fork counts 2, a publish caches
//! it, a fence holds it, and every give-back returns it once, to be taken
//! again by anyone. Each test ends with the pool whole.

use std::sync::Arc;

use kvslots::{hash_blocks, BlockHash, BlockId, BlockPool, FreeError, Sequence};

/// Slots a block in these tests.
const BS: usize = 4;

/// Every block free and unreferenced, and every one handed out once by a
/// raw allocation of the whole pool (which reads no stale mark: each has
/// one reference).
fn assert_whole(pool: &BlockPool) {
    let n = pool.num_blocks();
    assert_eq!((pool.free_blocks(), pool.used_blocks()), (n, 0));
    assert_eq!(pool.pending_release_blocks(), 0);
    for i in 0..n {
        assert_eq!(pool.ref_count(BlockId::new(i as u32)), Some(0), "block {i}");
    }
    let mut all = Vec::new();
    pool.try_alloc(n, &mut all).expect("the whole pool");
    let mut sorted = all.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), n, "a block handed out twice");
    assert!(all.iter().all(|&id| pool.ref_count(id) == Some(1)));
    pool.free(&all).expect("just taken");
}

/// The reference counts of `ids`.
fn counts(pool: &BlockPool, ids: &[BlockId]) -> Vec<Option<usize>> {
    ids.iter().map(|&id| pool.ref_count(id)).collect()
}

/// `blocks` full blocks' keys of a prompt made from `seed`.
fn keys(seed: u32, blocks: usize) -> Vec<BlockHash> {
    let tokens: Vec<u32> = (0..(blocks * BS) as u32)
        .map(|t| seed * 100_000 + t)
        .collect();
    let mut keys = Vec::new();
    hash_blocks(b"fresh", &tokens, BS, &mut keys);
    keys
}

#[test]
fn a_fresh_block_counts_one_and_raw_calls_refuse_it() {
    for shards in [1, 3] {
        let pool = Arc::new(BlockPool::with_shards(200, BS, shards));
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(100 * BS).unwrap();
        let ids = seq.blocks().to_vec();
        assert!(ids.iter().all(|&id| pool.ref_count(id) == Some(1)));
        let used = pool.used_blocks();
        for &id in &ids {
            assert_eq!(pool.free(&[id]), Err(FreeError::HeldBySequence { id }));
            assert_eq!(pool.add_refs(&[id]), Err(FreeError::HeldBySequence { id }));
        }
        // A list mixing a free block and a fresh one: the free block is
        // named (not allocated comes first), nothing changes.
        let free = (0..200)
            .map(|i| BlockId::new(i as u32))
            .find(|id| !ids.contains(id))
            .unwrap();
        assert_eq!(
            pool.free(&[ids[5], free]),
            Err(FreeError::NotAllocated { id: free })
        );
        assert_eq!(pool.used_blocks(), used);
        assert!(ids.iter().all(|&id| pool.ref_count(id) == Some(1)));
        drop(seq);
        assert_whole(&pool);
    }
}

#[test]
fn a_fork_counts_fresh_blocks_and_each_side_gives_back_its_own() {
    let pool = Arc::new(BlockPool::new(64, BS));
    let mut parent = Sequence::new(Arc::clone(&pool));
    // One block counted at once (a small take), then 20 fresh ones, and a
    // partly filled tail.
    parent.try_append(BS).unwrap();
    parent.try_append(20 * BS + 1).unwrap();
    let full = parent.blocks()[..21].to_vec();
    let (child, copy) = parent.try_fork().unwrap();
    let copy = copy.expect("the tail is copied");
    assert_eq!(copy.src, parent.blocks()[21]);
    assert_eq!(counts(&pool, &full), vec![Some(2); 21]);
    // The tail stays the parent's alone, the copy the child's alone.
    assert_eq!(pool.ref_count(parent.blocks()[21]), Some(1));
    assert_eq!(pool.ref_count(copy.dst), Some(1));
    assert_eq!(
        pool.free(&[full[7]]),
        Err(FreeError::HeldBySequence { id: full[7] })
    );
    drop(parent);
    assert_eq!(counts(&pool, &full), vec![Some(1); 21]);
    assert_eq!(pool.used_blocks(), 22);
    drop(child);
    assert_whole(&pool);
}

#[test]
fn a_truncate_into_a_fresh_run_gives_back_the_rest_once() {
    let pool = Arc::new(BlockPool::new(64, BS));
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_reserve(40 * BS, 0).unwrap();
    assert_eq!(pool.used_blocks(), 40);
    seq.try_append(30 * BS + 2).unwrap();
    assert_eq!(seq.shrink_to_fit(), 9);
    assert_eq!(seq.truncate(17 * BS + 1), 13);
    assert_eq!(pool.used_blocks(), 18);
    assert!(seq.blocks().iter().all(|&id| pool.ref_count(id) == Some(1)));
    // The blocks given back are free to anyone, counted once.
    let mut raw = Vec::new();
    pool.try_alloc(46, &mut raw).unwrap();
    assert!(raw.iter().all(|&id| pool.ref_count(id) == Some(1)));
    pool.free(&raw).unwrap();
    // Grow again past the old end: fresh blocks after the kept ones.
    seq.try_append(30 * BS).unwrap();
    let (child, _) = seq.try_fork().unwrap();
    drop(seq);
    drop(child);
    assert_whole(&pool);
}

#[test]
fn published_fresh_blocks_are_cached_matched_and_evicted() {
    let pool = Arc::new(BlockPool::new(64, BS));
    let prompt = keys(1, 12);
    let mut first = Sequence::new(Arc::clone(&pool));
    first.try_append(12 * BS + 3).unwrap();
    assert_eq!(first.publish(&prompt), 12);
    assert_eq!(pool.cached_blocks(), 12);
    assert!(first
        .blocks()
        .iter()
        .all(|&id| pool.ref_count(id) == Some(1)));
    let mut second = Sequence::new(Arc::clone(&pool));
    assert_eq!(second.try_match_prefix(&prompt), 12);
    assert_eq!(second.blocks(), &first.blocks()[..12]);
    assert!(first.blocks()[..12]
        .iter()
        .all(|&id| pool.ref_count(id) == Some(2)));
    drop(first);
    drop(second);
    assert_eq!((pool.cached_blocks(), pool.evictable_blocks()), (12, 12));
    assert_eq!(pool.reset_prefix_cache(), 12);
    assert_whole(&pool);
}

#[test]
fn a_publish_whose_first_keys_are_held_elsewhere_counts_the_rest() {
    let pool = Arc::new(BlockPool::new(64, BS));
    let prompt = keys(2, 10);
    // Another sequence holds the first 4 keys on its own blocks.
    let mut other = Sequence::new(Arc::clone(&pool));
    other.try_append(4 * BS).unwrap();
    assert_eq!(other.publish(&prompt[..4]), 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(10 * BS).unwrap();
    // The first 4 keys stay with `other`: those blocks of `seq` are not
    // claimed (they stay fresh); the last 6 are counted, claimed, cached.
    assert_eq!(seq.publish(&prompt), 6);
    assert_eq!(pool.cached_blocks(), 10);
    assert!(seq.blocks().iter().all(|&id| pool.ref_count(id) == Some(1)));
    let id = seq.blocks()[2];
    assert_eq!(pool.free(&[id]), Err(FreeError::HeldBySequence { id }));
    let (child, _) = seq.try_fork().unwrap();
    assert!(seq.blocks().iter().all(|&id| pool.ref_count(id) == Some(2)));
    drop(seq);
    drop(child);
    drop(other);
    assert_eq!(pool.evictable_blocks(), 10);
    assert_eq!(pool.reset_prefix_cache(), 10);
    assert_whole(&pool);
}

#[test]
fn a_fence_holds_fresh_blocks_until_it_completes() {
    let pool = Arc::new(BlockPool::new(32, BS));
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(24 * BS).unwrap();
    let tail = seq.blocks()[10..].to_vec();
    assert_eq!(seq.truncate_fenced(10 * BS, 7), 14);
    assert_eq!(pool.pending_release_blocks(), 14);
    assert_eq!((pool.used_blocks(), pool.free_blocks()), (24, 8));
    for &id in &tail {
        assert_eq!(pool.ref_count(id), Some(1));
        assert_eq!(pool.free(&[id]), Err(FreeError::HeldBySequence { id }));
    }
    let rest = seq.blocks().to_vec();
    assert_eq!(seq.retire(8), 10);
    assert!(rest.iter().all(|&id| pool.ref_count(id) == Some(1)));
    assert_eq!(pool.complete(8), 10);
    assert_eq!(pool.complete(7), 14);
    assert_whole(&pool);
}

#[test]
fn two_threads_take_and_give_back_fresh_runs_of_one_word() {
    let pool = Arc::new(BlockPool::with_shards(64, BS, 1));
    std::thread::scope(|s| {
        for t in 0..2 {
            let pool = Arc::clone(&pool);
            s.spawn(move || {
                let mut seq = Sequence::new(Arc::clone(&pool));
                for round in 0..2_000 {
                    let blocks = 8 + (round * 7 + t) % 20;
                    if seq.try_append(blocks * BS).is_ok() {
                        assert!(seq.blocks().iter().all(|&id| pool.ref_count(id) == Some(1)));
                        if round % 3 == 0 {
                            let (child, _) = seq.try_fork().unwrap();
                            drop(child);
                        }
                        seq.truncate(round % 5 * BS);
                    }
                    seq.truncate(0);
                }
            });
        }
    });
    assert_whole(&pool);
}
