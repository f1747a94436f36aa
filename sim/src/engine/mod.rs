//! The engine: worker threads, each running an iteration-level scheduler
//! over its own running set, on one shared pool, with every allocator call
//! checked by the KV-memory [oracle](crate::oracle).
//!
//! # What a worker does
//!
//! Requests wait in one shared, bounded queue (a crossbeam channel that a
//! producer thread keeps filled: the simulator is closed-loop, every request
//! has arrived at the start). Each request is run as its
//! [`Profile`] (admission, drafts, samples; one for all, or the default
//! mix's, see [`EngineConfig::profile`]). Each worker loops over iterations:
//!
//! 1. **Admission.** While it runs fewer than `max_running` groups, it takes
//!    the head of its waiting list (its own preempted requests first, then
//!    the shared queue) and admits it only if the *whole prompt* fits with
//!    the watermark's headroom: with [`Admission::Reserve`], one
//!    all-or-nothing `try_reserve(seq, prompt tokens, watermark)` that puts
//!    the prompt's blocks straight into the new sequence's table, ahead of
//!    its length; with [`Admission::Check`], an atomic check that keeps
//!    the prompt's block past its cached prefix (a `try_reserve` of that
//!    block, with the rest of the prompt plus the watermark as headroom),
//!    so that the sequence is running and its prefill chunks are growth
//!    (a check that kept nothing would leave its first chunk a new
//!    admission, which kvslots refuses behind any waiter queued since, and
//!    the group would be preempted). If the head does not fit, admission stops for this
//!    iteration (first come, first served). A request whose prompt plus
//!    output (times its samples) can never fit the pool is rejected
//!    (`NeverFits`), counted, and never retried. With prefix caching
//!    (`prefix_cache`, for a request with `hash_ids`), the new sequence
//!    first takes the prompt's longest cached prefix
//!    (`try_match_prefix`), and only the rest of the prompt is admitted as
//!    above; a refused admission gives the matched blocks back.
//! 2. **A step of every running group**, oldest first:
//!    * *prefill*: one chunk of up to `chunk` tokens, one multi-token
//!      append; with a reservation it only fills blocks the sequence
//!      already holds; with check-only admission it takes the chunk's
//!      blocks (growth);
//!    * *fork*: once the prompt is in, `samples - 1` children are forked
//!      from it (sharing its full blocks; a partly filled last block is
//!      copied, and counted);
//!    * *decode*: every sample appends one token, or with `spec = K`
//!      appends `K` draft tokens at once, accepts each in turn with
//!      probability `accept` until the first rejection, keeps the accepted
//!      ones plus the target's correction, and truncates the rest.
//! 3. **Preemption.** When an allocation is refused, the worker drops its
//!    most recently admitted group (all its sequences, with the reserved
//!    blocks its prompt has not filled yet), puts its request back at the
//!    head of its waiting list (recompute-style: it starts again from its
//!    prompt), and retries, until the allocation succeeds or the group
//!    being stepped was itself the one dropped.
//! 4. A group whose every sample has its output tokens completes, and its
//!    sequences are dropped (their blocks go back).
//!
//! With prefix caching, a prompt's full blocks are published (their keys
//! made known to the cache) once it is prefilled, before any decode step.
//!
//! With `async_depth = K > 0` (asynchronous scheduling), each iteration is
//! a step with a fence of its own, and the device runs `K` steps behind:
//! every give-back of the step (the rollback of rejected drafts, the drop
//! of a completed or preempted group's sequences, the source of a
//! copy-on-write) is retired under the step's fence, and the step is
//! completed (its references given back) when the worker starts the step
//! `K` later. A refused allocation first waits for the device (completes
//! the oldest step in flight, and retries) and preempts only when nothing
//! is in flight; a worker with nothing running, or ending, completes every
//! step in flight.
//!
//! Every append writes the KV stamps of the positions it covers, every
//! device copy copies them, attention reads them back, and the oracle
//! checks every table against the pool (see [`crate::oracle`]).
//!
//! A worker with nothing running whose waiting head does not fit completes
//! every step it has in flight, gives back what its prefix match took, and
//! waits in the allocator ([`KvSeq::reserve_blocking`]) for the admission
//! itself, keeping what it is granted: reserve admission waits for the
//! whole prompt with the watermark as headroom; check-only for the
//! prompt's blocks up to the first past the prefix its refused admission
//! had matched (every group full; else the first block) with the rest of
//! the prompt plus the watermark as headroom (granted exactly when the
//! check passes), and keeps them, so that its prefill chunks are growth. kvslots
//! queues the waiter in the pool's FIFO wait queue (new admissions leave
//! it all it asks for, headroom included; running groups' growth does not
//! wait behind it); the baseline waits on a `Condvar` notified by every
//! give-back. The allocator wakes it when another worker's give-back lets
//! it in; each wait also times out after 500 µs, so that the worker sees a
//! stop request and its queue again (so nothing is left waiting at the end
//! of a run). That is [`IdleWait::Queue`], the default. With
//! [`IdleWait::Poll`] the worker does not wait in the allocator: for up to
//! the same 500 µs it retries the same all-or-nothing admission every
//! [`POLL_TICK`], on both allocators alike.
//!
//! The two differ when the pool is short. kvslots' queue grants the head
//! in the thread whose give-back lets it in, at that moment, and while
//! anyone is queued the other workers' new admissions leave it what it is
//! owed. A waiter that retries (the baseline's, woken by its condition
//! variable, or any waiter with [`IdleWait::Poll`]) finds the blocks given
//! back taken by the running groups' growth first, as vLLM's scheduler
//! serves its running requests before its waiting ones. So with the
//! queue the requests that waited are admitted sooner, and the running
//! groups find less room to grow: the prefill chunks of groups admitted
//! check-only, which take their blocks as growth, and decode steps are
//! refused, and preempt, more often.
//!
//! A refused step preempts the worker's most recently admitted group,
//! except the *priority group* (see `Shared::hold_priority`): the first
//! group refused with nothing else on its worker to preempt, which is never
//! preempted until it completes; while it is refused, no worker admits a
//! new request. So on a pool where every request fits alone, some request
//! always completes: groups on different workers cannot preempt one
//! another for ever.
//!
//! [`KvSeq::reserve_blocking`]: crate::backend::KvSeq::reserve_blocking
//!
//! # Failures end the run
//!
//! The first failure (a wrong stamp, a table that disagrees with the pool,
//! an unexpected error) stops every worker and is reported. A worker that
//! panics stops the run the same way, with the panic's message. A monitor
//! thread watches every allocator call: one that has run for
//! `stuck_after` (10 s by default) is reported as stuck (a livelock), with
//! its kind; the run then ends without waiting for it (its thread is left
//! behind, and the process exits). Once the run is being stopped, a worker
//! that does not stop within `stuck_after` (stuck somewhere the watchdog
//! does not look) is left behind the same way. As a guard against a livelock outside
//! the allocator, a worker that sees no request finish anywhere for
//! `stall_limit` of its own iterations (or `stall_limit / 1000` of its
//! idle waits, in the allocator or polling, whatever they ended in, and of its
//! waits while the request holding priority is refused with nothing else
//! running anywhere) stops the run too.
//!
//! # What is measured
//!
//! Every call into the allocator (each admission attempt, each blocking
//! admission of an idle worker, each append, truncate, fork, prefix match
//! and publish, and each drop of a sequence that was admitted) is counted
//! and timed with two `Instant::now()` calls around it, in the same place
//! for both allocators; the oracle's work is outside the timed part (and
//! the waits' time, mostly asleep, outside the run's allocator busy time). Creating an empty sequence (no pool access) is
//! not a call; a sequence whose admission was refused holds nothing (it
//! gives back what it matched) and is kept for the next attempt. Append latencies go into a per-worker HDR histogram,
//! merged at the end.

