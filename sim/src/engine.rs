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

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvError};
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use kvslots::ReserveError;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::backend::KvBackend;
use crate::workload::Request;

/// How a worker admits a waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Admission {
    /// Reserve the whole prompt's blocks with the watermark's headroom in
    /// one all-or-nothing `try_reserve` into the new sequence (ahead of its
    /// length); the prefill chunks then fill those blocks without taking
    /// any from the pool. Nobody can take an admitted prompt's blocks.
    Reserve,
    /// Only check, atomically, that the whole prompt plus the watermark is
    /// free (a zero-block allocation with headroom), as vLLM's
    /// `can_allocate` does; the chunks are then appended without a
    /// reservation, so another worker may take the blocks first (and a
    /// chunk may then preempt).
    Check,
}

impl std::fmt::Display for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Admission::Reserve => "reserve",
            Admission::Check => "check",
        })
    }
}

/// The scheduler's settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// How waiting requests are admitted.
    pub admission: Admission,
    /// Worker threads.
    pub workers: usize,
    /// Blocks that admission keeps free (the watermark).
    pub watermark_blocks: usize,
    /// Prefill chunk, in tokens (at least 1).
    pub chunk: usize,
    /// Speculative draft tokens per decode step; 0 decodes one token a step.
    pub spec: usize,
    /// Probability that a draft token is accepted.
    pub accept: f64,
    /// Samples per request (1 = no fork).
    pub samples: usize,
    /// Most groups one worker runs at once.
    pub max_running: usize,
    /// Seed for the acceptance draws (per request, so that both allocators
    /// see the same draws).
    pub seed: u64,
    /// Iterations a worker may run without any request finishing anywhere
    /// (or, while it waits for blocks, a thousandth as many waits) before it
    /// declares a livelock and stops the run.
    pub stall_limit: u64,
    /// Time between two monitor samples.
    pub monitor_interval: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            admission: Admission::Reserve,
            workers: 4,
            watermark_blocks: 0,
            chunk: 512,
            spec: 0,
            accept: 0.7,
            samples: 1,
            max_running: 64,
            seed: 0,
            stall_limit: 20_000_000,
            monitor_interval: Duration::from_micros(200),
        }
    }
}

/// What one run did.
#[derive(Debug, Clone)]
pub struct RunStats {
    /// The allocator's name.
    pub allocator: &'static str,
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Worker threads.
    pub workers: usize,
    /// Requests in the workload.
    pub requests: usize,
    /// Requests that completed.
    pub requests_completed: u64,
    /// Requests rejected as never fitting.
    pub requests_rejected: u64,
    /// Groups dropped to free blocks (each requeued).
    pub preemptions: u64,
    /// Prompt tokens appended (recomputation included).
    pub tokens_prefilled: u64,
    /// Output tokens kept (recomputation included).
    pub tokens_decoded: u64,
    /// Draft tokens truncated.
    pub tokens_rolled_back: u64,
    /// Children forked.
    pub forks: u64,
    /// Forks that needed a block copy (a partly filled last block).
    pub block_copies: u64,
    /// The pool's high-water mark.
    pub peak_blocks_used: usize,
    /// Allocator calls made.
    pub alloc_calls: u64,
    /// Time spent inside allocator calls, summed over workers.
    pub alloc_busy: Duration,
    /// From the first worker's start to the last worker's end.
    pub wall: Duration,
    /// `try_append` latencies, in nanoseconds.
    pub append_latency: Histogram<u64>,
    /// Monitor samples taken.
    pub monitor_samples: u64,
    /// Samples that saw `used_blocks() > num_blocks()`.
    pub monitor_overcommits: u64,
    /// Blocks still in use after every worker finished.
    pub final_used_blocks: usize,
    /// Completed requests whose samples did not get exactly their output.
    pub output_mismatches: u64,
    /// Iterations in which a worker had nothing running and its waiting
    /// request did not fit (it parked until blocks were freed).
    pub idle_waits: u64,
    /// Allocator calls and their time, by kind (indexed by [`OpKind`]).
    pub ops: [OpStats; OpKind::ALL.len()],
    /// Requests neither completed nor rejected, or finished twice.
    pub unfinished_requests: u64,
    /// A worker saw no progress for `stall_limit` iterations.
    pub stalled: bool,
    /// Errors that should never happen (a closed pool, a refused free).
    pub errors: Vec<String>,
}

