//! Rayon and real-thread stress tests: many threads drive mixed operations
//! on one small `SlotCounter`, `BlockPool` or set of `Sequence`s, while a
//! separate observer thread samples the invariants.
//!
//! # SlotCounter
//!
//! Mixed admissions, releases and guard operations. What is checked, throughout and at the end:
//!
//! * **Whole or nothing.** `admit` returns 0 or exactly the request; every
//!   guard's length is exactly what was asked for; `try_grow` adds exactly
//!   `n` or nothing; every refusal is typed and consistent with the request
//!   (`Full` only for requests that could fit, with an `available` that was
//!   too small; `NeverFits` exactly for requests above capacity).
//! * **Never overcommitted.** The observer samples `used() <= capacity()`
//!   (and `available()`, `peak_used()`) for the whole run, and a *shadow*
//!   count: each worker adds what it got after the admission and subtracts
//!   what it gives back before giving it back, so the shadow never exceeds
//!   what is really held and must stay `<= capacity` too.
//! * **Nothing leaks.** `used() == 0` and the shadow is 0 once every task is
//!   done, also when tasks panic while holding guards.
//!
//! Every worker has its own tiny deterministic PRNG (xorshift), so the
//! operation mix of each task is reproducible (the interleaving is not).
//!
//! # BlockPool and Sequence (at least 8 threads)
//!
//! 1. **Ownership.** Many tasks allocate and free mixed request sizes
//!    (including sizes that never fit) on a small pool. An ownership array
//!    (one `AtomicBool` per block) proves that no id is ever held by two
//!    owners: taking an id swaps its flag to `true` and must find `false`;
//!    giving it back swaps it to `false` (before the free) and must find
//!    `true`. Refused calls (also deliberately bad frees) must leave the
//!    caller's ids held. At the end every block is free again and
//!    allocating all of them yields every id once.
//! 2. **Sequences.** Many tasks append (multi-token), truncate, fork and
//!    drop sequences over one small pool, handing forked children to other
//!    tasks, so shared blocks are dropped on other threads. Every append is
//!    whole or nothing, every block written into has exactly one reference
//!    (nobody else can read it), and the pool is full again at the end.
//! 3. **A refused free racing a legitimate one.** A free that lists a
//!    shared block before a bad id must change nothing, even while the
//!    block's other holder frees it at the same time.
//!
//! Throughout, an observer thread samples `used_blocks() <= num_blocks()`.
//! Every task has its own tiny deterministic PRNG (xorshift), so each task's
//! operation mix is reproducible (the interleaving is not). The default
//! sizes run in a few seconds in debug builds on 2 cores; the `#[ignore]`d
//! variants run longer.
//!
//! # The free list's takes
//!
//! A storm of small takes and single frees on a small pool, on more threads
//! than cores, where a take that lost an update of its bitmap word would
//! hand out a held block (the loom models prove the CAS; this catches its
//! loss in an ordinary test run too).

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use crossbeam_queue::SegQueue;
use kvslots::{
    BlockId, BlockPool, FreeError, OwnedReservation, ReleaseError, Reservation, ReserveError,
    Sequence, SlotCounter,
};
use rayon::prelude::*;

mod common;
use common::{assert_pool_whole, rayon_pool, run_observed, XorShift};

// ---------------------------------------------------------------------------
// SlotCounter: shared state and the observer
// ---------------------------------------------------------------------------

/// What all workers of one run share.
struct Shared {
    counter: Arc<SlotCounter>,
    /// What the workers believe they hold: added after an admission,
    /// subtracted before giving back.
    shadow: AtomicUsize,
    /// Whether this run closes the counter midway.
    closing: bool,
}

impl Shared {
    fn new(capacity: usize, closing: bool) -> Self {
        Shared {
            counter: Arc::new(SlotCounter::new(capacity)),
            shadow: AtomicUsize::new(0),
            closing,
        }
    }

    fn shadow_add(&self, n: usize) {
        // SeqCst: the shadow is the test's oracle; the strongest ordering
        // keeps it from adding any doubt of its own. It is updated after the
        // counter's Acquire admission and before its Release give-back, so
        // the counter's own orderings are what keep it <= capacity.
        let prev = self.shadow.fetch_add(n, Ordering::SeqCst);
        assert!(
            prev + n <= self.counter.capacity(),
            "shadow {} above capacity {}",
            prev + n,
            self.counter.capacity()
        );
    }

    fn shadow_sub(&self, n: usize) {
        // SeqCst: see `shadow_add`.
        let prev = self.shadow.fetch_sub(n, Ordering::SeqCst);
        assert!(prev >= n, "shadow underflow: {prev} - {n}");
    }

    fn shadow(&self) -> usize {
        // SeqCst: see `shadow_add`.
        self.shadow.load(Ordering::SeqCst)
    }
}

/// Runs `work` while a separate std thread samples the invariants (see
/// [`run_observed`]); returns what `work` returned and the number of
/// samples the observer took (at least one while `work` may run, and one
/// after it ended).
fn counter_observed<R: Send>(shared: &Shared, work: impl FnOnce() -> R + Send) -> (R, u64) {
    let c = &*shared.counter;
    let capacity = c.capacity();
    let sample = || {
        let used = c.used();
        assert!(used <= capacity, "used {used} > capacity {capacity}");
        // `available` would underflow (and panic) on an overcommit.
        assert!(c.available() <= capacity);
        assert!(c.peak_used() <= capacity);
        let shadow = shared.shadow();
        assert!(shadow <= capacity, "shadow {shadow} > capacity {capacity}");
    };
    run_observed(sample, work)
}

// ---------------------------------------------------------------------------
// Guards that keep the shadow honest
// ---------------------------------------------------------------------------

enum Inner<'a> {
    Borrowed(Reservation<'a>),
    Owned(OwnedReservation),
}

impl Inner<'_> {
    fn len(&self) -> usize {
        match self {
            Inner::Borrowed(r) => r.len(),
            Inner::Owned(r) => r.len(),
        }
    }
}

/// A guard of either kind that subtracts its length from the shadow just
/// before it gives its slots back: when dropped (also while unwinding) or
/// shrunk.
struct Held<'a> {
    inner: Option<Inner<'a>>,
    shared: &'a Shared,
}

impl<'a> Held<'a> {
    fn new(inner: Inner<'a>, shared: &'a Shared) -> Self {
        Held {
            inner: Some(inner),
            shared,
        }
    }

