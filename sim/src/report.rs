//! The report: a table for people, one JSON object for machines.

use std::fmt::Write as _;

use serde::Serialize;

use crate::engine::{Counts, Invariants, OpKind, OpStats, RunStats};

/// `try_append` latency percentiles, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
    /// Calls recorded.
    pub count: u64,
}

/// Allocator calls of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OpReport {
    /// Calls made.
    pub calls: u64,
    /// Time inside them, summed over workers, in milliseconds.
    pub busy_ms: f64,
    /// Mean time per call, in nanoseconds (timer overhead included).
    pub mean_ns: f64,
}

/// One run, as reported: the run's [`Counts`] under their own names, and
/// what is derived from the rest of its [`RunStats`].
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `kvslots` or `mutex`.
    pub allocator: String,
    /// The column's title in the table: the allocator, and for a hybrid
    /// model's run as all full attention, `all-full` after it.
    #[serde(skip)]
    pub column: String,
    /// The groups of layers of the sequences (`1 full` for a plain model).
    pub layout: String,
    /// Requests running at once (admitted and not completed or
    /// preempted, over all workers), averaged over the workers' samples
    /// (one a step).
    pub running_mean: f64,
    /// The most requests running at once.
    pub running_peak: usize,
    /// The pool's blocks in use per running request, averaged over the
    /// same samples (blocks in use over requests running).
    pub kv_blocks_per_request: f64,
    /// `kv_blocks_per_request` in bytes of KV memory (the sizing's bytes a
    /// block).
    pub kv_bytes_per_request: f64,
    /// Worker threads.
    pub workers: usize,
    /// Requests in the workload.
    pub requests: usize,
    /// What happened (each count a key of its own).
    #[serde(flatten)]
    pub counts: Counts,
    /// `prefix_hit_tokens` over `prompt_tokens` (0 without prompts).
    pub prefix_hit_rate: f64,
    /// Cached blocks whose key was dropped to reuse the block.
    pub evictions: u64,
    /// Blocks holding a key at the end of the run.
    pub cached_blocks: usize,
    /// High-water mark of blocks in use.
    pub peak_blocks_used: usize,
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// `peak_blocks_used` as a percentage of `num_blocks`.
    pub peak_blocks_pct: f64,
    /// The high-water mark of block references retired under a step's
    /// fence and not yet given back (the pool's
    /// `peak_pending_release_blocks`; 0 without `--async-depth`).
    pub pending_release_peak: usize,
    /// Allocator calls per second of the run's wall time.
    pub alloc_ops_per_sec: f64,
    /// Time inside allocator calls, summed over workers, in milliseconds.
    pub alloc_busy_ms: f64,
    /// The run's wall time (workers only), in milliseconds.
    pub wall_ms: f64,
    /// `try_append` latency.
    pub append_latency_ns: Latency,
    /// Allocator calls by kind: `admit`, `try_append`,
    /// `truncate`, `try_fork`, `drop`, `try_match_prefix`, `publish`.
    pub alloc_ops: std::collections::BTreeMap<&'static str, OpReport>,
    /// Each invariant.
    pub invariants: Invariants,
    /// Whether every invariant holds.
    pub invariants_ok: bool,
    /// Failures, the first one first.
    pub errors: Vec<String>,
    /// A fault planted with `--plant-fault` that never fired, and the
    /// occasions the run gave it: the check of the checker did not happen.
    #[serde(skip)]
    pub unfired_fault: Option<(crate::fault::Fault, u64)>,
}

