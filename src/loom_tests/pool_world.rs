//! The harness of the `BlockPool` and `Sequence` models (`pool.rs`,
//! `sequence.rs`): a pool next to a shadow holder count and a
//! happens-before witness per block, the conservation check, the fault sets
//! of the negative controls, and a `check` that refuses to pass vacuously.
//!
//! * **Shadow holders.** A model takes a block in the shadow when the pool
//!   hands it to a new owner (its count must have been 0, [`DOUBLE`]
//!   otherwise), shares it when a second holder gets a reference, and drops
//!   its reference from the shadow *before* giving it back to the pool, so
//!   the shadow never claims a holder the pool no longer counts. The
//!   shadow's RMWs are `Relaxed` on purpose: only their atomicity matters,
//!   and a stronger ordering would add happens-before edges that could hide
//!   a missing `Release`/`Acquire` in the pool.
//! * **Payloads.** Each block has a `loom::cell::UnsafeCell<usize>`: owners
//!   write it, holders read it, and loom reports a "Causality violation"
//!   when the previous holder's access does not happen-before the next
//!   owner's. Loom tracks the accesses in `with`/`with_mut` themselves, so
//!   the pointer is never dereferenced and no `unsafe` is needed.
//! * **Conservation** ([`PoolWorld::assert_conserved`], [`LOST`]) once
//!   every reference is back.

use std::sync::Arc;

use crate::sync::Faults;
use crate::sync::{AtomicUsize, Ordering};
use crate::{BlockHash, BlockId, BlockPool, FreeError, ReserveError, Sequence};
use loom::cell::UnsafeCell;

/// A block was handed out while a holder still had it (the same words as
/// the pool's own debug assertion, which fires first in a debug build).
pub const DOUBLE: &str = "handed out twice";
/// The pool did not come back whole after every reference was returned.
pub const LOST: &str = "blocks not conserved";

