//! [`HybridSequence`]: one sequence's block tables, one per group of
//! layers, over one pool, admitted together.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use super::groups::{GroupKeys, KvGroup, KvGroups};
use crate::allocator::{checked_alloc, BlockAllocator, Seal, SequenceCall};
use crate::error::{HybridError, ReserveError};
use crate::id::BlockId;
use crate::pool::{BlockPool, Holder};
use crate::sequence::{BlockCopy, Sequence};
use crate::sync::Faults;
use crate::wait::Unwound;

/// One sequence of a hybrid model: a block table per group of layers
/// ([`KvGroups`]), all over one pool, with one length.
///
/// Every table is a [`Sequence`]'s: the same copy-on-write, forks,
/// rollback, fenced release and prefix caching, over any
/// [`BlockAllocator`]. What the hybrid sequence adds:
///
/// * **One admission.** An append, a reservation or a fork counts the
///   blocks every group needs and takes them with **one** allocation call,
///   all or nothing across the groups: a refusal changes no table, and no
///   group runs ahead of another.
/// * **Sliding windows.** A [`KvGroup::SlidingWindow`] table gives back,
///   in the append that moves past them, the blocks wholly before the
///   window of the append's first new token (they are never read again):
///   their entries become [`BlockId::NULL`], as vLLM's null block, so that
///   a table keeps its shape (entry `i` is block `i` of the sequence). So
///   a sliding group's table grows with the sequence's length, not with
///   the blocks it holds: one 4-byte entry per block the window has
///   passed, in each sliding group, also past the pool's size in a model
///   whose groups all slide ([`with_capacity`](Self::with_capacity) sets
///   that room aside).
///   A block so given back that the sequence held alone and uncached is
///   reused, in the same call, for the blocks the append needs (in any
///   group) instead of going back to the pool: a sequence in steady
///   decode makes no pool call for its sliding groups, and an append that
///   needs a block fits whenever its window frees one.
///
///   A [`KvGroup::ChunkedLocal`] group (Llama 4's chunked local
///   attention) is a sliding group whose window is the token's chunk: its
///   table gives back the blocks wholly before the next token's chunk, a
///   truncate may not reach back past them, and a prefix hit needs the
///   blocks of the chunk it ends in. What these docs say of a sliding
///   group holds for it, except the steady decode: a chunked group's
///   window grows with the chunk, so inside a chunk its appends take a
///   block from the pool at each block boundary and give none back, and
///   the first append past a chunk's end gives the whole chunk back.
/// * **Prefix caching across groups.** [`try_match_prefix`](Self::try_match_prefix)
///   takes the longest prefix that every group can serve: a full group
///   needs all its blocks, a sliding group only those inside the window
///   ending at the hit. Each group has keys of its own ([`GroupKeys`]).
///
/// # Examples
///
/// gpt-oss's two groups, sliding windows of 128 tokens and full attention:
///
/// ```
/// use std::sync::Arc;
/// use kvslots::{BlockId, BlockPool, HybridSequence, KvGroup, KvGroups};
///
/// let pool = Arc::new(BlockPool::new(64, 16));
/// let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 128 }, KvGroup::Full])?;
/// let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
/// seq.try_append(300).unwrap(); // prefill: 19 blocks in each group, one admission
/// assert_eq!(pool.used_blocks(), 38);
/// seq.try_append(1).unwrap(); // token 300 reads 173..=300: blocks 0..10 go back
/// assert_eq!(seq.blocks(0).unwrap()[..10], [BlockId::NULL; 10]);
/// assert_eq!(seq.blocks(1).unwrap().len(), 19); // the full group keeps them all
/// assert_eq!(pool.used_blocks(), 28);
/// let mut slots = Vec::new();
/// seq.extend_slots(0, 300..301, &mut slots).unwrap(); // where the kernel writes
/// drop(seq);
/// assert_eq!(pool.free_blocks(), 64);
/// # Ok::<(), kvslots::KvGroupsError>(())
/// ```
///
/// # Memory ordering
///
/// As [`Sequence`]'s: a plain `Send` value used by one thread at a time
/// (not `Sync`), whose blocks follow the pool's rules. They are a sequence's blocks in
/// every table (also a window's block reused for new tokens, a fork's,
/// a match's and those retired under a fence): a raw
/// [`BlockPool::free`] of one is refused with
/// [`FreeError::HeldBySequence`](crate::FreeError::HeldBySequence), and
/// the sequence gives them back itself.
pub struct HybridSequence<A: BlockAllocator + ?Sized = BlockPool> {
    groups: KvGroups,
    /// One table per group, each over the same pool.
    tables: Box<[Sequence<A>]>,
    /// The blocks of one call on their way to the tables; empty between
    /// calls (the drop gives back any a panic left here).
    scratch: Vec<BlockId>,
    /// Per group, the blocks the call in progress takes, how many of them
    /// its tokens need, and whether it copies the group's tail: planned
    /// once, before the admission, since a tail's need for a copy may
    /// change meanwhile (another holder lets go).
    plans: Box<[(usize, usize, bool)]>,
    /// What a match into a reservation found of each group's keys while
    /// it planned (see `BlockPool::plan_hybrid_match`); kept for its
    /// memory.
    planned: Vec<u8>,
    /// The faults of loom's negative controls (none outside loom).
    faults: Faults,
}

/// The room to set aside for the table of a group of kind `kind` that
/// holds up to `tokens` tokens, over a pool of `num_blocks` blocks of `bs`
/// tokens (an empty list with that capacity), in a model whose groups all
/// slide (`all_sliding`) or not. A full group's table holds distinct
/// blocks, so never more than the pool has, and a spare entry for a
/// copy-on-write append ([`table::entries`](crate::table::entries)); so
/// its sequence never holds more tokens than the pool's blocks do, and
/// neither does any other table of a model with a full group. In a model
/// whose groups all slide, a table keeps a null entry for each block the
/// window has passed, so it grows with the length, not with the pool: room
/// for `tokens`' blocks and the spare, or, if the allocator refuses that
/// much, a full group's room (the table then grows as the sequence does).
fn table_room(
    kind: KvGroup,
    all_sliding: bool,
    tokens: usize,
    bs: usize,
    num_blocks: usize,
) -> Vec<BlockId> {
    let capped = crate::table::entries(tokens, bs, num_blocks);
    if !all_sliding || !kind.gives_back() {
        return Vec::with_capacity(capped);
    }
    let mut room = Vec::new();
    if room
        .try_reserve_exact(crate::table::entries(tokens, bs, usize::MAX))
        .is_err()
    {
        room.reserve_exact(capped);
    }
    room
}

impl<A: BlockAllocator + ?Sized> HybridSequence<A> {
    /// An empty sequence over `pool`, with a table per group of `groups`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full]).unwrap();
    /// let seq = HybridSequence::new(Arc::new(BlockPool::new(8, 16)), groups);
    /// assert!(seq.is_empty());
    /// ```
    pub fn new(pool: Arc<A>, groups: KvGroups) -> HybridSequence<A> {
        HybridSequence::with_capacity(pool, groups, 0)
    }

    /// An empty sequence whose tables have room for `tokens` tokens each
    /// without reallocating, so that appends, reservations and matches up
    /// to that length allocate no heap memory.
    ///
    /// A full group's table is sized by the pool as well, since it holds
    /// distinct blocks: at most one entry per block of the pool, and a
    /// spare; a model with a full group never holds more tokens than that,
    /// so its sliding tables are sized so too. In a model whose groups all
    /// slide, a table keeps a [`BlockId::NULL`] entry for each block its
    /// window has passed, so it is sized by `tokens` alone: 4 bytes per
    /// block of `tokens` (and a spare), even where that is more blocks
    /// than the pool has. Where the allocator refuses that much, it is
    /// sized as a full group's, and grows as the sequence does.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    /// let seq = HybridSequence::with_capacity(Arc::new(BlockPool::new(8, 16)), groups, 100);
    /// assert_eq!(seq.len(), 0);
    /// ```
    pub fn with_capacity(pool: Arc<A>, groups: KvGroups, tokens: usize) -> HybridSequence<A> {
        HybridSequence::with_faults(pool, groups, tokens, Faults::default())
    }

