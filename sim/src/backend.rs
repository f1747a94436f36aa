//! The allocator interface the engine drives: a pool ([`KvBackend`]) and
//! its sequences' block tables ([`KvSeq`]).
//!
//! Both allocators are pools under the library's own
//! [`kvslots::Sequence`]: the lock-free `kvslots::BlockPool` and the mutex
//! baseline ([`MutexPool`]), each a
//! [`kvslots::BlockAllocator`] and a [`Pool`] (the counts the engine and
//! the oracle read). [`Backend<P>`] is the one backend over either, and
//! `kvslots::Sequence<P>` the one [`KvSeq`]. The engine is generic over
//! [`KvBackend`] (static dispatch), so both allocators run exactly the same
//! scheduler code and the same block tables, and the comparison measures
//! the allocators, not the plumbing. Every call into the library's
//! copy-on-write API is in [`KvSeq::try_append`]'s impl.

use std::fmt;
use std::hash::Hash;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use kvslots::{BlockAllocator, BlockHash, BlockId, BlockPool, ReserveError, Sequence};

use crate::baseline::MutexPool;

/// A device copy the caller must make: the first `tokens` slots of block
/// `src` into block `dst` (a fork's private tail, or a copy-on-write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy<Id> {
    /// The block to copy from.
    pub src: Id,
    /// The block to copy into.
    pub dst: Id,
    /// How many leading token slots to copy.
    pub tokens: usize,
}

impl From<kvslots::BlockCopy> for BlockCopy<BlockId> {
    fn from(c: kvslots::BlockCopy) -> Self {
        BlockCopy {
            src: c.src,
            dst: c.dst,
            tokens: c.tokens,
        }
    }
}

/// What an append returns: the new positions, and the device copy it needs
/// first, if it copied a shared partly filled block on write.
pub type Appended<Id> = (Range<usize>, Option<BlockCopy<Id>>);

/// What a fork returns: the child, and the copy of the parent's partly
/// filled last block into the child's own, if there is one.
pub type Forked<S, Id> = (S, Option<BlockCopy<Id>>);

/// One sequence's block table, as the engine uses it. The calls that take
/// `&mut self` or fork are allocator calls; the others only read the table.
pub trait KvSeq: Send + Sized + 'static {
    /// A block id.
    type Id: Copy + Send + Sync + Eq + Hash + fmt::Debug + 'static;

    /// The block's index in the pool (`0..num_blocks`): its slots are
    /// `index * block_size..(index + 1) * block_size`.
    fn index(id: Self::Id) -> usize;
    /// Tokens in the sequence.
    fn len(&self) -> usize;
    /// Whether the sequence holds no token.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The block table: the filled blocks, then the reserved ones.
    fn table(&self) -> &[Self::Id];
    /// Tokens the blocks in the table can hold.
    fn capacity(&self) -> usize;
    /// Reserves blocks for `tokens` more tokens ahead of the length, all or
    /// none, only if `headroom` blocks stay free afterwards (the appends of
    /// those tokens then take nothing). On error nothing changes.
    fn try_reserve(&mut self, tokens: usize, headroom: usize) -> Result<(), ReserveError>;
    /// [`try_reserve`](Self::try_reserve), waiting in the allocator for at
    /// most `timeout` (`None`: no limit) until the blocks are granted; a
    /// timeout is a retryable refusal (`Full`, or kvslots' `BehindWaiters`
    /// when what is free is owed to other waiters), and on error nothing
    /// changes.
    fn reserve_blocking(
        &mut self,
        tokens: usize,
        headroom: usize,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError>;
    /// The multi-token append: all the blocks `n` more tokens need, or
    /// none; with the device copy it needs first, if it copied a shared
    /// partly filled block on write.
    fn try_append(&mut self, n: usize) -> Result<Appended<Self::Id>, ReserveError>;
    /// Rolls back to `len` tokens; returns how many blocks left the table.
    fn truncate(&mut self, len: usize) -> usize;
    /// [`truncate`](Self::truncate) with the references that go back (and
    /// a copy-on-write's source still kept) kept until `fence` completes
    /// ([`KvBackend::complete`]).
    fn truncate_fenced(&mut self, len: usize, fence: u64) -> usize;
    /// Gives the sequence up with its references kept until `fence`
    /// completes; returns how many references.
    fn retire(self, fence: u64) -> usize;
    /// Hands the source of the last copy-on-write, still kept, to `fence`;
    /// returns 1 if there was one.
    fn retire_copy_source(&mut self, fence: u64) -> usize;
    /// A child sharing the full blocks, and the copy of a partly filled
    /// last block into the child's private one, if there is one.
    fn try_fork(&self) -> Result<Forked<Self, Self::Id>, ReserveError>;
    /// Appends the slot mapping of `positions` to `out`; an error (a range
    /// past the length) leaves `out` unchanged.
    fn extend_slots(&self, positions: Range<usize>, out: &mut Vec<usize>) -> Result<(), String>;
    /// On an empty sequence: takes the longest prefix of `hashes` whose
    /// blocks are cached (one reference each), puts them in the table, sets
    /// the length to `k * block_size` and returns `k`. On a non-empty one:
    /// 0, nothing changes.
    fn try_match_prefix(&mut self, hashes: &[BlockHash]) -> usize;
    /// Makes `hashes[i]` the key of full block `i` for every full block
    /// not cached yet (a key another block holds stays with it: first
    /// wins); returns how many became cached.
    fn publish(&mut self, hashes: &[BlockHash]) -> usize;
}