/// The kinds of allocator call the engine makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Admission: `try_reserve` of the prompt's blocks into the new
    /// sequence (or, check-only, the zero-block headroom check), failed
    /// attempts included.
    Admit,
    /// `try_append`: prefill chunks, decode tokens, speculative drafts.
    Append,
    /// `truncate` of rejected draft tokens.
    Truncate,
    /// `try_fork` for parallel sampling.
    Fork,
    /// Dropping a sequence (its blocks go back).
    Drop,
}

impl OpKind {
    /// Every kind, in index order.
    pub const ALL: [OpKind; 5] = [
        OpKind::Admit,
        OpKind::Append,
        OpKind::Truncate,
        OpKind::Fork,
        OpKind::Drop,
    ];

    /// The kind's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Admit => "admit",
            OpKind::Append => "try_append",
            OpKind::Truncate => "truncate",
            OpKind::Fork => "try_fork",
            OpKind::Drop => "drop",
        }
    }
}

/// Calls of one kind and the time spent in them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpStats {
    /// Calls made.
    pub calls: u64,
    /// Nanoseconds inside them, summed over workers.
    pub busy_ns: u64,
}

impl OpStats {
    #[inline]
    fn add(&mut self, ns: u64) {
        self.calls += 1;
        self.busy_ns += ns;
    }
}

/// Each invariant checked at the end of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Invariants {
    /// Every block is free again.
    pub pool_full_again: bool,
    /// The monitor never saw `used_blocks() > num_blocks()`, and the peak
    /// stayed within the pool.
    pub never_overcommitted: bool,
    /// Every completed request's samples got exactly their output tokens.
    pub exact_outputs: bool,
    /// Every request not rejected completed, exactly once, and nothing
    /// unexpected happened.
    pub all_completed: bool,
}

impl Invariants {
    /// Whether all hold.
    pub fn ok(&self) -> bool {
        self.pool_full_again && self.never_overcommitted && self.exact_outputs && self.all_completed
    }
}

impl RunStats {
    /// The invariants.
    pub fn invariants(&self) -> Invariants {
        Invariants {
            pool_full_again: self.final_used_blocks == 0,
            never_overcommitted: self.monitor_overcommits == 0
                && self.peak_blocks_used <= self.num_blocks,
            exact_outputs: self.output_mismatches == 0,
            all_completed: self.unfinished_requests == 0
                && self.requests_completed + self.requests_rejected == self.requests as u64
                && !self.stalled
                && self.errors.is_empty(),
        }
    }

    /// Allocator calls per second of wall time (all workers together).
    pub fn alloc_ops_per_sec(&self) -> f64 {
        per_sec(self.alloc_calls, self.wall)
    }
}

fn per_sec(n: u64, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// Requests the shared queue holds at most.
pub const QUEUE_CAPACITY: usize = 1024;

/// A fresh latency histogram: 1 ns to 100 s, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid histogram bounds")
}

/// Blocks needed by a group of `samples` sequences that share the full
/// blocks of a `prompt`-token prefix and each grow to `prompt + output`.
pub fn group_blocks(prompt: usize, output: usize, samples: usize, block_size: usize) -> usize {
    let total = prompt.saturating_add(output).div_ceil(block_size);
    let shared = prompt / block_size;
    total.saturating_add(samples.saturating_sub(1).saturating_mul(total - shared))
}

