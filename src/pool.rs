//! [`BlockPool`]: a lock-free pool of KV-cache blocks with all-or-nothing
//! allocation and per-block reference counts.
//!
//! Paged servers cut the KV cache into blocks of `block_size` token slots.
//! A `BlockPool` hands out block ids: [`BlockPool::try_alloc`] takes `n` of
//! them or none, [`BlockPool::free`] drops one reference per listed id, and a
//! block whose last reference goes returns to the pool. Full blocks can be
//! shared between sequences (forks for parallel sampling or beam search)
//! through the reference counts; [`Sequence`](crate::Sequence) does that
//! bookkeeping for you.
//!
//! # Implementation
//!
//! Allocation is two steps, neither of which can leave a partial result:
//!
//! 1. The count is admitted through a [`SlotCounter`] (one CAS on one
//!    padded word, all or nothing). `Full`, `NeverFits` and `Closed` come
//!    from here, and nothing has changed when they do.
//! 2. Once admitted, the ids are popped from the free list, one CAS for a
//!    whole chain (see the `free_list` module: Treiber stacks over one
//!    index array, ABA-safe through a generation tag in the same
//!    `AtomicU64` as each head index). The stacks together always hold at
//!    least the admitted count, so this step cannot fail.
//!
//! Freeing validates every id, drops the references with checked
//! decrements, links the blocks whose count reached zero into a private
//! chain, pushes the chain (one CAS per run of ids with the same owner
//! stack: one in all when they share one) and then releases the count. If
//! any id is bad, nothing changes (see [`BlockPool::free`] for the one
//! refusal that can come after some decrements: a racing double free).
//!
//! The free list is cut into [`shards`](BlockPool::shards) stacks (16 for
//! pools of 1,024 blocks or more; see [`BlockPool::with_shards`]). Each
//! stack owns a contiguous range of ids and every freed block goes back to
//! the stack that owns it; a thread's pops start at its home stack (its
//! number modulo the stack count) and take from the others only when it is short. Threads that free and
//! reallocate sequences of blocks thus keep to their own stack head and to
//! their own part of the `next` array, instead of moving both between
//! cores on every request: walking a 130-block prompt's chain was the hot
//! spot of `kvslots-sim` with one stack (README, Performance). The only
//! word every thread writes is the admission counter's.
//!
//! Bookkeeping is 8 bytes per block: a 4-byte `next` link and a 4-byte
//! reference count, plus one cache line per stack head. The counter's
//! state and every stack head sit in cache lines of their own.
//!
//! Why tagged Treiber stacks rather than a bitmap: taking `k` ids is one
//! CAS on one word whatever the pool size, where a bitmap needs a search
//! that grows with the pool and one RMW per word touched, and the stack
//! reuses the most recently freed (cache-warm) blocks first. The pool
//! benchmark (`benches/pool.rs`, figures in the README) checks that
//! `try_alloc` costs the same at 1,000 and 1,000,000 blocks.
//!
//! # Orderings
//!
//! * **Freeing is `Release`**: each reference drop is an `AcqRel` RMW on the
//!   block's count (the `Release` half orders this holder's accesses before
//!   the last drop; the `Acquire` half lets the last dropper see every other
//!   holder's), the push of the chain is a `Release` CAS, and the count is
//!   given back with a `Release` `fetch_sub`. A sequence's drops are the
//!   same RMWs (a racing double free through the public `free` can change
//!   the same count, so no drop is a load followed by a store); they only
//!   skip the first load, guessing a count of 1.
//! * **Allocation is `Acquire`**: the admission CAS and the pop CAS. So
//!   everything a previous owner wrote into a block happens-before the next
//!   owner touches it.
//! * Setting a fresh block's count to 1 and adding a reference for a fork
//!   are `Relaxed`: the block is exclusively ours, or we already hold a
//!   reference, and the new reference travels to its holder through
//!   whatever hands over the sequence (as with `Arc::clone`).

use std::fmt;

