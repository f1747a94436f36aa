//! The faults that loom's negative controls inject into the real pool and
//! counter, and the hooks through which they consult them.
//!
//! Only the loom models' build (`cfg(all(test, kvslots_loom))`: the crate's
//! own unit tests under `RUSTFLAGS="--cfg kvslots_loom"`, which
//! `scripts/loom` runs) has faults. There each field of [`Faults`] switches
//! one known bug on, a model in `crate::loom_tests` builds a pool or a
//! counter with it (`BlockPool::with_faults`, `SlotCounter::with_faults`,
//! which exist only in that build) and must be caught by loom. In every
//! other build, the release build included, a `Faults` is an empty type
//! (checked below), and every hook is a constant: the correct behaviour
//! (an identity, or "no fault here"), which the compiler inlines away.
//!
//! A new fault is a field under `#[cfg(all(test, kvslots_loom))]` and a
//! hook whose faulty branch has the same cfg. A field under a wider cfg
//! (`kvslots_loom` alone) fails the check below in a build of the library
//! under `--cfg kvslots_loom` that is not its unit tests (CI lints one).

use super::atomic::{AtomicU64, Ordering};

/// Faults that loom's negative controls inject into a
/// [`BlockPool`](crate::BlockPool) or a [`SlotCounter`](crate::SlotCounter).
/// The default is no fault: the code as shipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Faults {
    /// Take free ids from a word of the free list's bitmap with a load
    /// and a plain store (no read-modify-write): two takers can take the
    /// same block.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) plain_bitmap_take: bool,
    /// Give blocks back to the free list and drop references with
    /// `Relaxed` instead of `Release`.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) relaxed_free: bool,
    /// When a free finds a listed block already freed by another thread,
    /// add the references it dropped back blindly, even to a block that
    /// another holder has freed meanwhile: resurrects a block that sits in
    /// the free list.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) blind_undo: bool,
    /// A raw `BlockPool::free` takes a reference to a block that
    /// sequences hold (it ignores the block's sequence flag, in its checks
    /// and in its CAS): a sequence's drop of its last reference, a load
    /// and a plain store, can then race the free's CAS, and both give the
    /// block back.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) free_ignores_sequence: bool,
    /// Add a reference to a block whose count is 0 (a `fetch_add` with no
    /// check), as a fork does after a raw free took the parent's reference:
    /// revives a block that sits in the free list.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) blind_add_ref: bool,
    /// Revive a cached block by adding a reference to whatever state it is
    /// in now, without checking that its generation (and so its key) is
    /// still the one the matcher compared: a stale hit.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) no_generation_check: bool,
    /// Publish a key with `Relaxed` instead of `Release`: the publisher's
    /// writes into the block need not happen-before the matcher's reads.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) relaxed_publish: bool,
    /// Evict a cached block whatever its reference count: takes a block
    /// that a matcher still holds.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) evict_referenced: bool,
    /// A publisher that finds a rival claim of the same key with a higher
    /// block id does not kill it (it only acts as if it had): both can
    /// commit, and two blocks hold one key.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) no_kill: bool,
    /// A publisher's claim sets `BUSY` without a reference of its own: a
    /// raw free (a double free) can then take the block's last reference
    /// while it is claimed and push it to the free list, and the commit
    /// sets its key on a free block.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) unreferenced_claim: bool,
    /// A commit or unclaim that drops a claimed block's last reference
    /// reports that references remain: nobody gives the block back.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) claim_drop_kept: bool,
    /// A publish claims its block without first looking its key up: a
    /// publish of a key that a committed block holds then claims and
    /// loses only in its rescan, and meanwhile beats a later publish.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) no_held_key_check: bool,
    /// A publisher's claim that a rival deferred to, or that a rival
    /// killed, gives up without looking for the key's holders again: a
    /// later publish that deferred to it is lost when the holder it lost
    /// to is gone (the key ends on no block).
    #[cfg(all(test, kvslots_loom))]
    pub(crate) ignore_deferral: bool,
    /// A publisher's claim is a rival from the start, before its key words
    /// are written: a rescan that reads the claim's state through an entry
    /// that an earlier claim of the block left, with that claim's key
    /// words, defers to it (or loses to its commit) although it publishes
    /// another key.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) armed_claim: bool,
    /// Every lookup of a key in the prefix index (a match, a publish's
    /// check for a holder, its rescan for rivals) reads only the key's
    /// first bucket: an entry that an insert put in the second bucket (the
    /// first being the fuller) is never found.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) first_bucket_only: bool,
    /// A publisher's rescan makes its read-modify-write on the first slot
    /// of the bucket its own entry went into instead of the key's first
    /// bucket: two publishers of one key whose entries went into different
    /// buckets share no word, and each rescan may miss the other's entry
    /// (both commit).
    #[cfg(all(test, kvslots_loom))]
    pub(crate) fence_own_bucket: bool,
    /// An evictor claims its candidates' positions in the eviction ring
    /// before it copies them: a refill that has moved on may be rewriting
    /// those slots with the blocks of its scan, not yet sorted, and the
    /// evictor takes a young block out of order.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) claim_before_read: bool,
    /// A refill that found every evictable block it saw clears the eviction
    /// ring's overflowed bit whatever appends missed since its scan began:
    /// a block released while the ring was overflowed, which the scan
    /// passed, stays out of the ring while appends resume.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) unchecked_overflow_clear: bool,
    /// A refill judges whether every evictable block it saw outside the
    /// ring fit by its first pass's count of them against the room, not by
    /// what its placing pass saw and wrote: a block released between the
    /// passes, ranked by its old stamp, takes the place of an older block
    /// that the first pass counted, and the refill clears the overflowed
    /// bit with that block left out.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) fill_counts_first_pass: bool,
    /// A refill whose publishing CAS fails (an append that read the
    /// overflowed bit clear moved the ring's length, and may have written
    /// over the slots of the entries not yet published) does not scan
    /// again: it takes what it published for the whole refill and ends the
    /// overflow as if it had written every block it saw. A block whose
    /// entry the append displaced stays out of the ring while appends
    /// resume.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) no_rescan_after_raced_publish: bool,
    /// A waiter joins the wait queue without trying again after it is
    /// queued: a release that happened between its failed attempt and its
    /// enqueue found nobody waiting, and nothing wakes it (a lost wakeup).
    #[cfg(all(test, kvslots_loom))]
    pub(crate) late_enqueue: bool,
    /// A waiter that is cancelled (or times out) after it was granted gives
    /// the units back but does not hand them on to the waiters behind it.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) cancel_keeps_grant: bool,
    /// A pending head that is cancelled (or times out) leaves the queue
    /// without re-checking the waiters behind it, which may fit now.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) cancel_no_recheck: bool,
    /// `close` sets the closed flag but does not wake the queued waiters.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) silent_close: bool,
    /// The waiter's half of the wait queue's hand-shake (its
    /// read-modify-write of the allocator's words after it queues) is left
    /// out: a releaser that loads `owed` before the enqueue and a waiter
    /// whose attempt reads the words before the release miss each other
    /// (a lost wakeup).
    #[cfg(all(test, kvslots_loom))]
    pub(crate) unfenced_wait: bool,
    /// Give a retired sequence's references back at once, at the retire,
    /// instead of when its fence completes: a block can be handed out again
    /// while a step that reads it is still in flight.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) early_release: bool,
    /// Take from the home shard's admission count with a load and a plain
    /// store (no read-modify-write): a concurrent take or release on that
    /// shard is lost, and more blocks are admitted than are free.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) racy_take: bool,
    /// A refused slow-path admission keeps the counts it took instead of
    /// giving them back: blocks stay in transit after the call returns
    /// (lost to every later admission).
    #[cfg(all(test, kvslots_loom))]
    pub(crate) keep_refused: bool,
    /// A slow-path admission that gave blocks back (all it held when
    /// refused, or the excess over its request) does not run the wait
    /// queue's grant loop afterwards: a waiter that looked while those
    /// blocks were in transit is not re-checked (a lost wakeup).
    #[cfg(all(test, kvslots_loom))]
    pub(crate) quiet_gather: bool,
    /// The growth of blocks a caller holds leaves free what the head of
    /// the wait queue is owed, as a new admission does: a running
    /// sequence's append is refused behind a queued admission.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) growth_waits: bool,
    /// A [`HybridSequence`](crate::HybridSequence)'s append admits each
    /// group's blocks on their own, giving back what the earlier groups
    /// took when a later one is refused: two appends that each take some
    /// groups' blocks can both be refused, although one of them fits.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) per_group_admission: bool,
    /// A [`HybridSequence`](crate::HybridSequence)'s append reuses the
    /// blocks its sliding windows give back without checking that it holds
    /// them alone and uncached: it writes into a block that a matcher can
    /// take, or holds, under its key.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) recycle_shared: bool,
    /// A [`HybridSequence`](crate::HybridSequence)'s match settles each
    /// group once: a group that matched a longer prefix than a later group
    /// keeps it, so the groups' tables disagree with the length.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) unreconciled_match: bool,
    /// A [`HybridSequence`](crate::HybridSequence)'s match into a
    /// reservation gives back the admission of each matched block it lets
    /// go of (a group that serves a shorter prefix) and keeps the block's
    /// place in the capacity as a credit all the same: the block is
    /// counted free twice.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) cut_releases: bool,
    /// A match keeps the blocks it admitted ahead for revivals and did not
    /// use (its key's block was evicted meanwhile) instead of giving them
    /// back: they are lost to every later admission.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) match_keeps_credits: bool,
    /// A match into a reservation gives back the admission of each
    /// reserved block it lends for a revival, and spends the block's
    /// credit on the revival all the same: every lent block is counted
    /// free twice.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) lend_releases: bool,
    /// The wait queue tells new admissions to leave free only what its
    /// head asks for, without the head's headroom and without the waiters
    /// behind it: a relay of small admissions starves a head that asks for
    /// headroom.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) owed_without_headroom: bool,
    /// The grant loop wakes the head it took units for before it counts the
    /// grant: a waker that panics leaves the units taken for an entry that
    /// still looks pending, and they are lost when it leaves.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) wake_before_count: bool,
    /// A waker that panics cuts its batch of wakes short: the wakers of
    /// the batch not called yet are dropped uncalled, so entries granted
    /// (or closed) beside it are never woken.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) panic_cuts_batch: bool,
    /// A slow-path admission that gathered runs the wait queue's grant
    /// loop after it admitted its blocks without guarding it: a waker's
    /// panic out of that loop leaves the call with its blocks admitted and
    /// never taken (lost to every later admission).
    #[cfg(all(test, kvslots_loom))]
    pub(crate) panic_keeps_admission: bool,
    /// An admission that took its blocks and then finds the pool closed
    /// (a `close` between its take and its re-check of the flag) reports
    /// `Closed` and keeps them instead of giving them back: admitted and
    /// never handed out (lost to every later admission).
    #[cfg(all(test, kvslots_loom))]
    pub(crate) close_keeps_admission: bool,
    /// An eviction (or a reset's, or a truncate's drop of a key) takes its
    /// place in the KV event ring after the CAS that drops the key instead
    /// of before it: a publish of the same key on another block, which
    /// saw the key gone, can then take an earlier place, and the key's
    /// removal is reported after its next store.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) late_removal_record: bool,
    /// A publish takes its place in the KV event ring before it claims its
    /// block instead of after its last look for rivals: an eviction of the
    /// key from another block, which the publish waits to see, can then
    /// take a later place, and the key's store is reported before the
    /// removal it follows.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) early_stored_record: bool,
    /// A publish writes its block's group tag (for the KV events'
    /// removals) before it claims the block: a publish whose claim then
    /// fails, because another holder of the block published it, overwrites
    /// the winner's tag, and the key's removal names the loser's group.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) early_group_tag: bool,
    /// A KV event record is published with `Relaxed` instead of `Release`:
    /// a consumer that sees the record's position need not see its words.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) relaxed_record: bool,
    /// A KV event that finds its ring full is lost without being counted:
    /// the consumer is never told to resync.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) uncounted_loss: bool,
    /// A sequence's sole drop loads the block's word `Relaxed` instead of
    /// `Acquire`: a co-holder's accesses before its own drop no longer
    /// happen-before the give-back, nor the block's next owner.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) relaxed_sole_drop: bool,
    /// A take for a sequence marks its blocks fresh with a load and a
    /// plain store of the fresh bitmap's word (no read-modify-write):
    /// another holder's mark, or clear, in the same word is lost, and a
    /// fresh block then reads as counted (its bare word drops nothing: it
    /// is never given back), or a given-back block as fresh.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) plain_fresh_mark: bool,
    /// Counting a fresh block's reference (before a fork shares it or a
    /// publish claims it) leaves its fresh bit set: its holder's
    /// give-back then takes it for fresh and gives it back whatever its
    /// count, while a fork's child still holds it.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) fresh_kept: bool,
    /// Counting a fresh block's reference clears its fresh bit with
    /// `Relaxed` instead of `Release`: a raw call's checks that read the
    /// bit clear need not see the count written before it, and read the
    /// block as unheld.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) relaxed_fresh_clear: bool,
    /// A take's mark and a give-back's or a count's clear of fresh bits
    /// are plain stores of the word even when the caller holds only some
    /// of its blocks (the store is right only for a caller that holds them
    /// all): another holder's marks in the word are overwritten.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) fresh_store_any_word: bool,
    /// A publish that cannot claim a block (another holder's claim is in
    /// flight) reports it cached already, so the sequence's mark moves
    /// past it, though that claim may lose.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) claim_refused_as_cached: bool,
    /// A drop of one of a block's several references (a sequence's
    /// shared block, or any holder's) is a load and a plain store of the
    /// decremented word instead of the CAS: two racing drops can both
    /// store the same count, and the block is never given back.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) plain_shared_drop: bool,
    /// The pool's admission count is given back (`fetch_add`) with
    /// `Acquire` alone, without its `Release` half: the next taker's
    /// admission no longer orders the previous holder's accesses before
    /// its own (with `relaxed_free`, nothing does).
    #[cfg(all(test, kvslots_loom))]
    pub(crate) relaxed_count_release: bool,
    /// A publishing sequence takes its block for its own alone whatever
    /// the count (any `SEQUENCE` word, neither cached nor claimed), and
    /// claims it with a plain store: two holders of a shared block that
    /// publish it at once both claim it, each overwriting the other's
    /// count and key words.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) shared_sole_claim: bool,
    /// A publisher writes its key words with `Relaxed` stores instead of
    /// `Release`: a peek that reads a later key's words no longer sees
    /// the state that came before them when it reads the state again, and
    /// takes them for the key of the state it read first.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) relaxed_key_words: bool,
    /// A peek trusts the key words it compared without reading the
    /// block's state again: words of a later key, written by a publisher
    /// that has not committed, pass for the key of the state it read.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) peek_trusts_first_read: bool,
    /// A peek takes a cached candidate for its key without comparing the
    /// key words: another key whose index entry has the same fingerprint
    /// counts.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) peek_skips_key: bool,
}

