//! The prefix cache: matching, publishing, a mixed workload against
//! mutex-guarded caches, and match cost against the number of cached
//! blocks.
//!
//! | id | one operation |
//! |---|---|
//! | `single/match_release/128` | a 128-block cached prefix matched into a sequence, then released |
//! | `single/peek/128` | the same prefix counted by `BlockPool::peek_prefix`, nothing taken |
//! | `single/peek_std_mutex/128` | the same count from the locked cache's index (a `HashMap` lookup a key) under a `std::sync::Mutex` |
//! | `single/publish/128` | 128 full blocks of a sequence published (setup: the keys dropped, the blocks appended) |
//! | `mixed/{kvslots,std_mutex,parking_lot}/{1,2,8}` | one request: match a prompt's cached prefix, append the rest, publish, drop; split over 1, 2 or 8 threads |
//! | `match_cost/{1000,1000000}` | one cached block, picked across the whole cache, matched and released, in a pool whose every block is cached |
//! | `events/publish/{off,on}` | `single/publish/128` on a pool without and with KV events (the rings drained in the setup) |
//! | `events/evict/{off,on}` | an allocation of 128 blocks that evicts 128 cached ones, then their free, without and with KV events |
//! | `events/drain/128` | the consumer: 128 stores drained into events (and merged into one `BlockStored`) |
//!
//! The mixed workload: prompts of 24 blocks of 16 tokens (plus 5 tokens),
//! whose first 8 blocks all prompts share (a system prompt), the next 8
//! their family's (8 families), and the last 8 their variant's (16 per
//! family); a pool of 512 blocks, so that keys are evicted. The mutex
//! baselines apply the same policy under one lock (a `HashMap` from key to
//! block, an index-linked LRU list of the evictable blocks, a free stack),
//! taking it once per call as the library is called: match, allocate,
//! publish, release. Each worker thread reuses one sequence (emptied with
//! `truncate(0)`) or one block table across its requests.
//!
//! Run: `cargo bench --bench prefix`.

mod support;

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvslots::{hash_blocks, BlockHash, BlockPool, Sequence};
use support::cache::{mixed_prompts, Cache, BS, EXTRA, MIXED_POOL, PROMPT_BLOCKS};
use support::Lock;

/// One worker thread of the mixed workload, with what it reuses from one
/// request to the next (a sequence, or a block table).
trait Worker: Send {
    /// Serves one request for the prompt with these keys.
    fn request(&mut self, keys: &[BlockHash]);
}

/// A worker on the pool: one sequence, emptied after each request.
struct PoolWorker {
    seq: Sequence,
}

impl Worker for PoolWorker {
    fn request(&mut self, keys: &[BlockHash]) {
        let seq = &mut self.seq;
        let k = seq.try_match_prefix(keys);
        if seq.try_append(PROMPT_BLOCKS * BS + EXTRA - k * BS).is_ok() {
            seq.publish(keys);
        }
        black_box(seq.truncate(0));
    }
}

/// A worker on a locked cache: four calls, each under the lock.
struct LockedWorker<L> {
    cache: Arc<L>,
    table: Vec<u32>,
}

impl<L: Lock<Cache> + 'static> Worker for LockedWorker<L> {
    fn request(&mut self, keys: &[BlockHash]) {
        let table = &mut self.table;
        table.clear();
        let k = self.cache.with(|c| c.match_prefix(keys, table));
        let blocks = (PROMPT_BLOCKS * BS + EXTRA).div_ceil(BS);
        if self.cache.with(|c| c.allocate(blocks - k, table)) {
            self.cache.with(|c| c.publish(&table[..keys.len()], keys));
        }
        self.cache.with(|c| c.release(table));
        black_box(&table);
    }
}

