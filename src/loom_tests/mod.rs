//! The loom models: the crate's own unit tests under
//! `cfg(all(test, kvslots_loom))`, one file per subject, with the harness
//! they share (this file: the counter models' shapes, shadow and wrong
//! allocators; `pool_world.rs`: the pool models' world and fault sets).
//!
//! Nothing here exists in any other build. `scripts/loom` runs them
//! (`RUSTFLAGS="--cfg kvslots_loom" cargo test --lib --release`, with
//! `LOOM_MAX_PREEMPTIONS=2`; five models search at 1 whatever it is:
//! `pool_world::check_one_preemption`, unless `KVSLOTS_LOOM_FULL` is set,
//! and `pool_wait.rs`'s `check_bounded(1, ..)`); `scripts/loom pool` runs one file's models
//! (the tests whose path contains `loom_tests::pool::`), and
//! `scripts/loom -- --list` lists them. Under that cfg the crate's other
//! unit tests are left out, so the list is the models and their controls.
//!
//! The models reach what the public API does not offer from inside the
//! crate: the atomics facade (`crate::sync`, loom's types here), the faults
//! of the negative controls (`crate::sync::Faults`, through
//! `BlockPool::with_faults`, `BlockPoolBuilder::faults` and
//! `SlotCounter::with_faults`) and the pool's
//! uncapped admission sum (`BlockPool::admission_free_uncapped`), all of
//! them crate-private and compiled only into this build. A new model is a
//! `#[test]` in one of these files (or a new file declared below) with its
//! negative control: a `#[should_panic(expected = ..)]` test of the same
//! shape with one fault on.
//!
//! | file | subject |
//! |---|---|
//! | `counter.rs` | `SlotCounter`'s admission, release and close |
//! | `guards.rs` | the reservation guards: split, merge, shrink, owned guards across threads |
//! | `wait.rs` | waiting on a `SlotCounter`: the FIFO queue, grants, cancellation, close |
//! | `pool.rs` | `BlockPool`'s allocation and free |
//! | `shards.rs` | a free list (per-shard bitmaps) in two shards |
//! | `admission.rs` | per-shard admission counts: the fast path and gathers |
//! | `pool_wait.rs` | waiting on a pool counted over two shards |
//! | `refused_free.rs` | a free refused after a racing double free; a raw `add_refs` racing a free of a listed block |
//! | `release_race.rs` | a sequence's sole drop (a plain store) racing its block's other holder: two releases of a shared block, a sequence's drop and its fork's (controls: the double release through the token), and the sole drop's `Acquire` (control: `relaxed_sole_drop`) |
//! | `held_drop.rs` | a sequence's give-back against a double free, which the sequence flag refuses; a stale free against a sequence that retook the block |
//! | `fresh.rs` | fresh blocks (8 or more a sequence takes from one bitmap word, uncounted, marked in the fresh bitmap): two takes' marks in one word, a fork's and a publish's count against the drops, `ref_count` against the count, a double free against the give-back, a fence's retire and complete of fresh runs on different threads |
//! | `fresh_attack.rs` | fresh blocks: `ref_count` against a publish's count, and against a fork's count beside another sequence's give-back in the same fresh word |
//! | `whole_attack.rs` | whole-word fresh bits (stores) on short words: a fork's count against `ref_count` and a rival's take, a truncate of part of a whole word then the rest, a fence's completion against the sequence's drop, a whole word and half a word given back in one truncate over two shards |
//! | `sequence.rs` | `Sequence`: fork, drop, append, truncate |
//! | `hybrid.rs` | `HybridSequence`: one admission across groups, a window's give-back and reuse against a match, an append and a double free, a match across groups against an evicting append |
//! | `fence.rs` | fenced release against `complete` and allocation; two completers of a block a sequence and its fork share |
//! | `prefix.rs` | the prefix cache: match, publish, eviction, reset |
//! | `prefix_evict.rs` | the eviction ring: an evictor taking its candidates while another refills it |
//! | `prefix_misuse.rs` | the prefix cache under misuse and three-way races |
//! | `prefix_publish_attack.rs` | rivals of a publish reclaimed, killed or deferred to |
//! | `mark.rs` | `Sequence::publish`'s mark: a fork's publish that finds its parent's claim in flight, which then loses to a rival |
//! | `events.rs` | KV events: the rings' records against the transitions they report, a drain, a full ring |
//!
//! # How the counter models are built
//!
//! Every model shape (in `counter.rs` and `guards.rs`) is written once,
//! generically over the `Slots` trait, and run against two kinds of
//! allocator:
//!
//! * the real `SlotCounter` with its real guards (`Reservation`,
//!   `OwnedReservation`), which every model must pass at every capacity;
//! * the wrong allocators of `wrong`, written against the same atomics
//!   facade (`crate::sync`), which loom must catch under the same model
//!   shape: the two known wrong ways of the seed contract (token by token,
//!   against total capacity), check-then-add in two atomic steps, a closed
//!   flag kept outside the count's word, an admission that is not
//!   `Acquire`, and a guard drop that is not `Release`. Their tests are
//!   `#[should_panic]`, so the suite fails if loom ever stops finding those
//!   bugs.
//!
//! Each model asserts that no admission is partial (the admitted count, or a
//! guard's length, is exactly the request, or nothing was taken), that no
//! more than `capacity` slots are ever held at once (a `Shadow` counter,
//! as in tokio's `loom_semaphore_batch.rs`: a thread adds to it after each
//! admission and subtracts before each release, and checks the sum after
//! every add), that every `Full { available }` reports a count the counter
//! really could have held, and that `used() == 0` once every guard is gone.
//!
//! The assertion messages are fixed strings (see `msg`) so that the
//! negative controls can pin them with `#[should_panic(expected = "...")]`.

