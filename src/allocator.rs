//! [`BlockAllocator`]: what a [`Sequence`](crate::Sequence) needs from the
//! pool its blocks come from.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use crate::error::ReserveError;
use crate::hash::BlockHash;
use crate::id::BlockId;

/// The seal of [`BlockAllocator::as_block_pool`]: a type that code
/// outside the crate cannot name, so it cannot override that method (nor
/// call it in safe code).
mod seal {
    /// The argument of `BlockAllocator::as_block_pool`.
    #[derive(Clone, Copy, Debug)]
    pub struct Pool(pub(crate) ());
}

pub(crate) use seal::Pool as Seal;

/// The capability of a [`BlockAllocator`] call made by a
/// [`Sequence`](crate::Sequence) or a
/// [`HybridSequence`](crate::HybridSequence), on blocks it holds.
///
/// Only this crate builds one (its field is private), and only its
/// sequences do, for the duration of one call. It is neither `Clone` nor
/// `Copy`; the borrow an implementor receives ends with the call, so it
/// cannot keep the token past it, and the token is not `Sync`, so it
/// cannot hand it to another thread. Code outside the crate can implement
/// `BlockAllocator` (it receives tokens), and while one of its calls runs
/// it holds the token it was given: what a forwarding implementor may do
/// with it is under [The contract](BlockAllocator#the-contract). Any other
/// outside code has no token, so it cannot make the calls that change a
/// sequence's blocks.
///
/// Outside code cannot build one:
///
/// ```compile_fail
/// let by = kvslots::SequenceCall::new();
/// ```
///
/// nor spell its value:
///
/// ```compile_fail
/// let by = kvslots::SequenceCall { _private: std::marker::PhantomData, group: None };
/// ```
///
/// The token also says on whose behalf a publish is made
/// ([`group`](Self::group)), so that a forwarding implementor that passes
/// its token on passes that on too.
pub struct SequenceCall<'a> {
    /// Private, so that no code outside the crate builds one; a raw
    /// pointer, so that the token is neither `Send` nor `Sync`; invariant
    /// in `'a`, so that a borrow of it cannot be stretched.
    _private: PhantomData<*mut &'a ()>,
    /// See [`group`](Self::group).
    group: Option<u16>,
    /// What a `BlockPool` publish reports back to the sequence that made
    /// it: see [`keyed`](Self::keyed).
    keyed: Cell<Option<KeyedRun>>,
    /// The address of the `BlockPool` the sequence calls, where a publish
    /// names it: see [`is_straight_to`](Self::is_straight_to).
    to: Option<usize>,
}

/// The blocks of a publish that hold keys after it: the first `run` of
/// the `offered` blocks of the slice at address `at`. While a sequence's
/// call runs, its table is borrowed, so only that very slice has this
/// address and length: a forwarder's own list of the same blocks (in
/// another order, say) is never taken for it.
#[derive(Clone, Copy, Debug)]
struct KeyedRun {
    at: usize,
    offered: usize,
    run: usize,
}