mod config;
mod device;
mod shared;
mod stats;
mod worker;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, SendTimeoutError, Sender};
use indicatif::ProgressBar;

use crate::backend::KvBackend;
use crate::oracle::Oracle;
use crate::workload::Request;

pub use config::{Admission, EngineConfig, IdleWait, Profile, MIX_CLASSES, MIX_SAMPLES};
pub use stats::{new_histogram, Counts, Invariants, OpKind, OpStats, RunStats};
pub use worker::{group_blocks, never_fits};

use device::Device;
use shared::Shared;
use stats::WorkerStats;
use worker::Worker;

/// Requests the shared queue holds at most.
pub const QUEUE_CAPACITY: usize = 1024;

/// With [`IdleWait::Poll`], the time between two attempts of an idle
/// worker's admission.
pub const POLL_TICK: std::time::Duration = std::time::Duration::from_micros(100);

/// What the main thread hears about each worker.
enum Exit {
    /// The worker has finished (normally, early, or by a panic).
    Done(Box<WorkerStats>),
    /// The watchdog found worker `.0` stuck in an allocator call.
    Stuck(usize),
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
/// refuses these first), if its groups of layers are not `backend`'s, or
/// if a thread cannot be spawned.
pub fn run<B: KvBackend>(
    backend: &B,
    requests: &[Request],
    cfg: &EngineConfig,
    progress: Option<&ProgressBar>,
) -> RunStats {
    let oracle = Oracle::new(backend.num_blocks(), backend.block_size());
    run_with_oracle(backend, oracle, requests, cfg, progress)
}

/// [`run`] with an oracle the caller has allocated (with
/// [`Oracle::try_new`], to refuse a pool too large for memory before the
/// run), sized for `backend`'s pool.
///
/// # Panics
///
/// As [`run`].
pub fn run_with_oracle<B: KvBackend>(
    backend: &B,
    oracle: Oracle,
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
    // The admission counts blocks in the config's groups, the sequences
    // take them in the backend's.
    assert_eq!(
        &cfg.groups,
        backend.kv_groups(),
        "the engine's groups of layers must be the backend's"
    );
    let cfg = Arc::new(cfg.clone());
    let shared = Arc::new(Shared::new(cfg.workers, oracle));
    // The shared request queue: a producer thread feeds it (as a server's
    // front end would) and the workers pull from it.
    let (tx, rx) = crossbeam_channel::bounded::<Request>(QUEUE_CAPACITY);
    let (exit_tx, exit_rx) = crossbeam_channel::unbounded::<Exit>();
    let start = Instant::now();
    let (per_worker, stuck) = std::thread::scope(|scope| {
        let shared = &shared;
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
        let monitor = {
            let (exit_tx, cfg) = (exit_tx.clone(), &cfg);
            scope.spawn(move || monitor(shared, cfg, &exit_tx, &done_rx, progress))
        };
        scope.spawn(move || produce(shared, requests, &tx));
        spawn_workers(backend, &cfg, shared, rx, &exit_tx);
        drop(exit_tx);
        let result = collect_exits(shared, cfg.workers, cfg.stuck_after, &exit_rx);
        drop(done_tx);
        let _ = monitor.join();
        result
    });
    let wall = start.elapsed();
    if let Some(pb) = progress {
        // Relaxed: every worker has reported (or is stuck); a display.
        pb.set_position(shared.finished.load(Ordering::Relaxed) as u64);
    }
    summarize(
        backend,
        requests.len(),
        &cfg,
        &shared,
        per_worker,
        stuck,
        wall,
    )
}

/// Feeds the queue until every request is in or the run is stopped.
fn produce(shared: &Shared, requests: &[Request], tx: &Sender<Request>) {
    for r in requests {
        let mut r = r.clone();
        loop {
            match tx.send_timeout(r, Duration::from_millis(10)) {
                Ok(()) => break,
                Err(SendTimeoutError::Timeout(back)) if !shared.aborted() => r = back,
                // Every worker has stopped, or the run is being stopped.
                Err(_) => return,
            }
        }
    }
}

/// Starts the workers on threads of their own (not scoped: a worker stuck
/// in an allocator call must not keep the run from ending). Each reports
/// its stats on `exits` when it ends, also by a panic, which first stops
/// the run with the panic's message.
fn spawn_workers<B: KvBackend>(
    backend: &B,
    cfg: &Arc<EngineConfig>,
    shared: &Arc<Shared>,
    rx: Receiver<Request>,
    exits: &Sender<Exit>,
) {
    for index in 0..cfg.workers {
        let worker = Worker {
            index,
            backend: backend.clone(),
            cfg: Arc::clone(cfg),
            shared: Arc::clone(shared),
            stats: WorkerStats::new(),
            // Room for a chunk's or a draft batch's slots (bounded: absurd
            // flag values must not abort).
            slots: Vec::with_capacity(cfg.chunk.max(cfg.spec).min(1 << 16)),
            spare: None,
            keys: (None, None),
            base_keys: Vec::new(),
            key_bufs: Vec::new(),
            copies: Vec::new(),
            device: Device::new(index, cfg.workers, cfg.async_depth),
            lone_waits: 0,
        };
        let (rx, exits, shared) = (rx.clone(), exits.clone(), Arc::clone(shared));
        std::thread::Builder::new()
            .name(format!("worker-{index}"))
            .spawn(move || {
                let ran =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker.run(&rx)));
                drop(rx);
                let stats = ran.unwrap_or_else(|panic| {
                    // The panic left its call: the watchdog must not count it.
                    shared.watch[index].exit();
                    let msg = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a non-string payload".to_string());
                    shared.fail(format!("worker {index} panicked: {msg}"));
                    let mut stats = WorkerStats::new();
                    stats.counts.panics = 1;
                    stats
                });
                // The receiver outlives the run's collection only if the
                // run ended without this worker (it was stuck).
                let _ = exits.send(Exit::Done(Box::new(stats)));
            })
            .expect("spawn a worker thread");
    }
}