// Outside the loom models' build a `Faults` holds nothing: the field that
// each of the pool's parts carries takes no memory, and no hook reads one.
#[cfg(not(all(test, kvslots_loom)))]
const _: () = assert!(std::mem::size_of::<Faults>() == 0);

impl Faults {
    /// Whether a take from the free list's bitmap is a load and a plain
    /// store: `false`, or `true` under `plain_bitmap_take`.
    #[inline]
    pub(crate) fn plain_bitmap_take(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.plain_bitmap_take {
            return true;
        }
        false
    }

    /// Whether a take marks its fresh blocks with a load and a plain
    /// store: `false`, or `true` under `plain_fresh_mark`.
    #[inline]
    pub(crate) fn plain_fresh_mark(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.plain_fresh_mark {
            return true;
        }
        false
    }

    /// Whether every write of fresh bits is a store of the word, whoever
    /// holds its other blocks: `false`, or `true` under
    /// `fresh_store_any_word`.
    #[inline]
    pub(crate) fn fresh_store_any_word(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.fresh_store_any_word {
            return true;
        }
        false
    }

    /// The ordering of a publisher's stores of its key words: `good`, or
    /// `Relaxed` under `relaxed_key_words`.
    #[inline]
    pub(crate) fn key_word_ordering(self, good: Ordering) -> Ordering {
        #[cfg(all(test, kvslots_loom))]
        if self.relaxed_key_words {
            return Ordering::Relaxed;
        }
        good
    }