/// No faults: the pool as shipped.
pub const SOUND: Faults = Faults {
    plain_bitmap_take: false,
    relaxed_free: false,
    blind_undo: false,
    free_ignores_sequence: false,
    blind_add_ref: false,
    no_generation_check: false,
    relaxed_publish: false,
    evict_referenced: false,
    no_kill: false,
    unreferenced_claim: false,
    claim_drop_kept: false,
    no_held_key_check: false,
    ignore_deferral: false,
    armed_claim: false,
    first_bucket_only: false,
    fence_own_bucket: false,
    late_enqueue: false,
    cancel_keeps_grant: false,
    cancel_no_recheck: false,
    silent_close: false,
    unfenced_wait: false,
    early_release: false,
    racy_take: false,
    keep_refused: false,
    quiet_gather: false,
    growth_waits: false,
    per_group_admission: false,
    recycle_shared: false,
    unreconciled_match: false,
    cut_releases: false,
    match_keeps_credits: false,
    lend_releases: false,
    owed_without_headroom: false,
    wake_before_count: false,
    panic_cuts_batch: false,
    panic_keeps_admission: false,
    close_keeps_admission: false,
    late_removal_record: false,
    early_stored_record: false,
    early_group_tag: false,
    relaxed_record: false,
    uncounted_loss: false,
    relaxed_sole_drop: false,
    plain_fresh_mark: false,
    fresh_kept: false,
    relaxed_fresh_clear: false,
    fresh_store_any_word: false,
    claim_refused_as_cached: false,
    claim_before_read: false,
    unchecked_overflow_clear: false,
    fill_counts_first_pass: false,
    no_rescan_after_raced_publish: false,
    plain_shared_drop: false,
    relaxed_count_release: false,
    shared_sole_claim: false,
    relaxed_key_words: false,
    peek_trusts_first_read: false,
    peek_skips_key: false,
};
/// The free list's control: a take from a bitmap word with a load and a
/// plain store, so that two takers can take the same block.
pub const PLAIN_BITMAP_TAKE: Faults = Faults {
    plain_bitmap_take: true,
    ..SOUND
};
/// The ordering control: freeing with `Relaxed` instead of `Release`.
pub const RELAXED_FREE: Faults = Faults {
    relaxed_free: true,
    ..SOUND
};
/// The shared drop's control: a drop of one of several references is a
/// load and a plain store, so two racing drops can both keep a reference
/// and nobody gives the block back.
pub const PLAIN_SHARED_DROP: Faults = Faults {
    plain_shared_drop: true,
    ..SOUND
};
/// Every release without `Release`: the free list's give-back and the
/// reference drops (`relaxed_free`) and the admission count's give-back
/// (`relaxed_count_release`), so that nothing orders a holder's accesses
/// before the next owner's, even where the count alone would.
pub const RELAXED_RELEASES: Faults = Faults {
    relaxed_free: true,
    relaxed_count_release: true,
    ..SOUND
};
/// The eviction ring's control: an evictor claims its candidates'
/// positions before it copies them, so a refill that has moved on may
/// rewrite a slot it claimed with a younger block.
pub const CLAIM_BEFORE_READ: Faults = Faults {
    claim_before_read: true,
    ..SOUND
};
/// The eviction ring's overflow control: a refill clears the overflowed
/// bit whatever appends missed since its scan began.
pub const UNCHECKED_OVERFLOW_CLEAR: Faults = Faults {
    unchecked_overflow_clear: true,
    ..SOUND
};
/// The eviction ring's fill control: a refill judges its fit by its first
/// pass's count of the blocks outside the ring against the room.
pub const FILL_COUNTS_FIRST_PASS: Faults = Faults {
    fill_counts_first_pass: true,
    ..SOUND
};
/// The eviction ring's rescan control: a refill whose publishing CAS
/// fails (an append moved the length) does not scan again, and ends the
/// overflow as if what it published were all it had found.
pub const NO_RESCAN_AFTER_RACED_PUBLISH: Faults = Faults {
    no_rescan_after_raced_publish: true,
    ..SOUND
};
/// The undo control: a refused free adds its references back blindly,
/// resurrecting a block that another holder freed meanwhile.
pub const BLIND_UNDO: Faults = Faults {
    blind_undo: true,
    ..SOUND
};

/// The sole drop's ordering control: a sequence's sole drop loads the
/// block's word `Relaxed`, so a co-holder's accesses before its drop need
/// not happen-before the block's next owner.
pub const RELAXED_SOLE_DROP: Faults = Faults {
    relaxed_sole_drop: true,
    ..SOUND
};

/// The sequence-flag control: a raw free takes a reference to a block
/// that sequences hold, so it races the sequence's sole drop (a load and
/// a plain store) and both give the block back.
pub const FREE_IGNORES_SEQUENCE: Faults = Faults {
    free_ignores_sequence: true,
    ..SOUND
};

/// The fork control: adding a reference raises a count of 0 (no check),
/// reviving a block that a raw free put back in the free list. A raw free
/// can take a parent's reference only if it ignores the sequence flag, so
/// the control has both faults.
pub const BLIND_ADD_REF: Faults = Faults {
    blind_add_ref: true,
    free_ignores_sequence: true,
    ..SOUND
};

/// The stale-hit control: a match revives a block without checking that
/// its generation (and so its key) is the one it compared.
pub const NO_GENERATION_CHECK: Faults = Faults {
    no_generation_check: true,
    ..SOUND
};
/// The causality control of the prefix cache: publishing with `Relaxed`
/// instead of `Release`.
pub const RELAXED_PUBLISH: Faults = Faults {
    relaxed_publish: true,
    ..SOUND
};
/// The eviction control: an allocation evicts a cached block that a
/// matcher still holds.
pub const EVICT_REFERENCED: Faults = Faults {
    evict_referenced: true,
    ..SOUND
};
/// The first-wins control: a publisher that finds a rival claim of its key
/// on a higher block id does not kill it, so both can commit.
pub const NO_KILL: Faults = Faults {
    no_kill: true,
    ..SOUND
};

