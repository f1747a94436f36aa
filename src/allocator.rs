//! [`BlockAllocator`]: what a [`Sequence`](crate::Sequence) needs from the
//! pool its blocks come from.

use std::time::Duration;

use crate::error::ReserveError;
use crate::hash::BlockHash;
use crate::id::BlockId;

/// The pool under a [`Sequence`](crate::Sequence): the calls a sequence
/// makes to take, share, give back and cache blocks, and nothing else.
///
/// [`BlockPool`](crate::BlockPool) implements it, lock-free; a sequence is
/// `Sequence<A = BlockPool>`, so `Sequence` alone means one over a
/// `BlockPool`. Implement it to run the same block tables (appends,
/// copy-on-write, forks, rollback, fenced release, prefix matching) over
/// another allocator: `kvslots-sim` runs its mutex baseline this way, with
/// every call under one lock.
///
/// Users of `Sequence` never call these methods: the sequence does, on
/// blocks it holds. Calling them directly follows the same rules as
/// [`BlockPool::free`](crate::BlockPool::free): listing a block the caller
/// does not hold is a logic error (it takes or lends another holder's
/// reference), never memory unsafety. An id at or past
/// [`num_blocks`](Self::num_blocks) is one the allocator never handed out:
/// an implementation may panic on it (`BlockPool` does, before changing
/// anything).
///
/// # The contract
///
/// An implementor keeps, for every call:
///
/// * **References.** Each block has a reference count. A block handed out
///   by an allocation or a match carries one new reference for the caller;
///   [`add_refs`](Self::add_refs) adds one, [`release`](Self::release)
///   drops one, and a block whose last reference goes is free again (for a
///   cached block: evictable, see below). No block is handed out while it
///   has a reference.
/// * **All or nothing.** An allocation takes all the blocks it is asked for
///   or none; a refused call changes nothing (its `out` is unchanged,
///   though its capacity may grow).
/// * **Orderings.** What the holders of a block did with it before its last
///   reference went happens-before the call that hands it to its next
///   owner returns (a `Release` drop and an `Acquire` take, or one lock).
/// * **Blocks are ids.** Every id handed out is below
///   [`num_blocks`](Self::num_blocks); ids of one call are distinct.
///   `num_blocks` and `block_size` never change, and `block_size > 0`.
///
/// The prefix cache is optional: its methods have defaults that cache
/// nothing (a match finds nothing, a publish caches nothing), which is
/// correct for an allocator without one. Fenced release and waiting are
/// not optional: a sequence's [`retire`](crate::Sequence::retire) must not
/// give blocks back before their fence completes, and its
/// [`reserve_blocking`](crate::Sequence::reserve_blocking) must wait, so
/// every allocator says how it does both.
///
/// # Examples
///
/// A sequence over any allocator, here a `BlockPool` behind a trait
/// object:
///
/// ```
/// use std::sync::Arc;
/// use kvslots::{BlockAllocator, BlockPool, Sequence};
///
/// let pool: Arc<dyn BlockAllocator + Send + Sync> = Arc::new(BlockPool::new(8, 16));
/// let mut seq = Sequence::new(Arc::clone(&pool));
/// assert_eq!(seq.try_append(20).unwrap(), 0..20);
/// assert_eq!(seq.blocks().len(), 2);
/// ```
pub trait BlockAllocator {
    /// The number of blocks (constant). Ids are `0..num_blocks()`.
    fn num_blocks(&self) -> usize;

    /// The number of token slots per block (constant, at least 1).
    fn block_size(&self) -> usize;

    /// Whether the allocator is closed: it admits nothing more (every
    /// allocation fails with [`ReserveError::Closed`]) while releases keep
    /// working. A sequence reports a request that could never fit as
    /// `Closed` then, as the allocator would. The default is never closed,
    /// for an allocator without a close.
    fn is_closed(&self) -> bool {
        false
    }