    /// Whether a peek skips its second read of a block's state: `false`,
    /// or `true` under `peek_trusts_first_read`.
    #[inline]
    pub(crate) fn peek_trusts_first_read(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.peek_trusts_first_read {
            return true;
        }
        false
    }

    /// Whether a peek skips the comparison of a candidate's key words:
    /// `false`, or `true` under `peek_skips_key`.
    #[inline]
    pub(crate) fn peek_skips_key(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.peek_skips_key {
            return true;
        }
        false
    }

    /// Whether a publish reports a block it could not claim as cached
    /// already: `false`, or `true` under `claim_refused_as_cached`.
    #[inline]
    pub(crate) fn claim_refused_as_cached(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.claim_refused_as_cached {
            return true;
        }
        false
    }

    /// Whether counting a fresh block's reference leaves its fresh bit
    /// set: `false`, or `true` under `fresh_kept`.
    #[inline]
    pub(crate) fn fresh_kept(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.fresh_kept {
            return true;
        }
        false
    }

    /// The ordering of a count's clear of fresh bits: `good`, or `Relaxed`
    /// under `relaxed_fresh_clear`.
    #[inline]
    pub(crate) fn fresh_clear_ordering(self, good: Ordering) -> Ordering {
        #[cfg(all(test, kvslots_loom))]
        if self.relaxed_fresh_clear {
            return Ordering::Relaxed;
        }
        good
    }

