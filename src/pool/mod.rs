//! [`BlockPool`]: a lock-free pool of KV-cache blocks with all-or-nothing
//! allocation and per-block reference counts.
//!
//! The core pool is this file and four beside it: per-shard admission
//! counts of blocks (`admission`), the free list (`free_list`), the
//! per-block state words with their reference counts (`refs`), and the
//! over-free check of [`BlockPool::free`] (`over_free`); waiting for
//! blocks is `wait`. The layers a pool is built with or without sit on
//! top: the prefix cache (the folder `prefix`, optional) and fenced
//! release (`fence`, in every pool). The core hands a cached block whose last reference goes to
//! the prefix cache instead of the free list (the last-reference hook in
//! `drop_each`), and asks it to evict when the free list runs short (in
//! `take_admitted`); nothing else in the core knows about it.
//! [`BlockPoolBuilder`] (`builder`) picks the layers.
//!
//! The design and the orderings are described in [`crate::implementation`]
//! ("Allocating and freeing blocks", "Reference counts", "Orderings").

use std::fmt;
use std::time::Duration;

use crate::allocator::{BlockAllocator, SequenceCall};
use crate::error::{FreeError, ReserveError};
use crate::hash::BlockHash;
use crate::id::BlockId;
use crate::sync::{self, Backoff};

mod admission;
mod builder;
mod fence;
mod free_list;
mod over_free;
mod prefix;
mod refs;
mod stats;
mod wait;

use admission::Admission;
pub use builder::BlockPoolBuilder;
use fence::Fences;
use free_list::{FreeList, Give, Taker};
use prefix::{Evictions, GroupTag, PrefixCache, Published};
pub use prefix::{KvEvent, PrefixStats};
pub(crate) use refs::Holder;
use refs::{Dropped, RawAddRefused, Refs};

pub use stats::PoolStats;
pub use wait::Alloc;

/// A lock-free pool of `num_blocks` KV-cache blocks of `block_size` token
/// slots each. Share it as an `Arc<BlockPool>`.
///
/// # Examples
///
/// ```
/// use kvslots::{BlockPool, ReserveError};
///
/// let pool = BlockPool::new(4, 16);
/// let mut ids = Vec::new();
/// pool.try_alloc(3, &mut ids).unwrap();
/// assert_eq!(ids.len(), 3);
/// // Two more do not fit in the one left: nothing is taken.
/// assert!(matches!(pool.try_alloc(2, &mut ids), Err(ReserveError::Full { .. })));
/// assert_eq!(ids.len(), 3);
/// pool.free(&ids).unwrap();
/// assert_eq!(pool.free_blocks(), 4);
/// ```
///
/// # Memory ordering
///
/// Everything the holders of a block did with it before its last reference
/// was dropped (by [`free`](Self::free), or by a [`Sequence`](crate::Sequence)'s
/// truncate or drop) happens-before the allocation that hands the block to
/// its next owner returns: a worker may write into the slots of a block it
/// was just given without further synchronisation. Adding a reference (a
/// fork) orders nothing by itself; the new holder gets it through whatever
/// hands over the sequence, as with `Arc::clone`.
///
/// # Prefix cache
///
/// A full block can be given a content key ([`BlockHash`])
/// with [`Sequence::publish`](crate::Sequence::publish); a later sequence
/// with the same prompt prefix takes the cached blocks with
/// [`Sequence::try_match_prefix`](crate::Sequence::try_match_prefix)
/// instead of computing them again. A cached block whose last reference
/// goes stays cached and becomes *evictable*: it counts as free
/// ([`free_blocks`](Self::free_blocks)), a match can revive it (which takes
/// capacity exactly as allocating a free block does), and an allocation
/// takes it only when no uncached free block is left, least recently
/// released first (exactly so with one thread; see the
/// [design notes](crate::implementation#prefix-cache) for the order under
/// concurrency). A refused allocation evicts nothing.
/// [`cached_blocks`](Self::cached_blocks),
/// [`evictable_blocks`](Self::evictable_blocks),
/// [`reset_prefix_cache`](Self::reset_prefix_cache) and
/// [`prefix_stats`](Self::prefix_stats) report on it and clear it. Every
/// path is lock-free while nobody waits (a give-back while someone waits
/// runs the wait queue's grant loop, see
/// [Waiting](crate::implementation#waiting)), and none allocates heap
/// memory.
///
/// # Fenced release
///
/// With asynchronous scheduling a device step may still read a sequence's
/// blocks after the scheduler has let go of them. [`Sequence::retire`](crate::Sequence::retire)
/// and [`Sequence::truncate_fenced`](crate::Sequence::truncate_fenced)
/// keep the references under the step's fence until
/// [`complete`](Self::complete) declares it done; until then the blocks
/// count as used and are never handed out.
/// [`pending_release_blocks`](Self::pending_release_blocks) counts them.
/// Dropping the pool with retirements pending frees their lists with it
/// (the references are the pool's own bookkeeping, so nothing leaks).
///
/// # Orderings
///
/// Whatever a sequence's thread wrote into a block before publishing it
/// happens-before any match that returns the block: the publish sets the
/// block's cached flag (and inserts its index entry) with `Release`, and a
/// matcher reads the flag with `Acquire` before it compares the key and
/// takes its reference with a CAS on the same word. Reviving an evictable
/// block also synchronises with its last holder's drop (`Release`), as an
/// allocation does.
pub struct BlockPool {
    /// Admits block counts: a free count per shard, each on its own line,
    /// so that a thread allocating from and freeing to its home shard
    /// writes no line that other threads write; and the closed flag.
    counter: Admission,
    /// The ids not in use, in shards (one per id range) with padded heads.
    free: FreeList,
    /// Per-block state words (reference count, prefix-cache flags,
    /// generation): the single truth about each block.
    refs: Refs,
    /// The prefix cache layer (keys, index, eviction order, statistics),
    /// if the pool was built with one.
    prefix: Option<Box<PrefixCache>>,
    /// The fenced release layer: references retired under fences that have
    /// not completed yet.
    fences: Fences,
    block_size: usize,
}

impl BlockPool {
    /// The largest number of blocks a pool can have: ids are `u32` values
    /// below `u32::MAX`.
    pub const MAX_BLOCKS: usize = u32::MAX as usize;

    /// The most free-list shards [`new`](Self::new) gives a pool.
    pub const DEFAULT_SHARDS: usize = 16;

    /// The blocks per free-list shard below which [`new`](Self::new) uses
    /// fewer shards.
    pub const BLOCKS_PER_SHARD: usize = 64;

    /// The most free-list shards [`with_shards`](Self::with_shards) accepts.
    pub const MAX_SHARDS: usize = 1024;

