//! The engine: worker threads, each running an iteration-level scheduler
//! over its own running set, on one shared pool.
//!
//! # What a worker does
//!
//! Requests wait in one shared, bounded queue (a crossbeam channel that a
//! producer thread keeps filled: the simulator is closed-loop, every request
//! has arrived at the start). Each worker loops over iterations:
//!
//! 1. **Admission.** While it runs fewer than `max_running` groups, it takes
//!    the head of its waiting list (its own preempted requests first, then
//!    the shared queue) and admits it only if the *whole prompt* fits with
//!    the watermark's headroom. By default ([`Admission::Reserve`]) that is
//!    one all-or-nothing `try_reserve(seq, prompt tokens, watermark)` that
//!    puts the prompt's blocks straight into the new sequence's table,
//!    ahead of its length; with [`Admission::Check`] it is only an atomic
//!    check (a zero-block allocation with the prompt plus the watermark as
//!    headroom). If the head does not fit, admission stops for this
//!    iteration (first come, first served). A
//!    request whose prompt plus output (times its samples) can never fit
//!    the pool is rejected (`NeverFits`), counted, and never retried.
//! 2. **A step of every running group**, oldest first:
//!    * *prefill*: one chunk of up to `chunk` tokens, one multi-token
//!      `try_append`; with a reservation it only fills blocks the sequence
//!      already holds (it takes nothing from the pool); with check-only
//!      admission it takes the chunk's blocks;
//!    * *fork*: once the prompt is in, `samples - 1` children are forked
//!      from it (sharing its full blocks; a partly filled last block is
//!      copied, and counted);
//!    * *decode*: every sample appends one token, or with `spec = K`
//!      appends `K` draft tokens at once, accepts each in turn with
//!      probability `accept` until the first rejection, keeps the accepted
//!      ones plus the target's correction, and truncates the rest.
//! 3. **Preemption.** When an allocation is refused, the worker drops its
//!    most recently admitted group (all its sequences, with the reserved
//!    blocks its prompt has not filled yet), puts its request back at the head of its waiting list
//!    (recompute-style: it starts again from its prompt), and retries, until
//!    the allocation succeeds or the group being stepped was itself the one
//!    dropped.
//! 4. A group whose every sample has its output tokens completes, and its
//!    sequences are dropped (their blocks go back).
//!
//! A worker with nothing running whose waiting head does not fit (other
//! workers hold the blocks) parks until another worker completes or
//! preempts a group (which frees blocks), then tries again. A single
//! group always fits an otherwise empty pool (anything larger was rejected),
//! and every refusal frees blocks through preemption, so the run ends; as a
//! guard against a livelock that should not happen, a worker that sees no
//! request finish anywhere for `stall_limit` of its own iterations (or
//! `stall_limit / 1000` of its waits) stops the run, which then fails its
//! invariants instead of hanging.
//!
//! # What is measured
//!
//! Every call into the allocator (each admission attempt, each
//! `try_append`, `truncate`, `try_fork`, and each drop of a sequence that
//! was admitted) is counted and timed with two `Instant::now()` calls
//! around it, in the same place for both allocators; nothing else is
//! timed. Creating an empty sequence (no pool access) is not a call; a
//! sequence whose admission was refused holds nothing and is kept for the
//! next attempt, so no empty sequence is ever dropped during the run. `try_append` latencies go into a per-worker HDR histogram, merged
//! at the end. A monitor thread samples `used_blocks() <= num_blocks()`.

mod config;
mod stats;
mod worker;

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use indicatif::ProgressBar;

use crate::backend::KvBackend;
use crate::workload::Request;

pub use config::{Admission, EngineConfig};
pub use stats::{new_histogram, Invariants, OpKind, OpStats, RunStats};
pub use worker::{group_blocks, never_fits};

use stats::WorkerStats;
use worker::Worker;

/// Requests the shared queue holds at most.
pub const QUEUE_CAPACITY: usize = 1024;

/// State shared by the workers and the monitor.
struct Shared {
    /// Requests completed or rejected, for progress and stall detection.
    finished: AtomicUsize,
    /// Set to stop every worker early (stall or unexpected error).
    abort: AtomicBool,
    /// Set once every worker is done: stops the monitor.
    done: AtomicBool,
    /// Monitor samples and overcommits seen.
    samples: AtomicU64,
    overcommits: AtomicU64,
    /// Unexpected errors.
    errors: Mutex<Vec<String>>,
    /// Workers waiting for blocks.
    idle: IdleWorkers,
}

