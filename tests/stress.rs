//! Rayon stress tests: many threads drive mixed operations on one small
//! `SlotCounter` while a separate observer thread samples the invariant.
//!
//! What is checked, throughout and at the end:
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

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use kvslots::{OwnedReservation, ReleaseError, Reservation, ReserveError, SlotCounter};
use rayon::prelude::*;

mod common;
use common::{rayon_pool, run_observed, XorShift};

// ---------------------------------------------------------------------------
// Shared state and the observer
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
fn observed<R: Send>(shared: &Shared, work: impl FnOnce() -> R + Send) -> (R, u64) {
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
        match self.inner.as_ref().expect("guard already taken") {
            Inner::Borrowed(r) => r.len(),
            Inner::Owned(r) => r.len(),
        }
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
        let shared = self.shared;
        if self.held.len() > MAX_HELD {
            // Too many guards: give one back.
            let i = self.rng.below(self.held.len());
            drop(self.held.swap_remove(i));
            return;
        }
        // Seen closed before the operation: then it must be refused.
        let was_closed = c.is_closed();
        match self.rng.below(100) {
            // admit
            0..=11 => {
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
            // release a plain count (or try an over-release)
            12..=19 => match self.plain.pop() {
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
                },
            },
            // try_reserve
            20..=33 => {
                self.stats.done[RESERVE] += 1;
                let n = self.size();
                match c.try_reserve(n) {
                    Ok(r) => {
                        assert_eq!(r.len(), n, "guard length differs from the request");
                        shared.shadow_add(n);
                        self.admitted(n, 0, was_closed);
                        self.held.push(Held::new(Inner::Borrowed(r), shared));
                    }
                    Err(e) => self.refused(e, n, 0, was_closed),
                }
            }
            // try_reserve_owned
            34..=41 => {
                self.stats.done[RESERVE_OWNED] += 1;
                let n = self.size();
                match shared.counter.try_reserve_owned(n) {
                    Ok(r) => {
                        assert_eq!(r.len(), n, "guard length differs from the request");
                        shared.shadow_add(n);
                        self.admitted(n, 0, was_closed);
                        self.held.push(Held::new(Inner::Owned(r), shared));
                    }
                    Err(e) => self.refused(e, n, 0, was_closed),
                }
            }
            // try_reserve_with_headroom
            42..=51 => {
                self.stats.done[HEADROOM] += 1;
                let n = self.size();
                let headroom = match self.rng.below(10) {
                    0 => usize::MAX,
                    1 => self.capacity,
                    _ => self.rng.below(self.capacity / 4 + 1),
                };
                match c.try_reserve_with_headroom(n, headroom) {
                    Ok(r) => {
                        assert_eq!(r.len(), n, "guard length differs from the request");
                        shared.shadow_add(n);
                        self.admitted(n, headroom, was_closed);
                        self.held.push(Held::new(Inner::Borrowed(r), shared));
                    }
                    Err(e) => self.refused(e, n, headroom, was_closed),
                }
            }
            // try_grow
            52..=61 => {
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
            // shrink_to
            62..=70 => {
                if let Some(i) = self.pick() {
                    let before = self.held[i].len();
                    let len = self.rng.below(before + 2);
                    self.stats.done[SHRINK] += 1;
                    self.held[i].shrink_to(len);
                    assert_eq!(self.held[i].len(), before.min(len));
                }
            }
            // split
            71..=78 => {
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
            // merge
            79..=85 => {
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
            // drop
            86..=94 => {
                if let Some(i) = self.pick() {
                    self.stats.done[DROP] += 1;
                    drop(self.held.swap_remove(i));
                }
            }
            // forget, then release now or later
            _ => {
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
    let ((), samples) = observed(&shared, || {
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
        assert!(out.samples > 1);
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
        let ((), samples) = observed(&shared, || {
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
    let ((), samples) = observed(&shared, || {
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
