//! The allocator interface the engine drives, implemented for the real
//! `kvslots` pool and for the mutex baseline.
//!
//! The engine is generic over [`KvBackend`] (static dispatch), so both
//! allocators run exactly the same scheduler code and the comparison
//! measures the allocators, not the plumbing.

use std::fmt;
use std::hash::Hash;
use std::ops::Range;
use std::sync::Arc;

use kvslots::{BlockId, BlockPool, ReserveError, Sequence};

use crate::baseline::{MutexPool, MutexSeq};

/// A block pool plus its per-sequence block tables, as the engine uses
/// them. Every method that touches the pool is one "allocator call".
pub trait KvBackend: Send + Sync + 'static {
    /// A sequence's block table; dropping it gives its blocks back.
    type Seq: Send;
    /// A block id (of a raw allocation, or in a sequence's table).
    type Id: Copy + Send + Eq + Hash + fmt::Debug;

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
    /// is a bug in the caller, reported as a string. (The engine does not
    /// use it; the parity tests do.)
    fn free(&self, ids: &[Self::Id]) -> Result<(), String>;
    /// An empty sequence with room for `tokens` tokens in its table.
    fn new_seq(&self, tokens: usize) -> Self::Seq;
    /// Tokens in the sequence.
    fn seq_len(seq: &Self::Seq) -> usize;
    /// Blocks in the sequence's table (reserved ones included).
    fn seq_blocks(seq: &Self::Seq) -> usize;
    /// The sequence's block table: the filled blocks, then the reserved
    /// ones (not an allocator call).
    fn seq_table(seq: &Self::Seq) -> &[Self::Id];
    /// Tokens the blocks in the table can hold (`seq_blocks * block_size`).
    fn seq_capacity(seq: &Self::Seq) -> usize;
    /// Reserves blocks for `tokens` more tokens ahead of the sequence's
    /// length, all or none, only if `headroom` blocks stay free afterwards;
    /// the appends of those tokens then take nothing from the pool.
    /// Reserved blocks are never shared by a fork and are given back by
    /// `truncate` (below the length) and by dropping the sequence. Tokens
    /// that already fit take nothing. On error nothing changes.
    fn try_reserve(seq: &mut Self::Seq, tokens: usize, headroom: usize)
        -> Result<(), ReserveError>;
    /// The multi-token append: all the blocks `n` more tokens need, or none.
    fn try_append(seq: &mut Self::Seq, n: usize) -> Result<Range<usize>, ReserveError>;
    /// Rolls back to `len` tokens; returns how many block references went.
    fn truncate(seq: &mut Self::Seq, len: usize) -> usize;
    /// A child sharing the full blocks; `Some(tokens)` when a partly filled
    /// last block had to be copied.
    fn try_fork(seq: &Self::Seq) -> Result<(Self::Seq, Option<usize>), ReserveError>;
    /// Appends the slot mapping of `positions` to `out` (not an allocator
    /// call: it only reads the sequence's own table).
    fn extend_slots(seq: &Self::Seq, positions: Range<usize>, out: &mut Vec<usize>);
}

/// The real allocator: one `Arc<kvslots::BlockPool>` and `kvslots::Sequence`.
#[derive(Debug, Clone)]
pub struct KvslotsBackend {
    pool: Arc<BlockPool>,
}

