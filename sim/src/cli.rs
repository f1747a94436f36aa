//! The command line: flags, sizing, workload, run(s), report, exit code.
//!
//! Exit codes: 0 when every run's invariants hold, 1 when one does not, 2
//! for bad input (a flag's value, a malformed trace) before any work.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvslots::BlockPool;
use serde_json::json;

use crate::backend::{KvBackend, KvslotsBackend, MutexBackend};
use crate::engine::{self, Admission, EngineConfig, MIX_SAMPLES};
pub use crate::fault::Fault;
use crate::fault::Faulty;
use crate::model::{size_pool, ModelPreset, Sizing};
use crate::prefix::TRACE_BLOCK;
use crate::report::{table, Report};
use crate::workload::{read_trace, Request, SharedPrefixes};

/// Synthetic requests in a default run: every token of them is written to
/// and read back from the oracle's KV memory, which makes a request cost
/// about three times what the allocator calls alone cost; this many keep
/// the default run at about 15 seconds on a 2-core machine.
pub const DEFAULT_REQUESTS: usize = 500_000;

/// The most worker threads a run may start.
pub const MAX_WORKERS: usize = 1024;

/// The most steps `--async-depth` lets the device run behind.
pub const MAX_ASYNC_DEPTH: usize = 64;

/// The default seed.
pub const DEFAULT_SEED: u64 = 42;

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
/// reports what happened. Exit code 0 only if every invariant holds; 2 for
/// bad input.
#[derive(Debug, Clone, Parser)]
#[command(name = "kvslots-sim", version, about, long_about)]
pub struct Cli {
    /// Model preset whose KV shape sizes the pool.
    #[arg(long, value_enum, default_value_t = ModelPreset::Llama3_8b)]
    pub model: ModelPreset,
    /// KV bytes per token, instead of a preset's.
    #[arg(long)]
    pub kv_bytes_per_token: Option<u64>,
    /// KV-cache memory budget, in GiB.
    #[arg(long, default_value_t = 16.0)]
    pub memory_gib: f64,
    /// Tokens per block.
    #[arg(long, default_value_t = 16)]
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
    /// first N of the trace (default: all of it).
    #[arg(long)]
    pub requests: Option<usize>,
    /// Seed for the synthetic workload and the acceptance draws.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Worker threads (default: available parallelism, at least 4).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Blocks that admission keeps free for running sequences to grow
    /// (default: 1% of the blocks).
    #[arg(long)]
    pub watermark: Option<usize>,
    /// Prefill chunk, in tokens.
    #[arg(long, default_value_t = 512)]
    pub chunk: usize,
    /// Speculative decoding: K draft tokens per step (0: off). Giving
    /// `--spec`, `--samples` or `--admission` runs every request the same
    /// way instead of the default mix.
    #[arg(long, value_name = "K")]
    pub spec: Option<usize>,
    /// Probability that a draft token is accepted.
    #[arg(long, default_value_t = 0.7)]
    pub accept: f64,
    /// Samples per request: forks N-1 children after prefill (default 1).
    #[arg(long, value_name = "N")]
    pub samples: Option<usize>,
    /// How a waiting request is admitted: reserve its whole prompt's blocks
    /// (with the watermark's headroom) in one allocation, or only check
    /// that they are free (default: reserve).
    #[arg(long, value_enum)]
    pub admission: Option<Admission>,
    /// Most requests one worker runs at once.
    #[arg(long, default_value_t = 64)]
    pub max_running: usize,
    /// Free-list shards of the kvslots pool (default: what
    /// `BlockPool::new` picks, one per 64 blocks up to 16; 1 is a single
    /// shard).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub shards: Option<u16>,
    /// The allocator to run.
    #[arg(long, value_enum, default_value_t = Allocator::Kvslots)]
    pub allocator: Allocator,
    /// Run kvslots and then the mutex baseline on the same workload and
    /// print them side by side.
    #[arg(long)]
    pub compare: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Plant a fault in the backend (the check of the checker): the run
    /// must fail, naming it.
    #[arg(long, value_enum, value_name = "KIND")]
    pub plant_fault: Option<Fault>,
    /// Asynchronous scheduling: the device runs K steps behind the
    /// scheduler, so the blocks a step gives back (preemption, rejected
    /// drafts, completion) are retired under the step's fence and go back
    /// when the step completes, K steps later (0: at once).
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub async_depth: usize,
    /// The livelock watchdog: an allocator call running this long ends the
    /// run as stuck.
    #[arg(long, default_value_t = 10_000, value_name = "MS")]
    pub stuck_after_ms: u64,
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

/// Everything a run needs, checked.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The pool's sizing.
    pub sizing: Sizing,
    /// The requests.
    pub requests: Vec<Request>,
    /// Where they came from, for the report.
    pub workload: String,
    /// The scheduler's settings.
    pub engine: EngineConfig,
    /// Free-list shards of the kvslots pool.
    pub shards: usize,
}