    fn inner(&mut self) -> &mut Inner<'a> {
        self.inner.as_mut().expect("guard already taken")
    }

    fn len(&self) -> usize {
        self.inner.as_ref().expect("guard already taken").len()
    }

    fn split(&mut self, n: usize) -> Option<Held<'a>> {
        let shared = self.shared;
        let part = match self.inner() {
            Inner::Borrowed(r) => r.split(n).map(Inner::Borrowed),
            Inner::Owned(r) => r.split(n).map(Inner::Owned),
        };
        part.map(|p| Held::new(p, shared))
    }

    /// Merges `other` into `self` if they are of the same kind; otherwise
    /// hands it back.
    fn merge(&mut self, mut other: Held<'a>) -> Result<(), Held<'a>> {
        match (
            self.inner(),
            other.inner.take().expect("guard already taken"),
        ) {
            (Inner::Borrowed(a), Inner::Borrowed(b)) => a.merge(b),
            (Inner::Owned(a), Inner::Owned(b)) => a.merge(b),
            (_, b) => {
                other.inner = Some(b);
                return Err(other);
            }
        }
        Ok(())
    }

    fn shrink_to(&mut self, len: usize) {
        let excess = self.len().saturating_sub(len);
        self.shared.shadow_sub(excess);
        match self.inner() {
            Inner::Borrowed(r) => r.shrink_to(len),
            Inner::Owned(r) => r.shrink_to(len),
        }
    }

    fn try_grow(&mut self, n: usize) -> Result<(), ReserveError> {
        let result = match self.inner() {
            Inner::Borrowed(r) => r.try_grow(n),
            Inner::Owned(r) => r.try_grow(n),
        };
        if result.is_ok() {
            self.shared.shadow_add(n);
        }
        result
    }

    /// Forgets the guard; the caller now owns the count (and its share of
    /// the shadow).
    fn forget(mut self) -> usize {
        match self.inner.take().expect("guard already taken") {
            Inner::Borrowed(r) => r.forget(),
            Inner::Owned(r) => r.forget(),
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.inner.is_some() {
            // Before the inner guard gives the slots back (fields drop after
            // this body).
            self.shared.shadow_sub(self.len());
        }
    }
}

// ---------------------------------------------------------------------------
// The worker: one task's operation mix
// ---------------------------------------------------------------------------

/// The kinds of operation in the mix, as indices into `Stats::done`.
const KINDS: [&str; 11] = [
    "admit",
    "release",
    "try_reserve",
    "try_reserve_owned",
    "try_reserve_with_headroom",
    "try_grow",
    "shrink_to",
    "split",
    "merge",
    "drop",
    "forget+release",
];
const ADMIT: usize = 0;
const RELEASE: usize = 1;
const RESERVE: usize = 2;
const RESERVE_OWNED: usize = 3;
const HEADROOM: usize = 4;
const GROW: usize = 5;
const SHRINK: usize = 6;
const SPLIT: usize = 7;
const MERGE: usize = 8;
const DROP: usize = 9;
const FORGET: usize = 10;

/// How often each kind of operation happened, and how often it was refused.
#[derive(Default, Clone, Copy, Debug)]
struct Stats {
    ops: u64,
    /// Per kind (see `KINDS`): how often it was really carried out (a guard
    /// operation needs a guard; a split or a merge must have succeeded).
    done: [u64; KINDS.len()],
    admitted: u64,
    refused_full: u64,
    refused_never_fits: u64,
    refused_closed: u64,
}

impl Stats {
    fn add(&mut self, other: Stats) {
        self.ops += other.ops;
        for (d, o) in self.done.iter_mut().zip(other.done) {
            *d += o;
        }
        self.admitted += other.admitted;
        self.refused_full += other.refused_full;
        self.refused_never_fits += other.refused_never_fits;
        self.refused_closed += other.refused_closed;
    }
}

/// Totals over all tasks of a run.
#[derive(Default)]
struct Totals {
    ops: AtomicU64,
    done: [AtomicU64; KINDS.len()],
    admitted: AtomicU64,
    refused_full: AtomicU64,
    refused_never_fits: AtomicU64,
    refused_closed: AtomicU64,
}

impl Totals {
    fn add(&self, s: Stats) {
        // Relaxed (all): plain tallies, read after every task has joined.
        self.ops.fetch_add(s.ops, Ordering::Relaxed);
        for (d, o) in self.done.iter().zip(s.done) {
            d.fetch_add(o, Ordering::Relaxed);
        }
        self.admitted.fetch_add(s.admitted, Ordering::Relaxed);
        self.refused_full
            .fetch_add(s.refused_full, Ordering::Relaxed);
        self.refused_never_fits
            .fetch_add(s.refused_never_fits, Ordering::Relaxed);
        self.refused_closed
            .fetch_add(s.refused_closed, Ordering::Relaxed);
    }

    fn get(&self) -> Stats {
        // Relaxed (all): every task has joined, which orders its tallies
        // before this read.
        Stats {
            ops: self.ops.load(Ordering::Relaxed),
            done: std::array::from_fn(|k| self.done[k].load(Ordering::Relaxed)),
            admitted: self.admitted.load(Ordering::Relaxed),
            refused_full: self.refused_full.load(Ordering::Relaxed),
            refused_never_fits: self.refused_never_fits.load(Ordering::Relaxed),
            refused_closed: self.refused_closed.load(Ordering::Relaxed),
        }
    }
}

/// Holds at most this many guards at once, so that slots keep circulating.
const MAX_HELD: usize = 6;

struct Worker<'a> {
    shared: &'a Shared,
    capacity: usize,
    rng: XorShift,
    held: Vec<Held<'a>>,
    /// Counts taken with `admit` or kept by `forget`, to `release` later.
    plain: Vec<usize>,
    stats: Stats,
}

impl<'a> Worker<'a> {
    fn new(shared: &'a Shared, seed: u64) -> Self {
        Worker {
            shared,
            capacity: shared.counter.capacity(),
            rng: XorShift::new(seed),
            held: Vec::with_capacity(MAX_HELD + 2),
            plain: Vec::with_capacity(MAX_HELD + 2),
            stats: Stats::default(),
        }
    }