    /// [`with_capacity`](Self::with_capacity), carrying `faults`.
    pub(crate) fn with_faults(
        pool: Arc<A>,
        groups: KvGroups,
        tokens: usize,
        faults: Faults,
    ) -> HybridSequence<A> {
        let bs = pool.block_size();
        let num_blocks = pool.num_blocks();
        let all_sliding = groups.as_slice().iter().all(KvGroup::gives_back);
        let tables: Box<[Sequence<A>]> = groups
            .as_slice()
            .iter()
            .map(|&kind| {
                Sequence::with_table(
                    Arc::clone(&pool),
                    bs,
                    table_room(kind, all_sliding, tokens, bs, num_blocks),
                )
            })
            .collect();
        // The scratch list holds one call's blocks in transit, distinct
        // blocks of the pool: an append's or a reservation's for every
        // group (at most a table's worth per group, and the pool's in
        // all), a fork's private blocks, or a sliding group's match of the
        // window's blocks it is missing (at most the pool's).
        let per_group = crate::table::entries(tokens, bs, num_blocks);
        HybridSequence {
            scratch: Vec::with_capacity(per_group.saturating_mul(groups.len())),
            plans: vec![(0, 0, false); groups.len()].into_boxed_slice(),
            planned: Vec::new(),
            groups,
            tables,
            faults,
        }
    }

    /// The number of tokens in the sequence (the same in every group).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::new(BlockPool::new(8, 16)), groups);
    /// seq.try_append(5).unwrap();
    /// assert_eq!(seq.len(), 5);
    /// ```
    pub fn len(&self) -> usize {
        self.tables[0].len()
    }

    /// Whether the sequence holds no token.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full]).unwrap();
    /// assert!(HybridSequence::new(Arc::new(BlockPool::new(8, 16)), groups).is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The groups.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full]).unwrap();
    /// let seq = HybridSequence::new(Arc::new(BlockPool::new(8, 16)), groups.clone());
    /// assert_eq!(seq.groups(), &groups);
    /// ```
    pub fn groups(&self) -> &KvGroups {
        &self.groups
    }

    /// The pool the blocks come from.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let pool = Arc::new(BlockPool::new(8, 16));
    /// let seq = HybridSequence::new(Arc::clone(&pool), KvGroups::new([KvGroup::Full]).unwrap());
    /// assert!(Arc::ptr_eq(seq.pool(), &pool));
    /// ```
    pub fn pool(&self) -> &Arc<A> {
        self.tables[0].pool()
    }

    /// Group `group`'s block table, or `None` past the last group: the
    /// blocks holding positions `0..len()` in order (entry `i` holds
    /// positions `i * block_size..`), [`BlockId::NULL`] for those a sliding
    /// window gave back, then any reserved blocks.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockId, BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 4 }]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::new(BlockPool::new(8, 4)), groups);
    /// seq.try_append(12).unwrap();
    /// seq.try_append(1).unwrap(); // position 12 reads 9..=12: block 0 and 1 go back
    /// assert_eq!(seq.blocks(0).unwrap()[..2], [BlockId::NULL; 2]);
    /// assert_eq!(seq.blocks(1), None);
    /// ```
    pub fn blocks(&self, group: usize) -> Option<&[BlockId]> {
        self.tables.get(group).map(Sequence::blocks)
    }

    /// How many leading entries of group `group`'s table are
    /// [`BlockId::NULL`] (given back by its sliding window), or `None`
    /// past the last group.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 4 }, KvGroup::Full]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::new(BlockPool::new(8, 4)), groups);
    /// seq.try_append(12).unwrap();
    /// seq.try_append(1).unwrap();
    /// assert_eq!((seq.null_blocks(0), seq.null_blocks(1)), (Some(2), Some(0)));
    /// ```
    pub fn null_blocks(&self, group: usize) -> Option<usize> {
        self.tables.get(group).map(|t| t.null)
    }

    /// The blocks the sequence holds in all its tables (its KV memory, in
    /// blocks): every entry but the null ones.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 4 }, KvGroup::Full]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::new(BlockPool::new(16, 4)), groups);
    /// seq.try_append(12).unwrap();
    /// seq.try_append(1).unwrap();
    /// assert_eq!(seq.held_blocks(), 2 + 4); // the window's 2, the full group's 4
    /// ```
    pub fn held_blocks(&self) -> usize {
        self.tables.iter().map(Sequence::in_table).sum()
    }

    /// How many tokens every group's table can hold: the least of
    /// `blocks(g).len() * block_size` over the groups, null entries
    /// included (saturating at `usize::MAX`: a sliding window's table
    /// reaches that far). The tables hold as many entries but while a
    /// [`try_reserve`](Self::try_reserve) has kept a block for the copy of
    /// one group's shared tail, which a group that holds its tail alone
    /// does not need: that block holds no token of its own, and the group
    /// with the fewest entries bounds an append that takes no new block.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::new(BlockPool::new(8, 16)), groups);
    /// seq.try_append(17).unwrap();
    /// assert_eq!(seq.capacity(), 32);
    /// ```
    pub fn capacity(&self) -> usize {
        self.tables
            .iter()
            .map(Sequence::capacity)
            .min()
            .unwrap_or(0)
    }

    /// The flat slot index of token `position` in group `group`
    /// (`block.index() * block_size + position % block_size`); `None` past
    /// the last group, at or past [`len`](Self::len), or in a block the
    /// group's sliding window gave back.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 2 }, KvGroup::Full]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::new(BlockPool::new(8, 4)), groups);
    /// seq.try_append(6).unwrap();
    /// seq.try_append(1).unwrap(); // position 6 reads 5..=6: block 0 goes back
    /// assert_eq!(seq.slot(0, 1), None);
    /// assert_eq!(seq.slot(1, 1), Some(seq.blocks(1).unwrap()[0].index() * 4 + 1));
    /// assert_eq!(seq.slot(0, 5), Some(seq.blocks(0).unwrap()[1].index() * 4 + 1));
    /// ```
    pub fn slot(&self, group: usize, position: usize) -> Option<usize> {
        let t = self.tables.get(group)?;
        if position < t.null * t.bs {
            return None;
        }
        t.slot(position)
    }

    /// Appends group `group`'s flat slot indices of `positions` to `out`
    /// (the slot mapping of a batch of new tokens in that group's layers),
    /// allocating nothing but `out`'s growth. An empty range appends
    /// nothing. `out` grows as [`Vec::reserve`] grows it, as in
    /// [`Sequence::extend_slots`].
    ///
    /// # Errors
    ///
    /// [`HybridError::NoSuchGroup`] past the last group,
    /// [`HybridError::Position`] if the range reaches past
    /// [`len`](Self::len), [`HybridError::OutsideWindow`] if it starts in a
    /// block the group's sliding window gave back; `out` is then
    /// unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::new(BlockPool::new(8, 4)), groups);
    /// let new = seq.try_append(6).unwrap();
    /// let mut slots = Vec::new();
    /// for g in 0..2 {
    ///     slots.clear();
    ///     seq.extend_slots(g, new.clone(), &mut slots).unwrap();
    ///     assert_eq!(slots[5], seq.slot(g, 5).unwrap());
    /// }
    /// ```
    pub fn extend_slots(
        &self,
        group: usize,
        positions: Range<usize>,
        out: &mut Vec<usize>,
    ) -> Result<(), HybridError> {
        let t = self.table(group)?;
        if positions.is_empty() {
            return Ok(());
        }
        let first_held = t.null * t.bs;
        if positions.end <= t.len() && positions.start < first_held {
            return Err(HybridError::OutsideWindow {
                group,
                position: positions.start,
                first_held,
            });
        }
        Ok(t.extend_slots(positions, out)?)
    }

    /// Group `group`'s table, or `NoSuchGroup`.
    fn table(&self, group: usize) -> Result<&Sequence<A>, HybridError> {
        self.tables.get(group).ok_or(HybridError::NoSuchGroup {
            group,
            groups: self.tables.len(),
        })
    }

    /// Whether an append of at least one token now needs a copy-on-write
    /// in some group (its last block partly filled and shared or cached,
    /// after a truncate into it): [`try_append`](Self::try_append) would
    /// then panic, and [`try_append_cow`](Self::try_append_cow) returns
    /// the copies to make. A snapshot, as [`Sequence::append_needs_copy`]:
    /// `true` can turn `false` when other holders let go, never back
    /// without this sequence's own fork or truncate.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 8 }]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::new(BlockPool::new(16, 4)), groups);
    /// seq.try_append(8).unwrap();
    /// let child = seq.try_fork(&mut Vec::new()).unwrap();
    /// seq.truncate(6).unwrap(); // back into blocks shared with the child
    /// assert!(seq.append_needs_copy());
    /// drop(child);
    /// assert!(!seq.append_needs_copy());
    /// ```
    pub fn append_needs_copy(&self) -> bool {
        self.tables.iter().any(Sequence::append_needs_copy)
    }