/// Whether a request can never be admitted and run to completion in a pool
/// of `num_blocks` (alone, with the watermark at admission).
pub fn never_fits(req: &Request, cfg: &EngineConfig, num_blocks: usize, block_size: usize) -> bool {
    let prompt_blocks = req.prompt.div_ceil(block_size);
    prompt_blocks.saturating_add(cfg.watermark_blocks) > num_blocks
        || group_blocks(req.prompt, req.output, cfg.samples, block_size) > num_blocks
}

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

/// Where a group is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Prefill,
    Fork,
    Decode,
}

/// One admitted request: its sequences (the parent first) and progress.
struct Group<B: KvBackend> {
    req: Request,
    phase: Phase,
    seqs: Vec<B::Seq>,
    /// Output tokens kept, per sample.
    generated: Vec<usize>,
    /// Prompt tokens appended.
    prefilled: usize,
    /// The next sample to step in this iteration (steps resume there after
    /// a refusal was resolved by preempting another group).
    cursor: usize,
    rng: SmallRng,
}

/// Counters and the histogram of one worker.
struct WorkerStats {
    completed: u64,
    rejected: u64,
    preemptions: u64,
    prefilled: u64,
    decoded: u64,
    rolled_back: u64,
    forks: u64,
    copies: u64,
    calls: u64,
    busy_ns: u64,
    mismatches: u64,
    idle_waits: u64,
    ops: [OpStats; OpKind::ALL.len()],
    stalled: bool,
    append: Histogram<u64>,
    finished_ids: Vec<usize>,
}

impl WorkerStats {
    fn new() -> Self {
        WorkerStats {
            completed: 0,
            rejected: 0,
            preemptions: 0,
            prefilled: 0,
            decoded: 0,
            rolled_back: 0,
            forks: 0,
            copies: 0,
            calls: 0,
            busy_ns: 0,
            mismatches: 0,
            idle_waits: 0,
            ops: Default::default(),
            stalled: false,
            append: new_histogram(),
            finished_ids: Vec::new(),
        }
    }

    /// Runs one allocator call, counting and timing it.
    #[inline]
    fn call<R>(&mut self, kind: OpKind, f: impl FnOnce() -> R) -> R {
        let t = Instant::now();
        let r = f();
        let ns = t.elapsed().as_nanos() as u64;
        self.busy_ns += ns;
        self.calls += 1;
        self.ops[kind as usize].add(ns);
        r
    }

    /// Runs one `try_append`, counting, timing and recording it.
    #[inline]
    fn append<B: KvBackend>(
        &mut self,
        seq: &mut B::Seq,
        n: usize,
    ) -> Result<Range<usize>, ReserveError> {
        let t = Instant::now();
        let r = B::try_append(seq, n);
        let ns = t.elapsed().as_nanos() as u64;
        self.busy_ns += ns;
        self.calls += 1;
        self.ops[OpKind::Append as usize].add(ns);
        self.append.saturating_record(ns.max(1));
        r
    }
}

/// Why a step could not go on.
enum StepError {
    /// The pool refused: preempt and retry.
    Refused,
    /// Something that should never happen; the run is stopped.
    Fatal(String),
}

struct Worker<'a, B: KvBackend> {
    backend: &'a B,
    cfg: &'a EngineConfig,
    shared: &'a Shared,
    stats: WorkerStats,
    /// Slot mapping scratch (what a real worker hands the kernel).
    slots: Vec<usize>,
    /// An empty sequence whose admission was refused, and the tokens its
    /// table was sized for: reused by the next attempt for the same size
    /// (usually the same request), so that refused attempts neither build
    /// nor drop a sequence each time.
    spare: Option<(usize, B::Seq)>,
}