    /// The ordering of a give-back to the free list and of a reference
    /// drop: `good`, or `Relaxed` under `relaxed_free`.
    #[inline]
    pub(crate) fn free_ordering(self, good: Ordering) -> Ordering {
        #[cfg(all(test, kvslots_loom))]
        if self.relaxed_free {
            return Ordering::Relaxed;
        }
        good
    }

    /// Whether a drop of one of several references is a load and a plain
    /// store: `false`, or `true` under `plain_shared_drop`.
    #[inline]
    pub(crate) fn plain_shared_drop(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.plain_shared_drop {
            return true;
        }
        false
    }

    /// The ordering of the give-back of a pool's admission count: `good`,
    /// or `Acquire` under `relaxed_count_release`.
    #[inline]
    pub(crate) fn count_release_ordering(self, good: Ordering) -> Ordering {
        #[cfg(all(test, kvslots_loom))]
        if self.relaxed_count_release {
            return Ordering::Acquire;
        }
        good
    }

    /// The ordering of a sequence's sole drop's load: `good`, or `Relaxed`
    /// under `relaxed_sole_drop`.
    #[inline]
    pub(crate) fn sole_drop_ordering(self, good: Ordering) -> Ordering {
        #[cfg(all(test, kvslots_loom))]
        if self.relaxed_sole_drop {
            return Ordering::Relaxed;
        }
        good
    }