    /// Takes `n` blocks for a new admission, all or nothing, only if
    /// `headroom` more stay free afterwards, and appends their distinct ids
    /// to `out`, each with one reference. `n == 0` takes nothing and
    /// succeeds unless the allocator is closed or `headroom` blocks are not
    /// free (a check-only admission).
    ///
    /// A sequence calls it for the blocks of a sequence that holds none yet
    /// (an append or a reservation into an empty table).
    ///
    /// # Errors
    ///
    /// [`ReserveError::NeverFits`] if `n + headroom > num_blocks()`
    /// (saturating: `usize::MAX` included), [`ReserveError::Full`] if fewer
    /// are free now, [`ReserveError::Closed`] once the allocator is closed.
    /// On error nothing changes.
    fn try_alloc_with_headroom(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError>;

    /// Takes `n` blocks, as [`try_alloc_with_headroom`](Self::try_alloc_with_headroom)
    /// without headroom, for the growth of a caller that holds blocks
    /// already (an append to a running sequence, a fork's private tail).
    ///
    /// An allocator that queues waiters may let growth take blocks that
    /// new admissions leave for the head of its queue, so that running
    /// sequences do not wait behind new ones (`BlockPool` does). The
    /// default is the plain allocation.
    ///
    /// # Errors
    ///
    /// As [`try_alloc_with_headroom`](Self::try_alloc_with_headroom).
    fn try_alloc_growth(&self, n: usize, out: &mut Vec<BlockId>) -> Result<(), ReserveError> {
        self.try_alloc_with_headroom(n, 0, out)
    }

    /// [`try_alloc_with_headroom`](Self::try_alloc_with_headroom), waiting
    /// until `n` blocks can be taken with `headroom` more free, for at most
    /// `timeout` (`None`: no limit).
    ///
    /// # Errors
    ///
    /// [`ReserveError::NeverFits`] at once, [`ReserveError::Closed`] (also
    /// when the allocator is closed while the caller waits), or
    /// [`ReserveError::Full`] when `timeout` runs out (never with `None`).
    /// On error nothing changes.
    fn alloc_with_headroom_blocking(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError>;

    /// Adds one reference to each of `ids`, in order, and returns how many
    /// it added: all of them, unless the next block cannot take one. That
    /// happens when its count is at the allocator's maximum, or when it has
    /// no reference left although the caller listed it as held (a raw
    /// free took the caller's reference: a double free); adding one to a
    /// free block would hand it to two owners. The caller (a fork) then
    /// gives back the references added and panics.
    ///
    /// Orders nothing by itself: the new holder gets the blocks through
    /// whatever hands it over, as with `Arc::clone`.
    fn add_refs(&self, ids: &[BlockId]) -> usize;

    /// Drops one reference to each of `ids`, which the caller holds, the
    /// last listed first (so that of a cached prompt the tail is evicted
    /// before the head). A block whose last reference goes is free again,
    /// or evictable if it is cached.
    ///
    /// A reference that is no longer there (a raw free of the same block
    /// took it: a double free) is skipped; the others are dropped all the
    /// same.
    fn release(&self, ids: &[BlockId]);

    /// Whether a holder of `id` must copy the block before writing into
    /// it: another holder shares it, or it is cached (its key can match).
    /// A snapshot that may only turn from `true` to `false` while the
    /// caller holds the block, never back: a block the caller holds alone
    /// gains no holder and no key without the caller.
    fn needs_copy(&self, id: BlockId) -> bool;

    /// Takes the blocks of the longest prefix of `keys` that the allocator
    /// holds cached, one new reference each, appends them to `out` and
    /// returns how many. `out` has room for `min(keys.len(), num_blocks())`
    /// more ids.
    ///
    /// The blocks are distinct (a key repeated in `keys` ends the match),
    /// and `keys[i]` is the key of block `i` of the prefix, exactly (never
    /// another key). A cached block that no one holds counts as free, and
    /// taking it counts against the capacity as an allocation does: when
    /// none is free, or the allocator is closed, the match ends before it.
    /// What the publisher wrote into a block before publishing it
    /// happens-before this call returns it.
    ///
    /// The default caches nothing and returns 0.
    fn match_prefix(&self, keys: &[BlockHash], out: &mut Vec<BlockId>) -> usize {
        let _ = (keys, out);
        0
    }

    /// Makes `keys[i]` the key of `blocks[i]` (full blocks the caller
    /// holds, written) for each pair whose block holds no key yet and
    /// whose key no block holds (first wins), and returns how many became
    /// cached. Extra entries of the longer slice are ignored.
    ///
    /// A cached block is never handed out for writing while its key can
    /// match: when its last reference goes it becomes evictable, and an
    /// allocation takes an evictable block (dropping its key) only when no
    /// uncached block is free.
    ///
    /// The default caches nothing and returns 0.
    fn publish(&self, blocks: &[BlockId], keys: &[BlockHash]) -> usize {
        let _ = (blocks, keys);
        0
    }

    /// [`publish`](Self::publish) of blocks that continue a sequence past
    /// its first block: `parent` is the key of the block before
    /// `blocks[0]` in the sequence (held or not; `None` when `blocks[0]`
    /// is the sequence's first block). An allocator that reports its
    /// cache's changes names it as the parent of the first block stored
    /// (`BlockPool` with [KV events](crate::BlockPoolBuilder::kv_events));
    /// a [`HybridSequence`](crate::HybridSequence)'s sliding group
    /// publishes this way from the first block its window still holds.
    ///
    /// The default ignores `parent` and calls `publish`.
    fn publish_after(
        &self,
        parent: Option<&BlockHash>,
        blocks: &[BlockId],
        keys: &[BlockHash],
    ) -> usize {
        let _ = parent;
        self.publish(blocks, keys)
    }

    /// Drops the key of `id` if the caller is its only holder, so that the
    /// caller may write into it (a truncate into a cached block). A block
    /// that another holder shares keeps its key; writing into it takes a
    /// copy. The default does nothing (no block is ever cached).
    fn uncache_if_sole(&self, id: BlockId) {
        let _ = id;
    }

    /// Keeps the caller's references to `ids` until `fence` completes (for
    /// `BlockPool`, [`BlockPool::complete`](crate::BlockPool::complete)),
    /// and returns how many references that is (`ids.len()`): until then
    /// the blocks count as used and are never handed out, whatever else is
    /// released. An empty list retires nothing and returns 0.
    fn retire(&self, fence: u64, ids: &[BlockId]) -> usize;

    /// [`retire`](Self::retire) of a table the caller gives up: an
    /// allocator that keeps lists per fence may keep the `Vec` itself
    /// (`BlockPool` does: no allocation per block). The default retires
    /// the slice.
    fn retire_owned(&self, fence: u64, ids: Vec<BlockId>) -> usize {
        self.retire(fence, &ids)
    }
}