    /// Appends `n` tokens to every group: takes the new blocks all the
    /// groups need with **one** allocation, all or none, gives back the
    /// sliding groups' blocks that fall out of their windows, and returns
    /// the positions `old_len..old_len + n`. `n == 0` returns an empty
    /// range and changes nothing. No heap allocation happens here beyond
    /// growing the tables and the sequence's list of blocks in transit
    /// (which [`with_capacity`](Self::with_capacity) sizes).
    ///
    /// A sliding (or chunked) group's blocks wholly before the window (or
    /// chunk) of the first new token are given back
    /// ([`KvGroup::first_needed_block`] of `old_len`: for a sliding window,
    /// `(old_len + 1 - window_tokens) / block_size`; for chunks,
    /// `old_len / chunk_tokens * chunk_tokens / block_size`), as the call
    /// also marks the point by which the device step that read them last
    /// has run (as for a copy-on-write's source, see
    /// [`Sequence::try_append_cow`]); with a step still in flight, use
    /// [`try_append_fenced`](Self::try_append_fenced). Those that the
    /// sequence holds alone and that are not cached are reused for the new
    /// blocks first, so only the rest is asked of the pool; the others
    /// (shared with a fork, or cached: a prefix match can still take them)
    /// go back to the pool.
    ///
    /// # Panics
    ///
    /// Panics, before changing anything, if `n > 0` and a group's last
    /// block is partly filled and shared or cached (after a truncate into
    /// it): that append needs a device copy, which only
    /// [`try_append_cow`](Self::try_append_cow) hands back.
    ///
    /// # Errors
    ///
    /// The pool's [`ReserveError`], for the blocks of all the groups
    /// together (less those the windows free for reuse), as
    /// [`Sequence::try_append`] counts them: `NeverFits` if the new blocks
    /// can never fit beside the blocks the sequence keeps (the pool's
    /// blocks less those, the error's capacity; copy-on-write sources it
    /// keeps are not counted, and its `requested` is every block the append
    /// takes, the copies' included, as `Full`'s is); `Full`;
    /// `BehindWaiters` for new work (a sequence whose tables hold no block
    /// beyond the prefix [`try_match_prefix`](Self::try_match_prefix) took
    /// with no reservation: an empty one, or a new request whose prompt
    /// hit the cache; its append is a new admission) while the free blocks
    /// are owed to queued waiters; `Closed`. A length past `usize::MAX`, which the windows'
    /// give-backs let a hybrid sequence reach with the blocks it holds, is
    /// `NeverFits` with `requested: usize::MAX`. On error nothing changes:
    /// no table, no window.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups, ReserveError};
    ///
    /// let pool = Arc::new(BlockPool::new(5, 4));
    /// let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 4 }, KvGroup::Full]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    /// seq.try_append(8).unwrap(); // 2 blocks in each group: 4 of 5
    /// // Position 8 reads 5..=8: the sliding group's block 0 leaves the
    /// // window and holds positions 8..12 instead; the pool gives the full
    /// // group's new block.
    /// assert_eq!(seq.try_append(4).unwrap(), 8..12);
    /// assert_eq!(pool.used_blocks(), 5);
    /// // 4 more: the window frees block 1 for the sliding group, but the
    /// // full group's block does not fit, so neither group moves.
    /// assert_eq!(
    ///     seq.try_append(4),
    ///     Err(ReserveError::Full { requested: 1, available: 0 })
    /// );
    /// assert_eq!((seq.len(), seq.held_blocks(), seq.null_blocks(0)), (12, 5, Some(1)));
    /// ```
    pub fn try_append(&mut self, n: usize) -> Result<Range<usize>, ReserveError> {
        self.append(n, None, None)
    }

    /// [`try_append`](Self::try_append) that returns the device copies it
    /// needs instead of panicking: for each group whose partly filled last
    /// block is shared or cached (after a truncate into it), the copy of
    /// its tokens into a new block, pushed onto `copies` (in group order),
    /// which the caller makes before the kernel writes the new tokens. As
    /// [`Sequence::try_append_cow`], the sequence keeps the copies' sources
    /// until its next append of at least one token.
    ///
    /// # Errors
    ///
    /// As [`try_append`](Self::try_append); on error nothing changes
    /// (`copies` included).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 8 }]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::new(BlockPool::new(16, 4)), groups);
    /// seq.try_append(8).unwrap();
    /// let child = seq.try_fork(&mut Vec::new()).unwrap(); // shares every block
    /// seq.truncate(6).unwrap(); // back into a block shared with the child
    /// let mut copies = Vec::new();
    /// assert_eq!(seq.try_append_cow(1, &mut copies).unwrap(), 6..7);
    /// assert_eq!(copies.len(), 2); // one per group
    /// assert_eq!(copies[0].src, child.blocks(0).unwrap()[1]);
    /// ```
    pub fn try_append_cow(
        &mut self,
        n: usize,
        copies: &mut Vec<BlockCopy>,
    ) -> Result<Range<usize>, ReserveError> {
        self.append(n, None, Some(copies))
    }

    /// [`try_append_cow`](Self::try_append_cow) for asynchronous
    /// scheduling, where the device step that last read the blocks a
    /// window leaves behind may still be in flight: they are retired under
    /// `fence` (given back when
    /// [`BlockPool::complete(fence)`](BlockPool::complete) declares the
    /// step done; until then they count as used) and none is reused.
    ///
    /// # Errors
    ///
    /// As [`try_append`](Self::try_append); on error nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let pool = Arc::new(BlockPool::new(8, 4));
    /// let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 4 }]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    /// seq.try_append(8).unwrap();
    /// seq.try_append_fenced(4, 7, &mut Vec::new()).unwrap(); // block 0 waits for step 7
    /// assert_eq!((seq.held_blocks(), pool.used_blocks()), (2, 3));
    /// assert_eq!(pool.complete(7), 1);
    /// assert_eq!(pool.used_blocks(), 2);
    /// ```
    pub fn try_append_fenced(
        &mut self,
        n: usize,
        fence: u64,
        copies: &mut Vec<BlockCopy>,
    ) -> Result<Range<usize>, ReserveError> {
        self.append(n, Some(fence), Some(copies))
    }

    /// The body of the appends: windows' give-backs at once (`fence ==
    /// None`, reusing what can be) or under `fence`; copies pushed onto
    /// `copies`, or a panic without it.
    fn append(
        &mut self,
        n: usize,
        fence: Option<u64>,
        mut copies: Option<&mut Vec<BlockCopy>>,
    ) -> Result<Range<usize>, ReserveError> {
        let old_len = self.len();
        if n == 0 {
            return Ok(old_len..old_len);
        }
        let bs = self.tables[0].bs;
        // A decode step's usual case: every group's tokens fit in the
        // blocks it holds, no copy is pending or needed, and no window
        // moves past a block. Only the lengths change.
        if self
            .tables
            .iter()
            .zip(self.groups.as_slice())
            .all(|(t, kind)| t.fits_in_place(n) && kind.first_needed_block(old_len, bs) <= t.null)
        {
            for t in self.tables.iter_mut() {
                t.len = old_len + n;
            }
            return Ok(old_len..old_len + n);
        }
        // Plan: the blocks each group takes, and whether it copies its
        // tail (nothing changes until the admission succeeded).
        let (mut total, mut new_blocks) = (0usize, 0usize);
        let mut any_cow = false;
        for (t, plan) in self.tables.iter().zip(self.plans.iter_mut()) {
            *plan = t.plan_append(n);
            total = total.saturating_add(plan.0);
            new_blocks = new_blocks.saturating_add(plan.1);
            any_cow |= plan.2;
        }
        assert!(
            !any_cow || copies.is_some(),
            "HybridSequence::try_append: a group's last block is shared (with a fork or a \
             match) or cached, and must be copied before it is written; append with \
             HybridSequence::try_append_cow, which returns the BlockCopy values to make"
        );
        // The windows' blocks to give back, and how many of them can take
        // the place of new blocks.
        let recycle_shared = self.faults.recycle_shared();
        let (mut reusable, mut leaving) = (0, 0);
        for (t, kind) in self.tables.iter().zip(self.groups.as_slice()) {
            let upto = kind.first_needed_block(old_len, bs);
            let from = t.null.min(upto);
            leaving += upto - from;
            if fence.is_none() {
                reusable += t.blocks[from..upto]
                    .iter()
                    .filter(|&&id| recycle_shared || !t.pool().needs_copy(id))
                    .count();
            }
        }
        let mut recycle = reusable.min(total);
        // One admission for every group (growth, unless the sequence is
        // new work: then a new admission).
        let asked = total - recycle;
        if asked > 0 {
            // Only the new blocks can never come (a copy of a shared tail
            // is not needed once its other holders let go), beside what
            // the sequence keeps once its windows moved on.
            let needed = new_blocks.saturating_sub(recycle);
            self.never_fits_beside_own(asked, needed, 0, leaving)?;
        }
        // The windows give their blocks back, so the pool does not bound
        // the length as it bounds a `Sequence`'s: with blocks enough, a
        // position past `usize::MAX` is what never fits, as many blocks as
        // there can be.
        let Some(new_len) = old_len.checked_add(n) else {
            return Err(self.never_fits(usize::MAX, self.room_beside_own(leaving)));
        };
        self.clear_scratch();
        if asked > 0 {
            self.admit(asked)?;
        }
        // Commit: the windows first (their reusable blocks join the
        // admitted ones), then each group takes its share in order. A
        // waker's panic out of a give-back (a window's blocks, a previous
        // copy's source) is resumed once every table is committed.
        let mut unwound = Unwound::new();
        let mut picked = true;
        for (t, kind) in self.tables.iter_mut().zip(self.groups.as_slice()) {
            let upto = kind.first_needed_block(old_len, bs);
            let scratch = &mut self.scratch;
            let recycle = &mut recycle;
            let mut done = false;
            unwound.catch(|| {
                t.skip_to(upto, fence, scratch, recycle, recycle_shared, &mut done);
            });
            picked &= done;
        }
        // The windows recycle what the plan counted unless a `needs_copy`
        // unwound (an allocator's panic: that window is left as it was)
        // or turned from false to true (a breach of the contract): then
        // the append is undone, its blocks given back, and the other
        // windows stay moved on (what they gave back lay before the first
        // block the old length needs).
        let planned = self.plans.iter().map(|p| p.0).sum::<usize>();
        if !picked || self.scratch.len() != planned {
            self.undo_append(unwound, planned);
        }
        for (t, &(need, _, cow)) in self.tables.iter_mut().zip(self.plans.iter()) {
            // Moved, so that each block is in one place when a panic
            // comes.
            t.blocks.extend(self.scratch.drain(..need));
            let (_, copy, done) = t.commit_append_keeping(n, cow);
            if let (Some(copy), Some(out)) = (copy, copies.as_deref_mut()) {
                out.push(copy);
            }
            if let Some(id) = done {
                unwound.catch(|| t.pool().release(&SequenceCall::new(), &[id]));
            }
        }
        debug_assert!(self.scratch.is_empty());
        Ok(old_len..new_len)
    }