    /// Whether a raw free ignores the sequence flag of a block: `false`, or
    /// `true` under `free_ignores_sequence` (a racing double free and a
    /// sequence's plain last drop then both give the block back).
    #[inline]
    pub(crate) fn free_ignores_sequence(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.free_ignores_sequence {
            return true;
        }
        false
    }

    /// Whether adding a reference may raise a count from 0: `false`, or
    /// `true` under `blind_add_ref`.
    #[inline]
    pub(crate) fn blind_add_ref(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.blind_add_ref {
            return true;
        }
        false
    }

    /// Whether a matcher may revive a block without checking its
    /// generation: `false`, or `true` under `no_generation_check`.
    #[inline]
    pub(crate) fn no_generation_check(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.no_generation_check {
            return true;
        }
        false
    }

    /// The ordering of a publisher's release operations (inserting the
    /// index entry, arming the claim, setting the cached flag): `good`, or `Relaxed` under
    /// `relaxed_publish`.
    #[inline]
    pub(crate) fn publish_ordering(self, good: Ordering) -> Ordering {
        #[cfg(all(test, kvslots_loom))]
        if self.relaxed_publish {
            return Ordering::Relaxed;
        }
        good
    }

    /// Whether an eviction may take a block that still has references:
    /// `false`, or `true` under `evict_referenced`.
    #[inline]
    pub(crate) fn evict_referenced(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.evict_referenced {
            return true;
        }
        false
    }

