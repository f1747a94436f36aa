//! One scheduler request on either side, and a replay of many over worker
//! threads.
//!
//! A request is what a scheduler does to admit a prompt with prefix
//! caching, in four calls on each side:
//!
//! | step | kvslots | kvbm-logical |
//! |---|---|---|
//! | match the cached prefix | [`Sequence::try_match_prefix`] | [`BlockManager::match_blocks`] |
//! | allocate the rest, all or nothing | [`Sequence::try_append`] (the prompt's remaining tokens) | [`BlockManager::allocate_blocks_with_evictions`] |
//! | register the new full blocks | [`Sequence::publish`] | [`MutableBlock::stage`] each, then [`BlockManager::register_blocks`] |
//! | drop, last block first | the sequence's drop | the blocks' drops, last first |
//!
//! A request holds its blocks only while it runs: the replay measures
//! admission and release, not a batch of running sequences.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use kvbm_logical::pools::BlockDuplicationPolicy;
use kvbm_logical::{BlockManager, BlockRegistry, ImmutableBlock, MutableBlock, SequenceHash};
use kvslots::{BlockHash, BlockPool, Sequence};

use crate::trace::Keys;
use crate::BLOCK_SIZE;

/// The storage-tier marker of the kvbm-logical blocks here (device memory,
/// Dynamo's G1).
#[derive(Clone, Copy, Debug)]
pub struct G1;

/// A kvbm-logical manager of `num_blocks` blocks of [`BLOCK_SIZE`] tokens
/// with an LRU inactive pool, one block per key
/// ([`BlockDuplicationPolicy::Reject`]) and a registry without frequency
/// tracking: kvslots' policy.
pub fn kvbm_manager(num_blocks: usize) -> BlockManager<G1> {
    BlockManager::<G1>::builder()
        .block_count(num_blocks)
        .block_size(BLOCK_SIZE)
        .registry(BlockRegistry::new())
        .with_lru_backend()
        .duplication_policy(BlockDuplicationPolicy::Reject)
        .build()
        .expect("a valid kvbm-logical configuration")
}

/// A block manager with a prefix cache, as a scheduler calls it.
pub trait PrefixCache: Send + Sync {
    /// Its block key.
    type Key: Send + Sync + 'static;

    /// The name of its rows in benchmarks and tables.
    const NAME: &'static str;

    /// A cache of `num_blocks` free blocks of [`BLOCK_SIZE`] tokens.
    fn with_blocks(num_blocks: usize) -> Self;

    /// One request of `prompt` tokens whose full blocks have `keys`: match
    /// the longest cached prefix of `keys`, allocate the prompt's other
    /// blocks all or nothing, register the new full blocks under their
    /// keys, and drop all the blocks, last block first. Returns the blocks
    /// matched, or `None` if the allocation was refused (the matched blocks
    /// are dropped then too).
    fn request(&self, prompt: usize, keys: &[Self::Key]) -> Option<usize>;

    /// Blocks free for allocation (uncached and evictable); all of them
    /// when no request runs.
    fn free_blocks(&self) -> usize;

    /// Cached blocks whose key an allocation dropped, so far.
    fn evictions(&self) -> u64;

    /// Blocks holding a key; exact when no request runs.
    fn cached_blocks(&self) -> usize;
}

/// kvslots: a [`BlockPool`] and a [`Sequence`] per request.
pub struct Kvslots(pub Arc<BlockPool>);

impl PrefixCache for Kvslots {
    type Key = BlockHash;
    const NAME: &'static str = "kvslots";

    fn with_blocks(num_blocks: usize) -> Self {
        Kvslots(Arc::new(BlockPool::new(num_blocks, BLOCK_SIZE)))
    }

    fn request(&self, prompt: usize, keys: &[BlockHash]) -> Option<usize> {
        let mut seq = Sequence::with_capacity(Arc::clone(&self.0), prompt);
        let hits = seq.try_match_prefix(keys);
        seq.try_append(prompt - seq.len()).ok()?;
        seq.publish(keys);
        Some(hits)
    }

    fn free_blocks(&self) -> usize {
        self.0.free_blocks()
    }

    fn evictions(&self) -> u64 {
        self.0.prefix_stats().evictions
    }

    fn cached_blocks(&self) -> usize {
        self.0.cached_blocks()
    }
}

/// kvbm-logical: a [`BlockManager`] built by [`kvbm_manager`].
pub struct Kvbm(pub BlockManager<G1>);