/// The default worker count: available parallelism, at least 4.
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .max(4)
}

impl Cli {
    /// Checks the flags, sizes the pool and loads or draws the requests.
    pub fn plan(&self) -> Result<Plan, InputError> {
        let (model, bpt) = match self.kv_bytes_per_token {
            Some(b) => ("custom".to_string(), b),
            None => (
                self.model.name().to_string(),
                self.model.shape().kv_bytes_per_token(),
            ),
        };
        let sizing = size_pool(&model, bpt, self.memory_gib, self.block_size)
            .map_err(|e| InputError(e.to_string()))?;
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
        if !(0.0..=1.0).contains(&self.accept) {
            return Err(InputError(format!(
                "--accept must be a probability in [0, 1], got {}",
                self.accept
            )));
        }
        let (requests, workload) = match &self.trace {
            Some(path) => {
                let mut all =
                    read_trace(path).map_err(|e| InputError(format!("{}: {e}", path.display())))?;
                if let Some(n) = self.requests {
                    all.truncate(n);
                }
                let n = all.len();
                (all, format!("trace {} ({n} requests)", path.display()))
            }
            None => {
                let n = self.requests.unwrap_or(DEFAULT_REQUESTS);
                (
                    SharedPrefixes::default().generate(n, self.seed),
                    format!(
                        "synthetic log-normal with shared prefixes, {n} requests, seed {}",
                        self.seed
                    ),
                )
            }
        };
        let prefix_cache = !self.no_prefix_cache;
        if prefix_cache
            && !TRACE_BLOCK.is_multiple_of(self.block_size)
            && requests.iter().any(|r| r.hash_ids.is_some())
        {
            return Err(InputError(format!(
                "--block-size {} does not divide the {TRACE_BLOCK}-token blocks the workload's \
                 prompt content is named by: prefix caching needs a block size that does \
                 (or --no-prefix-cache)",
                self.block_size
            )));
        }
        let watermark_blocks = self.watermark.unwrap_or(sizing.num_blocks / 100);
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
        let engine = EngineConfig {
            admission: self.admission.unwrap_or(Admission::Reserve),
            workers,
            watermark_blocks,
            chunk: self.chunk,
            spec: self.spec.unwrap_or(0),
            accept: self.accept,
            samples: self.samples.unwrap_or(1),
            max_running: self.max_running,
            seed: self.seed,
            mix: self.spec.is_none() && self.samples.is_none() && self.admission.is_none(),
            prefix_cache,
            async_depth: self.async_depth,
            stuck_after: std::time::Duration::from_millis(self.stuck_after_ms),
            ..EngineConfig::default()
        };
        check_runnable(&sizing, &engine, &requests)?;
        Ok(Plan {
            engine,
            shards: self
                .shards
                .map_or_else(|| BlockPool::default_shards(sizing.num_blocks), usize::from),
            sizing,
            requests,
            workload,
        })
    }
}