    /// Whether a kill of a rival publisher's claim is skipped: `false`, or
    /// `true` under `no_kill`.
    #[inline]
    pub(crate) fn no_kill(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.no_kill {
            return true;
        }
        false
    }

    /// Whether an evictor claims its candidates before it copies them:
    /// `false`, or `true` under `claim_before_read`.
    #[inline]
    pub(crate) fn claim_before_read(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.claim_before_read {
            return true;
        }
        false
    }

    /// Whether a refill clears the eviction ring's overflowed bit without
    /// checking for misses since its scan began: `false`, or `true` under
    /// `unchecked_overflow_clear`.
    #[inline]
    pub(crate) fn unchecked_overflow_clear(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.unchecked_overflow_clear {
            return true;
        }
        false
    }

    /// Whether a refill judges its fit by its first pass's count: `false`,
    /// or `true` under `fill_counts_first_pass`.
    #[inline]
    pub(crate) fn fill_counts_first_pass(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.fill_counts_first_pass {
            return true;
        }
        false
    }

    /// Whether a refill whose publishing CAS failed stops without scanning
    /// again: `false`, or `true` under `no_rescan_after_raced_publish`.
    #[inline]
    pub(crate) fn no_rescan_after_raced_publish(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.no_rescan_after_raced_publish {
            return true;
        }
        false
    }

    /// Whether a waiter skips its attempt after joining the queue: `false`,
    /// or `true` under `late_enqueue`.
    #[inline]
    pub(crate) fn late_enqueue(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.late_enqueue {
            return true;
        }
        false
    }

    /// Whether a cancelled granted waiter skips handing its grant on:
    /// `false`, or `true` under `cancel_keeps_grant`.
    #[inline]
    pub(crate) fn cancel_keeps_grant(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.cancel_keeps_grant {
            return true;
        }
        false
    }

    /// Whether a cancelled pending waiter skips re-checking the waiters
    /// behind it: `false`, or `true` under `cancel_no_recheck`.
    #[inline]
    pub(crate) fn cancel_no_recheck(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.cancel_no_recheck {
            return true;
        }
        false
    }

    /// Whether the wait queue skips the waiter's hand-shake: `false`, or `true`
    /// under `unfenced_wait`.
    #[inline]
    pub(crate) fn unfenced_wait(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.unfenced_wait {
            return true;
        }
        false
    }

    /// Whether `close` skips waking the queued waiters: `false`, or `true`
    /// under `silent_close`.
    #[inline]
    pub(crate) fn silent_close(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.silent_close {
            return true;
        }
        false
    }

    /// Whether a fenced retirement gives its references back at once:
    /// `false`, or `true` under `early_release`.
    #[inline]
    pub(crate) fn early_release(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.early_release {
            return true;
        }
        false
    }

