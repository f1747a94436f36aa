//! The command line: flags, sizing, workload, run(s), report, exit code.
//!
//! Exit codes: [`EXIT_OK`] (0) when every run's invariants hold,
//! [`EXIT_FAILED`] (1) when one does not, [`EXIT_BAD_INPUT`] (2) for bad
//! input (a flag's value, a malformed trace, a run too large for the host's
//! memory) before any work, or after the run for a `--plant-fault` that the
//! workload never let fire, and [`EXIT_UNWRITTEN`] (3) when every invariant
//! held but the report or the exports could not be written.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvslots::{BlockPool, Sequence};
use serde_json::json;

use crate::backend::{
    HybridKvslotsBackend, HybridMutexBackend, KvBackend, KvslotsBackend, MutexBackend,
};
use crate::baseline::MutexPool;
use crate::engine::{self, Admission, EngineConfig, IdleWait, MIX_SAMPLES};
use crate::export::{Exported, Exports, DEFAULT_EVENTS_CAPACITY};
pub use crate::fault::Fault;
use crate::fault::Faulty;
use crate::model::{layout, size_pool, Layout, ModelPreset, Sizing, GIB};
use crate::oracle::{Oracle, Tracked};
use crate::prefix::TRACE_BLOCK;
use crate::report::{table_with, Report};
use crate::workload::{
    read_trace_limited, request_bytes, synthetic_request_bytes, Request, SharedPrefixes,
    TraceLimits,
};

/// The exit code of a run whose every invariant held.
pub const EXIT_OK: i32 = 0;
/// The exit code of a run in which an invariant failed (a worker panicked,
/// an allocator call got stuck, the oracle found a wrong block): the
/// failures are named on stderr, whether or not the report was written.
pub const EXIT_FAILED: i32 = 1;
/// The exit code for bad input, before any work: a flag's value, flags
/// that contradict each other or have no effect, a malformed trace, a run
/// that would take more host memory than it may use. Also clap's code for a
/// command line it cannot parse.
pub const EXIT_BAD_INPUT: i32 = 2;
/// The exit code of a run whose every invariant held but whose report could
/// not be written (a pipe whose reader has gone, a full device), or whose exports (`--events`,
/// `--metrics`) could not (the report is written then, without them).
pub const EXIT_UNWRITTEN: i32 = 3;

/// Synthetic requests in a default run: every token of them is written to
/// and read back from the oracle's KV memory, which makes a request cost
/// about three times what the allocator calls alone cost; this many keep
/// the default run short (its time on the development machine is in
/// `BENCHMARKS.md`).
pub const DEFAULT_REQUESTS: usize = 500_000;

/// The most worker threads a run may start.
pub const MAX_WORKERS: usize = 1024;

/// The most steps `--async-depth` lets the device run behind.
pub const MAX_ASYNC_DEPTH: usize = 64;

/// The default seed.
pub const DEFAULT_SEED: u64 = 42;

/// The default probability that a draft token is accepted.
pub const DEFAULT_ACCEPT: f64 = 0.7;

/// Which allocator to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Allocator {
    /// The lock-free `kvslots::BlockPool`.
    Kvslots,
    /// A `Mutex<Vec<u32>>` free list behind the same interface.
    Mutex,
}