/// The revival control: a match keeps the blocks it admitted ahead and did
/// not use.
pub const MATCH_KEEPS_CREDITS: Faults = Faults {
    match_keeps_credits: true,
    ..SOUND
};

/// The lending control: a match into a reservation gives back the
/// admission of each reserved block it lends, and spends its credit too.
pub const LEND_RELEASES: Faults = Faults {
    lend_releases: true,
    ..SOUND
};

/// The claim control: a publisher's claim takes no reference of its own,
/// so a raw free (a double free) racing the publish can push the claimed
/// block to the free list, where the commit then sets its key. A raw free
/// reaches a publisher's block only if it ignores the sequence flag, so
/// the control has both faults.
pub const UNREFERENCED_CLAIM: Faults = Faults {
    unreferenced_claim: true,
    free_ignores_sequence: true,
    ..SOUND
};

/// The claim's give-back control: a commit or unclaim that drops a claimed
/// block's last reference does not give the block back (a leak). As for
/// [`UNREFERENCED_CLAIM`], with a raw free that ignores the sequence flag.
pub const CLAIM_DROP_KEPT: Faults = Faults {
    claim_drop_kept: true,
    free_ignores_sequence: true,
    ..SOUND
};

/// The deferral control: a claim that a rival deferred to (or killed)
/// gives up without looking for the key's holders again.
pub const IGNORE_DEFERRAL: Faults = Faults {
    ignore_deferral: true,
    ..SOUND
};

/// The arming control: a publisher's claim is a rival before its key
/// words are written, so a rescan can take it for a claim of the key that
/// an earlier claim of the block published.
pub const ARMED_CLAIM: Faults = Faults {
    armed_claim: true,
    ..SOUND
};

/// The sole claim's control: a publishing sequence claims a block it
/// shares with a plain store, as if it held it alone, so two holders that
/// publish it at once both claim it.
pub const SHARED_SOLE_CLAIM: Faults = Faults {
    shared_sole_claim: true,
    ..SOUND
};

/// The key words' control: a publisher stores its key words `Relaxed`, so
/// a peek that reads them need not see the state that came before them.
pub const RELAXED_KEY_WORDS: Faults = Faults {
    relaxed_key_words: true,
    ..SOUND
};

/// The peek's control: a peek trusts the key words it compared without
/// reading the block's state again.
pub const PEEK_TRUSTS_FIRST_READ: Faults = Faults {
    peek_trusts_first_read: true,
    ..SOUND
};

/// The peek's key control: a peek counts a cached candidate without
/// comparing its key words.
pub const PEEK_SKIPS_KEY: Faults = Faults {
    peek_skips_key: true,
    ..SOUND
};

/// The two-bucket control of lookups: every lookup of a key in the prefix
/// index (a match, a publish's check for a holder, its rescan) reads only
/// the key's first bucket, so an entry in the second is never found.
pub const FIRST_BUCKET_ONLY: Faults = Faults {
    first_bucket_only: true,
    ..SOUND
};

/// The two-bucket control of the publish protocol: a publisher's rescan
/// makes its read-modify-write in the bucket its own entry went into, so
/// two publishers whose entries went into different buckets share no
/// word.
pub const FENCE_OWN_BUCKET: Faults = Faults {
    fence_own_bucket: true,
    ..SOUND
};