use std::ops::Deref;
use std::sync::Arc;

use crate::sync::{AtomicBool, AtomicUsize, Ordering};
use crate::{OwnedReservation, ReleaseError, Reservation, ReserveError, SlotCounter};

pub mod pool_world;

mod admission;
mod counter;
mod events;
mod fence;
mod fresh;
mod fresh_attack;
mod guards;
mod held_drop;
mod hybrid;
mod mark;
mod pool;
mod pool_wait;
mod prefix;
mod prefix_evict;
mod prefix_misuse;
mod prefix_publish_attack;
mod refused_free;
mod release_race;
mod sequence;
mod shards;
mod wait;
mod whole_attack;

/// A waker that records that it was woken: the async waiters of the
/// waiting models (`wait.rs`, `pool_wait.rs`) are polled by
/// hand with one.
#[derive(Debug, Default)]
pub struct Flag(AtomicBool);

impl std::task::Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Release: pairs with the Acquire in `was_woken` (the flag is a
        // model-side witness; the queue's lock orders the grant itself).
        self.0.store(true, Ordering::Release);
    }
}

impl Flag {
    /// Whether the waker was woken (since the flag was made).
    pub fn was_woken(&self) -> bool {
        // Acquire: pairs with the Release in `wake_by_ref`.
        self.0.load(Ordering::Acquire)
    }
}

/// The fixed assertion messages (the prefix of each panic), shared by the
/// models and the `expected = "..."` of the negative controls.
pub mod msg {
    /// An admission took part of a request (or a guard's length is not
    /// what was asked for).
    pub const PARTIAL: &str = "partial admission";
    /// More than `capacity` slots were held at once.
    pub const OVERCOMMIT: &str = "overcommit";
    /// `used()` was not zero once every guard was gone.
    pub const LEAK: &str = "slots leaked";
    /// An admission succeeded after the counter was observed closed.
    pub const AFTER_CLOSE: &str = "admission after close";
    /// A `Full` or `ExceedsUsed` error reported a count the counter could
    /// never have held.
    pub const IMPOSSIBLE: &str = "impossible count reported";
    /// A holder of a slot did not see the previous holder's write: the
    /// admission did not synchronise with the release.
    pub const LOST_UPDATE: &str = "lost update";
    /// A headroom reservation succeeded although the slots it had to leave
    /// free were held.
    pub const HEADROOM: &str = "headroom ignored";
    /// A request that had to fit was refused.
    pub const REFUSED: &str = "refused a request that fit";
}

/// The capacities every model runs at.
pub const CAPACITIES: std::ops::RangeInclusive<usize> = 1..=5;

// `caught!` names one test per capacity of `CAPACITIES`: keep the two in
// step.
const _: () = assert!(*CAPACITIES.start() == 1 && *CAPACITIES.end() == 5);