/// The prefix cache's counts since the pool was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCounts {
    /// Keys looked up by matches.
    pub queried_blocks: u64,
    /// Of those, blocks matched.
    pub hit_blocks: u64,
    /// Cached blocks whose key was dropped to reuse the block.
    pub evictions: u64,
}

/// A block pool plus its sequences, as the engine uses them. Every method
/// that touches the pool is one "allocator call".
pub trait KvBackend: Clone + Send + Sync + 'static {
    /// A sequence's block table; dropping it gives its blocks back.
    type Seq: KvSeq<Id = Self::Id>;
    /// A block id (of a raw allocation, or in a sequence's table).
    type Id: Copy + Send + Sync + Eq + Hash + fmt::Debug + 'static;

    /// The name shown in reports (`kvslots` or `mutex`).
    fn name(&self) -> &'static str;
    /// Total blocks.
    fn num_blocks(&self) -> usize;
    /// Tokens per block.
    fn block_size(&self) -> usize;
    /// A snapshot of the blocks in use.
    fn used_blocks(&self) -> usize;
    /// The high-water mark of blocks in use.
    fn peak_used_blocks(&self) -> usize;
    /// The references the pool counts on the block at `index`; `None` past
    /// the pool.
    fn ref_count(&self, index: usize) -> Option<usize>;
    /// Takes `n` blocks, all or nothing, only if `headroom` more stay free
    /// (with `n == 0`, the check-only admission's atomic headroom check).
    fn try_alloc_with_headroom(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<Self::Id>,
    ) -> Result<(), ReserveError>;
    /// Gives back blocks taken with
    /// [`try_alloc_with_headroom`](Self::try_alloc_with_headroom); an error
    /// is a bug in the caller, reported as a string.
    fn free(&self, ids: &[Self::Id]) -> Result<(), String>;
    /// An empty sequence with room for `tokens` tokens in its table.
    fn new_seq(&self, tokens: usize) -> Self::Seq;
    /// Gives back every reference retired under `fence` so far; returns
    /// how many.
    fn complete(&self, fence: u64) -> usize;
    /// The high-water mark of references retired and not yet given back.
    fn peak_pending_release_blocks(&self) -> usize;
    /// Blocks holding a key, referenced or not.
    fn cached_blocks(&self) -> usize;
    /// Blocks holding a key that no sequence holds (they count as free).
    fn evictable_blocks(&self) -> usize;
    /// The prefix cache's counts.
    fn prefix_stats(&self) -> PrefixCounts;
}