/// The fenced-release control: a retirement gives its references back at
/// once instead of when its fence completes.
pub const EARLY_RELEASE: Faults = Faults {
    early_release: true,
    ..SOUND
};
/// The admission fast-path control: the home shard's count is taken with
/// a load and a plain store, so a concurrent take from that shard is lost.
pub const RACY_TAKE: Faults = Faults {
    racy_take: true,
    ..SOUND
};
/// The all-or-nothing control of the admission slow path: a refused
/// gather keeps the counts it took, which stay in transit after it
/// returned.
pub const KEEP_REFUSED: Faults = Faults {
    keep_refused: true,
    ..SOUND
};
/// The transit control of waiting: a slow-path admission that gave blocks
/// back does not re-check the waiters, so one that looked while they were
/// in transit is never woken.
pub const QUIET_GATHER: Faults = Faults {
    quiet_gather: true,
    ..SOUND
};
/// The growth control of waiting: the growth of blocks a caller holds
/// leaves the queue's head what it is owed, as a new admission does.
pub const GROWTH_WAITS: Faults = Faults {
    growth_waits: true,
    ..SOUND
};
/// The hybrid admission control: a hybrid sequence's append admits each
/// group's blocks on their own, giving the earlier groups' back when a
/// later one is refused.
pub const PER_GROUP_ADMISSION: Faults = Faults {
    per_group_admission: true,
    ..SOUND
};
/// The hybrid reuse control: an append reuses the blocks its sliding
/// windows give back without checking that it holds them alone and
/// uncached.
pub const RECYCLE_SHARED: Faults = Faults {
    recycle_shared: true,
    ..SOUND
};
/// The hybrid match control: a match settles each group once, so a group
/// that matched more than a later one keeps it.
pub const UNRECONCILED_MATCH: Faults = Faults {
    unreconciled_match: true,
    ..SOUND
};
/// The hybrid lending control: a match into a reservation gives back the
/// admission of the matched blocks it lets go of and keeps their credits.
pub const CUT_RELEASES: Faults = Faults {
    cut_releases: true,
    ..SOUND
};
/// The headroom control of waiting: new admissions leave free only what
/// the queue's head asks for, without its headroom (or anyone behind it).
pub const OWED_WITHOUT_HEADROOM: Faults = Faults {
    owed_without_headroom: true,
    ..SOUND
};
/// The panicking-waker control of waiting: the grant loop wakes a head
/// before it counts the grant.
pub const WAKE_BEFORE_COUNT: Faults = Faults {
    wake_before_count: true,
    ..SOUND
};
/// The batch control of waiting: a waker's panic drops the rest of its
/// batch of wakes uncalled.
pub const PANIC_CUTS_BATCH: Faults = Faults {
    panic_cuts_batch: true,
    ..SOUND
};
/// The admission control of a waker's panic: a gather that admitted its
/// blocks keeps them when the grant loop it runs after unwinds.
pub const PANIC_KEEPS_ADMISSION: Faults = Faults {
    panic_keeps_admission: true,
    ..SOUND
};
/// The close control of admission: an admission that finds the pool
/// closed after its take keeps what it took.
pub const CLOSE_KEEPS_ADMISSION: Faults = Faults {
    close_keeps_admission: true,
    ..SOUND
};
/// The KV events' order control for removals: an eviction (or a
/// truncate's drop of a key) takes its place in the ring after its CAS.
pub const LATE_REMOVAL_RECORD: Faults = Faults {
    late_removal_record: true,
    ..SOUND
};
/// The KV events' order control for stores: a publish takes its place in
/// the ring before it claims its block.
pub const EARLY_STORED_RECORD: Faults = Faults {
    early_stored_record: true,
    ..SOUND
};
/// The KV events' group control: a publish writes its block's group tag
/// before it claims the block.
pub const EARLY_GROUP_TAG: Faults = Faults {
    early_group_tag: true,
    ..SOUND
};
/// The KV events' publication control: a record's position word stored
/// with `Relaxed` instead of `Release`.
pub const RELAXED_RECORD: Faults = Faults {
    relaxed_record: true,
    ..SOUND
};
/// The KV events' loss control: an event that finds its ring full is lost
/// without being counted.
pub const UNCOUNTED_LOSS: Faults = Faults {
    uncounted_loss: true,
    ..SOUND
};

/// The re-check control of waiting: a waiter does not try again after it
/// queues, so a release between its failed attempt and its enqueue is
/// lost.
pub const LATE_ENQUEUE: Faults = Faults {
    late_enqueue: true,
    ..SOUND
};
/// The hand-shake control of waiting: a waiter does not do its
/// read-modify-write of the shards' words after it queues.
pub const UNFENCED_WAIT: Faults = Faults {
    unfenced_wait: true,
    ..SOUND
};

