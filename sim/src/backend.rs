//! The allocator interface the engine drives: a pool ([`KvBackend`]) and
//! its sequences' block tables ([`KvSeq`]).
//!
//! Both allocators are pools under the library's own sequences: the
//! lock-free `kvslots::BlockPool` and the mutex baseline ([`MutexPool`]),
//! each a [`kvslots::BlockAllocator`] and a [`Pool`] (the counts the engine
//! and the oracle read). [`Backend<P, S>`] is the one backend over either,
//! with `kvslots::Sequence<P>` (one table: a plain model) or
//! `kvslots::HybridSequence<P>` (one table per group of layers: a hybrid
//! model) as its [`KvSeq`]. The engine is generic over [`KvBackend`]
//! (static dispatch), so both allocators run exactly the same scheduler
//! code and the same block tables, and the comparison measures the
//! allocators, not the plumbing. Every call into the library's
//! copy-on-write API is in [`KvSeq::try_append`]'s impls.

use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use kvslots::{
    BlockAllocator, BlockHash, BlockId, BlockPool, GroupKeys, HybridSequence, KvGroup, KvGroups,
    ReserveError, Sequence,
};

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

/// The device copies a call asks for, each with its group: `(group,
/// copy)`.
pub type Copies<Id> = Vec<(usize, BlockCopy<Id>)>;

/// One sequence's block tables (one per group of layers: one for a plain
/// model, several for a hybrid one), as the engine uses them. The calls
/// that take `&mut self` or fork are allocator calls; the others only
/// read the tables.
pub trait KvSeq: Send + Sized + 'static {
    /// A block id.
    type Id: Copy + Send + Sync + Eq + Hash + fmt::Debug + 'static;
    /// A prompt's prefix-cache keys, as the sequence's matches and
    /// publishes take them.
    type Keys: Send + 'static;

    /// The block's index in the pool (`0..num_blocks`): its slots are
    /// `index * block_size..(index + 1) * block_size`.
    fn index(id: Self::Id) -> usize;
    /// Whether `id` is a table's null entry: a block a sliding window gave
    /// back (never in a plain sequence's table).
    fn is_null(id: Self::Id) -> bool;
    /// Tokens in the sequence.
    fn len(&self) -> usize;
    /// Whether the sequence holds no token.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Groups of layers, one table each.
    fn groups(&self) -> usize {
        1
    }
    /// Group `group`'s block table: the filled blocks (null entries for
    /// those a sliding window gave back), then the reserved ones.
    fn table(&self, group: usize) -> &[Self::Id];
    /// The first block group `group` still needs at `len` tokens (the
    /// first of the next token's window); 0 for full attention.
    fn first_needed_block(&self, group: usize, len: usize) -> usize {
        let _ = (group, len);
        0
    }
    /// Tokens the blocks in each table can hold.
    fn capacity(&self) -> usize;
    /// Reserves blocks for `tokens` more tokens ahead of the length, all or
    /// none (in every group together), only if `headroom` blocks stay free
    /// afterwards (the appends of those tokens then take nothing). On
    /// error nothing changes.
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
    /// The multi-token append: all the blocks `n` more tokens need in every
    /// group, or none; the device copies it needs first (copies on write of
    /// shared partly filled blocks) are pushed onto `copies`. The blocks a
    /// sliding window leaves behind go back in the same call, under
    /// `fence` if given. On error nothing changes.
    fn try_append(
        &mut self,
        n: usize,
        fence: Option<u64>,
        copies: &mut Copies<Self::Id>,
    ) -> Result<Range<usize>, ReserveError>;
    /// Rolls back to `len` tokens (no further back than the last append's
    /// first token, or to 0); returns how many blocks left the tables.
    fn truncate(&mut self, len: usize) -> usize;
    /// [`truncate`](Self::truncate) with the references that go back (and
    /// a copy-on-write's source still kept) kept until `fence` completes
    /// ([`KvBackend::complete`]).
    fn truncate_fenced(&mut self, len: usize, fence: u64) -> usize;
    /// Gives the sequence up with its references kept until `fence`
    /// completes; returns how many references.
    fn retire(self, fence: u64) -> usize;
    /// Hands the sources of the last copies on write, still kept, to
    /// `fence`; returns how many there were.
    fn retire_copy_source(&mut self, fence: u64) -> usize;
    /// A child sharing the full blocks; the copies of a partly filled last
    /// block into the child's private ones are pushed onto `copies`.
    fn try_fork(&self, copies: &mut Copies<Self::Id>) -> Result<Self, ReserveError>;
    /// Appends group `group`'s slot mapping of `positions` to `out`; an
    /// error (a range past the length, or outside the group's window)
    /// leaves `out` unchanged.
    fn extend_slots(
        &self,
        group: usize,
        positions: Range<usize>,
        out: &mut Vec<usize>,
    ) -> Result<(), String>;
    /// How many blocks `keys` covers.
    fn key_blocks(keys: &Self::Keys) -> usize;
    /// Drops every key of `keys`, keeping its memory.
    fn clear_keys(keys: &mut Self::Keys);
    /// On a sequence that holds no token (empty, or holding only a
    /// reservation): takes the longest prefix of `keys` that every group
    /// can serve from the cache (one reference each), puts the blocks in
    /// the tables (in reserved blocks' places, which pay for revivals
    /// where the allocator lends them), sets the length to `k *
    /// block_size` and returns `k`. The reservation's capacity stays,
    /// unless a race lost some of it with the pool full (the library's
    /// hybrid sequences only): the caller checks
    /// [`capacity`](Self::capacity). On one that holds tokens: 0, nothing
    /// changes.
    fn try_match_prefix(&mut self, keys: &Self::Keys) -> usize;
    /// Makes each of its keys the key of the corresponding full block, in
    /// every group, for every one not cached yet (first wins); returns how
    /// many became cached.
    fn publish(&mut self, keys: &Self::Keys) -> usize;
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
    /// (with `n == 0`, an atomic check that `headroom` blocks are free).
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
    /// An empty sequence with room for `tokens` tokens in its tables.
    fn new_seq(&self, tokens: usize) -> Self::Seq;
    /// Empty prefix keys for this backend's sequences.
    fn new_keys(&self) -> <Self::Seq as KvSeq>::Keys;
    /// Adds the keys, in every group, of the blocks whose content keys are
    /// `base`.
    fn extend_keys(&self, keys: &mut <Self::Seq as KvSeq>::Keys, base: &[BlockHash]);
    /// The groups of layers of every sequence, for the report (one `Full`
    /// for a plain model).
    fn kv_groups(&self) -> &KvGroups;
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
/// the raw allocation and free, and the fences' completion.
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

