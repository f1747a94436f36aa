//! What a run measured: the event [`Counts`] (one list, kept per worker and
//! summed), the run-wide [`RunStats`], its [`Invariants`], and the allocator
//! calls by [`OpKind`].

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::shared::CallWatch;

/// Declares [`Counts`] from one list of fields, with the sum of two.
macro_rules! counts {
    ($($(#[doc = $doc:literal])* $field:ident,)*) => {
        /// What happened in a run (or in one worker's part of it): every
        /// field is a count, reported under its own name.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
        pub struct Counts {
            $($(#[doc = $doc])* pub $field: u64,)*
        }

        impl Counts {
            /// Adds `other`'s counts to these.
            pub fn add(&mut self, other: &Counts) {
                $(self.$field += other.$field;)*
            }
        }
    };
}

counts! {
    /// Requests that completed.
    requests_completed,
    /// Requests rejected as never fitting the pool.
    requests_rejected,
    /// Groups dropped to free blocks (each requeued and recomputed).
    preemptions,
    /// Prompt tokens of admitted requests (recomputation included): the
    /// matched ones and those prefilled.
    prompt_tokens,
    /// Of those, tokens served from the prefix cache (matched blocks).
    prefix_hit_tokens,
    /// Prompt tokens appended (recomputation included).
    tokens_prefilled,
    /// Output tokens kept (recomputation included).
    tokens_decoded,
    /// Draft tokens truncated.
    tokens_rolled_back,
    /// Children forked.
    forks,
    /// Device copies made: forks of a partly filled last block, and
    /// copies on write.
    block_copies,
    /// Appends that took two or more new blocks from the pool.
    multi_block_appends,
    /// KV stamps written (one per appended token, drafts included).
    stamps_written,
    /// KV stamps read back and checked.
    stamps_read,
    /// Failures of the KV-memory oracle (wrong stamp, shadow and pool
    /// disagreeing, a table of the wrong size, two writers on a block).
    kv_failures,
    /// Completed requests whose samples did not each hold exactly their
    /// prompt and output.
    output_mismatches,
    /// Waits of a worker with nothing running whose waiting request did
    /// not fit: each waits in the allocator (the library's queue, or the
    /// baseline's condition variable) or, with `--idle-wait poll`, retries
    /// the admission, until the request is granted or the wait's time runs
    /// out.
    idle_waits,
    /// Blocking admissions granted while waiting. The prefix was given
    /// back before the wait; a sequence, plain or hybrid, matches it into
    /// its grant after.
    waited_admissions,
    /// Of the prefix hit tokens, those of admissions granted while
    /// waiting.
    waited_hit_tokens,
    /// Waited admissions whose grant the match into it left short of the
    /// blocks it reserved (the library's hybrid sequences only, when a
    /// concurrent match shares a block the match revived and let go of
    /// and the pool has no room for its place): each is topped up as an
    /// admission, or else refused.
    short_grants,
    /// Of those, the ones whose top-up was refused: the grant was given
    /// back whole and the request waits again.
    refused_short_grants,
    /// Admissions refused because the pool owed its free blocks to queued
    /// waiters (`BehindWaiters`; the library's queue only).
    refused_behind_waiters,
    /// Admissions refused for want of blocks (`Full`).
    refused_full,
    /// With `--async-depth`: block references retired under a step's fence
    /// (given back when the step completed).
    blocks_retired,
    /// With `--async-depth`: refusals resolved by waiting for the device to
    /// complete its oldest step in flight (instead of preempting).
    device_syncs,
    /// Allocator calls made.
    alloc_calls,
    /// Times a worker sampled the pool's occupancy (once a step of its
    /// running groups): the requests running at once over all workers,
    /// and the blocks in use.
    occupancy_samples,
    /// The requests running at once, summed over the samples.
    running_sum,
    /// The pool's blocks in use, summed over the samples.
    used_blocks_sum,
    /// Workers the run was given up on: stuck in an allocator call (the
    /// watchdog), or not stopping within the watchdog's time once the run
    /// was being stopped.
    stuck_calls,
    /// Worker threads that panicked.
    panics,
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
    /// What happened, summed over workers.
    pub counts: Counts,
    /// The pool's high-water mark.
    pub peak_blocks_used: usize,
    /// Time spent inside allocator calls, summed over workers (the waits
    /// of [`OpKind::Wait`] excluded).
    pub alloc_busy: Duration,
    /// From the first worker's start to the last worker's end.
    pub wall: Duration,
    /// `try_append` latencies, in nanoseconds.
    pub append_latency: Histogram<u64>,
    /// Allocator calls and their time, by kind (indexed by [`OpKind`]).
    pub ops: [OpStats; OpKind::ALL.len()],
    /// Blocks still in use after every worker finished.
    pub final_used_blocks: usize,
    /// Requests neither completed nor rejected, or finished twice.
    pub unfinished_requests: u64,
    /// A worker saw no progress for `stall_limit` iterations.
    pub stalled: bool,
    /// The most allocator calls one worker made in a row while no request
    /// finished anywhere (its calls between two completions it saw, or
    /// after the last one): a bound on the run's progress, which a
    /// livelock makes grow without bound.
    pub longest_calls_without_progress: u64,
    /// Failures, the first one first (a wrong stamp, an unexpected error,
    /// a panic, a stuck call, what the final sweep found).
    pub errors: Vec<String>,
    /// The prefix cache's counts at the end.
    pub prefix: crate::backend::PrefixCounts,
    /// Blocks holding a key at the end.
    pub cached_blocks: usize,
    /// The high-water mark of block references retired under a fence and
    /// not yet given back (`--async-depth`).
    pub pending_release_peak: usize,
    /// The most requests running at once, over all workers.
    pub running_peak: usize,
    /// The groups of layers of the run's sequences, in words (`1 full` for
    /// a plain model).
    pub layout: String,
}

/// The kinds of allocator call the engine makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Admission: `try_reserve` of the prompt's blocks into the new
    /// sequence (check-only: of its block past the prefix, the rest as
    /// headroom), failed attempts included.
    Admit,
    /// `try_append`: prefill chunks, decode tokens, speculative drafts.
    Append,
    /// `truncate` of rejected draft tokens (and of the blocks a refused
    /// admission matched).
    Truncate,
    /// `try_fork` for parallel sampling.
    Fork,
    /// Dropping a sequence (its blocks go back).
    Drop,
    /// `try_match_prefix` before admission.
    Match,
    /// `publish` of a prefilled prompt's full blocks.
    Publish,
    /// `complete` of a step's fence (`--async-depth`): the references
    /// retired under it go back. (A fenced truncate is a `Truncate`, a
    /// retired sequence a `Drop`, and handing a copy-on-write's source to
    /// the step's fence part of the `Append` that copied.)
    Complete,
    /// An idle worker's blocking admission: the `reserve_blocking` that
    /// waits in the allocator, up to the wait's timeout, and whose grant is
    /// the admission; kept apart from `Admit` so that the time asleep does
    /// not count as admission time.
    Wait,
}

impl OpKind {
    /// Every kind, in index order.
    pub const ALL: [OpKind; 9] = [
        OpKind::Admit,
        OpKind::Append,
        OpKind::Truncate,
        OpKind::Fork,
        OpKind::Drop,
        OpKind::Match,
        OpKind::Publish,
        OpKind::Complete,
        OpKind::Wait,
    ];

    /// The kind's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Admit => "admit",
            OpKind::Append => "try_append",
            OpKind::Truncate => "truncate",
            OpKind::Fork => "try_fork",
            OpKind::Drop => "drop",
            OpKind::Match => "try_match_prefix",
            OpKind::Publish => "publish",
            OpKind::Complete => "complete",
            OpKind::Wait => "wait",
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

/// Each invariant checked at the end of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Invariants {
    /// Every block is free again, and no live table or pool count holds one.
    pub pool_full_again: bool,
    /// The KV-memory oracle found nothing wrong: every stamp read back was
    /// the one its sequence wrote, the shadow of block holders matched the
    /// pool's reference counts, every table held exactly the blocks its
    /// length (and reservation) needs, and no block had two writers.
    pub kv_memory_intact: bool,
    /// Every completed request's samples each hold its prompt and output,
    /// in exactly the blocks that needs.
    pub exact_outputs: bool,
    /// Every request not rejected completed, exactly once, and nothing
    /// unexpected happened (no error, panic, stuck call or stall).
    pub all_completed: bool,
}

impl Invariants {
    /// Whether all hold.
    pub fn ok(&self) -> bool {
        self.pool_full_again && self.kv_memory_intact && self.exact_outputs && self.all_completed
    }
}

impl RunStats {
    /// The invariants.
    pub fn invariants(&self) -> Invariants {
        let c = &self.counts;
        Invariants {
            pool_full_again: self.final_used_blocks == 0,
            kv_memory_intact: c.kv_failures == 0,
            exact_outputs: c.output_mismatches == 0,
            all_completed: self.unfinished_requests == 0
                && c.requests_completed + c.requests_rejected == self.requests as u64
                && !self.stalled
                && c.stuck_calls == 0
                && c.panics == 0
                && self.errors.is_empty(),
        }
    }

    /// Allocator calls per second of wall time (all workers together).
    pub fn alloc_ops_per_sec(&self) -> f64 {
        let s = self.wall.as_secs_f64();
        if s > 0.0 {
            self.counts.alloc_calls as f64 / s
        } else {
            0.0
        }
    }
}

/// A fresh latency histogram: 1 ns to 100 s, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid histogram bounds")
}

/// One worker's counts, call times and histogram.
pub(super) struct WorkerStats {
    pub(super) counts: Counts,
    pub(super) busy_ns: u64,
    pub(super) ops: [OpStats; OpKind::ALL.len()],
    pub(super) stalled: bool,
    pub(super) longest_calls_without_progress: u64,
    pub(super) append: Histogram<u64>,
    pub(super) finished_ids: Vec<usize>,
}

impl WorkerStats {
    pub(super) fn new() -> Self {
        WorkerStats {
            counts: Counts::default(),
            busy_ns: 0,
            ops: Default::default(),
            stalled: false,
            longest_calls_without_progress: 0,
            append: new_histogram(),
            finished_ids: Vec::new(),
        }
    }

    /// Runs one allocator call, counting and timing it, and showing it to
    /// the watchdog while it runs.
    #[inline]
    pub(super) fn call<R>(
        &mut self,
        watch: (&CallWatch, Instant),
        kind: OpKind,
        f: impl FnOnce() -> R,
    ) -> R {
        let (w, origin) = watch;
        let t = Instant::now();
        w.enter(kind, (t.duration_since(origin).as_nanos() as u64).max(1));
        let r = f();
        let ns = t.elapsed().as_nanos() as u64;
        w.exit();
        if kind != OpKind::Wait {
            // Time asleep in a wait is not allocator work.
            self.busy_ns += ns;
        }
        self.counts.alloc_calls += 1;
        let o = &mut self.ops[kind as usize];
        o.calls += 1;
        o.busy_ns += ns;
        if kind == OpKind::Append {
            self.append.saturating_record(ns.max(1));
        }
        r
    }
}
