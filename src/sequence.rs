//! [`Sequence`]: one sequence's block table over a shared
//! [`BlockPool`] (or any [`BlockAllocator`]), mapping its token positions to
//! flat KV-cache slots. Forks share full blocks; an append into a shared
//! partly filled tail copies it on write (see [`crate::implementation`],
//! "Sequences").

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use crate::allocator::{checked_alloc, BlockAllocator, SequenceCall};
use crate::error::{PositionError, ReserveError};
use crate::hash::BlockHash;
use crate::id::BlockId;
use crate::pool::{Alloc, BlockPool, Holder};
use crate::table;
use crate::wait::Unwound;

/// A device copy the caller must make: the first `tokens` slots of block
/// `src` into block `dst` (a fork's private tail, or a copy-on-write).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use kvslots::{BlockPool, Sequence};
///
/// let mut parent = Sequence::new(Arc::new(BlockPool::new(8, 4)));
/// parent.try_append(6).unwrap(); // one full block, one with 2 tokens
/// let (child, copy) = parent.try_fork().unwrap();
/// let copy = copy.unwrap();
/// assert_eq!(copy.src, parent.blocks()[1]);
/// assert_eq!(copy.dst, child.blocks()[1]);
/// assert_eq!(copy.tokens, 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    /// The block to copy from.
    pub src: BlockId,
    /// The block to copy into.
    pub dst: BlockId,
    /// How many leading token slots to copy.
    pub tokens: usize,
}

/// One sequence's block table: its length in tokens and the blocks that
/// hold them, in order.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use kvslots::{BlockPool, Sequence};
///
/// let pool = Arc::new(BlockPool::new(8, 16));
/// let mut seq = Sequence::new(Arc::clone(&pool));
/// // A 20-token prefill takes two blocks, all or nothing.
/// assert_eq!(seq.try_append(20).unwrap(), 0..20);
/// assert_eq!(seq.blocks().len(), 2);
/// // Where token 17 goes in the flat KV cache:
/// let slot = seq.slot(17).unwrap();
/// assert_eq!(slot, seq.blocks()[1].index() * 16 + 1);
/// drop(seq);
/// assert_eq!(pool.free_blocks(), 8);
/// ```
///
/// # Allocators
///
/// `Sequence` is `Sequence<A = BlockPool>`: its blocks come from a
/// [`BlockPool`] unless another [`BlockAllocator`] is named. Every method
/// works over any allocator, except the async [`reserve`](Self::reserve),
/// which waits in the `BlockPool`'s queue (over another allocator, wait
/// with [`reserve_blocking`](Self::reserve_blocking)).
///
/// # Memory ordering
///
/// A sequence is a plain `Send` value, used by one thread at a time; its
/// blocks follow the pool's rule (see [`BlockPool`]): what a sequence's
/// thread did with a block before the sequence gave it back happens-before
/// the block's next owner gets it.
///
/// It is not `Sync`: even the calls that take `&self` and write the pool
/// ([`try_fork`](Self::try_fork), which counts the references of the
/// sequence's fresh blocks before sharing them) rely on no other thread
/// calling the sequence meanwhile. Share a sequence between threads behind
/// a lock, or fork it and send the child:
///
/// ```compile_fail
/// fn shared_by_threads<T: Sync>() {}
/// shared_by_threads::<kvslots::Sequence>();
/// ```
///
/// ```
/// fn sent_to_a_thread<T: Send>() {}
/// sent_to_a_thread::<kvslots::Sequence>();
/// ```
pub struct Sequence<A: BlockAllocator + ?Sized = BlockPool> {
    pool: Arc<A>,
    /// The pool's block size, read once: it never changes, and a call
    /// that reads it again cannot be cut short by an allocator's
    /// `block_size` that unwinds.
    pub(crate) bs: usize,
    pub(crate) blocks: Vec<BlockId>,
    pub(crate) len: usize,
    /// The block a copy-on-write replaced: its reference is kept until the
    /// next successful non-empty append, shortening truncate or drop, so the
    /// caller's device copy can still read it even if every other holder
    /// lets go.
    pub(crate) retired: Option<BlockId>,
    /// Whether the partly filled last block may be shared. Forks share only
    /// full blocks, so a partly filled tail is ours alone unless `truncate`
    /// went back into a block that was once full; only then does an append
    /// read the block's reference count.
    pub(crate) tail_may_be_shared: bool,
    /// How many leading table entries are [`BlockId::NULL`]: blocks a
    /// sliding window gave back (only in a
    /// [`HybridSequence`](crate::HybridSequence)'s tables; 0 otherwise).
    pub(crate) null: usize,
    /// How many entries at the front of the table `try_match_prefix` took
    /// into an empty table (at most the table's length; a hybrid match's
    /// null entries count); 0 after a match into a reservation, which was
    /// the sequence's admission. A sequence that holds no block beyond
    /// them is new work, not a running sequence: its allocations are new
    /// admissions, which leave the queued waiters what they are owed.
    pub(crate) matched: usize,
    /// How many entries at the front of the table are known to hold a key
    /// (null entries aside): blocks this sequence matched, or that a
    /// `publish` left cached (as `SequenceCall::keyed` says). A block we
    /// hold keeps its key until our own truncate into it drops it, which
    /// lowers this; so `publish` starts here, and a decode step that
    /// publishes its full blocks walks only the new ones.
    pub(crate) published: usize,
    /// Not `Sync` (see above); `Send` as before.
    pub(crate) single_thread: PhantomData<Cell<()>>,
}

impl<A: BlockAllocator + ?Sized> Sequence<A> {
    /// An empty sequence over `pool`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// let seq = kvslots::Sequence::new(Arc::new(kvslots::BlockPool::new(8, 16)));
    /// assert!(seq.is_empty());
    /// ```
    pub fn new(pool: Arc<A>) -> Sequence<A> {
        Sequence::with_capacity(pool, 0)
    }

    /// An empty sequence whose block table has room for `tokens` tokens
    /// without reallocating (so that appends up to that length allocate no
    /// heap memory).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// let pool = Arc::new(kvslots::BlockPool::new(8, 16));
    /// let seq = kvslots::Sequence::with_capacity(pool, 100);
    /// assert!(seq.is_empty());
    /// ```
    pub fn with_capacity(pool: Arc<A>, tokens: usize) -> Sequence<A> {
        // A sequence's table holds each of its blocks once, so never more
        // entries than the pool has blocks; one spare entry lets a
        // copy-on-write append pass its new block through the table
        // without reallocating. (A sliding window's table in a
        // `HybridSequence` also keeps a null entry for each block the
        // window has passed: the hybrid sequence sizes it.)
        let bs = pool.block_size();
        let blocks = Vec::with_capacity(table::entries(tokens, bs, pool.num_blocks()));
        Sequence::with_table(pool, bs, blocks)
    }

    /// An empty sequence over `pool`, whose blocks hold `bs` tokens (the
    /// pool's block size), with `blocks` as its table: an empty list,
    /// whose capacity is the room set aside for the table.
    pub(crate) fn with_table(pool: Arc<A>, bs: usize, blocks: Vec<BlockId>) -> Sequence<A> {
        debug_assert!(blocks.is_empty());
        Sequence {
            pool,
            bs,
            blocks,
            len: 0,
            retired: None,
            tail_may_be_shared: false,
            null: 0,
            matched: 0,
            published: 0,
            single_thread: PhantomData,
        }
    }

    /// The number of tokens in the sequence.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// let mut seq = kvslots::Sequence::new(Arc::new(kvslots::BlockPool::new(8, 16)));
    /// seq.try_append(5).unwrap();
    /// assert_eq!(seq.len(), 5);
    /// ```
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the sequence holds no token.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// let seq = kvslots::Sequence::new(Arc::new(kvslots::BlockPool::new(8, 16)));
    /// assert!(seq.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The block table: the blocks holding positions `0..len()`, in order,
    /// followed by any blocks reserved with [`try_reserve`](Self::try_reserve).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// let mut seq = kvslots::Sequence::new(Arc::new(kvslots::BlockPool::new(8, 16)));
    /// seq.try_append(17).unwrap();
    /// assert_eq!(seq.blocks().len(), 2);
    /// ```
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// The pool the blocks come from.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// let pool = Arc::new(kvslots::BlockPool::new(8, 16));
    /// let seq = kvslots::Sequence::new(Arc::clone(&pool));
    /// assert!(Arc::ptr_eq(seq.pool(), &pool));
    /// ```
    pub fn pool(&self) -> &Arc<A> {
        &self.pool
    }