/// What the engine and the oracle read of a pool besides what its
/// sequences call ([`BlockAllocator`]): its name, counts and statistics,
/// the raw allocation and free of a check-only admission, and the fences'
/// completion.
pub trait Pool: BlockAllocator + Send + Sync + 'static {
    /// The name shown in reports.
    const NAME: &'static str;
    /// Takes `n` blocks for a raw caller, all or nothing, only if
    /// `headroom` more stay free: blocks that [`free`](Self::free) gives
    /// back. (A `BlockPool` refuses a raw free of blocks taken through
    /// [`BlockAllocator`], which are a sequence's.)
    fn try_alloc_raw(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError>;
    /// A snapshot of the blocks in use.
    fn used_blocks(&self) -> usize;
    /// The high-water mark of blocks in use.
    fn peak_used_blocks(&self) -> usize;
    /// The references the pool counts on block `id`; `None` past the pool.
    fn ref_count(&self, id: BlockId) -> Option<usize>;
    /// Drops one reference per listed id, all or nothing; an error is
    /// reported as a string.
    fn free(&self, ids: &[BlockId]) -> Result<(), String>;
    /// Gives back every reference retired under `fence` so far; returns
    /// how many.
    fn complete(&self, fence: u64) -> usize;
    /// The high-water mark of references retired and not yet given back.
    fn peak_pending_release_blocks(&self) -> usize;
    /// Blocks holding a key, referenced or not.
    fn cached_blocks(&self) -> usize;
    /// Blocks holding a key that no sequence holds.
    fn evictable_blocks(&self) -> usize;
    /// The prefix cache's counts.
    fn prefix_stats(&self) -> PrefixCounts;
}

impl Pool for BlockPool {
    const NAME: &'static str = "kvslots";

    fn try_alloc_raw(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        BlockPool::try_alloc_with_headroom(self, n, headroom, out)
    }
    fn used_blocks(&self) -> usize {
        BlockPool::used_blocks(self)
    }
    fn peak_used_blocks(&self) -> usize {
        BlockPool::peak_used_blocks(self)
    }
    fn ref_count(&self, id: BlockId) -> Option<usize> {
        BlockPool::ref_count(self, id)
    }
    fn free(&self, ids: &[BlockId]) -> Result<(), String> {
        BlockPool::free(self, ids).map_err(|e| e.to_string())
    }
    fn complete(&self, fence: u64) -> usize {
        BlockPool::complete(self, fence)
    }
    fn peak_pending_release_blocks(&self) -> usize {
        BlockPool::peak_pending_release_blocks(self)
    }
    fn cached_blocks(&self) -> usize {
        BlockPool::cached_blocks(self)
    }
    fn evictable_blocks(&self) -> usize {
        BlockPool::evictable_blocks(self)
    }
    fn prefix_stats(&self) -> PrefixCounts {
        let s = BlockPool::prefix_stats(self);
        PrefixCounts {
            queried_blocks: s.queried_blocks,
            hit_blocks: s.hit_blocks,
            evictions: s.evictions,
        }
    }
}

/// A shared pool and the library's sequences over it: the engine's
/// backend for either allocator.
#[derive(Debug)]
pub struct Backend<P> {
    pool: Arc<P>,
}

impl<P> Clone for Backend<P> {
    fn clone(&self) -> Self {
        Backend {
            pool: Arc::clone(&self.pool),
        }
    }
}

impl<P> Backend<P> {
    /// A backend over `pool`.
    pub fn from_pool(pool: P) -> Self {
        Backend {
            pool: Arc::new(pool),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<P> {
        &self.pool
    }
}

/// The real allocator: one `Arc<kvslots::BlockPool>` and `kvslots::Sequence`.
pub type KvslotsBackend = Backend<BlockPool>;

/// The lock-based baseline: a [`MutexPool`] under `kvslots::Sequence`.
pub type MutexBackend = Backend<MutexPool>;

impl Backend<BlockPool> {
    /// A pool of `num_blocks` blocks of `block_size` tokens.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Backend {
            pool: Arc::new(BlockPool::new(num_blocks, block_size)),
        }
    }

    /// A pool of `num_blocks` blocks of `block_size` tokens whose free list
    /// is cut into `shards` shards.
    pub fn with_shards(num_blocks: usize, block_size: usize, shards: usize) -> Self {
        Backend {
            pool: Arc::new(BlockPool::with_shards(num_blocks, block_size, shards)),
        }
    }
}