    fn counter(&self) -> &'a SlotCounter {
        &self.shared.counter
    }

    /// A request size: mostly small (so that several fit at once), some up
    /// to the whole capacity, a few that can never fit.
    fn size(&mut self) -> usize {
        let cap = self.capacity;
        match self.rng.below(100) {
            0..=84 => self.rng.below(cap / 4 + 1),
            85..=96 => self.rng.below(cap + 1),
            97 => cap + 1 + self.rng.below(3),
            98 => usize::MAX - self.rng.below(2),
            _ => usize::MAX >> 1,
        }
    }

    /// Checks a refusal of `n` with `headroom` against the request.
    fn refused(&mut self, err: ReserveError, n: usize, headroom: usize, was_closed: bool) {
        let cap = self.capacity;
        let needed = n.saturating_add(headroom);
        match err {
            ReserveError::Full {
                requested,
                available,
            } => {
                assert_eq!(requested, n);
                assert!(needed <= cap, "Full for a request that never fits: {err:?}");
                assert!(
                    available < needed,
                    "refused {n} (+{headroom}) with {available} available"
                );
                assert!(available <= cap);
                assert!(!was_closed, "Full after the counter was seen closed");
                self.stats.refused_full += 1;
            }
            ReserveError::BehindWaiters { .. } => panic!("nobody waits here: {err:?}"),
            ReserveError::NeverFits {
                requested,
                capacity,
            } => {
                assert_eq!((requested, capacity), (n, cap));
                assert!(needed > cap, "NeverFits for a request that fits: {err:?}");
                self.stats.refused_never_fits += 1;
            }
            ReserveError::Closed => {
                assert!(self.shared.closing, "Closed, but nobody closed the counter");
                assert!(self.counter().is_closed());
                self.stats.refused_closed += 1;
            }
            other => panic!("an error this test does not know: {other:?}"),
        }
    }

    /// An admission succeeded: `n` fits in the capacity (with headroom) and
    /// the counter was not seen closed before the call.
    fn admitted(&mut self, n: usize, headroom: usize, was_closed: bool) {
        assert!(n.saturating_add(headroom) <= self.capacity);
        assert!(
            !was_closed,
            "admitted {n} after the counter was seen closed"
        );
        self.stats.admitted += 1;
    }

    fn pick(&mut self) -> Option<usize> {
        (!self.held.is_empty()).then(|| self.rng.below(self.held.len()))
    }

    /// One operation, chosen at random.
    fn step(&mut self) {
        self.stats.ops += 1;
        let c = self.counter();
        if self.held.len() > MAX_HELD {
            // Too many guards: give one back.
            let i = self.rng.below(self.held.len());
            drop(self.held.swap_remove(i));
            return;
        }
        // Seen closed before the operation: then it must be refused.
        let was_closed = c.is_closed();
        match self.rng.below(100) {
            0..=11 => self.admit(was_closed),
            12..=19 => self.release(),
            20..=33 => self.reserve(was_closed),
            34..=41 => self.reserve_owned(was_closed),
            42..=51 => self.reserve_with_headroom(was_closed),
            52..=61 => self.grow(was_closed),
            62..=70 => self.shrink(),
            71..=78 => self.split(),
            79..=85 => self.merge(),
            86..=94 => self.drop_one(),
            _ => self.forget(),
        }
    }

    /// `admit` of a random request, negative and extreme ones included.
    fn admit(&mut self, was_closed: bool) {
        let c = self.counter();
        let shared = self.shared;
        let request = match self.rng.below(20) {
            0 => -(self.rng.below(3) as isize),
            1 => isize::MAX,
            2 => isize::MIN,
            _ => self.size().min(isize::MAX as usize) as isize,
        };
        self.stats.done[ADMIT] += 1;
        let got = c.admit(request);
        if got != 0 {
            assert_eq!(got as isize, request, "partial admission");
            shared.shadow_add(got);
            self.admitted(got, 0, was_closed);
            self.plain.push(got);
        } else if request > 0 && request as usize <= self.capacity && !was_closed {
            self.stats.refused_full += 1;
        }
    }

    /// Releases a plain count, or tries an over-release when none is held.
    fn release(&mut self) {
        let c = self.counter();
        let shared = self.shared;
        match self.plain.pop() {
            Some(n) => {
                self.stats.done[RELEASE] += 1;
                shared.shadow_sub(n);
                c.release(n).expect("released a count this task holds");
            }
            None => match c.release(usize::MAX) {
                Err(ReleaseError::ExceedsUsed { released, used }) => {
                    assert_eq!(released, usize::MAX);
                    assert!(used <= self.capacity);
                }
                Ok(()) => panic!("released usize::MAX slots"),
                Err(other) => panic!("an error this test does not know: {other:?}"),
            },
        }
    }

    /// Checks what a reservation of `n` with `headroom` returned: a guard of
    /// exactly `n`, counted in the shadow and kept, or a consistent refusal.
    fn reserved(
        &mut self,
        got: Result<Inner<'a>, ReserveError>,
        n: usize,
        headroom: usize,
        was_closed: bool,
    ) {
        match got {
            Ok(inner) => {
                assert_eq!(inner.len(), n, "guard length differs from the request");
                self.shared.shadow_add(n);
                self.admitted(n, headroom, was_closed);
                self.held.push(Held::new(inner, self.shared));
            }
            Err(e) => self.refused(e, n, headroom, was_closed),
        }
    }

    /// `try_reserve` of a random size.
    fn reserve(&mut self, was_closed: bool) {
        self.stats.done[RESERVE] += 1;
        let n = self.size();
        let got = self.counter().try_reserve(n).map(Inner::Borrowed);
        self.reserved(got, n, 0, was_closed);
    }

    /// `try_reserve_owned` of a random size.
    fn reserve_owned(&mut self, was_closed: bool) {
        self.stats.done[RESERVE_OWNED] += 1;
        let n = self.size();
        let got = self.shared.counter.try_reserve_owned(n).map(Inner::Owned);
        self.reserved(got, n, 0, was_closed);
    }

    /// `try_reserve_with_headroom` of a random size and headroom.
    fn reserve_with_headroom(&mut self, was_closed: bool) {
        self.stats.done[HEADROOM] += 1;
        let n = self.size();
        let headroom = match self.rng.below(10) {
            0 => usize::MAX,
            1 => self.capacity,
            _ => self.rng.below(self.capacity / 4 + 1),
        };
        let got = self
            .counter()
            .try_reserve_with_headroom(n, headroom)
            .map(Inner::Borrowed);
        self.reserved(got, n, headroom, was_closed);
    }

    /// `try_grow` of a held guard: by exactly `n` or not at all.
    fn grow(&mut self, was_closed: bool) {
        if let Some(i) = self.pick() {
            self.stats.done[GROW] += 1;
            let n = self.size();
            let before = self.held[i].len();
            match self.held[i].try_grow(n) {
                Ok(()) => {
                    assert_eq!(self.held[i].len(), before + n, "partial growth");
                    self.admitted(n, 0, was_closed);
                }
                Err(e) => {
                    assert_eq!(
                        self.held[i].len(),
                        before,
                        "refused growth changed the guard"
                    );
                    self.refused(e, n, 0, was_closed);
                }
            }
        }
    }

    /// `shrink_to` of a held guard, to any length (never grows it).
    fn shrink(&mut self) {
        if let Some(i) = self.pick() {
            let before = self.held[i].len();
            let len = self.rng.below(before + 2);
            self.stats.done[SHRINK] += 1;
            self.held[i].shrink_to(len);
            assert_eq!(self.held[i].len(), before.min(len));
        }
    }

    /// `split` of a held guard, sometimes by more than it holds.
    fn split(&mut self) {
        if let Some(i) = self.pick() {
            let before = self.held[i].len();
            let n = self.rng.below(before + 2);
            match self.held[i].split(n) {
                Some(part) => {
                    self.stats.done[SPLIT] += 1;
                    assert!(n <= before);
                    assert_eq!((self.held[i].len(), part.len()), (before - n, n));
                    self.held.push(part);
                }
                None => {
                    assert!(n > before);
                    assert_eq!(self.held[i].len(), before);
                }
            }
        }
    }

    /// `merge` of two held guards (of one kind only).
    fn merge(&mut self) {
        if self.held.len() >= 2 {
            let other = self.held.pop().expect("two guards held");
            let i = self.rng.below(self.held.len());
            let (a, b) = (self.held[i].len(), other.len());
            match self.held[i].merge(other) {
                Ok(()) => {
                    self.stats.done[MERGE] += 1;
                    assert_eq!(self.held[i].len(), a + b);
                }
                Err(other) => self.held.push(other),
            }
        }
    }

    /// Drops a held guard.
    fn drop_one(&mut self) {
        if let Some(i) = self.pick() {
            self.stats.done[DROP] += 1;
            drop(self.held.swap_remove(i));
        }
    }

    /// `forget` of a held guard, its count released now or later.
    fn forget(&mut self) {
        let c = self.counter();
        let shared = self.shared;
        if let Some(i) = self.pick() {
            let g = self.held.swap_remove(i);
            let len = g.len();
            let n = g.forget();
            assert_eq!(n, len);
            self.stats.done[FORGET] += 1;
            if self.rng.below(2) == 0 {
                self.plain.push(n);
            } else {
                shared.shadow_sub(n);
                c.release(n).expect("released a forgotten count");
            }
        }
    }

    /// Gives back the plain counts (guards give themselves back on drop).
    fn release_plain(&mut self) {
        for n in self.plain.drain(..) {
            self.shared.shadow_sub(n);
            self.shared
                .counter
                .release(n)
                .expect("released a count this task holds");
        }
    }

    /// Gives everything back and returns the tallies.
    fn finish(mut self) -> Stats {
        self.release_plain();
        self.held.clear();
        self.stats
    }
}