    /// Whether the admission fast path takes with a load and a plain
    /// store: `false`, or `true` under `racy_take`.
    #[inline]
    pub(crate) fn racy_take(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.racy_take {
            return true;
        }
        false
    }

    /// Whether a refused slow-path admission keeps what it took: `false`,
    /// or `true` under `keep_refused`.
    #[inline]
    pub(crate) fn keep_refused(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.keep_refused {
            return true;
        }
        false
    }

    /// Whether a slow-path admission skips re-checking the waiters after
    /// giving blocks back: `false`, or `true` under `quiet_gather`.
    #[inline]
    pub(crate) fn quiet_gather(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.quiet_gather {
            return true;
        }
        false
    }

    /// Whether growth leaves the head of the wait queue what it is owed:
    /// `false`, or `true` under `growth_waits`.
    #[inline]
    pub(crate) fn growth_waits(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.growth_waits {
            return true;
        }
        false
    }

    /// Whether a match keeps what it admitted ahead and did not use:
    /// `false`, or `true` under `match_keeps_credits`.
    #[inline]
    pub(crate) fn match_keeps_credits(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.match_keeps_credits {
            return true;
        }
        false
    }

    /// Whether lending a reserved block gives its admission back:
    /// `false`, or `true` under `lend_releases`.
    #[inline]
    pub(crate) fn lend_releases(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.lend_releases {
            return true;
        }
        false
    }

    /// Whether the wait queue publishes only its head's request as what
    /// new admissions must leave free: `false`, or `true` under
    /// `owed_without_headroom`.
    #[inline]
    pub(crate) fn owed_without_headroom(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.owed_without_headroom {
            return true;
        }
        false
    }

    /// Whether a waker's panic cuts its batch of wakes short: `false`, or
    /// `true` under `panic_cuts_batch`.
    #[inline]
    pub(crate) fn panic_cuts_batch(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.panic_cuts_batch {
            return true;
        }
        false
    }

    /// Whether a gather that admitted its blocks runs the grant loop
    /// without giving them back if a waker's panic comes out of it:
    /// `false`, or `true` under `panic_keeps_admission`.
    #[inline]
    pub(crate) fn panic_keeps_admission(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.panic_keeps_admission {
            return true;
        }
        false
    }

    /// Whether an admission that finds the pool closed after its take
    /// keeps what it took: `false`, or `true` under
    /// `close_keeps_admission`.
    #[inline]
    pub(crate) fn close_keeps_admission(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.close_keeps_admission {
            return true;
        }
        false
    }

    /// Whether the grant loop wakes a head before counting its grant:
    /// `false`, or `true` under `wake_before_count`.
    #[inline]
    pub(crate) fn wake_before_count(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.wake_before_count {
            return true;
        }
        false
    }

    /// Whether an eviction takes its place in the KV event ring after its
    /// CAS: `false`, or `true` under `late_removal_record`.
    #[inline]
    pub(crate) fn late_removal_record(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.late_removal_record {
            return true;
        }
        false
    }

    /// Whether a publish takes its place in the KV event ring before its
    /// claim: `false`, or `true` under `early_stored_record`.
    #[inline]
    pub(crate) fn early_stored_record(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.early_stored_record {
            return true;
        }
        false
    }

    /// Whether a publish writes its group tag before its claim: `false`,
    /// or `true` under `early_group_tag`.
    #[inline]
    pub(crate) fn early_group_tag(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.early_group_tag {
            return true;
        }
        false
    }

    /// The ordering that publishes a KV event record: `good`, or `Relaxed`
    /// under `relaxed_record`.
    #[inline]
    pub(crate) fn record_ordering(self, good: Ordering) -> Ordering {
        #[cfg(all(test, kvslots_loom))]
        if self.relaxed_record {
            return Ordering::Relaxed;
        }
        good
    }

