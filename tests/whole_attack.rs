//! Adversarial tests of whole-word fresh blocks: a sequence's take that
//! empties a whole word of the free list's bitmap (every id the word holds,
//! also a short last word of a shard or of the pool) marks the word's
//! fresh bits with a store, its give-back of the whole word clears them
//! with a store, and a fork's or publish's count of all of them clears
//! them with a store. These tests give pools whose words are short
//! (9 to 200 blocks, one to four shards, words of 8 to 64 ids), mix whole words
//! with partial ones in one take, truncate part of a whole word then the
//! rest, fork and publish whole-word fresh sequences, fence them, and race
//! raw callers on the same words. Every test ends with the pool whole.

mod common;

use std::sync::Arc;
use std::thread;

use common::{assert_pool_whole, XorShift};
use kvslots::{
    BlockHash, BlockId, BlockPool, FreeError, HybridSequence, KvGroup, KvGroups, Sequence,
};

/// Pool shapes whose last word (of a shard, or of the pool) is short:
/// `(num_blocks, shards)`.
const SHAPES: [(usize, usize); 11] = [
    (9, 1),
    (33, 2),
    (40, 4),
    (70, 1),
    (72, 1),
    (100, 1),
    (130, 1),
    (130, 2),
    (130, 3),
    (136, 2),
    (200, 3),
];

/// A pool of `n` one-token blocks over `shards` shards, prefix cache on.
fn cached_pool(n: usize, shards: usize) -> Arc<BlockPool> {
    common::one_token_cached_pool(n, shards)
}

/// The keys of `tokens` in one-token blocks.
fn keys(tokens: &[u32]) -> Vec<BlockHash> {
    common::one_token_keys(b"whole", tokens)
}

/// Ids per shard of a pool of `n` blocks over `shards` shards, and the
/// sizes of the words of one full shard (the last one possibly short).
fn word_sizes(n: usize, shards: usize) -> Vec<usize> {
    let span = n.div_ceil(shards);
    let mut sizes = Vec::new();
    let mut left = span;
    while left > 0 {
        sizes.push(left.min(64));
        left -= left.min(64);
    }
    sizes
}

/// Every block of `ids`, held by one sequence alone, reads one reference,
/// and every raw call on it is refused as a sequence's and changes nothing.
fn assert_held_alone(pool: &BlockPool, ids: &[BlockId]) {
    common::assert_sequences_hold(pool, ids, 1);
}

#[test]
fn whole_short_words_taken_truncated_and_forked_alone() {
    for (n, shards) in SHAPES {
        let pool = Arc::new(BlockPool::with_shards(n, 1, shards));
        // Take the whole pool in one sequence: every word is taken whole
        // (short ones too), the small ones counted, the rest fresh.
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(n).unwrap();
        assert_eq!(pool.used_blocks(), n, "{n}/{shards}");
        let mut sorted = seq.blocks().to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), n, "{n}/{shards}: an id handed out twice");
        assert_held_alone(&pool, seq.blocks());
        // Give back part of every word, then the rest, a block at a time
        // near the words' ends.
        for keep in [n - 1, n - 7, n / 2 + 3, n / 3, 9.min(n), 1] {
            seq.truncate(keep);
            assert_eq!(pool.used_blocks(), keep, "{n}/{shards} keep {keep}");
            assert_held_alone(&pool, seq.blocks());
            // What went back is taken by raw callers, counted, once.
            let mut raw = Vec::new();
            pool.try_alloc(n - keep, &mut raw).unwrap();
            assert!(raw.iter().all(|&id| pool.ref_count(id) == Some(1)));
            assert!(raw.iter().all(|id| !seq.blocks().contains(id)));
            pool.free(&raw).unwrap();
            // And taken again fresh (whole words and partial ones).
            seq.try_append(n - keep).unwrap();
            assert_held_alone(&pool, seq.blocks());
        }
        // Down to one block and back to the whole pool, then fork it all:
        // every block counts 2.
        seq.truncate(1);
        seq.try_append(n - 1).unwrap();
        let (child, copy) = seq.try_fork().unwrap();
        assert!(copy.is_none(), "one-token blocks are full");
        for &id in seq.blocks() {
            assert_eq!(pool.ref_count(id), Some(2), "{n}/{shards}: {id}");
            assert_eq!(pool.free(&[id]), Err(FreeError::HeldBySequence { id }));
        }
        drop(seq);
        assert_held_alone(&pool, child.blocks());
        drop(child);
        assert_pool_whole(&pool);
    }
}

