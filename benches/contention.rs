//! Contention benchmark: [`SlotCounter`] against the obvious peers.
//!
//! Every benchmark here times one *operation* = take a small request of
//! slots (1..=4 tokens, varying) from a shared counter and give it back,
//! run by 1, 2, 4 or 8 threads at once on the same counter. The peers:
//!
//! | id | take | give back |
//! |---|---|---|
//! | `kvslots_try_reserve_drop` | [`SlotCounter::try_reserve`] | drop of the guard |
//! | `kvslots_admit_release` | [`SlotCounter::admit`] | [`SlotCounter::release`] |
//! | `std_mutex` | lock a `std::sync::Mutex<usize>`, check it fits, add | lock, subtract |
//! | `parking_lot_mutex` | the same on a `parking_lot::Mutex<usize>` | the same |
//! | `tokio_semaphore` | `Semaphore::try_acquire_many` | drop of the permit |
//! | `fetch_add_sub` | `fetch_add` on one `CachePadded<AtomicUsize>` | `fetch_sub` |
//!
//! `fetch_add_sub` checks nothing and can overcommit: it is not an
//! allocator, only the ceiling of what any single shared counter can do
//! (one locked read-modify-write to take, one to give back).
//!
//! # Timing
//!
//! Inside `iter_custom`, the threads are spawned (untimed), then they meet
//! at a [`Barrier`]; each worker runs its share of the `iters` operations
//! and meets the others at a second barrier. The measured time is from the
//! first worker leaving the first barrier to the last worker reaching the
//! second, so it covers the slowest worker, and criterion's time per
//! iteration is the wall time per operation of all threads together (its
//! `Throughput::Elements(1)` turns that into aggregate operations per
//! second).
//!
//! # Groups
//!
//! * `cap_1M`: capacity `1 << 20`, so refusals never happen and the numbers
//!   measure only the cost of the shared word under contention.
//! * `cap_64_refusing`: capacity 64, requests of 1..=16, and every worker
//!   keeps its last 3 admitted requests (each operation takes a new one,
//!   then gives back the oldest), so the workers together hold about the
//!   whole capacity and refusals are common (more of them with more
//!   threads). This measures the refusal path as well as the admission
//!   path.
//!
//! `KVSLOTS_BENCH_THREADS=1,2,4,8,16` runs both groups at those thread
//! counts instead (`scripts/bench-threads`).
//!
//! The ratios in `BENCHMARKS.md` are taken between rows of the same run,
//! on 2 threads: `kvslots_try_reserve_drop` against `fetch_add_sub` and
//! against `std_mutex`. Run e.g. `cargo bench --bench contention -- '/2$'`.
//!
//! Rows whose id starts with `proto_` (in `cap_1M`) are prototypes of
//! alternative admission loops, written here only to measure them; the
//! library does not use them:
//!
//! * `proto_cas_no_backoff`: the library's loop retrying a failed CAS at
//!   once (a plain CAS loop);
//! * `proto_cas_backoff_from_8`: the library's loop waiting 8 spins after
//!   the first failed CAS instead of the library's 4, doubling up to 64;
//! * `proto_fetch_add_undo`: one `fetch_add`, undone when it overshot. Not
//!   a valid admission (see [`ProtoFetchUndo`]); it shows what the load
//!   before the CAS costs.

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use crossbeam_utils::CachePadded;
use kvslots::SlotCounter;
use tokio::sync::Semaphore;

mod support;

use support::threads::bench_threads;
use support::{Lock, MutexCounter, PlMutexCounter, StdMutexCounter};

/// Thread counts of the `cap_1M` group (unless `KVSLOTS_BENCH_THREADS`
/// says otherwise).
const THREADS: [usize; 4] = [1, 2, 4, 8];

/// Thread counts of the `cap_64_refusing` group (unless
/// `KVSLOTS_BENCH_THREADS` says otherwise).
const REFUSING_THREADS: [usize; 2] = [2, 8];

/// How many admitted requests each worker of the refusing group keeps.
const HOLD: usize = 3;

/// What a worker keeps between operations: its last [`HOLD`] admissions
/// (always empty outside the refusing group).
type Window<'a, S> = [Option<<S as Slots>::Held<'a>>; HOLD];