impl KvslotsBackend {
    /// A pool of `num_blocks` blocks of `block_size` tokens.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        KvslotsBackend {
            pool: Arc::new(BlockPool::new(num_blocks, block_size)),
        }
    }

    /// A pool of `num_blocks` blocks of `block_size` tokens whose free list
    /// is cut into `shards` stacks.
    pub fn with_shards(num_blocks: usize, block_size: usize, shards: usize) -> Self {
        KvslotsBackend {
            pool: Arc::new(BlockPool::with_shards(num_blocks, block_size, shards)),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<BlockPool> {
        &self.pool
    }
}

impl KvBackend for KvslotsBackend {
    type Seq = Sequence;
    type Id = BlockId;

    fn name(&self) -> &'static str {
        "kvslots"
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
    fn try_alloc_with_headroom(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        self.pool.try_alloc_with_headroom(n, headroom, out)
    }
    fn free(&self, ids: &[BlockId]) -> Result<(), String> {
        self.pool.free(ids).map_err(|e| e.to_string())
    }
    fn new_seq(&self, tokens: usize) -> Sequence {
        Sequence::with_capacity(Arc::clone(&self.pool), tokens)
    }
    fn seq_len(seq: &Sequence) -> usize {
        seq.len()
    }
    fn seq_blocks(seq: &Sequence) -> usize {
        seq.blocks().len()
    }
    fn seq_table(seq: &Sequence) -> &[BlockId] {
        seq.blocks()
    }
    fn seq_capacity(seq: &Sequence) -> usize {
        seq.capacity()
    }
    fn try_reserve(seq: &mut Sequence, tokens: usize, headroom: usize) -> Result<(), ReserveError> {
        seq.try_reserve(tokens, headroom)
    }
    fn try_append(seq: &mut Sequence, n: usize) -> Result<Range<usize>, ReserveError> {
        seq.try_append(n)
    }
    fn truncate(seq: &mut Sequence, len: usize) -> usize {
        seq.truncate(len)
    }
    fn try_fork(seq: &Sequence) -> Result<(Sequence, Option<usize>), ReserveError> {
        seq.try_fork()
            .map(|(child, copy)| (child, copy.map(|c| c.tokens)))
    }
    fn extend_slots(seq: &Sequence, positions: Range<usize>, out: &mut Vec<usize>) {
        // The engine only maps positions it just appended.
        let result = seq.extend_slots(positions, out);
        debug_assert!(result.is_ok(), "mapped positions past the sequence");
    }
}

/// The lock-based baseline: a [`MutexPool`] and [`MutexSeq`].
#[derive(Debug, Clone)]
pub struct MutexBackend {
    pool: Arc<MutexPool>,
}

impl MutexBackend {
    /// A pool of `num_blocks` blocks of `block_size` tokens.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        MutexBackend {
            pool: Arc::new(MutexPool::new(num_blocks, block_size)),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<MutexPool> {
        &self.pool
    }
}

impl KvBackend for MutexBackend {
    type Seq = MutexSeq;
    type Id = u32;

    fn name(&self) -> &'static str {
        "mutex"
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
    fn try_alloc_with_headroom(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), ReserveError> {
        self.pool.try_alloc_with_headroom(n, headroom, out)
    }
    fn free(&self, ids: &[u32]) -> Result<(), String> {
        self.pool.free(ids).map_err(|e| e.to_string())
    }
    fn new_seq(&self, tokens: usize) -> MutexSeq {
        MutexSeq::with_capacity(Arc::clone(&self.pool), tokens)
    }
    fn seq_len(seq: &MutexSeq) -> usize {
        seq.len()
    }
    fn seq_blocks(seq: &MutexSeq) -> usize {
        seq.blocks().len()
    }
    fn seq_table(seq: &MutexSeq) -> &[u32] {
        seq.blocks()
    }
    fn seq_capacity(seq: &MutexSeq) -> usize {
        seq.capacity()
    }
    fn try_reserve(seq: &mut MutexSeq, tokens: usize, headroom: usize) -> Result<(), ReserveError> {
        seq.try_reserve(tokens, headroom)
    }
    fn try_append(seq: &mut MutexSeq, n: usize) -> Result<Range<usize>, ReserveError> {
        seq.try_append(n)
    }
    fn truncate(seq: &mut MutexSeq, len: usize) -> usize {
        seq.truncate(len)
    }
    fn try_fork(seq: &MutexSeq) -> Result<(MutexSeq, Option<usize>), ReserveError> {
        seq.try_fork()
            .map(|(child, copy)| (child, copy.map(|c| c.tokens)))
    }
    fn extend_slots(seq: &MutexSeq, positions: Range<usize>, out: &mut Vec<usize>) {
        seq.extend_slots(positions, out);
    }
}
