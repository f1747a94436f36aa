//! The prefix cache's transitions of the per-block state word (its layout
//! is in `crate::pool::refs`): a publisher's claim, arm, commit and
//! unclaim, a rival's deferral and kill, a matcher's revival, an
//! eviction, and a truncate's drop of a key. The core pool's operations on
//! the same word (the first reference, a fork's, the drops) are in
//! `refs.rs`; the design is described in [`crate::implementation`]
//! ("Prefix cache", "The state word").
//!
//! # The claim's reference
//!
//! A publisher's claim holds a reference of its own: `BUSY` is set together
//! with one more count, and the commit (or the unclaim) clears `BUSY` and
//! drops that reference in the same CAS. So a claimed block is never free,
//! whatever the block's holders do meanwhile, including a raw
//! `BlockPool::free` that takes the publishing holder's own reference (a
//! double free): the key words that the claim writes belong to a block no
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

use crate::id::BlockId;
use crate::pool::refs::{
    count_of, settle, Dropped, Holder, Refs, BUSY, CACHED, COUNT, DEFERRED, GEN, KILLED, MAX_REFS,
    SEQUENCE,
};
use crate::sync::Ordering;

/// The bit where the generation starts.
const GEN_SHIFT: u32 = GEN.trailing_zeros();

/// The generation in a state word.
const fn gen_of(state: u64) -> u64 {
    state >> GEN_SHIFT
}

/// Whether a state word is that of an evictable block: cached, not
/// claimed, no reference.
pub(super) const fn is_evictable(state: u64) -> bool {
    state & (CACHED | BUSY | COUNT) == CACHED
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

/// A peek's check: whether a block whose state read `seen` (cached) and,
/// after its key words, `now`, kept the key of `seen` between the two
/// reads: the same generation. A block loses its key only with a new
/// generation (so `now` is cached too), and its key words are rewritten
/// only after that (see `Keys::write`).
pub(super) const fn kept_key(seen: u64, now: u64) -> bool {
    gen_of(now) == gen_of(seen)
}

impl Refs {
    /// Whether `id` holds a key now.
    pub(super) fn is_cached(&self, id: BlockId) -> bool {
        // Acquire: as `needs_copy`.
        self.words[id.index()].load(Ordering::Acquire) & CACHED != 0
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
    /// `CACHED` with a count of 1), calling `prepare` once it has seen
    /// that state and before the CAS that drops the key: `Some` of what
    /// `prepare` returned if it did. `None`, and nothing changed, if the
    /// block is shared or holds no key (then `prepare` is not called, or
    /// what it returned is dropped).
    pub(super) fn uncache_sole<T>(&self, id: BlockId, prepare: impl FnOnce() -> T) -> Option<T> {
        let word = &self.words[id.index()];
        // Acquire: if another holder dropped its reference, its reads of the
        // block happen-before we decide to write into it; and the commit
        // that cached the block happens-before `prepare`.
        let seen = word.load(Ordering::Acquire);
        if seen & (CACHED | COUNT) != CACHED | 1 {
            return None;
        }
        let prepared = prepare();
        let next = (seen & !CACHED).wrapping_add(GEN);
        // Acquire on success: as the load above. Relaxed on failure: a
        // matcher took a reference meanwhile, and the block stays cached.
        word.compare_exchange(seen, next, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| prepared)
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
    /// the arm sees this claim's key words. (A sequence that holds the
    /// block alone writes its key words first and claims armed, with
    /// [`claim_sole`](Self::claim_sole).)
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

    /// The state of block `id`, which the caller holds, if it holds it
    /// alone and the block is neither cached nor claimed: `SEQUENCE`, a
    /// count of 1 and no other flag. The caller is a sequence that called
    /// this pool itself (not through a forwarder, which may count a fork's
    /// share on its own: see `SequenceCall::is_straight_to`), so the count
    /// is every holder's. From this load on no other thread writes the
    /// word, or the block's key words, until the caller claims the block:
    /// a raw call refuses a sequence's block, a fork adds a reference only
    /// from its parent (the caller, busy here), and every other writer of
    /// the word needs a count above 1, `CACHED` or `BUSY` in it (see
    /// `refs.rs`, "Fresh blocks"). `None` otherwise (the caller claims with
    /// a CAS).
    pub(super) fn sole_unclaimed(&self, id: BlockId) -> Option<u64> {
        // Acquire: a co-holder's drop (a Release CAS, the last write of the
        // word before this load) and its accesses to the block, the key
        // words of a claim it gave up included, happen-before the key words
        // we write next.
        let state = self.words[id.index()].load(Ordering::Acquire);
        let flags = state & (GEN - 1);
        let sole = if self.faults.shared_sole_claim() {
            // loom's control: any count.
            flags & !COUNT == SEQUENCE && count_of(flags) > 0
        } else {
            flags == SEQUENCE | 1
        };
        sole.then_some(state)
    }

    /// The claim of a block that the caller holds alone, whose state it
    /// read as `seen` ([`sole_unclaimed`](Self::sole_unclaimed)): one store
    /// of `BUSY` and the claim's reference, armed, since the caller has
    /// written the claim's key words already (no other thread wrote the
    /// word since `seen`). From here on rivals may defer to or kill the
    /// claim, as any.
    pub(super) fn claim_sole(&self, id: BlockId, seen: u64) {
        // Release: a rescan that reads this state or a later one of its
        // release sequence (Acquire) sees the key words written before,
        // not those of an earlier claim of the block; as the arm's.
        // (Relaxed under loom's `relaxed_publish` control.)
        self.words[id.index()].store(
            (seen | BUSY) + self.claim_ref(),
            self.faults.publish_ordering(Ordering::Release),
        );
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
}
