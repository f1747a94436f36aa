//! A rayon stress test of the prefix cache: 8 threads and more tasks drive
//! match, append, publish, truncate-and-append, drop and reset over a
//! small pool, on a few prompt families that share prefixes, so that
//! blocks are published, matched, revived and evicted concurrently.
//!
//! Each block has a content stamp (an `AtomicU64` per block, standing for
//! the block's KV data): the writer of a full block stamps it with its key
//! before publishing it, and every matched block's stamp must be its
//! key's. The stamps are `Relaxed`, so the only happens-before between
//! writer and matcher is the pool's own (publish, then match); a stale hit,
//! a block evicted while held, or a cached block written while its key can
//! match shows up as a wrong stamp. A block is written only while its
//! writer holds it alone (checked with `ref_count`). At the end every
//! block is free again, the cache drops its keys, and allocating every
//! block yields every id once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kvslots::{hash_blocks, BlockHash, BlockPool, Sequence};

mod common;
use common::{key_stamp, XorShift};
use rayon::prelude::*;

/// Tokens per block.
const BS: usize = 4;

/// The shared world: the pool and the blocks' content stamps.
struct World {
    pool: Arc<BlockPool>,
    content: Vec<AtomicU64>,
}

impl World {
    fn content(&self, block: kvslots::BlockId) -> &AtomicU64 {
        &self.content[block.index()]
    }

    /// Checks that every matched block of `seq` holds its key's content.
    fn check_matched(&self, seq: &Sequence, keys: &[BlockHash], k: usize) {
        for (i, &block) in seq.blocks()[..k].iter().enumerate() {
            // Relaxed: only the pool may order the writer before us.
            let seen = self.content(block).load(Ordering::Relaxed);
            assert_eq!(
                seen,
                key_stamp(&keys[i]),
                "{block} matched with other content"
            );
        }
    }

    /// Writes the content of blocks `from..` of `seq`, full ones with their
    /// keys' stamps, which `seq` must hold alone.
    fn write(&self, seq: &Sequence, keys: &[BlockHash], from: usize) {
        for (i, &block) in seq.blocks().iter().enumerate().skip(from) {
            assert_eq!(
                self.pool.ref_count(block),
                Some(1),
                "{block} written while shared"
            );
            let value = keys.get(i).map_or(0, key_stamp);
            // Relaxed: see `check_matched`.
            self.content(block).store(value, Ordering::Relaxed);
        }
    }
}

/// One task's operations.
fn task(world: &World, seed: u64, ops: usize) -> (u64, u64) {
    let mut rng = XorShift::new(seed);
    let mut live: Vec<Sequence> = Vec::new();
    let mut keys = Vec::new();
    let (mut hits, mut published) = (0, 0);
    for _ in 0..ops {
        // A prompt of family f: a shared head, then a tail that varies.
        let family = rng.below(4) as u32;
        let blocks = 1 + rng.below(5);
        let split = rng.below(blocks + 1);
        let variant = rng.below(3) as u32;
        let extra = rng.below(BS);
        let tokens: Vec<u32> = (0..blocks * BS + extra)
            .map(|t| {
                let tail = if t >= split * BS { variant * 7919 } else { 0 };
                family * 100_000 + t as u32 + tail
            })
            .collect();
        keys.clear();
        hash_blocks(b"stress", &tokens, BS, &mut keys);
        let mut seq = Sequence::new(Arc::clone(&world.pool));
        let k = seq.try_match_prefix(&keys);
        world.check_matched(&seq, &keys, k);
        hits += k as u64;
        if seq.try_append(tokens.len() - k * BS).is_err() {
            continue;
        }
        world.write(&seq, &keys, k);
        published += seq.publish(&keys) as u64;
        world.check_matched(&seq, &keys, keys.len());
        match rng.below(8) {
            // Truncate into the last full block and append one token: a
            // cached block held alone loses its key and is written in
            // place; a shared or cached one is copied.
            0 if !keys.is_empty() => {
                let last = keys.len() - 1;
                seq.truncate(keys.len() * BS - 1);
                let (_, copy) = seq.try_append_cow(1).unwrap_or((0..0, None));
                if seq.len() == keys.len() * BS {
                    let block = seq.blocks()[last];
                    if let Some(copy) = copy {
                        assert_eq!(copy.dst, block);
                    }
                    assert_eq!(
                        world.pool.ref_count(block),
                        Some(1),
                        "{block} written while shared"
                    );
                    // Relaxed: see `check_matched`. Other content now.
                    world.content(block).store(0, Ordering::Relaxed);
                }
            }
            1 => {
                world.pool.reset_prefix_cache();
            }
            _ => {}
        }
        live.push(seq);
        if live.len() > 2 {
            live.remove(rng.below(live.len()));
        }
    }
    (hits, published)
}