/// Runs `f` under loom with the environment's bounds, defaulting the
/// preemption bound to 2 when `LOOM_MAX_PREEMPTIONS` is not set, so that
/// the three-thread models stay tractable. Prints how many executions loom
/// explored (see `--nocapture`) and checks that it explored more than one,
/// so that a model whose threads never overlap cannot pass vacuously.
/// (Unlike the crate's [`check`](crate::check), which takes the
/// environment's bounds as they are and counts nothing.)
///
/// # Panics
///
/// Panics if loom explored a single execution, besides whatever the model
/// panics with.
pub fn check<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    check_long(0, f);
}

/// [`check`] for a model whose executions are long (many atomic accesses
/// in one path, as a hybrid sequence's calls over several groups make):
/// loom's bound on the branches of one execution raised to at least
/// `max_branches` (`LOOM_MAX_BRANCHES` if larger).
///
/// # Panics
///
/// As [`check`].
pub fn check_long<F>(max_branches: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(2);
    }
    builder.max_branches = builder.max_branches.max(max_branches);
    counted_check(builder, f);
}

/// [`check`] at preemption bound 1, for a model whose search at bound 2
/// is by far the longest of the models': three publishes at once, a rival
/// that publishes twice while others publish, or two threads that each
/// drop their references to the same run of eight fresh blocks. At bound 1
/// loom explores every schedule with one preemption, which holds the
/// interleaving the model is about: its negative control is caught there.
/// With `KVSLOTS_LOOM_FULL` set (to anything) the model searches at the
/// environment's bound instead, as [`check`] does
/// (`KVSLOTS_LOOM_FULL=1 scripts/loom mark`).
///
/// # Panics
///
/// As [`check`].
pub fn check_one_preemption<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    if std::env::var_os("KVSLOTS_LOOM_FULL").is_some() {
        return check(f);
    }
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(1);
    counted_check(builder, f);
}

/// [`check_one_preemption`] for a model whose executions are long (see
/// [`check_long`]): bound 1, loom's bound on the branches of one execution
/// raised to at least `max_branches`; with `KVSLOTS_LOOM_FULL` set, as
/// [`check_long`] (`KVSLOTS_LOOM_FULL=1 scripts/loom hybrid`).
///
/// # Panics
///
/// As [`check`].
pub fn check_long_one_preemption<F>(max_branches: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    if std::env::var_os("KVSLOTS_LOOM_FULL").is_some() {
        return check_long(max_branches, f);
    }
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(1);
    builder.max_branches = builder.max_branches.max(max_branches);
    counted_check(builder, f);
}