    /// Appends `n` tokens: takes exactly the new blocks they need, all or
    /// none, and returns their positions `old_len..old_len + n`. `n == 0`
    /// returns an empty range and takes nothing. No heap allocation happens
    /// here beyond growing the block table.
    ///
    /// A sequence that never truncates into a block it shares (with a
    /// fork, or with a sequence that matched it through the prefix cache)
    /// or that stays cached never needs a copy-on-write, and appends with
    /// this. After such a truncate, append with
    /// [`try_append_cow`](Self::try_append_cow), which returns the device
    /// copy to make. (A truncate into a cached block that this sequence
    /// holds alone drops the block's key instead, and needs no copy; see
    /// [`truncate`](Self::truncate).)
    ///
    /// # Panics
    ///
    /// Panics, before changing anything, if `n > 0` and the last block is
    /// partly filled and shared or cached: that append needs a device
    /// copy, which only [`try_append_cow`](Self::try_append_cow) can hand
    /// back.
    ///
    /// # Errors
    ///
    /// The pool's [`ReserveError`], counted in blocks:
    ///
    /// * `NeverFits` if the new blocks can never fit beside the blocks this
    ///   sequence holds (more than `num_blocks()` less those, e.g. `n ==
    ///   usize::MAX`), with that rest of the pool as the capacity (a block
    ///   for the copy of a shared tail is not counted there: it is not
    ///   needed once the tail's other holders let go, so without room for
    ///   it the append is `Full`); its `requested` is every block the
    ///   append takes, the copy's included, as `Full`'s is;
    /// * `Full` if not enough blocks are free now;
    /// * `BehindWaiters` for the first append of a sequence that holds no
    ///   block beyond the prefix it matched with no reservation (an empty
    ///   one, or a new request whose prompt hit the prefix cache: a new
    ///   admission) when the blocks are free but owed to queued waiters;
    ///   the append of a sequence that holds a block beyond its matched
    ///   prefix, or that matched into a reservation (its admission) and
    ///   holds a block, is growth, which takes free blocks even while
    ///   others wait;
    /// * `Closed` after [`BlockPool::close`].
    ///
    /// On error nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, Sequence};
    ///
    /// let mut seq = Sequence::new(Arc::new(BlockPool::new(2, 4)));
    /// assert_eq!(seq.try_append(3).unwrap(), 0..3);
    /// assert_eq!(seq.try_append(5).unwrap(), 3..8);
    /// assert!(seq.try_append(1).is_err()); // would need a third block
    /// assert_eq!(seq.len(), 8);
    /// ```
    pub fn try_append(&mut self, n: usize) -> Result<Range<usize>, ReserveError> {
        self.append(n, false).map(|(range, _)| range)
    }

    /// Appends `n` tokens as [`try_append`](Self::try_append) does, and
    /// returns the copy-on-write the append needed, if any: `Some` only when
    /// the last block was partly filled and shared with a fork or a
    /// matcher, or cached (after truncating into a shared or published
    /// block). A cached block is never written while its key can match:
    /// the copy gets the new tokens, and the cached block keeps its key. The caller must copy `tokens`
    /// slots from `src` to `dst` before the kernel writes the new tokens;
    /// the sequence keeps its reference to `src` until its next append of at
    /// least one token that succeeds, its next truncate that shortens it, or
    /// its drop, so the copy can still read it.
    ///
    /// # Errors
    ///
    /// As [`try_append`](Self::try_append); on error nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, Sequence};
    ///
    /// let mut seq = Sequence::new(Arc::new(BlockPool::new(8, 4)));
    /// seq.try_append(8).unwrap();
    /// let (child, _) = seq.try_fork().unwrap(); // shares both full blocks
    /// seq.truncate(6); // back into the shared second block
    /// let (range, copy) = seq.try_append_cow(1).unwrap();
    /// assert_eq!(range, 6..7);
    /// let copy = copy.unwrap();
    /// assert_eq!((copy.src, copy.tokens), (child.blocks()[1], 2));
    /// assert_ne!(seq.blocks()[1], child.blocks()[1]);
    /// ```
    #[must_use = "a returned BlockCopy is a device copy the caller must make"]
    pub fn try_append_cow(
        &mut self,
        n: usize,
    ) -> Result<(Range<usize>, Option<BlockCopy>), ReserveError> {
        self.append(n, true)
    }

    /// The body of both appends; one without `cow_allowed` panics, before
    /// changing anything, where a copy is needed. (The plan asks the
    /// allocator once whether the tail needs a copy, and that answer is
    /// the one both the panic and the append follow.) Inlined into each,
    /// so that `try_append` builds no copy it drops.
    #[inline(always)]
    fn append(
        &mut self,
        n: usize,
        cow_allowed: bool,
    ) -> Result<(Range<usize>, Option<BlockCopy>), ReserveError> {
        let old_len = self.len;
        if n == 0 {
            return Ok((old_len..old_len, None));
        }
        if self.fits_in_place(n) {
            self.len = old_len + n;
            return Ok((old_len..self.len, None));
        }
        let (total, new_blocks, cow) = self.plan_append(n);
        assert!(
            cow_allowed || !cow,
            "Sequence::try_append: the last block is shared (with a fork or a match) or cached, and must be \
             copied before it is written; append with Sequence::try_append_cow, which \
             returns the BlockCopy to make"
        );
        // Nothing new needed? Then nothing to admit: the append only fills
        // blocks we hold (also on a closed pool, so workers can drain).
        if total > 0 {
            // Only the new blocks can never come: a copy of a shared tail
            // is not needed any more once its other holders let go.
            self.never_fits_beside_own(total, new_blocks, 0)?;
            // A sequence that holds blocks beyond a matched prefix (or
            // matched into a reservation) is running: its growth does not
            // wait behind queued admissions; an empty one, or one that
            // holds only what it matched with no reservation, is a new
            // admission.
            let running = self.is_running();
            checked_alloc(&*self.pool, total, &mut self.blocks, |pool, out| {
                if running {
                    pool.try_alloc_growth(&SequenceCall::new(), total, out)
                } else {
                    pool.try_alloc_with_headroom(&SequenceCall::new(), total, 0, out)
                }
            })?;
        }
        Ok(self.commit_append(n, cow))
    }

    /// Whether an append of `n` tokens is a decode step's usual case,
    /// which only sets the length: the tokens fit in the blocks held, and
    /// no copy is pending or needed (`tail_may_be_shared` false, nothing
    /// retired). What `commit_append` does then, without planning.
    pub(crate) fn fits_in_place(&self, n: usize) -> bool {
        if self.tail_may_be_shared || self.retired.is_some() {
            return false;
        }
        let room = self
            .blocks
            .len()
            .checked_mul(self.bs)
            .and_then(|slots| slots.checked_sub(self.len));
        room.is_some_and(|room| n <= room)
    }

    /// What an append of `n > 0` tokens takes: how many blocks in all
    /// (those the tokens need, and one for the copy of a partly filled
    /// tail that is shared or cached, unless a reserved block the tokens
    /// leave unused takes the copy), how many of those the tokens need,
    /// and whether it copies the tail.
    pub(crate) fn plan_append(&self, n: usize) -> (usize, usize, bool) {
        let (new_blocks, spare) = self.blocks_for(n);
        // Is the last block partly filled and shared? Then it needs a
        // private copy before we write into it: into a reserved block that
        // these tokens leave unused, if there is one, else a new one.
        let cow = self.tail_needs_copy();
        (
            new_blocks.saturating_add(usize::from(cow && spare == 0)),
            new_blocks,
            cow,
        )
    }