    /// Creates a pool of `num_blocks` free blocks of `block_size` token
    /// slots, with [`default_shards`](Self::default_shards) free-list
    /// shards and every layer: the prefix cache and fenced release.
    /// `num_blocks == 0` is a valid pool that refuses every allocation.
    /// [`builder`](Self::builder) is the fallible form, and picks the
    /// layers (a pool without a prefix cache takes about a ninth of the
    /// memory: 8 bytes a block against 78).
    ///
    /// # Panics
    ///
    /// Panics (an unwinding panic, never an abort) with the message of the
    /// [`ConfigError`](crate::ConfigError) that [`BlockPoolBuilder::build`]
    /// returns for the same arguments: if `block_size == 0` ("block_size
    /// must be non-zero"), if `num_blocks` is larger than
    /// [`BlockPool::MAX_BLOCKS`] ("num_blocks .. does not fit the block id
    /// type"), if `num_blocks * block_size` (the number of flat slot
    /// indices) overflows `usize` ("num_blocks * block_size overflows
    /// usize"), or if the pool's bookkeeping (78 bytes a block) cannot be
    /// allocated ("out of memory: ..."). The arguments are checked before
    /// any memory is asked for.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = kvslots::BlockPool::new(1024, 16);
    /// assert_eq!(pool.num_blocks(), 1024);
    /// assert_eq!(pool.block_size(), 16);
    /// assert!(pool.has_prefix_cache());
    /// ```
    pub fn new(num_blocks: usize, block_size: usize) -> BlockPool {
        BlockPool::builder(num_blocks, block_size)
            .prefix_cache(true)
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`new`](Self::new), with the free list cut into `shards`
    /// shards instead of the default (see [`shards`](Self::shards)). A
    /// shard is a lock-free bitmap of the free block ids it owns, on cache
    /// lines of its own (one CAS takes up to 64 of them, lowest first).
    ///
    /// Shard `s` owns the ids `s * span .. (s + 1) * span` (`span` =
    /// `num_blocks / shards`, rounded up) and a freed block always goes
    /// back to the shard that owns it. Each thread takes from a home shard
    /// first (threads are numbered in the order they first allocate from
    /// or free to any pool, and thread `i` starts at shard `i % shards`) and from the
    /// others only when its own is short, so threads that free and
    /// reallocate do not contend on one word and keep their own part of
    /// the bitmap in their cache. A thread whose home shard is
    /// short looks through the others, so very many shards over a nearly
    /// full pool make that slow path longer. `shards == 1` is the plain
    /// single-shard pool.
    ///
    /// Admission is counted per shard too: each shard keeps a count of
    /// free blocks on its own cache line, an allocation takes from its
    /// home shard's count and a free gives back to the freeing thread's,
    /// so a thread that allocates and frees on its own shard writes no
    /// line that other threads write. When the home count is short the
    /// allocation gathers from the other shards' counts, all or nothing
    /// (see [`try_alloc`](Self::try_alloc) for what a concurrent `Full`
    /// means then, and [`free_blocks`](Self::free_blocks) for the counts).
    /// Which shard an id or a count sits in is never visible in a
    /// single-threaded run: all or nothing, `Full` and the counts are
    /// those of the whole pool.
    ///
    /// Like `new`, the pool has every layer.
    ///
    /// # Panics
    ///
    /// As [`new`](Self::new), and if `shards` is 0 or above
    /// [`BlockPool::MAX_SHARDS`] ("shards must be in 1..=1024, got ..."):
    /// with the message of the [`ConfigError`](crate::ConfigError) that
    /// `BlockPool::builder(num_blocks, block_size).shards(shards).build()`
    /// returns.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = kvslots::BlockPool::with_shards(1024, 16, 4);
    /// assert_eq!(pool.shards(), 4);
    /// let mut ids = Vec::new();
    /// // Any thread can take every block, whichever shards hold them.
    /// pool.try_alloc(1024, &mut ids).unwrap();
    /// pool.free(&ids).unwrap();
    /// ```
    pub fn with_shards(num_blocks: usize, block_size: usize, shards: usize) -> BlockPool {
        BlockPool::builder(num_blocks, block_size)
            .shards(shards)
            .prefix_cache(true)
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`with_shards`](Self::with_shards) with the faults of one of loom's
    /// negative controls: the loom models' build only.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) fn with_faults(
        num_blocks: usize,
        block_size: usize,
        shards: usize,
        faults: crate::sync::Faults,
    ) -> BlockPool {
        BlockPool::builder(num_blocks, block_size)
            .shards(shards)
            .prefix_cache(true)
            .faults(faults)
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Whether the pool has a prefix cache (see
    /// [`BlockPoolBuilder::prefix_cache`]): pools from [`new`](Self::new)
    /// and [`with_shards`](Self::with_shards) do.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::BlockPool;
    ///
    /// assert!(BlockPool::new(64, 16).has_prefix_cache());
    /// assert!(!BlockPool::builder(64, 16).build().unwrap().has_prefix_cache());
    /// ```
    pub fn has_prefix_cache(&self) -> bool {
        self.prefix.is_some()
    }

    /// The prefix cache, for a block that is cached: only a pool with a
    /// prefix cache has cached blocks.
    fn cache(&self) -> &PrefixCache {
        self.prefix
            .as_deref()
            .expect("a cached block in a pool without a prefix cache")
    }

    /// The shard count [`new`](Self::new) picks for `num_blocks` blocks:
    /// one shard per [`BLOCKS_PER_SHARD`](Self::BLOCKS_PER_SHARD) blocks,
    /// at least 1 and at most [`DEFAULT_SHARDS`](Self::DEFAULT_SHARDS).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::BlockPool;
    ///
    /// assert_eq!(BlockPool::default_shards(100), 1);
    /// assert_eq!(BlockPool::default_shards(512), 8);
    /// assert_eq!(BlockPool::default_shards(usize::MAX), 16);
    /// assert_eq!(BlockPool::new(512, 16).shards(), 8);
    /// ```
    pub const fn default_shards(num_blocks: usize) -> usize {
        let shards = num_blocks / Self::BLOCKS_PER_SHARD;
        if shards == 0 {
            1
        } else if shards > Self::DEFAULT_SHARDS {
            Self::DEFAULT_SHARDS
        } else {
            shards
        }
    }

    /// How many shards the free list is cut into.
    ///
    /// [`new`](Self::new) gives a pool one shard per 64 blocks, up to 16:
    /// tiny pools keep a single shard (nothing to spread), and 16 covers
    /// the worker threads of one inference process on most machines (with
    /// more threads than shards, some threads share a home shard, which is
    /// correct, only more contended).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::BlockPool;
    ///
    /// assert_eq!(BlockPool::new(16, 16).shards(), 1);
    /// assert_eq!(BlockPool::new(8192, 16).shards(), BlockPool::DEFAULT_SHARDS);
    /// ```
    pub fn shards(&self) -> usize {
        self.free.shards()
    }

    /// The total number of blocks.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(kvslots::BlockPool::new(8, 16).num_blocks(), 8);
    /// ```
    pub fn num_blocks(&self) -> usize {
        self.counter.capacity()
    }

    /// The number of token slots per block.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(kvslots::BlockPool::new(8, 16).block_size(), 16);
    /// ```
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// A snapshot of the number of free blocks (never above
    /// [`num_blocks`](Self::num_blocks)): uncached free blocks and
    /// [evictable](Self::evictable_blocks) cached ones, which an allocation
    /// may take.
    ///
    /// It is the sum of the shards' free counts, read one after another:
    /// exact whenever no allocation or free is running. While some run,
    /// each shard's count is exact at the moment it is read, but blocks
    /// that an allocation holds in transit between shards count as used,
    /// and blocks that other calls move between shards while the sum is
    /// taken can be missed or counted twice; the sum is capped at
    /// `num_blocks()`.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = kvslots::BlockPool::new(8, 16);
    /// let mut ids = Vec::new();
    /// pool.try_alloc(3, &mut ids).unwrap();
    /// assert_eq!(pool.free_blocks(), 5);
    /// # pool.free(&ids).unwrap();
    /// ```
    pub fn free_blocks(&self) -> usize {
        self.counter.available()
    }

    /// A snapshot of the number of blocks in use: those with at least one
    /// reference (cached or not), plus any an allocation or a match is
    /// taking right now. It is `num_blocks() - free_blocks()`, with the
    /// same bounds: exact whenever no call is running, never above
    /// `num_blocks()`.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = kvslots::BlockPool::new(8, 16);
    /// let mut ids = Vec::new();
    /// pool.try_alloc(3, &mut ids).unwrap();
    /// assert_eq!(pool.used_blocks(), 3);
    /// # pool.free(&ids).unwrap();
    /// ```
    pub fn used_blocks(&self) -> usize {
        self.counter.used()
    }

    /// An estimate of how many blocks an admission could take now, less
    /// what the queued waiters are owed (see
    /// [`Admission::estimate_free`](admission::Admission::estimate_free)):
    /// what a hybrid match into a reservation plans to admit beside it.
    pub(crate) fn admission_estimate(&self) -> usize {
        self.counter.estimate_free()
    }

    /// The shards' free counts summed without the cap at `num_blocks`, for
    /// the loom models' conservation check.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) fn admission_free_uncapped(&self) -> usize {
        self.counter.free_uncapped()
    }

    /// The prefix cache's eviction ring: its capacity, how many candidates
    /// it holds (stale ones included) and whether it is overflowed, for the
    /// loom models of the ring. Panics without a prefix cache.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) fn eviction_ring(&self) -> (usize, usize, bool) {
        self.prefix
            .as_deref()
            .expect("a prefix cache")
            .eviction_ring()
    }

    /// Empties the prefix cache's eviction ring without evicting: its
    /// head moves past every candidate, and the blocks they name stay
    /// evictable, outside the ring, with its overflowed bit as it was, for
    /// the loom models that start from a ring run dry while evictable
    /// blocks are left out of it. Panics without a prefix cache.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) fn pass_eviction_candidates(&self) {
        self.prefix
            .as_deref()
            .expect("a prefix cache")
            .pass_eviction_candidates();
    }

    /// Takes `n` stamps of the prefix cache's release clock, as `n`
    /// releases of cached blocks would, for the loom models that need
    /// stamps far apart. Panics without a prefix cache.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) fn skip_release_stamps(&self, n: u32) {
        self.prefix
            .as_deref()
            .expect("a prefix cache")
            .skip_release_stamps(n);
    }

    /// The high-water mark of [`used_blocks`](Self::used_blocks), never
    /// above [`num_blocks`](Self::num_blocks).
    ///
    /// Exact when one thread uses the pool. Each allocation raises it
    /// from its home shard's free count after the allocation plus the
    /// other shards' counts as its home shard last saw them (each
    /// allocation that had to gather from other shards sums them afresh),
    /// so that the fast path reads no line that other threads write. With
    /// several threads it is therefore an estimate: blocks that other
    /// threads took from or gave to other shards since that shard's last
    /// gather make it lag or lead the true high-water mark by that many.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = kvslots::BlockPool::new(8, 16);
    /// let mut ids = Vec::new();
    /// pool.try_alloc(6, &mut ids).unwrap();
    /// pool.free(&ids).unwrap();
    /// assert_eq!(pool.peak_used_blocks(), 6);
    /// ```
    pub fn peak_used_blocks(&self) -> usize {
        self.counter.peak_used()
    }

    /// The number of references block `id` has now (0 when it is free), or
    /// `None` if `id` is out of range. A snapshot, for tests and metrics.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{BlockId, BlockPool};
    ///
    /// let pool = BlockPool::new(2, 16);
    /// let mut ids = Vec::new();
    /// pool.try_alloc(1, &mut ids).unwrap();
    /// assert_eq!(pool.ref_count(ids[0]), Some(1));
    /// assert_eq!(pool.ref_count(BlockId::new(9)), None);
    /// # pool.free(&ids).unwrap();
    /// ```
    pub fn ref_count(&self, id: BlockId) -> Option<usize> {
        if id.index() >= self.num_blocks() {
            return None;
        }
        Some(self.holders_now(id).0 as usize)
    }

    /// Allocates exactly `n` blocks, all or nothing, appending their
    /// distinct ids to `out` (each with one reference).
    ///
    /// `n == 0` appends nothing, and succeeds unless the pool is closed
    /// (then it is [`ReserveError::Closed`], as for any `n`). No heap
    /// allocation happens here, except growing `out` if it lacks room for
    /// `n` more ids.
    ///
    /// # Errors
    ///
    /// * [`ReserveError::NeverFits`] if `n > num_blocks()` (`usize::MAX`
    ///   included).
    /// * [`ReserveError::Full`] if fewer than `n` blocks are free. In a
    ///   single-threaded run, `available` is exactly the free blocks.
    ///   Under concurrency a refusal may also come while blocks are in
    ///   transit inside other calls that are still running (an allocation
    ///   that its home shard cannot serve holds what it takes from the
    ///   shards until it has enough, or gives it all back): a `Full` is
    ///   always justified in that, at some instant during the call, the
    ///   free blocks outside other running calls were `available`, fewer
    ///   than requested.
    /// * [`ReserveError::BehindWaiters`] if `n` blocks were free, but not
    ///   beside what the waiters queued by [`alloc`](Self::alloc) and its
    ///   kin are owed (each granted in arrival order with its headroom); a
    ///   new allocation does not pass them.
    /// * [`ReserveError::Closed`] after [`close`](Self::close).
    ///
    /// On error `out` and the pool are unchanged (only `out`'s capacity may
    /// have grown: room for the ids is made before admission, so that
    /// nothing can fail once blocks are admitted).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = kvslots::BlockPool::new(4, 16);
    /// let mut ids = Vec::new();
    /// pool.try_alloc(2, &mut ids).unwrap();
    /// assert_ne!(ids[0], ids[1]);
    /// assert!(pool.try_alloc(usize::MAX, &mut ids).is_err());
    /// assert_eq!(ids.len(), 2);
    /// # pool.free(&ids).unwrap();
    /// ```
    pub fn try_alloc(&self, n: usize, out: &mut Vec<BlockId>) -> Result<(), ReserveError> {
        self.try_alloc_with_headroom(n, 0, out)
    }

    /// Like [`try_alloc`](Self::try_alloc), but only if `headroom` blocks
    /// would still be free afterwards (`used + n + headroom <= num_blocks`):
    /// the watermark a scheduler applies to new sequences so that running
    /// ones keep room to grow.
    ///
    /// # Errors
    ///
    /// As [`SlotCounter::try_reserve_with_headroom`](crate::SlotCounter::try_reserve_with_headroom):
    /// `NeverFits` if `n + headroom > num_blocks()`, `Closed`,
    /// `BehindWaiters` (as for `try_alloc`), or `Full`
    /// (which, under concurrency, may count blocks in transit as
    /// [`try_alloc`](Self::try_alloc) says; an allocation that gathers
    /// holds `n + headroom` for an instant before it gives the headroom
    /// back). On error `out`'s contents and the pool are unchanged (as for
    /// `try_alloc`).
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = kvslots::BlockPool::new(4, 16);
    /// let mut ids = Vec::new();
    /// assert!(pool.try_alloc_with_headroom(3, 2, &mut ids).is_err());
    /// pool.try_alloc_with_headroom(2, 2, &mut ids).unwrap();
    /// # pool.free(&ids).unwrap();
    /// ```
    pub fn try_alloc_with_headroom(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        self.try_alloc_for(n, headroom, out, Holder::Raw)
    }

    /// [`try_alloc_with_headroom`](Self::try_alloc_with_headroom) for a
    /// [`Sequence`](crate::Sequence): the blocks carry the sequence flag
    /// (see [Reference counts](crate::implementation#reference-counts)).
    pub(crate) fn try_alloc_sequence(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        self.try_alloc_for(n, headroom, out, Holder::Sequence)
    }

    /// The body of both: blocks for `holder`.
    fn try_alloc_for(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
        holder: Holder,
    ) -> Result<(), ReserveError> {
        // Room for the ids first (it could panic or allocate), and only for a
        // request that can fit at all, so that nothing admitted can leak.
        if n <= self.num_blocks() {
            out.reserve(n);
        }
        self.counter.try_reserve_raw(n, headroom)?;
        self.take_admitted(n, out, holder);
        Ok(())
    }

    /// [`try_alloc`](Self::try_alloc) for the growth of what a caller
    /// already holds (an append to a [`Sequence`](crate::Sequence) that holds
    /// blocks, a fork of one): it takes free blocks even when they are owed
    /// to the head of the wait queue, so that running sequences do not wait
    /// behind new admissions (see [Waiting](crate::implementation#waiting)).
    pub(crate) fn try_alloc_growth(
        &self,
        n: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        // Room for the ids first, as in `try_alloc_with_headroom`.
        if n <= self.num_blocks() {
            out.reserve(n);
        }
        self.counter.try_grow_raw(n)?;
        self.take_admitted(n, out, Holder::Sequence);
        Ok(())
    }

    /// Appends to `out` the ids of `n` blocks whose admission the caller
    /// has made (a `try_*` call, or a grant of the wait queue), each with
    /// one reference of `holder`'s. `out` has room for them.
    fn take_admitted(&self, n: usize, out: &mut Vec<BlockId>, holder: Holder) {
        if n == 0 {
            return;
        }
        // Uncached free blocks first; only then evict cached blocks that no
        // one holds, least recently released first. The admission above
        // guarantees that the two together hold `n` blocks for us; when
        // they look short, other threads are moving blocks between them.
        let mut need = n;
        let backoff = Backoff::new();
        loop {
            need -= self.take_free(need, out, holder, false);
            if let (true, Some(cache)) = (need > 0, self.prefix.as_deref()) {
                need -= self.evict_into(cache, need, out, holder);
            }
            if need > 0 {
                // The last look: every word of the free list, whatever its
                // summaries say.
                need -= self.take_free(need, out, holder, true);
            }
            if need == 0 {
                return;
            }
            sync::stale_retry(&backoff);
        }
    }

    /// Takes up to `k > 0` uncached free blocks from the free list
    /// (through its summaries, or with `everywhere` through every word),
    /// appends them to `out` with one reference of `holder`'s each, and
    /// returns how many.
    ///
    /// Blocks that a sequence gets from one word of the bitmap, at least
    /// `free_list::FRESH_MIN` (8) of them, are left fresh: their references are
    /// uncounted, marked in the free list's fresh bitmap (one `fetch_or`
    /// for the word, a store if the take emptied it), and their state
    /// words are not written (see
    /// [Reference counts](crate::implementation#reference-counts)). Fewer
    /// get a count of 1 each, a plain store, which costs less than the
    /// mark and the fresh give-back's clear for a few blocks.
    fn take_free(
        &self,
        k: usize,
        out: &mut Vec<BlockId>,
        holder: Holder,
        everywhere: bool,
    ) -> usize {
        let mut taker = Taker {
            fresh: holder == Holder::Sequence,
            first: |ids: &[BlockId]| self.refs.set_first(ids, holder),
        };
        if everywhere {
            self.free.pop_everywhere(k, out, &mut taker)
        } else {
            self.free.pop(k, out, &mut taker)
        }
    }

    /// Drops one reference per listed id; a block whose last reference goes
    /// returns to the pool. Freeing an empty slice is a no-op.
    ///
    /// The whole call or nothing: if any id is out of range, not allocated,
    /// held by [`Sequence`](crate::Sequence)s, or listed more times than it
    /// has references, nothing changes and the error names the offending
    /// id (checked in this order: any id out of range, then any block not
    /// allocated, then any block held by sequences, then any block
    /// over-freed; each the first in list order). No heap allocation happens
    /// here, and the checks stay near linear in the list's length: pairwise
    /// for up to 16 ids; otherwise one pass when no two listed ids are equal
    /// modulo 4,096; when some are, one marking pass per span of 65,536
    /// indices that holds a listed id, and a tallying pass per window of
    /// 8,192 indices where an id is listed twice (plus, for ids listed 255
    /// times or more beyond the first 32 such, a pass per 32 of them).
    ///
    /// The checks are made with loads before any reference is dropped, so a
    /// call refused by them changes nothing that another thread could
    /// observe. Reference counts cannot tell holders apart, though: a
    /// caller that lists a shared block more often than it holds it (but no
    /// more often than it has references) takes the other holders'
    /// references. Free only what you hold; [`Sequence`](crate::Sequence)
    /// does that for you.
    ///
    /// One refusal comes later, and is not all or nothing: when another
    /// thread frees a listed block between those checks and this call's own
    /// drop of it (a double free that races, so the caller listed a
    /// reference it did not hold). That reference is refused with
    /// [`FreeError::Raced`], and every other listed reference is dropped as
    /// by a successful free: taking them back could add a reference to a
    /// block that its other holders freed, and someone reallocated, in the
    /// meantime.
    ///
    /// A block that sequences hold (their tables, a fork's, a match's, or
    /// a fence's retirement) is theirs to give back: a free of it is a
    /// double free, refused with [`FreeError::HeldBySequence`] before
    /// anything changes. So a sequence never loses a reference to a raw
    /// free, and gives back a block it holds alone without a
    /// read-modify-write (see
    /// [Reference counts](crate::implementation#reference-counts)). Only
    /// sequences take blocks through [`BlockAllocator`] (whose calls take
    /// a [`SequenceCall`], which only this crate builds), and give them
    /// back themselves.
    ///
    /// Whatever races, the pool's own books stay exact: no block is given
    /// back twice, the count of used blocks is given back once per block,
    /// and `free_blocks() <= num_blocks()`. That includes a free racing a
    /// raw holder's own free of the block: whichever of the two drops the
    /// last reference gives it back; if this call loses, it returns `Raced`
    /// (or `NotAllocated`, if the block was back before its checks). And a
    /// free whose checks passed while a raw caller held the block, and that
    /// finds it freed and taken for a sequence since, refuses that block
    /// with `Raced` (its drop compares the whole state word).
    ///
    /// What a double free does break is the caller's own claim: once a free
    /// takes a reference its caller did not hold, the real holder names a
    /// block it no longer holds. If that block is handed to a new owner
    /// before the real holder gives it back, the holder's accesses, and its
    /// drop, act on the new owner's block (reference counts cannot tell
    /// holders apart). So a double free can hand a block to two owners
    /// through the holder that lost its reference; never through the pool.
    ///
    /// # Errors
    ///
    /// [`FreeError::OutOfRange`], [`FreeError::NotAllocated`],
    /// [`FreeError::HeldBySequence`], [`FreeError::OverFreed`] (nothing
    /// changed), [`FreeError::Raced`]
    /// (the other references were dropped).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{BlockPool, FreeError};
    ///
    /// let pool = BlockPool::new(4, 16);
    /// let mut ids = Vec::new();
    /// pool.try_alloc(2, &mut ids).unwrap();
    /// pool.free(&ids).unwrap();
    /// assert_eq!(pool.free(&ids), Err(FreeError::NotAllocated { id: ids[0] }));
    /// assert_eq!(pool.free_blocks(), 4);
    /// ```
    pub fn free(&self, ids: &[BlockId]) -> Result<(), FreeError> {
        // Every block allocated, a raw caller's, and listed no more often
        // than it has references? Checked with loads before anything
        // changes, so that a refused call never drops (and restores) a
        // reference that a concurrent holder could observe.
        self.check_raw(ids)?;
        if let Some(id) = over_free::first_over_freed(ids, |id| self.holders_now(id).0 as usize) {
            return Err(FreeError::OverFreed { id });
        }
        self.drop_refs(ids)
    }

    /// Adds one reference to each listed raw block (taken by
    /// [`try_alloc`](Self::try_alloc) and its kin), which the caller holds:
    /// to share a block between raw holders, each of which then gives its
    /// reference back with [`free`](Self::free). An id listed twice gets
    /// two references. Adding to an empty slice is a no-op.
    ///
    /// All or nothing. The checks come first, with loads, in this order
    /// (each the first in list order): any id out of range, then any block
    /// not allocated, then any block held by [`Sequence`](crate::Sequence)s
    /// (a sequence's references are its own to share, by a fork). Then the
    /// references are added, one CAS each, which refuses a block that has
    /// no holder left or is a sequence's (compared in the whole state
    /// word, so that a raw call never writes a sequence's block), and one
    /// at the most references a block can have. If one is refused there
    /// (another thread freed the block since the checks, a double free
    /// that races, or its count is at its maximum), the references this
    /// call added are dropped again, as [`free`](Self::free) drops them,
    /// and the error names the block: nothing changed, though another
    /// thread may have seen the added references meanwhile (and a block
    /// whose other holders freed it meanwhile goes back when this call
    /// drops what it added).
    ///
    /// Orders nothing by itself: the new holder gets the blocks through
    /// whatever hands it over, as with `Arc::clone`.
    ///
    /// # Errors
    ///
    /// [`FreeError::OutOfRange`], [`FreeError::NotAllocated`],
    /// [`FreeError::HeldBySequence`] from the checks;
    /// [`FreeError::Raced`] (freed since the checks) or
    /// [`FreeError::TooManyRefs`] from the adds. Nothing changed in every
    /// case.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, FreeError, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(4, 16));
    /// let mut ids = Vec::new();
    /// pool.try_alloc(1, &mut ids).unwrap();
    /// pool.add_refs(&ids).unwrap();
    /// assert_eq!(pool.ref_count(ids[0]), Some(2));
    /// pool.free(&ids).unwrap();
    /// pool.free(&ids).unwrap();
    ///
    /// // A sequence's blocks are its own.
    /// let mut seq = Sequence::new(Arc::clone(&pool));
    /// seq.try_append(16).unwrap();
    /// let id = seq.blocks()[0];
    /// assert_eq!(pool.add_refs(&[id]), Err(FreeError::HeldBySequence { id }));
    /// assert_eq!(pool.ref_count(id), Some(1));
    /// ```
    pub fn add_refs(&self, ids: &[BlockId]) -> Result<(), FreeError> {
        self.check_raw(ids)?;
        for (i, &id) in ids.iter().enumerate() {
            if let Err(why) = self.refs.add_raw(id) {
                // The references added so far are this call's own: dropping
                // them again cannot fail but for a third party's double
                // free of the same blocks (which `free` reports to that
                // party), so the result has nothing to add here.
                let _ = self.drop_refs(&ids[..i]);
                return Err(match why {
                    RawAddRefused::Gone => FreeError::Raced { id },
                    RawAddRefused::Full => FreeError::TooManyRefs { id },
                });
            }
        }
        Ok(())
    }

    /// The first checks of [`free`](Self::free) and
    /// [`add_refs`](Self::add_refs), with loads, before anything changes:
    /// every id in range, then every block allocated, then none held by
    /// sequences (the first offender in list order for each; one load per
    /// id for the last two).
    fn check_raw(&self, ids: &[BlockId]) -> Result<(), FreeError> {
        if let Some(&id) = ids.iter().find(|id| id.index() >= self.num_blocks()) {
            return Err(FreeError::OutOfRange {
                id,
                num_blocks: self.num_blocks(),
            });
        }
        // The usual case, raw blocks with counts, without a call in the
        // loop; a bare word (a fresh block, or a free one) sends the whole
        // check to the loop that reads fresh bits.
        let mut held_by_sequence = None;
        for &id in ids {
            let state = self.refs.holders(id);
            if state.bare {
                return self.check_held(ids);
            }
            if state.counted == 0 {
                return Err(FreeError::NotAllocated { id });
            }
            if state.sequence && held_by_sequence.is_none() {
                held_by_sequence = Some(id);
            }
        }
        match held_by_sequence {
            Some(id) => Err(FreeError::HeldBySequence { id }),
            None => Ok(()),
        }
    }

    /// The checks of [`check_raw`](Self::check_raw) after the ids' range,
    /// with each block's holders as [`holders_now`](Self::holders_now)
    /// reads them (a fresh block's bit looked up).
    #[cold]
    #[inline(never)]
    fn check_held(&self, ids: &[BlockId]) -> Result<(), FreeError> {
        let mut held_by_sequence = None;
        for &id in ids {
            let (holders, sequence) = self.holders_now(id);
            if holders == 0 {
                return Err(FreeError::NotAllocated { id });
            }
            if sequence && held_by_sequence.is_none() {
                held_by_sequence = Some(id);
            }
        }
        match held_by_sequence {
            Some(id) => Err(FreeError::HeldBySequence { id }),
            None => Ok(()),
        }
    }

    /// Block `id`'s holders now (a claim's own reference aside), and
    /// whether every one of them is a sequence: the count in its state
    /// word, or the one uncounted reference of a fresh block. A snapshot,
    /// as a raw call's checks and [`ref_count`](Self::ref_count) read it.
    ///
    /// A fresh block's state word is bare, as a free block's is: a bare
    /// word sends the read to the block's fresh bit, and then back to the
    /// word if the bit is clear. The block's holder counts a fresh
    /// reference in the word before it clears the bit (Release, read here
    /// with Acquire), so a block held throughout reads as held; one that
    /// reads bare, clear and bare was free, or its take or give-back was
    /// under way, at a moment of the read.
    #[inline]
    fn holders_now(&self, id: BlockId) -> (u32, bool) {
        let state = self.refs.holders(id);
        if !state.bare {
            return (state.counted, state.sequence);
        }
        self.bare_holders(id)
    }

    /// [`holders_now`](Self::holders_now) of a block whose state word read
    /// bare: fresh, or free (kept out of the checks' loop).
    #[cold]
    #[inline(never)]
    fn bare_holders(&self, id: BlockId) -> (u32, bool) {
        if self.free.is_fresh(id) {
            // Under loom's `free_ignores_sequence` control, a raw call
            // takes it for its own.
            return (1, !self.refs.faults.free_ignores_sequence());
        }
        let state = self.refs.holders(id);
        (state.counted, state.sequence)
    }

    /// Drops one reference per listed id for [`free`](Self::free), whose
    /// checks found every listed reference present; gathers the blocks that
    /// reach zero and gives them back (one `fetch_or` per run of ids in one
    /// word of the free list).
    fn drop_refs(&self, ids: &[BlockId]) -> Result<(), FreeError> {
        self.drop_each(Give::new(), ids.iter().copied(), ids, true, |id| {
            self.refs.drop(id)
        })
        .1
    }

    /// Drops the references a [`Sequence`](crate::Sequence) holds in its
    /// table (or retired), as [`drop_refs`](Self::drop_refs) does.
    ///
    /// A fresh block goes back with no access to its word, a run of them
    /// at a time; a block that the sequence holds alone, counted, neither
    /// cached nor claimed, with a load and a plain store of its word (see
    /// [Reference counts](crate::implementation#reference-counts)); every
    /// other drop is the CAS loop of a raw free. A reference that is no
    /// longer there (a raw free took it before the block was a sequence's:
    /// a double free) is refused with `Raced` like any drop that loses that
    /// race, and the others are dropped all the same.
    ///
    /// The references go last listed first: a sequence's last block is
    /// released first, so that of a cached prompt the tail is evicted
    /// before the head.
    pub(crate) fn drop_held_refs(&self, ids: &[BlockId]) -> Result<(), FreeError> {
        self.drop_held(ids, true).1
    }

    /// Drops the references of `ids`, blocks the caller holds, as
    /// [`drop_held_refs`](Self::drop_held_refs) does, but keeps the
    /// admission of the blocks that go back (free, or evictable): the
    /// counter still counts them as taken, and the caller owns their place
    /// in the capacity (credits, as a match's revivals admitted ahead are:
    /// spent on revivals, or given back with
    /// [`give_back_ahead`](admission::Admission::give_back_ahead)).
    /// Returns how many went back. Under loom's `lend_releases` control
    /// the admission goes back too (the credits are then counted twice).
    pub(crate) fn lend_held(&self, ids: &[BlockId]) -> usize {
        let release = self.refs.faults.lend_releases();
        self.drop_held(ids, release).0
    }

    /// Appends to `out` the ids of `n` blocks (free ones first, then
    /// evicted; one reference each, a sequence's) paid by credits the
    /// caller holds: places in the capacity kept by
    /// [`lend_held`](Self::lend_held).
    pub(crate) fn take_lent(&self, n: usize, out: &mut Vec<BlockId>) {
        self.take_admitted(n, out, Holder::Sequence);
    }

    /// Gives back `n` credits kept by [`lend_held`](Self::lend_held) and
    /// not spent, as a release of that many blocks does (waking whom it
    /// grants).
    pub(crate) fn give_back_lent(&self, n: usize) {
        if n > 0 {
            self.counter.release_held(n);
        }
    }

    /// The body of [`drop_held_refs`](Self::drop_held_refs) and
    /// [`lend_held`](Self::lend_held): `release` says whether the blocks
    /// that go back give their admission back. Returns how many went back.
    fn drop_held(&self, ids: &[BlockId], release: bool) -> (usize, Result<(), FreeError>) {
        // One block counted and held alone (a decode step's block rolled
        // back, a copy-on-write's source): a load and a store, no runs.
        if let &[id] = ids {
            if self.refs.drop_sole(id) {
                self.free.give(Give::new().add(&self.free, id));
                if release {
                    self.counter.release_held(1);
                }
                return (1, Ok(()));
            }
        }
        // The usual case, a sequence's own blocks that it holds alone, in
        // runs: fresh ones with no access to their state words.
        let (give, rest) = self.free.gather_held(
            ids,
            |id| self.refs.is_bare(id),
            |lo, hi| self.refs.drop_sole_run(lo, hi),
        );
        if rest > 0 {
            let rest = &ids[..rest];
            return self.drop_each(give, rest.iter().rev().copied(), rest, release, |id| {
                match self.refs.drop_held(id) {
                    // No counted reference: the block is fresh (the caller
                    // holds it), or (misuse) the caller lost it.
                    Err(()) if self.free.is_fresh(id) => Ok(Dropped::Fresh),
                    dropped => dropped,
                }
            });
        }
        self.free.give(give);
        // Released after the give-back, as in `drop_each`.
        if release && give.len() > 0 {
            self.counter.release_held(give.len());
        }
        (give.len(), Ok(()))
    }

    /// The body of both drops: `drop` takes one reference and says what
    /// became of the block (`Err` if no reference was left). `order` lists
    /// the ids of `ids` in the order of the drops; `give` holds free blocks
    /// that the caller has dropped already (returned with these).
    /// `release` says whether the blocks that go back give their admission
    /// back (see [`lend_held`](Self::lend_held)). Returns how many went
    /// back, free or evictable (those in `give` included).
    fn drop_each(
        &self,
        mut give: Give,
        order: impl ExactSizeIterator<Item = BlockId>,
        ids: &[BlockId],
        release: bool,
        drop: impl Fn(BlockId) -> Result<Dropped, ()>,
    ) -> (usize, Result<(), FreeError>) {
        // A drop can fail here only if the caller does not hold what it
        // lists and another holder freed it meanwhile (a racing double
        // free). The other drops still go ahead: undoing them could add a
        // reference to a block that was freed and reallocated to a new
        // owner since (an ABA on the count).
        let mut raced = None;
        // The last-reference hook: a cached block whose last reference went
        // stays cached and becomes evictable, for the prefix cache to stamp
        // (only a pool with a prefix cache has cached blocks).
        let mut evictions = Evictions::new(order.len());
        for (i, id) in order.enumerate() {
            match drop(id) {
                Ok(Dropped::Free) => give = give.add(&self.free, id),
                Ok(Dropped::Fresh) => {
                    self.free.clear_given_fresh_one(id);
                    give = give.add(&self.free, id);
                }
                Ok(Dropped::Evictable) => evictions.push(self.cache(), id, i),
                Ok(Dropped::Kept) => {}
                Err(()) => {
                    // (A refusal with nothing changed only under loom's
                    // `blind_undo` control, which only `free` reaches, in
                    // list order.)
                    if self.refs.blind_undo(&ids[..i]) {
                        return (0, Err(FreeError::NotAllocated { id }));
                    }
                    raced.get_or_insert(id);
                }
            }
        }
        let evictable = evictions.count();
        if evictable > 0 {
            evictions.finish(self.cache());
        }
        self.free.give(give);
        // Released after the give-back, so that whoever admits these
        // blocks finds them (in the free list, or evictable).
        let back = give.len() + evictable;
        if release && back > 0 {
            self.counter.release_held(back);
        }
        let done = match raced {
            None => Ok(()),
            Some(id) => Err(FreeError::Raced { id }),
        };
        (back, done)
    }

    /// Closes the pool: every later allocation fails with
    /// [`ReserveError::Closed`], while frees keep working so that workers
    /// can drain.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{BlockPool, ReserveError};
    ///
    /// let pool = BlockPool::new(4, 16);
    /// pool.close();
    /// assert!(pool.is_closed());
    /// assert_eq!(pool.try_alloc(1, &mut Vec::new()), Err(ReserveError::Closed));
    /// ```
    pub fn close(&self) {
        self.counter.close();
    }

    /// Whether [`close`](Self::close) has been called.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(!kvslots::BlockPool::new(4, 16).is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        self.counter.is_closed()
    }
}