#[test]
fn a_take_of_exactly_each_word_is_fresh_and_goes_back_once() {
    for (n, shards) in SHAPES {
        let pool = Arc::new(BlockPool::with_shards(n, 1, shards));
        // Sequences of exactly one word's size each, until the pool is
        // spent: whole words taken one per sequence where they line up.
        let mut seqs = Vec::new();
        let sizes = word_sizes(n, shards);
        let mut left = n;
        let mut i = 0;
        while left > 0 {
            let k = sizes[i % sizes.len()].min(left);
            let mut seq = Sequence::new(Arc::clone(&pool));
            seq.try_append(k).unwrap();
            assert_held_alone(&pool, seq.blocks());
            left -= k;
            i += 1;
            seqs.push(seq);
        }
        assert_eq!(pool.free_blocks(), 0);
        // Fork every other one, drop in an interleaved order.
        let mut children = Vec::new();
        for seq in seqs.iter().step_by(2) {
            children.push(seq.try_fork().unwrap().0);
        }
        for (j, seq) in seqs.iter_mut().enumerate() {
            if j % 3 == 0 {
                seq.truncate(seq.len() / 2);
            }
        }
        let mut all: Vec<Sequence> = seqs.into_iter().chain(children).collect();
        while !all.is_empty() {
            let j = all.len() * 7 / 11;
            drop(all.swap_remove(j));
        }
        assert_pool_whole(&pool);
    }
}

#[test]
fn threads_take_whole_and_partial_words_with_forks_fences_and_raw_callers() {
    for (n, shards) in SHAPES {
        let pool = Arc::new(BlockPool::with_shards(n, 1, shards));
        let sizes = word_sizes(n, shards);
        thread::scope(|s| {
            for t in 0..3u64 {
                let pool = Arc::clone(&pool);
                let sizes = sizes.clone();
                s.spawn(move || {
                    let mut rng = XorShift::new(t * 1000 + n as u64);
                    let mut seq = Sequence::new(Arc::clone(&pool));
                    let mut fences = Vec::new();
                    for round in 0..6_000u64 {
                        let k = match rng.below(4) {
                            0 => sizes[rng.below(sizes.len())],
                            1 => 8 + rng.below(8),
                            2 => 1 + rng.below(n / 2),
                            _ => sizes[rng.below(sizes.len())] + rng.below(9),
                        };
                        if seq.try_append(k).is_ok() {
                            assert_held_alone(&pool, seq.blocks());
                        }
                        match rng.below(6) {
                            0 => {
                                let (child, _) = seq.try_fork().unwrap();
                                for &id in child.blocks() {
                                    assert_eq!(pool.ref_count(id), Some(2));
                                }
                                drop(child);
                            }
                            1 => {
                                let fence = t << 32 | round;
                                let len = rng.below(seq.len() + 1);
                                seq.truncate_fenced(len, fence);
                                fences.push(fence);
                            }
                            2 => {
                                seq.truncate(rng.below(seq.len() + 1));
                            }
                            3 => {
                                // Fork, then the parent drops: the child
                                // goes on alone with counted blocks.
                                let (child, _) = seq.try_fork().unwrap();
                                seq = child;
                            }
                            _ => {}
                        }
                        if !seq.is_empty() && rng.below(2) == 0 {
                            assert_held_alone(&pool, seq.blocks());
                        }
                        if fences.len() > 2 || rng.below(3) == 0 {
                            for fence in fences.drain(..) {
                                pool.complete(fence);
                            }
                        }
                        if rng.below(4) == 0 {
                            seq = Sequence::new(Arc::clone(&pool));
                        }
                    }
                    for fence in fences {
                        pool.complete(fence);
                    }
                });
            }
            // A raw caller takes and frees blocks of the same words.
            let pool = Arc::clone(&pool);
            s.spawn(move || {
                let mut rng = XorShift::new(n as u64);
                let mut raw = Vec::new();
                for _ in 0..12_000 {
                    raw.clear();
                    let k = 1 + rng.below(20);
                    if pool.try_alloc(k, &mut raw).is_ok() {
                        for &id in &raw {
                            assert_eq!(pool.ref_count(id), Some(1), "raw {id}");
                        }
                        pool.add_refs(&raw[..1]).unwrap();
                        assert_eq!(pool.ref_count(raw[0]), Some(2));
                        pool.free(&raw[..1]).unwrap();
                        pool.free(&raw).unwrap();
                    }
                }
            });
        });
        assert_eq!(pool.pending_release_blocks(), 0);
        assert_pool_whole(&pool);
    }
}

