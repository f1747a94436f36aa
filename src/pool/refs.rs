//! Per-block state words: the reference count, the prefix cache's flags
//! and a generation, in one `AtomicU64` per block, the single truth about a
//! block.
//!
//! ```text
//! bits  0..29   reference count (0 while free or evictable)
//! bit   29      SEQUENCE: every holder is a sequence (a raw
//!               `BlockPool::free` refuses the block)
//! bit   30      DEFERRED: a rival publisher of the same key on a higher
//!               block id gave up in this claim's favour
//! bit   31      CACHED: the block holds a key that can match
//! bit   32      BUSY: a publisher has claimed the block to give it a key
//! bit   33      KILLED: a rival publisher of the same key won, or the
//!               claim's key is not written yet
//! bits 34..64   generation: bumped whenever the block loses a key or a
//!               claim, so a state value names one incarnation of its key
//! ```
//!
//! This file holds the core pool's operations on the word: the first
//! reference of an allocation, a fork's added reference and every drop.
//! Only the prefix cache (`super::prefix`, whose `state.rs` holds its
//! transitions: claims, commits, revivals, evictions, and the generation's
//! argument) sets the flags and the generation; in a pool without it they
//! stay 0. The core reads two of them: a drop of the last reference of a
//! `CACHED` block hands the block to the prefix cache (it becomes
//! evictable) instead of the free list, and a `BUSY` block's claim holds
//! one reference that is not a holder's.
//!
//! A drop is a read-modify-write (a CAS), also a drop of a reference that
//! its holder is sure of, unless the block is a sequence's held by the
//! dropper alone (below): a racing double free through the public
//! `BlockPool::free` can change the same count, and exactly one of the two
//! drops must see it reach 0 and give the block back.
//!
//! # Sequence blocks
//!
//! A block taken for a [`Sequence`](crate::Sequence) (allocated, evicted
//! or revived by a match into an empty count) carries `SEQUENCE`, which
//! the count keeps while it has references: forks and matches add holders
//! that are sequences too. A count that reaches 0 clears the flag.
//!
//! # Fresh blocks: the uncounted reference
//!
//! A sequence's take writes no state word for the blocks it gets from one
//! word of the free list's bitmap if they are 8 or more
//! (`BlockPool::take_free`; fewer, and blocks evicted for it, are
//! counted): the blocks are *fresh*, each held through one uncounted
//! reference, its taker's, which the free list's fresh bitmap records (a
//! bit per block, set by the take, one `fetch_or` a word, a store when the
//! take emptied the word). The state word
//! of a fresh block stays bare, as the free list left it: no count, key
//! or claim. Its holder gives it back without writing the word either: it
//! clears the fresh bit and sets the free bit, one `fetch_and` (a store
//! for a whole word) and one `fetch_or` a word of the bitmaps; a run of
//! fresh blocks goes back
//! without reading their words (one listed among shared or cached blocks
//! is read first, `BlockPool::drop_held_refs`; a list that is one run of
//! fresh blocks goes back a word at a time, `FreeList::give_fresh_run`).
//! A fence that retires it
//! holds that reference on the sequence's behalf, and gives it back the
//! same way.
//!
//! The holder counts the reference in the word, then clears the bit,
//! before the block is shared or claimed: it stores `SEQUENCE` and a
//! count of 1 ([`count_fresh`](Refs::count_fresh)), and a fork adds
//! its reference to that, a publisher claims the counted word. Only the
//! holder writes a bare word of a block it holds: a raw
//! free or add, a revival, an eviction and a rival's deferral or kill
//! each need a count, `CACHED` or `BUSY` in the word (compared whole in
//! their CAS). A raw call's checks read a bare word's fresh bit (see
//! `BlockPool::holders_now`).
//!
//! A sequence that reads its block's word as `SEQUENCE` with a count of 1,
//! neither `CACHED` nor `BUSY`, gives it back with a plain store of the
//! word with the count and the flag cleared: no read-modify-write, no loop
//! (the common case of a fresh block's give-back). That is sound because
//! from that load on no other thread writes the word until the block is
//! handed out again; every writer of the word is one of:
//!
//! * **Its holders, through the sealed calls.** A sequence's `release`,
//!   `add_refs`, `retire`, `publish` and `uncache_if_sole` take a
//!   [`SequenceCall`](crate::SequenceCall), which only the crate's
//!   sequences build, for blocks they hold: outside code cannot list a
//!   sequence's block (no double release, no release of
//!   `Sequence::blocks` racing the sequence's drop; an allocator that
//!   forwards to a `BlockPool` passes its token on to the same call, as
//!   the trait's contract requires). A count of 1 means
//!   the dropper is the only holder: a fork adds a reference only from
//!   its parent, a holder, through `&self` (so not while the parent
//!   drops), and a co-holder that dropped its reference wrote nothing
//!   after that drop. A fence's references are the fence's once retired,
//!   and a completion takes the fence's list out under its lock, so each
//!   is dropped once.
//! * **A raw call.** `BlockPool::free` and `BlockPool::add_refs` refuse a
//!   `SEQUENCE` block, in their checks and in their CAS (which compares
//!   the whole word), so no raw call ever writes its word.
//! * **The prefix cache.** A claim (`BUSY`) is a holder's publish (a
//!   store, not a CAS, by a sequence that called the pool itself and read
//!   its block as `SEQUENCE` with a count of 1: no one else writes the
//!   word until it claims); a
//!   rival's deferral or kill CASes only a `BUSY` word; a match's revival
//!   and an eviction (also `reset_prefix_cache`'s) CAS from a `CACHED`
//!   word they read, the whole word compared; `uncache_if_sole` is a
//!   holder's. None of them can succeed on an uncached, unclaimed word.
//! * **An allocation's first reference.** Only on a block taken from the
//!   free list, where this block is not until the store is followed by
//!   its give-back.
//!
//! Every other drop, and any drop that reads another value, takes the CAS
//! loop of a raw free.