/// The pool under its [`Sequence`](crate::Sequence)s. Each method is the
/// pool's own operation: the lock-free admission, the reference counts'
/// updates, and the layers' (prefix cache, fenced release). A method given
/// an id at or past `num_blocks()` panics before it changes anything.
/// Every call but the read-only ones takes a [`SequenceCall`]: only this
/// crate's sequences make them, on blocks they hold. The blocks these
/// allocations take carry the sequence flag: a raw [`BlockPool::free`]
/// and [`BlockPool::add_refs`] refuse them
/// (`FreeError::HeldBySequence`), and
/// [`release`](BlockAllocator::release) gives them back.
impl BlockAllocator for BlockPool {
    fn num_blocks(&self) -> usize {
        BlockPool::num_blocks(self)
    }

    fn block_size(&self) -> usize {
        BlockPool::block_size(self)
    }

    fn is_closed(&self) -> bool {
        BlockPool::is_closed(self)
    }

    fn try_alloc_with_headroom(
        &self,
        _: &SequenceCall<'_>,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        self.try_alloc_sequence(n, headroom, out)
    }

    fn try_alloc_growth(
        &self,
        _: &SequenceCall<'_>,
        n: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        BlockPool::try_alloc_growth(self, n, out)
    }

    fn alloc_with_headroom_blocking(
        &self,
        _: &SequenceCall<'_>,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError> {
        BlockPool::alloc_with_headroom_blocking(self, n, headroom, out, timeout, Holder::Sequence)
    }