/// Runs `tasks` tasks of `ops` operations on `threads` threads over a pool
/// of `num_blocks` blocks.
fn run(num_blocks: usize, threads: usize, tasks: u64, ops: usize) {
    let world = World {
        pool: Arc::new(BlockPool::with_shards(num_blocks, BS, 2)),
        content: (0..num_blocks).map(|_| AtomicU64::new(0)).collect(),
    };
    let rayon = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let (hits, published) = rayon.install(|| {
        (0..tasks)
            .into_par_iter()
            .map(|seed| task(&world, seed, ops))
            .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    // The run exercised the cache.
    assert!(
        hits > 0 && published > 0,
        "hits {hits}, published {published}"
    );
    assert!(world.pool.prefix_stats().evictions > 0);
    assert_eq!(world.pool.prefix_stats().hit_blocks, hits);
    // Whole again.
    let pool = &world.pool;
    assert_eq!(pool.used_blocks(), 0);
    assert_eq!(pool.free_blocks(), num_blocks);
    assert_eq!(pool.evictable_blocks(), pool.cached_blocks());
    let evictable = pool.evictable_blocks();
    assert_eq!(pool.reset_prefix_cache(), evictable);
    assert_eq!(pool.cached_blocks(), 0);
    let mut ids = Vec::new();
    pool.try_alloc(num_blocks, &mut ids).unwrap();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), num_blocks);
    pool.free(&ids).unwrap();
}

#[test]
fn concurrent_matches_publishes_and_evictions_keep_content_and_the_pool_whole() {
    run(24, 8, 64, 1_000);
}

#[test]
fn a_tiny_pool_under_heavy_eviction() {
    run(8, 8, 64, 600);
}

#[test]
#[ignore = "long: run with --ignored"]
fn concurrent_prefix_cache_heavy() {
    run(48, 16, 256, 2_000);
}

/// Peeks among the stress tasks: a prefix that one sequence holds all
/// along (so it keeps its keys) peeks whole every time, alone and with
/// keys never published after it, and keys never published peek 0, while
/// the other tasks match, publish, evict and reset around it.
#[test]
fn peeks_count_a_held_prefix_and_no_unpublished_key_under_churn() {
    let num_blocks = 24;
    let world = World {
        pool: Arc::new(BlockPool::with_shards(num_blocks, BS, 2)),
        content: (0..num_blocks).map(|_| AtomicU64::new(0)).collect(),
    };
    let tokens: Vec<u32> = (0..3 * BS as u32).map(|t| 900_000 + t).collect();
    let mut held_keys = Vec::new();
    hash_blocks(b"held", &tokens, BS, &mut held_keys);
    let mut held = Sequence::new(Arc::clone(&world.pool));
    held.try_append(tokens.len()).unwrap();
    assert_eq!(held.publish(&held_keys), 3);
    let mut ghost = Vec::new();
    hash_blocks(b"never published", &tokens, BS, &mut ghost);
    let mut extended = held_keys.clone();
    extended.extend_from_slice(&ghost);
    let rayon = rayon::ThreadPoolBuilder::new()
        .num_threads(8)
        .build()
        .unwrap();
    let hits: u64 = rayon.install(|| {
        (0..64u64)
            .into_par_iter()
            .map(|seed| {
                if seed % 2 == 0 {
                    return task(&world, seed, 500).0;
                }
                for _ in 0..2_000 {
                    assert_eq!(world.pool.peek_prefix(&held_keys), 3);
                    assert_eq!(world.pool.peek_prefix(&extended), 3);
                    assert_eq!(world.pool.peek_prefix(&ghost), 0);
                }
                0
            })
            .sum()
    });
    assert!(hits > 0 && world.pool.prefix_stats().evictions > 0);
    // The peeks counted nothing.
    assert_eq!(world.pool.prefix_stats().hit_blocks, hits);
    assert_eq!(world.pool.peek_prefix(&held_keys), 3);
    drop(held);
    assert_eq!(world.pool.used_blocks(), 0);
}
