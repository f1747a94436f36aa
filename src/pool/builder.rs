//! [`BlockPoolBuilder`]: a pool's size, shards and layers, checked before
//! anything is allocated, and its arrays allocated fallibly.

use std::fmt;

use super::admission::Admission;
use super::fence::Fences;
use super::free_list::FreeList;
use super::prefix::{EventsShape, PrefixCache};
use super::refs::Refs;
use super::BlockPool;
use crate::error::ConfigError;
use crate::sync::Faults;

/// The options of a [`BlockPool`] before it is built: from
/// [`BlockPool::builder`], set with its methods, checked and allocated by
/// [`build`](Self::build).
///
/// A builder starts from the core pool (admission, the free list, a state
/// word and a reference count per block, waiting, fenced release) and adds
/// the layers it is asked for; a layer not chosen takes no memory:
///
/// | layer | option | per block | default |
/// |---|---|---|---|
/// | core pool, waiting, fenced release | always | 8 bytes and two bits | on |
/// | prefix cache | [`prefix_cache`](Self::prefix_cache) | 70 bytes | off |
/// | KV events (with the prefix cache) | [`kv_events`](Self::kv_events) | 2 bytes, and 128 bytes a record of its rings | off |
///
/// ([`BlockPool::new`] and [`BlockPool::with_shards`] build a pool with
/// every layer; [`memory_bytes`](Self::memory_bytes) says what a pool
/// will take, and `tests/footprint.rs` measures it.) Fenced release keeps
/// nothing per block, only a few lock-guarded maps per pool (about 1 KiB),
/// and adds nothing to the allocation paths, so every pool has it.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use kvslots::{hash_blocks, BlockPool, ConfigError, Sequence};
///
/// let pool = Arc::new(BlockPool::builder(1024, 16).shards(4).prefix_cache(true).build()?);
/// assert_eq!((pool.num_blocks(), pool.shards(), pool.has_prefix_cache()), (1024, 4, true));
///
/// let mut keys = Vec::new();
/// hash_blocks(b"", &[7; 32], 16, &mut keys);
/// let mut seq = Sequence::new(Arc::clone(&pool));
/// seq.try_append(32)?;
/// assert_eq!(seq.publish(&keys), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
#[must_use = "a builder builds nothing until `build` is called"]
pub struct BlockPoolBuilder {
    num_blocks: usize,
    block_size: usize,
    /// `None`: [`BlockPool::default_shards`].
    shards: Option<usize>,
    prefix_cache: bool,
    /// The KV event rings' records in all, if chosen.
    kv_events: Option<usize>,
    /// The faults of loom's negative controls (none outside them).
    faults: Faults,
}

impl fmt::Debug for BlockPoolBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockPoolBuilder")
            .field("num_blocks", &self.num_blocks)
            .field("block_size", &self.block_size)
            .field("shards", &self.shard_count())
            .field("prefix_cache", &self.prefix_cache)
            .field("kv_events", &self.kv_events)
            .finish()
    }
}

impl BlockPool {
    /// A builder of a pool of `num_blocks` blocks of `block_size` token
    /// slots, with [`default_shards`](Self::default_shards) shards and no
    /// prefix cache: set its options, then
    /// [`build`](BlockPoolBuilder::build) it, which returns a
    /// [`ConfigError`] where [`new`](Self::new) and
    /// [`with_shards`](Self::with_shards) panic.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{BlockPool, ConfigError};
    ///
    /// let pool = BlockPool::builder(1024, 16).shards(4).build()?;
    /// assert_eq!((pool.num_blocks(), pool.block_size(), pool.shards()), (1024, 16, 4));
    /// assert!(!pool.has_prefix_cache());
    ///
    /// let too_many = BlockPool::builder(BlockPool::MAX_BLOCKS + 1, 16).build();
    /// assert!(matches!(too_many, Err(ConfigError::TooManyBlocks { .. })));
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn builder(num_blocks: usize, block_size: usize) -> BlockPoolBuilder {
        BlockPoolBuilder {
            num_blocks,
            block_size,
            shards: None,
            prefix_cache: false,
            kv_events: None,
            faults: Faults::default(),
        }
    }
}

impl BlockPoolBuilder {
    /// Cuts the free list into `shards` shards instead of
    /// [`BlockPool::default_shards`]`(num_blocks)` (see
    /// [`BlockPool::with_shards`] for what a shard is). Checked by
    /// [`build`](Self::build): it must be in `1..=`[`BlockPool::MAX_SHARDS`].
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = kvslots::BlockPool::builder(64, 16).shards(1).build().unwrap();
    /// assert_eq!(pool.shards(), 1);
    /// ```
    pub fn shards(mut self, shards: usize) -> BlockPoolBuilder {
        self.shards = Some(shards);
        self
    }