    fn add_refs(&self, _: &SequenceCall<'_>, ids: &[BlockId]) -> usize {
        self.check_ids(ids);
        let mut added = 0;
        let mut counted = false;
        while let Some(&id) = ids.get(added) {
            if self.refs.add(id).is_ok() {
                added += 1;
            } else if !counted && self.refs.is_bare(id) {
                // A fresh block (the caller holds it): count the
                // references of it and of the rest first, then go on.
                self.count_fresh(&ids[added..]);
                counted = true;
            } else {
                break;
            }
        }
        added
    }

    fn release(&self, _: &SequenceCall<'_>, ids: &[BlockId]) {
        // First the usual give-back of a prompt's blocks, as its take left
        // them: one run of consecutive fresh ids (which that look finds in
        // range), a word of the bitmaps at a time.
        if self.free.give_fresh_run(ids) {
            // Released after the give-back, as in `drop_each`.
            self.counter.release_held(ids.len());
            return;
        }
        self.check_ids(ids);
        // `Err(Raced)` only if a raw `free` of one of these blocks (a double
        // free, which is misuse, of a block that is not a sequence's)
        // dropped the caller's reference first: that block went back once,
        // by the free, and every other reference is dropped all the same.
        let _ = self.drop_held_refs(ids);
    }

    fn needs_copy(&self, id: BlockId) -> bool {
        self.check_ids(&[id]);
        self.refs.needs_copy(id)
    }