/// Drops `blocks` last first.
fn drop_reversed<B>(mut blocks: Vec<B>) {
    while blocks.pop().is_some() {}
}

impl PrefixCache for Kvbm {
    type Key = SequenceHash;
    const NAME: &'static str = "kvbm_logical";

    fn with_blocks(num_blocks: usize) -> Self {
        Kvbm(kvbm_manager(num_blocks))
    }

    fn request(&self, prompt: usize, keys: &[SequenceHash]) -> Option<usize> {
        let manager = &self.0;
        let matched: Vec<ImmutableBlock<G1>> = manager.match_blocks(keys);
        let hits = matched.len();
        let Some((mut fresh, _evicted)) =
            manager.allocate_blocks_with_evictions(prompt.div_ceil(BLOCK_SIZE) - hits)
        else {
            drop_reversed(matched);
            return None;
        };
        // The new full blocks are staged and registered; a partly filled
        // last block stays mutable.
        let tail: Vec<MutableBlock<G1>> = fresh.split_off(keys.len() - hits);
        let staged = fresh
            .into_iter()
            .zip(&keys[hits..])
            .map(|(block, &key)| {
                block
                    .stage(key, BLOCK_SIZE)
                    .unwrap_or_else(|_| panic!("a block of {BLOCK_SIZE} tokens"))
            })
            .collect();
        let registered = manager.register_blocks(staged);
        drop_reversed(tail);
        drop_reversed(registered);
        drop_reversed(matched);
        Some(hits)
    }

    fn free_blocks(&self) -> usize {
        self.0.available_blocks()
    }

    fn evictions(&self) -> u64 {
        self.0.metrics().snapshot().evictions
    }

    /// The inactive pool's blocks: a registered block no one holds is
    /// there, so when no request runs, every cached block is.
    fn cached_blocks(&self) -> usize {
        self.0.metrics().snapshot().inactive_pool_size as usize
    }
}

/// What a replay counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replay {
    /// Requests run.
    pub requests: u64,
    /// Requests whose allocation was refused.
    pub refused: u64,
    /// Full blocks of the admitted requests' prompts.
    pub full_blocks: u64,
    /// Blocks matched in the cache by the admitted requests.
    pub hit_blocks: u64,
    /// Cached blocks evicted.
    pub evictions: u64,
}

impl Replay {
    /// Matched blocks over full blocks, in percent.
    pub fn hit_rate(&self) -> f64 {
        100.0 * self.hit_blocks as f64 / self.full_blocks.max(1) as f64
    }
}

/// Runs the first `requests` requests of `keys` (all of them if there are
/// fewer) once on `cache`, spread over `threads` worker threads that take
/// the next request from a shared cursor, and returns the counts and the
/// wall time from the first worker's start to the last one's end. With
/// one thread the requests run in trace order.
///
/// # Panics
///
/// If `threads` is 0.
pub fn replay<C: PrefixCache>(
    cache: &C,
    keys: &Keys<C::Key>,
    requests: usize,
    threads: usize,
) -> (Replay, Duration) {
    assert!(threads > 0, "at least one thread");
    let requests = requests.min(keys.len());
    let evictions_before = cache.evictions();
    let cursor = AtomicUsize::new(0);
    let runs: Vec<(Replay, Instant, Instant)> = thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut counts = Replay::default();
                    let began = Instant::now();
                    loop {
                        // Relaxed: only hands out distinct indices; the
                        // caches order their own data.
                        let i = cursor.fetch_add(1, Ordering::Relaxed);
                        if i >= requests {
                            break;
                        }
                        let (prompt, request_keys) = keys.request(i);
                        counts.requests += 1;
                        match cache.request(prompt, request_keys) {
                            Some(hits) => {
                                counts.hit_blocks += hits as u64;
                                counts.full_blocks += request_keys.len() as u64;
                            }
                            None => counts.refused += 1,
                        }
                    }
                    (counts, began, Instant::now())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("replay worker panicked"))
            .collect()
    });
    let mut total = Replay::default();
    for (counts, _, _) in &runs {
        total.requests += counts.requests;
        total.refused += counts.refused;
        total.full_blocks += counts.full_blocks;
        total.hit_blocks += counts.hit_blocks;
    }
    total.evictions = cache.evictions() - evictions_before;
    let first = runs.iter().map(|r| r.1).min().expect("a worker");
    let last = runs.iter().map(|r| r.2).max().expect("a worker");
    (total, last - first)
}