impl Shared {
    fn fail(&self, msg: String) {
        let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if errors.len() < 16 {
            errors.push(msg);
        }
        // Relaxed: a stop request; workers poll it once an iteration.
        self.abort.store(true, Ordering::Relaxed);
        self.idle.wake_all();
    }
}

/// A worker's view of the queue: the shared channel and its own waiting
/// list (preempted requests first).
struct Queue<'a> {
    rx: &'a Receiver<Request>,
    waiting: VecDeque<Request>,
    source_done: bool,
}

/// The longest an idle worker parks before it looks again on its own.
const IDLE_PARK: Duration = Duration::from_micros(500);

/// Idle workers, parked until another worker frees blocks.
struct IdleWorkers {
    /// How many are registered; read without the lock by whoever frees.
    parked: AtomicUsize,
    threads: Mutex<Vec<std::thread::Thread>>,
}

impl IdleWorkers {
    fn new() -> Self {
        IdleWorkers {
            parked: AtomicUsize::new(0),
            threads: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<std::thread::Thread>> {
        self.threads.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(&self) {
        self.lock().push(std::thread::current());
        // SeqCst, with the fence in `wake_all`: either this registration is
        // seen by a waker that freed blocks, or the admission attempt that
        // follows it sees those blocks (a store-load pair on both sides).
        self.parked.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    fn unregister(&self) {
        let me = std::thread::current().id();
        let mut threads = self.lock();
        if let Some(i) = threads.iter().position(|t| t.id() == me) {
            threads.swap_remove(i);
        }
        // Relaxed: the count only gates the waker's lock; the list under
        // the lock is the truth.
        self.parked.fetch_sub(1, Ordering::Relaxed);
    }

    /// Wakes every parked worker; called after freeing blocks.
    fn wake_all(&self) {
        // SeqCst: pairs with the fence in `register` (see there).
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) > 0 {
            for t in self.lock().iter() {
                t.unpark();
            }
        }
    }
}

/// Runs `requests` through `cfg.workers` workers on `backend`, with a
/// monitor thread (which also drives `progress`, if given).
///
/// Request ids must be their indices (`0..requests.len()`), as the
/// workload readers make them; other ids fail the `all_completed`
/// invariant.
///
/// # Panics
///
/// Panics if `cfg` has no worker, a zero `chunk`, `samples` or
/// `max_running`, or an `accept` outside `[0, 1]` (the command line
/// refuses these first), or if a thread cannot be spawned.
pub fn run<B: KvBackend>(
    backend: &B,
    requests: &[Request],
    cfg: &EngineConfig,
    progress: Option<&ProgressBar>,
) -> RunStats {
    assert!(cfg.workers >= 1, "at least one worker");
    assert!(cfg.chunk >= 1, "chunk must be at least 1 token");
    assert!(cfg.samples >= 1, "at least one sample");
    assert!(cfg.max_running >= 1, "max_running must be at least 1");
    assert!(
        (0.0..=1.0).contains(&cfg.accept),
        "accept must be a probability"
    );

    // The shared request queue: a producer thread feeds it (as a server's
    // front end would) and the workers pull from it.
    let (tx, rx) = crossbeam_channel::bounded::<Request>(QUEUE_CAPACITY);

    let shared = Shared {
        finished: AtomicUsize::new(0),
        abort: AtomicBool::new(false),
        done: AtomicBool::new(false),
        samples: AtomicU64::new(0),
        overcommits: AtomicU64::new(0),
        errors: Mutex::new(Vec::new()),
        idle: IdleWorkers::new(),
    };
    let nb = backend.num_blocks();

    let (wall, per_worker) = std::thread::scope(|scope| {
        let shared = &shared;
        let monitor = scope.spawn(move || {
            loop {
                let used = backend.used_blocks();
                // Relaxed (all): statistics.
                if used > nb {
                    shared.overcommits.fetch_add(1, Ordering::Relaxed);
                }
                shared.samples.fetch_add(1, Ordering::Relaxed);
                if let Some(pb) = progress {
                    // Relaxed: a progress snapshot for display.
                    pb.set_position(shared.finished.load(Ordering::Relaxed) as u64);
                }
                // Relaxed: a stop flag set after every worker joined.
                if shared.done.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::sleep(cfg.monitor_interval);
            }
        });
        let start = Instant::now();
        scope.spawn(move || {
            for &r in requests {
                // An error means every worker has stopped (an aborted run).
                if tx.send(r).is_err() {
                    break;
                }
            }
        });
        let handles: Vec<_> = (0..cfg.workers)
            .map(|_| {
                let rx = rx.clone();
                scope.spawn(move || {
                    Worker {
                        backend,
                        cfg,
                        shared,
                        stats: WorkerStats::new(),
                        // Room for a chunk's or a draft batch's slots
                        // (bounded: absurd flag values must not abort).
                        slots: Vec::with_capacity(cfg.chunk.max(cfg.spec).min(1 << 16)),
                        spare: None,
                    }
                    .run(&rx)
                })
            })
            .collect();
        // Only the workers hold the receiving end now, so the producer
        // stops if they all stop early.
        drop(rx);
        let per_worker: Vec<WorkerStats> = handles
            .into_iter()
            .map(|h| h.join().expect("a worker panicked"))
            .collect();
        let wall = start.elapsed();
        // One last sample after the run, then stop the monitor. Relaxed
        // (both): a statistic, and a stop flag whose readers are joined
        // right after (the join orders everything the monitor did).
        if backend.used_blocks() > nb {
            shared.overcommits.fetch_add(1, Ordering::Relaxed);
        }
        shared.samples.fetch_add(1, Ordering::Relaxed);
        shared.done.store(true, Ordering::Relaxed);
        monitor.join().expect("the monitor panicked");
        (wall, per_worker)
    });
    // Relaxed (here and below): every thread was joined, and joins order
    // all their writes before these reads.
    if let Some(pb) = progress {
        pb.set_position(shared.finished.load(Ordering::Relaxed) as u64);
    }

    let mut append_latency = new_histogram();
    let mut finished = vec![0u8; requests.len()];
    let mut stats = RunStats {
        allocator: backend.name(),
        num_blocks: nb,
        block_size: backend.block_size(),
        workers: cfg.workers,
        requests: requests.len(),
        requests_completed: 0,
        requests_rejected: 0,
        preemptions: 0,
        tokens_prefilled: 0,
        tokens_decoded: 0,
        tokens_rolled_back: 0,
        forks: 0,
        block_copies: 0,
        peak_blocks_used: backend.peak_used_blocks(),
        alloc_calls: 0,
        alloc_busy: Duration::ZERO,
        wall,
        append_latency: new_histogram(),
        monitor_samples: shared.samples.load(Ordering::Relaxed),
        monitor_overcommits: shared.overcommits.load(Ordering::Relaxed),
        final_used_blocks: backend.used_blocks(),
        output_mismatches: 0,
        idle_waits: 0,
        ops: Default::default(),
        unfinished_requests: 0,
        stalled: false,
        errors: shared
            .errors
            .into_inner()
            .unwrap_or_else(|e| e.into_inner()),
    };
    let mut busy_ns = 0u64;
    // Ids outside `0..requests.len()`: a workload whose ids are not its
    // indices cannot be checked, and fails the invariant.
    let mut stray = 0u64;
    for w in per_worker {
        stats.requests_completed += w.completed;
        stats.requests_rejected += w.rejected;
        stats.preemptions += w.preemptions;
        stats.tokens_prefilled += w.prefilled;
        stats.tokens_decoded += w.decoded;
        stats.tokens_rolled_back += w.rolled_back;
        stats.forks += w.forks;
        stats.block_copies += w.copies;
        stats.alloc_calls += w.calls;
        busy_ns += w.busy_ns;
        stats.output_mismatches += w.mismatches;
        stats.idle_waits += w.idle_waits;
        for (total, o) in stats.ops.iter_mut().zip(&w.ops) {
            total.calls += o.calls;
            total.busy_ns += o.busy_ns;
        }
        stats.stalled |= w.stalled;
        append_latency
            .add(&w.append)
            .expect("histograms with the same bounds merge");
        for id in w.finished_ids {
            match finished.get_mut(id) {
                Some(n) => *n = n.saturating_add(1),
                None => stray += 1,
            }
        }
    }
    stats.alloc_busy = Duration::from_nanos(busy_ns);
    stats.append_latency = append_latency;
    stats.unfinished_requests = stray + finished.iter().filter(|&&n| n != 1).count() as u64;
    stats
}