    /// Gives back the blocks an append holds in the scratch list (a
    /// window's `needs_copy` unwound, or their count is not the plan's),
    /// and resumes the panic `unwound` caught, or panics for the breach of
    /// the contract.
    #[cold]
    #[inline(never)]
    fn undo_append(&mut self, mut unwound: Unwound, planned: usize) -> ! {
        let held = self.scratch.len();
        unwound.catch(|| self.clear_scratch());
        // Resumes the panic caught, if any: the count is short for it.
        drop(unwound);
        panic!(
            "a BlockAllocator's needs_copy turned from false to true: the append planned \
             {planned} blocks and holds {held}"
        );
    }

    /// Gives back the blocks in the scratch list, which holds some
    /// between calls only when a panic interrupted one (an allocator's:
    /// an allocation that appended and then unwound).
    fn clear_scratch(&mut self) {
        if self.scratch.is_empty() {
            return;
        }
        let ids = std::mem::take(&mut self.scratch);
        if let Some(t) = self.tables.first() {
            t.pool().release(&SequenceCall::new(), &ids);
        }
        self.scratch = ids;
        self.scratch.clear();
    }

    /// `NeverFits` for a call that asks the pool for `asked` blocks, of
    /// which `needed` can never be taken, with `headroom` free besides,
    /// beside the blocks the sequence's tables hold (less the `leaving`
    /// ones its windows give back in the call): the rest of the pool is
    /// all it can ever get, and is the error's capacity. Copy-on-write
    /// sources the tables keep are not counted, as in
    /// [`Sequence::try_append`]: the caller gives them back once the
    /// copies are made. (`Closed` wins after `close`.)
    fn never_fits_beside_own(
        &self,
        asked: usize,
        needed: usize,
        headroom: usize,
        leaving: usize,
    ) -> Result<(), ReserveError> {
        let room = self.room_beside_own(leaving);
        if needed.saturating_add(headroom) <= room {
            return Ok(());
        }
        Err(self.never_fits(asked, room))
    }

    /// The blocks of the pool the sequence could ever get: all but those
    /// its tables hold, less the `leaving` ones its windows give back.
    fn room_beside_own(&self, leaving: usize) -> usize {
        let held = self.tables.iter().map(Sequence::in_table).sum::<usize>();
        self.pool()
            .num_blocks()
            .saturating_sub(held.saturating_sub(leaving))
    }

    /// `NeverFits` for `asked` blocks beside a `room` of blocks, or
    /// `Closed` after `close`.
    fn never_fits(&self, asked: usize, room: usize) -> ReserveError {
        if self.pool().is_closed() {
            return ReserveError::Closed;
        }
        ReserveError::NeverFits {
            requested: asked,
            capacity: room,
        }
    }

    /// Whether the sequence is new work: no table holds a block beyond the
    /// prefix a match took with no reservation (an empty sequence, or a
    /// new request whose prompt hit the prefix cache), as for
    /// [`Sequence`]: its allocations are new admissions, which leave
    /// queued waiters what they are owed.
    fn is_new_work(&self) -> bool {
        !self.tables.iter().any(Sequence::is_running)
    }

    /// Takes `n > 0` blocks into the scratch list: growth of a running
    /// sequence, or a new admission for new work.
    fn admit(&mut self, n: usize) -> Result<(), ReserveError> {
        let fresh = self.is_new_work();
        let pool = Arc::clone(self.pool());
        if self.faults.per_group_admission() {
            return self.admit_per_group(n, fresh);
        }
        checked_alloc(&*pool, n, &mut self.scratch, |pool, out| {
            if fresh {
                pool.try_alloc_with_headroom(&SequenceCall::new(), n, 0, out)
            } else {
                pool.try_alloc_growth(&SequenceCall::new(), n, out)
            }
        })
    }