// ---------------------------------------------------------------------------
// The runs
// ---------------------------------------------------------------------------

struct Run {
    threads: usize,
    capacity: usize,
    tasks: usize,
    ops_per_task: usize,
    /// Task 0 closes the counter after this many of its operations.
    close_after: Option<usize>,
}

struct Outcome {
    stats: Stats,
    samples: u64,
    peak: usize,
}

fn run(cfg: &Run) -> Outcome {
    let shared = Shared::new(cfg.capacity, cfg.close_after.is_some());
    let totals = Totals::default();
    let pool = rayon_pool(cfg.threads);
    let ((), samples) = counter_observed(&shared, || {
        pool.install(|| {
            (0..cfg.tasks).into_par_iter().for_each(|task| {
                let seed = (cfg.capacity as u64) << 32 | task as u64;
                let mut w = Worker::new(&shared, seed);
                for i in 0..cfg.ops_per_task {
                    if task == 0 && cfg.close_after == Some(i) {
                        shared.counter.close();
                    }
                    w.step();
                }
                totals.add(w.finish());
            });
        });
    });
    let c = &shared.counter;
    assert_eq!(c.used(), 0, "slots leaked");
    assert_eq!(shared.shadow(), 0, "shadow count leaked");
    assert_eq!(c.available(), cfg.capacity);
    assert!(c.peak_used() <= cfg.capacity);
    assert!(samples > 0, "the observer took no sample");
    assert_eq!(Arc::strong_count(c), 1, "an owned guard outlived its task");
    Outcome {
        stats: totals.get(),
        samples,
        peak: c.peak_used(),
    }
}

/// Runs `ops_total` operations spread over `capacities`, and checks what
/// every run must show.
fn run_mix(threads: usize, capacities: &[usize], ops_total: usize) -> Stats {
    let tasks = threads * 8;
    let ops_per_task = ops_total.div_ceil(capacities.len() * tasks);
    let mut all = Stats::default();
    for &capacity in capacities {
        let out = run(&Run {
            threads,
            capacity,
            tasks,
            ops_per_task,
            close_after: None,
        });
        let s = out.stats;
        assert_eq!(s.ops, (tasks * ops_per_task) as u64);
        // The mix really contended: admissions and every kind of refusal
        // except Closed happened.
        assert!(
            s.admitted > 0 && s.refused_full > 0 && s.refused_never_fits > 0,
            "{s:?}"
        );
        assert_eq!(s.refused_closed, 0);
        assert!(out.peak > capacity / 2, "peak {} of {capacity}", out.peak);
        // At least the observer's last sample (one taken while the work
        // ran is up to the scheduler).
        assert!(out.samples >= 1);
        for (kind, &done) in KINDS.iter().zip(&s.done) {
            assert!(done > 0, "{kind} never happened at capacity {capacity}");
        }
        eprintln!(
            "capacity {capacity}: {s:?}, peak {}, samples {}",
            out.peak, out.samples
        );
        all.add(s);
    }
    assert!(all.ops >= ops_total as u64);
    all
}

#[test]
fn mixed_operations_keep_every_invariant() {
    let stats = run_mix(8, &[16, 37, 64], 3_000_000);
    assert!(stats.ops >= 3_000_000, "{stats:?}");
}

#[test]
#[ignore = "heavy: 20M operations on 16 threads; run with --ignored (preferably --release)"]
fn mixed_operations_keep_every_invariant_heavy() {
    let stats = run_mix(16, &[16, 24, 32, 48, 64], 20_000_000);
    assert!(stats.ops >= 20_000_000, "{stats:?}");
}

#[test]
fn closing_while_busy_refuses_admissions_and_drains() {
    for capacity in [16, 64] {
        let out = run(&Run {
            threads: 8,
            capacity,
            tasks: 32,
            ops_per_task: 2_000,
            close_after: Some(500),
        });
        // Task 0 closed after its 500th operation and then kept going, so
        // it alone met the closed counter at least once.
        assert!(out.stats.refused_closed > 0, "{:?}", out.stats);
        assert!(out.stats.admitted > 0);
    }
}

// ---------------------------------------------------------------------------
// Panics while holding guards
// ---------------------------------------------------------------------------

/// The payload of the injected panics, to tell them from real failures.
struct Injected;

/// Unwinds like a panic. Most use `resume_unwind`, which skips the panic
/// hook (keeping the test output readable); a few use a real `panic!`.
fn crash(task: usize) -> ! {
    if task % 16 == 0 {
        panic!("injected panic in task {task}");
    }
    resume_unwind(Box::new(Injected))
}

fn is_injected(payload: &(dyn std::any::Any + Send)) -> bool {
    payload.is::<Injected>()
        || payload
            .downcast_ref::<String>()
            .is_some_and(|s| s.starts_with("injected panic"))
}

#[test]
fn rayon_tasks_panicking_with_guards_leak_nothing() {
    for capacity in [16, 40] {
        let shared = Shared::new(capacity, false);
        let pool = rayon_pool(8);
        let tasks = 96;
        let panicked = AtomicUsize::new(0);
        let ((), samples) = counter_observed(&shared, || {
            pool.install(|| {
                (0..tasks).into_par_iter().for_each(|task| {
                    let result = catch_unwind(AssertUnwindSafe(|| {
                        let mut w = Worker::new(&shared, 1_000 + task as u64);
                        // Crash two tasks out of three, at a random step.
                        let crash_at = (task % 3 != 2).then(|| w.rng.below(400));
                        for i in 0..400 {
                            w.step();
                            if crash_at == Some(i) {
                                // Plain counts are not RAII; give them back
                                // and crash holding guards only.
                                w.release_plain();
                                let _keep = w.shared.counter.try_reserve_owned(1);
                                crash(task);
                            }
                        }
                        w.finish()
                    }));
                    if let Err(payload) = result {
                        assert!(is_injected(&*payload), "a real failure");
                        // Relaxed: a tally read after the pool is done.
                        panicked.fetch_add(1, Ordering::Relaxed);
                    }
                });
            });
        });
        // Relaxed: every task has completed (install returned).
        assert_eq!(panicked.load(Ordering::Relaxed), 64);
        assert!(samples > 0);
        assert_eq!(shared.counter.used(), 0, "a panicking task leaked slots");
        assert_eq!(shared.shadow(), 0);
        assert_eq!(Arc::strong_count(&shared.counter), 1);
        assert!(shared.counter.peak_used() <= capacity);
    }
}

