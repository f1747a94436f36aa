//! [`BlockPool::stats`]: the pool's gauges and counters in one struct, for
//! metrics.

use super::BlockPool;

/// A snapshot of a [`BlockPool`]'s gauges and counters, as
/// [`BlockPool::stats`] returns it: what a metrics exporter publishes
/// (the simulator's `--metrics` writes them as Prometheus `kvslots_*`
/// series).
///
/// Each field is read on its own, one after another, while other threads
/// may change the pool: the fields of one snapshot need not be consistent
/// with each other (`used_blocks + free_blocks == num_blocks` holds only
/// when no call runs), and each has the bounds of the method it comes
/// from. The struct is `#[non_exhaustive]`: new fields may come in a minor
/// release.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use kvslots::{hash_blocks, BlockPool, Sequence};
///
/// let pool = Arc::new(BlockPool::new(8, 4));
/// let mut keys = Vec::new();
/// hash_blocks(b"", &[1, 2, 3, 4, 5, 6, 7, 8], 4, &mut keys);
/// let mut seq = Sequence::new(Arc::clone(&pool));
/// seq.try_append(10).unwrap(); // 3 blocks
/// seq.publish(&keys);
///
/// let stats = pool.stats();
/// assert_eq!((stats.num_blocks, stats.used_blocks, stats.free_blocks), (8, 3, 5));
/// assert_eq!((stats.cached_blocks, stats.evictable_blocks), (2, 0));
/// assert_eq!(stats.usage(), 3.0 / 8.0);
/// assert_eq!(stats.events_dropped, None); // built without KV events
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct PoolStats {
    /// The pool's blocks ([`BlockPool::num_blocks`]).
    pub num_blocks: usize,
    /// Blocks in use ([`BlockPool::used_blocks`]).
    pub used_blocks: usize,
    /// The high-water mark of `used_blocks`
    /// ([`BlockPool::peak_used_blocks`]).
    pub peak_used_blocks: usize,
    /// Free blocks, evictable ones included ([`BlockPool::free_blocks`]).
    pub free_blocks: usize,
    /// Blocks holding a key ([`BlockPool::cached_blocks`]).
    pub cached_blocks: usize,
    /// Cached blocks that no one holds ([`BlockPool::evictable_blocks`]).
    pub evictable_blocks: usize,
    /// Blocks whose release waits for a fence
    /// ([`BlockPool::pending_release_blocks`]).
    pub pending_release_blocks: usize,
    /// Keys queried by prefix matches ([`BlockPool::prefix_stats`]).
    pub queried_blocks: u64,
    /// Blocks those matches hit ([`BlockPool::prefix_stats`]).
    pub hit_blocks: u64,
    /// Cached blocks evicted ([`BlockPool::prefix_stats`]).
    pub evictions: u64,
    /// Calls waiting in the allocation queue ([`BlockPool::waiters`]).
    pub waiters: usize,
    /// KV events lost to full rings since the pool was built, `None` for
    /// a pool without KV events
    /// ([`BlockPoolBuilder::kv_events`](crate::BlockPoolBuilder::kv_events)).
    pub events_dropped: Option<u64>,
}

impl PoolStats {
    /// `used_blocks / num_blocks`, in `0.0..=1.0` (0 for a pool of no
    /// blocks).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = kvslots::BlockPool::new(4, 16);
    /// pool.try_alloc(1, &mut Vec::new()).unwrap();
    /// assert_eq!(pool.stats().usage(), 0.25);
    /// ```
    pub fn usage(&self) -> f64 {
        if self.num_blocks == 0 {
            0.0
        } else {
            self.used_blocks as f64 / self.num_blocks as f64
        }
    }

    /// `hit_blocks / queried_blocks`, in `0.0..=1.0` (0 before any
    /// query).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(kvslots::BlockPool::new(4, 16).stats().hit_rate(), 0.0);
    /// ```
    pub fn hit_rate(&self) -> f64 {
        if self.queried_blocks == 0 {
            0.0
        } else {
            self.hit_blocks as f64 / self.queried_blocks as f64
        }
    }
}

impl BlockPool {
    /// The pool's gauges and counters in one snapshot, for metrics: the
    /// values of the methods each field names.
    ///
    /// It scans every block's state word once (for `cached_blocks` and
    /// `evictable_blocks`, both counted in the same pass), so it costs
    /// `O(num_blocks)` loads: call it from a metrics thread every second
    /// or so, not on a hot path. It takes no lock and changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = kvslots::BlockPool::new(16, 16);
    /// let mut ids = Vec::new();
    /// pool.try_alloc(4, &mut ids).unwrap();
    /// pool.free(&ids[..1]).unwrap();
    /// let stats = pool.stats();
    /// assert_eq!((stats.used_blocks, stats.peak_used_blocks, stats.free_blocks), (3, 4, 13));
    /// ```
    pub fn stats(&self) -> PoolStats {
        let prefix = self.prefix_stats();
        let (cached_blocks, evictable_blocks) = self.cache_counts();
        PoolStats {
            num_blocks: self.num_blocks(),
            used_blocks: self.used_blocks(),
            peak_used_blocks: self.peak_used_blocks(),
            free_blocks: self.free_blocks(),
            cached_blocks,
            evictable_blocks,
            pending_release_blocks: self.pending_release_blocks(),
            queried_blocks: prefix.queried_blocks,
            hit_blocks: prefix.hit_blocks,
            evictions: prefix.evictions,
            waiters: self.waiters(),
            events_dropped: self.prefix.as_deref().and_then(|c| c.events_lost()),
        }
    }
}