/// A shared counter of slots that workers take requests from and give back.
///
/// `Held` is what a worker keeps between taking and giving back: a guard
/// for the RAII peers, a count for the others.
trait Slots: Sync {
    type Held<'a>
    where
        Self: 'a;

    /// Takes `n` slots, all or nothing; `None` if refused.
    fn take(&self, n: usize) -> Option<Self::Held<'_>>;

    /// Gives back what [`take`](Slots::take) returned.
    fn give<'a>(&'a self, held: Self::Held<'a>);
}

/// [`SlotCounter::try_reserve`] and the guard's drop.
struct KvReserve(SlotCounter);

impl Slots for KvReserve {
    type Held<'a> = kvslots::Reservation<'a>;

    #[inline]
    fn take(&self, n: usize) -> Option<Self::Held<'_>> {
        self.0.try_reserve(n).ok()
    }

    #[inline]
    fn give<'a>(&'a self, held: Self::Held<'a>) {
        drop(held);
    }
}

/// [`SlotCounter::admit`] and [`SlotCounter::release`].
struct KvAdmit(SlotCounter);

impl Slots for KvAdmit {
    type Held<'a> = usize;

    #[inline]
    fn take(&self, n: usize) -> Option<usize> {
        match self.0.admit(n as isize) {
            0 => None,
            got => Some(got),
        }
    }

    #[inline]
    fn give(&self, held: usize) {
        self.0.release(held).expect("released what admit returned");
    }
}

/// The shared mutex-guarded count (`support`): lock, check it fits, add;
/// to give back, lock and subtract.
impl<L: Lock<usize>> Slots for MutexCounter<L> {
    type Held<'a>
        = usize
    where
        L: 'a;

    #[inline]
    fn take(&self, n: usize) -> Option<usize> {
        MutexCounter::take(self, n).then_some(n)
    }

    #[inline]
    fn give(&self, held: usize) {
        MutexCounter::give(self, held)
    }
}

/// `tokio::sync::Semaphore::try_acquire_many` and the permit's drop.
struct TokioSem(Semaphore);

impl Slots for TokioSem {
    type Held<'a> = tokio::sync::SemaphorePermit<'a>;

    #[inline]
    fn take(&self, n: usize) -> Option<Self::Held<'_>> {
        self.0.try_acquire_many(n as u32).ok()
    }

    #[inline]
    fn give<'a>(&'a self, held: Self::Held<'a>) {
        drop(held);
    }
}

/// A bare `fetch_add`/`fetch_sub` pair on one padded word: no check, so not
/// an allocator, only the ceiling of a single shared counter.
struct FetchPair(CachePadded<AtomicUsize>);

impl Slots for FetchPair {
    type Held<'a> = usize;

    #[inline]
    fn take(&self, n: usize) -> Option<usize> {
        // Acquire: as the counter's admission, pairs with the Release below
        // of whoever gave slots back.
        black_box(self.0.fetch_add(n, Ordering::Acquire));
        Some(n)
    }

    #[inline]
    fn give(&self, held: usize) {
        // Release: as the counter's guard drop, publishes the holder's
        // writes to the next taker (its Acquire).
        self.0.fetch_sub(held, Ordering::Release);
    }
}

/// The most spins one backoff step waits, as in `crossbeam_utils::Backoff`.
const SPIN_CAP: u32 = 64;

/// A prototype of the library's admission loop with another backoff
/// schedule, on the same state word (`used << 1 | CLOSED`, padded) and with
/// the same peak tracking; it gives back with one `fetch_sub`, as the
/// guard's drop does.
///
/// After each failed CAS it spins `FIRST_SPINS` times, doubling up to
/// [`SPIN_CAP`]; `FIRST_SPINS == 0` retries at once (a plain CAS loop). The
/// library's own `sync::Backoff` waits 4 spins first (crossbeam's waits 1).
struct ProtoCas<const FIRST_SPINS: u32> {
    state: CachePadded<AtomicUsize>,
    peak: CachePadded<AtomicUsize>,
    capacity: usize,
}

impl<const FIRST_SPINS: u32> ProtoCas<FIRST_SPINS> {
    fn new(capacity: usize) -> Self {
        ProtoCas {
            state: CachePadded::new(AtomicUsize::new(0)),
            peak: CachePadded::new(AtomicUsize::new(0)),
            capacity,
        }
    }
}