/// Runs `iters` requests split over `threads` workers made by `worker`,
/// timed between barriers; worker `t` walks the prompts from its own
/// offset.
fn timed(
    threads: usize,
    iters: u64,
    prompts: &Arc<Vec<Vec<BlockHash>>>,
    worker: &dyn Fn() -> Box<dyn Worker>,
) -> Duration {
    let start = Arc::new(Barrier::new(threads + 1));
    let end = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads as u64)
        .map(|t| {
            let (start, end, prompts) = (Arc::clone(&start), Arc::clone(&end), Arc::clone(prompts));
            let mut worker = worker();
            let share = iters / threads as u64 + u64::from(t < iters % threads as u64);
            thread::spawn(move || {
                start.wait();
                for i in 0..share {
                    let p = ((i * 7 + t * 13) % prompts.len() as u64) as usize;
                    worker.request(&prompts[p]);
                }
                end.wait();
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    end.wait();
    let took = began.elapsed();
    for h in handles {
        h.join().expect("bench worker panicked");
    }
    took
}

fn single(c: &mut Criterion) {
    let pool = Arc::new(BlockPool::new(4096, BS));
    let tokens: Vec<u32> = (0..128 * BS as u32).collect();
    let mut keys = Vec::new();
    hash_blocks(b"bench", &tokens, BS, &mut keys);
    let mut group = c.benchmark_group("single");
    group.throughput(Throughput::Elements(128));
    {
        let mut owner = Sequence::new(Arc::clone(&pool));
        owner.try_append(tokens.len()).unwrap();
        assert_eq!(owner.publish(&keys), 128);
    }
    group.bench_function(BenchmarkId::new("match_release", 128), |b| {
        let mut seq = Sequence::with_capacity(Arc::clone(&pool), tokens.len());
        b.iter(|| {
            assert_eq!(seq.try_match_prefix(black_box(&keys)), 128);
            seq.truncate(0);
        })
    });
    group.bench_function(BenchmarkId::new("peek", 128), |b| {
        b.iter(|| assert_eq!(pool.peek_prefix(black_box(&keys)), 128))
    });
    {
        // The peer: the locked cache's index, behind one lock, holding the
        // same 128 keys.
        let locked = std::sync::Mutex::new(Cache::new(4096));
        locked.with(|cache| {
            let mut table = Vec::new();
            assert!(cache.allocate(128, &mut table));
            cache.publish(&table, &keys);
        });
        group.bench_function(BenchmarkId::new("peek_std_mutex", 128), |b| {
            b.iter(|| assert_eq!(locked.with(|c| c.peek_prefix(black_box(&keys))), 128))
        });
    }
    group.bench_function(BenchmarkId::new("publish", 128), |b| {
        b.iter_batched(
            || {
                pool.reset_prefix_cache();
                let mut seq = Sequence::new(Arc::clone(&pool));
                seq.try_append(tokens.len()).unwrap();
                seq
            },
            |mut seq| {
                assert_eq!(seq.publish(black_box(&keys)), 128);
                seq
            },
            // One at a time: a live input holds its keys, and the next
            // setup must find none cached.
            criterion::BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn mixed(c: &mut Criterion) {
    let prompts = Arc::new(mixed_prompts());
    let mut group = c.benchmark_group("mixed");
    group.throughput(Throughput::Elements(1));
    for threads in [1, 2, 8] {
        group.bench_function(BenchmarkId::new("kvslots", threads), |b| {
            let pool = Arc::new(BlockPool::new(MIXED_POOL, BS));
            let worker = || -> Box<dyn Worker> {
                let seq = Sequence::with_capacity(Arc::clone(&pool), PROMPT_BLOCKS * BS + EXTRA);
                Box::new(PoolWorker { seq })
            };
            b.iter_custom(|iters| timed(threads, iters, &prompts, &worker))
        });
        group.bench_function(BenchmarkId::new("std_mutex", threads), |b| {
            let cache = Arc::new(std::sync::Mutex::new(Cache::new(MIXED_POOL)));
            let worker = || -> Box<dyn Worker> {
                Box::new(LockedWorker {
                    cache: Arc::clone(&cache),
                    table: Vec::with_capacity(PROMPT_BLOCKS + 1),
                })
            };
            b.iter_custom(|iters| timed(threads, iters, &prompts, &worker))
        });
        group.bench_function(BenchmarkId::new("parking_lot", threads), |b| {
            let cache = Arc::new(parking_lot::Mutex::new(Cache::new(MIXED_POOL)));
            let worker = || -> Box<dyn Worker> {
                Box::new(LockedWorker {
                    cache: Arc::clone(&cache),
                    table: Vec::with_capacity(PROMPT_BLOCKS + 1),
                })
            };
            b.iter_custom(|iters| timed(threads, iters, &prompts, &worker))
        });
    }
    group.finish();
}

fn match_cost(c: &mut Criterion) {
    let mut group = c.benchmark_group("match_cost");
    group.throughput(Throughput::Elements(1));
    for cached in [1_000usize, 1_000_000] {
        // Every block cached (and evictable): sequences of up to 1,000
        // blocks with distinct keys, published and dropped.
        let pool = Arc::new(BlockPool::new(cached, BS));
        let mut keys: Vec<BlockHash> = Vec::with_capacity(cached);
        for chunk in 0..cached.div_ceil(1000) {
            let blocks = (cached - chunk * 1000).min(1000);
            let tokens: Vec<u32> = (0..(blocks * BS) as u32).collect();
            let salt = (chunk as u64).to_le_bytes();
            let start = keys.len();
            hash_blocks(&salt, &tokens, BS, &mut keys);
            let mut seq = Sequence::new(Arc::clone(&pool));
            seq.try_append(tokens.len()).unwrap();
            assert_eq!(seq.publish(&keys[start..]), blocks);
        }
        assert_eq!(pool.cached_blocks(), cached);
        group.bench_function(BenchmarkId::from_parameter(cached), |b| {
            let mut seq = Sequence::with_capacity(Arc::clone(&pool), BS);
            // A stride through the keys, so that the lookups spread over
            // the whole cache (and its memory).
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 7_919) % keys.len();
                assert_eq!(seq.try_match_prefix(black_box(&keys[i..=i])), 1);
                seq.truncate(0);
            })
        });
    }
    group.finish();
}

/// A pool of 128 blocks for the `events` group, with KV events or not.
fn events_pool(on: bool) -> Arc<BlockPool> {
    let builder = BlockPool::builder(128, BS).prefix_cache(true);
    let builder = if on { builder.kv_events(4096) } else { builder };
    Arc::new(builder.build().unwrap())
}

/// Drains `pool`'s events (if it records them) outside the timed part.
fn drain(pool: &BlockPool, out: &mut Vec<kvslots::KvEvent>) {
    out.clear();
    pool.drain_events(out);
}

fn events(c: &mut Criterion) {
    let tokens: Vec<u32> = (0..128 * BS as u32).collect();
    let mut keys = Vec::new();
    hash_blocks(b"bench", &tokens, BS, &mut keys);
    let mut group = c.benchmark_group("events");
    group.throughput(Throughput::Elements(128));
    for on in [false, true] {
        let name = if on { "on" } else { "off" };
        let pool = events_pool(on);
        let mut out = Vec::new();
        group.bench_function(BenchmarkId::new("publish", name), |b| {
            b.iter_batched(
                || {
                    pool.reset_prefix_cache();
                    drain(&pool, &mut out);
                    let mut seq = Sequence::new(Arc::clone(&pool));
                    seq.try_append(tokens.len()).unwrap();
                    seq
                },
                |mut seq| {
                    assert_eq!(seq.publish(black_box(&keys)), 128);
                    seq
                },
                criterion::BatchSize::PerIteration,
            )
        });
        let mut ids = Vec::with_capacity(128);
        group.bench_function(BenchmarkId::new("evict", name), |b| {
            b.iter_batched_ref(
                || {
                    // Every block cached and evictable.
                    let mut seq = Sequence::new(Arc::clone(&pool));
                    seq.try_append(tokens.len()).unwrap();
                    assert_eq!(seq.publish(&keys), 128);
                    drop(seq);
                    drain(&pool, &mut out);
                },
                |_| {
                    ids.clear();
                    pool.try_alloc(128, &mut ids).unwrap();
                    pool.free(&ids).unwrap();
                },
                criterion::BatchSize::PerIteration,
            )
        });
        assert_eq!(pool.prefix_stats().evictions % 128, 0);
    }
    let pool = events_pool(true);
    let (mut scratch, mut events) = (Vec::new(), Vec::with_capacity(4));
    group.bench_function(BenchmarkId::new("drain", 128), |b| {
        b.iter_batched_ref(
            || {
                pool.reset_prefix_cache();
                drain(&pool, &mut scratch);
                let mut seq = Sequence::new(Arc::clone(&pool));
                seq.try_append(tokens.len()).unwrap();
                assert_eq!(seq.publish(&keys), 128);
                seq
            },
            |_| {
                // The events of the last run go first: one `BlockStored`.
                events.clear();
                pool.drain_events(black_box(&mut events));
            },
            criterion::BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, single, mixed, match_cost, events);
criterion_main!(benches);