/// Generates one `#[should_panic(expected = ...)]` test per capacity of
/// [`CAPACITIES`] (`cap1` ... `cap5`), in a module of its own: loom must
/// catch the wrong allocator `$wrong` under the model shape `$shape` (a
/// `fn(usize)` generic over [`Slots`]) at each of them. With `from 2` or
/// `from 3`, the tests start at that capacity, for a wrong allocator that
/// is exact below it (token by token is exact at capacity 1, for
/// instance).
///
/// ```ignore
/// caught!(admit_token_by_token: admit_vs_admit_2::<TokenByToken>,
///     "partial admission", from 2);
/// ```
macro_rules! caught {
    ($module:ident: $shape:ident::<$wrong:ty>, $expected:literal) => {
        $crate::loom_tests::caught!($module: $shape::<$wrong>, $expected, from 1);
    };
    ($module:ident: $shape:ident::<$wrong:ty>, $expected:literal, from $min:tt) => {
        mod $module {
            use super::*;
            $crate::loom_tests::caught!(@from $min, $shape::<$wrong>, $expected,
                [cap1 = 1] [cap2 = 2] [cap3 = 3] [cap4 = 4] [cap5 = 5]);
        }
    };
    (@from 1, $shape:ident::<$wrong:ty>, $expected:literal, $($cap:tt)+) => {
        $crate::loom_tests::caught!(@tests $shape::<$wrong>, $expected, $($cap)+);
    };
    (@from 2, $shape:ident::<$wrong:ty>, $expected:literal, $skip:tt $($cap:tt)+) => {
        $crate::loom_tests::caught!(@tests $shape::<$wrong>, $expected, $($cap)+);
    };
    (@from 3, $shape:ident::<$wrong:ty>, $expected:literal, $a:tt $b:tt $($cap:tt)+) => {
        $crate::loom_tests::caught!(@tests $shape::<$wrong>, $expected, $($cap)+);
    };
    (@tests $shape:ident::<$wrong:ty>, $expected:literal, $([$test:ident = $c:literal])+) => {
        $(
            #[test]
            #[should_panic(expected = $expected)]
            fn $test() {
                assert!($crate::loom_tests::CAPACITIES.contains(&$c));
                $shape::<$wrong>($c);
            }
        )+
    };
}

pub(crate) use caught;

/// Spawns a loom thread that runs `f` on clones of a model's shared
/// allocator and shadow.
pub fn spawn<S: Slots>(
    slots: &Arc<S>,
    shadow: &Arc<Shadow>,
    f: impl FnOnce(&Arc<S>, &Shadow) + 'static,
) -> loom::thread::JoinHandle<()> {
    let slots = Arc::clone(slots);
    let shadow = Arc::clone(shadow);
    loom::thread::spawn(move || f(&slots, &shadow))
}

/// Runs `f` under loom with the bounds of the environment
/// (`LOOM_MAX_PREEMPTIONS` and friends).
pub fn check<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    loom::model(f);
}

/// Runs `f` under loom with an explicit preemption bound, for a model that
/// needs a bound other than the environment's.
pub fn check_bounded<F>(preemption_bound: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemption_bound);
    builder.check(f);
}

/// Runs `f` under loom with no preemption bound: every interleaving
/// (up to loom's partial-order reduction). Cheap for two threads.
pub fn check_exhaustive<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = None;
    builder.check(f);
}

/// Runs a model of `threads` threads (the model's main thread included):
/// exhaustively ([`check_exhaustive`]) for two, with the environment's
/// preemption bound ([`check`], `LOOM_MAX_PREEMPTIONS=2` in CI) for more.
pub fn check_threads<F>(threads: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    if threads <= 2 {
        check_exhaustive(f);
    } else {
        check(f);
    }
}

/// The slots held at once, as the threads of a model account for them: each
/// thread adds what it was admitted *after* the admission returns and
/// subtracts what it gives back *before* giving it back, so the shadow never
/// exceeds what the counter really has out. If the shadow ever exceeds the
/// capacity, the allocator overcommitted.
#[derive(Debug)]
pub struct Shadow {
    held: AtomicUsize,
    capacity: usize,
}

impl Shadow {
    /// A shadow of a counter of `capacity` slots, none held.
    pub fn new(capacity: usize) -> Self {
        Shadow {
            held: AtomicUsize::new(0),
            capacity,
        }
    }

