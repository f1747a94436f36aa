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
//! A drop is a read-modify-write (a CAS), also a drop of a reference that
//! its holder is sure of, unless the block is a sequence's: a racing double
//! free through the public `BlockPool::free` can change the same count,
//! and exactly one of the two drops must see it reach 0 and give the block
//! back.
//!
//! # Sequence blocks
//!
//! A block taken for a [`Sequence`](crate::Sequence) (allocated, evicted
//! or revived by a match into an empty count) carries `SEQUENCE`, which
//! the count keeps while it has references: forks and matches add holders
//! that are sequences too. `BlockPool::free` refuses such a block, in its
//! checks and in its CAS (which compares the whole word), so no raw free
//! ever writes its word. A sequence that reads its block's word as
//! `SEQUENCE` with a count of 1, neither cached nor claimed, is then its
//! only holder and the only thread that may write the word (a match
//! revives only cached blocks, an eviction takes only unreferenced ones, a
//! claim and a fork need a holder): it gives the block back with a plain
//! store, no read-modify-write. A count that reaches 0 clears the flag.
//!
//! # The claim's reference
//!
//! A publisher's claim holds a reference of its own: `BUSY` is set together
//! with one more count, and the commit (or the unclaim) clears `BUSY` and
//! drops that reference in the same CAS. So a claimed block is never free,
//! whatever the block's holders do meanwhile, including a double free that
//! takes the publishing holder's own reference (a raw `BlockPool::free`
//! refuses a sequence's block, so the protocol does not rely on that, and
//! loom's claim controls let the free ignore the flag): the key words that
//! the claim writes belong to a block no
//! one else can be handed, and whichever of the commit and the holders'
//! drops takes the last reference gives the block back through the normal
//! path (evictable if the commit set `CACHED`, free otherwise). No other
//! drop can take the claim's reference: a drop, or a fork's `add`, that
//! finds only that reference left finds nothing of its own.
//! The alternative, a last drop that clears a claim it finds and a commit
//! that fails on it, would let the block be reallocated while the
//! publisher still writes its key words and holds an index entry for it.
//!
//! # Generations
//!
//! The generation is 30 bits and wraps. A matcher's revival, an evictor's
//! take and a rival's kill each compare a state read earlier with the
//! current one; the comparison is fooled only if, between the read and the
//! CAS of one stalled thread, the same block lost a key or a claim exactly
//! a multiple of 2^30 (about 1.07e9) times and is back in the same count
//! and flags. Such a loss is an eviction, a reset or a truncate that drops
//! the key (each followed by a new allocation and publish of the block
//! before the next), or a publish of the block that loses or is refused (a
//! claim and an unclaim, the cheapest: no allocation). Even at ten million
//! losses a second on that one block, the stalled thread would have to
//! stall for over 100 seconds between its read and its CAS.

use std::collections::TryReserveError;

use crate::array::{bytes_of, Room};
use crate::id::BlockId;
use crate::sync::{AtomicU64, Faults, Ordering};

/// A reference count above this panics instead of wrapping (a claim is
/// refused instead): the largest count that fits the 29 bits of [`COUNT`].
const MAX_REFS: u64 = COUNT;

/// The reference count's bits.
pub(super) const COUNT: u64 = 0x1FFF_FFFF;
/// Every holder of the block is a [`Sequence`](crate::Sequence) (see the
/// module doc): a raw `BlockPool::free` refuses it.
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
/// The bit where the generation starts.
const GEN_SHIFT: u32 = GEN.trailing_zeros();

/// The reference count in a state word.
pub(super) const fn count_of(state: u64) -> u64 {
    state & COUNT
}

/// The generation in a state word.
pub(super) const fn gen_of(state: u64) -> u64 {
    state >> GEN_SHIFT
}

/// The references of a block's holders in a state word: the count without
/// the claim's own reference (`claim_ref` is 1, or 0 under loom's
/// `unreferenced_claim` control).
const fn holders_of(state: u64, claim_ref: u64) -> u64 {
    if state & BUSY != 0 {
        count_of(state).saturating_sub(claim_ref)
    } else {
        count_of(state)
    }
}