impl Report {
    /// The report of a run.
    pub fn new(s: &RunStats) -> Report {
        let h = &s.append_latency;
        let invariants = s.invariants();
        let per_call = |o: OpStats| OpReport {
            calls: o.calls,
            busy_ms: o.busy_ns as f64 / 1e6,
            mean_ns: if o.calls == 0 {
                0.0
            } else {
                o.busy_ns as f64 / o.calls as f64
            },
        };
        let c = &s.counts;
        Report {
            allocator: s.allocator.to_string(),
            column: s.allocator.to_string(),
            layout: s.layout.clone(),
            running_mean: if c.occupancy_samples == 0 {
                0.0
            } else {
                c.running_sum as f64 / c.occupancy_samples as f64
            },
            running_peak: s.running_peak,
            kv_blocks_per_request: if c.running_sum == 0 {
                0.0
            } else {
                c.used_blocks_sum as f64 / c.running_sum as f64
            },
            kv_bytes_per_request: 0.0,
            workers: s.workers,
            requests: s.requests,
            counts: s.counts,
            prefix_hit_rate: if s.counts.prompt_tokens == 0 {
                0.0
            } else {
                s.counts.prefix_hit_tokens as f64 / s.counts.prompt_tokens as f64
            },
            evictions: s.prefix.evictions,
            cached_blocks: s.cached_blocks,
            peak_blocks_used: s.peak_blocks_used,
            num_blocks: s.num_blocks,
            peak_blocks_pct: if s.num_blocks == 0 {
                0.0
            } else {
                100.0 * s.peak_blocks_used as f64 / s.num_blocks as f64
            },
            pending_release_peak: s.pending_release_peak,
            alloc_ops_per_sec: s.alloc_ops_per_sec(),
            alloc_busy_ms: s.alloc_busy.as_secs_f64() * 1e3,
            wall_ms: s.wall.as_secs_f64() * 1e3,
            append_latency_ns: Latency {
                p50: h.value_at_quantile(0.5),
                p99: h.value_at_quantile(0.99),
                p999: h.value_at_quantile(0.999),
                max: h.max(),
                count: h.len(),
            },
            alloc_ops: OpKind::ALL
                .iter()
                .map(|&k| (k.name(), per_call(s.ops[k as usize])))
                .collect(),
            invariants,
            invariants_ok: invariants.ok(),
            errors: s.errors.clone(),
            unfired_fault: None,
        }
    }
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl Report {
    /// Sets [`kv_bytes_per_request`](Self::kv_bytes_per_request) from the
    /// pool's bytes a block.
    pub fn with_block_bytes(mut self, bytes_per_block: u64) -> Report {
        self.kv_bytes_per_request = self.kv_blocks_per_request * bytes_per_block as f64;
        self
    }
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1u64 << 20) as f64)
}

fn ns(v: u64) -> String {
    if v >= 10_000_000 {
        format!("{:.1} ms", v as f64 / 1e6)
    } else if v >= 10_000 {
        format!("{:.1} us", v as f64 / 1e3)
    } else {
        format!("{v} ns")
    }
}

/// The rows of the table: label and one cell per report, plus the number
/// the ratio column divides (`None`: no ratio).
fn rows(r: &Report) -> Vec<(&'static str, String, Option<f64>)> {
    let l = &r.append_latency_ns;
    let c = &r.counts;
    vec![
        ("layout (groups of layers)", r.layout.clone(), None),
        (
            "requests running at once (mean)",
            format!("{:.1}", r.running_mean),
            Some(r.running_mean),
        ),
        (
            "requests running at once (peak)",
            thousands(r.running_peak as u64),
            Some(r.running_peak as f64),
        ),
        (
            "KV memory per running request",
            mib(r.kv_bytes_per_request),
            Some(r.kv_bytes_per_request),
        ),
        ("requests completed", thousands(c.requests_completed), None),
        (
            "requests rejected (never fit)",
            thousands(c.requests_rejected),
            None,
        ),
        ("preemptions (recompute)", thousands(c.preemptions), None),
        ("prompt tokens", thousands(c.prompt_tokens), None),
        (
            "prefix hit tokens (rate)",
            format!(
                "{} ({:.2}%)",
                thousands(c.prefix_hit_tokens),
                100.0 * r.prefix_hit_rate
            ),
            None,
        ),
        ("evictions", thousands(r.evictions), None),
        ("tokens prefilled", thousands(c.tokens_prefilled), None),
        ("tokens decoded", thousands(c.tokens_decoded), None),
        ("tokens rolled back", thousands(c.tokens_rolled_back), None),
        ("forks", thousands(c.forks), None),
        ("block copies", thousands(c.block_copies), None),
        (
            "appends taking 2+ blocks",
            thousands(c.multi_block_appends),
            None,
        ),
        (
            "KV stamps written / read",
            format!(
                "{} / {}",
                thousands(c.stamps_written),
                thousands(c.stamps_read)
            ),
            None,
        ),
        (
            "peak blocks used",
            format!(
                "{} / {} ({:.1}%)",
                thousands(r.peak_blocks_used as u64),
                thousands(r.num_blocks as u64),
                r.peak_blocks_pct
            ),
            None,
        ),
        (
            "pending release peak (blocks)",
            thousands(r.pending_release_peak as u64),
            None,
        ),
        (
            "blocks retired / device syncs",
            format!(
                "{} / {}",
                thousands(c.blocks_retired),
                thousands(c.device_syncs)
            ),
            None,
        ),
        ("allocator calls", thousands(c.alloc_calls), None),
        (
            "allocator calls/s (wall)",
            thousands(r.alloc_ops_per_sec.round() as u64),
            Some(r.alloc_ops_per_sec),
        ),
        (
            "wall time",
            format!("{:.2} s", r.wall_ms / 1e3),
            Some(r.wall_ms),
        ),
        ("try_append p50", ns(l.p50), Some(l.p50 as f64)),
        ("try_append p99", ns(l.p99), Some(l.p99 as f64)),
        ("try_append p99.9", ns(l.p999), Some(l.p999 as f64)),
        ("try_append max", ns(l.max), Some(l.max as f64)),
        (
            "invariants",
            if r.invariants_ok {
                "ok".to_string()
            } else {
                "FAILED".to_string()
            },
            None,
        ),
    ]
}