impl<B: KvBackend> Worker<'_, B> {
    fn block_size(&self) -> usize {
        self.backend.block_size()
    }

    fn finish_one(&mut self, id: usize) {
        self.stats.finished_ids.push(id);
        // Relaxed: a progress count; it orders nothing.
        self.shared.finished.fetch_add(1, Ordering::Relaxed);
    }

    /// Maps an append's new positions, as a worker building the kernel's
    /// slot mapping would (not timed: it touches no shared state).
    fn map_slots(&mut self, seq: &B::Seq, positions: Range<usize>) {
        self.slots.clear();
        B::extend_slots(seq, positions, &mut self.slots);
        debug_assert!(self
            .slots
            .iter()
            .all(|&s| s < self.backend.num_blocks() * self.block_size()));
    }

    fn refused(&self, e: ReserveError, what: &str) -> StepError {
        match e {
            ReserveError::Full { .. } => StepError::Refused,
            other => StepError::Fatal(format!("{what}: unexpected {other:?}")),
        }
    }

    /// One step of `g`; `Ok(true)` when the group has completed.
    fn step(&mut self, g: &mut Group<B>) -> Result<bool, StepError> {
        let bs = self.block_size();
        match g.phase {
            Phase::Prefill => {
                let chunk = self.cfg.chunk.min(g.req.prompt - g.prefilled);
                let held = B::seq_blocks(&g.seqs[0]);
                let range = self
                    .stats
                    .append::<B>(&mut g.seqs[0], chunk)
                    .map_err(|e| self.refused(e, "prefill"))?;
                // A reserved prompt is filled without taking a block.
                if self.cfg.admission == Admission::Reserve && B::seq_blocks(&g.seqs[0]) != held {
                    return Err(StepError::Fatal(format!(
                        "prefill of a reserved prompt took blocks ({held} held, {} after)",
                        B::seq_blocks(&g.seqs[0])
                    )));
                }
                self.map_slots(&g.seqs[0], range);
                g.prefilled += chunk;
                self.stats.prefilled += chunk as u64;
                if g.prefilled == g.req.prompt {
                    debug_assert_eq!(B::seq_blocks(&g.seqs[0]), g.req.prompt.div_ceil(bs));
                    g.phase = if self.cfg.samples > 1 {
                        Phase::Fork
                    } else {
                        Phase::Decode
                    };
                    return Ok(g.req.output == 0 && self.cfg.samples == 1);
                }
                Ok(false)
            }
            Phase::Fork => {
                while g.seqs.len() < self.cfg.samples {
                    let (child, copy) = self
                        .stats
                        .call(OpKind::Fork, || B::try_fork(&g.seqs[0]))
                        .map_err(|e| self.refused(e, "fork"))?;
                    g.seqs.push(child);
                    self.stats.forks += 1;
                    self.stats.copies += u64::from(copy.is_some());
                }
                g.phase = Phase::Decode;
                Ok(g.req.output == 0)
            }
            Phase::Decode => {
                let output = g.req.output;
                while g.cursor < g.seqs.len() {
                    let s = g.cursor;
                    let remaining = output - g.generated[s];
                    if remaining > 0 {
                        let kept = self.decode(g, s, remaining)?;
                        g.generated[s] += kept;
                        self.stats.decoded += kept as u64;
                    }
                    g.cursor += 1;
                }
                g.cursor = 0;
                Ok(g.generated.iter().all(|&n| n == output))
            }
        }
    }

    /// One decode step of sample `s`; returns the tokens it kept.
    fn decode(&mut self, g: &mut Group<B>, s: usize, remaining: usize) -> Result<usize, StepError> {
        if self.cfg.spec == 0 {
            let range = self
                .stats
                .append::<B>(&mut g.seqs[s], 1)
                .map_err(|e| self.refused(e, "decode"))?;
            self.map_slots(&g.seqs[s], range);
            return Ok(1);
        }
        // Speculative: K drafts in one append, then keep the accepted
        // prefix plus the target's correction token, truncate the rest.
        let k = self.cfg.spec.min(remaining);
        let range = self
            .stats
            .append::<B>(&mut g.seqs[s], k)
            .map_err(|e| self.refused(e, "speculative append"))?;
        let start = range.start;
        let mut accepted = 0;
        while accepted < k && g.rng.random_bool(self.cfg.accept) {
            accepted += 1;
        }
        let kept = (accepted + 1).min(k);
        if kept < k {
            let seq = &mut g.seqs[s];
            self.stats
                .call(OpKind::Truncate, || B::truncate(seq, start + kept));
            self.stats.rolled_back += (k - kept) as u64;
        }
        self.map_slots(&g.seqs[s], start..start + kept);
        Ok(kept)
    }

    /// Drops a group's sequences, with any reserved blocks they still hold
    /// (each drop is an allocator call).
    fn release(&mut self, g: Group<B>) {
        for seq in g.seqs {
            self.stats.call(OpKind::Drop, || drop(seq));
        }
    }

    fn complete(&mut self, g: Group<B>) {
        let want = g.req.prompt + g.req.output;
        let exact = g.seqs.len() == self.cfg.samples
            && g.generated.iter().all(|&n| n == g.req.output)
            && g.seqs.iter().all(|s| B::seq_len(s) == want);
        if !exact {
            self.stats.mismatches += 1;
        }
        self.stats.completed += 1;
        let id = g.req.id;
        self.release(g);
        self.finish_one(id);
    }

    /// Admits `req` if its whole prompt fits with the watermark; `Ok(None)`
    /// if it does not fit now.
    fn admit(&mut self, req: Request) -> Result<Option<Group<B>>, String> {
        let backend = self.backend;
        let wm = self.cfg.watermark_blocks;
        // The sequence's table is sized for the whole run (prompt plus
        // output), so that no append reallocates it.
        let tokens = req.prompt + req.output;
        let mut seq = match self.spare.take() {
            Some((sized, seq)) if sized == tokens => seq,
            // An empty sequence of another size: dropping it touches no
            // block (it holds none), so it is not an allocator call.
            _ => backend.new_seq(tokens),
        };
        debug_assert_eq!(B::seq_blocks(&seq), 0, "a spare sequence holds blocks");
        let admitted = match self.cfg.admission {
            Admission::Reserve => self
                .stats
                .call(OpKind::Admit, || B::try_reserve(&mut seq, req.prompt, wm)),
            Admission::Check => {
                let prompt_blocks = req.prompt.div_ceil(self.block_size());
                // A zero-block allocation pushes nothing: `none` stays empty
                // and never allocates.
                let mut none = Vec::new();
                self.stats.call(OpKind::Admit, || {
                    backend.try_alloc_with_headroom(0, prompt_blocks + wm, &mut none)
                })
            }
        };
        match admitted {
            Ok(()) => {}
            Err(ReserveError::Full { .. }) => {
                // Refused: nothing changed, the sequence is still empty.
                self.spare = Some((tokens, seq));
                return Ok(None);
            }
            Err(e) => return Err(format!("admission: unexpected {e:?}")),
        }
        let mut seqs = Vec::with_capacity(self.cfg.samples);
        seqs.push(seq);
        Ok(Some(Group {
            req,
            phase: Phase::Prefill,
            seqs,
            generated: vec![0; self.cfg.samples],
            prefilled: 0,
            cursor: 0,
            rng: SmallRng::seed_from_u64(
                self.cfg.seed ^ (req.id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            ),
        }))
    }

    /// Admits waiting requests, first come first served, while this worker
    /// runs fewer than `max_running` groups and the head fits.
    fn admit_waiting(
        &mut self,
        q: &mut Queue<'_>,
        running: &mut Vec<Group<B>>,
    ) -> Result<(), String> {
        let (nb, bs) = (self.backend.num_blocks(), self.block_size());
        while running.len() < self.cfg.max_running {
            let req = match q.waiting.front() {
                Some(&r) => r,
                None if q.source_done => break,
                // Closed-loop: every request has arrived, so a worker waits
                // for the producer rather than treating a momentarily empty
                // queue as "no work" (which would also make one-worker runs
                // depend on thread timing).
                None => match q.rx.recv() {
                    Ok(r) => {
                        q.waiting.push_back(r);
                        r
                    }
                    Err(RecvError) => {
                        q.source_done = true;
                        break;
                    }
                },
            };
            if never_fits(&req, self.cfg, nb, bs) {
                q.waiting.pop_front();
                self.stats.rejected += 1;
                self.finish_one(req.id);
                continue;
            }
            match self.admit(req)? {
                Some(g) => {
                    q.waiting.pop_front();
                    running.push(g);
                }
                None => break,
            }
        }
        Ok(())
    }

    fn run(mut self, rx: &Receiver<Request>) -> WorkerStats {
        let mut running: Vec<Group<B>> = Vec::new();
        let mut q = Queue {
            rx,
            waiting: VecDeque::new(),
            source_done: false,
        };
        // Relaxed: progress snapshots for stall detection.
        let mut last_finished = self.shared.finished.load(Ordering::Relaxed);
        let (mut busy_idle, mut parked_idle) = (0u64, 0u64);
        let park_limit = self.cfg.stall_limit / 1000;
        'run: loop {
            // Relaxed: a stop request, polled once an iteration.
            if self.shared.abort.load(Ordering::Relaxed) {
                break;
            }
            // 1. Admission.
            if let Err(e) = self.admit_waiting(&mut q, &mut running) {
                self.shared.fail(e);
                break;
            }
            // 2. Nothing running: done, or wait until another worker frees
            // blocks. Register as idle first and try once more, so that a
            // free that came before the registration is not missed; then
            // park until a completion or preemption anywhere wakes us (the
            // timeout is only a safety net).
            if running.is_empty() {
                if q.waiting.is_empty() && q.source_done {
                    break;
                }
                self.shared.idle.register();
                let again = self.admit_waiting(&mut q, &mut running);
                if again.is_ok() && running.is_empty() && !(q.waiting.is_empty() && q.source_done) {
                    self.stats.idle_waits += 1;
                    std::thread::park_timeout(IDLE_PARK);
                }
                self.shared.idle.unregister();
                if let Err(e) = again {
                    self.shared.fail(e);
                    break;
                }
                // Stall guard for waits: parks without any request
                // finishing anywhere.
                let now = self.shared.finished.load(Ordering::Relaxed);
                if now != last_finished {
                    (last_finished, busy_idle, parked_idle) = (now, 0, 0);
                } else if running.is_empty() {
                    parked_idle += 1;
                    if parked_idle > park_limit {
                        self.stall();
                        break;
                    }
                }
                continue;
            }
            // 3. One step of every running group, oldest first.
            let mut i = 0;
            while i < running.len() {
                match self.step(&mut running[i]) {
                    Ok(true) => {
                        let g = running.remove(i);
                        self.complete(g);
                        self.shared.idle.wake_all();
                    }
                    Ok(false) => i += 1,
                    Err(StepError::Refused) => {
                        // Preempt the most recently admitted group (maybe
                        // this one), then retry this one if it is still here.
                        let victim = running.pop().expect("running is not empty");
                        q.waiting.push_front(victim.req);
                        self.stats.preemptions += 1;
                        self.release(victim);
                        self.shared.idle.wake_all();
                    }
                    Err(StepError::Fatal(e)) => {
                        self.shared.fail(e);
                        break 'run;
                    }
                }
            }
            // 4. Stall guard, by count. Relaxed: a progress snapshot.
            let now = self.shared.finished.load(Ordering::Relaxed);
            if now != last_finished {
                (last_finished, busy_idle, parked_idle) = (now, 0, 0);
            } else {
                busy_idle += 1;
                if busy_idle > self.cfg.stall_limit {
                    self.stall();
                    break;
                }
            }
        }
        for g in running.drain(..).rev() {
            self.release(g);
        }
        self.shared.idle.wake_all();
        self.stats
    }

    fn stall(&mut self) {
        self.stats.stalled = true;
        self.shared.fail(format!(
            "stalled: no request finished in {} iterations ({} waits)",
            self.cfg.stall_limit,
            self.cfg.stall_limit / 1000
        ));
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