use std::collections::TryReserveError;

use crate::array::{bytes_of, Room};
use crate::id::BlockId;
use crate::sync::{AtomicU64, Faults, Ordering};

/// The largest reference count: the 29 bits of [`COUNT`]. A fork's
/// reference, or a claim's, is refused above it, and a revival panics.
pub(super) const MAX_REFS: u64 = COUNT;

/// The reference count's bits.
pub(super) const COUNT: u64 = 0x1FFF_FFFF;
/// Every holder of the block is a [`Sequence`](crate::Sequence) (see the
/// module doc): a raw `BlockPool::free` or `BlockPool::add_refs` refuses
/// it.
pub(super) const SEQUENCE: u64 = 1 << 29;
/// A rival publisher of the same key on a higher block id gave up in
/// favour of this claim: the claim must not give up without looking for
/// the key's holders again (see `BlockPool::publish_block`).
pub(super) const DEFERRED: u64 = 1 << 30;
/// The block holds a key that can match.
pub(super) const CACHED: u64 = 1 << 31;
/// A publisher has claimed the block (and holds one reference for it).
pub(super) const BUSY: u64 = 1 << 32;
/// A rival publisher of the same key won against the claim; also set from
/// the claim until its key words are written (see [`Refs::claim`]), so
/// that a rival never takes the claim for one of its key.
pub(super) const KILLED: u64 = 1 << 33;
/// One step of the generation.
pub(super) const GEN: u64 = 1 << 34;

/// The reference count in a state word.
pub(super) const fn count_of(state: u64) -> u64 {
    state & COUNT
}

/// The references of a block's holders in a state word: the count without
/// the claim's own reference (`claim_ref` is 1, or 0 under loom's
/// `unreferenced_claim` control).
pub(super) const fn holders_of(state: u64, claim_ref: u64) -> u64 {
    if state & BUSY != 0 {
        count_of(state).saturating_sub(claim_ref)
    } else {
        count_of(state)
    }
}

/// `state` with `SEQUENCE` cleared if its count is 0: a block without
/// references has no holders to be sequences.
pub(super) const fn settle(state: u64) -> u64 {
    if count_of(state) == 0 {
        state & !SEQUENCE
    } else {
        state
    }
}

/// Whether a state word is bare: no count, no key, no claim. A free
/// block's word is bare, and so is a fresh block's (see the module doc).
pub(super) const fn is_bare(state: u64) -> bool {
    state & (COUNT | CACHED | BUSY) == 0
}

/// [`Refs::drop_sole`] on a block's state word.
#[inline]
fn drop_sole_word(word: &AtomicU64, faults: Faults) -> bool {
    // Acquire: if another holder dropped its reference (a Release CAS, the
    // last write of the word before this load), its accesses to the block
    // happen-before our give-back and the block's next owner. (Relaxed
    // under loom's `relaxed_sole_drop` control.)
    let state = word.load(faults.sole_drop_ordering(Ordering::Acquire));
    if state & (SEQUENCE | CACHED | BUSY | COUNT) != SEQUENCE | 1 {
        return false;
    }
    // Relaxed: no other thread writes the word of a block its sequence
    // holds alone, uncached and unclaimed (see the module doc), and none
    // reads it to act on it until the block is handed out again; the
    // give-back that follows (a Release `fetch_or` on the free list, which
    // the next owner's take acquires) orders this store before that
    // owner's first reference.
    word.store(state & !(SEQUENCE | COUNT), Ordering::Relaxed);
    true
}