/// The table for one or more runs side by side; with two runs, a last
/// column gives the first divided by the second.
pub fn table(reports: &[Report]) -> String {
    let ratios: Vec<(usize, usize, String)> = match reports {
        [a, b] => vec![(0, 1, format!("{}/{}", a.column, b.column))],
        _ => Vec::new(),
    };
    table_with(reports, &ratios)
}

/// The table for runs side by side, with a ratio column for each `(i, j,
/// title)`: report `i`'s figure divided by report `j`'s.
pub fn table_with(reports: &[Report], ratios: &[(usize, usize, String)]) -> String {
    let all: Vec<_> = reports.iter().map(rows).collect();
    let label_w = all
        .first()
        .map(|r| r.iter().map(|(l, _, _)| l.len()).max().unwrap_or(0))
        .unwrap_or(0);
    let mut col_w: Vec<usize> = reports.iter().map(|r| r.column.len()).collect();
    for (i, rs) in all.iter().enumerate() {
        for (_, cell, _) in rs {
            col_w[i] = col_w[i].max(cell.len());
        }
    }
    let ratio_w: Vec<usize> = ratios.iter().map(|(_, _, t)| t.len().max(13)).collect();
    let mut out = String::new();
    let _ = write!(out, "{:label_w$}", "");
    for (r, w) in reports.iter().zip(&col_w) {
        let _ = write!(out, "  {:>w$}", r.column);
    }
    for ((_, _, t), w) in ratios.iter().zip(&ratio_w) {
        let _ = write!(out, "  {t:>w$}");
    }
    out.push('\n');
    for row in 0..all.first().map_or(0, Vec::len) {
        let _ = write!(out, "{:label_w$}", all[0][row].0);
        for (rs, w) in all.iter().zip(&col_w) {
            let _ = write!(out, "  {:>w$}", rs[row].1);
        }
        for (&(i, j, _), w) in ratios.iter().zip(&ratio_w) {
            if let (Some(a), Some(b)) = (all[i][row].2, all[j][row].2) {
                let cell = if b > 0.0 {
                    format!("{:.2}x", a / b)
                } else {
                    "-".to_string()
                };
                let _ = write!(out, "  {cell:>w$}");
            }
        }
        out.push('\n');
    }
    // Calls by kind: how many, and the mean time of one.
    let _ = write!(out, "\n{:label_w$}", "allocator calls by kind");
    for (r, w) in reports.iter().zip(&col_w) {
        let _ = write!(out, "  {:>w$}", r.column);
    }
    out.push('\n');
    for k in OpKind::ALL {
        let cells: Vec<String> = reports
            .iter()
            .map(|r| {
                let o = r.alloc_ops[k.name()];
                format!("{} x {:.0} ns", thousands(o.calls), o.mean_ns)
            })
            .collect();
        if reports.iter().all(|r| r.alloc_ops[k.name()].calls == 0) {
            continue;
        }
        let _ = write!(out, "{:label_w$}", format!("  {}", k.name()));
        for (c, w) in cells.iter().zip(&col_w) {
            let _ = write!(out, "  {c:>w$}");
        }
        out.push('\n');
    }
    for r in reports {
        if !r.invariants_ok {
            let _ = writeln!(out, "{}: invariants: {:?}", r.column, r.invariants);
        }
        for e in &r.errors {
            let _ = writeln!(out, "{}: error: {e}", r.column);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    #[test]
    fn latencies_pick_a_readable_unit() {
        assert_eq!(ns(950), "950 ns");
        assert_eq!(ns(12_345), "12.3 us");
        assert_eq!(ns(25_000_000), "25.0 ms");
    }
}