    /// The `per_group_admission` fault: one allocation per group (the
    /// blocks split as evenly as the groups go), with the earlier groups'
    /// blocks given back when a later one is refused.
    fn admit_per_group(&mut self, n: usize, fresh: bool) -> Result<(), ReserveError> {
        let pool = Arc::clone(self.pool());
        let groups = self.tables.len();
        for g in 0..groups {
            let share = n / groups + usize::from(g < n % groups);
            if share == 0 {
                continue;
            }
            let taken = checked_alloc(&*pool, share, &mut self.scratch, |pool, out| {
                if fresh {
                    pool.try_alloc_with_headroom(&SequenceCall::new(), share, 0, out)
                } else {
                    pool.try_alloc_growth(&SequenceCall::new(), share, out)
                }
            });
            if let Err(e) = taken {
                pool.release(&SequenceCall::new(), &self.scratch);
                self.scratch.clear();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Makes sure every table holds blocks for `tokens` more tokens,
    /// taking the missing ones of all the groups with one allocation, all
    /// or none, only if `headroom` blocks stay free afterwards, without
    /// changing [`len`](Self::len) (see [`Sequence::try_reserve`]). A
    /// sliding group reserves for every token too, since one append may
    /// write them all; its window gives blocks back as the appends move
    /// on.
    ///
    /// # Errors
    ///
    /// As [`Sequence::try_reserve`], counted in blocks of all the groups
    /// together (`NeverFits` beside the blocks the sequence holds in all
    /// its tables); also `NeverFits` when `tokens` more would pass
    /// `usize::MAX` tokens (with `requested: usize::MAX`, as
    /// [`try_append`](Self::try_append), unless the missing blocks do not
    /// fit beside the sequence's own). On error nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let pool = Arc::new(BlockPool::new(8, 16));
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    /// seq.try_reserve(40, 2).unwrap(); // 3 blocks a group, 2 left free
    /// assert_eq!((seq.len(), seq.capacity(), pool.used_blocks()), (0, 48, 6));
    /// assert!(seq.try_reserve(80, 0).is_err()); // 2 more a group, 2 free: none taken
    /// assert_eq!(pool.used_blocks(), 6);
    /// ```
    pub fn try_reserve(&mut self, tokens: usize, headroom: usize) -> Result<(), ReserveError> {
        let missing = self.missing_within_len(tokens, headroom)?;
        if missing == 0 {
            return Ok(());
        }
        self.never_fits_beside_own(missing, missing, headroom, 0)?;
        self.clear_scratch();
        let pool = Arc::clone(self.pool());
        checked_alloc(&*pool, missing, &mut self.scratch, |pool, out| {
            pool.try_alloc_with_headroom(&SequenceCall::new(), missing, headroom, out)
        })?;
        self.distribute_reserved();
        Ok(())
    }

    /// [`try_reserve`](Self::try_reserve), sleeping in the pool's queue
    /// until the missing blocks of every group are granted together, for
    /// at most `timeout` (`None`: no limit).
    ///
    /// # Errors
    ///
    /// `NeverFits` (at once, beside the blocks the sequence holds),
    /// `Closed`, or, when `timeout` runs out, `Full` or `BehindWaiters`;
    /// on error the sequence is unchanged.
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
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let pool = Arc::new(BlockPool::new(4, 16));
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    /// let mut first = HybridSequence::new(Arc::clone(&pool), groups.clone());
    /// first.reserve_blocking(32, 0, None).unwrap(); // all 4 blocks
    /// let mut second = HybridSequence::new(Arc::clone(&pool), groups);
    /// assert!(second.reserve_blocking(16, 0, Some(Duration::from_millis(1))).is_err());
    /// drop(first);
    /// second.reserve_blocking(16, 0, None).unwrap();
    /// ```
    pub fn reserve_blocking(
        &mut self,
        tokens: usize,
        headroom: usize,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError> {
        let missing = self.missing_within_len(tokens, headroom)?;
        if missing == 0 {
            return Ok(());
        }
        self.never_fits_beside_own(missing, missing, headroom, 0)?;
        self.clear_scratch();
        let pool = Arc::clone(self.pool());
        checked_alloc(&*pool, missing, &mut self.scratch, |pool, out| {
            pool.alloc_with_headroom_blocking(&SequenceCall::new(), missing, headroom, out, timeout)
        })?;
        self.distribute_reserved();
        Ok(())
    }

    /// [`missing_for`](Self::missing_for), refusing tokens that would pass
    /// a length of `usize::MAX` (the windows' give-backs let a length pass
    /// the pool's slots): such a reservation never fits, as an append's
    /// does, whether or not the blocks held cover it. Missing blocks that
    /// do not fit beside the sequence's own (with `headroom`) are the
    /// refusal's count, as for any reservation too large; otherwise it is
    /// `usize::MAX`, as an append's.
    fn missing_within_len(
        &mut self,
        tokens: usize,
        headroom: usize,
    ) -> Result<usize, ReserveError> {
        let missing = self.missing_for(tokens);
        if self.len().checked_add(tokens).is_none() {
            if missing > 0 {
                self.never_fits_beside_own(missing, missing, headroom, 0)?;
            }
            return Err(self.never_fits(usize::MAX, self.room_beside_own(0)));
        }
        Ok(missing)
    }

    /// Plans the blocks every group needs for `tokens` more tokens (see
    /// [`Sequence::try_reserve`]) and returns their sum.
    fn missing_for(&mut self, tokens: usize) -> usize {
        let mut sum = 0usize;
        for (t, plan) in self.tables.iter().zip(self.plans.iter_mut()) {
            let missing = t.missing_for(tokens);
            *plan = (missing, missing, false);
            sum = sum.saturating_add(missing);
        }
        sum
    }

    /// Hands the reserved blocks in the scratch list to the groups, as
    /// planned by [`missing_for`](Self::missing_for).
    fn distribute_reserved(&mut self) {
        for (t, &(need, _, _)) in self.tables.iter_mut().zip(self.plans.iter()) {
            t.blocks.extend(self.scratch.drain(..need));
        }
        debug_assert!(self.scratch.is_empty());
    }

    /// The shortest length, besides 0, that the tables can be truncated to:
    /// one whose next token's window holds no null entry.
    fn min_truncate_len(&self) -> usize {
        let bs = self.tables[0].bs;
        self.tables
            .iter()
            .zip(self.groups.as_slice())
            .map(|(t, kind)| kind.first_len_from(t.null, bs))
            .max()
            .unwrap_or(0)
    }

    /// Rolls every group back to `len` tokens (rejected speculative
    /// tokens, preemption) as [`Sequence::truncate`] does, and returns how
    /// many blocks left the tables in all. A `len` at or past
    /// [`len`](Self::len) is a no-op.
    ///
    /// # Errors
    ///
    /// [`HybridError::TruncateOutsideWindow`] if `len` is not 0 and the
    /// window (or chunk) of the token at position `len` reaches into
    /// blocks a sliding (or chunked) group gave back (a truncate back into
    /// the last append's tokens never does); nothing changes then.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridError, HybridSequence, KvGroup, KvGroups};
    ///
    /// let pool = Arc::new(BlockPool::new(16, 4));
    /// let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 4 }, KvGroup::Full]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    /// seq.try_append(12).unwrap();
    /// let drafts = seq.try_append(5).unwrap(); // 5 drafts; blocks 0 and 1 leave the window
    /// assert_eq!(seq.truncate(drafts.start + 2), Ok(2)); // 2 accepted: a block per group back
    /// assert_eq!(
    ///     seq.truncate(4),
    ///     Err(HybridError::TruncateOutsideWindow { len: 4, min_len: 11 })
    /// );
    /// assert_eq!(seq.truncate(0), Ok(2 + 4));
    /// assert_eq!(pool.used_blocks(), 0);
    /// ```
    pub fn truncate(&mut self, len: usize) -> Result<usize, HybridError> {
        self.truncate_with(len, None)
    }

    /// [`truncate`](Self::truncate) for a device step that may still read
    /// the blocks given back: as [`Sequence::truncate_fenced`], in every
    /// group.
    ///
    /// # Errors
    ///
    /// As [`truncate`](Self::truncate); nothing changes then.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let pool = Arc::new(BlockPool::new(8, 4));
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    /// seq.try_append(4 + 8).unwrap();
    /// assert_eq!(seq.truncate_fenced(4, 3), Ok(4)); // 2 blocks a group wait for step 3
    /// assert_eq!(pool.used_blocks(), 6);
    /// assert_eq!(pool.complete(3), 4);
    /// assert_eq!(pool.used_blocks(), 2);
    /// ```
    pub fn truncate_fenced(&mut self, len: usize, fence: u64) -> Result<usize, HybridError> {
        self.truncate_with(len, Some(fence))
    }

    fn truncate_with(&mut self, len: usize, fence: Option<u64>) -> Result<usize, HybridError> {
        if len >= self.len() {
            return Ok(0);
        }
        let min_len = self.min_truncate_len();
        if len != 0 && len < min_len {
            return Err(HybridError::TruncateOutsideWindow { len, min_len });
        }
        // Every table is cut, also when a waker's panic comes out of one
        // table's give-back: it is resumed once all agree on the length.
        let mut unwound = Unwound::new();
        let mut freed = 0;
        for t in self.tables.iter_mut() {
            unwound.catch(|| {
                freed += match fence {
                    None => t.truncate(len),
                    Some(fence) => t.truncate_fenced(len, fence),
                }
            });
        }
        Ok(freed)
    }

    /// Hands every group's copy-on-write source, still kept, to `fence`
    /// ([`Sequence::retire_copy_source`]); returns how many.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let pool = Arc::new(BlockPool::new(8, 4));
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    /// seq.try_append(4).unwrap();
    /// let child = seq.try_fork(&mut Vec::new()).unwrap();
    /// seq.truncate(2).unwrap();
    /// seq.try_append_cow(1, &mut Vec::new()).unwrap();
    /// assert_eq!(seq.retire_copy_source(6), 2);
    /// drop(child);
    /// assert_eq!(pool.complete(6), 2);
    /// ```
    pub fn retire_copy_source(&mut self, fence: u64) -> usize {
        self.tables
            .iter_mut()
            .map(|t| t.retire_copy_source(fence))
            .sum()
    }

    /// Gives the sequence up while a device step may still read its
    /// blocks: every group's references are given back when
    /// [`BlockPool::complete(fence)`](BlockPool::complete) declares the
    /// step done ([`Sequence::retire`]); returns how many references.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let pool = Arc::new(BlockPool::new(8, 4));
    /// let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 4 }, KvGroup::Full]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    /// seq.try_append(8).unwrap();
    /// seq.try_append(1).unwrap(); // the sliding group gives block 0 back
    /// assert_eq!(seq.retire(11), 2 + 3);
    /// assert_eq!(pool.used_blocks(), 5);
    /// assert_eq!(pool.complete(11), 5);
    /// ```
    pub fn retire(mut self, fence: u64) -> usize {
        // Every step, however one ends: a table dropped instead would give
        // its blocks back before the fence. Blocks a panic left in transit
        // were never in a table (no step reads them): they go back now.
        let mut unwound = Unwound::new();
        unwound.catch(|| self.clear_scratch());
        let tables = std::mem::take(&mut self.tables);
        let mut n = 0;
        for t in tables.into_vec() {
            unwound.catch(|| n += t.retire(fence));
        }
        n
    }

    /// Gives back every group's reserved blocks that hold no token
    /// ([`Sequence::shrink_to_fit`]); returns how many.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let pool = Arc::new(BlockPool::new(8, 16));
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    /// let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    /// seq.try_reserve(64, 0).unwrap();
    /// seq.try_append(20).unwrap();
    /// assert_eq!(seq.shrink_to_fit(), 4);
    /// assert_eq!(pool.used_blocks(), 4);
    /// ```
    pub fn shrink_to_fit(&mut self) -> usize {
        // Every table, as in `truncate_with`.
        let mut unwound = Unwound::new();
        let mut freed = 0;
        for t in self.tables.iter_mut() {
            unwound.catch(|| freed += t.shrink_to_fit());
        }
        freed
    }

    /// Forks a child for parallel sampling or beam search, in every group
    /// as [`Sequence::try_fork`]: the child shares every full block
    /// (sliding groups: those in the window; the null entries stay null)
    /// and gets a private block for each group's partly filled last one,
    /// all taken with one allocation. The copies to make are pushed onto
    /// `copies`, in group order.
    ///
    /// # Panics
    ///
    /// As [`Sequence::try_fork`], if a block to share cannot take another
    /// reference; nothing leaks then.
    ///
    /// # Errors
    ///
    /// The pool's [`ReserveError`] if the private blocks do not fit; then
    /// nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let pool = Arc::new(BlockPool::new(16, 4));
    /// let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 4 }, KvGroup::Full]).unwrap();
    /// let mut parent = HybridSequence::new(Arc::clone(&pool), groups);
    /// parent.try_append(10).unwrap();
    /// let mut copies = Vec::new();
    /// let child = parent.try_fork(&mut copies).unwrap();
    /// assert_eq!(copies.len(), 2); // a partly filled tail in each group
    /// assert_eq!(child.blocks(1).unwrap()[..2], parent.blocks(1).unwrap()[..2]);
    /// ```
    pub fn try_fork(&self, copies: &mut Vec<BlockCopy>) -> Result<HybridSequence<A>, ReserveError> {
        let len = self.len();
        let pool = Arc::clone(self.pool());
        let private = if len % self.tables[0].bs == 0 {
            0
        } else {
            self.tables.len()
        };
        let mut child =
            HybridSequence::with_faults(Arc::clone(&pool), self.groups.clone(), len, self.faults);
        if private > 0 {
            self.never_fits_beside_own(private, private, 0, 0)?;
            // Growth of a running sequence; new work's fork (after a
            // truncate into what it matched) is a new admission.
            let fresh = self.is_new_work();
            checked_alloc(&*pool, private, &mut child.scratch, |pool, out| {
                if fresh {
                    pool.try_alloc_with_headroom(&SequenceCall::new(), private, 0, out)
                } else {
                    pool.try_alloc_growth(&SequenceCall::new(), private, out)
                }
            })?;
            // Popped in group order below.
            child.scratch.reverse();
        }
        for (g, t) in self.tables.iter().enumerate() {
            // The child's own table, with the room `with_faults` set aside
            // for the group (an empty one without room takes its place).
            let bs = t.bs;
            let mut c = std::mem::replace(
                &mut child.tables[g],
                Sequence::with_table(Arc::clone(&pool), bs, Vec::new()),
            );
            // Moved out of the scratch list before the fork can panic, so
            // that each block is given back once (by the table or by the
            // child's drop).
            c.blocks.extend(child.scratch.pop());
            let (c, copy) = t.fork_into(c);
            child.tables[g] = c;
            copies.extend(copy);
        }
        Ok(child)
    }

    /// Takes the longest prefix of `keys` that every group can serve from
    /// the pool's cache into this sequence, which holds no token, and
    /// returns its length
    /// in blocks `k` ([`len`](Self::len) becomes `k * block_size`):
    ///
    /// * a [`Full`](KvGroup::Full) group needs its blocks `0..k`, all
    ///   cached;
    /// * a [`SlidingWindow`](KvGroup::SlidingWindow) (or
    ///   [`ChunkedLocal`](KvGroup::ChunkedLocal)) group needs only the
    ///   blocks inside the window (or chunk) of the token at position `k *
    ///   block_size`, `first_needed_block(k * block_size)..k`; its entries
    ///   before them are [`BlockId::NULL`]. A chunked group needs none
    ///   when `k * block_size` starts a chunk.
    ///
    /// So `k` is the largest count at most `keys.blocks()` for which every
    /// group holds those blocks, one reference each. The full groups match
    /// first (each the prefix the ones before it matched); each sliding
    /// group then looks for a cached window ending at the current `k`,
    /// from its end backwards: a missing block at `i` moves the candidate
    /// end to `i`, and a lower `k` shortens the full groups and has the
    /// sliding groups look again, until every group agrees. Blocks taken
    /// on the way that the final prefix does not need are given back
    /// (they count as recently released, which moves them to the back of
    /// the eviction order). Each group matches only under its own keys.
    ///
    /// The pool's [`prefix_stats`](BlockPool::prefix_stats) count these
    /// lookups, group by group: the keys each asks for and the blocks the
    /// pool hands it, also those given back because another group serves
    /// a shorter prefix. The prefix a hybrid request gets is what this
    /// returns (`k` blocks of tokens). Until it holds a block beyond them,
    /// a sequence that matched with no reservation is new work: its next
    /// append is a new admission (see [`try_append`](Self::try_append)).
    /// One that matched into a reservation was admitted by it, and stays
    /// running while it holds a block: its appends are growth.
    ///
    /// On a sequence that holds tokens it returns 0 and changes nothing.
    /// A sequence that holds only reserved blocks (a reservation, granted
    /// after a wait say) matches into them, as
    /// [`Sequence::try_match_prefix`] does: each reserved block can pay
    /// for a cached block revived (its place in the capacity is the
    /// revival's, also when the rest of the pool is owed to waiters). Over
    /// a [`BlockPool`] it first plans, taking nothing, the longest prefix
    /// that every group serves (as [`BlockPool::peek_hybrid_prefix`]
    /// searches it) and whose revivals (the evictable blocks among its
    /// blocks) the reserved blocks and the pool's room beside the waiters
    /// pay for, and matches no further; a matched block that the final
    /// prefix does not need (the cache or the pool's room changed since
    /// the plan, and a group serves a shorter prefix) goes back with its
    /// place kept for the reservation. Once the groups agree on
    /// `k`, every group holds its `k` entries of the match, then as many
    /// blocks as it reserved beyond them (reserved blocks not lent, or
    /// fresh ones paid by what the match kept):
    /// [`capacity`](Self::capacity) stays at least what it was, and what
    /// is left over goes back to the pool. It can come up short only in a
    /// race: when a block this match revived and then let go of was
    /// shared meanwhile by another match (the block stays that holder's,
    /// with its place in the capacity) and the pool has no free block to
    /// replace it. A group then holds fewer blocks beyond the match; a
    /// caller that needs the whole reservation checks
    /// [`capacity`](Self::capacity) and reserves the rest. The
    /// reserved blocks are lent only to a [`BlockPool`] itself: over
    /// another allocator they wait unlent (each revival is admitted by the
    /// allocator, as into an empty sequence) and the capacity is never
    /// short. As [`Sequence::try_match_prefix`]: an
    /// evictable block taken counts against the pool's capacity, and a
    /// full or closed pool stops a group's match short; under contention
    /// fewer blocks may match; a matched block's key is exactly the one
    /// asked for, and what its publisher wrote happens-before the match
    /// returns it.
    ///
    /// # Performance
    ///
    /// Each lookup of a group's keys (a full group's once, a sliding
    /// group's once for each window it tries) costs as
    /// [`Sequence::try_match_prefix`]'s: in a pool of up to 131,072
    /// blocks, time linear in the number of blocks it matches.
    ///
    /// # Errors
    ///
    /// [`HybridError::OtherGroups`] if `keys` were made for other groups
    /// than the sequence's; nothing changes then.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{hash_blocks, BlockId, BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let pool = Arc::new(BlockPool::new(32, 4));
    /// let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 5 }, KvGroup::Full]).unwrap();
    /// let prompt: Vec<u32> = (0..22).collect();
    /// let mut base = Vec::new();
    /// hash_blocks(b"", &prompt, 4, &mut base); // 5 full blocks
    /// let keys = groups.keys(&base);
    ///
    /// let mut first = HybridSequence::new(Arc::clone(&pool), groups.clone());
    /// first.try_append(prompt.len()).unwrap();
    /// assert_eq!(first.publish(&keys), Ok(5 + 5));
    /// drop(first);
    ///
    /// let mut second = HybridSequence::new(Arc::clone(&pool), groups.clone());
    /// assert_eq!(second.try_match_prefix(&keys), Ok(5)); // 20 tokens
    /// // Position 20 reads 16..=20: the sliding group holds block 4 only.
    /// assert_eq!(second.blocks(0).unwrap()[..4], [BlockId::NULL; 4]);
    /// assert_eq!(second.held_blocks(), 1 + 5);
    ///
    /// // Reserved first (granted after a wait, say), then matched: 7
    /// // blocks a group reserved, the 5 matched entries replace 5 of them.
    /// let mut third = HybridSequence::new(Arc::clone(&pool), groups);
    /// third.try_reserve(prompt.len() + 4, 0).unwrap();
    /// assert_eq!(third.try_match_prefix(&keys), Ok(5));
    /// assert_eq!((third.len(), third.capacity()), (20, 28));
    /// assert_eq!(third.held_blocks(), 1 + 5 + 2 * 2);
    /// ```
    pub fn try_match_prefix(&mut self, keys: &GroupKeys) -> Result<usize, HybridError> {
        if keys.groups() != &self.groups {
            return Err(HybridError::OtherGroups);
        }
        // Nothing in it yet: no token, nothing retired, no null entry. Its
        // blocks, if any, are reserved: held alone (a fork shares only
        // blocks that hold tokens), uncached, empty.
        let new = self
            .tables
            .iter()
            .all(|t| t.len == 0 && t.null == 0 && t.retired.is_none());
        if !new || keys.blocks() == 0 {
            return Ok(0);
        }
        let pool = Arc::clone(self.pool());
        let reserved = self.tables.iter().any(|t| !t.blocks.is_empty());
        self.clear_scratch();
        // A reservation is lent only to the pool itself, whose credits the
        // match keeps; over any other allocator the reserved blocks wait
        // unlent, and revivals are admitted as usual.
        let mut lending = Lending {
            pool: pool.as_block_pool(Seal(())).filter(|_| reserved),
            credits: 0,
        };
        // The reserved blocks wait in the scratch list, where the matches
        // lend them from (see `match_run`); each group's count is planned.
        for (t, plan) in self.tables.iter_mut().zip(self.plans.iter_mut()) {
            *plan = (t.blocks.len(), 0, false);
            self.scratch.append(&mut t.blocks);
        }
        let bs = self.tables[0].bs;
        // At most the blocks whose tokens a length can count: sliding
        // groups alone can match more blocks than the pool has (their
        // tables hold null entries), up to `usize::MAX` tokens.
        let mut k = keys.blocks().min(usize::MAX / bs);
        // A match into a reservation first plans, taking nothing, how far
        // every group agrees with revivals it can pay for (the reserved
        // blocks, and what the pool could admit beside them), and matches
        // no further: a block it revives and then lets go of could be
        // shared meanwhile by another match, whose block it then stays
        // (its place in the capacity with it). With the plan the match
        // lets go of a block only when the cache or the pool's room
        // changed since.
        let planned = lending.pool.map(|p| {
            // What pays for the revivals of a match of `j` blocks: each
            // group's reserved blocks up to `j` (those beyond refill it),
            // and the pool's room.
            let room = p.admission_estimate();
            let plans = &self.plans;
            let payable = |j: usize| {
                plans
                    .iter()
                    .map(|&(reserved, _, _)| reserved.min(j))
                    .fold(room, usize::saturating_add)
            };
            p.plan_hybrid_match(keys, k, payable, &mut self.planned)
        });
        let kinds = self.groups.clone();
        // A waker's panic out of a match (an admission for a revival, or a
        // give-back) or out of a give-back here is resumed once the match
        // is whole: the tables then hold exactly the blocks of the `k`
        // matched, and count them.
        let mut unwound = Unwound::new();
        // Reserved blocks set aside for the revivals planned in the
        // sliding groups' windows at `k` and in the full groups not
        // matched yet, so that a full group does not lend what a later
        // group's revivals need, and every group can agree on a hit that
        // the reservation pays for. (Without a plan nothing is lent.)
        let (windows, mut later) = match planned {
            Some(plan) => {
                k = plan.k;
                (plan.window_revivals, plan.full_revivals)
            }
            None => (0, 0),
        };
        // The full groups: each matches the prefix the ones before it did.
        for (g, kind) in kinds.as_slice().iter().enumerate() {
            if *kind != KvGroup::Full {
                continue;
            }
            if let Some(plan) = planned {
                later -= plan.group_revivals(&self.planned, g);
            }
            let share = self
                .scratch
                .len()
                .saturating_sub(windows.saturating_add(later));
            let from = match_run(
                &*pool,
                &lending,
                share,
                &keys.group(g).unwrap_or(&[])[..k],
                &mut self.scratch,
                &mut unwound,
            );
            let t = &mut self.tables[g];
            t.blocks.extend_from_slice(&self.scratch[from..]);
            self.scratch.truncate(from);
            let m = t.blocks.len();
            if m < k {
                k = m;
                self.cut_full(k, &mut lending, &mut unwound);
            }
        }
        // The sliding groups, until every group agrees on `k`.
        loop {
            let mut lowered = false;
            for (g, kind) in kinds.as_slice().iter().enumerate() {
                if !kind.gives_back() {
                    continue;
                }
                let group_keys = keys.group(g).unwrap_or(&[]);
                let served = self.settle(g, *kind, k, group_keys, &mut lending, &mut unwound);
                if served < k {
                    k = served;
                    lowered = true;
                }
            }
            if !lowered || self.faults.unreconciled_match() {
                break;
            }
            self.cut_full(k, &mut lending, &mut unwound);
        }
        for t in self.tables.iter_mut() {
            t.len = k * bs;
            t.tail_may_be_shared = false;
            // Into an empty table, new work until it holds a block beyond
            // the match; into a reservation, which was its admission,
            // running. Every block of the match is cached.
            t.matched = if reserved { 0 } else { k };
            t.published = k;
        }
        if reserved {
            self.refill_reservation(k, &mut lending, &mut unwound);
        }
        Ok(k)
    }

    /// After a match of `k` blocks into a reservation: gives each group the
    /// blocks it reserved beyond the match (so that its capacity stays at
    /// least what it was), from the reserved blocks the match did not
    /// lend, then from the credits it kept, and gives back what is left
    /// of both. Each table holds exactly its `k` entries of the match on
    /// entry. A waker's panic out of the give-back goes to `unwound`, with
    /// the tables whole.
    fn refill_reservation(&mut self, k: usize, lending: &mut Lending<'_>, unwound: &mut Unwound) {
        let pool = Arc::clone(self.pool());
        // Taken in order from the front of the scratch list (reserved
        // blocks are alike: held alone, uncached, empty); with nothing
        // lent and no hit, each group gets its own back.
        let mut next = 0;
        for (t, &(reserved, _, _)) in self.tables.iter_mut().zip(self.plans.iter()) {
            let mut need = reserved.saturating_sub(k);
            let kept = need.min(self.scratch.len() - next);
            t.blocks.extend_from_slice(&self.scratch[next..next + kept]);
            next += kept;
            need -= kept;
            let paid = need.min(lending.credits);
            if let (Some(p), true) = (lending.pool, paid > 0) {
                p.take_lent(paid, &mut t.blocks);
                lending.credits -= paid;
                need -= paid;
            }
            // Short only if the match lent reserved blocks and another
            // match took a block this one let go of (its place in the
            // capacity went with it): taken from the pool if it has room,
            // as a running sequence's growth.
            if need > 0 {
                let _ = checked_alloc(&*pool, need, &mut t.blocks, |pool, out| {
                    pool.try_alloc_growth(&SequenceCall::new(), need, out)
                });
            }
        }
        if next < self.scratch.len() {
            let left = &self.scratch[next..];
            unwound.catch(|| pool.release(&SequenceCall::new(), left));
        }
        self.scratch.clear();
        if let (Some(p), credits) = (lending.pool, std::mem::take(&mut lending.credits)) {
            unwound.catch(|| p.give_back_lent(credits));
        }
    }

    /// Shortens every full group's matched blocks to `k` (see
    /// [`give_back_matched`]; a waker's panic out of a give-back goes to
    /// `unwound`).
    fn cut_full(&mut self, k: usize, lending: &mut Lending<'_>, unwound: &mut Unwound) {
        let faults = self.faults;
        for (t, kind) in self.tables.iter_mut().zip(self.groups.as_slice()) {
            if *kind == KvGroup::Full && t.blocks.len() > k {
                give_back_matched(&**t.pool(), lending, &t.blocks[k..], faults, unwound);
                t.blocks.truncate(k);
            }
        }
    }

    /// A sliding group's part of a match: with its table holding a run of
    /// matched blocks `null..len` (null entries before), finds the largest
    /// `j <= k` whose window it can serve, holding exactly that window's
    /// blocks, and returns `j`.
    fn settle(
        &mut self,
        g: usize,
        kind: KvGroup,
        k: usize,
        keys: &[crate::hash::BlockHash],
        lending: &mut Lending<'_>,
        unwound: &mut Unwound,
    ) -> usize {
        let faults = self.faults;
        let t = &mut self.tables[g];
        let pool = Arc::clone(t.pool());
        let bs = t.bs;
        // Blocks past the candidate go back.
        if t.blocks.len() > k {
            let from = t.null.max(k);
            give_back_matched(&*pool, lending, &t.blocks[from..], faults, unwound);
            t.blocks.truncate(k);
            t.null = t.null.min(k);
        }
        // An empty run starts afresh at `k`.
        if t.null == t.blocks.len() {
            t.blocks.clear();
            t.blocks.resize(k, BlockId::NULL);
            t.null = k;
        }
        loop {
            let end = t.blocks.len();
            let need = kind.first_needed_block(end * bs, bs);
            if t.null <= need {
                // The window is held; what lies before it goes back.
                give_back_matched(&*pool, lending, &t.blocks[t.null..need], faults, unwound);
                t.blocks[t.null..need].fill(BlockId::NULL);
                t.null = need;
                return end;
            }
            // Match the window's missing head, `need..null`, into the
            // scratch list, after the reserved blocks waiting there.
            let from = match_run(
                &*pool,
                lending,
                usize::MAX,
                &keys[need..t.null],
                &mut self.scratch,
                unwound,
            );
            let m = self.scratch.len() - from;
            if m == t.null - need {
                t.blocks[need..t.null].copy_from_slice(&self.scratch[from..]);
                self.scratch.truncate(from);
                t.null = need;
                continue;
            }
            // Block `need + m` is missing: no window ending past it can be
            // served. The run above it goes back; the blocks matched below
            // it are the new run, ending at the new candidate.
            give_back_matched(&*pool, lending, &t.blocks[t.null..], faults, unwound);
            t.blocks.truncate(need);
            t.blocks.extend_from_slice(&self.scratch[from..]);
            self.scratch.truncate(from);
            t.null = need;
        }
    }

    /// Publishes the keys of every group's full blocks, as
    /// [`Sequence::publish`] does in each table (a sliding group publishes
    /// the full blocks it still holds), and returns how many became cached
    /// in all.
    ///
    /// A sliding group gives blocks back as soon as an append moves its
    /// window past them, published or not: publish a step's full blocks
    /// before the next append (as vLLM caches blocks as they are
    /// computed), or a prefill in several chunks leaves its early blocks
    /// uncached in the sliding groups, and a later prompt sharing only
    /// part of this one finds no window at its end.
    ///
    /// With [KV events](crate::BlockPoolBuilder::kv_events), the stores are
    /// reported under the keys the index holds, the groups' own
    /// ([`GroupKeys::group`]), never the content keys: a chain per group,
    /// each block's parent that group's key of the block before it in the
    /// sequence (also when a sliding window gave that block back), and
    /// each event names its group ([`KvEvent`](crate::KvEvent)'s `group`,
    /// also in the removals of these keys).
    ///
    /// # Errors
    ///
    /// [`HybridError::OtherGroups`] if `keys` were made for other groups;
    /// nothing changes then.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{hash_blocks, BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let pool = Arc::new(BlockPool::new(16, 4));
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    /// let mut base = Vec::new();
    /// hash_blocks(b"", &[9; 12], 4, &mut base);
    /// let keys = groups.keys(&base);
    /// let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    /// seq.try_append(9).unwrap(); // 2 full blocks a group
    /// assert_eq!(seq.publish(&keys), Ok(4));
    /// assert_eq!(seq.publish(&keys), Ok(0)); // already cached
    /// ```
    pub fn publish(&mut self, keys: &GroupKeys) -> Result<usize, HybridError> {
        if keys.groups() != &self.groups {
            return Err(HybridError::OtherGroups);
        }
        Ok(self
            .tables
            .iter_mut()
            .enumerate()
            .map(|(g, t)| t.publish_in(Some(g), keys.group(g).unwrap_or(&[])))
            .sum())
    }
}

/// Waiting in the pool's queue, which only a [`BlockPool`] has.
impl HybridSequence<BlockPool> {
    /// [`try_reserve`](Self::try_reserve), waiting: resolves once the
    /// missing blocks of every group for `tokens` more tokens are taken,
    /// together, with `headroom` blocks still free besides (see
    /// [`Sequence::reserve`] for the queue's rules).
    ///
    /// # Errors
    ///
    /// `NeverFits` (at once) or `Closed`; on error, and when the future is
    /// dropped before it resolves, the sequence is unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let pool = Arc::new(BlockPool::new(8, 16));
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 64 }]).unwrap();
    /// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    /// runtime.block_on(seq.reserve(40, 2)).unwrap(); // 3 blocks a group, 2 left free
    /// assert_eq!(pool.used_blocks(), 6);
    /// ```
    pub async fn reserve(&mut self, tokens: usize, headroom: usize) -> Result<(), ReserveError> {
        let missing = self.missing_within_len(tokens, headroom)?;
        if missing == 0 {
            return Ok(());
        }
        self.never_fits_beside_own(missing, missing, headroom, 0)?;
        let pool = Arc::clone(self.pool());
        // The list travels with the future, so that a cancelled wait
        // leaves the sequence untouched (the pool's future gives back
        // anything granted to it).
        self.clear_scratch();
        let mut scratch = std::mem::take(&mut self.scratch);
        let granted = pool
            .alloc_with_headroom(missing, headroom, &mut scratch, Holder::Sequence)
            .await;
        self.scratch = scratch;
        granted?;
        self.distribute_reserved();
        Ok(())
    }
}

/// What a hybrid match into a reservation lends the pool and keeps (see
/// [`HybridSequence::try_match_prefix`]).
struct Lending<'p> {
    /// The pool itself, when the sequence holds reserved blocks and its
    /// allocator is a `BlockPool`: they pay
    /// for the match's revivals (see [`match_run`]), and the matched blocks
    /// the match lets go of keep their places in the capacity (see
    /// [`give_back_matched`]); `None` otherwise.
    pool: Option<&'p BlockPool>,
    /// Places in the capacity kept from matched blocks let go of: turned
    /// into the reservation's fresh blocks at the end, or given back.
    credits: usize,
}