/// Refuses a pool in which no request of the workload can ever run: no
/// block, a watermark that leaves no block to admit into, or every request
/// too large for it.
fn check_runnable(
    sizing: &Sizing,
    engine: &EngineConfig,
    requests: &[Request],
) -> Result<(), InputError> {
    let (nb, bs) = (sizing.num_blocks, sizing.block_size);
    if nb == 0 {
        return Err(InputError(format!(
            "the pool has no block ({} GiB at {} bytes a block): no request can run",
            sizing.memory_bytes as f64 / crate::model::GIB,
            sizing.bytes_per_block
        )));
    }
    if engine.watermark_blocks >= nb {
        return Err(InputError(format!(
            "--watermark {} keeps every one of the pool's {nb} blocks free: no request can be admitted",
            engine.watermark_blocks
        )));
    }
    let runs = |r: &Request| {
        let profile = engine.profile(r.id, bs);
        !engine::never_fits(r, &profile, engine.watermark_blocks, nb, bs)
    };
    if !requests.iter().any(runs) {
        return Err(InputError(format!(
            "no request of the workload can ever run in a pool of {nb} blocks of {bs} tokens \
             with a watermark of {} blocks",
            engine.watermark_blocks
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

fn run_one<B: KvBackend>(backend: &B, plan: &Plan) -> Report {
    let pb = progress_bar(plan.requests.len(), backend.name());
    let stats = engine::run(backend, &plan.requests, &plan.engine, Some(&pb));
    pb.finish_and_clear();
    Report::new(&stats)
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
        "workload: {}; {} workers, {}, prefix cache {}, async depth {}, watermark {} blocks, chunk {}, max running {}; kvslots free list: {} shards",
        plan.workload,
        e.workers,
        profile_words(e, plan.sizing.block_size),
        if e.prefix_cache { "on" } else { "off" },
        e.async_depth,
        e.watermark_blocks,
        e.chunk,
        e.max_running,
        plan.shards
    )
}

fn settings_json(plan: &Plan) -> serde_json::Value {
    let e = &plan.engine;
    json!({
        "shards": plan.shards,
        "admission": e.admission,
        "workers": e.workers,
        "watermark_blocks": e.watermark_blocks,
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
    })
}

/// Runs the command line and returns the process's exit code. Output goes
/// to `out`, errors to stderr.
pub fn run(cli: &Cli, out: &mut dyn Write) -> i32 {
    let plan = match cli.plan() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("kvslots-sim: error: {e}");
            return 2;
        }
    };
    let nb = plan.sizing.num_blocks;
    let bs = plan.sizing.block_size;
    let allocators = if cli.compare {
        vec![Allocator::Kvslots, Allocator::Mutex]
    } else {
        vec![cli.allocator]
    };
    // The kvslots pool has the prefix cache only when the run uses it.
    let mut pool = None;
    if allocators.contains(&Allocator::Kvslots) {
        let layers = BlockPool::builder(nb, bs)
            .shards(plan.shards)
            .prefix_cache(plan.engine.prefix_cache);
        match layers.build() {
            Ok(p) => pool = Some(p),
            Err(e) => {
                eprintln!("kvslots-sim: error: {e}");
                return 2;
            }
        }
    }
    let mut kvslots = || KvslotsBackend::from_pool(pool.take().expect("one kvslots run"));
    let mutex = || MutexBackend::new(nb, bs);
    let reports: Vec<Report> = allocators
        .into_iter()
        .map(|a| match (a, cli.plant_fault) {
            (Allocator::Kvslots, None) => run_one(&kvslots(), &plan),
            (Allocator::Mutex, None) => run_one(&mutex(), &plan),
            (Allocator::Kvslots, Some(f)) => run_one(&Faulty::new(kvslots(), f), &plan),
            (Allocator::Mutex, Some(f)) => run_one(&Faulty::new(mutex(), f), &plan),
        })
        .collect();
    for r in &reports {
        for e in &r.errors {
            eprintln!("kvslots-sim: {}: {e}", r.allocator);
        }
    }
    let ok = reports.iter().all(|r| r.invariants_ok);
    let written = if cli.json {
        let value = match reports.as_slice() {
            [one] => {
                let mut v = serde_json::to_value(one).expect("a report serialises");
                v["sizing"] = json!(plan.sizing);
                v["workload"] = json!(plan.workload);
                v["settings"] = settings_json(&plan);
                v
            }
            [a, b] => json!({
                "sizing": plan.sizing,
                "workload": plan.workload,
                "settings": settings_json(&plan),
                "kvslots": a,
                "mutex": b,
                "ratios": {
                    "alloc_ops_per_sec": a.alloc_ops_per_sec / b.alloc_ops_per_sec.max(f64::MIN_POSITIVE),
                    "prefix_hit_rate": a.prefix_hit_rate / b.prefix_hit_rate.max(f64::MIN_POSITIVE),
                    "append_p999": a.append_latency_ns.p999 as f64 / b.append_latency_ns.p999.max(1) as f64,
                    "wall": a.wall_ms / b.wall_ms.max(f64::MIN_POSITIVE),
                },
                "invariants_ok": ok,
            }),
            _ => unreachable!("one or two runs"),
        };
        writeln!(out, "{value}")
    } else {
        writeln!(
            out,
            "{}\n{}\n\n{}",
            sizing_line(&plan.sizing),
            settings_line(&plan),
            table(&reports)
        )
    };
    if let Err(e) = written {
        eprintln!("kvslots-sim: cannot write the report: {e}");
        return 1;
    }
    if ok {
        0
    } else {
        1
    }
}