/// A library sequence type the engine runs over a pool `P`: a plain
/// [`Sequence`] (one table) or a [`HybridSequence`] (one per group).
pub trait SeqOver<P: Pool>: KvSeq<Id = BlockId> {
    /// An empty sequence over `pool`, of `groups`, with room for `tokens`.
    fn over(pool: &Arc<P>, groups: &KvGroups, tokens: usize) -> Self;
    /// Empty keys for sequences of `groups`.
    fn new_keys(groups: &KvGroups) -> Self::Keys;
    /// Adds the keys of the blocks whose content keys are `base`.
    fn extend_keys(keys: &mut Self::Keys, base: &[BlockHash]);
}

/// A shared pool and the library's sequences over it (`S`: plain or
/// hybrid): the engine's backend for either allocator.
#[derive(Debug)]
pub struct Backend<P, S = Sequence<P>> {
    pool: Arc<P>,
    groups: KvGroups,
    seq: PhantomData<fn() -> S>,
}

impl<P, S> Clone for Backend<P, S> {
    fn clone(&self) -> Self {
        Backend {
            pool: Arc::clone(&self.pool),
            groups: self.groups.clone(),
            seq: PhantomData,
        }
    }
}

/// One full-attention group: a plain model's layout.
fn all_full() -> KvGroups {
    KvGroups::new([KvGroup::Full]).expect("one group")
}

impl<P: BlockAllocator> Backend<P> {
    /// A backend of plain sequences over `pool`.
    pub fn from_pool(pool: P) -> Self {
        Backend {
            pool: Arc::new(pool),
            groups: all_full(),
            seq: PhantomData,
        }
    }
}

impl<P, S> Backend<P, S> {
    /// The pool.
    pub fn pool(&self) -> &Arc<P> {
        &self.pool
    }
}

impl<P: BlockAllocator> Backend<P, HybridSequence<P>> {
    /// A backend of hybrid sequences of `groups` over `pool`.
    pub fn hybrid(pool: P, groups: KvGroups) -> Self {
        Backend {
            pool: Arc::new(pool),
            groups,
            seq: PhantomData,
        }
    }
}