#[test]
fn threads_publish_match_and_evict_whole_word_fresh_blocks() {
    for (n, shards) in SHAPES {
        let pool = cached_pool(n, shards);
        let sizes = word_sizes(n, shards);
        thread::scope(|s| {
            for t in 0..3u64 {
                let pool = Arc::clone(&pool);
                let sizes = sizes.clone();
                s.spawn(move || {
                    let mut rng = XorShift::new(t * 77 + n as u64);
                    for round in 0..3_000u32 {
                        // Prompts shared between threads (matches), of a
                        // whole word's size or near it.
                        let prompt = rng.below(4) as u32;
                        let k = (sizes[rng.below(sizes.len())] + rng.below(3)).min(n / 2);
                        let tokens: Vec<u32> = (0..k as u32).map(|i| prompt << 16 | i).collect();
                        let hashes = keys(&tokens);
                        let mut seq = Sequence::new(Arc::clone(&pool));
                        let matched = seq.try_match_prefix(&hashes);
                        if seq.try_append(k - matched).is_err() {
                            continue;
                        }
                        for &id in &seq.blocks()[matched..] {
                            assert!(pool.ref_count(id).unwrap() >= 1, "{id}");
                            assert_eq!(pool.free(&[id]), Err(FreeError::HeldBySequence { id }));
                        }
                        if rng.below(2) == 0 {
                            seq.publish(&hashes);
                        }
                        match rng.below(4) {
                            0 => {
                                let (child, _) = seq.try_fork().unwrap();
                                drop(seq);
                                seq = child;
                            }
                            1 => {
                                seq.truncate(rng.below(k + 1));
                            }
                            2 if round % 50 == 0 => {
                                pool.reset_prefix_cache();
                            }
                            _ => {}
                        }
                        for &id in seq.blocks() {
                            assert!(pool.ref_count(id).unwrap() >= 1, "{id}");
                            assert_eq!(pool.free(&[id]), Err(FreeError::HeldBySequence { id }));
                        }
                    }
                });
            }
        });
        pool.reset_prefix_cache();
        assert_eq!(pool.cached_blocks(), 0);
        assert_pool_whole(&pool);
    }
}

#[test]
fn threads_run_hybrid_sequences_on_short_words() {
    for (n, shards) in SHAPES {
        let pool = Arc::new(BlockPool::with_shards(n, 1, shards));
        let groups =
            KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 9 }]).unwrap();
        thread::scope(|s| {
            for t in 0..2u64 {
                let pool = Arc::clone(&pool);
                let groups = groups.clone();
                s.spawn(move || {
                    let mut rng = XorShift::new(t + 5 * n as u64);
                    let mut seq = HybridSequence::new(Arc::clone(&pool), groups.clone());
                    for _ in 0..3_000 {
                        let k = 1 + rng.below(n / 4);
                        let _ = seq.try_append(k);
                        for g in 0..2 {
                            for &id in seq.blocks(g).unwrap() {
                                if id == BlockId::NULL {
                                    continue;
                                }
                                assert!(pool.ref_count(id).unwrap() >= 1, "{id}");
                                assert_eq!(pool.free(&[id]), Err(FreeError::HeldBySequence { id }));
                            }
                        }
                        match rng.below(5) {
                            0 => {
                                let mut copies = Vec::new();
                                if let Ok(child) = seq.try_fork(&mut copies) {
                                    if rng.below(2) == 0 {
                                        seq = child;
                                    }
                                }
                            }
                            1 => {
                                // A length inside the window, or refused.
                                let len = rng.below(seq.len() + 1);
                                let before = seq.len();
                                if seq.truncate(len).is_err() {
                                    assert_eq!(seq.len(), before);
                                }
                            }
                            2 => seq = HybridSequence::new(Arc::clone(&pool), groups.clone()),
                            _ => {}
                        }
                    }
                });
            }
        });
        assert_pool_whole(&pool);
    }
}