/// Who takes a block: a [`Sequence`](crate::Sequence) (its table, a fork,
/// a match, a fence on its behalf), or a raw caller of
/// [`BlockPool::try_alloc`](crate::BlockPool::try_alloc) and its kin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// A raw caller, who gives blocks back with `BlockPool::free`.
    Raw,
    /// A sequence, which gives blocks back itself.
    Sequence,
}

impl Holder {
    /// The flag a fresh reference of this holder sets.
    pub(super) const fn flag(self) -> u64 {
        match self {
            Holder::Raw => 0,
            Holder::Sequence => SEQUENCE,
        }
    }
}

/// Why [`Refs::add_raw`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RawAddRefused {
    /// No holder's reference is left, or the block is a sequence's: it was
    /// freed (and maybe taken for a sequence) since the caller's checks.
    Gone,
    /// The count is at its maximum.
    Full,
}

/// What a block's state word says of its holders (see [`Refs::holders`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Holders {
    /// The holders' references counted in the word (a claim's own aside).
    pub(super) counted: u32,
    /// Every holder is a sequence.
    pub(super) sequence: bool,
    /// The word is bare: the block is free, or fresh.
    pub(super) bare: bool,
}

/// What became of a block after one of its references was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dropped {
    /// Other references remain.
    Kept,
    /// The last reference went and the block holds no key: back to the
    /// free list.
    Free,
    /// The last reference went and the block holds a key: it stays cached
    /// and becomes evictable.
    Evictable,
    /// The block was fresh, and its uncounted reference went: back to the
    /// free list, its fresh bit cleared (never a state word's answer: the
    /// fresh bitmap's).
    Fresh,
}

/// One state word per block of a pool.
pub(super) struct Refs {
    pub(super) words: Box<[AtomicU64]>,
    /// The faults of loom's negative controls (none outside them).
    pub(super) faults: Faults,
}

impl Refs {
    /// `num_blocks` words of 0 (every block free, no key, generation 0).
    pub(super) fn new(room: Room<AtomicU64>, faults: Faults) -> Refs {
        Refs {
            words: room.fill(|_| AtomicU64::new(0)),
            faults,
        }
    }

    /// Reserves the room of [`new`](Self::new)'s words for `num_blocks`
    /// blocks.
    pub(super) fn room(num_blocks: usize) -> Result<Room<AtomicU64>, TryReserveError> {
        Room::reserve(num_blocks)
    }

    /// The heap bytes [`room`](Self::room) asks for.
    pub(super) fn heap_bytes(num_blocks: usize) -> usize {
        bytes_of::<AtomicU64>(num_blocks)
    }

    /// How many blocks.
    pub(super) fn len(&self) -> usize {
        self.words.len()
    }

    /// The reference a claim holds: 1, or 0 under loom's
    /// `unreferenced_claim` control.
    pub(super) fn claim_ref(&self) -> u64 {
        if self.faults.unreferenced_claim() {
            0
        } else {
            1
        }
    }

    /// Block `index`'s whole state word, loaded with `order`.
    pub(super) fn state(&self, index: usize, order: Ordering) -> u64 {
        self.words[index].load(order)
    }

    /// Gives each block of `ids`, just taken from the free list, its first
    /// reference, for `holder`.
    pub(super) fn set_first(&self, ids: &[BlockId], holder: Holder) {
        let words: &[AtomicU64] = &self.words;
        let flag = holder.flag() | 1;
        for &id in ids {
            let word = &words[id.index()];
            // Relaxed (both): the block is exclusively ours after the
            // Acquire take (a free block holds no key and no claim, so no
            // CAS of another thread can succeed on it); a plain store is
            // cheaper than a read-modify-write.
            let state = word.load(Ordering::Relaxed);
            debug_assert_eq!(count_of(state), 0, "{id} handed out twice");
            debug_assert_eq!(
                state & (CACHED | BUSY | SEQUENCE),
                0,
                "{id} free but cached"
            );
            word.store(state | flag, Ordering::Relaxed);
        }
    }