/// The real allocator: one `Arc<kvslots::BlockPool>` and `kvslots::Sequence`.
pub type KvslotsBackend = Backend<BlockPool>;

/// The lock-based baseline: a [`MutexPool`] under `kvslots::Sequence`.
pub type MutexBackend = Backend<MutexPool>;

/// The real allocator under `kvslots::HybridSequence`.
pub type HybridKvslotsBackend = Backend<BlockPool, HybridSequence<BlockPool>>;

/// The lock-based baseline under `kvslots::HybridSequence`.
pub type HybridMutexBackend = Backend<MutexPool, HybridSequence<MutexPool>>;

impl Backend<BlockPool> {
    /// A pool of `num_blocks` blocks of `block_size` tokens.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Backend::from_pool(BlockPool::new(num_blocks, block_size))
    }

    /// A pool of `num_blocks` blocks of `block_size` tokens whose free list
    /// is cut into `shards` shards.
    pub fn with_shards(num_blocks: usize, block_size: usize, shards: usize) -> Self {
        Backend::from_pool(BlockPool::with_shards(num_blocks, block_size, shards))
    }
}

impl Backend<MutexPool> {
    /// A pool of `num_blocks` blocks of `block_size` tokens.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Backend::from_pool(MutexPool::new(num_blocks, block_size))
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

impl<P: Pool> SeqOver<P> for Sequence<P> {
    fn over(pool: &Arc<P>, _groups: &KvGroups, tokens: usize) -> Self {
        Sequence::with_capacity(Arc::clone(pool), tokens)
    }
    fn new_keys(_groups: &KvGroups) -> Vec<BlockHash> {
        Vec::new()
    }
    fn extend_keys(keys: &mut Vec<BlockHash>, base: &[BlockHash]) {
        keys.extend_from_slice(base);
    }
}

impl<P: Pool> KvSeq for Sequence<P> {
    type Id = BlockId;
    type Keys = Vec<BlockHash>;

