//! [`BlockPoolBuilder`]: a pool's size, shards and layers, checked before
//! anything is allocated.

use super::admission::Admission;
use super::fence::Fences;
use super::free_list::FreeList;
use super::prefix::PrefixCache;
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
/// | core pool, waiting, fenced release | always | 12 bytes | on |
/// | prefix cache | [`prefix_cache`](Self::prefix_cache) | 52 bytes | off |
///
/// ([`BlockPool::new`] and [`BlockPool::with_shards`] build a pool with
/// every layer; the figures are measured by `tests/footprint.rs`.) Fenced
/// release keeps nothing per block, only a few lock-guarded maps per pool
/// (about 1 KiB), and adds nothing to the allocation paths, so every pool
/// has it.
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
#[derive(Debug, Clone)]
#[must_use = "a builder builds nothing until `build` is called"]
pub struct BlockPoolBuilder {
    num_blocks: usize,
    block_size: usize,
    /// `None`: [`BlockPool::default_shards`].
    shards: Option<usize>,
    prefix_cache: bool,
    /// The faults of loom's negative controls (none outside them).
    faults: Faults,
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
    /// takes 52 bytes a block (a key of 32 bytes, 1.75 index slots of 8, an
    /// eviction stamp and a share of the eviction ring) and a few cache
    /// lines per pool.
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

    /// The faults of one of loom's negative controls.
    pub(crate) fn faults(mut self, faults: Faults) -> BlockPoolBuilder {
        self.faults = faults;
        self
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
    /// overflows `usize`), [`ConfigError::BadShardCount`].
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
            shards,
            prefix_cache,
            faults,
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
        let shards = shards.unwrap_or_else(|| BlockPool::default_shards(num_blocks));
        if !(1..=BlockPool::MAX_SHARDS).contains(&shards) {
            return Err(ConfigError::BadShardCount {
                shards,
                max: BlockPool::MAX_SHARDS,
            });
        }
        // The statistics' cells: one per shard, at least one per default
        // shard, so that up to that many threads each write their own.
        let cells = shards.max(BlockPool::DEFAULT_SHARDS);
        Ok(BlockPool {
            counter: Admission::new(num_blocks, shards, faults),
            // `num_blocks <= MAX_BLOCKS = u32::MAX`: exact.
            free: FreeList::new(num_blocks as u32, shards, faults),
            refs: Refs::new(num_blocks, faults),
            prefix: prefix_cache.then(|| Box::new(PrefixCache::new(num_blocks, cells, faults))),
            fences: Fences::new(faults),
            block_size,
        })
    }
}