impl<const FIRST_SPINS: u32> Slots for ProtoCas<FIRST_SPINS> {
    type Held<'a> = usize;

    #[inline]
    fn take(&self, n: usize) -> Option<usize> {
        if n > self.capacity {
            return None;
        }
        let mut spins = FIRST_SPINS;
        // Relaxed: a first guess, validated by the CAS.
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            if cur & 1 != 0 || n > self.capacity - (cur >> 1) {
                return None;
            }
            let next = cur + (n << 1);
            // Acquire on success: pairs with the Release of whoever gave
            // slots back. Relaxed on failure: only a retry with the fresh
            // value.
            match self
                .state
                .compare_exchange_weak(cur, next, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => {
                    // Relaxed (both): a statistic, orders nothing.
                    if next >> 1 > self.peak.load(Ordering::Relaxed) {
                        self.peak.fetch_max(next >> 1, Ordering::Relaxed);
                    }
                    return Some(n);
                }
                Err(actual) => {
                    cur = actual;
                    for _ in 0..spins {
                        std::hint::spin_loop();
                    }
                    spins = (spins * 2).min(SPIN_CAP);
                }
            }
        }
    }

    #[inline]
    fn give(&self, held: usize) {
        // Release: publishes the holder's writes to the next taker.
        self.state.fetch_sub(held << 1, Ordering::Release);
    }
}

/// A prototype that takes with `fetch_add` first and undoes it with
/// `fetch_sub` if that overshot the capacity. One RMW on success, but NOT a
/// valid admission: `used` transiently exceeds the capacity, and a request
/// that fits can be refused because of another's overshoot. Measured only
/// to show what a single-RMW admission would gain.
struct ProtoFetchUndo {
    state: CachePadded<AtomicUsize>,
    capacity: usize,
}

impl Slots for ProtoFetchUndo {
    type Held<'a> = usize;

    #[inline]
    fn take(&self, n: usize) -> Option<usize> {
        // Acquire: pairs with the Release of whoever gave slots back.
        let prev = self.state.fetch_add(n, Ordering::Acquire);
        if prev + n <= self.capacity {
            Some(n)
        } else {
            // Relaxed: undoing our own overshoot hands nothing over.
            self.state.fetch_sub(n, Ordering::Relaxed);
            None
        }
    }

    #[inline]
    fn give(&self, held: usize) {
        // Release: publishes the holder's writes to the next taker.
        self.state.fetch_sub(held, Ordering::Release);
    }
}

/// Runs `iters` operations of `op` spread over `threads` workers that share
/// `slots`, and returns the time from when the first worker left the start
/// barrier to when the last one finished its share.
///
/// The workers take the timestamps themselves: the spawning thread only
/// joins them, so it neither competes for a core during the run nor, woken
/// late by the scheduler, starts the clock after the work has begun (which
/// on a 2-core machine under-measures badly). The end barrier keeps the
/// untimed clean-up of one worker off the timed run of the others.
///
/// `op(slots, worker, i, held)` is one operation; `held` is the worker's
/// own carry-over between operations (used by the refusing group).
fn run_threads<S, F>(slots: &S, threads: usize, iters: u64, op: F) -> Duration
where
    S: Slots,
    F: for<'a> Fn(&'a S, usize, u64, &mut Window<'a, S>) + Sync,
{
    let start = Barrier::new(threads);
    let end = Barrier::new(threads);
    let per = iters / threads as u64;
    let extra = iters % threads as u64;
    let spans: Vec<(Instant, Instant)> = thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|worker| {
                let (start, end, op) = (&start, &end, &op);
                let mine = per + u64::from((worker as u64) < extra);
                s.spawn(move || {
                    let mut held: Window<'_, S> = Default::default();
                    start.wait();
                    let t0 = Instant::now();
                    for i in 0..mine {
                        op(slots, worker, i, &mut held);
                    }
                    let t1 = Instant::now();
                    end.wait();
                    // Untimed: give back what the refusing group still holds.
                    for h in held.iter_mut().filter_map(Option::take) {
                        slots.give(h);
                    }
                    (t0, t1)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("benchmark worker panicked"))
            .collect()
    });
    let first = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("at least one worker");
    let last = spans
        .iter()
        .map(|s| s.1)
        .max()
        .expect("at least one worker");
    last - first
}