#[test]
fn threads_panicking_with_guards_leak_nothing() {
    let shared = Shared::new(24, false);
    let threads = 8;
    let ((), samples) = counter_observed(&shared, || {
        thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let shared = &shared;
                    s.spawn(move || {
                        let mut w = Worker::new(shared, 7_000 + t as u64);
                        for _ in 0..2_000 {
                            w.step();
                        }
                        w.release_plain();
                        // Also hold guards of both kinds, grown and split.
                        let mut own = Held::new(
                            Inner::Owned(shared.counter.try_reserve_owned(0).unwrap()),
                            shared,
                        );
                        let _ = own.try_grow(1);
                        let _part = own.split(own.len() / 2);
                        if t % 2 == 0 {
                            crash(t + 1);
                        }
                        drop(own);
                        w.finish()
                    })
                })
                .collect();
            let mut crashed = 0;
            for h in handles {
                match h.join() {
                    Ok(stats) => assert_eq!(stats.ops, 2_000),
                    Err(payload) => {
                        assert!(is_injected(&*payload), "a real failure");
                        crashed += 1;
                    }
                }
            }
            assert_eq!(crashed, threads / 2);
        });
    });
    assert!(samples > 0);
    assert_eq!(shared.counter.used(), 0, "a panicking thread leaked slots");
    assert_eq!(shared.shadow(), 0);
    assert_eq!(Arc::strong_count(&shared.counter), 1);
}

// ---------------------------------------------------------------------------
// The oracle itself can fail
// ---------------------------------------------------------------------------

#[test]
#[should_panic(expected = "shadow 17 above capacity 16")]
fn shadow_catches_an_overcommit() {
    // If a wrong counter admitted more than its capacity, the workers'
    // shadow would say so.
    let shared = Shared::new(16, false);
    shared.shadow_add(16);
    shared.shadow_add(1);
}

#[test]
fn xorshift_is_deterministic_and_spread() {
    let (mut a, mut b) = (XorShift::new(3), XorShift::new(3));
    let xs: Vec<u64> = (0..64).map(|_| a.next()).collect();
    let ys: Vec<u64> = (0..64).map(|_| b.next()).collect();
    assert_eq!(xs, ys);
    let mut c = XorShift::new(4);
    assert_ne!(xs[0], c.next());
    // Every bucket of a small range is hit.
    let mut seen = [false; 10];
    for _ in 0..1_000 {
        seen[a.below(10)] = true;
    }
    assert!(seen.iter().all(|&s| s));
}

// ---------------------------------------------------------------------------
// BlockPool and Sequence: the observer
// ---------------------------------------------------------------------------

/// Runs `work` while a separate std thread samples the pool's invariants
/// (see [`run_observed`]); returns what `work` returned and how many
/// samples the observer took (at least one while `work` may run and one
/// after it ended).
fn pool_observed<R: Send>(pool: &BlockPool, work: impl FnOnce() -> R + Send) -> (R, u64) {
    let num_blocks = pool.num_blocks();
    let sample = || {
        let used = pool.used_blocks();
        assert!(used <= num_blocks, "used {used} > num_blocks {num_blocks}");
        let free = pool.free_blocks();
        assert!(free <= num_blocks, "free {free} > num_blocks {num_blocks}");
        assert!(pool.peak_used_blocks() <= num_blocks);
    };
    run_observed(sample, work)
}

// ---------------------------------------------------------------------------
// Pool 1. Alloc/free with an ownership array
// ---------------------------------------------------------------------------

/// One flag per block: `true` while some task owns it.
struct Ownership(Vec<AtomicBool>);

impl Ownership {
    fn new(n: usize) -> Self {
        Ownership((0..n).map(|_| AtomicBool::new(false)).collect())
    }

    /// Marks `id` as ours, after the allocation that handed it to us.
    fn take(&self, id: BlockId) {
        // SeqCst: the array is the test's oracle; the strongest ordering
        // adds no doubt of its own. Only the pool's Acquire allocation and
        // Release free order one owner's swap before the next one's.
        let was = self.0[id.index()].swap(true, Ordering::SeqCst);
        assert!(!was, "{id} handed out while another task owns it");
    }

    /// Marks `id` as no longer ours, before the free that gives it back.
    fn give_back(&self, id: BlockId) {
        // SeqCst: see `take`.
        let was = self.0[id.index()].swap(false, Ordering::SeqCst);
        assert!(was, "{id} given back by a task that did not own it");
    }

    fn owned(&self, id: BlockId) -> bool {
        // SeqCst: see `take`.
        self.0[id.index()].load(Ordering::SeqCst)
    }
}

/// Counts what the tasks did, so the test can check that every kind of
/// operation really happened.
#[derive(Default)]
struct Tally {
    allocs: AtomicU64,
    full: AtomicU64,
    never_fits: AtomicU64,
    frees: AtomicU64,
    bad_frees: AtomicU64,
}