/// Waits until every worker has reported or been found stuck; returns the
/// reports and how many workers were given up on. Once the run is being stopped, a
/// worker that has not reported within `grace` (stuck outside an
/// allocator call, where the watchdog does not look) is given up on too.
fn collect_exits(
    shared: &Shared,
    workers: usize,
    grace: Duration,
    exits: &Receiver<Exit>,
) -> (Vec<WorkerStats>, usize) {
    let (mut done, mut stuck) = (Vec::with_capacity(workers), HashSet::new());
    let mut stopping_since: Option<Instant> = None;
    let mut left_behind = 0;
    while done.len() + stuck.len() + left_behind < workers {
        match exits.recv_timeout(Duration::from_millis(50)) {
            Ok(Exit::Done(s)) => {
                done.push(*s);
                stopping_since = None;
            }
            Ok(Exit::Stuck(w)) => {
                stuck.insert(w);
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                if !shared.aborted() {
                    continue;
                }
                let since = *stopping_since.get_or_insert_with(Instant::now);
                if since.elapsed() > grace {
                    left_behind = workers - done.len() - stuck.len();
                    shared.fail(format!(
                        "{left_behind} worker(s) did not stop within {} ms of the run being \
                         stopped",
                        grace.as_millis()
                    ));
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        }
    }
    (done, stuck.len() + left_behind)
}

/// Drives the progress bar and the livelock watchdog until `done` closes.
fn monitor(
    shared: &Shared,
    cfg: &EngineConfig,
    exits: &Sender<Exit>,
    done: &Receiver<()>,
    progress: Option<&ProgressBar>,
) {
    let mut reported = HashSet::new();
    loop {
        let now = shared.now_ns();
        for (w, watch) in shared.watch.iter().enumerate() {
            if let Some((kind, ran)) = watch.stuck(now, cfg.stuck_after) {
                if reported.insert(w) {
                    shared.fail(format!(
                        "livelock: worker {w} has been inside {} for {} ms (the watchdog's \
                         limit is {} ms)",
                        kind.name(),
                        ran.as_millis(),
                        cfg.stuck_after.as_millis()
                    ));
                    let _ = exits.send(Exit::Stuck(w));
                }
            }
        }
        if let Some(pb) = progress {
            // Relaxed: a progress snapshot for display.
            pb.set_position(shared.finished.load(Ordering::Relaxed) as u64);
        }
        match done.recv_timeout(cfg.monitor_interval) {
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
    }
}

/// The run's stats from the workers' reports, with the oracle's final
/// sweep.
fn summarize<B: KvBackend>(
    backend: &B,
    requests: usize,
    cfg: &EngineConfig,
    shared: &Shared,
    per_worker: Vec<WorkerStats>,
    stuck: usize,
    wall: Duration,
) -> RunStats {
    let mut stats = RunStats {
        allocator: backend.name(),
        num_blocks: backend.num_blocks(),
        block_size: backend.block_size(),
        workers: cfg.workers,
        requests,
        counts: Counts::default(),
        peak_blocks_used: backend.peak_used_blocks(),
        alloc_busy: Duration::ZERO,
        wall,
        append_latency: new_histogram(),
        ops: Default::default(),
        final_used_blocks: backend.used_blocks(),
        unfinished_requests: 0,
        stalled: false,
        longest_calls_without_progress: 0,
        errors: Vec::new(),
        prefix: backend.prefix_stats(),
        cached_blocks: backend.cached_blocks(),
        pending_release_peak: backend.peak_pending_release_blocks(),
        // Relaxed: every worker has finished.
        running_peak: shared.running_peak.load(Ordering::Relaxed),
        layout: layout_words(backend.kv_groups()),
    };
    stats.counts.stuck_calls = stuck as u64;
    let mut finished = vec![0u8; requests];
    // Ids outside `0..requests`: a workload whose ids are not its indices
    // cannot be checked, and fails the invariant.
    let mut stray = 0u64;
    let mut busy_ns = 0u64;
    for w in per_worker {
        stats.counts.add(&w.counts);
        busy_ns += w.busy_ns;
        for (total, o) in stats.ops.iter_mut().zip(&w.ops) {
            total.calls += o.calls;
            total.busy_ns += o.busy_ns;
        }
        stats.stalled |= w.stalled;
        stats.longest_calls_without_progress = stats
            .longest_calls_without_progress
            .max(w.longest_calls_without_progress);
        stats
            .append_latency
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
    stats.unfinished_requests = stray + finished.iter().filter(|&&n| n != 1).count() as u64;
    stats.errors = shared.errors();
    // The sweep names what is left once every worker has let go (a leak
    // shows here, or as a stall when what it took is missing); after a
    // failure of the oracle it would only repeat it.
    if stuck == 0 && stats.counts.panics == 0 && stats.counts.kv_failures == 0 {
        let leftovers = shared.oracle.sweep(backend);
        stats.counts.kv_failures += leftovers.len() as u64;
        stats
            .errors
            .extend(leftovers.into_iter().map(|e| format!("kv memory: {e}")));
    }
    stats
}

/// A layout of groups in words: how many of each kind, in order of first
/// appearance (`1 full`, `6 sliding 1024 + 1 full`).
pub fn layout_words(groups: &kvslots::KvGroups) -> String {
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for g in groups.as_slice() {
        let name = match g {
            kvslots::KvGroup::SlidingWindow { window_tokens } => format!("sliding {window_tokens}"),
            kvslots::KvGroup::ChunkedLocal { chunk_tokens } => format!("chunked {chunk_tokens}"),
            _ => "full".to_string(),
        };
        match kinds.iter_mut().find(|(k, _)| *k == name) {
            Some((_, n)) => *n += 1,
            None => kinds.push((name, 1)),
        }
    }
    kinds
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(" + ")
}