/// Multi-threaded LLM inference workers on one shared paged KV cache.
///
/// Sizes a block pool from a model and a memory budget, feeds it a
/// synthetic workload with shared prompt prefixes (or a trace: Azure CSV or
/// Mooncake JSONL), with prefix caching where the workload names its
/// prompts' content, runs
/// iteration-level schedulers on `--workers` threads (chunked prefill,
/// decode or speculative decode, parallel sampling, preemption), and
/// reports what happened. Exit code 0 only if every invariant holds; 1 if
/// one does not; 2 for bad input (before any work); 3 if the report could
/// not be written.
#[derive(Debug, Clone, Parser)]
#[command(name = "kvslots-sim", version, about, long_about)]
pub struct Cli {
    /// Model preset whose KV shape sizes the pool. A hybrid one
    /// (`gemma-3-27b`, `gpt-oss-20b`: sliding-window layers beside full
    /// ones; `llama-4-scout`: chunked local attention beside full) runs its sequences as one block table per group of layers,
    /// and then the same model treated as all full attention, side by
    /// side.
    #[arg(long, value_enum, default_value_t = ModelPreset::Llama3_8b)]
    pub model: ModelPreset,
    /// KV bytes per token, instead of a preset's (not with `--model`).
    #[arg(long, conflicts_with = "model", allow_negative_numbers = true)]
    pub kv_bytes_per_token: Option<u64>,
    /// KV-cache memory budget, in GiB.
    #[arg(long, default_value_t = 16.0, allow_negative_numbers = true)]
    pub memory_gib: f64,
    /// Tokens per block.
    #[arg(long, default_value_t = 16, allow_negative_numbers = true)]
    pub block_size: usize,
    /// A trace instead of the synthetic workload: an Azure CSV
    /// (`TIMESTAMP,ContextTokens,GeneratedTokens`, header required) or a
    /// Mooncake JSONL (`{"timestamp", "input_length", "output_length",
    /// "hash_ids"}` a line), told apart by the extension (`.csv`; `.jsonl`
    /// or `.json`), else by the content (JSONL starts with `{`).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Turn prefix caching off (it is on for every workload that names its
    /// prompts' content: a JSONL trace's `hash_ids`, the synthetic
    /// workload's shared prefixes).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Requests to run: synthetic ones to draw (default 500000), or the
    /// first N of the trace (default: all of it; the lines after the Nth
    /// request are not read).
    #[arg(long, allow_negative_numbers = true)]
    pub requests: Option<usize>,
    /// Seed for the synthetic workload, the default mix's draws and the
    /// acceptance draws (default 42; refused where nothing is drawn: a
    /// trace run without the mix or draft tokens).
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Worker threads (default: available parallelism, at least 4).
    #[arg(long, allow_negative_numbers = true)]
    pub workers: Option<usize>,
    /// Blocks that admission keeps free for running sequences to grow
    /// (default: 1% of the blocks).
    #[arg(long, allow_negative_numbers = true)]
    pub watermark: Option<usize>,
    /// Prefill chunk, in tokens.
    #[arg(long, default_value_t = 512, allow_negative_numbers = true)]
    pub chunk: usize,
    /// Speculative decoding: K draft tokens per step (0: off). Giving
    /// `--spec`, `--samples` or `--admission` runs every request the same
    /// way instead of the default mix.
    #[arg(long, value_name = "K", allow_negative_numbers = true)]
    pub spec: Option<usize>,
    /// Probability that a draft token is accepted (default 0.7; only with
    /// draft tokens: `--spec` above 0, or the default mix).
    #[arg(long, allow_negative_numbers = true)]
    pub accept: Option<f64>,
    /// Samples per request: forks N-1 children after prefill (default 1).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub samples: Option<usize>,
    /// How a waiting request is admitted: reserve its whole prompt's blocks
    /// (with the watermark's headroom) in one allocation, or check that they
    /// are free and take only the one past its cached prefix (default:
    /// reserve).
    #[arg(long, value_enum)]
    pub admission: Option<Admission>,
    /// How a worker with nothing running waits for a request that does not
    /// fit: in the allocator (kvslots' FIFO queue, the baseline's condition
    /// variable), or by retrying its admission every 100 µs on both.
    #[arg(long, value_enum, default_value_t = IdleWait::Queue)]
    pub idle_wait: IdleWait,
    /// Most requests one worker runs at once.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    pub max_running: usize,
    /// Free-list shards of the kvslots pool (default: what
    /// `BlockPool::new` picks, one per 64 blocks up to 16; 1 is a single
    /// shard). Not with `--allocator mutex`, which has no shards.
    #[arg(
        long,
        value_parser = clap::value_parser!(u16).range(1..=1024),
        allow_negative_numbers = true
    )]
    pub shards: Option<u16>,
    /// The allocator to run (not with `--compare`, which runs both).
    #[arg(long, value_enum, default_value_t = Allocator::Kvslots, conflicts_with = "compare")]
    pub allocator: Allocator,
    /// Run kvslots and then the mutex baseline on the same workload and
    /// print them side by side.
    #[arg(long)]
    pub compare: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Plant a fault in the backend (the check of the checker): the run
    /// must fail, naming it (exit 2 if the workload never let it fire).
    #[arg(long, value_enum, value_name = "KIND")]
    pub plant_fault: Option<Fault>,
    /// Asynchronous scheduling: the device runs K steps behind the
    /// scheduler, so the blocks a step gives back (preemption, rejected
    /// drafts, completion) are retired under the step's fence and go back
    /// when the step completes, K steps later (0: at once).
    #[arg(
        long,
        value_name = "K",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub async_depth: usize,
    /// The livelock watchdog: an allocator call running this long ends the
    /// run as stuck. An idle worker's blocking wait lasts up to 0.5 ms by
    /// design, and a call whose thread the OS preempts lasts a time slice
    /// or more: a limit of a few ms reports such calls as stuck.
    #[arg(
        long,
        default_value_t = 10_000,
        value_name = "MS",
        allow_negative_numbers = true
    )]
    pub stuck_after_ms: u64,
    /// The host memory the run may use, in GiB (default: what the system
    /// has available, `MemAvailable` in `/proc/meminfo`). A run whose
    /// estimate (the pool's bookkeeping, the simulated KV memory, the
    /// requests, the running requests' samples) is larger is refused before
    /// any work.
    #[arg(long, value_name = "GIB", allow_negative_numbers = true)]
    pub host_memory_gib: Option<f64>,
    /// Write the kvslots pool's KV events to FILE, as JSON lines (one batch
    /// a line: `seq`, `ts`, `events` in vLLM's shapes; see sim/README.md),
    /// drained every 2 ms. Needs prefix caching on a workload that names
    /// its prompts' content; with `--compare`, of the kvslots run; of a
    /// hybrid `--model`, of its hybrid run (keys per group); not with
    /// `--allocator mutex`.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,
    /// Records in the kvslots pool's KV event rings, 128 bytes each
    /// (default 65536; only with `--events`). Events that find them full
    /// are lost and counted (`Dropped`).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub events_capacity: Option<usize>,
    /// Write the kvslots pool's metrics to FILE as Prometheus text
    /// (OpenMetrics, `kvslots_*` series), every second and at the end. With
    /// `--compare`, of the kvslots run; of a hybrid `--model`, of its hybrid
    /// run; not with `--allocator mutex`.
    #[arg(long, value_name = "FILE")]
    pub metrics: Option<PathBuf>,
}

/// A bad flag value or input file: exit code 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputError(pub String);

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InputError {}

/// A hybrid model's run: its layout, and the same model as all full
/// attention to run it against.
#[derive(Debug, Clone)]
pub struct HybridPlan {
    /// The groups of layers (vLLM's grouping).
    pub layout: Layout,
    /// The pool's sizing when every layer is treated as full attention
    /// (one table a sequence, every layer in a block).
    pub all_full: Sizing,
}

/// Everything a run needs, checked.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The pool's sizing (of a hybrid model: a block holds one group's
    /// layers).
    pub sizing: Sizing,
    /// A hybrid model's layout and its all-full-attention twin.
    pub hybrid: Option<HybridPlan>,
    /// The requests.
    pub requests: Vec<Request>,
    /// Where they came from, for the report.
    pub workload: String,
    /// The scheduler's settings.
    pub engine: EngineConfig,
    /// Free-list shards of the kvslots pool.
    pub shards: usize,
    /// Records in the kvslots pool's KV event rings, with `--events`.
    pub events_capacity: Option<usize>,
    /// The files the kvslots run exports to.
    pub exports: Exports,
}

/// The default worker count: available parallelism, at least 4.
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .max(4)
}

/// The host memory a run may use, and where that figure comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostMemory {
    /// The bytes (never above `isize::MAX`, the most one allocation can
    /// take).
    pub bytes: usize,
    /// `--host-memory-gib`, if it was given; else the system's figure.
    pub from_flag: bool,
}