/// `state` with `SEQUENCE` cleared if its count is 0: a block without
/// references has no holders to be sequences.
const fn settle(state: u64) -> u64 {
    if count_of(state) == 0 {
        state & !SEQUENCE
    } else {
        state
    }
}

/// [`Refs::drop_sole`] on the words `words`.
#[inline]
fn drop_sole_in(words: &[AtomicU64], id: BlockId) -> bool {
    let word = &words[id.index()];
    // Acquire: if another holder dropped its reference, its accesses to the
    // block happen-before our give-back (its drop is a Release CAS, which
    // this load reads from).
    let state = word.load(Ordering::Acquire);
    if state & (SEQUENCE | CACHED | BUSY | COUNT) != SEQUENCE | 1 {
        return false;
    }
    // Relaxed: no other thread reads this word to decide anything until the
    // block is handed out again, and the give-back that follows (a Release
    // `fetch_or` on the free list) publishes it.
    word.store(state & !(SEQUENCE | COUNT), Ordering::Relaxed);
    true
}

/// Whether a state word is that of an evictable block: cached, not
/// claimed, no reference.
pub(super) const fn is_evictable(state: u64) -> bool {
    state & (CACHED | BUSY | COUNT) == CACHED
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
    const fn flag(self) -> u64 {
        match self {
            Holder::Raw => 0,
            Holder::Sequence => SEQUENCE,
        }
    }
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
}

/// What a publisher's deferral to a rival claim on a lower block id found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Defer {
    /// The rival's claim is marked `DEFERRED`: it will commit, or look for
    /// the key's holders again before it gives up.
    Deferred,
    /// The rival committed: it holds the key.
    Committed,
    /// The rival's claim is gone, or killed (a killed claim cannot commit
    /// without looking again): it is no reason to give up.
    Gone,
}

/// What a kill attempt on a rival publisher's claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kill {
    /// The rival's claim is marked killed (now or by someone else before).
    Killed,
    /// The rival committed first: it holds the key.
    Committed,
    /// The rival's claim is gone (it lost, or the state is another
    /// incarnation's).
    Gone,
}

/// One state word per block of a pool.
pub(super) struct Refs {
    words: Box<[AtomicU64]>,
    /// The faults of loom's negative controls (none outside them).
    faults: Faults,
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
    fn claim_ref(&self) -> u64 {
        if self.faults.unreferenced_claim() {
            0
        } else {
            1
        }
    }

    /// Block `index`'s holders now (its count without a claim's own
    /// reference), or `None` if out of range. A snapshot.
    pub(super) fn get(&self, index: usize) -> Option<u32> {
        // Relaxed: a snapshot for reporting.
        self.words
            .get(index)
            .map(|r| holders_of(r.load(Ordering::Relaxed), self.claim_ref()) as u32)
    }