use crate::counter::SlotCounter;
use crate::error::{FreeError, ReserveError};
use crate::free_list::{Chain, FreeList, NIL};
use crate::sync::{AtomicU32, Ordering};

/// The id of one block in a [`BlockPool`].
///
/// # Examples
///
/// ```
/// use kvslots::BlockId;
///
/// let id = BlockId::new(7);
/// assert_eq!(id.index(), 7);
/// assert!(BlockId::new(1) < id);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(u32);

impl BlockId {
    /// The id of block number `index`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(kvslots::BlockId::new(3).index(), 3);
    /// ```
    pub const fn new(index: u32) -> BlockId {
        BlockId(index)
    }

    /// The block's number, `0..num_blocks`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(kvslots::BlockId::new(42).index(), 42);
    /// ```
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block {}", self.0)
    }
}

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
pub struct BlockPool {
    /// Admits block counts; its padded state word is the one word every
    /// allocating and freeing thread writes.
    counter: SlotCounter,
    /// The ids not in use, in stacks (one per id range) with padded heads.
    free: FreeList,
    /// Per-block reference counts; 0 while the block is in the free list.
    refs: Box<[AtomicU32]>,
    block_size: usize,
}

impl BlockPool {
    /// The largest number of blocks a pool can have: ids are `u32`, and one
    /// value marks the end of the free list.
    pub const MAX_BLOCKS: usize = NIL as usize;

    /// The most free-list stacks [`new`](Self::new) gives a pool.
    pub const DEFAULT_SHARDS: usize = 16;

    /// The blocks per free-list stack below which [`new`](Self::new) uses
    /// fewer stacks.
    pub const BLOCKS_PER_SHARD: usize = 64;

    /// The most free-list stacks [`with_shards`](Self::with_shards) accepts.
    pub const MAX_SHARDS: usize = 1024;

    /// A reference count above this panics instead of wrapping.
    const MAX_REFS: u32 = u32::MAX / 2;

    /// Creates a pool of `num_blocks` free blocks of `block_size` token
    /// slots. `num_blocks == 0` is a valid pool that refuses every
    /// allocation.
    ///
    /// # Panics
    ///
    /// Panics if `block_size == 0`, if `num_blocks` is larger than
    /// [`BlockPool::MAX_BLOCKS`] (it does not fit the id type), or if
    /// `num_blocks * block_size` (the number of flat slot indices) overflows
    /// `usize`.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = kvslots::BlockPool::new(1024, 16);
    /// assert_eq!(pool.num_blocks(), 1024);
    /// assert_eq!(pool.block_size(), 16);
    /// ```
    pub fn new(num_blocks: usize, block_size: usize) -> BlockPool {
        BlockPool::with_shards(num_blocks, block_size, Self::default_shards(num_blocks))
    }