impl Backend<MutexPool> {
    /// A pool of `num_blocks` blocks of `block_size` tokens.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Backend {
            pool: Arc::new(MutexPool::new(num_blocks, block_size)),
        }
    }

    /// [`new`](Self::new), with the allocator's refusal of the pool's
    /// arrays as an error ([`MutexPool::try_new`]).
    pub fn try_new(
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, std::collections::TryReserveError> {
        MutexPool::try_new(num_blocks, block_size).map(Backend::from_pool)
    }
}

impl<P: Pool> KvSeq for Sequence<P> {
    type Id = BlockId;

    fn index(id: BlockId) -> usize {
        id.index()
    }
    fn len(&self) -> usize {
        Sequence::len(self)
    }
    fn table(&self) -> &[BlockId] {
        self.blocks()
    }
    fn capacity(&self) -> usize {
        Sequence::capacity(self)
    }
    fn try_reserve(&mut self, tokens: usize, headroom: usize) -> Result<(), ReserveError> {
        Sequence::try_reserve(self, tokens, headroom)
    }
    fn reserve_blocking(
        &mut self,
        tokens: usize,
        headroom: usize,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError> {
        Sequence::reserve_blocking(self, tokens, headroom, timeout)
    }
    fn try_append(&mut self, n: usize) -> Result<Appended<BlockId>, ReserveError> {
        // The one call into the library's copy-on-write API.
        self.try_append_cow(n)
            .map(|(range, copy)| (range, copy.map(BlockCopy::from)))
    }
    fn truncate(&mut self, len: usize) -> usize {
        Sequence::truncate(self, len)
    }
    fn truncate_fenced(&mut self, len: usize, fence: u64) -> usize {
        Sequence::truncate_fenced(self, len, fence)
    }
    fn retire(self, fence: u64) -> usize {
        Sequence::retire(self, fence)
    }
    fn retire_copy_source(&mut self, fence: u64) -> usize {
        Sequence::retire_copy_source(self, fence)
    }
    fn try_fork(&self) -> Result<Forked<Self, BlockId>, ReserveError> {
        Sequence::try_fork(self).map(|(child, copy)| (child, copy.map(BlockCopy::from)))
    }
    fn extend_slots(&self, positions: Range<usize>, out: &mut Vec<usize>) -> Result<(), String> {
        Sequence::extend_slots(self, positions, out).map_err(|e| e.to_string())
    }
    fn try_match_prefix(&mut self, hashes: &[BlockHash]) -> usize {
        Sequence::try_match_prefix(self, hashes)
    }
    fn publish(&mut self, hashes: &[BlockHash]) -> usize {
        Sequence::publish(self, hashes)
    }
}

impl<P: Pool> KvBackend for Backend<P> {
    type Seq = Sequence<P>;
    type Id = BlockId;

    fn name(&self) -> &'static str {
        P::NAME
    }
    fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }
    fn block_size(&self) -> usize {
        self.pool.block_size()
    }
    fn used_blocks(&self) -> usize {
        self.pool.used_blocks()
    }
    fn peak_used_blocks(&self) -> usize {
        self.pool.peak_used_blocks()
    }
    fn ref_count(&self, index: usize) -> Option<usize> {
        self.pool
            .ref_count(BlockId::new(u32::try_from(index).ok()?))
    }
    fn try_alloc_with_headroom(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        self.pool.try_alloc_raw(n, headroom, out)
    }
    fn free(&self, ids: &[BlockId]) -> Result<(), String> {
        self.pool.free(ids)
    }
    fn new_seq(&self, tokens: usize) -> Sequence<P> {
        Sequence::with_capacity(Arc::clone(&self.pool), tokens)
    }
    fn complete(&self, fence: u64) -> usize {
        self.pool.complete(fence)
    }
    fn peak_pending_release_blocks(&self) -> usize {
        self.pool.peak_pending_release_blocks()
    }
    fn cached_blocks(&self) -> usize {
        self.pool.cached_blocks()
    }
    fn evictable_blocks(&self) -> usize {
        self.pool.evictable_blocks()
    }
    fn prefix_stats(&self) -> PrefixCounts {
        self.pool.prefix_stats()
    }
}