    /// What a block's state word says of its holders now, with one load:
    /// the references counted (a claim's own aside: it is not one a free
    /// may take), whether every holder is a sequence (a raw call must
    /// refuse it), and whether the word is bare (see [`is_bare`]).
    pub(super) fn holders(&self, id: BlockId) -> Holders {
        // Acquire: a fresh bit read after it (`BlockPool::holders_now`)
        // is read after it. Otherwise a validation read: the drops that
        // follow are what order (and a raw drop's CAS re-checks the count
        // and the flag).
        let state = self.words[id.index()].load(Ordering::Acquire);
        Holders {
            counted: holders_of(state, self.claim_ref()) as u32,
            sequence: state & SEQUENCE != 0 && !self.faults.free_ignores_sequence(),
            bare: is_bare(state),
        }
    }

    /// Whether block `id`'s state word is bare now (see [`is_bare`]).
    pub(super) fn is_bare(&self, id: BlockId) -> bool {
        // Relaxed: the caller's own block, whose bare word only it writes.
        is_bare(self.words[id.index()].load(Ordering::Relaxed))
    }

    /// Counts the caller's uncounted reference to fresh block `id` in its
    /// state word, which is bare: `SEQUENCE` and a count of 1. Only the
    /// block's holder writes its word while it is fresh (see the module
    /// doc); the caller clears the fresh bit after it.
    pub(super) fn count_fresh(&self, id: BlockId) {
        let word = &self.words[id.index()];
        // Relaxed (both): no other thread writes a fresh block's word; the
        // clear of the fresh bit that follows (Release) publishes the count
        // to a raw call's checks.
        let state = word.load(Ordering::Relaxed);
        debug_assert!(is_bare(state), "{id} fresh but not bare");
        word.store(state | SEQUENCE | 1, Ordering::Relaxed);
    }

    /// Adds a reference to a block the caller holds a reference to.
    ///
    /// A CAS that never raises a count from 0, not a `fetch_add`: the
    /// caller's reference can be gone after all, taken by a raw
    /// `BlockPool::free` of the same block (a double free), and then the
    /// block may sit in the free list, where a reference would let it be
    /// handed out and given back a second time. `Err` then, and nothing
    /// changed; `Err` too if the count would exceed `2^29 - 1`.
    pub(super) fn add(&self, id: BlockId) -> Result<(), ()> {
        self.add_unless(id, false).map_err(|_| ())
    }

    /// Adds a reference for a raw caller that holds one
    /// ([`BlockPool::add_refs`](crate::BlockPool::add_refs)): as
    /// [`add`](Self::add), but `Err` on a sequence's block too, checked in
    /// the CAS itself (which compares the whole word), so that no raw call
    /// ever writes the word of a block that sequences hold. `Err`, and
    /// nothing changed, if the block has no holder's reference, is a
    /// sequence's, or its count is at `2^29 - 1` (the error says which).
    pub(super) fn add_raw(&self, id: BlockId) -> Result<(), RawAddRefused> {
        self.add_unless(id, !self.faults.free_ignores_sequence())
    }