impl HostMemory {
    /// `--host-memory-gib` if given (checked), else what the system has
    /// available ([`available_memory`]), else no limit but `isize::MAX`.
    pub fn of(flag: Option<f64>) -> Result<HostMemory, InputError> {
        let most = isize::MAX as usize;
        match flag {
            Some(gib) if !gib.is_finite() || gib <= 0.0 => Err(InputError(format!(
                "--host-memory-gib must be a finite number of GiB above 0, got {gib}"
            ))),
            Some(gib) => Ok(HostMemory {
                // `as` saturates for floats.
                bytes: ((gib * GIB) as u64).min(most as u64) as usize,
                from_flag: true,
            }),
            None => Ok(HostMemory {
                bytes: available_memory().map_or(most, |b| b.min(most as u64) as usize),
                from_flag: false,
            }),
        }
    }

    /// The budget in words, for a refusal.
    fn words(&self) -> String {
        let size = gib(self.bytes);
        if self.from_flag {
            format!("{size} of --host-memory-gib")
        } else {
            format!(
                "{size} of host memory available (MemAvailable; --host-memory-gib sets \
                 another budget)"
            )
        }
    }
}

/// What the system has available for a new process, in bytes:
/// `MemAvailable` in `/proc/meminfo` (Linux), or `None` where it cannot be
/// read.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line
        .trim_start_matches("MemAvailable:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib.saturating_mul(1024))
}

/// About the host memory one running sample takes beyond its block table:
/// its sequence (the same type over either allocator), the oracle's record
/// and its output count.
fn sample_bytes() -> usize {
    std::mem::size_of::<Sequence>()
        + std::mem::size_of::<Tracked<kvslots::BlockId>>()
        + std::mem::size_of::<usize>()
}