    /// Whether a KV event lost to a full ring goes uncounted: `false`, or
    /// `true` under `uncounted_loss`.
    #[inline]
    pub(crate) fn uncounted_loss(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.uncounted_loss {
            return true;
        }
        false
    }

    /// Whether a publisher's claim goes without a reference of its own:
    /// `false`, or `true` under `unreferenced_claim`.
    #[inline]
    pub(crate) fn unreferenced_claim(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.unreferenced_claim {
            return true;
        }
        false
    }

    /// Whether the drop of a claim's last reference is reported as
    /// leaving references: `false`, or `true` under `claim_drop_kept`.
    #[inline]
    pub(crate) fn claim_drop_kept(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.claim_drop_kept {
            return true;
        }
        false
    }

    /// Whether a publish skips its first lookup of the key: `false`, or
    /// `true` under `no_held_key_check`.
    #[inline]
    pub(crate) fn no_held_key_check(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.no_held_key_check {
            return true;
        }
        false
    }

    /// Whether a claim is a rival before its key words are written:
    /// `false`, or `true` under `armed_claim`.
    #[inline]
    pub(crate) fn armed_claim(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.armed_claim {
            return true;
        }
        false
    }

    /// Whether a publishing sequence takes a shared block for its own
    /// alone: `false`, or `true` under `shared_sole_claim`.
    #[inline]
    pub(crate) fn shared_sole_claim(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.shared_sole_claim {
            return true;
        }
        false
    }

    /// Whether a lookup in the prefix index leaves out the key's second
    /// bucket: `false`, or `true` under `first_bucket_only`.
    #[inline]
    pub(crate) fn first_bucket_only(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.first_bucket_only {
            return true;
        }
        false
    }

    /// Whether a publisher's rescan makes its read-modify-write in the
    /// bucket of its own entry: `false`, or `true` under
    /// `fence_own_bucket`.
    #[inline]
    pub(crate) fn fence_own_bucket(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.fence_own_bucket {
            return true;
        }
        false
    }

    /// Whether a claim that was deferred to, or killed, gives up without
    /// looking again: `false`, or `true` under `ignore_deferral`.
    #[inline]
    pub(crate) fn ignore_deferral(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.ignore_deferral {
            return true;
        }
        false
    }

    /// What a free does when one of its drops finds no reference left: with
    /// no fault, nothing here (the free goes on, see `BlockPool::free`), and
    /// `false` is returned. Under `blind_undo` it adds back one reference to
    /// each of `counts[dropped]` whatever happened to those blocks since,
    /// and returns `true`: the free then refuses as if nothing had changed.
    #[inline]
    pub(crate) fn blind_undo(
        self,
        counts: &[AtomicU64],
        dropped: impl Iterator<Item = usize>,
    ) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.blind_undo {
            for d in dropped {
                // Relaxed: the bug under test is the missing check, not
                // ordering.
                counts[d].fetch_add(1, Ordering::Relaxed);
            }
            return true;
        }
        let _ = (counts, dropped);
        false
    }

    /// Whether a hybrid append admits group by group: `false`, or `true`
    /// under `per_group_admission`.
    #[inline]
    pub(crate) fn per_group_admission(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.per_group_admission {
            return true;
        }
        false
    }

    /// Whether a hybrid append reuses a block its window gives back
    /// without checking it: `false`, or `true` under `recycle_shared`.
    #[inline]
    pub(crate) fn recycle_shared(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.recycle_shared {
            return true;
        }
        false
    }

    /// Whether a hybrid match into a reservation gives back the admission
    /// of the matched blocks it lets go of and keeps their credits too:
    /// `false`, or `true` under `cut_releases`.
    #[inline]
    pub(crate) fn cut_releases(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.cut_releases {
            return true;
        }
        false
    }

    /// Whether a hybrid match settles each group once: `false`, or `true`
    /// under `unreconciled_match`.
    #[inline]
    pub(crate) fn unreconciled_match(self) -> bool {
        #[cfg(all(test, kvslots_loom))]
        if self.unreconciled_match {
            return true;
        }
        false
    }
}