    /// A block's holders now, for the checks of a free: a claim's own
    /// reference is not one a free may take.
    pub(super) fn count(&self, id: BlockId) -> u32 {
        // Relaxed: a validation read; the drops that follow are what order.
        let state = self.words[id.index()].load(Ordering::Relaxed);
        holders_of(state, self.claim_ref()) as u32
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

    /// A block's holders now (as [`count`](Self::count)), and whether
    /// every one of them is a sequence (a raw free must refuse it): the
    /// checks of a free, one load.
    pub(super) fn holders(&self, id: BlockId) -> (u32, bool) {
        // Relaxed: a validation read; the drops that follow are what order
        // (and a raw drop's CAS re-checks the flag).
        let state = self.words[id.index()].load(Ordering::Relaxed);
        let sequence = state & SEQUENCE != 0 && !self.faults.free_ignores_sequence();
        (holders_of(state, self.claim_ref()) as u32, sequence)
    }

    /// Adds a reference to a block the caller holds a reference to.
    ///
    /// A CAS that never raises a count from 0, not a `fetch_add`: the
    /// caller's reference can be gone after all, taken by a raw
    /// `BlockPool::free` of the same block (a double free), and then the
    /// block may sit in the free list, where a reference would let it be
    /// handed out and pushed a second time. `Err` then, and nothing changed.
    ///
    /// # Panics
    ///
    /// Panics if the count would exceed `2^29 - 1` (as `Arc` aborts).
    pub(super) fn add(&self, id: BlockId) -> Result<(), ()> {
        let word = &self.words[id.index()];
        // Relaxed: only a guess; the CAS validates it.
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            // Any holder's reference left to add to? (A claim's own
            // reference does not count: a raw free took the caller's.)
            if holders_of(cur, self.claim_ref()) == 0 && !self.faults.blind_add_ref() {
                return Err(());
            }
            if count_of(cur) >= MAX_REFS {
                panic!("reference count overflow on {id}");
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

    /// Whether more than one holder's reference to `id` exists now (a
    /// claim's own reference is not a holder's: a publisher writes only
    /// key words, never the block).
    pub(super) fn is_shared(&self, id: BlockId) -> bool {
        // Acquire: if another holder dropped its reference, its reads of the
        // block happen-before we decide to write into it.
        let state = self.words[id.index()].load(Ordering::Acquire);
        holders_of(state, self.claim_ref()) > 1
    }

    /// Whether `id` holds a key now.
    pub(super) fn is_cached(&self, id: BlockId) -> bool {
        // Acquire: as `is_shared`.
        self.words[id.index()].load(Ordering::Acquire) & CACHED != 0
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
    /// is the only thread that may change its word (see the module doc): it
    /// clears the count with a plain store. Every other drop is a CAS: a
    /// racing `BlockPool::free` of the same block (a double free, possible
    /// on a block that is not a sequence's) can take the count from 1 to 0
    /// between a load and a store, and both sides would then give the block
    /// back. The CAS decides which of the two drops the last reference.
    pub(super) fn drop_held(&self, id: BlockId) -> Result<Dropped, ()> {
        if self.drop_sole(id) {
            return Ok(Dropped::Free);
        }
        self.drop_from(id, false)
    }

    /// Drops the reference of a sequence that holds block `id` alone, if
    /// it does and the block is neither cached nor claimed: a plain store,
    /// and `true` (the block is free). `false`, and nothing changed,
    /// otherwise.
    #[inline]
    pub(super) fn drop_sole(&self, id: BlockId) -> bool {
        drop_sole_in(&self.words, id)
    }

    /// [`drop_sole`](Self::drop_sole), as a function that holds the words
    /// themselves (so that a loop keeps them in registers).
    #[inline]
    pub(super) fn sole_dropper(&self) -> impl Fn(BlockId) -> bool + '_ {
        let words: &[AtomicU64] = &self.words;
        move |id| drop_sole_in(words, id)
    }

    /// What a block whose last reference went from `state` becomes.
    fn last(state: u64) -> Dropped {
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
        loop {
            // Any holder's reference left to drop? The claim's own reference
            // is the commit's or the unclaim's to drop: a drop that finds
            // only that one left lost it to a double free. A raw free finds
            // none of its own on a sequence's block: it was freed and taken
            // for a sequence since the free's checks.
            if holders_of(cur, self.claim_ref()) == 0 || (refuse_sequence && cur & SEQUENCE != 0) {
                return Err(());
            }
            let next = if count_of(cur) == 1 {
                (cur - 1) & !SEQUENCE
            } else {
                cur - 1
            };
            // AcqRel on success: Release orders this holder's accesses to
            // the block before the last drop; Acquire lets the last dropper
            // (who gives the block back) see every other holder's
            // accesses, and the Release half is what a reviving matcher or
            // an evictor acquires. Relaxed on failure: we only retry with
            // the fresh value.
            match word.compare_exchange_weak(
                cur,
                next,
                self.faults.free_ordering(Ordering::AcqRel),
                Ordering::Relaxed,
            ) {
                Ok(_) if count_of(cur) == 1 => return Ok(Self::last(cur)),
                Ok(_) => return Ok(Dropped::Kept),
                Err(actual) => cur = actual,
            }
        }
    }

    /// A matcher's revival: one more reference on a cached block whose
    /// state the matcher read as `seen` (and whose key it compared since),
    /// if the state is still exactly `seen`. A changed generation means
    /// the key may have changed: then nothing happens and `false`. The
    /// matcher is a sequence: a revival from a count of 0 sets
    /// `SEQUENCE` (one from a higher count keeps the flag as it is).
    pub(super) fn revive(&self, id: BlockId, seen: u64) -> bool {
        let word = &self.words[id.index()];
        if count_of(seen) >= MAX_REFS {
            panic!("reference count overflow on {id}");
        }
        if self.faults.no_generation_check() {
            // loom's control: whatever the block holds now.
            // Acquire: as below.
            return word.fetch_add(1, Ordering::Acquire) & CACHED != 0;
        }
        // Acquire on success: synchronises with the Release that set the
        // cached flag (the publish) and with the last drop (a revival of an
        // evictable block), so the publisher's writes into the block and
        // every earlier holder's accesses happen-before our use. Relaxed on
        // failure: the caller reloads.
        let next = if count_of(seen) == 0 {
            (seen + 1) | SEQUENCE
        } else {
            seen + 1
        };
        word.compare_exchange(seen, next, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// An eviction: takes an evictable block whose state read `seen`,
    /// dropping its key (a new generation) and giving `holder` one
    /// reference, if the state is still exactly `seen`.
    pub(super) fn evict(&self, id: BlockId, seen: u64, holder: Holder) -> bool {
        if !self.may_evict(seen) {
            return false;
        }
        let next = (seen & !(COUNT | SEQUENCE | DEFERRED | CACHED | BUSY | KILLED))
            .wrapping_add(GEN)
            | holder.flag()
            | 1;
        // Acquire on success: synchronises with the last holder's drop
        // (Release), so its accesses happen-before ours. Relaxed on
        // failure: the caller looks elsewhere.
        self.words[id.index()]
            .compare_exchange(seen, next, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Whether an evictor may try to take a block whose state read
    /// `state`: an evictable one (under loom's `evict_referenced` control,
    /// any cached one).
    pub(super) fn may_evict(&self, state: u64) -> bool {
        is_evictable(state) || (self.faults.evict_referenced() && state & CACHED != 0)
    }

    /// Drops the key of a cached block that the caller holds alone (state
    /// `CACHED` with a count of 1): `true` if it did. `false`, and nothing
    /// changed, if the block is shared or holds no key.
    pub(super) fn uncache_sole(&self, id: BlockId) -> bool {
        let word = &self.words[id.index()];
        // Acquire: if another holder dropped its reference, its reads of the
        // block happen-before we decide to write into it.
        let seen = word.load(Ordering::Acquire);
        if seen & (CACHED | COUNT) != CACHED | 1 {
            return false;
        }
        let next = (seen & !CACHED).wrapping_add(GEN);
        // Acquire on success: as the load above. Relaxed on failure: a
        // matcher took a reference meanwhile, and the block stays cached.
        word.compare_exchange(seen, next, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Claims a referenced, uncached, unclaimed block for publishing:
    /// sets `BUSY` and takes the claim's own reference (see the module
    /// doc). `false` if the block is cached, claimed, has no reference, or
    /// has so many that one more would overflow.
    ///
    /// The claim starts `KILLED`, and [`arm`](Self::arm) clears that once
    /// the publisher has written its key words. A publisher's rescan can
    /// find an index entry that an earlier claim of the block left under
    /// another key, and read the state word of this later claim with the
    /// earlier key words (this claim's are not written yet, or not
    /// visible): were the claim a rival from the start, the rescan would
    /// defer to it, or lose to its commit, although it publishes another
    /// key. A rescan ignores a killed claim; one that reads the state after
    /// the arm sees this claim's key words.
    pub(super) fn claim(&self, id: BlockId) -> bool {
        let word = &self.words[id.index()];
        let claim_ref = self.claim_ref();
        let unarmed = if self.faults.armed_claim() { 0 } else { KILLED };
        // Relaxed: only a guess; the CAS validates it.
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            if cur & (CACHED | BUSY) != 0 || count_of(cur) == 0 || count_of(cur) >= MAX_REFS {
                return false;
            }
            // Relaxed (both): the caller holds a reference, so the block is
            // not free, and the claim publishes nothing; the key it writes
            // next is published by the index insert and the commit
            // (Release). A raw free that takes the caller's reference
            // afterwards leaves the claim's, so the block stays ours.
            match word.compare_exchange_weak(
                cur,
                (cur | BUSY | unarmed) + claim_ref,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Makes a claim a rival of its key's other publishers: clears the
    /// `KILLED` that [`claim`](Self::claim) set, after the publisher wrote
    /// its key words and before it inserts its index entry (so no rival
    /// has killed the claim yet: none has found it).
    pub(super) fn arm(&self, id: BlockId) {
        // Release: a rescan that reads this state or a later one of its
        // release sequence (Acquire) sees the key words written before,
        // not those of an earlier claim of the block. (Relaxed under
        // loom's `relaxed_publish` control, which takes every release of a
        // publish away.)
        self.words[id.index()].fetch_and(!KILLED, self.faults.publish_ordering(Ordering::Release));
    }

    /// What the drop of the claim's own reference from `cur` did.
    fn claim_dropped(&self, cur: u64, cached: bool) -> Dropped {
        if self.claim_ref() == 0 || count_of(cur) != 1 || self.faults.claim_drop_kept() {
            Dropped::Kept
        } else if cached {
            Dropped::Evictable
        } else {
            Dropped::Free
        }
    }

    /// Commits a claim: the block becomes cached and the claim's reference
    /// goes, in one CAS; `Ok` says what became of the block (`Evictable`
    /// if that was its last reference: every holder let go meanwhile, and
    /// the caller gives it back). `Err` if a rival killed the claim: then
    /// nothing changed, and the claim stays for `unclaim`.
    pub(super) fn commit(&self, id: BlockId) -> Result<Dropped, ()> {
        let word = &self.words[id.index()];
        let claim_ref = self.claim_ref();
        // Relaxed: only a guess; the CAS validates it.
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            debug_assert!(cur & BUSY != 0, "{id}: commit without a claim");
            if cur & KILLED != 0 {
                return Err(());
            }
            // AcqRel on success: the Release half orders the publisher's
            // writes into the block and its key words before any matcher
            // that reads this state (Acquire) or a later value of its
            // release sequence, as a drop's Release does for the next
            // owner; the Acquire half, when this drops the last reference,
            // lets us (who give the block back) see every holder's accesses,
            // as in `drop_from`. Relaxed on failure: we retry with the fresh
            // value.
            match word.compare_exchange_weak(
                cur,
                settle(((cur & !(BUSY | DEFERRED)) | CACHED) - claim_ref),
                self.faults.publish_ordering(Ordering::AcqRel),
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(self.claim_dropped(cur, true)),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Gives up a claim (a lost or refused publish): clears `BUSY` and
    /// `KILLED`, moves to a new generation, so that a rival's kill aimed
    /// at this claim cannot hit a later one, and drops the claim's
    /// reference; says what became of the block (`Free` if that was its
    /// last reference: the caller gives it back).
    pub(super) fn unclaim(&self, id: BlockId) -> Dropped {
        let word = &self.words[id.index()];
        let claim_ref = self.claim_ref();
        // Relaxed: only a guess; the CAS validates it.
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            let next = settle((cur & !(BUSY | KILLED | DEFERRED)).wrapping_add(GEN) - claim_ref);
            // AcqRel on success: as a drop in `drop_from` (Release orders
            // our key writes before the block's next owner, who may write
            // its own; Acquire lets us, if this is the last reference, see
            // every holder's accesses before we give the block back).
            // Relaxed on failure: we retry with the fresh value.
            match word.compare_exchange_weak(
                cur,
                next,
                self.faults.free_ordering(Ordering::AcqRel),
                Ordering::Relaxed,
            ) {
                Ok(_) => return self.claim_dropped(cur, false),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Gives up a claim that lost, unless a rival publisher deferred to it
    /// since the claim last looked for the key's holders: then clears
    /// `DEFERRED` (and `KILLED`), keeps the claim and returns `Err`; the
    /// caller looks again. Otherwise as [`unclaim`](Self::unclaim).
    ///
    /// Deciding in the CAS that gives the claim up is what makes the
    /// deferral safe: a mark made before it is seen here, and a rival that
    /// marks after it finds the claim gone (a new generation).
    pub(super) fn unclaim_unless_deferred(&self, id: BlockId) -> Result<Dropped, ()> {
        let word = &self.words[id.index()];
        let claim_ref = self.claim_ref();
        // Relaxed: only a guess; the CAS validates it.
        let mut cur = word.load(Ordering::Relaxed);
        loop {
            let deferred = cur & DEFERRED != 0 && !self.faults.ignore_deferral();
            let next = if deferred {
                cur & !(DEFERRED | KILLED)
            } else {
                settle((cur & !(BUSY | KILLED | DEFERRED)).wrapping_add(GEN) - claim_ref)
            };
            // AcqRel on success: for a deferral, the Acquire half
            // synchronises with the deferring rival's mark (Release), so
            // what that rival saw before it (a holder of the key gone, say)
            // is seen by our next look; for an unclaim, as in `unclaim`.
            // Relaxed on failure: we retry with the fresh value.
            match word.compare_exchange_weak(
                cur,
                next,
                self.faults.free_ordering(Ordering::AcqRel),
                Ordering::Relaxed,
            ) {
                Ok(_) if deferred => return Err(()),
                Ok(_) => return Ok(self.claim_dropped(cur, false)),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Clears `KILLED` from a claim whose commit failed on it, so that the
    /// claim can look again and commit if the rival that killed it is gone.
    /// `false` under loom's `ignore_deferral` control (the claim gives up).
    pub(super) fn revoke_kill(&self, id: BlockId) -> bool {
        if self.faults.ignore_deferral() {
            return false;
        }
        // AcqRel: the Acquire half synchronises with the kill (Release), so
        // the killer's index entry, inserted before its kill, is seen by our
        // next look; the Release half is harmless. A `fetch_and` cannot be
        // fooled: only this claim's publisher clears `BUSY`.
        self.words[id.index()].fetch_and(!KILLED, Ordering::AcqRel);
        true
    }

    /// Defers to a rival's claim on a lower block id, whose state read
    /// `seen`: marks it `DEFERRED`, so that it commits or looks for the
    /// key's holders again (after this mark) before it gives up.
    pub(super) fn defer(&self, id: BlockId, seen: u64) -> Defer {
        let word = &self.words[id.index()];
        let mut cur = seen;
        loop {
            if gen_of(cur) != gen_of(seen) {
                return Defer::Gone;
            }
            if cur & CACHED != 0 {
                return Defer::Committed;
            }
            if cur & BUSY == 0 || cur & KILLED != 0 {
                return Defer::Gone;
            }
            // AcqRel on success, also when `DEFERRED` is set already (a CAS
            // to the same value still writes): the Release half makes what
            // we saw before (a holder of the key gone) visible to the
            // rival's next look, which acquires this value or a later one of
            // its release sequence in `unclaim_unless_deferred`. Acquire on
            // failure: the fresh value is judged again.
            match word.compare_exchange_weak(
                cur,
                cur | DEFERRED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Defer::Deferred,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Marks a rival's claim, whose state read `seen`, killed: its commit
    /// will fail.
    pub(super) fn kill(&self, id: BlockId, seen: u64) -> Kill {
        if self.faults.no_kill() {
            // loom's control: as if the claim had been killed.
            return Kill::Killed;
        }
        let word = &self.words[id.index()];
        let mut cur = seen;
        loop {
            if gen_of(cur) != gen_of(seen) {
                return Kill::Gone;
            }
            if cur & CACHED != 0 {
                return Kill::Committed;
            }
            if cur & BUSY == 0 {
                return Kill::Gone;
            }
            if cur & KILLED != 0 {
                return Kill::Killed;
            }
            // AcqRel on success: the kill is ordered with the rival's
            // commit through this word; the Acquire half sees its key.
            // Acquire on failure: the fresh value is judged again.
            match word.compare_exchange_weak(cur, cur | KILLED, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Kill::Killed,
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