    /// Like [`new`](Self::new), with the free list cut into `shards`
    /// stacks instead of the default (see [`shards`](Self::shards)).
    ///
    /// Stack `s` owns the ids `s * span .. (s + 1) * span` (`span` =
    /// `num_blocks / shards`, rounded up) and a freed block always goes
    /// back to the stack that owns it. Each thread takes from a home stack
    /// first (threads are numbered in the order they first allocate from any pool,
    /// and thread `i` starts at stack `i % shards`) and from the others
    /// only when its own is short, so threads
    /// that free and reallocate do not contend on one head and walk chains
    /// in their own part of the index array. A thread whose home stack is
    /// short looks through the others, so very many shards over a nearly
    /// full pool make that slow path longer. `shards == 1` is the plain
    /// single-stack pool. Which stack an id sits in is never visible in
    /// the API: all or nothing, `Full` and the counts are those of the
    /// whole pool.
    ///
    /// # Panics
    ///
    /// As [`new`](Self::new), and if `shards` is 0 or above
    /// [`BlockPool::MAX_SHARDS`].
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = kvslots::BlockPool::with_shards(1024, 16, 4);
    /// assert_eq!(pool.shards(), 4);
    /// let mut ids = Vec::new();
    /// // Any thread can take every block, whichever stacks hold them.
    /// pool.try_alloc(1024, &mut ids).unwrap();
    /// pool.free(&ids).unwrap();
    /// ```
    pub fn with_shards(num_blocks: usize, block_size: usize, shards: usize) -> BlockPool {
        assert!(block_size != 0, "block_size must be non-zero");
        assert!(
            num_blocks <= Self::MAX_BLOCKS,
            "num_blocks {num_blocks} does not fit the block id type (max {})",
            Self::MAX_BLOCKS
        );
        assert!(
            num_blocks.checked_mul(block_size).is_some(),
            "num_blocks * block_size overflows usize"
        );
        assert!(
            (1..=Self::MAX_SHARDS).contains(&shards),
            "shards must be in 1..={}, got {shards}",
            Self::MAX_SHARDS
        );
        BlockPool {
            counter: SlotCounter::new(num_blocks),
            free: FreeList::new(num_blocks as u32, shards),
            refs: (0..num_blocks).map(|_| AtomicU32::new(0)).collect(),
            block_size,
        }
    }

    /// The shard count [`new`](Self::new) picks for `num_blocks` blocks:
    /// one stack per [`BLOCKS_PER_SHARD`](Self::BLOCKS_PER_SHARD) blocks,
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

    /// A pool whose free list carries injected faults, for loom's negative
    /// controls only.
    #[cfg(kvslots_loom)]
    #[doc(hidden)]
    pub fn with_faults(
        num_blocks: usize,
        block_size: usize,
        shards: usize,
        faults: crate::free_list::Faults,
    ) -> BlockPool {
        let mut pool = BlockPool::with_shards(num_blocks, block_size, shards);
        pool.free.faults = faults;
        pool
    }

    /// How many stacks the free list is cut into.
    ///
    /// [`new`](Self::new) gives a pool one stack per 64 blocks, up to 16:
    /// tiny pools keep a single stack (nothing to spread), and 16 covers
    /// the worker threads of one inference process on most machines (more
    /// threads than shards share stacks, which is correct, only more
    /// contended).
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
    /// [`num_blocks`](Self::num_blocks)).
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

    /// A snapshot of the number of blocks in use.
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