    /// The blocks this sequence's table holds: its entries but the null
    /// ones (a copy-on-write source it keeps apart).
    pub(crate) fn in_table(&self) -> usize {
        self.blocks.len() - self.null
    }

    /// The rest of an append of `n > 0` tokens planned by
    /// [`plan_append`](Self::plan_append), once the blocks it takes are at
    /// the end of the table.
    pub(crate) fn commit_append(
        &mut self,
        n: usize,
        cow: bool,
    ) -> (Range<usize>, Option<BlockCopy>) {
        // The caller's previous copy (if any) is done by now: its source
        // goes first. A waker's panic out of that give-back leaves the
        // append undone, its new blocks reserved in the table (the next
        // append plans it again), so no copy to make is lost.
        self.release_retired();
        let (positions, copy, _) = self.commit_append_keeping(n, cow);
        (positions, copy)
    }

    /// [`commit_append`](Self::commit_append) but for the give-back of the
    /// previous copy's source, which it returns: the caller gives it back
    /// once its own books are whole (a waker's panic can come out of a
    /// give-back).
    pub(crate) fn commit_append_keeping(
        &mut self,
        n: usize,
        cow: bool,
    ) -> (Range<usize>, Option<BlockCopy>, Option<BlockId>) {
        let old_len = self.len;
        let (tail_index, tail) = table::tail(old_len, self.bs);
        // The caller's previous copy (if any) is done by now.
        let done = self.retired.take();
        // `total` blocks fitted in the pool, so the new length fits in its
        // `num_blocks * block_size` slots, which fit in usize.
        self.len = old_len + n;
        // The tail is ours alone now: checked, copied, or a new block.
        self.tail_may_be_shared = false;
        let copy = cow.then(|| {
            // Put the last block (new, or reserved and unused) in place of
            // the shared tail.
            let dst = self.blocks.pop().expect("a new or spare block");
            let src = std::mem::replace(&mut self.blocks[tail_index], dst);
            self.retired = Some(src);
            BlockCopy {
                src,
                dst,
                tokens: tail,
            }
        });
        (old_len..self.len, copy, done)
    }

    /// Makes sure the table holds blocks for `tokens` more tokens, taking the
    /// missing ones all or none, without changing [`len`](Self::len): the
    /// later appends of those tokens then allocate nothing. This is how a
    /// scheduler admits a whole prompt and then prefills it in chunks.
    ///
    /// The new blocks are taken only if `headroom` blocks stay free
    /// afterwards (the admission watermark; pass 0 for none). Reserved
    /// blocks follow the filled ones in [`blocks`](Self::blocks), are never
    /// shared by a fork, and are given back by a
    /// [`truncate`](Self::truncate) that shortens the sequence, by
    /// [`shrink_to_fit`](Self::shrink_to_fit) and on drop.
    ///
    /// `tokens == 0` takes nothing, and so do tokens that already fit, with
    /// one exception: if the sequence was truncated into a block it shares
    /// with a fork, one block is also kept for the copy-on-write that the
    /// first append will make (see [`try_append_cow`](Self::try_append_cow)).
    ///
    /// # Errors
    ///
    /// As [`BlockPool::try_alloc_with_headroom`], counted in blocks (a
    /// reservation is a new admission: `BehindWaiters` while the blocks are
    /// owed to queued waiters, also for a sequence that holds blocks),
    /// except that `NeverFits` also covers what can never fit beside the
    /// blocks this sequence holds: `missing + headroom` more than
    /// `num_blocks()` less those, which is the error's capacity. On error
    /// nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(8, 16));
    /// let mut seq = Sequence::new(Arc::clone(&pool));
    /// // Admit a 40-token prompt (3 blocks) only if 2 blocks stay free.
    /// seq.try_reserve(40, 2).unwrap();
    /// assert_eq!((seq.len(), seq.capacity(), pool.used_blocks()), (0, 48, 3));
    /// // Prefill it in chunks of 16: no further allocation.
    /// for _ in 0..2 {
    ///     seq.try_append(16).unwrap();
    /// }
    /// seq.try_append(8).unwrap();
    /// assert_eq!(pool.used_blocks(), 3);
    /// // 6 more blocks would leave fewer than 2 free:
    /// assert!(seq.try_reserve(8 + 6 * 16, 2).is_err());
    /// ```
    pub fn try_reserve(&mut self, tokens: usize, headroom: usize) -> Result<(), ReserveError> {
        let missing = self.missing_for(tokens);
        if missing == 0 {
            return Ok(());
        }
        self.never_fits_beside_own(missing, missing, headroom)?;
        checked_alloc(&*self.pool, missing, &mut self.blocks, |pool, out| {
            pool.try_alloc_with_headroom(&SequenceCall::new(), missing, headroom, out)
        })
    }