    /// Builds the pool with a prefix cache (`true`) or without one
    /// (`false`, the builder's default).
    ///
    /// With it, [`Sequence::publish`](crate::Sequence::publish) caches a
    /// sequence's full blocks under their keys and
    /// [`Sequence::try_match_prefix`](crate::Sequence::try_match_prefix)
    /// takes them back (see [Prefix cache](BlockPool#prefix-cache)); it
    /// takes 70 bytes a block (a key of 32 bytes, 2.5 index slots of 8, an
    /// eviction stamp, 1.25 slots of 8 of the eviction ring and a bit of its
    /// refill's map) and a few cache lines per pool.
    ///
    /// Without it, the prefix cache's calls are documented no-ops that
    /// cache nothing: `publish` returns 0, `try_match_prefix` returns 0 (a
    /// miss; the sequence stays empty), [`BlockPool::cached_blocks`],
    /// [`BlockPool::evictable_blocks`] and
    /// [`BlockPool::reset_prefix_cache`] return 0 and
    /// [`BlockPool::prefix_stats`] is all zeros.
    /// [`BlockPool::has_prefix_cache`] says which a pool has.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{hash_blocks, BlockPool, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::builder(64, 16).build().unwrap());
    /// let mut keys = Vec::new();
    /// hash_blocks(b"", &[7; 32], 16, &mut keys);
    /// let mut seq = Sequence::new(Arc::clone(&pool));
    /// seq.try_append(32).unwrap();
    /// assert_eq!(seq.publish(&keys), 0); // no prefix cache: nothing cached
    /// assert_eq!(Sequence::new(pool).try_match_prefix(&keys), 0);
    /// ```
    pub fn prefix_cache(mut self, enabled: bool) -> BlockPoolBuilder {
        self.prefix_cache = enabled;
        self
    }

    /// Records the prefix cache's changes as KV events for a KV-aware
    /// router, in rings of `capacity` records in all, which
    /// [`BlockPool::drain_events`] empties (see [`KvEvent`](crate::KvEvent)).
    /// Off by default: a pool without it has no rings and its publish,
    /// eviction and reset paths do exactly what they do without events.
    ///
    /// The records are shared among [`shards`](Self::shards) rings (a
    /// key's records all go to one ring, picked by a hash of the key),
    /// `capacity / shards` each, rounded up and at least 2; a record is
    /// 128 bytes (one cache line pair: its key, its parent key, its block
    /// id, kind and group, and a position word), so 4,096 records take
    /// 512 KiB. Each block also keeps 2 bytes: the group of layers its key
    /// was published for, which its removal's record names.
    /// Size it for the events of the longest pause between two drains: a
    /// ring that fills loses the events that find it full, and the
    /// consumer is told how many ([`KvEvent::Dropped`](crate::KvEvent::Dropped)).
    ///
    /// Requires the prefix cache; checked by [`build`](Self::build)
    /// ([`ConfigError::KvEventsWithoutPrefixCache`],
    /// [`ConfigError::ZeroEventCapacity`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{BlockPool, ConfigError};
    ///
    /// let pool = BlockPool::builder(1024, 16).prefix_cache(true).kv_events(4096).build()?;
    /// assert!(pool.has_kv_events());
    /// assert_eq!(
    ///     BlockPool::builder(1024, 16).kv_events(4096).build().unwrap_err(),
    ///     ConfigError::KvEventsWithoutPrefixCache
    /// );
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn kv_events(mut self, capacity: usize) -> BlockPoolBuilder {
        self.kv_events = Some(capacity);
        self
    }