    fn as_block_pool(&self, _: crate::allocator::Seal) -> Option<&BlockPool> {
        Some(self)
    }

    fn match_prefix(
        &self,
        _: &SequenceCall<'_>,
        keys: &[BlockHash],
        out: &mut Vec<BlockId>,
    ) -> usize {
        BlockPool::match_prefix(self, keys, out)
    }

    fn match_prefix_lending(
        &self,
        _: &SequenceCall<'_>,
        keys: &[BlockHash],
        out: &mut Vec<BlockId>,
        lendable: usize,
        lent: &mut usize,
    ) -> usize {
        self.check_ids(&out[out.len() - lendable.min(out.len())..]);
        BlockPool::match_prefix_lending(self, keys, out, lendable, lent)
    }

    fn publish(&self, by: &SequenceCall<'_>, blocks: &[BlockId], keys: &[BlockHash]) -> usize {
        BlockAllocator::publish_after(self, by, None, blocks, keys)
    }

    fn publish_after(
        &self,
        by: &SequenceCall<'_>,
        parent: Option<&BlockHash>,
        blocks: &[BlockId],
        keys: &[BlockHash],
    ) -> usize {
        let group = by.group().map_or(GroupTag::NONE, GroupTag::of);
        let (cached, keyed) =
            self.publish_chain(group, parent, blocks, keys, by.is_straight_to(self));
        by.note_keyed(blocks, keyed);
        cached
    }