    /// [`try_reserve`](Self::try_reserve), sleeping in the pool's queue
    /// until the missing blocks (with `headroom` free besides) are granted,
    /// for at most `timeout` (`None`: no limit). See
    /// [`reserve`](Self::reserve) for the rule and
    /// [`BlockPool::alloc_blocking`] for the wait.
    ///
    /// # Errors
    ///
    /// `NeverFits` (at once, as for [`reserve`](Self::reserve)), `Closed`,
    /// or, when `timeout` runs out, `Full` or `BehindWaiters` (see
    /// [`BlockPool::alloc_blocking`]); on error the sequence is unchanged.
    ///
    /// # Deadlocks
    ///
    /// As for [`BlockPool::alloc_blocking`]: with no `timeout`, a thread
    /// that waits for blocks only it can give back sleeps for ever. This
    /// sequence's own copy-on-write source is one: a reservation that fits
    /// the pool only once the source is free is `Full`, not `NeverFits`,
    /// so it waits; call [`retire_copy_source`](Self::retire_copy_source)
    /// (and complete its fence) first.
    ///
    /// # Panics
    ///
    /// If the waker of an async waiter that this call wakes panics: its
    /// queueing, and its leaving the queue when `timeout` runs out, can
    /// grant the waiters behind it, whose wakers then run on this thread.
    /// The panic comes once every other waker has run, with nothing held
    /// by this call (see [Waiting](crate::implementation#waiting)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use kvslots::{BlockPool, ReserveError, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(4, 16));
    /// let mut first = Sequence::new(Arc::clone(&pool));
    /// first.reserve_blocking(48, 0, None).unwrap(); // 3 blocks
    /// let mut second = Sequence::new(Arc::clone(&pool));
    /// assert_eq!(
    ///     second.reserve_blocking(32, 0, Some(Duration::from_millis(1))),
    ///     Err(ReserveError::Full { requested: 2, available: 1 })
    /// );
    /// drop(first);
    /// second.reserve_blocking(32, 0, None).unwrap();
    /// ```
    pub fn reserve_blocking(
        &mut self,
        tokens: usize,
        headroom: usize,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError> {
        let missing = self.missing_for(tokens);
        if missing == 0 {
            return Ok(());
        }
        self.never_fits_beside_own(missing, missing, headroom)?;
        checked_alloc(&*self.pool, missing, &mut self.blocks, |pool, out| {
            pool.alloc_with_headroom_blocking(&SequenceCall::new(), missing, headroom, out, timeout)
        })
    }

    /// `NeverFits` for a call that asks for `asked` blocks, of which
    /// `needed` can never be taken beside the blocks in this sequence's
    /// table with `headroom` free besides: those stay held while it asks,
    /// so the rest of the pool is all it can ever get, and is the error's
    /// capacity. A copy-on-write source the sequence keeps is not counted:
    /// the caller gives it back once the copy is made
    /// ([`retire_copy_source`](Self::retire_copy_source)), so a request
    /// short only of it is `Full`, which may fit later. (`Closed` wins
    /// after `close`.)
    fn never_fits_beside_own(
        &self,
        asked: usize,
        needed: usize,
        headroom: usize,
    ) -> Result<(), ReserveError> {
        let room = self.pool.num_blocks().saturating_sub(self.in_table());
        if needed.saturating_add(headroom) <= room {
            return Ok(());
        }
        if self.pool.is_closed() {
            return Err(ReserveError::Closed);
        }
        Err(ReserveError::NeverFits {
            requested: asked,
            capacity: room,
        })
    }

    /// How many blocks [`try_reserve`](Self::try_reserve) must add for
    /// `tokens` more tokens.
    pub(crate) fn missing_for(&self, tokens: usize) -> usize {
        if tokens == 0 {
            return 0;
        }
        let (new_blocks, spare) = self.blocks_for(tokens);
        // A shared tail will need a private copy at the first append: keep a
        // block for it too, so that the appends allocate nothing.
        let copy = usize::from(spare == 0 && self.tail_needs_copy());
        new_blocks.saturating_add(copy)
    }

    /// For `n` more tokens: how many blocks must be added to the table, and
    /// how many of the blocks it holds they would leave wholly unused.
    fn blocks_for(&self, n: usize) -> (usize, usize) {
        table::growth(self.len, self.blocks.len(), n, self.bs)
    }

    /// Whether an append of at least one token now needs a copy-on-write:
    /// the last block is partly filled and shared (with a fork, or with a
    /// sequence that matched it) or cached, which only happens after a
    /// [`truncate`](Self::truncate) into such a block. When it is `true`,
    /// [`try_append`](Self::try_append) would panic and
    /// [`try_append_cow`](Self::try_append_cow) returns the copy to make;
    /// when it is `false`, `try_append` does not panic.
    ///
    /// A snapshot of other holders: `true` can turn `false` when the other
    /// holders let go, but `false` stays `false` until this sequence
    /// itself forks or truncates (no one else can take a reference to a
    /// block that only this sequence holds and that is not cached). Reads
    /// one reference count at most; no heap allocation.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, Sequence};
    ///
    /// let mut seq = Sequence::new(Arc::new(BlockPool::new(8, 4)));
    /// seq.try_append(8).unwrap();
    /// let (child, _) = seq.try_fork().unwrap(); // shares both full blocks
    /// assert!(!seq.append_needs_copy()); // the next token opens a new block
    /// seq.truncate(6); // back into the shared second block
    /// assert!(seq.append_needs_copy());
    /// drop(child);
    /// assert!(!seq.append_needs_copy()); // no one else holds it now
    /// assert_eq!(seq.try_append(1).unwrap(), 6..7);
    /// ```
    pub fn append_needs_copy(&self) -> bool {
        self.tail_needs_copy()
    }

    /// Whether the last block is partly filled and shared (with a fork, or
    /// with a matcher) or cached, so that writing into it needs a private
    /// copy first. A cached block keeps its key while this sequence holds
    /// it (no one else can drop it), so the answer cannot change from
    /// cached to not cached under us.
    fn tail_needs_copy(&self) -> bool {
        let bs = self.bs;
        if !self.tail_may_be_shared || self.len % bs == 0 {
            return false;
        }
        let tail = self.blocks[self.len / bs];
        self.pool.needs_copy(tail)
    }

    /// Takes the longest prefix of `hashes` whose blocks are cached in the
    /// pool, one reference each, into this empty sequence: appends those
    /// `k` blocks to the table, sets [`len`](Self::len) to
    /// `k * block_size` and returns `k`.
    ///
    /// `hashes[i]` is the key of the prompt's block `i`, from
    /// [`hash_blocks`](crate::hash_blocks) with the pool's block size. A
    /// cached block that no one holds (evictable) stops being evictable,
    /// and taking it counts against the pool's capacity exactly as taking
    /// a free block does: when the pool is full,
    /// [closed](BlockPool::close), or its free blocks are owed to queued
    /// waiters (a revival is a new admission; see
    /// [Waiting](crate::implementation#waiting)), the match stops before
    /// it. A block that
    /// another sequence holds is shared without touching the capacity.
    ///
    /// A sequence that holds only reserved blocks (a
    /// [`try_reserve`](Self::try_reserve) or
    /// [`reserve_blocking`](Self::reserve_blocking) with no token yet)
    /// matches too: the `k` blocks matched take the place of its first `k`
    /// reserved blocks, which go back to the pool, and the rest stay
    /// reserved after them, so that [`capacity`](Self::capacity) stays at
    /// least what it was and the prompt's other tokens need no
    /// allocation. A reserved block pays for the revival of an evictable
    /// block (it goes back in its place), so a match into a reservation
    /// revives what is cached even when the pool's free blocks are owed
    /// to queued waiters: a request granted a reservation after waiting
    /// still gets its prefix (a [closed](BlockPool::close) pool still
    /// revives nothing). Blocks matched beyond the reservation are
    /// admitted as for an empty sequence. The reservation was the
    /// sequence's admission, so after a match into it the sequence is
    /// running while it holds a block, even when the match took the place
    /// of every reserved block: its appends (and its forks') are growth,
    /// which does not wait behind queued waiters. Emptied (a
    /// [`truncate`](Self::truncate) to 0), it is new work again; a
    /// [`shrink_to_fit`](Self::shrink_to_fit) that leaves the matched
    /// blocks leaves it admitted.
    ///
    /// On a sequence that holds tokens, or a copy-on-write source, this
    /// returns 0 and changes nothing. An empty `hashes` returns 0. Under
    /// contention it may match fewer blocks than are
    /// cached (a block evicted meanwhile is a miss); it never returns a
    /// block whose key is not the one asked for. The matched blocks are
    /// full and read-only: the next tokens go into new blocks. A sequence
    /// that holds only what it matched into an empty table is still new
    /// work: its next allocation (an append, a fork's, a reservation) is a
    /// new admission, which leaves queued waiters what they are owed (see
    /// [Waiting](crate::implementation#waiting)). No heap allocation
    /// happens here beyond growing the block table.
    ///
    /// A list of chained hashes never repeats a key; a list that does (not
    /// from `hash_blocks`: misuse) matches up to the first key equal to an
    /// earlier one, so the matched blocks are distinct and the table never
    /// outgrows the pool.
    ///
    /// # Performance
    ///
    /// In a pool of up to 131,072 blocks, a match's cost is linear in the
    /// number of blocks it matches: a lookup and a CAS per block, and a
    /// filter of the blocks taken on the stack (zeroed once a match passes
    /// 32 blocks: 4 KiB in a pool of up to 32,768 blocks, 16 KiB in a
    /// larger one) that tells a repeated key apart without a scan. In a
    /// larger pool, blocks whose ids differ by a multiple of 131,072 share
    /// the filter's bit, and each later one of them scans the blocks the
    /// match has taken: a match of many such blocks (every match of more
    /// than 131,072 blocks) can cost up to its length squared.
    ///
    /// # Memory ordering
    ///
    /// Whatever the publisher of a matched block wrote into it before
    /// [`publish`](Self::publish) happens-before this call returns.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{hash_blocks, BlockPool, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(8, 4));
    /// let prompt: Vec<u32> = (0..10).collect();
    /// let mut keys = Vec::new();
    /// hash_blocks(b"tenant", &prompt, 4, &mut keys); // 2 full blocks
    ///
    /// let mut first = Sequence::new(Arc::clone(&pool));
    /// assert_eq!(first.try_match_prefix(&keys), 0); // nothing cached yet
    /// first.try_append(prompt.len()).unwrap(); // prefill all 10 tokens
    /// assert_eq!(first.publish(&keys), 2);
    ///
    /// let mut second = Sequence::new(Arc::clone(&pool));
    /// assert_eq!(second.try_match_prefix(&keys), 2);
    /// assert_eq!(second.len(), 8); // prefill only the last 2 tokens
    /// assert_eq!(second.blocks(), &first.blocks()[..2]);
    ///
    /// // Reserved first (granted after a wait, say), then matched: the
    /// // 2 matched blocks replace 2 of the 3 reserved.
    /// let mut third = Sequence::new(Arc::clone(&pool));
    /// third.try_reserve(prompt.len(), 0).unwrap();
    /// assert_eq!(third.blocks().len(), 3);
    /// assert_eq!(third.try_match_prefix(&keys), 2);
    /// assert_eq!((third.len(), third.capacity()), (8, 12));
    /// assert_eq!(&third.blocks()[..2], &first.blocks()[..2]);
    /// assert_eq!(pool.used_blocks(), 4); // first's 3 and third's 1 reserved
    /// ```
    pub fn try_match_prefix(&mut self, hashes: &[BlockHash]) -> usize {
        if self.len != 0 || self.retired.is_some() || hashes.is_empty() {
            return 0;
        }
        // With `len == 0` every block in the table is reserved: held alone
        // (a fork shares only blocks that hold tokens), uncached, empty.
        let reserved = self.blocks.len();
        // Room for every block that can match (distinct blocks, so no more
        // than the pool has), and one more for a reservation's lent block
        // taken back (see `BlockAllocator::match_prefix_lending`), so that
        // the pushes below cannot allocate (or panic) halfway.
        self.blocks
            .reserve(hashes.len().min(self.pool.num_blocks()) + usize::from(reserved > 0));
        // The blocks matched are the table's however the match ends: a
        // waker's panic out of it (an admission for a revival, or the
        // give-back of what it admitted ahead; see "Wakers run after the
        // lock" in `crate::implementation`) is resumed once the sequence
        // counts them.
        let mut unwound = Unwound::new();
        let mut lent = 0;
        unwound.catch(|| {
            let call = SequenceCall::new();
            if reserved == 0 {
                self.pool.match_prefix(&call, hashes, &mut self.blocks);
            } else {
                self.pool.match_prefix_lending(
                    &call,
                    hashes,
                    &mut self.blocks,
                    reserved,
                    &mut lent,
                );
            }
        });
        let k = if reserved == 0 {
            self.blocks.len()
        } else {
            self.settle_reservation(reserved, lent, &mut unwound)
        };
        self.len = k * self.bs;
        self.tail_may_be_shared = false;
        // Into a reservation the sequence was admitted already: it stays
        // running whatever the match took (see `matched`).
        self.matched = if reserved == 0 { k } else { 0 };
        self.published = k;
        k
    }

    /// After a match into a reservation of `reserved` blocks, which lent
    /// the last `lent` of them to the pool (the table holds the reserved
    /// blocks, then the matched ones): drops the lent entries, gives back
    /// the reserved blocks that the matched ones replace (those past the
    /// first `reserved - k`), and moves the matched blocks to the front.
    /// Returns `k`, the blocks matched. A waker's panic out of the
    /// give-back goes to `unwound`, with the table whole.
    fn settle_reservation(&mut self, reserved: usize, lent: usize, unwound: &mut Unwound) -> usize {
        // An allocator that reports more than it was offered lent what it
        // was offered (a breach of its contract; the table stays whole).
        let lent = lent.min(reserved);
        let k = self.blocks.len().saturating_sub(reserved);
        let kept = reserved - lent;
        self.blocks.drain(kept..reserved);
        // The matched blocks stand for the first `k` reserved ones: the
        // capacity stays at least what it was. The lent blocks paid for
        // revivals, so `kept >= reserved - k` (an allocator that lent
        // more leaves fewer).
        let keep = reserved.saturating_sub(k).min(kept);
        if keep < kept {
            unwound.catch(|| {
                self.pool
                    .release(&SequenceCall::new(), &self.blocks[keep..kept]);
            });
            self.blocks.drain(keep..kept);
        }
        self.blocks.rotate_left(keep);
        k
    }

    /// Publishes the keys of this sequence's full blocks: makes `hashes[i]`
    /// the key of block `i` for every full block (`i < len() / block_size`
    /// and `i < hashes.len()`) that is not cached yet, and returns how many
    /// became cached. Extra hashes are ignored; an empty list publishes
    /// nothing.
    ///
    /// A key that another block already holds stays with that block (first
    /// wins) and this block stays uncached; so does a block already cached
    /// (under any key), and, rarely, a block whose key finds no room in the
    /// pool's index. Publish only committed tokens (never rejected draft
    /// tokens): a matcher may take the block as soon as it is published.
    /// A published block keeps its key until it is evicted (after its last
    /// holder lets go), dropped by
    /// [`BlockPool::reset_prefix_cache`], or dropped by a
    /// [`truncate`](Self::truncate) into it. No heap allocation happens
    /// here.
    ///
    /// The blocks the sequence knows hold their keys are not offered
    /// again: those it matched, and the leading blocks that an earlier
    /// publish found cached (by it, or before it by another holder, a
    /// fork's parent say). So a decode that publishes after every step
    /// walks only the blocks filled since. A block that stayed uncached
    /// (its key on another block, or no room in the index) is offered
    /// again by the next publish, with every block after it: a sequence
    /// whose prompt blocks lost their keys to another sequence's (two
    /// requests of one prompt admitted before either published) walks
    /// them at each publish while it holds them. Over an allocator other
    /// than `BlockPool`, a publish counts as knowing its blocks' keys only
    /// when it cached every one.
    ///
    /// # Memory ordering
    ///
    /// What this thread wrote into the blocks before publishing them
    /// happens-before any [`try_match_prefix`](Self::try_match_prefix) that
    /// returns them.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{hash_blocks, BlockPool, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(8, 4));
    /// let mut keys = Vec::new();
    /// hash_blocks(b"", &[7; 12], 4, &mut keys);
    /// let mut seq = Sequence::new(Arc::clone(&pool));
    /// seq.try_append(9).unwrap(); // 2 full blocks and 1 token
    /// assert_eq!(seq.publish(&keys), 2); // the third key has no full block
    /// assert_eq!(seq.publish(&keys), 0); // already cached
    /// assert_eq!(pool.cached_blocks(), 2);
    /// ```
    pub fn publish(&mut self, hashes: &[BlockHash]) -> usize {
        self.publish_in(None, hashes)
    }

    /// [`publish`](Self::publish) as the table of group `group` of a
    /// [`HybridSequence`](crate::HybridSequence) (`Some`), or as a
    /// sequence of its own (`None`).
    pub(crate) fn publish_in(&mut self, group: Option<usize>, hashes: &[BlockHash]) -> usize {
        let full = (self.len / self.bs).min(hashes.len());
        // Past the null entries (a sliding window's) and the blocks known
        // to hold their keys (see `published`).
        let from = self.null.max(self.published).min(full);
        // The first block's parent is the key of the block before it
        // (cached, or given back by a window).
        let parent = from.checked_sub(1).map(|p| &hashes[p]);
        let (blocks, hashes) = (&self.blocks[from..full], &hashes[from..full]);
        let call = group
            .map_or_else(SequenceCall::new, SequenceCall::in_group)
            .straight_to(&*self.pool);
        let cached = self.pool.publish_after(&call, parent, blocks, hashes);
        // The leading blocks that hold keys now, as the allocator noted
        // them (`BlockPool` does), or else all if it cached every one.
        let keyed = call
            .keyed(blocks)
            .unwrap_or(if cached == blocks.len() { cached } else { 0 });
        self.published = self.published.max(from + keyed);
        cached
    }

    /// How many tokens the blocks in the table can hold:
    /// `blocks().len() * block_size` (saturating at `usize::MAX`), at least
    /// [`len`](Self::len).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// let mut seq = kvslots::Sequence::new(Arc::new(kvslots::BlockPool::new(8, 16)));
    /// seq.try_append(17).unwrap();
    /// assert_eq!(seq.capacity(), 32);
    /// ```
    pub fn capacity(&self) -> usize {
        self.blocks.len().saturating_mul(self.bs)
    }

    /// The flat slot index of token `position`:
    /// `block.index() * block_size + position % block_size`, the slot
    /// mapping attention kernels take. `None` at or past [`len`](Self::len).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// let mut seq = kvslots::Sequence::new(Arc::new(kvslots::BlockPool::new(8, 4)));
    /// seq.try_append(6).unwrap();
    /// assert_eq!(seq.slot(5), Some(seq.blocks()[1].index() * 4 + 1));
    /// assert_eq!(seq.slot(6), None);
    /// ```
    pub fn slot(&self, position: usize) -> Option<usize> {
        if position >= self.len {
            return None;
        }
        let bs = self.bs;
        Some(self.blocks[position / bs].index() * bs + position % bs)
    }

    /// Appends the flat slot indices of `positions` to `out` (the slot
    /// mapping of a batch of new tokens), allocating nothing but `out`'s
    /// growth. An empty range appends nothing. `out` grows as
    /// [`Vec::reserve`] grows it (a panic past `isize::MAX` bytes, an
    /// abort when memory runs out); a caller that takes ranges it does not
    /// bound reserves first with [`Vec::try_reserve`] (the Python package
    /// does, for its `MemoryError`).
    ///
    /// # Errors
    ///
    /// [`PositionError`] (naming the range's last position) if the range
    /// reaches past [`len`](Self::len); `out` is then unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// let mut seq = kvslots::Sequence::new(Arc::new(kvslots::BlockPool::new(8, 4)));
    /// let new = seq.try_append(6).unwrap();
    /// let mut slots = Vec::new();
    /// seq.extend_slots(new, &mut slots).unwrap();
    /// assert_eq!(slots.len(), 6);
    /// assert_eq!(slots[5], seq.slot(5).unwrap());
    /// ```
    pub fn extend_slots(
        &self,
        positions: Range<usize>,
        out: &mut Vec<usize>,
    ) -> Result<(), PositionError> {
        if positions.is_empty() {
            return Ok(());
        }
        if positions.end > self.len {
            return Err(PositionError {
                position: positions.end - 1,
                len: self.len,
            });
        }
        let bs = self.bs;
        out.reserve(positions.len());
        let mut pos = positions.start;
        while pos < positions.end {
            let base = self.blocks[pos / bs].index() * bs;
            // Saturating: a sliding window's table can hold positions past
            // `num_blocks * block_size`, up to `usize::MAX`, whose block
            // ends past it.
            let block_end = (pos - pos % bs).saturating_add(bs);
            let end = block_end.min(positions.end);
            out.extend((pos % bs..pos % bs + (end - pos)).map(|off| base + off));
            pos = end;
        }
        Ok(())
    }

    /// Rolls the sequence back to `len` tokens (rejected speculative tokens,
    /// preemption) and gives back the blocks no longer needed, last block
    /// first; returns how many blocks left the table. A `len` at or past
    /// [`len`](Self::len) is a no-op. No heap allocation happens here.
    ///
    /// A cached block given back stays cached (evictable once no one holds
    /// it). If `len` ends inside a cached block that this sequence holds
    /// alone, that block's key is dropped here, so that the tokens written
    /// into it next never change a block that a key can match; if another
    /// sequence holds it too, it keeps its key and the next append copies
    /// it ([`try_append_cow`](Self::try_append_cow)).
    ///
    /// # Panics
    ///
    /// If the waker of an async waiter that the give-back grants panics
    /// (see [Waiting](crate::implementation#waiting)): the panic comes
    /// once the sequence is cut to `len` and the table's blocks are given
    /// back; a copy-on-write source it keeps then stays kept, as after
    /// [`try_append_cow`](Self::try_append_cow).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// let pool = Arc::new(kvslots::BlockPool::new(8, 4));
    /// let mut seq = kvslots::Sequence::new(Arc::clone(&pool));
    /// seq.try_append(4 + 5).unwrap(); // 1 verified block + 5 drafts
    /// assert_eq!(seq.truncate(6), 1); // 2 drafts accepted
    /// assert_eq!((seq.len(), seq.blocks().len()), (6, 2));
    /// assert_eq!(seq.truncate(100), 0);
    /// assert_eq!(pool.used_blocks(), 2);
    /// ```
    pub fn truncate(&mut self, len: usize) -> usize {
        self.truncate_with(len, None)
    }

    /// [`truncate`](Self::truncate) for a device step that may still read
    /// the blocks given back (asynchronous scheduling: the rollback of
    /// drafts that a step still in flight reads): the references of the
    /// blocks that leave the table, and that of a copy-on-write's source
    /// still kept, are given back only when
    /// [`BlockPool::complete(fence)`](BlockPool::complete) declares the
    /// step done. Until then those blocks count as used and are never
    /// handed out; [`BlockPool::pending_release_blocks`] counts them.
    /// Returns how many blocks left the table; a `len` at or past
    /// [`len`](Self::len) is a no-op. Every other rule of `truncate`
    /// holds: a cached block that leaves stays cached (evictable once its
    /// fence completes, if no one else holds it), and a cached tail this
    /// sequence holds alone loses its key. (A `BlockPool`'s retire wakes
    /// no waiter, so no waker's panic comes out of it; an allocator whose
    /// `retire` unwinds finds the table cut and the copy's source retired
    /// all the same, and its panic resumes after both.)
    ///
    /// The blocks that stay in the table are not fenced: the next append
    /// writes into the tail's free slots, which the caller's next step
    /// does after the one in flight on the same device stream. No heap
    /// allocation happens here beyond the fence's list and its entry in
    /// the pool's map of fences (one per fence, not per block).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(4, 4));
    /// let mut seq = Sequence::new(Arc::clone(&pool));
    /// let drafts = seq.try_append(4 + 8).unwrap(); // 1 block + 8 drafts
    /// // Step 3 verifies the drafts; none is accepted.
    /// assert_eq!(seq.truncate_fenced(4, 3), 2);
    /// assert_eq!((seq.len(), pool.used_blocks(), pool.free_blocks()), (4, 3, 1));
    /// assert!(seq.try_append(8).is_err()); // the 2 drafts' blocks wait for step 3
    /// assert_eq!(pool.complete(3), 2);
    /// assert_eq!(seq.try_append(8).unwrap(), 4..12);
    /// # let _ = drafts;
    /// ```
    pub fn truncate_fenced(&mut self, len: usize, fence: u64) -> usize {
        self.truncate_with(len, Some(fence))
    }

    /// The body of both truncates: the references given back go at once
    /// (`fence == None`) or when `fence` completes.
    fn truncate_with(&mut self, len: usize, fence: Option<u64>) -> usize {
        if len >= self.len {
            return 0;
        }
        let keep = table::blocks_for(len, self.bs);
        let freed = self.blocks.len() - keep.max(self.null);
        // Only whole blocks stay known to hold their keys: a cached tail
        // we hold alone loses its key below.
        self.published = self.published.min(len / self.bs);
        // A partly filled tail that was once full may be shared by a fork
        // or a matcher, or cached.
        let bs = self.bs;
        // Was the tail block ever full? (One that ends past `usize::MAX`,
        // in a sliding window's table, never was.)
        let was_full = (len - len % bs)
            .checked_add(bs)
            .is_some_and(|tail_end| self.len >= tail_end);
        self.tail_may_be_shared = len % bs != 0 && (self.tail_may_be_shared || was_full);
        self.len = len;
        // A cached tail will be written: if we hold it alone, its key goes
        // now, so no matcher can take it while it changes (and the next
        // append needs no copy). Shared, it keeps its key, and the next
        // append copies it.
        if self.tail_may_be_shared {
            self.pool
                .uncache_if_sole(&SequenceCall::new(), self.blocks[len / bs]);
        }
        // The give-backs last, the table's first: a waker's panic out of
        // one (see "Wakers run after the lock" in
        // `crate::implementation`) leaves the sequence whole, the table
        // cut and a copy-on-write source still kept.
        match fence {
            None => {
                self.give_back(keep);
                self.release_retired();
            }
            Some(fence) => {
                let from = keep.max(self.null);
                self.null = self.null.min(keep);
                self.matched = self.matched.min(keep);
                // The table is cut however the retire ends, as in
                // `give_back`: an allocator's `retire` that unwinds has
                // the blocks, which the table must not give back again.
                // The copy's source is retired all the same: kept, it
                // would go back unfenced at the next append.
                let mut unwound = Unwound::new();
                unwound.catch(|| {
                    let table = Cut {
                        blocks: &mut self.blocks,
                        keep,
                    };
                    self.pool
                        .retire(&SequenceCall::new(), fence, &table.blocks[from..]);
                });
                unwound.catch(|| {
                    self.retire_copy_source(fence);
                });
            }
        }
        freed
    }

    /// Hands the source of the last copy-on-write, which the sequence keeps
    /// for the caller's device copy (see
    /// [`try_append_cow`](Self::try_append_cow)), to `fence`: its reference
    /// is given back when [`BlockPool::complete(fence)`](BlockPool::complete)
    /// declares the step that makes the copy done, instead of at the
    /// sequence's next append. Returns 1 if there was such a block, else 0
    /// (and nothing changes). Call it after an append that returned a
    /// [`BlockCopy`], with the fence of the step that makes the copy.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(4, 4));
    /// let mut seq = Sequence::new(Arc::clone(&pool));
    /// seq.try_append(4).unwrap();
    /// let (child, _) = seq.try_fork().unwrap();
    /// seq.truncate(2); // into the block shared with the child
    /// let (_, copy) = seq.try_append_cow(1).unwrap();
    /// let src = copy.unwrap().src;
    /// assert_eq!(seq.retire_copy_source(6), 1);
    /// drop(child);
    /// assert_eq!(pool.ref_count(src), Some(1)); // step 6 still copies from it
    /// pool.complete(6);
    /// assert_eq!(pool.ref_count(src), Some(0));
    /// assert_eq!(seq.retire_copy_source(7), 0);
    /// ```
    pub fn retire_copy_source(&mut self, fence: u64) -> usize {
        match self.retired.take() {
            Some(id) => self.pool.retire(&SequenceCall::new(), fence, &[id]),
            None => 0,
        }
    }

    /// Gives the sequence up while a device step may still read its blocks
    /// (a completed or preempted request under asynchronous scheduling):
    /// its references (every block in its table, and a copy-on-write's
    /// source it still keeps) are given back only when
    /// [`BlockPool::complete(fence)`](BlockPool::complete) declares the
    /// step done, and returns how many references that is. Until then the
    /// blocks count as used and are never handed out; a cached block
    /// becomes evictable at the complete, as at a drop.
    ///
    /// The sequence's own block table is moved into the fence's list (or
    /// appended to it, if the fence has one already): no heap allocation
    /// per block. Works on a [closed](BlockPool::close) pool too.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, ReserveError, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(2, 16));
    /// let mut seq = Sequence::new(Arc::clone(&pool));
    /// seq.try_append(32).unwrap();
    /// assert_eq!(seq.retire(11), 2);
    /// // Still in use while step 11 is in flight, and `Full` says so.
    /// assert_eq!(
    ///     pool.try_alloc(1, &mut Vec::new()),
    ///     Err(ReserveError::Full { requested: 1, available: 0 })
    /// );
    /// assert_eq!(pool.complete(11), 2);
    /// assert_eq!(pool.free_blocks(), 2);
    /// ```
    pub fn retire(mut self, fence: u64) -> usize {
        let mut blocks = std::mem::take(&mut self.blocks);
        // Null entries hold no reference.
        blocks.drain(..self.null);
        self.null = 0;
        self.len = 0;
        // The table first, then the copy-on-write's source, as
        // `truncate_fenced` lists them; `self` then holds nothing, and its
        // drop gives back nothing.
        // Both, however the first ends: the source must not go back
        // unfenced at the drop (see "What the caller of a step that
        // unwinds finds" in `crate::implementation`).
        let mut unwound = Unwound::new();
        let mut n = 0;
        unwound.catch(|| n = self.pool.retire_owned(&SequenceCall::new(), fence, blocks));
        unwound.catch(|| n += self.retire_copy_source(fence));
        n
    }

    /// Gives back the reserved blocks that hold no token (those beyond
    /// `len().div_ceil(block_size)`, taken by [`try_reserve`](Self::try_reserve)
    /// or left by an append's copy-on-write reservation) and returns how
    /// many. The tokens, their slots and [`len`](Self::len) are unchanged;
    /// a scheduler calls it when it cancels a reservation, e.g. a prompt
    /// admitted whole whose prefill it abandons part-way. No heap
    /// allocation.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// let pool = Arc::new(kvslots::BlockPool::new(8, 16));
    /// let mut seq = kvslots::Sequence::new(Arc::clone(&pool));
    /// seq.try_reserve(64, 0).unwrap(); // 4 blocks
    /// seq.try_append(20).unwrap(); // fills 2 of them
    /// assert_eq!(seq.shrink_to_fit(), 2);
    /// assert_eq!((seq.len(), seq.capacity(), pool.used_blocks()), (20, 32, 2));
    /// assert_eq!(seq.shrink_to_fit(), 0);
    /// ```
    pub fn shrink_to_fit(&mut self) -> usize {
        let keep = table::blocks_for(self.len, self.bs);
        let freed = self.blocks.len() - keep;
        self.give_back(keep);
        freed
    }

    /// Forks a child for parallel sampling or beam search: it shares every
    /// full block (one more reference each) and gets a private block for a
    /// partly filled last one, which the caller fills by making the returned
    /// [`BlockCopy`]. A fork on a block boundary allocates nothing and
    /// returns `None`. The child's table is a new `Vec`.
    ///
    /// # Panics
    ///
    /// Panics if a block to share cannot take another reference
    /// ([`BlockAllocator::add_refs`]): in a [`BlockPool`], only if it would
    /// get more than `2^29 - 1` references (as `Arc` aborts on overflow;
    /// its raw [`BlockPool::free`] refuses a sequence's block, so it never
    /// takes this sequence's reference); over another allocator, also if
    /// its raw free took this sequence's reference (a double free: the
    /// block may be in the free list, and sharing it would hand it to two
    /// owners). Nothing leaks then: the child gives back what it took.
    ///
    /// # Errors
    ///
    /// The pool's [`ReserveError`] if no block is free for the private tail
    /// (`NeverFits { requested: 1, capacity: 0 }` when every block of the
    /// pool is this sequence's own); then nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(3, 4));
    /// let mut parent = Sequence::new(Arc::clone(&pool));
    /// parent.try_append(8).unwrap();
    /// let (child, copy) = parent.try_fork().unwrap();
    /// assert_eq!(copy, None); // on a block boundary: all shared
    /// assert_eq!(child.blocks(), parent.blocks());
    /// assert_eq!(pool.used_blocks(), 2);
    /// ```
    pub fn try_fork(&self) -> Result<(Sequence<A>, Option<BlockCopy>), ReserveError> {
        let mut child = Sequence::with_capacity(Arc::clone(&self.pool), self.len);
        // The fallible part first: a private block for a partly filled tail.
        if self.len % self.bs != 0 {
            // Growth of a running sequence, as in `try_append_cow`; new
            // work's fork (after a truncate into what it matched) is a new
            // admission.
            self.never_fits_beside_own(1, 1, 0)?;
            let running = self.is_running();
            checked_alloc(&*self.pool, 1, &mut child.blocks, |pool, out| {
                if running {
                    pool.try_alloc_growth(&SequenceCall::new(), 1, out)
                } else {
                    pool.try_alloc_with_headroom(&SequenceCall::new(), 1, 0, out)
                }
            })?;
        }
        Ok(self.fork_into(child))
    }

    /// The rest of [`try_fork`](Self::try_fork): `child` is an empty
    /// sequence over the same pool whose table holds the private block for
    /// a partly filled tail (if this sequence has one) and nothing else.
    pub(crate) fn fork_into(&self, mut child: Sequence<A>) -> (Sequence<A>, Option<BlockCopy>) {
        let bs = self.bs;
        let full = self.len / bs;
        let tail = self.len % bs;
        // Null entries (a sliding window's) stay null in the child.
        let null = self.null.min(full);
        if null > 0 {
            let private = child.blocks.pop();
            child.blocks.resize(null, BlockId::NULL);
            child.blocks.extend(private);
        }
        // Share the full blocks. The child owns the references added (and
        // the private block), so the panic below leaks nothing: dropping
        // the child gives them back.
        child.null = null;
        let shared = &self.blocks[null..full];
        let added = self.pool.add_refs(&SequenceCall::new(), shared);
        child
            .blocks
            .extend_from_slice(&shared[..added.min(shared.len())]);
        assert!(
            added <= shared.len(),
            "a BlockAllocator's add_refs said it shared {added} of {} blocks",
            shared.len()
        );
        if let Some(&id) = shared.get(added) {
            panic!(
                "{id} cannot take another reference: its count is at its maximum, or it has \
                 no reference left because BlockPool::free took this sequence's reference \
                 (a double free)"
            );
        }
        let copy = child
            .blocks
            .get(null)
            .copied()
            .filter(|_| tail != 0)
            .map(|dst| {
                // Move the private block from the front of the shared ones
                // to its place after them (in place: the table has room
                // for all of them).
                child.blocks[null..].rotate_left(1);
                BlockCopy {
                    src: self.blocks[full],
                    dst,
                    tokens: tail,
                }
            });
        child.len = self.len;
        // The child of a sequence that holds only what it matched into an
        // empty table is new work too.
        child.matched = self.matched.min(full);
        child.published = self.published.min(full);
        (child, copy)
    }

    /// Gives back the references of `blocks[keep..]`.
    fn give_back(&mut self, keep: usize) {
        let from = keep.max(self.null);
        self.null = self.null.min(keep);
        self.matched = self.matched.min(keep);
        self.published = self.published.min(keep);
        // The table is cut however the release ends: a waker's panic out
        // of it (see "Wakers run after the lock" in
        // `crate::implementation`) comes after every reference went.
        let table = Cut {
            blocks: &mut self.blocks,
            keep,
        };
        // A reference that a raw `BlockPool::free` of the same block (a
        // double free, which is misuse) dropped first is skipped: that block
        // was given back once, by the free, and every other reference here
        // is dropped all the same.
        self.pool
            .release(&SequenceCall::new(), &table.blocks[from..]);
    }

    /// Whether the sequence is running: it holds a block beyond those it
    /// matched (see `matched`), so that its allocations are growth.
    pub(crate) fn is_running(&self) -> bool {
        self.blocks.len() > self.matched
    }

    /// Gives back the blocks before table entry `upto` (those a sliding
    /// window left behind), at once or, with a `fence`, when it completes,
    /// and makes their entries [`BlockId::NULL`]. Before that, without a
    /// fence, up to `*recycle` blocks that this sequence holds alone and
    /// uncached move to the end of `out` instead (their references with
    /// them), and `*recycle` counts them down; `*picked` is set once they
    /// are picked (a `needs_copy` that unwinds before leaves the table
    /// and `out` as they were, and `*picked` unset). `upto` is at most the
    /// table's length.
    pub(crate) fn skip_to(
        &mut self,
        upto: usize,
        fence: Option<u64>,
        out: &mut Vec<BlockId>,
        recycle: &mut usize,
        recycle_shared: bool,
        picked: &mut bool,
    ) {
        let from = self.null;
        if upto <= from {
            *picked = true;
            return;
        }
        // The blocks to recycle, in table order, move to `out` first,
        // while the table is untouched: a `needs_copy` that unwinds (an
        // allocator's) leaves `out` as it was (cut back to `start`).
        let start = out.len();
        {
            let mut taken = Cut {
                blocks: out,
                keep: start,
            };
            for &id in &self.blocks[from..upto] {
                if *recycle == 0 {
                    break;
                }
                if recycle_shared || !self.pool.needs_copy(id) {
                    taken.blocks.push(id);
                    *recycle -= 1;
                }
            }
            taken.keep = taken.blocks.len();
        }
        *picked = true;
        // Then the rest are compacted to the front of the range: an entry
        // is recycled if it is the next of those moved (the same entries,
        // in the same order), else it is given back below.
        let mut moved = out[start..].iter().peekable();
        let mut kept = from;
        for i in from..upto {
            let id = self.blocks[i];
            if moved.next_if_eq(&&id).is_none() {
                self.blocks[kept] = id;
                kept += 1;
            }
        }
        self.null = upto;
        // The entries become null however the release ends (a waker's
        // panic out of it comes after every reference went).
        let gone = Nulls(&mut self.blocks[from..upto]);
        match fence {
            None => self
                .pool
                .release(&SequenceCall::new(), &gone.0[..kept - from]),
            Some(fence) => {
                self.pool
                    .retire(&SequenceCall::new(), fence, &gone.0[..kept - from]);
            }
        }
    }

    /// Drops the reference a copy-on-write kept for the caller's copy: the
    /// next successful non-empty append or shortening truncate is the point
    /// by which the caller has made it, and after which its source may be
    /// freed.
    fn release_retired(&mut self) {
        if let Some(id) = self.retired.take() {
            self.pool.release(&SequenceCall::new(), &[id]);
        }
    }
}

/// Waiting in the pool's queue, which only a [`BlockPool`] has.
impl Sequence<BlockPool> {
    /// [`try_reserve`](Self::try_reserve), waiting: a future that resolves
    /// once the missing blocks for `tokens` more tokens are taken, whole,
    /// with `headroom` blocks still free besides. This is how an async
    /// scheduler admits a whole prompt.
    ///
    /// It waits in the pool's queue in arrival order (see
    /// [`BlockPool::alloc`], whose future it returns, for the queue and
    /// cancellation). The grant waits until `missing + headroom` blocks are
    /// free and takes only `missing`: the `headroom` stays free for running
    /// sequences' growth ([`try_append`](Self::try_append) and the other
    /// `try_*` calls), which may use it while this waiter is at the head of
    /// the queue (see the [design notes](crate::implementation#waiting)).
    /// A sequence that needs no new block resolves at once.
    ///
    /// # Errors
    ///
    /// `NeverFits` (at once) if `missing + headroom` can never fit beside
    /// the blocks this sequence holds (more than `num_blocks()` less
    /// those, the error's capacity), `Closed`; on error, and when the
    /// future is dropped before it resolves, the sequence is unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(8, 16));
    /// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let mut seq = Sequence::new(Arc::clone(&pool));
    /// runtime.block_on(seq.reserve(40, 2)).unwrap(); // 3 blocks, 2 left free
    /// assert_eq!((seq.capacity(), pool.used_blocks()), (48, 3));
    /// ```
    pub fn reserve(&mut self, tokens: usize, headroom: usize) -> Alloc<'_> {
        let missing = self.missing_for(tokens);
        let fits = self.never_fits_beside_own(missing, missing, headroom);
        let pool = &*self.pool;
        if missing == 0 {
            return pool.alloc_nothing(&mut self.blocks);
        }
        if let Err(err) = fits {
            return pool.alloc_refused(err, &mut self.blocks);
        }
        pool.alloc_with_headroom(missing, headroom, &mut self.blocks, Holder::Sequence)
    }
}