    /// The faults of one of loom's negative controls: the loom models'
    /// build only.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) fn faults(mut self, faults: Faults) -> BlockPoolBuilder {
        self.faults = faults;
        self
    }

    /// The shard count the pool will have.
    fn shard_count(&self) -> usize {
        self.shards
            .unwrap_or_else(|| BlockPool::default_shards(self.num_blocks))
    }

    /// The KV event rings the pool will have, if any (with a prefix
    /// cache).
    fn events_shape(&self) -> Option<EventsShape> {
        match (self.prefix_cache, self.kv_events) {
            (true, Some(capacity)) => Some(EventsShape {
                capacity,
                rings: self.shard_count().max(1),
            }),
            _ => None,
        }
    }

    /// The statistics' cells of the prefix cache: one per shard, at least
    /// one per default shard, so that up to that many threads each write
    /// their own.
    fn cells(&self) -> usize {
        self.shard_count().max(BlockPool::DEFAULT_SHARDS)
    }

    /// The heap memory, in bytes, that [`build`](Self::build) allocates for
    /// the pool's bookkeeping, saturating at `usize::MAX`: per block, 8
    /// bytes and two bits for the core pool (a state word, and a bit of
    /// the free list's bitmap and one of its fresh blocks' map) and 70 more with the prefix cache (a key, index
    /// slots, an eviction stamp, a share of the eviction ring and a bit of
    /// its refill's map); per shard and per pool, a few cache lines; with
    /// KV events, 128 bytes a record of their rings and 2 bytes a block
    /// (the blocks' groups of layers). The
    /// structures that grow with use (the wait queue, the
    /// fences' lists) are not counted. The KV cache itself is the caller's
    /// device memory, and not counted either.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::BlockPool;
    ///
    /// let core = BlockPool::builder(1 << 20, 16).memory_bytes();
    /// let cached = BlockPool::builder(1 << 20, 16).prefix_cache(true).memory_bytes();
    /// assert_eq!(core / (1 << 20), 8);
    /// assert_eq!(cached / (1 << 20), 78);
    /// ```
    pub fn memory_bytes(&self) -> usize {
        let n = self.num_blocks;
        let shards = self.shard_count();
        let prefix = if self.prefix_cache {
            PrefixCache::heap_bytes(n, self.cells(), self.events_shape())
        } else {
            0
        };
        [
            Refs::heap_bytes(n),
            FreeList::heap_bytes(n, shards),
            Admission::heap_bytes(shards),
            Fences::heap_bytes(),
            prefix,
        ]
        .into_iter()
        .fold(0, usize::saturating_add)
    }

    /// Checks the options and builds the pool: `num_blocks` free blocks of
    /// `block_size` token slots, with the layers chosen.
    ///
    /// # Errors
    ///
    /// Checked in this order, before any memory is asked for:
    /// [`ConfigError::ZeroBlockSize`], [`ConfigError::TooManyBlocks`]
    /// (above [`BlockPool::MAX_BLOCKS`]),
    /// [`ConfigError::SlotCountOverflow`] (`num_blocks * block_size`
    /// overflows `usize`), [`ConfigError::BadShardCount`],
    /// [`ConfigError::KvEventsWithoutPrefixCache`],
    /// [`ConfigError::ZeroEventCapacity`]. Then room for
    /// each of the pool's arrays is reserved, fallibly and largest first,
    /// before any is written: [`ConfigError::OutOfMemory`] if the allocator
    /// refuses one, with the room reserved before it freed. (On a system
    /// that overcommits memory the allocator may grant more than it can
    /// back, and the operating system may then stop the process while the
    /// arrays are written; [`memory_bytes`](Self::memory_bytes) says
    /// beforehand what a pool will take.)
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{BlockPool, ConfigError};
    ///
    /// assert_eq!(
    ///     BlockPool::builder(2, usize::MAX).build().unwrap_err(),
    ///     ConfigError::SlotCountOverflow { num_blocks: 2, block_size: usize::MAX }
    /// );
    /// assert_eq!(
    ///     BlockPool::builder(8, 16).shards(0).build().unwrap_err(),
    ///     ConfigError::BadShardCount { shards: 0, max: BlockPool::MAX_SHARDS }
    /// );
    /// let pool = BlockPool::builder(0, 16).build().unwrap(); // refuses every allocation
    /// assert_eq!(pool.num_blocks(), 0);
    /// ```
    pub fn build(self) -> Result<BlockPool, ConfigError> {
        let BlockPoolBuilder {
            num_blocks,
            block_size,
            prefix_cache,
            faults,
            ..
        } = self;
        if block_size == 0 {
            return Err(ConfigError::ZeroBlockSize);
        }
        if num_blocks > BlockPool::MAX_BLOCKS {
            return Err(ConfigError::TooManyBlocks {
                num_blocks,
                max: BlockPool::MAX_BLOCKS,
            });
        }
        if num_blocks.checked_mul(block_size).is_none() {
            return Err(ConfigError::SlotCountOverflow {
                num_blocks,
                block_size,
            });
        }
        let shards = self.shard_count();
        if !(1..=BlockPool::MAX_SHARDS).contains(&shards) {
            return Err(ConfigError::BadShardCount {
                shards,
                max: BlockPool::MAX_SHARDS,
            });
        }
        match (prefix_cache, self.kv_events) {
            (false, Some(_)) => return Err(ConfigError::KvEventsWithoutPrefixCache),
            (true, Some(0)) => return Err(ConfigError::ZeroEventCapacity),
            _ => {}
        }
        let oom = |_| ConfigError::OutOfMemory {
            bytes: self.memory_bytes(),
        };
        // Room for every per-block array, largest first (the prefix
        // cache's), before any is written: a pool too large for memory is
        // refused before it has touched any of it.
        let prefix = if prefix_cache {
            Some(PrefixCache::room(num_blocks, self.events_shape()).map_err(oom)?)
        } else {
            None
        };
        let refs = Refs::room(num_blocks).map_err(oom)?;
        let free = FreeList::room(num_blocks, shards).map_err(oom)?;
        let cells = self.cells();
        Ok(BlockPool {
            counter: Admission::new(num_blocks, shards, faults),
            // `num_blocks <= MAX_BLOCKS = u32::MAX`: exact.
            free: FreeList::new(free, num_blocks as u32, shards, faults),
            refs: Refs::new(refs, faults),
            prefix: prefix.map(|room| Box::new(PrefixCache::new(room, cells, faults))),
            fences: Fences::new(faults),
            block_size,
        })
    }
}