#[test]
fn fences_of_whole_words_complete_on_another_thread_beside_takes() {
    for (n, shards) in SHAPES {
        let pool = Arc::new(BlockPool::with_shards(n, 1, shards));
        let sizes = word_sizes(n, shards);
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        thread::scope(|s| {
            for t in 0..2u64 {
                let pool = Arc::clone(&pool);
                let sizes = sizes.clone();
                let tx = tx.clone();
                s.spawn(move || {
                    let mut rng = XorShift::new(t * 31 + n as u64);
                    for round in 0..4_000u64 {
                        let fence = t << 32 | round;
                        let mut seq = Sequence::new(Arc::clone(&pool));
                        // One word's size, or two, or all that is free.
                        let k = match rng.below(3) {
                            0 => sizes[rng.below(sizes.len())],
                            1 => sizes.iter().sum::<usize>().min(n / 2),
                            _ => pool.free_blocks().max(1),
                        };
                        if seq.try_append(k).is_err() {
                            continue;
                        }
                        assert_held_alone(&pool, seq.blocks());
                        match rng.below(3) {
                            0 => {
                                // Part of the word fenced, then the rest.
                                let len = rng.below(seq.len() + 1);
                                seq.truncate_fenced(len, fence);
                                assert_held_alone(&pool, seq.blocks());
                                seq.retire(fence);
                            }
                            1 => {
                                seq.retire(fence);
                            }
                            _ => {
                                let (child, _) = seq.try_fork().unwrap();
                                seq.retire(fence);
                                child.retire(fence);
                            }
                        }
                        tx.send(fence).unwrap();
                    }
                });
            }
            drop(tx);
            // The completer: each fence completed once, on its own thread.
            let pool = Arc::clone(&pool);
            s.spawn(move || {
                for fence in rx {
                    pool.complete(fence);
                }
            });
        });
        assert_eq!(pool.pending_release_blocks(), 0);
        assert_pool_whole(&pool);
    }
}

#[test]
fn raw_double_frees_of_any_block_are_refused_while_sequences_churn_whole_words() {
    use std::sync::atomic::{AtomicBool, Ordering};
    for (n, shards) in SHAPES {
        let pool = Arc::new(BlockPool::with_shards(n, 1, shards));
        let sizes = word_sizes(n, shards);
        let done = AtomicBool::new(false);
        thread::scope(|s| {
            let workers: Vec<_> = (0..2u64)
                .map(|t| {
                    let pool = Arc::clone(&pool);
                    let sizes = sizes.clone();
                    s.spawn(move || {
                        let mut rng = XorShift::new(t * 13 + n as u64);
                        let mut seq = Sequence::new(Arc::clone(&pool));
                        for round in 0..4_000u64 {
                            let k = match rng.below(3) {
                                0 => sizes[rng.below(sizes.len())],
                                1 => pool.free_blocks().max(1),
                                _ => 1 + rng.below(16),
                            };
                            let _ = seq.try_append(k);
                            match rng.below(5) {
                                0 => drop(seq.try_fork().unwrap()),
                                1 => {
                                    let len = rng.below(seq.len() + 1);
                                    seq.truncate_fenced(len, t << 32 | round);
                                    pool.complete(t << 32 | round);
                                }
                                2 => {
                                    seq.truncate(rng.below(seq.len() + 1));
                                }
                                3 => seq = Sequence::new(Arc::clone(&pool)),
                                _ => {}
                            }
                        }
                    })
                })
                .collect();
            // No raw caller holds a block: every raw free or add of any
            // block is a double free (or of a free block), refused.
            let pool = Arc::clone(&pool);
            let done = &done;
            s.spawn(move || {
                let mut rng = XorShift::new(n as u64 + 99);
                while !done.load(Ordering::Relaxed) {
                    let a = BlockId::new(rng.below(n) as u32);
                    let b = BlockId::new(rng.below(n) as u32);
                    assert!(pool.free(&[a]).is_err(), "raw free of {a} taken");
                    assert!(pool.add_refs(&[a]).is_err(), "raw add of {a} taken");
                    assert!(pool.free(&[a, b]).is_err(), "raw free of {a} {b}");
                    assert!(pool.ref_count(a).unwrap() <= 2);
                }
            });
            for w in workers {
                w.join().unwrap();
            }
            // Relaxed (test code): only ends the raw caller's loop; orders
            // nothing.
            done.store(true, Ordering::Relaxed);
        });
        assert_eq!(pool.pending_release_blocks(), 0);
        assert_pool_whole(&pool);
    }
}