/// Matches `keys` into the end of `scratch`, whose entries are reserved
/// blocks (none in a match into an empty sequence) of which a revival may
/// lend up to `cap` to the pool (the last first), and returns the index
/// in `scratch` of the first block matched: the reserved blocks not lent
/// are `scratch[..index]`. A waker's panic out of the match goes to
/// `unwound`, with `scratch` so arranged.
fn match_run<A: BlockAllocator + ?Sized>(
    pool: &A,
    lending: &Lending<'_>,
    cap: usize,
    keys: &[crate::hash::BlockHash],
    scratch: &mut Vec<BlockId>,
    unwound: &mut Unwound,
) -> usize {
    let base = scratch.len();
    let lendable = base.min(cap);
    // Room for every block that can match (distinct blocks, so no more
    // than the pool has) and for a lent block taken back, so that the
    // pushes inside the match cannot allocate (or panic) halfway.
    scratch.reserve(keys.len().min(pool.num_blocks()) + 1);
    let mut lent = 0;
    unwound.catch(|| match lending.pool {
        Some(p) if lendable > 0 => {
            p.match_prefix_lending(keys, scratch, lendable, &mut lent);
        }
        _ => {
            pool.match_prefix(&SequenceCall::new(), keys, scratch);
        }
    });
    // The lent entries, the last of the reserved ones, are the pool's now.
    let lent = lent.min(lendable);
    scratch.drain(base - lent..base);
    base - lent
}