    fn uncache_if_sole(&self, _: &SequenceCall<'_>, id: BlockId) {
        self.check_ids(&[id]);
        self.uncache_sole(id);
    }

    fn retire(&self, _: &SequenceCall<'_>, fence: u64, ids: &[BlockId]) -> usize {
        self.check_ids(ids);
        self.retire_slice(fence, ids)
    }

    fn retire_owned(&self, _: &SequenceCall<'_>, fence: u64, ids: Vec<BlockId>) -> usize {
        self.check_ids(&ids);
        BlockPool::retire_owned(self, fence, ids)
    }
}

impl BlockPool {
    /// The body of the sequence calls' publishes: the chain of `blocks`
    /// under `keys` (`parent` before the first), reported as `group`'s.
    /// Returns how many blocks it cached, and how many of the first
    /// blocks hold keys after it (cached by it or before it). `straight`
    /// says that the sequence called this pool itself (see
    /// [`SequenceCall::is_straight_to`]): then a block it holds alone may
    /// take the sole holder's claim.
    fn publish_chain(
        &self,
        group: GroupTag,
        parent: Option<&BlockHash>,
        blocks: &[BlockId],
        keys: &[BlockHash],
        straight: bool,
    ) -> (usize, usize) {
        self.check_ids(blocks);
        let blocks = &blocks[..blocks.len().min(keys.len())];
        // A claim needs a counted reference: the first fresh block a claim
        // finds has its reference counted with those of the blocks after
        // it, before any of them is claimed (once a block is cached, a
        // matcher can hold it too, and a fresh bit still set would make
        // that matcher give it back as fresh).
        let mut counted = false;
        let (mut cached, mut keyed) = (0, None);
        for (i, (&id, key)) in blocks.iter().zip(keys).enumerate() {
            let parent = match i.checked_sub(1) {
                Some(p) => Some(&keys[p]),
                None => parent,
            };
            let published = self.publish_block(id, key, parent, group, straight, &mut || {
                !std::mem::replace(&mut counted, true) && {
                    self.count_fresh(&blocks[i..]);
                    true
                }
            });
            match published {
                Published::Now => cached += 1,
                Published::Already => {}
                Published::Not => {
                    keyed.get_or_insert(i);
                }
            }
        }
        (cached, keyed.unwrap_or(blocks.len()))
    }