    fn index(id: BlockId) -> usize {
        id.index()
    }
    fn is_null(id: BlockId) -> bool {
        id.is_null()
    }
    fn len(&self) -> usize {
        Sequence::len(self)
    }
    fn table(&self, _group: usize) -> &[BlockId] {
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
    fn try_append(
        &mut self,
        n: usize,
        _fence: Option<u64>,
        copies: &mut Copies<BlockId>,
    ) -> Result<Range<usize>, ReserveError> {
        // The one call into the library's copy-on-write API. (No window:
        // nothing to give back under the fence.)
        let (range, copy) = self.try_append_cow(n)?;
        copies.extend(copy.map(|c| (0, BlockCopy::from(c))));
        Ok(range)
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
    fn try_fork(&self, copies: &mut Copies<BlockId>) -> Result<Self, ReserveError> {
        let (child, copy) = Sequence::try_fork(self)?;
        copies.extend(copy.map(|c| (0, BlockCopy::from(c))));
        Ok(child)
    }
    fn extend_slots(
        &self,
        _group: usize,
        positions: Range<usize>,
        out: &mut Vec<usize>,
    ) -> Result<(), String> {
        Sequence::extend_slots(self, positions, out).map_err(|e| e.to_string())
    }
    fn key_blocks(keys: &Vec<BlockHash>) -> usize {
        keys.len()
    }
    fn clear_keys(keys: &mut Vec<BlockHash>) {
        keys.clear();
    }
    fn try_match_prefix(&mut self, keys: &Vec<BlockHash>) -> usize {
        Sequence::try_match_prefix(self, keys)
    }
    fn publish(&mut self, keys: &Vec<BlockHash>) -> usize {
        Sequence::publish(self, keys)
    }
}

impl<P: Pool> SeqOver<P> for HybridSequence<P> {
    fn over(pool: &Arc<P>, groups: &KvGroups, tokens: usize) -> Self {
        HybridSequence::with_capacity(Arc::clone(pool), groups.clone(), tokens)
    }
    fn new_keys(groups: &KvGroups) -> GroupKeys {
        GroupKeys::new(groups)
    }
    fn extend_keys(keys: &mut GroupKeys, base: &[BlockHash]) {
        keys.extend(base);
    }
}

impl<P: Pool> KvSeq for HybridSequence<P> {
    type Id = BlockId;
    type Keys = GroupKeys;

    fn index(id: BlockId) -> usize {
        id.index()
    }
    fn is_null(id: BlockId) -> bool {
        id.is_null()
    }
    fn len(&self) -> usize {
        HybridSequence::len(self)
    }
    fn groups(&self) -> usize {
        HybridSequence::groups(self).len()
    }
    fn table(&self, group: usize) -> &[BlockId] {
        self.blocks(group).unwrap_or(&[])
    }
    fn first_needed_block(&self, group: usize, len: usize) -> usize {
        HybridSequence::groups(self)
            .get(group)
            .map_or(0, |g| g.first_needed_block(len, self.pool().block_size()))
    }
    fn capacity(&self) -> usize {
        HybridSequence::capacity(self)
    }
    fn try_reserve(&mut self, tokens: usize, headroom: usize) -> Result<(), ReserveError> {
        HybridSequence::try_reserve(self, tokens, headroom)
    }
    fn reserve_blocking(
        &mut self,
        tokens: usize,
        headroom: usize,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError> {
        HybridSequence::reserve_blocking(self, tokens, headroom, timeout)
    }
    fn try_append(
        &mut self,
        n: usize,
        fence: Option<u64>,
        copies: &mut Copies<BlockId>,
    ) -> Result<Range<usize>, ReserveError> {
        let old_len = HybridSequence::len(self);
        let mut made = Vec::new();
        let range = match fence {
            None => self.try_append_cow(n, &mut made)?,
            Some(fence) => self.try_append_fenced(n, fence, &mut made)?,
        };
        // The copies come in group order, for the groups that copied: the
        // group is the one whose tail the copy's destination now is.
        let tail = old_len / self.pool().block_size();
        for c in made {
            let group = (0..KvSeq::groups(self))
                .find(|&g| KvSeq::table(self, g).get(tail) == Some(&c.dst))
                .unwrap_or(0);
            copies.push((group, BlockCopy::from(c)));
        }
        Ok(range)
    }
    fn truncate(&mut self, len: usize) -> usize {
        HybridSequence::truncate(self, len)
            .expect("the engine truncates back into its last append only, or to 0")
    }
    fn truncate_fenced(&mut self, len: usize, fence: u64) -> usize {
        HybridSequence::truncate_fenced(self, len, fence)
            .expect("the engine truncates back into its last append only, or to 0")
    }
    fn retire(self, fence: u64) -> usize {
        HybridSequence::retire(self, fence)
    }
    fn retire_copy_source(&mut self, fence: u64) -> usize {
        HybridSequence::retire_copy_source(self, fence)
    }
    fn try_fork(&self, copies: &mut Copies<BlockId>) -> Result<Self, ReserveError> {
        let mut made = Vec::new();
        let child = HybridSequence::try_fork(self, &mut made)?;
        // One copy per group, in group order, when the tail is partly
        // filled.
        copies.extend(
            made.into_iter()
                .enumerate()
                .map(|(g, c)| (g, BlockCopy::from(c))),
        );
        Ok(child)
    }
    fn extend_slots(
        &self,
        group: usize,
        positions: Range<usize>,
        out: &mut Vec<usize>,
    ) -> Result<(), String> {
        HybridSequence::extend_slots(self, group, positions, out).map_err(|e| e.to_string())
    }
    fn key_blocks(keys: &GroupKeys) -> usize {
        keys.blocks()
    }
    fn clear_keys(keys: &mut GroupKeys) {
        keys.clear();
    }
    fn try_match_prefix(&mut self, keys: &GroupKeys) -> usize {
        HybridSequence::try_match_prefix(self, keys).unwrap_or(0)
    }
    fn publish(&mut self, keys: &GroupKeys) -> usize {
        HybridSequence::publish(self, keys).unwrap_or(0)
    }
}

impl<P: Pool, S: SeqOver<P>> KvBackend for Backend<P, S> {
    type Seq = S;
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
    fn new_seq(&self, tokens: usize) -> S {
        S::over(&self.pool, &self.groups, tokens)
    }
    fn new_keys(&self) -> S::Keys {
        S::new_keys(&self.groups)
    }
    fn extend_keys(&self, keys: &mut S::Keys, base: &[BlockHash]) {
        S::extend_keys(keys, base);
    }
    fn kv_groups(&self) -> &KvGroups {
        &self.groups
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