#[test]
fn a_take_that_evicts_a_published_whole_word_beside_a_whole_short_word() {
    for shards in [1, 2] {
        let n = 72 * shards;
        let pool = cached_pool(n, shards);
        // A publishes whole words (counted, claimed, cached), then drops
        // them: they stay cached, evictable.
        let tokens: Vec<u32> = (0..n as u32 - 8 * shards as u32).collect();
        let hashes = keys(&tokens);
        let mut a = Sequence::new(Arc::clone(&pool));
        a.try_append(tokens.len()).unwrap();
        assert_held_alone(&pool, a.blocks());
        assert_eq!(a.publish(&hashes), tokens.len());
        let published = a.blocks().to_vec();
        drop(a);
        assert_eq!(pool.evictable_blocks(), tokens.len());
        // B takes the whole pool: the short words' 8 ids each fresh (a
        // whole word), the published blocks evicted and counted.
        let mut b = Sequence::new(Arc::clone(&pool));
        b.try_append(n).unwrap();
        assert_eq!(pool.cached_blocks(), 0);
        assert_held_alone(&pool, b.blocks());
        assert!(published.iter().all(|id| b.blocks().contains(id)));
        // A match finds nothing; a fork counts every block twice.
        let mut c = Sequence::new(Arc::clone(&pool));
        assert_eq!(c.try_match_prefix(&hashes), 0);
        let (child, _) = b.try_fork().unwrap();
        assert!(b.blocks().iter().all(|&id| pool.ref_count(id) == Some(2)));
        // Republish from the child (its blocks are counted now).
        let mut child = child;
        assert_eq!(child.publish(&hashes[..8]), 8);
        b.truncate(n / 2);
        drop(b);
        assert_held_alone(&pool, &child.blocks()[8..]);
        drop(child);
        assert_eq!(c.try_match_prefix(&hashes), 8);
        drop(c);
        pool.reset_prefix_cache();
        assert_pool_whole(&pool);
    }
}

/// A sequence is `Send` (not `Sync`), and so are the futures of its
/// waiting reserves, which hold it across their awaits: a scheduler can
/// await them on a multi-threaded runtime.
#[test]
fn the_waiting_reserves_of_send_sequences_are_send() {
    fn assert_send<T: Send>(_: &T) {}
    let pool = Arc::new(BlockPool::with_shards(72, 1, 1));
    let mut seq = Sequence::new(Arc::clone(&pool));
    assert_send(&seq);
    {
        let alloc = seq.reserve(8, 0);
        assert_send(&alloc);
    }
    let groups = KvGroups::new([KvGroup::Full]).unwrap();
    let mut hybrid = HybridSequence::new(Arc::clone(&pool), groups);
    assert_send(&hybrid);
    {
        let fut = hybrid.reserve(8, 0);
        assert_send(&fut);
    }
    drop((seq, hybrid));
    assert_pool_whole(&pool);
}