    /// Whether block `id` is fresh now (for the loom models).
    #[cfg(all(test, kvslots_loom))]
    pub(crate) fn is_fresh(&self, id: BlockId) -> bool {
        self.free.is_fresh(id)
    }

    /// Counts the uncounted references of the fresh blocks among `ids`
    /// (which a sequence holds) in their state words, then clears their
    /// fresh bits, before the caller shares or claims them (see `refs.rs`,
    /// "Fresh blocks"). A load a block; only a bare word's block is looked
    /// up in the fresh bitmap, and counted if its bit is set (a bare word
    /// without it is not a reference the caller holds: it is left alone,
    /// and the caller's add or claim then fails on it).
    fn count_fresh(&self, ids: &[BlockId]) {
        self.free.count_fresh(
            ids,
            |id| self.refs.is_bare(id),
            |id| self.refs.count_fresh(id),
        );
    }

    /// Panics, naming it, if an id is at or past `num_blocks()`: an
    /// allocator call given an id it never handed out (see
    /// [`BlockAllocator`]'s contract), refused before anything changes. A
    /// comparison per id, no atomic: nothing a `Sequence` notices.
    fn check_ids(&self, ids: &[BlockId]) {
        let n = self.num_blocks();
        // `num_blocks() <= MAX_BLOCKS`, which is `u32::MAX`.
        let n32 = n as u32;
        // Whether any id is out of range, without a branch an id (a loop
        // the compiler vectorises, over 32-bit lanes); the offender is
        // looked for only if there is one.
        let out = ids
            .iter()
            .fold(false, |out, id| out | (id.index() as u32 >= n32));
        if out {
            if let Some(id) = ids.iter().find(|id| id.index() >= n) {
                panic!("{id} is out of range for a pool of {n} blocks");
            }
        }
    }
}

impl fmt::Debug for BlockPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockPool")
            .field("num_blocks", &self.num_blocks())
            .field("block_size", &self.block_size)
            .field("shards", &self.shards())
            .field("prefix_cache", &self.has_prefix_cache())
            .field("kv_events", &self.has_kv_events())
            .field("used_blocks", &self.used_blocks())
            .field("peak_used_blocks", &self.peak_used_blocks())
            .field("closed", &self.is_closed())
            .finish()
    }
}