    /// Accounts for `n` slots just admitted and checks the sum.
    ///
    /// # Panics
    ///
    /// Panics with [`msg::OVERCOMMIT`] if more than `capacity` slots are now
    /// held at once.
    pub fn enter(&self, n: usize) {
        // SeqCst: the shadow's updates form one total order that agrees with
        // every thread's program order, so the sum checked here is a sum of
        // holdings that really overlapped.
        let now = self.held.fetch_add(n, Ordering::SeqCst) + n;
        assert!(
            now <= self.capacity,
            "{}: {now} slots held at once, capacity {}",
            msg::OVERCOMMIT,
            self.capacity
        );
    }

    /// Accounts for `n` slots about to be given back.
    pub fn exit(&self, n: usize) {
        // SeqCst: as in `enter`.
        self.held.fetch_sub(n, Ordering::SeqCst);
    }
}

/// Asserts that an admission of `requested` took all of it or nothing.
///
/// # Panics
///
/// Panics with [`msg::PARTIAL`] otherwise.
pub fn assert_whole(requested: isize, admitted: usize) {
    let whole = admitted == 0 || (requested > 0 && admitted == requested as usize);
    assert!(
        whole,
        "{}: requested {requested}, admitted {admitted}",
        msg::PARTIAL
    );
}

/// Asserts that a guard asked for `requested` slots holds exactly that many.
///
/// # Panics
///
/// Panics with [`msg::PARTIAL`] otherwise.
pub fn assert_len(requested: usize, len: usize) {
    assert_eq!(
        len,
        requested,
        "{}: guard of {len} for a request of {requested}",
        msg::PARTIAL
    );
}

/// Asserts that a refused request reports a free count the counter could
/// have held: `capacity - available` is one of `possible_used` (the sums of
/// what the other threads could have been holding at that moment), and the
/// request (with its headroom) really did not fit in it.
///
/// # Panics
///
/// Panics with [`msg::IMPOSSIBLE`] otherwise, or with [`msg::REFUSED`] if
/// the request fitted in the count the error reported.
pub fn assert_full(err: ReserveError, needed: usize, capacity: usize, possible_used: &[usize]) {
    match err {
        ReserveError::Full { available, .. } => {
            let plausible =
                available <= capacity && possible_used.contains(&(capacity - available));
            assert!(
                plausible,
                "{}: Full {{ available: {available} }} with capacity {capacity}, \
                 but only {possible_used:?} could have been in use",
                msg::IMPOSSIBLE
            );
            assert!(
                needed > available,
                "{}: {needed} needed, Full reported {available} available",
                msg::REFUSED
            );
        }
        other => panic!("{}: unexpected {other:?}", msg::REFUSED),
    }
}

/// Every count that could be in use at once when each of several threads
/// may hold any one of its own `options` (or nothing): all sums that pick
/// one entry or zero from each slice. For [`assert_full`]'s
/// `possible_used`.
pub fn sums(options: &[&[usize]]) -> Vec<usize> {
    let mut out = vec![0];
    for opts in options {
        let mut next = out.clone();
        for &base in &out {
            next.extend(opts.iter().map(|&o| base + o));
        }
        next.sort_unstable();
        next.dedup();
        out = next;
    }
    out
}

/// Asserts that nothing is in use any more (call it once every guard is
/// gone and every thread joined).
///
/// # Panics
///
/// Panics with [`msg::LEAK`] otherwise.
pub fn assert_drained<S: Slots>(slots: &S) {
    let used = slots.used();
    assert_eq!(used, 0, "{}: {used} still in use at the end", msg::LEAK);
}