impl<A: BlockAllocator + ?Sized> Drop for Sequence<A> {
    fn drop(&mut self) {
        // The table is given back even if a waker's panic comes out of the
        // copy-on-write source's give-back (during that unwinding, the
        // queue drops any second waker's panic).
        let table = GiveBackAll(self);
        table.0.release_retired();
    }
}

/// Gives back every block of a sequence's table when dropped.
struct GiveBackAll<'a, A: BlockAllocator + ?Sized>(&'a mut Sequence<A>);

impl<A: BlockAllocator + ?Sized> Drop for GiveBackAll<'_, A> {
    fn drop(&mut self) {
        self.0.give_back(0);
    }
}

/// Cuts a list of ids (a table, or a list a step appends to) to its
/// first `keep` entries when dropped.
struct Cut<'a> {
    blocks: &'a mut Vec<BlockId>,
    keep: usize,
}

impl Drop for Cut<'_> {
    fn drop(&mut self) {
        self.blocks.truncate(self.keep);
    }
}

/// Makes table entries null when dropped.
struct Nulls<'a>(&'a mut [BlockId]);

impl Drop for Nulls<'_> {
    fn drop(&mut self) {
        self.0.fill(BlockId::NULL);
    }
}

impl<A: BlockAllocator + ?Sized> fmt::Debug for Sequence<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sequence")
            .field("len", &self.len)
            .field("blocks", &self.blocks)
            .finish()
    }
}