    /// The high-water mark of [`used_blocks`](Self::used_blocks).
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
        // Relaxed: a snapshot for reporting.
        self.refs
            .get(id.index())
            .map(|r| r.load(Ordering::Relaxed) as usize)
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
    /// * [`ReserveError::Full`] if fewer than `n` blocks are free.
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
    /// As [`SlotCounter::try_reserve_with_headroom`]: `NeverFits` if
    /// `n + headroom > num_blocks()`, `Closed`, or `Full`. On error `out`'s
    /// contents and the pool are unchanged (as for `try_alloc`).
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
        // Room for the ids first (it could panic or allocate), and only for a
        // request that can fit at all, so that nothing admitted can leak.
        if n <= self.num_blocks() {
            out.reserve(n);
        }
        self.counter.acquire(n, headroom)?;
        if n == 0 {
            return Ok(());
        }
        let base = out.len();
        self.free.pop(n, out);
        for id in &out[base..] {
            let count = &self.refs[id.index()];
            // Relaxed (both): the block is exclusively ours after the Acquire
            // pop; a plain store is cheaper than a read-modify-write.
            debug_assert_eq!(count.load(Ordering::Relaxed), 0, "{id} handed out twice");
            count.store(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Drops one reference per listed id; a block whose last reference goes
    /// returns to the pool. Freeing an empty slice is a no-op.
    ///
    /// The whole call or nothing: if any id is out of range, not allocated,
    /// or listed more times than it has references, nothing changes and the
    /// error names the offending id (checked in this order: any id out of
    /// range, then any block not allocated, then any block over-freed; each
    /// the first in list order). No heap allocation happens here, and the
    /// checks stay near linear in the list's length: one pass for a list
    /// without repeated ids, and one more per 8,192-index range it touches
    /// otherwise (plus a count over the list for each listing of an id past
    /// its 254th).
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
    /// meantime. Whatever races, no block is handed to two owners, none is
    /// pushed twice, the count of used blocks is given back once per block,
    /// and `free_blocks() <= num_blocks()`. That includes a free racing the
    /// [`Sequence`](crate::Sequence) that holds the block: whichever of the
    /// two drops the last reference pushes it; if this call loses, it
    /// returns `Raced`, and if the sequence loses, its drop (or truncate)
    /// gives back nothing for that block.
    ///
    /// # Errors
    ///
    /// [`FreeError::OutOfRange`], [`FreeError::NotAllocated`],
    /// [`FreeError::OverFreed`] (nothing changed), [`FreeError::Raced`]
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
        // Every id in range? Checked before anything changes.
        if let Some(&id) = ids.iter().find(|id| id.index() >= self.num_blocks()) {
            return Err(FreeError::OutOfRange {
                id,
                num_blocks: self.num_blocks(),
            });
        }
        // Every block allocated, and listed no more often than it has
        // references? Checked with loads before anything changes, so that a
        // refused call never drops (and restores) a reference that a
        // concurrent holder could observe.
        if let Some(&id) = ids.iter().find(|id| self.count(**id) == 0) {
            return Err(FreeError::NotAllocated { id });
        }
        if let Some(id) = self.first_over_freed(ids) {
            return Err(FreeError::OverFreed { id });
        }
        self.drop_refs(ids)
    }

    /// Drops one reference per listed id for [`free`](Self::free), whose
    /// checks found every listed reference present; chains the blocks that
    /// reach zero and pushes them (one CAS per run of ids with the same
    /// owner stack).
    fn drop_refs(&self, ids: &[BlockId]) -> Result<(), FreeError> {
        self.drop_each(ids, |id| self.drop_ref(id))
    }

    /// Drops the references a [`Sequence`](crate::Sequence) holds in its
    /// table (or retired), as [`drop_refs`](Self::drop_refs) does.
    ///
    /// The caller holds each listed reference, but a public
    /// [`free`](Self::free) that lists the same block (a double free, which
    /// is misuse) can take it first: so every drop is a read-modify-write,
    /// and exactly one of the two sees the count reach 0 and pushes the
    /// block. If `free` won, the drop here finds no reference left and is
    /// refused with `Raced` like any drop that loses that race.
    pub(crate) fn drop_held_refs(&self, ids: &[BlockId]) -> Result<(), FreeError> {
        self.drop_each(ids, |id| self.drop_held_ref(id))
    }

    /// The body of both drops: `drop` takes one reference and says whether
    /// it was the last (`Err` if none was left).
    fn drop_each(
        &self,
        ids: &[BlockId],
        drop: impl Fn(BlockId) -> Result<bool, ()>,
    ) -> Result<(), FreeError> {
        // A drop can fail here only if the caller does not hold what it
        // lists and another holder freed it meanwhile (a racing double
        // free). The other drops still go ahead: undoing them could add a
        // reference to a block that was freed and reallocated to a new
        // owner since (an ABA on the count).
        let mut chain = Chain::new();
        let mut raced = None;
        for (i, &id) in ids.iter().enumerate() {
            match drop(id) {
                Ok(true) => self.free.prepend(&mut chain, id.index() as u32),
                Ok(false) => {}
                Err(()) => {
                    #[cfg(kvslots_loom)]
                    if self.free.faults.blind_undo {
                        return Err(self.blind_undo(&ids[..i], id));
                    }
                    let _ = i; // (only loom's control needs the index)
                    raced.get_or_insert(id);
                }
            }
        }
        if chain.len() > 0 {
            self.free.push(&chain);
            self.counter.release_held(chain.len());
        }
        match raced {
            None => Ok(()),
            Some(id) => Err(FreeError::Raced { id }),
        }
    }

    /// The negative control of `loom-tests/tests/refused_free.rs`: the
    /// undo an earlier version made, adding every dropped reference back
    /// whatever happened to the block since (it resurrects a block that
    /// another holder freed meanwhile).
    #[cfg(kvslots_loom)]
    fn blind_undo(&self, done: &[BlockId], id: BlockId) -> FreeError {
        for &d in done {
            // Relaxed: the bug under test is the missing check, not ordering.
            self.refs[d.index()].fetch_add(1, Ordering::Relaxed);
        }
        FreeError::NotAllocated { id }
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

    /// Adds a reference to a block the caller already holds a reference to.
    ///
    /// # Panics
    ///
    /// Panics if the count would exceed `u32::MAX / 2` (as `Arc` aborts).
    pub(crate) fn add_ref(&self, id: BlockId) {
        // Relaxed: the caller holds a reference, so the block cannot be freed
        // under us; the new reference is handed over by whatever hands over
        // its holder (as with `Arc::clone`).
        let prev = self.refs[id.index()].fetch_add(1, Ordering::Relaxed);
        if prev >= Self::MAX_REFS {
            // Relaxed: undoing our own increment.
            self.refs[id.index()].fetch_sub(1, Ordering::Relaxed);
            panic!("reference count overflow on {id}");
        }
    }

    /// Whether more than one reference to `id` exists now.
    pub(crate) fn is_shared(&self, id: BlockId) -> bool {
        // Acquire: if another holder dropped its reference, its reads of the
        // block happen-before we decide to write into it.
        self.refs[id.index()].load(Ordering::Acquire) > 1
    }

    /// The first id (in list order) listed more times than it has
    /// references now, if any. Allocates nothing, and stays near linear for
    /// long lists:
    /// - up to 16 ids are compared pairwise;
    /// - a longer list is screened once through a filter of `index % 4096`
    ///   (512 bytes on the stack): if no two ids share a bit, none is listed
    ///   twice;
    /// - otherwise it is checked exactly, one pass per window of 8,192
    ///   consecutive indices that holds a listed id, in index order, with a
    ///   tally per index of the window (8 KiB on the stack): an id whose
    ///   tally passes its reference count is over-freed. A pass stops at the
    ///   earliest over-freed position found so far (no later one can win).
    ///
    /// That is O(n · windows) for `n` ids: a pool of a million blocks has at
    /// most 123 windows. Only an id listed more than 254 times in one list
    /// (its tally saturated) is counted the slow way, over the list so far.
    /// (One filter for every list, with every id whose bit was already set
    /// counted over the whole prefix, made a list of over 4096 distinct ids
    /// quadratic.)
    fn first_over_freed(&self, ids: &[BlockId]) -> Option<BlockId> {
        const PAIRWISE: usize = 16;
        const SCREEN_BITS: usize = 64 * 64;
        const WINDOW: usize = 8 * 1024;
        let over = |i: usize, id: BlockId| {
            let listed = ids[..=i].iter().filter(|&&x| x == id).count();
            listed > self.count(id) as usize
        };
        if ids.len() <= PAIRWISE {
            return ids
                .iter()
                .enumerate()
                .find(|&(i, id)| ids[..i].contains(id) && over(i, *id))
                .map(|(_, &id)| id);
        }
        // Any two ids on the same bit of the screen?
        let mut screen = [0u64; SCREEN_BITS / 64];
        if !ids
            .iter()
            .any(|id| test_and_set(&mut screen, id.index() % SCREEN_BITS))
        {
            return None;
        }
        // Exactly, window by window: `lo` is the lowest listed index not yet
        // covered, and `end` the earliest over-freed position found so far
        // (the list's length while there is none).
        let mut tally = [0u8; WINDOW];
        let mut end = ids.len();
        let mut lo = ids.iter().map(|id| id.index()).min()?;
        loop {
            let mut next = usize::MAX;
            for (i, &id) in ids[..end].iter().enumerate() {
                let index = id.index();
                if index < lo {
                    continue;
                }
                if index - lo >= WINDOW {
                    next = next.min(index);
                    continue;
                }
                let listed = &mut tally[index - lo];
                *listed = listed.saturating_add(1);
                // Listed more often than referenced? (A repeat only: the
                // first listing was checked against zero references already.)
                let over_freed = match *listed {
                    1 => false,
                    u8::MAX => over(i, id),
                    n => usize::from(n) > self.count(id) as usize,
                };
                if over_freed {
                    end = i;
                    break;
                }
            }
            // Every listed index before `end` covered?
            if next == usize::MAX {
                return ids.get(end).copied();
            }
            lo = next;
            tally.fill(0);
        }
    }

    /// A block's reference count now.
    fn count(&self, id: BlockId) -> u32 {
        // Relaxed: a validation read; the drops that follow are what order.
        self.refs[id.index()].load(Ordering::Relaxed)
    }

    /// Drops a reference the caller holds; `Ok(true)` if it was the last.
    ///
    /// Never a load followed by a plain store of 0, even when the count
    /// reads 1: a racing [`free`](Self::free) of the same block (a double
    /// free) can take that count from 1 to 0 in between, and both sides
    /// would then push the block. The CAS decides which of the two drops
    /// the last reference.
    fn drop_held_ref(&self, id: BlockId) -> Result<bool, ()> {
        #[cfg(kvslots_loom)]
        if self.free.faults.plain_held_drop {
            return self.plain_held_drop(id);
        }
        // First guess 1, without a load: a sequence usually holds its blocks
        // alone, and then the first CAS succeeds.
        self.drop_ref_from(id, 1)
    }

    /// The negative control of `loom-tests/tests/held_drop.rs`: a count that
    /// reads 1 is cleared with a plain store, as if nobody else could drop
    /// that reference (a racing double free can).
    #[cfg(kvslots_loom)]
    fn plain_held_drop(&self, id: BlockId) -> Result<bool, ()> {
        let count = &self.refs[id.index()];
        // Acquire, Relaxed: the orderings of a correct last drop; the bug
        // under test is the store.
        if count.load(Ordering::Acquire) == 1 {
            count.store(0, Ordering::Relaxed);
            return Ok(true);
        }
        self.drop_ref(id)
    }

    /// Drops one reference; `Ok(true)` if it was the last. `Err` if the
    /// block has none (not allocated, or already dropped in this call).
    fn drop_ref(&self, id: BlockId) -> Result<bool, ()> {
        // Relaxed: only a guess; the CAS validates it.
        let guess = self.refs[id.index()].load(Ordering::Relaxed);
        self.drop_ref_from(id, guess)
    }

    /// [`drop_ref`](Self::drop_ref) with a first guess of the count.
    fn drop_ref_from(&self, id: BlockId, guess: u32) -> Result<bool, ()> {
        let count = &self.refs[id.index()];
        let mut cur = guess;
        loop {
            // Any reference left to drop?
            if cur == 0 {
                return Err(());
            }
            // AcqRel on success: Release orders this holder's accesses to
            // the block before the last drop; Acquire lets the last dropper
            // (who pushes the block) see every other holder's accesses.
            // Relaxed on failure: we only retry with the fresh value.
            match count.compare_exchange_weak(
                cur,
                cur - 1,
                self.free.free_ordering(Ordering::AcqRel),
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(cur == 1),
                Err(actual) => cur = actual,
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
            .field("used_blocks", &self.used_blocks())
            .field("peak_used_blocks", &self.peak_used_blocks())
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Sets bit `bit` of `bits` and returns whether it was already set.
fn test_and_set(bits: &mut [u64], bit: usize) -> bool {
    let (word, mask) = (bit / 64, 1u64 << (bit % 64));
    let was = bits[word] & mask != 0;
    bits[word] |= mask;
    was
}