impl SequenceCall<'_> {
    /// A token for one call of a sequence on blocks it holds.
    #[inline]
    pub(crate) fn new() -> Self {
        SequenceCall {
            _private: PhantomData,
            group: None,
            keyed: Cell::new(None),
            to: None,
        }
    }

    /// A token for a publish by the table of group `group` of a
    /// [`HybridSequence`](crate::HybridSequence) (fewer than
    /// [`KvGroups::MAX_GROUPS`](crate::KvGroups::MAX_GROUPS)).
    #[inline]
    pub(crate) fn in_group(group: usize) -> Self {
        debug_assert!(group < crate::KvGroups::MAX_GROUPS);
        SequenceCall {
            _private: PhantomData,
            group: u16::try_from(group).ok(),
            keyed: Cell::new(None),
            to: None,
        }
    }

    /// This token, for a call that the sequence makes on `allocator`, its
    /// own: it names the allocator if that is a `BlockPool` (of that type,
    /// also behind a trait object; see
    /// [`BlockAllocator::as_block_pool`]), and nothing otherwise.
    #[inline]
    pub(crate) fn straight_to<A: BlockAllocator + ?Sized>(mut self, allocator: &A) -> Self {
        if allocator.as_block_pool(seal::Pool(())).is_some() {
            self.to = Some(allocator as *const A as *const () as usize);
        }
        self
    }

    /// Whether the sequence that made this call made it on `pool` itself,
    /// not through an allocator that forwards to it. A forwarder may count
    /// some holders of a block itself (a fork's, say) and let the pool see
    /// one reference for them; the pool's own count is every holder's only
    /// when the sequence's allocator is the pool. The type decides (only
    /// `BlockPool` says it is one), then the address (a sequence over
    /// another pool names that one).
    #[inline]
    pub(crate) fn is_straight_to(&self, pool: &crate::BlockPool) -> bool {
        self.to == Some(pool as *const crate::BlockPool as usize)
    }

    /// Notes that the first `run` of `blocks`, the slice a publish was
    /// given, hold keys now (each cached by it or before it, under any
    /// key).
    #[inline]
    pub(crate) fn note_keyed(&self, blocks: &[BlockId], run: usize) {
        self.keyed.set(Some(KeyedRun {
            at: blocks.as_ptr() as usize,
            offered: blocks.len(),
            run,
        }));
    }

    /// How many of `blocks`, from the first, the allocator noted holding
    /// keys after the publish this token made, if it noted it for this
    /// very slice (an allocator other than `BlockPool` notes nothing; a
    /// forwarder that passed on a list of its own noted that list).
    #[inline]
    pub(crate) fn keyed(&self, blocks: &[BlockId]) -> Option<usize> {
        self.keyed
            .get()
            .filter(|k| k.at == blocks.as_ptr() as usize && k.offered == blocks.len())
            .map(|k| k.run)
    }

    /// The group of layers on whose behalf this call caches blocks: the
    /// index, in its [`KvGroups`](crate::KvGroups), of the
    /// [`HybridSequence`](crate::HybridSequence) table that makes a
    /// [`publish`](BlockAllocator::publish) or
    /// [`publish_after`](BlockAllocator::publish_after); `None` for a plain
    /// [`Sequence`](crate::Sequence)'s publish and for every other call
    /// (a hybrid append, for one, takes every group's blocks at once).
    /// [`BlockPool`](crate::BlockPool) names it in its [KV
    /// events](crate::KvEvent) (vLLM's `group_idx`); an allocator that
    /// forwards its calls to another passes it on with the token.
    #[inline]
    pub fn group(&self) -> Option<usize> {
        self.group.map(usize::from)
    }
}