/// A size for messages: in GiB, or in MiB or bytes where it is too small
/// to show as a hundredth of a GiB (a budget of a few MiB is not "0.00
/// GiB").
fn gib(bytes: usize) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let b = bytes as f64;
    if b >= GIB / 100.0 {
        format!("{:.2} GiB", b / GIB)
    } else if b >= MIB / 100.0 {
        format!("{:.2} MiB", b / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

impl Cli {
    /// The allocators the run uses, in order.
    pub fn allocators(&self) -> Vec<Allocator> {
        if self.compare {
            vec![Allocator::Kvslots, Allocator::Mutex]
        } else {
            vec![self.allocator]
        }
    }

    /// The flags that size the pool, in words for a message.
    fn sizing_flags(&self) -> &'static str {
        "lower --memory-gib, or raise --block-size or --kv-bytes-per-token"
    }

    /// Checks the flags, sizes the pool and loads or draws the requests,
    /// within the host memory the run may use.
    pub fn plan(&self) -> Result<Plan, InputError> {
        let kinds = self
            .kv_bytes_per_token
            .is_none()
            .then(|| self.model.layer_kinds())
            .flatten();
        let layout = kinds.as_deref().map(layout);
        let (model, bpt) = match (self.kv_bytes_per_token, &layout) {
            (Some(b), _) => ("custom".to_string(), b),
            (None, None) => (
                self.model.name().to_string(),
                self.model.shape().kv_bytes_per_token(),
            ),
            (None, Some(l)) => {
                // A block holds one group's layers.
                let mut group = self.model.shape();
                group.layers = l.layers_per_group;
                (
                    format!(
                        "{} ({}, {} layers a group)",
                        self.model.name(),
                        engine::layout_words(&l.groups),
                        l.layers_per_group
                    ),
                    group.kv_bytes_per_token(),
                )
            }
        };
        let sizing = size_pool(&model, bpt, self.memory_gib, self.block_size)
            .map_err(|e| InputError(e.to_string()))?;
        let hybrid = match layout {
            Some(layout) => {
                let name = format!("{} (all full attention)", self.model.name());
                let bpt = self.model.shape().kv_bytes_per_token();
                let all_full = size_pool(&name, bpt, self.memory_gib, self.block_size)
                    .map_err(|e| InputError(e.to_string()))?;
                Some(HybridPlan { layout, all_full })
            }
            None => None,
        };
        let workers = self.workers.unwrap_or_else(default_workers);
        if !(1..=MAX_WORKERS).contains(&workers) {
            return Err(InputError(format!(
                "--workers must be between 1 and {MAX_WORKERS}, got {workers}"
            )));
        }
        if self.requests == Some(0) {
            return Err(InputError("--requests must be at least 1".into()));
        }
        if self.chunk == 0 {
            return Err(InputError("--chunk must be at least 1".into()));
        }
        if self.samples == Some(0) {
            return Err(InputError("--samples must be at least 1".into()));
        }
        if self.max_running == 0 {
            return Err(InputError("--max-running must be at least 1".into()));
        }
        let accept = self.accept.unwrap_or(DEFAULT_ACCEPT);
        if !(0.0..=1.0).contains(&accept) {
            return Err(InputError(format!(
                "--accept must be a probability in [0, 1], got {accept}"
            )));
        }
        let mix = self.spec.is_none() && self.samples.is_none() && self.admission.is_none();
        // Draft tokens or the default mix: what `--accept` and `--seed` act on.
        let draws = mix || self.spec.unwrap_or(0) > 0;
        if self.accept.is_some() && !draws {
            return Err(InputError(format!(
                "--accept {accept} has no effect without draft tokens: give --spec K (K above 0), \
                 or leave out --spec, --samples and --admission for the default mix"
            )));
        }
        if let (Some(seed), Some(_), false) = (self.seed, &self.trace, draws) {
            return Err(InputError(format!(
                "--seed {seed} has no effect: the trace fixes the requests, and without draft \
                 tokens or the default mix nothing is drawn: leave it out, give --spec K (K \
                 above 0), or leave out --spec, --samples and --admission for the default mix"
            )));
        }
        let seed = self.seed.unwrap_or(DEFAULT_SEED);
        if let (Some(shards), false, Allocator::Mutex) = (self.shards, self.compare, self.allocator)
        {
            return Err(InputError(format!(
                "--shards {shards} has no effect with --allocator mutex (the mutex baseline has \
                 no shards): leave it out, or use --compare"
            )));
        }
        if self.stuck_after_ms == 0 {
            return Err(InputError("--stuck-after-ms must be at least 1".into()));
        }
        if self.async_depth > MAX_ASYNC_DEPTH {
            return Err(InputError(format!(
                "--async-depth must be at most {MAX_ASYNC_DEPTH}, got {}",
                self.async_depth
            )));
        }
        if let Some(f) = self.plant_fault.filter(|f| f.needs_async()) {
            if self.async_depth == 0 {
                return Err(InputError(format!(
                    "--plant-fault {} needs fenced release: give --async-depth 1 or more",
                    f.name()
                )));
            }
        }
        if let Some(f) = self.plant_fault.filter(|f| f.needs_drafts()) {
            if !draws {
                return Err(InputError(format!(
                    "--plant-fault {} fires at the rollback of rejected drafts: give --spec K \
                     (K above 0), or leave out --spec, --samples and --admission for the \
                     default mix",
                    f.name()
                )));
            }
        }
        if self.allocator == Allocator::Mutex && !self.compare {
            for (flag, given) in [
                ("--events", self.events.is_some()),
                ("--metrics", self.metrics.is_some()),
            ] {
                if given {
                    return Err(InputError(format!(
                        "{flag} exports the kvslots pool's, and --allocator mutex runs none: \
                         leave it out, or use --compare"
                    )));
                }
            }
        }
        let events_capacity = match (&self.events, self.events_capacity) {
            (None, Some(n)) => {
                return Err(InputError(format!(
                    "--events-capacity {n} has no effect without --events FILE"
                )))
            }
            (Some(_), Some(0)) => {
                return Err(InputError("--events-capacity must be at least 1".into()))
            }
            (Some(_), n) => Some(n.unwrap_or(DEFAULT_EVENTS_CAPACITY)),
            (None, None) => None,
        };
        if self.events.is_some() && self.no_prefix_cache {
            return Err(InputError(
                "--events reports the prefix cache's changes, and --no-prefix-cache turns it off"
                    .into(),
            ));
        }
        let host = HostMemory::of(self.host_memory_gib)?;
        let shards = self
            .shards
            .map_or_else(|| BlockPool::default_shards(sizing.num_blocks), usize::from);
        // The pool and the simulated KV memory, first: they depend on the
        // sizing flags alone.
        // The hybrid pool has the more blocks of the two.
        let (nb, bs) = (sizing.num_blocks, sizing.block_size);
        let pool = self
            .allocators()
            .into_iter()
            .map(|a| match a {
                Allocator::Kvslots => {
                    let builder = BlockPool::builder(nb, bs)
                        .shards(shards)
                        .prefix_cache(!self.no_prefix_cache);
                    match events_capacity {
                        Some(n) => builder.kv_events(n),
                        None => builder,
                    }
                    .memory_bytes()
                }
                Allocator::Mutex => MutexPool::memory_bytes(nb),
            })
            .max()
            .unwrap_or(0)
            .saturating_add(Oracle::memory_bytes(nb, bs));
        // The KV event rings, sized by their own flag.
        if let Some(n) = events_capacity {
            let without = BlockPool::builder(nb, bs).shards(shards).prefix_cache(true);
            let rings = without
                .clone()
                .kv_events(n)
                .memory_bytes()
                .saturating_sub(without.memory_bytes());
            if rings > host.bytes / 2 {
                return Err(InputError(format!(
                    "--events-capacity {n}: the KV event rings take about {} of host memory \
                     (128 bytes a record), more than half the {}: lower --events-capacity",
                    gib(rings),
                    host.words()
                )));
            }
        }
        if pool > host.bytes {
            return Err(InputError(format!(
                "a pool of {nb} blocks of {bs} tokens (--memory-gib {} at {bpt} bytes a token) \
                 takes about {} of host memory to simulate (the KV memory the oracle mirrors, 8 \
                 bytes a token slot, and the allocator's bookkeeping), more than the {}: {}",
                self.memory_gib,
                gib(pool),
                host.words(),
                self.sizing_flags()
            )));
        }
        let mut left = host.bytes - pool;
        let watermark_blocks = self.watermark.unwrap_or(sizing.num_blocks / 100);
        check_pool(&sizing, watermark_blocks)?;
        if let Some(h) = &hybrid {
            check_pool(&h.all_full, watermark_blocks)?;
        }
        let prefix_cache = !self.no_prefix_cache;
        // The synthetic workload names every prompt's content.
        if self.trace.is_none() && prefix_cache {
            self.check_prefix_block_size()?;
        }
        let (requests, workload) = match &self.trace {
            Some(path) => {
                let limits = TraceLimits {
                    requests: self.requests.unwrap_or(usize::MAX),
                    bytes: left,
                };
                let all = read_trace_limited(path, limits)
                    .map_err(|e| InputError(format!("--trace {}: {e}", path.display())))?;
                let n = all.len();
                (all, format!("trace {} ({n} requests)", path.display()))
            }
            None => {
                let n = self.requests.unwrap_or(DEFAULT_REQUESTS);
                let shape = SharedPrefixes::default();
                let each = synthetic_request_bytes(&shape);
                if n.saturating_mul(each) > left {
                    return Err(InputError(format!(
                        "--requests {n}: that many synthetic requests take about {} of host \
                         memory ({each} bytes each at most), more than the {} left of the {} \
                         beside the pool: give fewer",
                        gib(n.saturating_mul(each)),
                        gib(left),
                        host.words()
                    )));
                }
                (
                    shape.generate(n, seed),
                    format!(
                        "synthetic log-normal with shared prefixes, {n} requests, seed {}",
                        seed
                    ),
                )
            }
        };
        left -= requests
            .iter()
            .map(request_bytes)
            .fold(0, usize::saturating_add)
            .min(left);
        let keyed = requests.iter().any(|r| r.hash_ids.is_some());
        if prefix_cache && keyed {
            self.check_prefix_block_size()?;
        }
        if let (Some(path), false, true) = (&self.trace, keyed, self.events.is_some()) {
            return Err(InputError(format!(
                "--events reports the prefix cache's changes, and --trace {} names no prompt \
                 content to cache (no hash_ids): use a Mooncake JSONL trace",
                path.display()
            )));
        }
        let mut engine = EngineConfig {
            admission: self.admission.unwrap_or(Admission::Reserve),
            workers,
            watermark_blocks,
            idle_wait: self.idle_wait,
            chunk: self.chunk,
            spec: self.spec.unwrap_or(0),
            accept,
            samples: self.samples.unwrap_or(1),
            max_running: self.max_running,
            seed,
            mix,
            // On for a workload that names its prompts' content (as `--help`
            // says); a trace without it has nothing to cache.
            prefix_cache: prefix_cache && keyed,
            async_depth: self.async_depth,
            stuck_after: std::time::Duration::from_millis(self.stuck_after_ms),
            // A hybrid model's windows give prompt blocks back between
            // chunks: both of its runs publish every chunk.
            publish_chunks: hybrid.is_some(),
            groups: hybrid.as_ref().map_or_else(
                || EngineConfig::default().groups,
                |h| h.layout.groups.clone(),
            ),
            ..EngineConfig::default()
        };
        engine.stall_limit = stall_limit(&sizing, &engine, &requests);
        check_runnable(&sizing, &engine, &requests)?;
        if let Some(h) = &hybrid {
            check_runnable(&h.all_full, &all_full_engine(&engine), &requests)?;
        }
        self.check_samples_fit(&engine, &sizing, &requests, left, &host)?;
        let (events, metrics) = self.check_exports()?;
        Ok(Plan {
            engine,
            shards,
            sizing,
            hybrid,
            requests,
            workload,
            events_capacity,
            exports: Exports { events, metrics },
        })
    }

    /// The export files, checked last, once everything else is accepted:
    /// each is opened for writing (created if missing, not emptied yet), so
    /// that one that cannot be written is refused before any work. The
    /// metrics file is replaced whole at each write (a file beside it,
    /// renamed over it), so it must be a regular file, and is returned as
    /// the file a link names (the rename replaces that file, not the
    /// link). No export may be the trace or the other export, by path or
    /// as the same file (a hard link): the events file is emptied before
    /// the run, and each would overwrite the other. Nor may the file the
    /// metrics are written through (`FILE.tmp`, renamed over `FILE`) be
    /// one of them, and it must be creatable (or writable) now.
    fn check_exports(&self) -> Result<(Option<PathBuf>, Option<PathBuf>), InputError> {
        let mut seen: Vec<(&str, PathBuf, Option<FileId>)> = Vec::new();
        let find = |seen: &[(&'static str, PathBuf, Option<FileId>)], real: &Path| {
            let id = file_id(real);
            seen.iter()
                .find(|(_, p, i)| p == real || (id.is_some() && *i == id))
                .map(|(flag, _, _)| *flag)
        };
        if let Some(trace) = &self.trace {
            if let Ok(real) = std::fs::canonicalize(trace) {
                let id = file_id(&real);
                seen.push(("--trace", real, id));
            }
        }
        let mut real_paths = [None, None];
        for (i, (flag, path)) in [("--events", &self.events), ("--metrics", &self.metrics)]
            .into_iter()
            .enumerate()
        {
            let Some(path) = path else { continue };
            let shown = path.display();
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| InputError(format!("{flag} {shown}: {e}")))?;
            if flag == "--metrics" && !file.metadata().is_ok_and(|m| m.is_file()) {
                return Err(InputError(format!(
                    "--metrics {shown}: not a regular file (the metrics file is replaced whole \
                     at each write): name a file"
                )));
            }
            let real = std::fs::canonicalize(path)
                .map_err(|e| InputError(format!("{flag} {shown}: {e}")))?;
            if let Some(other) = find(&seen, &real) {
                return Err(InputError(format!(
                    "{flag} {shown} is the file {other} names: give {flag} a file of its own"
                )));
            }
            let id = file_id(&real);
            seen.push((flag, real.clone(), id));
            // The events file is written through its path (a device or a
            // pipe is fine); the metrics file is renamed over, at the
            // path a link names.
            let link = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_symlink());
            let target = if flag == "--metrics" && link {
                real
            } else {
                path.clone()
            };
            if flag == "--metrics" {
                check_metrics_tmp(&target, &seen, find)?;
            }
            real_paths[i] = Some(target);
        }
        let [events, metrics] = real_paths;
        Ok((events, metrics))
    }

    /// Refuses a block size that does not cut the trace's 512-token blocks
    /// evenly, for a workload whose prompts' content the cache keys.
    fn check_prefix_block_size(&self) -> Result<(), InputError> {
        if TRACE_BLOCK.is_multiple_of(self.block_size) {
            return Ok(());
        }
        Err(InputError(format!(
            "--block-size {} does not divide the {TRACE_BLOCK}-token blocks the workload's \
             prompt content is named by: prefix caching needs a block size that does \
             (or --no-prefix-cache)",
            self.block_size
        )))
    }

    /// Refuses a run whose running requests' samples could take more than
    /// `left` bytes: at most `workers * max_running` requests run at once
    /// (and no more than there are, or than the pool has blocks), each with
    /// its samples, and each sample with a block table of up to the blocks
    /// its request needs.
    fn check_samples_fit(
        &self,
        engine: &EngineConfig,
        sizing: &Sizing,
        requests: &[Request],
        left: usize,
        host: &HostMemory,
    ) -> Result<(), InputError> {
        let (nb, bs) = (sizing.num_blocks, sizing.block_size);
        let samples = if engine.mix {
            MIX_SAMPLES
        } else {
            engine.samples
        };
        let running = engine
            .workers
            .saturating_mul(engine.max_running)
            .min(requests.len())
            .min(nb);
        let entries = requests
            .iter()
            .map(|r| r.prompt.saturating_add(r.output).div_ceil(bs))
            .max()
            .unwrap_or(0)
            .min(nb)
            + 1;
        // Each sample's tables (one per group), in its sequence and in the
        // oracle's record.
        let each = sample_bytes()
            .saturating_add(entries.saturating_mul(8))
            .saturating_mul(engine.groups.len());
        let bytes = running.saturating_mul(samples).saturating_mul(each);
        if bytes > left {
            return Err(InputError(format!(
                "--samples {samples}: up to {running} requests running at once (--workers {} x \
                 --max-running {}) of {samples} samples each take about {} of host memory, more \
                 than the {} left of the {} beside the pool and the requests: lower --samples \
                 (or --workers, --max-running)",
                engine.workers,
                engine.max_running,
                gib(bytes),
                gib(left),
                host.words()
            )));
        }
        Ok(())
    }
}