    /// The body of [`add`](Self::add) and [`add_raw`](Self::add_raw):
    /// with `refuse_sequence`, a sequence's block is refused as one with
    /// no holder's reference left.
    #[inline]
    fn add_unless(&self, id: BlockId, refuse_sequence: bool) -> Result<(), RawAddRefused> {
        let word = &self.words[id.index()];
        // Relaxed: only a guess; the CAS validates it.
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            // Any holder's reference left to add to? (A claim's own
            // reference does not count: a raw free took the caller's.)
            let gone = holders_of(cur, self.claim_ref()) == 0 && !self.faults.blind_add_ref();
            if gone || (refuse_sequence && cur & SEQUENCE != 0) {
                return Err(RawAddRefused::Gone);
            }
            if count_of(cur) >= MAX_REFS {
                return Err(RawAddRefused::Full);
            }
            // Relaxed (both): the caller holds a reference, so the block is
            // not freed under us; the new reference is handed over by
            // whatever hands over its holder (as with `Arc::clone`).
            match word.compare_exchange_weak(cur, cur + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Whether a holder of `id` must copy it before writing: more than one
    /// holder's reference to it exists now (a claim's own reference is not
    /// a holder's: a publisher writes only key words, never the block), or
    /// it holds a key.
    pub(super) fn needs_copy(&self, id: BlockId) -> bool {
        // Acquire: if another holder dropped its reference, its reads of the
        // block happen-before we decide to write into it.
        let state = self.words[id.index()].load(Ordering::Acquire);
        holders_of(state, self.claim_ref()) > 1 || state & CACHED != 0
    }

    /// Drops one reference for a raw `BlockPool::free`. `Err` if the block
    /// has none (not allocated, or already dropped in this call), or is a
    /// sequence's (see the module doc).
    pub(super) fn drop(&self, id: BlockId) -> Result<Dropped, ()> {
        self.drop_from(id, true)
    }

    /// Drops a reference the caller holds.
    ///
    /// A sole holder of a sequence's block that holds no key and no claim
    /// clears the count with a load and a plain store (see the module doc:
    /// no one else writes that word); every other drop is the CAS loop of
    /// a raw free, where a racing raw double free of the same block can
    /// change the count between a load and a store: the CAS decides which
    /// of the two drops the last reference.
    pub(super) fn drop_held(&self, id: BlockId) -> Result<Dropped, ()> {
        if self.drop_sole(id) {
            return Ok(Dropped::Free);
        }
        self.drop_from(id, false)
    }

    /// Drops the reference of a sequence that holds block `id` alone, if
    /// it does and the block is neither cached nor claimed: a load and a
    /// plain store, and `true` (the block is free). `false`, and nothing
    /// changed, otherwise.
    #[inline]
    pub(super) fn drop_sole(&self, id: BlockId) -> bool {
        drop_sole_word(&self.words[id.index()], self.faults)
    }

    /// [`drop_sole`](Self::drop_sole) on blocks `hi - 1` down to `lo`,
    /// stopping before the first it leaves; returns how many it dropped.
    #[inline]
    pub(super) fn drop_sole_run(&self, lo: usize, hi: usize) -> usize {
        let faults = self.faults;
        self.words[lo..hi]
            .iter()
            .rev()
            .take_while(|word| drop_sole_word(word, faults))
            .count()
    }

    /// What a block whose last reference went from `state` becomes.
    pub(super) fn last(state: u64) -> Dropped {
        if state & CACHED != 0 {
            Dropped::Evictable
        } else {
            Dropped::Free
        }
    }

    /// The body of both drops; `raw` for a raw free, which must not touch
    /// a sequence's block.
    fn drop_from(&self, id: BlockId, raw: bool) -> Result<Dropped, ()> {
        let word = &self.words[id.index()];
        let refuse_sequence = raw && !self.faults.free_ignores_sequence();
        // Relaxed: only a guess; the CAS validates it.
        let mut cur = word.load(Ordering::Relaxed);
        if raw && !refuse_sequence && is_bare(cur) {
            // loom's `free_ignores_sequence` control: the raw free takes a
            // fresh block's uncounted reference too (its checks found the
            // block held), and gives it back while the fresh bit stays.
            return Ok(Dropped::Free);
        }
        loop {
            // Any holder's reference left to drop? The claim's own reference
            // is the commit's or the unclaim's to drop: a drop that finds
            // only that one left lost it to a double free. A raw free finds
            // none of its own on a sequence's block: it was freed and taken
            // for a sequence since the free's checks.
            if holders_of(cur, self.claim_ref()) == 0 || (refuse_sequence && cur & SEQUENCE != 0) {
                return Err(());
            }
            if !raw && self.faults.plain_shared_drop() {
                // loom's `plain_shared_drop` control: a load and a plain
                // store, which a racing drop's store can overwrite.
                // Release: as the CAS's Release half (this holder's
                // accesses before the last drop), so that the control is
                // caught for the lost update, not for an ordering.
                word.store(settle(cur - 1), Ordering::Release);
                return Ok(if count_of(cur) == 1 {
                    Self::last(cur)
                } else {
                    Dropped::Kept
                });
            }
            // AcqRel on success: Release orders this holder's accesses to
            // the block before the last drop; Acquire lets the last dropper
            // (who gives the block back) see every other holder's
            // accesses, and the Release half is what a reviving matcher or
            // an evictor acquires. Relaxed on failure: we only retry with
            // the fresh value.
            match word.compare_exchange_weak(
                cur,
                settle(cur - 1),
                self.faults.free_ordering(Ordering::AcqRel),
                Ordering::Relaxed,
            ) {
                Ok(_) if count_of(cur) == 1 => return Ok(Self::last(cur)),
                Ok(_) => return Ok(Dropped::Kept),
                Err(actual) => cur = actual,
            }
        }
    }

    /// The hook of loom's `blind_undo` control, after a drop of a free
    /// found no reference left: `false` (nothing done) outside that
    /// control; see `Faults::blind_undo`.
    pub(super) fn blind_undo(&self, dropped: &[BlockId]) -> bool {
        self.faults
            .blind_undo(&self.words, dropped.iter().map(|d| d.index()))
    }
}
