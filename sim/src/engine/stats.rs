//! What a run measured: the run-wide [`RunStats`], its [`Invariants`], the
//! allocator calls by [`OpKind`], and each worker's own counters.

use std::ops::Range;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kvslots::ReserveError;

use crate::backend::KvBackend;

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

/// A fresh latency histogram: 1 ns to 100 s, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid histogram bounds")
}

/// Counters and the histogram of one worker.
pub(super) struct WorkerStats {
    pub(super) completed: u64,
    pub(super) rejected: u64,
    pub(super) preemptions: u64,
    pub(super) prefilled: u64,
    pub(super) decoded: u64,
    pub(super) rolled_back: u64,
    pub(super) forks: u64,
    pub(super) copies: u64,
    pub(super) calls: u64,
    pub(super) busy_ns: u64,
    pub(super) mismatches: u64,
    pub(super) idle_waits: u64,
    pub(super) ops: [OpStats; OpKind::ALL.len()],
    pub(super) stalled: bool,
    pub(super) append: Histogram<u64>,
    pub(super) finished_ids: Vec<usize>,
}

impl WorkerStats {
    pub(super) fn new() -> Self {
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
    pub(super) fn call<R>(&mut self, kind: OpKind, f: impl FnOnce() -> R) -> R {
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
    pub(super) fn append<B: KvBackend>(
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