impl fmt::Debug for SequenceCall<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SequenceCall")
            .field("group", &self.group())
            .finish()
    }
}

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
/// Users of `Sequence` never call these methods, and cannot: every call
/// that takes, shares, gives back, retires, matches, publishes or uncaches
/// a sequence's blocks takes a [`SequenceCall`], which only this crate's
/// [`Sequence`](crate::Sequence) and [`HybridSequence`](crate::HybridSequence)
/// build, for the blocks they hold. So no code outside the crate changes a
/// sequence-held block's reference count (short of a forwarding
/// implementor that breaks [the contract](#the-contract) with the token
/// it receives): not a double release, not a release of
/// [`Sequence::blocks`](crate::Sequence::blocks) racing the sequence's
/// drop, not a stray `add_refs`. (`BlockPool` relies on it: a
/// sequence that holds a block alone gives it back with a load and a
/// plain store. A sequence that calls a `BlockPool` itself, not through a
/// forwarder, also claims a block it holds alone for its publish with a
/// plain store: then the pool has counted every holder itself, where a
/// forwarder may count some shares on its own.) The read-only calls ([`num_blocks`](Self::num_blocks),
/// [`block_size`](Self::block_size), [`is_closed`](Self::is_closed),
/// [`needs_copy`](Self::needs_copy)) take no token. Raw blocks have their
/// own calls on the pool: [`BlockPool::try_alloc`](crate::BlockPool::try_alloc),
/// [`BlockPool::add_refs`](crate::BlockPool::add_refs) and
/// [`BlockPool::free`](crate::BlockPool::free), which refuse a sequence's
/// block.
///
/// An id at or past [`num_blocks`](Self::num_blocks) is one the allocator
/// never handed out: an implementation may panic on it (`BlockPool` does,
/// before changing anything).
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
/// * **Keys stay while held.** A cached block that a caller holds keeps
///   its key until its last reference goes (it is then evictable) or the
///   holder's [`uncache_if_sole`](Self::uncache_if_sole) drops it: an
///   index that runs out of room forgets only keys whose blocks no one
///   holds, or caches nothing more (a [`publish`](Self::publish) may leave
///   a block uncached). A sequence relies on it: its publish does not
///   offer again the blocks it knows hold their keys (those it matched,
///   and those of a publish that cached every block it offered, or that
///   `BlockPool` reported cached by it or before it).
/// * **A pool's sequences hold their blocks.** The blocks that a
///   [`Sequence`](crate::Sequence) over a [`BlockPool`](crate::BlockPool)
///   itself holds are shared only through that pool's own
///   [`add_refs`](Self::add_refs) (a fork of the sequence) and matches: an
///   allocator that forwards to the same pool must not hand them to its
///   own sequences, nor count shares of them. The pool decides from its
///   count whether such a sequence holds a block alone: to give it back
///   with a plain store, to drop its key before a truncate writes into it
///   ([`uncache_if_sole`](Self::uncache_if_sole)), and to claim it for a
///   publish with a plain store. (A forwarder may count the shares of the
///   blocks its own sequences hold: their calls do not reach the pool as
///   the calls of a sequence over it.)
/// * **Blocks are ids.** Every id handed out is below
///   [`num_blocks`](Self::num_blocks); ids of one call are distinct.
///   `num_blocks` and `block_size` never change, and `block_size > 0`.
/// * **The token.** An implementor receives a `&SequenceCall` and cannot
///   build, clone or keep one. An allocator that forwards to another (a
///   wrapper around a `BlockPool`, say) passes the token it was given only
///   to inner calls made for this call, during it, which list only the ids
///   it was given and have the same effect on each of their references
///   (one inner `release` for a `release`, say): it must not list other
///   blocks, repeat a reference's drop or share, or drop a reference it
///   was asked to share. Each breach is a call the sequence did not
///   make, and the token cannot stop it: it is the one way left for code
///   outside the crate to change a sequence-held block, and then the inner
///   allocator may give a block back twice or to two owners (a logic
///   error, as a double free is; never memory unsafety). A forwarder
///   should also forward every method that has a default: the defaults
///   call other methods of `self` (the default `try_alloc_growth` is
///   `try_alloc_with_headroom`, a new admission, where `BlockPool`'s own
///   is a running sequence's growth).
///
/// A sequence checks the count of every allocation: one that succeeds
/// with more or fewer ids than asked, or fails with some, breaks all or
/// nothing, and the sequence panics before it changes (giving back the
/// ids of a success first). It does not check the rest of the contract;
/// a breach there is a logic error, as a double free is.
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
        by: &SequenceCall<'_>,
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
    fn try_alloc_growth(
        &self,
        by: &SequenceCall<'_>,
        n: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        self.try_alloc_with_headroom(by, n, 0, out)
    }

    /// [`try_alloc_with_headroom`](Self::try_alloc_with_headroom), waiting
    /// until `n` blocks can be taken with `headroom` more free, for at most
    /// `timeout` (`None`: no limit).
    ///
    /// # Errors
    ///
    /// [`ReserveError::NeverFits`] at once, [`ReserveError::Closed`] (also
    /// when the allocator is closed while the caller waits), or
    /// [`ReserveError::Full`] or [`ReserveError::BehindWaiters`] when
    /// `timeout` runs out (never with `None`).
    /// On error nothing changes.
    fn alloc_with_headroom_blocking(
        &self,
        by: &SequenceCall<'_>,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError>;

    /// Adds one reference to each of `ids`, in order, and returns how many
    /// it added: all of them, unless the next block cannot take one. That
    /// happens when its count is at the allocator's maximum, or when it has
    /// no reference left although the caller listed it as held (a raw
    /// free of the allocator's own took the caller's reference: a double
    /// free; `BlockPool`'s refuses a sequence's block); adding one to a
    /// free block would hand it to two owners. The caller (a fork) then
    /// gives back the references added and panics.
    ///
    /// Orders nothing by itself: the new holder gets the blocks through
    /// whatever hands it over, as with `Arc::clone`.
    fn add_refs(&self, by: &SequenceCall<'_>, ids: &[BlockId]) -> usize;

    /// Drops one reference to each of `ids`, which the caller holds, the
    /// last listed first (so that of a cached prompt the tail is evicted
    /// before the head). A block whose last reference goes is free again,
    /// or evictable if it is cached.
    ///
    /// A reference that is no longer there (a raw free of the allocator's
    /// own took it: a double free) is skipped; the others are dropped all
    /// the same. (`BlockPool`'s raw free refuses a sequence's block, and
    /// its `release` relies on the caller's references being there: see
    /// [`SequenceCall`].)
    fn release(&self, by: &SequenceCall<'_>, ids: &[BlockId]);

    /// Whether a holder of `id` must copy the block before writing into
    /// it: another holder shares it, or it is cached (its key can match).
    /// A snapshot that may only turn from `true` to `false` while the
    /// caller holds the block, never back: a block the caller holds alone
    /// gains no holder and no key without the caller.
    fn needs_copy(&self, id: BlockId) -> bool;

    /// This allocator as a [`BlockPool`](crate::BlockPool), if it is one:
    /// `Some` only from `BlockPool`'s own implementation. Code outside the crate
    /// cannot name the argument's type, so it cannot override this method,
    /// nor call it in safe code: a forwarder is never taken for the pool
    /// it forwards to (a publish through one claims with a CAS, see
    /// [`SequenceCall`]; a [`HybridSequence`](crate::HybridSequence) over
    /// one lends it no reserved block). An implementation outside the crate that tries
    /// to override it does not compile (without the override, it does):
    ///
    /// ```compile_fail
    /// use std::time::Duration;
    /// use kvslots::{BlockAllocator, BlockId, ReserveError, SequenceCall};
    ///
    /// struct Impostor;
    ///
    /// impl BlockAllocator for Impostor {
    ///     fn as_block_pool(&self, _: kvslots::allocator::seal::Pool) -> Option<&kvslots::BlockPool> {
    ///         None
    ///     }
    /// #   fn num_blocks(&self) -> usize { 1 }
    /// #   fn block_size(&self) -> usize { 1 }
    /// #   fn try_alloc_with_headroom(
    /// #       &self, _: &SequenceCall<'_>, _: usize, _: usize, _: &mut Vec<BlockId>,
    /// #   ) -> Result<(), ReserveError> { unimplemented!() }
    /// #   fn alloc_with_headroom_blocking(
    /// #       &self, _: &SequenceCall<'_>, _: usize, _: usize, _: &mut Vec<BlockId>,
    /// #       _: Option<Duration>,
    /// #   ) -> Result<(), ReserveError> { unimplemented!() }
    /// #   fn add_refs(&self, _: &SequenceCall<'_>, _: &[BlockId]) -> usize { 0 }
    /// #   fn release(&self, _: &SequenceCall<'_>, _: &[BlockId]) {}
    /// #   fn needs_copy(&self, _: BlockId) -> bool { false }
    /// #   fn retire(&self, _: &SequenceCall<'_>, _: u64, _: &[BlockId]) -> usize { 0 }
    /// }
    /// ```
    #[doc(hidden)]
    fn as_block_pool(&self, _: seal::Pool) -> Option<&crate::BlockPool> {
        None
    }

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
    fn match_prefix(
        &self,
        by: &SequenceCall<'_>,
        keys: &[BlockHash],
        out: &mut Vec<BlockId>,
    ) -> usize {
        let _ = (by, keys, out);
        0
    }

    /// [`match_prefix`](Self::match_prefix) for a caller whose `out` ends
    /// with `lendable` blocks of a reservation: blocks it holds alone,
    /// uncached, with no token written. The allocator may take them back,
    /// the last first, each in place of an admission for a revival (the
    /// block's place in the capacity pays for the cached block revived),
    /// and adds one to `*lent` as it takes each: on return (or when a
    /// panic unwinds out of the call) the caller no longer holds
    /// `out[base - *lent..base]`, where `base` is the length of `out` on
    /// entry, and keeps the rest. The caller gives back what it no longer
    /// needs of the rest itself.
    ///
    /// The default lends nothing and calls `match_prefix` (its revivals
    /// are admitted as usual).
    fn match_prefix_lending(
        &self,
        by: &SequenceCall<'_>,
        keys: &[BlockHash],
        out: &mut Vec<BlockId>,
        lendable: usize,
        lent: &mut usize,
    ) -> usize {
        let _ = (lendable, lent);
        self.match_prefix(by, keys, out)
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
    fn publish(&self, by: &SequenceCall<'_>, blocks: &[BlockId], keys: &[BlockHash]) -> usize {
        let _ = (by, blocks, keys);
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
        by: &SequenceCall<'_>,
        parent: Option<&BlockHash>,
        blocks: &[BlockId],
        keys: &[BlockHash],
    ) -> usize {
        let _ = parent;
        self.publish(by, blocks, keys)
    }

    /// Drops the key of `id` if the caller is its only holder, so that the
    /// caller may write into it (a truncate into a cached block). A block
    /// that another holder shares keeps its key; writing into it takes a
    /// copy. The default does nothing (no block is ever cached).
    fn uncache_if_sole(&self, by: &SequenceCall<'_>, id: BlockId) {
        let _ = (by, id);
    }

    /// Keeps the caller's references to `ids` until `fence` completes (for
    /// `BlockPool`, [`BlockPool::complete`](crate::BlockPool::complete)),
    /// and returns how many references that is (`ids.len()`): until then
    /// the blocks count as used and are never handed out, whatever else is
    /// released. An empty list retires nothing and returns 0.
    fn retire(&self, by: &SequenceCall<'_>, fence: u64, ids: &[BlockId]) -> usize;

    /// [`retire`](Self::retire) of a table the caller gives up: an
    /// allocator that keeps lists per fence may keep the `Vec` itself
    /// (`BlockPool` does: no allocation per block). The default retires
    /// the slice.
    fn retire_owned(&self, by: &SequenceCall<'_>, fence: u64, ids: Vec<BlockId>) -> usize {
        self.retire(by, fence, &ids)
    }
}

/// Runs `alloc`, an allocation of `n` blocks that appends their ids to
/// `out`, and holds the allocator to all or nothing: it appended `n` ids
/// if it succeeded, none if it failed. A `BlockPool`'s allocations are
/// not checked (theirs are the crate's own, tested): for a sequence over
/// one the check compiles away.
///
/// # Panics
///
/// If the allocator broke that rule, with `out` as it was: the ids of a
/// success that appended too few or too many are given back first (they
/// carry the caller's references), those of a failure are dropped from
/// `out` only (a failure took nothing). An allocator that removed ids
/// from `out` cannot be undone: the panic says so, and `out` stays short.
#[inline]
pub(crate) fn checked_alloc<A: BlockAllocator + ?Sized>(
    pool: &A,
    n: usize,
    out: &mut Vec<BlockId>,
    alloc: impl FnOnce(&A, &mut Vec<BlockId>) -> Result<(), ReserveError>,
) -> Result<(), ReserveError> {
    if pool.as_block_pool(seal::Pool(())).is_some() {
        return alloc(pool, out);
    }
    let before = out.len();
    let result = alloc(pool, out);
    let expected = if result.is_ok() { n } else { 0 };
    if out.len().checked_sub(before) != Some(expected) {
        not_all_or_nothing(pool, n, before, out, result.is_ok());
    }
    result
}

/// The panic of [`checked_alloc`].
#[cold]
#[inline(never)]
fn not_all_or_nothing<A: BlockAllocator + ?Sized>(
    pool: &A,
    n: usize,
    before: usize,
    out: &mut Vec<BlockId>,
    ok: bool,
) -> ! {
    let Some(appended) = out.len().checked_sub(before) else {
        panic!(
            "a BlockAllocator's allocation of {n} blocks removed {} ids from the list it was \
             to append to",
            before - out.len()
        );
    };
    let taken: Vec<BlockId> = out.drain(before..).collect();
    if ok {
        pool.release(&SequenceCall::new(), &taken);
    }
    panic!(
        "a BlockAllocator broke all or nothing: asked for {n} blocks, it {} and appended \
         {appended} ids",
        if ok { "succeeded" } else { "failed" }
    );
}

/// `BlockPool`'s sealed calls with bad ids: only the crate can make them
/// (outside code has no token), so their checks are tested here.
#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
mod tests {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use std::sync::Arc;

    use super::{BlockAllocator, SequenceCall};
    use crate::{hash_blocks, BlockId, BlockPool, Sequence};

    /// Every block's count, the free and used counts, and the layers'.
    fn snap(pool: &BlockPool) -> (Vec<Option<usize>>, usize, usize, usize, usize) {
        let refs = (0..pool.num_blocks() as u32 + 1)
            .map(|i| pool.ref_count(BlockId::new(i)))
            .collect();
        (
            refs,
            pool.free_blocks(),
            pool.used_blocks(),
            pool.cached_blocks(),
            pool.pending_release_blocks(),
        )
    }

    /// Each call given a held block and then an id it never handed out: a
    /// panic naming the id, before anything changed.
    #[test]
    fn a_sealed_call_with_an_id_out_of_range_changes_nothing() {
        let pool = Arc::new(BlockPool::builder(4, 4).prefix_cache(true).build().unwrap());
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(8).unwrap();
        let held = seq.blocks()[0];
        let bad = [held, BlockId::new(4)];
        let mut keys = Vec::new();
        hash_blocks(b"", &[1; 8], 4, &mut keys);
        let before = snap(&pool);
        let by = SequenceCall::new();
        let p: &BlockPool = &pool;
        type Call<'a> = (&'a str, Box<dyn Fn() -> usize + 'a>);
        let calls: [Call; 9] = [
            (
                "add_refs",
                Box::new(|| BlockAllocator::add_refs(p, &by, &bad)),
            ),
            (
                "release",
                Box::new(|| {
                    BlockAllocator::release(p, &by, &bad);
                    0
                }),
            ),
            (
                "publish",
                Box::new(|| BlockAllocator::publish(p, &by, &bad, &keys)),
            ),
            (
                "publish_after",
                Box::new(|| BlockAllocator::publish_after(p, &by, Some(&keys[0]), &bad, &keys)),
            ),
            (
                "retire",
                Box::new(|| BlockAllocator::retire(p, &by, 1, &bad)),
            ),
            (
                "retire_owned",
                Box::new(|| BlockAllocator::retire_owned(p, &by, 1, bad.to_vec())),
            ),
            (
                "uncache_if_sole",
                Box::new(|| {
                    BlockAllocator::uncache_if_sole(p, &by, bad[1]);
                    0
                }),
            ),
            (
                "needs_copy",
                Box::new(|| usize::from(BlockAllocator::needs_copy(p, bad[1]))),
            ),
            (
                "release of id u32::MAX",
                Box::new(|| {
                    BlockAllocator::release(p, &by, &[held, BlockId::new(u32::MAX)]);
                    0
                }),
            ),
        ];
        for (name, call) in calls {
            let panic = catch_unwind(AssertUnwindSafe(call)).expect_err(name);
            let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(msg.contains("is out of range"), "{name}: {msg}");
            assert_eq!(snap(&pool), before, "{name} changed the pool");
        }
        drop(seq);
        assert_eq!(pool.free_blocks(), 4);
    }

    /// The calls' documented "nothing" outcomes, which change nothing: an
    /// empty list, a block already cached, no key.
    #[test]
    fn a_sealed_call_with_nothing_to_do_changes_nothing() {
        let pool = Arc::new(BlockPool::builder(4, 4).prefix_cache(true).build().unwrap());
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(8).unwrap();
        let mut keys = Vec::new();
        hash_blocks(b"", &[1; 8], 4, &mut keys);
        assert_eq!(seq.publish(&keys), 2);
        let before = snap(&pool);
        let by = SequenceCall::new();
        let p: &BlockPool = &pool;
        let mut out = Vec::new();
        assert_eq!(BlockAllocator::add_refs(p, &by, &[]), 0);
        BlockAllocator::release(p, &by, &[]);
        assert_eq!(BlockAllocator::publish(p, &by, &[], &keys), 0);
        assert_eq!(
            BlockAllocator::publish_after(p, &by, None, seq.blocks(), &keys),
            0
        );
        assert_eq!(BlockAllocator::match_prefix(p, &by, &[], &mut out), 0);
        assert_eq!(BlockAllocator::retire(p, &by, 1, &[]), 0);
        assert_eq!(BlockAllocator::retire_owned(p, &by, 1, Vec::new()), 0);
        assert!(out.is_empty());
        assert_eq!(snap(&pool), before);
        assert_eq!(format!("{by:?}"), "SequenceCall { group: None }");
        assert_eq!(SequenceCall::in_group(3).group(), Some(3));
        assert_eq!(by.group(), None);
    }

    /// A call is straight to a pool when the sequence's allocator is that
    /// pool, also behind a trait object; not when it is another pool, or
    /// no allocator was named. (Forwarders, one of them the pool's bytes
    /// exactly: `tests/forwarded_publish.rs`.)
    #[test]
    fn a_call_is_straight_only_to_the_pool_itself() {
        let pool = BlockPool::new(4, 1);
        let other = BlockPool::new(4, 1);
        let dyn_pool: &dyn BlockAllocator = &pool;
        assert!(SequenceCall::new().straight_to(&pool).is_straight_to(&pool));
        assert!(SequenceCall::in_group(1)
            .straight_to(dyn_pool)
            .is_straight_to(&pool));
        assert!(!SequenceCall::new()
            .straight_to(&other)
            .is_straight_to(&pool));
        assert!(!SequenceCall::new().is_straight_to(&pool));
    }
}