/// An allocator a model can drive: the real [`SlotCounter`], or one of the
/// wrong ones in [`wrong`] (through [`wrong::Core`]).
pub trait Slots: Send + Sync + Sized + 'static {
    /// The borrowing guard ([`Reservation`] for the real counter).
    type Guard<'a>: Guard
    where
        Self: 'a;
    /// The owning guard ([`OwnedReservation`] for the real counter).
    type Owned: Guard + 'static;

    /// A counter of `capacity` free slots.
    fn with_capacity(capacity: usize) -> Self;
    /// The total number of slots.
    fn capacity(&self) -> usize;
    /// A snapshot of the slots in use.
    fn used(&self) -> usize;
    /// The admission rule applied atomically (`SlotCounter::admit`).
    fn admit(&self, requested: isize) -> usize;
    /// Gives back counts from `admit` or `forget`.
    fn release(&self, n: usize) -> Result<(), ReleaseError>;
    /// All-or-nothing reservation as a borrowing guard.
    fn try_reserve(&self, n: usize) -> Result<Self::Guard<'_>, ReserveError>;
    /// All-or-nothing reservation that leaves `headroom` free.
    fn try_reserve_with_headroom(
        &self,
        n: usize,
        headroom: usize,
    ) -> Result<Self::Guard<'_>, ReserveError>;
    /// All-or-nothing reservation as an owning guard.
    fn try_reserve_owned(self: &Arc<Self>, n: usize) -> Result<Self::Owned, ReserveError>;
    /// Stops admission; releases keep working.
    fn close(&self);
    /// Whether `close` was called.
    fn is_closed(&self) -> bool;
}

/// The guard operations a model drives ([`Reservation`]'s methods).
pub trait Guard: Sized + Send {
    /// Slots held.
    fn len(&self) -> usize;
    /// Whether it holds nothing.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Splits `n` slots off.
    fn split(&mut self, n: usize) -> Option<Self>;
    /// Takes all of `other`'s slots.
    fn merge(&mut self, other: Self);
    /// Gives back all but `len` slots.
    fn shrink_to(&mut self, len: usize);
    /// Takes `n` more, all or nothing.
    fn try_grow(&mut self, n: usize) -> Result<(), ReserveError>;
    /// Keeps the slots taken and returns their count.
    fn forget(self) -> usize;
}

impl Slots for SlotCounter {
    type Guard<'a>
        = Reservation<'a>
    where
        Self: 'a;
    type Owned = OwnedReservation;

    fn with_capacity(capacity: usize) -> Self {
        SlotCounter::new(capacity)
    }
    fn capacity(&self) -> usize {
        SlotCounter::capacity(self)
    }
    fn used(&self) -> usize {
        SlotCounter::used(self)
    }
    fn admit(&self, requested: isize) -> usize {
        SlotCounter::admit(self, requested)
    }
    fn release(&self, n: usize) -> Result<(), ReleaseError> {
        SlotCounter::release(self, n)
    }
    fn try_reserve(&self, n: usize) -> Result<Reservation<'_>, ReserveError> {
        SlotCounter::try_reserve(self, n)
    }
    fn try_reserve_with_headroom(
        &self,
        n: usize,
        headroom: usize,
    ) -> Result<Reservation<'_>, ReserveError> {
        SlotCounter::try_reserve_with_headroom(self, n, headroom)
    }
    fn try_reserve_owned(self: &Arc<Self>, n: usize) -> Result<OwnedReservation, ReserveError> {
        SlotCounter::try_reserve_owned(self, n)
    }
    fn close(&self) {
        SlotCounter::close(self)
    }
    fn is_closed(&self) -> bool {
        SlotCounter::is_closed(self)
    }
}

macro_rules! real_guard {
    ($guard:ty) => {
        impl Guard for $guard {
            fn len(&self) -> usize {
                <$guard>::len(self)
            }
            fn split(&mut self, n: usize) -> Option<Self> {
                <$guard>::split(self, n)
            }
            fn merge(&mut self, other: Self) {
                <$guard>::merge(self, other)
            }
            fn shrink_to(&mut self, len: usize) {
                <$guard>::shrink_to(self, len)
            }
            fn try_grow(&mut self, n: usize) -> Result<(), ReserveError> {
                <$guard>::try_grow(self, n)
            }
            fn forget(self) -> usize {
                <$guard>::forget(self)
            }
        }
    };
}