/// The engine's settings for the all-full-attention twin of a hybrid run:
/// the same, with one full group.
/// The stall guard's limit for `requests`: the engine's default, or twice
/// the tokens of the longest request that can run in the pool (prompt and
/// output) if that is more. A worker may step through a request one
/// iteration a token, so a long request's own steps between two finished
/// requests are not taken for a livelock; a request that never fits is
/// refused without a step, and does not lift the limit.
fn stall_limit(sizing: &Sizing, engine: &EngineConfig, requests: &[Request]) -> u64 {
    let (nb, bs) = (sizing.num_blocks, sizing.block_size);
    let longest = requests
        .iter()
        .filter(|r| !engine::never_fits(r, &engine.profile(r.id, bs), engine, nb, bs))
        .map(|r| r.prompt.saturating_add(r.output) as u64)
        .max()
        .unwrap_or(0);
    EngineConfig::default()
        .stall_limit
        .max(longest.saturating_mul(2))
}

/// A file's identity (its device and inode on Unix), so that two paths
/// naming one file (hard links) are caught as the same; `None` where the
/// platform gives none (paths are then compared alone).
type FileId = (u64, u64);

fn file_id(path: &Path) -> Option<FileId> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// Checks the file the metrics are written through, `FILE.tmp` beside the
/// metrics file `target` (see `export::write_whole`): not a file that
/// `seen` holds (the trace or the events file), a regular file if it is
/// there (a pipe would block the write, a link would be written through),
/// and creatable (or writable) now. A probe that creates it removes it
/// again.
fn check_metrics_tmp(
    target: &Path,
    seen: &[(&'static str, PathBuf, Option<FileId>)],
    find: impl Fn(&[(&'static str, PathBuf, Option<FileId>)], &Path) -> Option<&'static str>,
) -> Result<(), InputError> {
    let tmp = crate::export::tmp_path(target);
    let shown = tmp.display();
    let meta = std::fs::symlink_metadata(&tmp).ok();
    let existed = meta.is_some();
    if let Some(meta) = meta {
        if let Some(other) = std::fs::canonicalize(&tmp)
            .ok()
            .and_then(|real| find(seen, &real))
        {
            return Err(InputError(format!(
                "--metrics {}: the metrics are written through {shown}, the file {other} \
                 names: give --metrics another file",
                target.display()
            )));
        }
        if !meta.is_file() {
            return Err(InputError(format!(
                "--metrics {}: the metrics are written through {shown}, which is there and \
                 not a regular file: remove it, or give --metrics another file",
                target.display()
            )));
        }
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&tmp)
        .map_err(|e| {
            InputError(format!(
                "--metrics {}: the metrics are written through {shown}, which cannot be \
                 written: {e}",
                target.display()
            ))
        })?;
    if !existed {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok(())
}

fn all_full_engine(hybrid: &EngineConfig) -> EngineConfig {
    EngineConfig {
        groups: EngineConfig::default().groups,
        ..hybrid.clone()
    }
}

/// Refuses a pool in which no request can ever run: no block, or a
/// watermark that leaves no block to admit into.
fn check_pool(sizing: &Sizing, watermark_blocks: usize) -> Result<(), InputError> {
    let nb = sizing.num_blocks;
    if nb == 0 {
        return Err(InputError(format!(
            "the pool has no block ({} GiB at {} bytes a token, {} tokens a block): no request \
             can run; raise --memory-gib, or lower --block-size or --kv-bytes-per-token",
            sizing.memory_bytes as f64 / GIB,
            sizing.kv_bytes_per_token,
            sizing.block_size
        )));
    }
    if watermark_blocks >= nb {
        return Err(InputError(format!(
            "--watermark {watermark_blocks} keeps every one of the pool's {nb} blocks free: no \
             request can be admitted"
        )));
    }
    Ok(())
}

/// Refuses a workload of which no request can ever run in the pool: every
/// request too large for it.
fn check_runnable(
    sizing: &Sizing,
    engine: &EngineConfig,
    requests: &[Request],
) -> Result<(), InputError> {
    let (nb, bs) = (sizing.num_blocks, sizing.block_size);
    let runs = |r: &Request| {
        let profile = engine.profile(r.id, bs);
        !engine::never_fits(r, &profile, engine, nb, bs)
    };
    if !requests.iter().any(runs) {
        return Err(InputError(format!(
            "no request of the workload can ever run in a pool of {nb} blocks of {bs} tokens \
             with a watermark of {} blocks (with its samples, {}): raise --memory-gib, or lower \
             --watermark or --samples",
            engine.watermark_blocks,
            if engine.mix {
                format!("up to {MIX_SAMPLES} in the default mix")
            } else {
                engine.samples.to_string()
            }
        )));
    }
    Ok(())
}

fn progress_bar(len: usize, label: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(len as u64), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{prefix:>8} [{elapsed_precise}] {bar:40} {human_pos}/{human_len} requests (eta {eta})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    pb.set_style(style);
    pb.set_prefix(label.to_string());
    pb
}

fn run_one<B: KvBackend>(
    backend: &B,
    oracle: Oracle,
    requests: &[Request],
    engine: &EngineConfig,
    fault: Option<Fault>,
) -> Report {
    let pb = progress_bar(requests.len(), backend.name());
    let (stats, unfired) = match fault {
        None => (
            engine::run_with_oracle(backend, oracle, requests, engine, Some(&pb)),
            None,
        ),
        Some(f) => {
            let faulty = Faulty::new(backend.clone(), f);
            let stats = engine::run_with_oracle(&faulty, oracle, requests, engine, Some(&pb));
            (stats, (!faulty.fired()).then(|| (f, faulty.occasions())))
        }
    };
    pb.finish_and_clear();
    Report {
        unfired_fault: unfired,
        ..Report::new(&stats)
    }
}

/// Runs `run`, with `exports` (if any) written from `pool` beside it;
/// returns its report and what was exported (`None` without exports).
fn exporting(
    exports: Option<&Exports>,
    pool: &Arc<BlockPool>,
    run: impl FnOnce() -> Report,
) -> (Report, Option<std::io::Result<Exported>>) {
    match exports {
        Some(x) => {
            let (report, done) = x.around(pool, run);
            (report, Some(done))
        }
        None => (run(), None),
    }
}

fn sizing_lines(plan: &Plan) -> String {
    match &plan.hybrid {
        None => sizing_line(&plan.sizing),
        Some(h) => format!(
            "{}\n{} ({} layers of padding in the groups)\nall full: {}",
            sizing_line(&plan.sizing),
            "hybrid: one block table per group, a block is one group's layers",
            h.layout.padding_layers,
            sizing_line(&h.all_full)
        ),
    }
}

fn sizing_line(s: &Sizing) -> String {
    format!(
        "pool: {} KV {} bytes/token x block {} tokens = {:.2} MiB/block; {:.2} GiB -> {} blocks",
        s.model,
        s.kv_bytes_per_token,
        s.block_size,
        s.bytes_per_block as f64 / (1u64 << 20) as f64,
        s.memory_bytes as f64 / crate::model::GIB,
        s.num_blocks
    )
}

/// How requests are run, in words.
fn profile_words(e: &EngineConfig, block_size: usize) -> String {
    if e.mix {
        let spec = e.profile_spec(block_size);
        return format!(
            "mix: 50% plain, 20% {spec} drafts (accept {}), 15% {MIX_SAMPLES} samples, 15% check-only admission",
            e.accept
        );
    }
    let spec = if e.spec == 0 {
        "off".to_string()
    } else {
        format!("{} drafts, accept {}", e.spec, e.accept)
    };
    format!(
        "admission {}, spec {spec}, samples {}",
        e.admission, e.samples
    )
}

fn settings_line(plan: &Plan) -> String {
    let e = &plan.engine;
    format!(
        "workload: {}; {} workers, {}, prefix cache {}, async depth {}, watermark {} blocks, idle wait {}, chunk {}, max running {}; kvslots free list: {} shards",
        plan.workload,
        e.workers,
        profile_words(e, plan.sizing.block_size),
        if e.prefix_cache { "on" } else { "off" },
        e.async_depth,
        e.watermark_blocks,
        e.idle_wait,
        e.chunk,
        e.max_running,
        plan.shards
    )
}

/// What the kvslots run exported, in words (a line of its own; of a
/// hybrid model, its hybrid run's).
fn exports_line(exports: &Exports, e: &Exported, hybrid: bool) -> String {
    let mut parts = Vec::new();
    if let Some(path) = &exports.events {
        parts.push(format!(
            "{} KV event batches ({} events, {} lost to full rings) to {}",
            e.event_batches,
            e.events,
            e.events_dropped,
            path.display()
        ));
    }
    if let Some(path) = &exports.metrics {
        parts.push(format!(
            "metrics written {} times to {}",
            e.metrics_writes,
            path.display()
        ));
    }
    let of = if hybrid { " (the hybrid run's)" } else { "" };
    format!("\nexports{of}: {}", parts.join("; "))
}

fn settings_json(plan: &Plan) -> serde_json::Value {
    let e = &plan.engine;
    json!({
        "shards": plan.shards,
        "admission": e.admission,
        "workers": e.workers,
        "watermark_blocks": e.watermark_blocks,
        "idle_wait": e.idle_wait,
        "chunk": e.chunk,
        "spec": e.spec,
        "accept": e.accept,
        "samples": e.samples,
        "max_running": e.max_running,
        "seed": e.seed,
        "mix": e.mix,
        "prefix_cache": e.prefix_cache,
        "async_depth": e.async_depth,
        "profiles": profile_words(e, plan.sizing.block_size),
        "stuck_after_ms": e.stuck_after.as_millis() as u64,
        "events_capacity": plan.events_capacity,
    })
}

/// Parses `args` (the program's name first) and runs them: what the
/// binary does, with its output to `out` and its messages to `err`, and
/// the exit code returned. A command line clap cannot parse gets clap's
/// message and code ([`EXIT_BAD_INPUT`]; 0 for `--help` and `--version`,
/// which print to `out`).
pub fn main_with<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    match Cli::try_parse_from(args) {
        Ok(cli) => run(&cli, out, err),
        Err(e) => {
            let text = e.render().to_string();
            // Nothing else to tell if even this cannot be written.
            let _ = if e.use_stderr() {
                err.write_all(text.as_bytes())
            } else {
                out.write_all(text.as_bytes())
            };
            e.exit_code()
        }
    }
}

/// A pool or an oracle the allocator refused, though the estimate let the
/// run through: bad input all the same.
fn refused(err: &mut dyn Write, cli: &Cli, what: &str, e: &dyn std::fmt::Display) -> i32 {
    let _ = writeln!(
        err,
        "kvslots-sim: error: cannot allocate {what}: {e}; {}",
        cli.sizing_flags()
    );
    EXIT_BAD_INPUT
}

/// Runs the command line and returns the process's exit code ([`EXIT_OK`],
/// [`EXIT_FAILED`], [`EXIT_BAD_INPUT`] or [`EXIT_UNWRITTEN`]). The report
/// goes to `out`, errors to `err`.
pub fn run(cli: &Cli, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let plan = match cli.plan() {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(err, "kvslots-sim: error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    // The runs: the model as given; for a hybrid model, then the same
    // model as all full attention.
    let mut layouts = vec![(&plan.sizing, plan.engine.clone(), plan.hybrid.is_some())];
    if let Some(h) = &plan.hybrid {
        layouts.push((&h.all_full, all_full_engine(&plan.engine), false));
    }
    let mut reports = Vec::new();
    let mut exported: Option<std::io::Result<Exported>> = None;
    for (i, (sizing, engine, hybrid)) in layouts.iter().enumerate() {
        let (nb, bs) = (sizing.num_blocks, sizing.block_size);
        let groups = engine.groups.clone();
        for a in cli.allocators() {
            let oracle = match Oracle::try_new(nb, bs) {
                Ok(o) => o,
                Err(e) => return refused(err, cli, "the simulated KV memory", &e),
            };
            let (reqs, fault) = (&plan.requests, cli.plant_fault);
            let report = match a {
                // The kvslots pool has the prefix cache only when the run
                // uses it, and KV events only with `--events`; the exports
                // are of the first layout's run (a hybrid model as given,
                // not its all-full twin).
                Allocator::Kvslots => {
                    let exports = (i == 0 && plan.exports.any()).then_some(&plan.exports);
                    let builder = BlockPool::builder(nb, bs)
                        .shards(plan.shards)
                        .prefix_cache(engine.prefix_cache);
                    let builder = match plan.events_capacity {
                        Some(n) if i == 0 => builder.kv_events(n),
                        _ => builder,
                    };
                    let (report, done) = match builder.build() {
                        Ok(p) if *hybrid => {
                            let b = HybridKvslotsBackend::hybrid(p, groups.clone());
                            let pool = Arc::clone(b.pool());
                            exporting(exports, &pool, || run_one(&b, oracle, reqs, engine, fault))
                        }
                        Ok(p) => {
                            let b = KvslotsBackend::from_pool(p);
                            let pool = Arc::clone(b.pool());
                            exporting(exports, &pool, || run_one(&b, oracle, reqs, engine, fault))
                        }
                        Err(e) => return refused(err, cli, "the kvslots pool", &e),
                    };
                    if done.is_some() {
                        exported = done;
                    }
                    report
                }
                Allocator::Mutex => match MutexPool::try_new(nb, bs) {
                    Ok(p) if *hybrid => {
                        let b = HybridMutexBackend::hybrid(p, groups.clone());
                        run_one(&b, oracle, reqs, engine, fault)
                    }
                    Ok(p) => run_one(&MutexBackend::from_pool(p), oracle, reqs, engine, fault),
                    Err(e) => return refused(err, cli, "the mutex pool", &e),
                },
            };
            let mut report = report.with_block_bytes(sizing.bytes_per_block);
            if i == 1 {
                report.column = format!("{} all-full", report.allocator);
            }
            reports.push(report);
        }
    }
    for r in &reports {
        for e in &r.errors {
            let _ = writeln!(err, "kvslots-sim: {}: {e}", r.allocator);
        }
    }
    // A planted fault that never fired checked nothing: whatever the run
    // found, it is no answer to `--plant-fault`.
    if let Some((r, (fault, occasions))) =
        reports.iter().find_map(|r| r.unfired_fault.map(|u| (r, u)))
    {
        let _ = writeln!(
            err,
            "kvslots-sim: error: --plant-fault {} never fired on the {} run: the workload gave \
             it {occasions} occasions, and it fires at the {}th; run more requests",
            fault.name(),
            r.column,
            crate::fault::FIRE_AT
        );
        return EXIT_BAD_INPUT;
    }
    let ok = reports.iter().all(|r| r.invariants_ok);
    // Exports that could not be written leave the report to write (it
    // says nothing of them), and the exit code says so.
    let (exported, unexported) = match exported.transpose() {
        Ok(e) => (e, false),
        Err(e) => {
            let _ = writeln!(err, "kvslots-sim: error: cannot write the exports: {e}");
            (None, true)
        }
    };
    let per = cli.allocators().len();
    let written = if cli.json {
        let mut value = match &plan.hybrid {
            None => allocators_json(&reports),
            Some(h) => {
                let (hybrid, all_full) = reports.split_at(per);
                json!({
                    "all_full_sizing": h.all_full,
                    "layout": {
                        "groups": engine::layout_words(&h.layout.groups),
                        "layers_per_group": h.layout.layers_per_group,
                        "padding_layers": h.layout.padding_layers,
                    },
                    "hybrid": allocators_json(hybrid),
                    "all_full": allocators_json(all_full),
                    "hybrid_vs_all_full": {
                        "kv_bytes_per_request": hybrid[0].kv_bytes_per_request
                            / all_full[0].kv_bytes_per_request.max(f64::MIN_POSITIVE),
                        "running_mean": hybrid[0].running_mean
                            / all_full[0].running_mean.max(f64::MIN_POSITIVE),
                        "running_peak": hybrid[0].running_peak as f64
                            / all_full[0].running_peak.max(1) as f64,
                        "wall": hybrid[0].wall_ms / all_full[0].wall_ms.max(f64::MIN_POSITIVE),
                    },
                    "invariants_ok": ok,
                })
            }
        };
        value["sizing"] = json!(plan.sizing);
        value["workload"] = json!(plan.workload);
        value["settings"] = settings_json(&plan);
        if let Some(e) = &exported {
            value["exported"] = json!(e);
        }
        writeln!(out, "{value}")
    } else {
        let mut ratios = Vec::new();
        if per == 2 {
            ratios.push((0, 1, "kvslots/mutex".to_string()));
        }
        if plan.hybrid.is_some() {
            ratios.push((0, per, "hybrid/all-full".to_string()));
        }
        writeln!(
            out,
            "{}\n{}{}\n\n{}",
            sizing_lines(&plan),
            settings_line(&plan),
            exported
                .as_ref()
                .map(|e| exports_line(&plan.exports, e, plan.hybrid.is_some()))
                .unwrap_or_default(),
            table_with(&reports, &ratios)
        )
    }
    .and_then(|()| out.flush());
    if !ok {
        return EXIT_FAILED;
    }
    match written {
        Ok(()) if unexported => EXIT_UNWRITTEN,
        Ok(()) => EXIT_OK,
        Err(e) => {
            let _ = writeln!(err, "kvslots-sim: error: cannot write the report: {e}");
            EXIT_UNWRITTEN
        }
    }
}

/// The JSON of one layout's runs: one report, or with `--compare` both
/// allocators' with their ratios.
fn allocators_json(reports: &[Report]) -> serde_json::Value {
    match reports {
        [a, b] => json!({
            "kvslots": a,
            "mutex": b,
            "ratios": {
                "alloc_ops_per_sec": a.alloc_ops_per_sec / b.alloc_ops_per_sec.max(f64::MIN_POSITIVE),
                "prefix_hit_rate": a.prefix_hit_rate / b.prefix_hit_rate.max(f64::MIN_POSITIVE),
                "append_p999": a.append_latency_ns.p999 as f64 / b.append_latency_ns.p999.max(1) as f64,
                "wall": a.wall_ms / b.wall_ms.max(f64::MIN_POSITIVE),
            },
            "invariants_ok": a.invariants_ok && b.invariants_ok,
        }),
        [one, ..] => serde_json::to_value(one).expect("a report serialises"),
        [] => json!(null),
    }
}