/// A small request size, 1..=4 tokens, varying with the worker and step so
/// that the workers do not move in lockstep.
#[inline]
fn small(worker: usize, i: u64) -> usize {
    ((i as usize).wrapping_add(worker) & 3) + 1
}

/// One operation of the `cap_1M` group: take a small request, give it back.
#[inline]
fn take_give<'a, S: Slots>(slots: &'a S, worker: usize, i: u64, _: &mut Window<'a, S>) {
    if let Some(h) = slots.take(black_box(small(worker, i))) {
        slots.give(h);
    }
}

/// One operation of the `cap_64_refusing` group: take a request of 1..=16,
/// then give back the one taken [`HOLD`] operations before, so that each
/// worker keeps its last `HOLD` admitted requests.
#[inline]
fn take_then_give_oldest<'a, S: Slots>(
    slots: &'a S,
    worker: usize,
    i: u64,
    held: &mut Window<'a, S>,
) {
    let n = ((i as usize).wrapping_mul(7).wrapping_add(worker * 5) & 15) + 1;
    let new = slots.take(black_box(n));
    let slot = &mut held[i as usize % HOLD];
    if let Some(old) = slot.take() {
        slots.give(old);
    }
    *slot = new;
}

/// Benchmarks one peer at every thread count in `group`.
fn bench_peer<S, F>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    thread_counts: &[usize],
    make: impl Fn() -> S,
    op: F,
) where
    S: Slots,
    F: for<'a> Fn(&'a S, usize, u64, &mut Window<'a, S>) + Sync + Copy,
{
    for &threads in thread_counts {
        group.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &t| {
            b.iter_custom(|iters| {
                let slots = make();
                run_threads(&slots, t, iters, op)
            });
        });
    }
}

/// Benchmarks every peer in `group` with capacity `cap` and operation `op`.
macro_rules! all_peers {
    ($group:expr, $threads:expr, $cap:expr, $op:ident) => {{
        let cap: usize = $cap;
        let threads: &[usize] = $threads;
        bench_peer(
            $group,
            "kvslots_try_reserve_drop",
            threads,
            || KvReserve(SlotCounter::new(cap)),
            $op::<KvReserve>,
        );
        bench_peer(
            $group,
            "kvslots_admit_release",
            threads,
            || KvAdmit(SlotCounter::new(cap)),
            $op::<KvAdmit>,
        );
        bench_peer(
            $group,
            "std_mutex",
            threads,
            || StdMutexCounter::new(cap),
            $op::<StdMutexCounter>,
        );
        bench_peer(
            $group,
            "parking_lot_mutex",
            threads,
            || PlMutexCounter::new(cap),
            $op::<PlMutexCounter>,
        );
        bench_peer(
            $group,
            "tokio_semaphore",
            threads,
            || TokioSem(Semaphore::new(cap)),
            $op::<TokioSem>,
        );
    }};
}

fn contention(c: &mut Criterion) {
    let threads = bench_threads(&THREADS);
    let mut group = c.benchmark_group("cap_1M");
    group.throughput(Throughput::Elements(1));
    all_peers!(&mut group, &threads, 1 << 20, take_give);
    bench_peer(
        &mut group,
        "fetch_add_sub",
        &threads,
        || FetchPair(CachePadded::new(AtomicUsize::new(0))),
        take_give::<FetchPair>,
    );
    bench_peer(
        &mut group,
        "proto_cas_no_backoff",
        &threads,
        || ProtoCas::<0>::new(1 << 20),
        take_give::<ProtoCas<0>>,
    );
    bench_peer(
        &mut group,
        "proto_cas_backoff_from_8",
        &threads,
        || ProtoCas::<8>::new(1 << 20),
        take_give::<ProtoCas<8>>,
    );
    bench_peer(
        &mut group,
        "proto_fetch_add_undo",
        &threads,
        || ProtoFetchUndo {
            state: CachePadded::new(AtomicUsize::new(0)),
            capacity: 1 << 20,
        },
        take_give::<ProtoFetchUndo>,
    );
    group.finish();

    let mut group = c.benchmark_group("cap_64_refusing");
    group.throughput(Throughput::Elements(1));
    all_peers!(
        &mut group,
        &bench_threads(&REFUSING_THREADS),
        64,
        take_then_give_oldest
    );
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = contention
}
criterion_main!(benches);