real_guard!(Reservation<'_>);
real_guard!(OwnedReservation);

/// Deliberately wrong allocators, written against the same atomics facade
/// as [`SlotCounter`], for the negative controls.
///
/// Each differs from a sound allocator in one place: how it takes slots
/// ([`Core::take`](wrong::Core::take)), or, for
/// [`RelaxedRelease`](wrong::RelaxedRelease), how slots are given back.
/// Everything else (untrusted `release`, guards, errors) is shared and
/// sound, so that a model catches each for its own reason. The one exception is `close`: all
/// of them keep the closed flag in a word of its own, which cannot be made
/// linearizable with admission; so the close models are controlled with
/// [`SeparateCloseFlag`](wrong::SeparateCloseFlag), whose admission is
/// otherwise sound.
pub mod wrong {
    use super::*;

    /// The words every wrong allocator shares: a used-count and a closed
    /// flag kept in a *separate* word (which is itself one of the wrong
    /// ways, see [`SeparateCloseFlag`]).
    #[derive(Debug)]
    pub struct Words {
        capacity: usize,
        used: AtomicUsize,
        closed: AtomicBool,
    }

    impl Words {
        fn new(capacity: usize) -> Self {
            Words {
                capacity,
                used: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
            }
        }

        /// One correct all-or-nothing CAS loop with the given success
        /// ordering; the wrong allocators differ from it on purpose.
        fn cas_take(&self, n: usize, headroom: usize, success: Ordering) -> Result<usize, usize> {
            let needed = n.saturating_add(headroom);
            // Relaxed: a first guess, validated by the CAS.
            let mut cur = self.used.load(Ordering::Relaxed);
            loop {
                let available = self.capacity.saturating_sub(cur);
                if needed > available {
                    return Err(available);
                }
                // `success` on success (Acquire when sound); Relaxed on
                // failure: we only retry with the fresh value.
                match self
                    .used
                    .compare_exchange(cur, cur + n, success, Ordering::Relaxed)
                {
                    Ok(_) => return Ok(n),
                    Err(actual) => cur = actual,
                }
            }
        }
    }

    /// An allocator core: the shared [`Words`] and one (wrong) way to take
    /// slots. Every `Core` is a [`Slots`] through a blanket impl.
    pub trait Core: Send + Sync + Sized + 'static {
        /// A core of `capacity` free slots.
        fn with_capacity(capacity: usize) -> Self;
        /// Its words.
        fn words(&self) -> &Words;
        /// Takes slots for a request of `n` that must leave `headroom` free:
        /// `Ok(taken)` with `taken > 0` (which the wrong ways let be less
        /// than `n`), or `Err(available)` with the free count it saw.
        fn take(&self, n: usize, headroom: usize) -> Result<usize, usize>;
        /// The ordering with which slots are given back, by a guard's drop
        /// and by `release` (`Release`, which pairs with the admission's
        /// `Acquire`, unless that is the bug).
        fn give_back_ordering(&self) -> Ordering {
            Ordering::Release
        }
    }

    /// Wrong way 1 of the seed contract: admits token by token, each token
    /// on its own, so a request that does not fit still eats the free slots
    /// that were left (a partial admission).
    #[derive(Debug)]
    pub struct TokenByToken(Words);

    impl Core for TokenByToken {
        fn with_capacity(capacity: usize) -> Self {
            TokenByToken(Words::new(capacity))
        }
        fn words(&self) -> &Words {
            &self.0
        }
        fn take(&self, n: usize, headroom: usize) -> Result<usize, usize> {
            let w = &self.0;
            let mut taken = 0;
            let mut seen = 0;
            while taken < n {
                // Acquire: pairs with the Release of whoever freed the slot.
                let cur = w.used.load(Ordering::Acquire);
                seen = w.capacity.saturating_sub(cur);
                // Does *this token* fit (leaving the headroom)?
                if headroom.saturating_add(1) > seen {
                    break;
                }
                // Acquire on success, as above; Relaxed on failure: retry.
                if w.used
                    .compare_exchange(cur, cur + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    taken += 1;
                }
            }
            if taken == 0 {
                Err(seen)
            } else {
                Ok(taken)
            }
        }
    }

    /// Wrong way 2 of the seed contract: compares the request with the
    /// total capacity only, ignoring the slots already used (overcommit).
    #[derive(Debug)]
    pub struct AgainstCapacity(Words);

    impl Core for AgainstCapacity {
        fn with_capacity(capacity: usize) -> Self {
            AgainstCapacity(Words::new(capacity))
        }
        fn words(&self) -> &Words {
            &self.0
        }
        fn take(&self, n: usize, headroom: usize) -> Result<usize, usize> {
            let w = &self.0;
            if n.saturating_add(headroom) <= w.capacity {
                // AcqRel: pairs with the Release of whoever freed slots.
                w.used.fetch_add(n, Ordering::AcqRel);
                Ok(n)
            } else {
                // Relaxed: a report only.
                Err(w.capacity.saturating_sub(w.used.load(Ordering::Relaxed)))
            }
        }
    }

    /// The concurrent wrong way: checks `capacity - used` with one load and
    /// adds with a separate `fetch_add`, so two appenders can both pass a
    /// check that only one of them fits.
    #[derive(Debug)]
    pub struct CheckThenAdd(Words);

    impl Core for CheckThenAdd {
        fn with_capacity(capacity: usize) -> Self {
            CheckThenAdd(Words::new(capacity))
        }
        fn words(&self) -> &Words {
            &self.0
        }
        fn take(&self, n: usize, headroom: usize) -> Result<usize, usize> {
            let w = &self.0;
            // Acquire: pairs with the Release of whoever freed slots.
            let available = w.capacity.saturating_sub(w.used.load(Ordering::Acquire));
            if n.saturating_add(headroom) <= available {
                // AcqRel: as above; the bug is that this is a second step.
                w.used.fetch_add(n, Ordering::AcqRel);
                Ok(n)
            } else {
                Err(available)
            }
        }
    }

    /// Sound all-or-nothing admission, but the closed flag lives in its own
    /// word: admission reads the flag, then CASes the count, so a `close`
    /// that lands in between does not stop it (not linearizable).
    #[derive(Debug)]
    pub struct SeparateCloseFlag(Words);

    impl Core for SeparateCloseFlag {
        fn with_capacity(capacity: usize) -> Self {
            SeparateCloseFlag(Words::new(capacity))
        }
        fn words(&self) -> &Words {
            &self.0
        }
        fn take(&self, n: usize, headroom: usize) -> Result<usize, usize> {
            self.0.cas_take(n, headroom, Ordering::Acquire)
        }
    }

    /// Sound all-or-nothing admission with a `Relaxed` successful CAS: it
    /// never synchronises with the `Release` of the previous holder, so the
    /// new holder may not see what the previous one wrote into the slots.
    #[derive(Debug)]
    pub struct RelaxedAdmission(Words);

    impl Core for RelaxedAdmission {
        fn with_capacity(capacity: usize) -> Self {
            RelaxedAdmission(Words::new(capacity))
        }
        fn words(&self) -> &Words {
            &self.0
        }
        fn take(&self, n: usize, headroom: usize) -> Result<usize, usize> {
            self.0.cas_take(n, headroom, Ordering::Relaxed)
        }
    }

    /// Sound all-or-nothing admission (`Acquire`), but slots are given back
    /// `Relaxed` (a guard's `fetch_sub`, and `release`'s CAS): the next
    /// holder's admission has no `Release` to synchronise with.
    #[derive(Debug)]
    pub struct RelaxedRelease(Words);

    impl Core for RelaxedRelease {
        fn with_capacity(capacity: usize) -> Self {
            RelaxedRelease(Words::new(capacity))
        }
        fn words(&self) -> &Words {
            &self.0
        }
        fn take(&self, n: usize, headroom: usize) -> Result<usize, usize> {
            self.0.cas_take(n, headroom, Ordering::Acquire)
        }
        fn give_back_ordering(&self) -> Ordering {
            // Relaxed: the bug.
            Ordering::Relaxed
        }
    }

    /// The guard of a wrong allocator: a count and a pointer to the core
    /// (`&C` or `Arc<C>`).
    #[derive(Debug)]
    pub struct NaiveGuard<P: Deref>
    where
        P::Target: Core,
    {
        core: P,
        len: usize,
    }

    fn reserve<C: Core>(core: &C, n: usize, headroom: usize) -> Result<usize, ReserveError> {
        let w = core.words();
        if n.saturating_add(headroom) > w.capacity {
            return Err(ReserveError::NeverFits {
                requested: n,
                capacity: w.capacity,
            });
        }
        // SeqCst: the flag is a separate word (the SeparateCloseFlag bug);
        // even the strongest ordering cannot make check-then-CAS atomic.
        if w.closed.load(Ordering::SeqCst) {
            return Err(ReserveError::Closed);
        }
        if n == 0 {
            return Ok(0);
        }
        core.take(n, headroom)
            .map_err(|available| ReserveError::Full {
                requested: n,
                available,
            })
    }

    fn give_back<C: Core>(core: &C, n: usize) {
        // Release (unless that is the bug): the holder's writes
        // happen-before the next admission.
        core.words().used.fetch_sub(n, core.give_back_ordering());
    }

    impl<P> Guard for NaiveGuard<P>
    where
        P: Deref + Clone + Send,
        P::Target: Core,
    {
        fn len(&self) -> usize {
            self.len
        }
        fn split(&mut self, n: usize) -> Option<Self> {
            if n > self.len {
                return None;
            }
            self.len -= n;
            Some(NaiveGuard {
                core: self.core.clone(),
                len: n,
            })
        }
        fn merge(&mut self, mut other: Self) {
            assert!(std::ptr::eq(&*self.core, &*other.core));
            self.len += std::mem::take(&mut other.len);
        }
        fn shrink_to(&mut self, len: usize) {
            if len < self.len {
                give_back(&*self.core, self.len - len);
                self.len = len;
            }
        }
        fn try_grow(&mut self, n: usize) -> Result<(), ReserveError> {
            self.len += reserve(&*self.core, n, 0)?;
            Ok(())
        }
        fn forget(mut self) -> usize {
            std::mem::take(&mut self.len)
        }
    }

    impl<P: Deref> Drop for NaiveGuard<P>
    where
        P::Target: Core,
    {
        fn drop(&mut self) {
            // When loom has found the bug, it unwinds the model's other,
            // suspended threads outside the model, where no loom atomic may
            // be touched (a second panic would abort the test binary instead
            // of failing the model). A panicking model is over anyway.
            if self.len > 0 && !std::thread::panicking() {
                give_back(&*self.core, self.len);
            }
        }
    }

    impl<C: Core> Slots for C {
        type Guard<'a>
            = NaiveGuard<&'a C>
        where
            Self: 'a;
        type Owned = NaiveGuard<Arc<C>>;

        fn with_capacity(capacity: usize) -> Self {
            <C as Core>::with_capacity(capacity)
        }
        fn capacity(&self) -> usize {
            self.words().capacity
        }
        fn used(&self) -> usize {
            // Relaxed: a snapshot.
            self.words().used.load(Ordering::Relaxed)
        }
        fn admit(&self, requested: isize) -> usize {
            // No NeverFits pre-check here: the wrong ways are given every
            // request as it comes (token by token eats what is left).
            // SeqCst: see `reserve`.
            if requested <= 0 || self.words().closed.load(Ordering::SeqCst) {
                return 0;
            }
            self.take(requested as usize, 0).unwrap_or(0)
        }
        fn release(&self, n: usize) -> Result<(), ReleaseError> {
            let used = &self.words().used;
            // Relaxed: a first guess, validated by the CAS.
            let mut cur = used.load(Ordering::Relaxed);
            loop {
                if n > cur {
                    return Err(ReleaseError::ExceedsUsed {
                        released: n,
                        used: cur,
                    });
                }
                // The give-back ordering on success (Release when sound: the
                // holder's writes happen-before the next admission; the
                // `RelaxedRelease` bug otherwise); Relaxed on failure: retry.
                let success = self.give_back_ordering();
                match used.compare_exchange(cur, cur - n, success, Ordering::Relaxed) {
                    Ok(_) => return Ok(()),
                    Err(actual) => cur = actual,
                }
            }
        }
        fn try_reserve(&self, n: usize) -> Result<NaiveGuard<&C>, ReserveError> {
            self.try_reserve_with_headroom(n, 0)
        }
        fn try_reserve_with_headroom(
            &self,
            n: usize,
            headroom: usize,
        ) -> Result<NaiveGuard<&C>, ReserveError> {
            let len = reserve(self, n, headroom)?;
            Ok(NaiveGuard { core: self, len })
        }
        fn try_reserve_owned(
            self: &Arc<Self>,
            n: usize,
        ) -> Result<NaiveGuard<Arc<C>>, ReserveError> {
            let len = reserve(&**self, n, 0)?;
            Ok(NaiveGuard {
                core: Arc::clone(self),
                len,
            })
        }
        fn close(&self) {
            // SeqCst: a separate word; see `reserve`.
            self.words().closed.store(true, Ordering::SeqCst);
        }
        fn is_closed(&self) -> bool {
            // SeqCst: as in `close`.
            self.words().closed.load(Ordering::SeqCst)
        }
    }
}