impl Tally {
    fn bump(counter: &AtomicU64) {
        // Relaxed: a statistic, read after the rayon scope has joined.
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn get(counter: &AtomicU64) -> u64 {
        // Relaxed: read after every task has joined.
        counter.load(Ordering::Relaxed)
    }
}

/// One allocation of the ownership task, of a mixed size (mostly small,
/// sometimes too large): every id handed out is marked as owned and kept in
/// `held`; a refusal must leave `out` alone and be the right one.
fn alloc_owned(
    pool: &BlockPool,
    own: &Ownership,
    tally: &Tally,
    rng: &mut XorShift,
    held: &mut Vec<Vec<BlockId>>,
) {
    let n_blocks = pool.num_blocks();
    let n = match rng.below(20) {
        0 => usize::MAX,
        1 => n_blocks + 1 + rng.below(4),
        2 => n_blocks,
        _ => rng.below(n_blocks.min(6) + 1),
    };
    let mut out = vec![BlockId::new(u32::MAX)];
    match pool.try_alloc(n, &mut out) {
        Ok(()) => {
            assert_eq!(out.len(), 1 + n, "try_alloc({n}) appended a wrong count");
            assert_eq!(out[0], BlockId::new(u32::MAX));
            out.remove(0);
            for &id in &out {
                assert!(id.index() < n_blocks, "{id} out of range");
                own.take(id);
                assert_eq!(pool.ref_count(id), Some(1));
            }
            if !out.is_empty() {
                held.push(out);
            }
            Tally::bump(&tally.allocs);
        }
        Err(e) => {
            assert_eq!(out, [BlockId::new(u32::MAX)], "refused but `out` changed");
            match e {
                ReserveError::NeverFits {
                    requested,
                    capacity,
                } => {
                    assert_eq!((requested, capacity), (n, n_blocks));
                    assert!(n > n_blocks);
                    Tally::bump(&tally.never_fits);
                }
                ReserveError::Full {
                    requested,
                    available,
                } => {
                    assert_eq!(requested, n);
                    assert!(n <= n_blocks && available < n, "{e}");
                    Tally::bump(&tally.full);
                }
                ReserveError::BehindWaiters { .. } => panic!("nobody waits here: {e}"),
                ReserveError::Closed => panic!("the pool was never closed"),
                other => panic!("an error this test does not know: {other:?}"),
            }
        }
    }
}

/// One task of the ownership test: `ops` random operations.
fn ownership_task(pool: &BlockPool, own: &Ownership, tally: &Tally, seed: u64, ops: usize) {
    let n_blocks = pool.num_blocks();
    let mut rng = XorShift::new(seed);
    // The chunks this task holds, each from one successful allocation.
    let mut held: Vec<Vec<BlockId>> = Vec::new();
    for _ in 0..ops {
        match rng.below(10) {
            // Allocate a mixed size: mostly small, sometimes too large.
            0..=4 => alloc_owned(pool, own, tally, &mut rng, &mut held),
            // Free a whole chunk, or part of one.
            5..=7 => {
                if held.is_empty() {
                    continue;
                }
                let i = rng.below(held.len());
                let k = 1 + rng.below(held[i].len());
                let chunk: Vec<BlockId> = held[i].drain(..k).collect();
                if held[i].is_empty() {
                    held.swap_remove(i);
                }
                for &id in &chunk {
                    own.give_back(id);
                }
                pool.free(&chunk).expect("freeing owned blocks");
                Tally::bump(&tally.frees);
            }
            // A bad free listing owned ids first: refused, nothing changes.
            8 => {
                let Some(chunk) = held.last() else { continue };
                let mut list = chunk.clone();
                let expected = if rng.below(2) == 0 {
                    // Listed twice with one reference.
                    let dup = list[rng.below(list.len())];
                    list.push(dup);
                    FreeError::OverFreed { id: dup }
                } else {
                    let id = BlockId::new((n_blocks + rng.below(3)) as u32);
                    list.push(id);
                    FreeError::OutOfRange {
                        id,
                        num_blocks: n_blocks,
                    }
                };
                assert_eq!(pool.free(&list), Err(expected));
                for &id in chunk {
                    assert!(own.owned(id));
                    assert_eq!(pool.ref_count(id), Some(1), "a refused free dropped {id}");
                }
                Tally::bump(&tally.bad_frees);
            }
            // Free everything this task holds.
            _ => {
                let all: Vec<BlockId> = held.drain(..).flatten().collect();
                for &id in &all {
                    own.give_back(id);
                }
                pool.free(&all).expect("freeing owned blocks");
                Tally::bump(&tally.frees);
            }
        }
    }
    let all: Vec<BlockId> = held.into_iter().flatten().collect();
    for &id in &all {
        own.give_back(id);
    }
    pool.free(&all).expect("freeing owned blocks");
}

fn run_ownership(num_blocks: usize, shards: usize, threads: usize, tasks: u64, ops: usize) {
    let pool = BlockPool::with_shards(num_blocks, 16, shards);
    let own = Ownership::new(num_blocks);
    let tally = Tally::default();
    let workers = rayon_pool(threads);
    let ((), samples) = pool_observed(&pool, || {
        workers.install(|| {
            (0..tasks)
                .into_par_iter()
                .for_each(|seed| ownership_task(&pool, &own, &tally, seed, ops));
        })
    });
    eprintln!(
        "ownership, {num_blocks} blocks in {shards} shards: {} allocs, {} full, {} never fit, {} frees, \
         {} bad frees, {samples} observer samples, peak {}",
        Tally::get(&tally.allocs),
        Tally::get(&tally.full),
        Tally::get(&tally.never_fits),
        Tally::get(&tally.frees),
        Tally::get(&tally.bad_frees),
        pool.peak_used_blocks(),
    );
    assert!(samples > 0, "the observer took no sample");
    // Every kind of operation happened (the PRNG mix guarantees it at these
    // sizes).
    assert!(Tally::get(&tally.allocs) > 0);
    assert!(Tally::get(&tally.never_fits) > 0);
    assert!(Tally::get(&tally.frees) > 0);
    assert!(Tally::get(&tally.bad_frees) > 0);
    for i in 0..num_blocks {
        assert!(!own.owned(BlockId::new(i as u32)), "block {i} still owned");
    }
    assert!(pool.peak_used_blocks() <= num_blocks);
    assert_pool_whole(&pool);
}

#[test]
fn alloc_free_never_hands_an_id_to_two_owners() {
    for num_blocks in [8, 16, 64] {
        run_ownership(num_blocks, 1, 8, 64, 6_000);
    }
}

/// The same over sharded free lists: threads start their pops at different
/// shards, steal from the others when theirs runs short, and give every
/// block back to the shard that owns it (3 shards split 16 ids unevenly;
/// 16 shards over 8 ids leave half the shards without an id of their own).
#[test]
fn alloc_free_never_hands_an_id_to_two_owners_sharded() {
    for (num_blocks, shards) in [(16, 3), (64, 8), (8, 16)] {
        run_ownership(num_blocks, shards, 8, 64, 4_000);
    }
}

/// Large requests over sharded pools, with and without headroom: no home
/// shard can serve them alone, so allocations gather from every shard
/// while other tasks' gathers hold blocks in transit. Every allocation is
/// whole or nothing and hands out only blocks no one owns; every refusal
/// reports fewer than needed; once the tasks are done, the counts are
/// exact and a refusal reports exactly the free blocks.
#[test]
fn gathers_over_shards_stay_whole_and_exact_when_quiet() {
    for (num_blocks, shards) in [(12, 3), (64, 8), (8, 16)] {
        let pool = BlockPool::with_shards(num_blocks, 16, shards);
        let own = Ownership::new(num_blocks);
        let (gathered, refused) = (AtomicU64::new(0), AtomicU64::new(0));
        let workers = rayon_pool(8);
        let ((), samples) = pool_observed(&pool, || {
            workers.install(|| {
                (0..64u64).into_par_iter().for_each(|task| {
                    let mut rng = XorShift::new(0x6A7 + task);
                    let mut out = Vec::with_capacity(num_blocks);
                    for _ in 0..2_000 {
                        let n = 1 + rng.below(num_blocks);
                        let headroom = [0, 0, 1, num_blocks / 4][rng.below(4)];
                        out.clear();
                        match pool.try_alloc_with_headroom(n, headroom, &mut out) {
                            Ok(()) => {
                                assert_eq!(out.len(), n, "partial allocation");
                                for &id in &out {
                                    own.take(id);
                                }
                                for &id in &out {
                                    own.give_back(id);
                                }
                                pool.free(&out).expect("freeing owned blocks");
                                Tally::bump(&gathered);
                            }
                            Err(ReserveError::Full {
                                requested,
                                available,
                            }) => {
                                assert!(out.is_empty(), "refused but `out` changed");
                                assert_eq!(requested, n);
                                assert!(available < n + headroom && available <= num_blocks);
                                Tally::bump(&refused);
                            }
                            Err(e) => {
                                assert!(n + headroom > num_blocks, "{e}");
                            }
                        }
                    }
                });
            });
        });
        eprintln!(
            "gathers, {num_blocks} blocks in {shards} shards: {} allocated, {} refused, \
             {samples} observer samples",
            Tally::get(&gathered),
            Tally::get(&refused)
        );
        // Refusals for want of blocks come only from the threads' overlap,
        // which a scheduler may not give: not asserted.
        assert!(Tally::get(&gathered) > 0);
        // Quiet now: exact counts, and an exact refusal.
        assert_eq!(pool.free_blocks(), num_blocks);
        let mut held = Vec::new();
        pool.try_alloc(num_blocks - 1, &mut held).unwrap();
        assert_eq!(
            pool.try_alloc(2, &mut Vec::new()),
            Err(ReserveError::Full {
                requested: 2,
                available: 1
            })
        );
        pool.free(&held).unwrap();
        assert_pool_whole(&pool);
    }
}

#[test]
fn alloc_free_on_a_one_block_pool() {
    run_ownership(1, 1, 8, 32, 4_000);
}

#[test]
#[ignore = "heavy: run with --ignored (ideally --release)"]
fn alloc_free_never_hands_an_id_to_two_owners_heavy() {
    for num_blocks in [2, 8, 13, 32, 64] {
        run_ownership(num_blocks, 4, 16, 128, 20_000);
    }
}

// ---------------------------------------------------------------------------
// Pool 2. Sequences appending, truncating, forking and dropping
// ---------------------------------------------------------------------------

/// What every sequence task shares: the pool, a queue of forked children
/// handed to whichever task takes them next, and counts.
struct SeqShared {
    pool: Arc<BlockPool>,
    handoff: SegQueue<Sequence>,
    appends: AtomicU64,
    refused: AtomicU64,
    forks: AtomicU64,
    copies: AtomicU64,
}

/// Appends `n` to `seq` and checks whole-or-nothing and that every block
/// written into is held by this sequence alone. Returns whether the pool
/// was full (a scheduler would preempt something).
fn checked_append(seq: &mut Sequence, n: usize, shared: &SeqShared) -> bool {
    let bs = seq.pool().block_size();
    let num_blocks = seq.pool().num_blocks();
    let (len, blocks) = (seq.len(), seq.blocks().to_vec());
    match seq.try_append_cow(n) {
        Ok((range, copy)) => {
            assert_eq!(range, len..len + n, "append({n}) at {len}");
            assert_eq!(seq.len(), len + n, "append({n}) grew by a wrong count");
            assert_eq!(seq.blocks().len(), seq.len().div_ceil(bs));
            // The blocks before the tail are untouched.
            let kept = len / bs;
            assert_eq!(seq.blocks()[..kept], blocks[..kept]);
            // Nobody else can read what we are about to write.
            for p in range {
                let block = seq.blocks()[p / bs];
                assert_eq!(
                    seq.pool().ref_count(block),
                    Some(1),
                    "writing position {p} into shared {block}"
                );
            }
            if let Some(copy) = copy {
                assert_eq!(copy.tokens, len % bs);
                assert_eq!(copy.src, blocks[kept]);
                assert_eq!(copy.dst, seq.blocks()[kept]);
                Tally::bump(&shared.copies);
            }
            Tally::bump(&shared.appends);
            false
        }
        Err(e) => {
            assert_eq!(seq.len(), len, "a refused append changed the length");
            assert_eq!(
                seq.blocks(),
                &blocks[..],
                "a refused append changed the table"
            );
            match e {
                // What a sequence could ever be given: the pool less the
                // blocks it holds (its table, and a copy-on-write source it
                // may keep).
                ReserveError::NeverFits {
                    requested,
                    capacity,
                } => assert!(
                    requested > capacity
                        && capacity <= num_blocks - blocks.len()
                        && capacity + 1 >= num_blocks - blocks.len(),
                    "{e}"
                ),
                ReserveError::Full {
                    requested,
                    available,
                } => assert!(requested <= num_blocks && available < requested, "{e}"),
                ReserveError::BehindWaiters { .. } => panic!("nobody waits here: {e}"),
                ReserveError::Closed => panic!("the pool was never closed"),
                other => panic!("an error this test does not know: {other:?}"),
            }
            Tally::bump(&shared.refused);
            e.is_retryable()
        }
    }
}

/// One task: `ops` random operations on its own sequences and on children
/// other tasks forked.
fn sequence_task(shared: &SeqShared, seed: u64, ops: usize) {
    let pool = &shared.pool;
    let bs = pool.block_size();
    let capacity_tokens = pool.num_blocks() * bs;
    let mut rng = XorShift::new(seed);
    let mut seqs: Vec<Sequence> = Vec::new();
    for _ in 0..ops {
        if seqs.is_empty() {
            seqs.push(
                shared
                    .handoff
                    .pop()
                    .unwrap_or_else(|| Sequence::new(Arc::clone(pool))),
            );
        }
        let i = rng.below(seqs.len());
        match rng.below(16) {
            // Appends: decode steps, draft batches, prefill chunks, and
            // sizes that never fit.
            0..=6 => {
                let n = match rng.below(24) {
                    0 => usize::MAX,
                    1 => capacity_tokens + 1 + rng.below(bs),
                    2 => bs * (2 + rng.below(4)),
                    _ => 1 + rng.below(bs + 2),
                };
                let full = checked_append(&mut seqs[i], n, shared);
                // Preempt another sequence (it may share blocks with
                // sequences on other threads) half of the time.
                if full && seqs.len() > 1 && rng.below(2) == 0 {
                    let j = (i + 1 + rng.below(seqs.len() - 1)) % seqs.len();
                    drop(seqs.swap_remove(j));
                }
            }
            // Roll back (rejected drafts, preemption).
            7..=9 => {
                let seq = &mut seqs[i];
                let (len, blocks) = (seq.len(), seq.blocks().len());
                let to = if rng.below(4) == 0 {
                    0
                } else {
                    len.saturating_sub(rng.below(2 * bs + 1))
                };
                let given = seq.truncate(to);
                assert_eq!(seq.len(), to.min(len));
                assert_eq!(seq.blocks().len(), seq.len().div_ceil(bs));
                assert_eq!(given, blocks - seq.blocks().len());
            }
            // Fork; keep the child or hand it to another task.
            10..=12 => {
                let parent = &seqs[i];
                let (len, blocks) = (parent.len(), parent.blocks().to_vec());
                match parent.try_fork() {
                    Ok((child, copy)) => {
                        assert_eq!(child.len(), len);
                        assert_eq!(parent.blocks(), &blocks[..], "a fork changed the parent");
                        let full = len / bs;
                        assert_eq!(child.blocks()[..full], blocks[..full]);
                        assert_eq!(child.blocks().len(), blocks.len());
                        assert_eq!(copy.is_some(), len % bs != 0);
                        if let Some(copy) = copy {
                            assert_eq!(copy.src, blocks[full]);
                            assert_eq!(copy.dst, child.blocks()[full]);
                            assert_eq!(copy.tokens, len % bs);
                            assert!(!blocks.contains(&copy.dst));
                        }
                        Tally::bump(&shared.forks);
                        if rng.below(2) == 0 && seqs.len() < 4 {
                            seqs.push(child);
                        } else if shared.handoff.len() < 8 {
                            shared.handoff.push(child);
                        } else {
                            // Beam search pruning a candidate right away.
                            drop(child);
                        }
                    }
                    Err(e) => {
                        match e {
                            ReserveError::Full { .. } => {}
                            // The parent holds every block of the pool: a
                            // private tail beside them can never come.
                            ReserveError::NeverFits {
                                requested: 1,
                                capacity: 0,
                            } => assert_eq!(blocks.len(), pool.num_blocks(), "{e}"),
                            _ => panic!("a fork refused with {e}"),
                        }
                        assert_eq!(parent.blocks(), &blocks[..]);
                        assert_eq!(parent.len(), len);
                    }
                }
            }
            // Drop a sequence (possibly sharing blocks with another thread's).
            13 | 14 => drop(seqs.swap_remove(i)),
            // Adopt a child some other task forked.
            _ => {
                if let Some(seq) = shared.handoff.pop() {
                    if seqs.len() < 4 {
                        seqs.push(seq);
                    } else {
                        // Dropped on another thread than its parent's.
                        drop(seq);
                    }
                }
            }
        }
    }
}

fn run_sequences(
    (num_blocks, shards): (usize, usize),
    block_size: usize,
    threads: usize,
    tasks: u64,
    ops: usize,
) {
    let shared = SeqShared {
        pool: Arc::new(BlockPool::with_shards(num_blocks, block_size, shards)),
        handoff: SegQueue::new(),
        appends: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        forks: AtomicU64::new(0),
        copies: AtomicU64::new(0),
    };
    let workers = rayon_pool(threads);
    let ((), samples) = pool_observed(&shared.pool, || {
        workers.install(|| {
            (0..tasks)
                .into_par_iter()
                .for_each(|seed| sequence_task(&shared, seed, ops));
        })
    });
    eprintln!(
        "sequences, {num_blocks} blocks of {block_size} in {shards} shards: {} appends, {} refused, {} forks, \
         {} copies-on-write, {samples} observer samples, peak {}",
        Tally::get(&shared.appends),
        Tally::get(&shared.refused),
        Tally::get(&shared.forks),
        Tally::get(&shared.copies),
        shared.pool.peak_used_blocks(),
    );
    assert!(samples > 0, "the observer took no sample");
    assert!(Tally::get(&shared.appends) > 0);
    assert!(Tally::get(&shared.refused) > 0);
    assert!(Tally::get(&shared.forks) > 0);
    // Children nobody adopted still hold references until dropped.
    while let Some(seq) = shared.handoff.pop() {
        drop(seq);
    }
    assert_eq!(Arc::strong_count(&shared.pool), 1, "a sequence leaked");
    assert_pool_whole(&shared.pool);
}

#[test]
fn sequences_append_truncate_fork_and_drop_concurrently() {
    run_sequences((32, 1), 4, 8, 64, 6_000);
    run_sequences((12, 1), 1, 8, 32, 3_000);
    run_sequences((48, 1), 16, 8, 32, 3_000);
}

/// The same over sharded free lists (forks, copies-on-write and drops free
/// chains whose blocks belong to several shards).
#[test]
fn sequences_append_truncate_fork_and_drop_concurrently_sharded() {
    run_sequences((32, 4), 4, 8, 48, 4_000);
    run_sequences((48, 5), 16, 8, 32, 3_000);
}

#[test]
#[ignore = "heavy: run with --ignored (ideally --release)"]
fn sequences_append_truncate_fork_and_drop_concurrently_heavy() {
    for (num_blocks, bs) in [(8, 2), (32, 4), (64, 16), (16, 1)] {
        for shards in [1, 4] {
            run_sequences((num_blocks, shards), bs, 16, 128, 20_000);
        }
    }
}

// ---------------------------------------------------------------------------
// Pool 3. A refused free racing a legitimate free of a shared block
// ---------------------------------------------------------------------------

/// A parent of `blocks` full blocks and a child forked on the boundary share
/// every block (two references each). One thread frees the parent's blocks
/// followed by a never-allocated id (refused: nothing may change) while
/// another drops the child at the same time. Afterwards the parent must
/// still hold one reference to each block and the pool must count them as
/// used: the refused free may not turn the child's drop into a "last" drop
/// that returns the parent's blocks to the free list.
fn race_refused_free_with_legit_free(blocks: usize, rounds: usize) {
    let pool = Arc::new(BlockPool::new(blocks + 1, 1));
    for round in 0..rounds {
        let mut parent = Sequence::new(Arc::clone(&pool));
        parent.try_append(blocks).unwrap();
        let (child, copy) = parent.try_fork().unwrap();
        assert_eq!(copy, None);
        let unallocated = (0..=blocks as u32)
            .map(BlockId::new)
            .find(|&id| pool.ref_count(id) == Some(0))
            .unwrap();
        let mut bad = parent.blocks().to_vec();
        bad.push(unallocated);
        let start = Barrier::new(2);
        let refused = thread::scope(|s| {
            let dropper = s.spawn(|| {
                start.wait();
                drop(child);
            });
            start.wait();
            let refused = pool.free(&bad);
            dropper.join().unwrap();
            refused
        });
        let used = pool.used_blocks();
        let wrong: Vec<BlockId> = parent
            .blocks()
            .iter()
            .copied()
            .filter(|&id| pool.ref_count(id) != Some(1))
            .collect();
        if refused != Err(FreeError::NotAllocated { id: unallocated })
            || used != blocks
            || !wrong.is_empty()
        {
            // The pool is corrupt; dropping the parent would free its blocks
            // a second time (and panic while unwinding).
            std::mem::forget(parent);
            panic!(
                "round {round}: the refused free returned {refused:?} and changed the pool: \
                 used_blocks {used} (expected {blocks}: the parent still holds them all), \
                 free_blocks {} (expected 1), {} of the parent's blocks without exactly one \
                 reference",
                pool.free_blocks(),
                wrong.len()
            );
        }
        drop(parent);
        assert_eq!(pool.free_blocks(), blocks + 1);
    }
}

#[test]
fn a_refused_free_racing_a_legit_free_of_a_shared_block_changes_nothing() {
    race_refused_free_with_legit_free(2048, 200);
}

// ---------------------------------------------------------------------------
// The free list's takes
// ---------------------------------------------------------------------------

/// Rounds of the free-list storm per thread.
const STORM_ROUNDS: usize = 50_000;
/// More threads than most CI machines have cores, so that threads are
/// preempted in the middle of their pops and pushes.
const STORM_THREADS: usize = 16;
/// Blocks in the storm's pool, and the most one take asks for.
const STORM_BLOCKS: usize = 16;
const STORM_MAX_TAKE: usize = 4;

#[test]
fn a_storm_of_takes_and_single_frees_never_hands_a_block_out_twice() {
    // The free list's shape: while one thread has read a bitmap word,
    // others take some of its blocks and give some back. A take that
    // stored its result over theirs (no compare-and-swap) would hand out a
    // block that is held (caught here, or by the pool's own debug
    // assertion), or lose blocks from the list (the storm then never ends:
    // a take of blocks that were admitted but are missing from the list
    // spins). Small takes of 1 to 4 blocks, each given back one at a time,
    // keep the same few ids (the lowest) coming back.
    let pool = BlockPool::new(STORM_BLOCKS, 1);
    let owned: Vec<AtomicBool> = (0..STORM_BLOCKS).map(|_| AtomicBool::new(false)).collect();
    let barrier = Barrier::new(STORM_THREADS);
    thread::scope(|s| {
        for t in 0..STORM_THREADS {
            let (pool, owned, barrier) = (&pool, &owned, &barrier);
            s.spawn(move || {
                let mut ids = Vec::with_capacity(STORM_MAX_TAKE);
                barrier.wait();
                for round in 0..STORM_ROUNDS {
                    let k = 1 + (round + t) % STORM_MAX_TAKE;
                    if pool.try_alloc(k, &mut ids).is_err() {
                        continue;
                    }
                    for id in &ids {
                        // Relaxed (test code): only the swap's atomicity
                        // matters.
                        assert!(
                            !owned[id.index()].swap(true, Ordering::Relaxed),
                            "{id} handed out twice"
                        );
                    }
                    while let Some(id) = ids.pop() {
                        // Relaxed: as above; cleared before the block can be
                        // taken again.
                        assert!(owned[id.index()].swap(false, Ordering::Relaxed));
                        pool.free(&[id]).unwrap();
                    }
                }
            });
        }
    });
    assert_pool_whole(&pool);
}