/// Runs `f` under `builder`, prints how many executions loom explored and
/// checks that it explored more than one.
fn counted_check<F>(builder: loom::model::Builder, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&runs);
    builder.check(move || {
        // Relaxed: a plain std counter of loom's executions, which loom runs
        // one at a time; it is outside the model.
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    // Relaxed: as above; every execution is done.
    let runs = runs.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("loom explored {runs} executions");
    assert!(runs > 1, "the model explored a single execution");
}

/// A pool with the model's shadow holder counts and block payloads (see
/// the module doc). A model file adds its own checked operations (through
/// a trait of its own).
///
/// `loom::cell::UnsafeCell` is deliberately not `Sync`, and neither is a
/// `PoolWorld`; sharing one between a model's threads (in an `Arc`) is
/// sound because loom runs them one at a time (its `thread::spawn` does not
/// ask for `Send`).
#[derive(Debug)]
pub struct PoolWorld {
    /// The pool under test.
    pub pool: Arc<BlockPool>,
    /// Shadow reference count per block.
    holders: Box<[AtomicUsize]>,
    /// The happens-before witness per block.
    payload: Box<[UnsafeCell<usize>]>,
    /// What holds references in the models ("thread", "sequence"), as the
    /// messages name it.
    holder: &'static str,
}

impl PoolWorld {
    /// A pool of `num_blocks` blocks of `block_size` slots built with
    /// `faults`, every block free in the shadow, ready to be shared by a
    /// model's threads; `holder` names what holds references in the models,
    /// for the messages. The free list is one shard.
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        faults: Faults,
        holder: &'static str,
    ) -> Arc<PoolWorld> {
        PoolWorld::with_shards(num_blocks, block_size, 1, faults, holder)
    }

    /// [`new`](Self::new) with the free list cut into `shards` shards.
    // Not `Send`/`Sync` (see the type's doc), yet shared through an `Arc`:
    // loom runs a model's threads one at a time.
    #[allow(clippy::arc_with_non_send_sync)]
    pub fn with_shards(
        num_blocks: usize,
        block_size: usize,
        shards: usize,
        faults: Faults,
        holder: &'static str,
    ) -> Arc<PoolWorld> {
        Arc::new(PoolWorld {
            pool: Arc::new(BlockPool::with_faults(
                num_blocks, block_size, shards, faults,
            )),
            holders: (0..num_blocks).map(|_| AtomicUsize::new(0)).collect(),
            payload: (0..num_blocks).map(|_| UnsafeCell::new(0)).collect(),
            holder,
        })
    }

    /// Records that `id` was just handed out to a new owner.
    ///
    /// # Panics
    ///
    /// Panics with [`DOUBLE`] if somebody still held it.
    pub fn take(&self, id: BlockId) {
        // Relaxed: only the swap's atomicity matters (see the module doc).
        let before = self.holders[id.index()].swap(1, Ordering::Relaxed);
        assert_eq!(before, 0, "{id} {DOUBLE}: it had {before} holder(s)");
    }

    /// Records one more holder of a block already held.
    ///
    /// # Panics
    ///
    /// Panics if nobody held it.
    pub fn share(&self, id: BlockId) {
        // Relaxed: as in `take`.
        let before = self.holders[id.index()].fetch_add(1, Ordering::Relaxed);
        assert!(before > 0, "{id} shared while nobody held it");
    }

    /// Records one more holder of `id`, which may or may not have had
    /// holders (a match: it revives an evictable block or shares a held
    /// one).
    pub fn hold(&self, id: BlockId) {
        // Relaxed: as in `take`.
        self.holders[id.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Records that one holder of `id` is about to give its reference back.
    ///
    /// # Panics
    ///
    /// Panics if nobody held it.
    pub fn drop_ref(&self, id: BlockId) {
        // Relaxed: as in `take`.
        let before = self.holders[id.index()].fetch_sub(1, Ordering::Relaxed);
        assert!(
            before > 0,
            "{id} given back by a {} that did not hold it",
            self.holder
        );
    }

    /// The owner writes into block `id` (tracked by loom).
    pub fn write(&self, id: BlockId) {
        self.payload[id.index()].with_mut(|_| ());
    }

    /// A holder reads block `id` (tracked by loom).
    pub fn read(&self, id: BlockId) {
        self.payload[id.index()].with(|_| ());
    }

    /// The conservation check, once every reference is back: every block
    /// free and unreferenced, and allocating `num_blocks` blocks yields that
    /// many distinct ids. The pool is left as it was found.
    ///
    /// # Panics
    ///
    /// Panics with [`LOST`] or [`DOUBLE`] otherwise.
    pub fn assert_conserved(&self) {
        self.conserved(false);
    }

    /// [`assert_conserved`](Self::assert_conserved), and while every block
    /// is out, one more is refused.
    ///
    /// # Panics
    ///
    /// As `assert_conserved`, and with [`LOST`] if the extra block is
    /// handed out.
    pub fn assert_conserved_and_bounded(&self) {
        self.conserved(true);
    }

    /// The counts of the conservation check, which need no allocation (a
    /// closed pool allocates nothing): every block free and unreferenced,
    /// and the shards' admission counts summing to `num_blocks`.
    ///
    /// # Panics
    ///
    /// Panics with [`LOST`] otherwise.
    pub fn assert_counts_whole(&self) {
        let n = self.pool.num_blocks();
        assert_eq!(self.pool.free_blocks(), n, "{LOST}: free_blocks");
        // The shards' admission counts, without the cap that `free_blocks`
        // applies: a count admitted twice shows here.
        assert_eq!(
            self.pool.admission_free_uncapped(),
            n,
            "{LOST}: the admission counts"
        );
        assert_eq!(self.pool.used_blocks(), 0, "{LOST}: used_blocks");
        for i in 0..n {
            let id = BlockId::new(i as u32);
            assert_eq!(
                self.pool.ref_count(id),
                Some(0),
                "{LOST}: {id} still referenced"
            );
        }
    }

    fn conserved(&self, bounded: bool) {
        self.assert_counts_whole();
        let n = self.pool.num_blocks();
        let mut all = Vec::new();
        self.pool
            .try_alloc(n, &mut all)
            .unwrap_or_else(|e| panic!("{LOST}: allocating every block failed: {e:?}"));
        let mut sorted = all.clone();
        sorted.sort_unstable();
        sorted.dedup();
        // A duplicate here is a block that sits in the free list twice: the
        // next two allocations would both be handed it.
        assert_eq!(
            sorted.len(),
            n,
            "{DOUBLE}: allocating every block gave {all:?}"
        );
        if bounded {
            assert!(
                self.pool.try_alloc(1, &mut Vec::new()).is_err(),
                "{LOST}: a block beyond num_blocks was handed out"
            );
        }
        self.pool.free(&all).expect("freeing every block");
        assert_eq!(self.pool.free_blocks(), n, "{LOST}: after the final free");
    }
}

/// What a racing double free of a sequence's block may answer (the models
/// of `held_drop.rs` and `hybrid.rs`): `HeldBySequence` while the
/// sequence holds the block, `NotAllocated` once it is back; and under the
/// `free_ignores_sequence` control, as before the flag, `Ok` if it dropped
/// the reference before the sequence did and `Raced` if the sequence
/// dropped it first (its checks saw the reference, its drop found none).
///
/// # Panics
///
/// Panics on any other answer, or on a refusal that names another block.
pub fn assert_double_free_answer(r: Result<(), FreeError>, id: BlockId) {
    match r {
        Ok(()) => {}
        Err(FreeError::Raced { id: raced })
        | Err(FreeError::NotAllocated { id: raced })
        | Err(FreeError::HeldBySequence { id: raced }) => {
            assert_eq!(raced, id, "the refusal names the doubly freed block");
        }
        Err(e) => panic!("unexpected {e:?}"),
    }
}

/// The checked allocations of the pool models (`pool.rs`,
/// `shards.rs`).
pub trait Allocs {
    /// `try_alloc(n)` into a fresh vector, checked whole or nothing (a
    /// refusal is `Full`, or `BehindWaiters` while someone waits); each new
    /// block is taken in the shadow and its payload written.
    fn alloc(&self, n: usize) -> Result<Vec<BlockId>, ReserveError>;

    /// The owner writes into its blocks one last time, then frees them.
    fn give_back(&self, ids: &[BlockId]);
}

impl Allocs for PoolWorld {
    fn alloc(&self, n: usize) -> Result<Vec<BlockId>, ReserveError> {
        let mut ids = Vec::new();
        let result = self.pool.try_alloc(n, &mut ids);
        match result {
            Ok(()) => assert_eq!(ids.len(), n, "partial allocation"),
            Err(e) => {
                assert!(ids.is_empty(), "a refused allocation changed `out`");
                assert!(
                    matches!(
                        e,
                        ReserveError::Full { requested, .. }
                            | ReserveError::BehindWaiters { requested, .. } if requested == n
                    ),
                    "unexpected {e:?}"
                );
            }
        }
        for &id in &ids {
            self.take(id);
            self.write(id);
        }
        result.map(|()| ids)
    }

    fn give_back(&self, ids: &[BlockId]) {
        for &id in ids {
            self.write(id);
            self.drop_ref(id);
        }
        self.pool.free(ids).expect("a holder's free was refused");
    }
}

/// The body of the alloc-vs-alloc models (`pool.rs`,
/// `shards.rs`): a spawned thread allocates `takes` blocks and gives
/// back the one at index `gives_back`, keeping the rest; meanwhile this
/// thread allocates one block, which must succeed (`takes` leaves one), and
/// then tries one more. Each keeps what it holds until both are done; then
/// everything is given back and conservation is checked.
pub fn alloc_then_more(world: &Arc<PoolWorld>, takes: usize, gives_back: usize) {
    let other = {
        let world = Arc::clone(world);
        loom::thread::spawn(move || match world.alloc(takes) {
            Ok(mut ids) => {
                let back = ids.remove(gives_back);
                world.give_back(&[back]);
                ids
            }
            Err(_) => Vec::new(),
        })
    };
    let mut held = world
        .alloc(1)
        .expect("one block is left whatever the other thread holds");
    if let Ok(more) = world.alloc(1) {
        held.extend(more);
    }
    let mut rest = other.join().unwrap();
    rest.extend(held);
    world.give_back(&rest);
    world.assert_conserved_and_bounded();
}

/// Three sequences of `pool` holding one block each, for the models of
/// racing publishes: the holder `c` (allocated first), then a rival `r` and
/// a publisher `p` with `r`'s block id below `p`'s, so that `p` defers to
/// `r`'s claim rather than killing it.
pub fn holder_rival_publisher(pool: &Arc<BlockPool>) -> (Sequence, Sequence, Sequence) {
    let one_block = || {
        let mut seq = Sequence::new(Arc::clone(pool));
        seq.try_append(1).unwrap();
        seq
    };
    let c = one_block();
    let (x, y) = (one_block(), one_block());
    if x.blocks()[0] < y.blocks()[0] {
        (c, x, y)
    } else {
        (c, y, x)
    }
}

/// The race of three publishes of key `[1; 32]` on a pool of three
/// one-token blocks ([`holder_rival_publisher`]): the holder publishes while
/// the rival does (the rival then publishes `rival_then` on its block, if
/// given: its tokens rewritten); the holder goes and its key is reset; only
/// then does the publisher publish. The key must end on exactly one of the
/// rival's and the publisher's blocks ("nobody holds the key" otherwise).
/// With `rival_forked`, a fork of the rival shares its block (held by the
/// model's thread until the end), so the rival's claims are the CAS of a
/// shared block, not a sole holder's store. With `rival_then` the search
/// is at one preemption ([`check_one_preemption`]).
pub fn holder_gone_then_publish(faults: Faults, rival_then: Option<BlockHash>, rival_forked: bool) {
    // A rival that publishes twice makes the search long: one preemption.
    let search = if rival_then.is_some() {
        check_one_preemption
    } else {
        check
    };
    search(move || {
        let key = BlockHash([1; 32]);
        let pool = Arc::new(BlockPool::with_faults(3, 1, 1, faults));
        let (mut c, mut r, mut p) = holder_rival_publisher(&pool);
        let fork = rival_forked.then(|| r.try_fork().expect("a full block is shared").0);
        let holder = loom::thread::spawn(move || {
            c.publish(&[key]);
            c
        });
        let rival = loom::thread::spawn(move || {
            let n = r.publish(&[key]);
            if let Some(other) = rival_then {
                r.publish(&[other]);
            }
            (r, n)
        });
        drop(holder.join().unwrap());
        pool.reset_prefix_cache();
        let mine = p.publish(&[key]);
        let (r, theirs) = rival.join().unwrap();
        assert_eq!(
            mine + theirs,
            1,
            "nobody holds the key (rival {:?}, mine {:?})",
            r.blocks(),
            p.blocks()
        );
        drop(fork);
    });
}