/// Gives back `ids`, matched blocks that the match's final prefix does not
/// need: released, or, in a match into a reservation over a `BlockPool`,
/// let go of with their
/// places in the capacity kept as `lending`'s credits (a block another
/// holder keeps leaves none). Under loom's `cut_releases` control the
/// places go back too. A waker's panic out of a release goes to `unwound`.
fn give_back_matched<A: BlockAllocator + ?Sized>(
    pool: &A,
    lending: &mut Lending<'_>,
    ids: &[BlockId],
    faults: Faults,
    unwound: &mut Unwound,
) {
    if ids.is_empty() {
        return;
    }
    match lending.pool {
        Some(p) => {
            let kept = p.lend_held(ids);
            if faults.cut_releases() {
                unwound.catch(|| p.give_back_lent(kept));
            }
            lending.credits += kept;
        }
        None => unwound.catch(|| pool.release(&SequenceCall::new(), ids)),
    }
}

impl<A: BlockAllocator + ?Sized> Drop for HybridSequence<A> {
    fn drop(&mut self) {
        // Blocks in transit only if a panic interrupted a call; the tables
        // give theirs back themselves.
        if !self.scratch.is_empty() {
            if let Some(t) = self.tables.first() {
                t.pool().release(&SequenceCall::new(), &self.scratch);
            }
        }
    }
}

impl<A: BlockAllocator + ?Sized> fmt::Debug for HybridSequence<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HybridSequence")
            .field("len", &self.len())
            .field("groups", &self.groups)
            .field("tables", &self.tables)
            .finish()
    }
}
