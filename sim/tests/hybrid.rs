//! Hybrid models in the simulator: the engine on `kvslots::HybridSequence`
//! (one table per group of layers over one pool) on small pools where
//! windows give blocks back, preemption, speculative rollback, forks,
//! copies and prefix hits happen, on both allocators, with the oracle
//! checking every group's slots; the planted faults caught in hybrid runs
//! too; a sequence whose windows lie caught; and the presets' report.

use std::process::Command;

use kvslots::{BlockPool, KvGroup, KvGroups};
use kvslots_sim::backend::{HybridKvslotsBackend, HybridMutexBackend};
use kvslots_sim::baseline::MutexPool;
use kvslots_sim::cli::Fault;
use kvslots_sim::engine::{self, EngineConfig, RunStats};
use kvslots_sim::workload::{Request, SharedPrefixes, Synthetic};

mod common;

use common::{Lie, Lying};

const BIN: &str = env!("CARGO_BIN_EXE_kvslots-sim");

/// Tokens per block.
const BS: usize = 4;

/// A sliding window of 12 tokens and full attention, twice over: a
/// layout like Gemma's, in small.
fn layout() -> KvGroups {
    let w = KvGroup::SlidingWindow { window_tokens: 12 };
    KvGroups::new([KvGroup::Full, w, w]).unwrap()
}

/// Small requests (prompt ~ e^3.6 = 37 tokens, output ~ e^2.8 = 16).
fn small_workload(n: usize, seed: u64) -> Vec<Request> {
    Synthetic {
        prompt_mu: 3.6,
        prompt_sigma: 0.6,
        output_mu: 2.8,
        output_sigma: 0.6,
        max_prompt: 160,
        max_output: 60,
    }
    .generate(n, seed)
}

fn config(groups: KvGroups, workers: usize, async_depth: usize) -> EngineConfig {
    EngineConfig {
        workers,
        watermark_blocks: 2,
        chunk: 16,
        mix: true,
        max_running: 8,
        seed: 5,
        async_depth,
        publish_chunks: true,
        groups,
        ..EngineConfig::default()
    }
}

fn assert_ran_everything(s: &RunStats, reqs: &[Request]) {
    let inv = s.invariants();
    assert!(inv.ok(), "{}: {inv:?} {:?}", s.allocator, s.errors);
    assert_eq!(s.final_used_blocks, 0);
    assert_eq!(
        s.counts.requests_completed + s.counts.requests_rejected,
        reqs.len() as u64
    );
    assert!(s.counts.requests_completed > 0);
    for (what, n) in [
        ("preemptions", s.counts.preemptions),
        ("rolled back", s.counts.tokens_rolled_back),
        ("forks", s.counts.forks),
        ("block copies", s.counts.block_copies),
        ("stamps written", s.counts.stamps_written),
        ("occupancy samples", s.counts.occupancy_samples),
    ] {
        assert!(n > 0, "{}: no {what}", s.allocator);
    }
    assert!(s.counts.stamps_read >= s.counts.stamps_written / 2);
    assert_eq!(s.layout, "1 full + 2 sliding 12");
    assert!(s.running_peak >= 1);
}

#[test]
fn hybrid_runs_keep_every_invariant_on_both_allocators() {
    let reqs = small_workload(400, 3);
    for workers in [1, 3] {
        for depth in [0, 2] {
            let cfg = config(layout(), workers, depth);
            let kv = HybridKvslotsBackend::hybrid(BlockPool::new(160, BS), layout());
            let s = engine::run(&kv, &reqs, &cfg, None);
            assert_ran_everything(&s, &reqs);
            if depth > 0 {
                assert!(s.counts.blocks_retired > 0);
            }
            let mx = HybridMutexBackend::hybrid(MutexPool::new(160, BS), layout());
            let s = engine::run(&mx, &reqs, &cfg, None);
            assert_ran_everything(&s, &reqs);
        }
    }
}

#[test]
fn one_worker_hybrid_runs_are_the_same_on_both_allocators() {
    let reqs = small_workload(300, 4);
    let cfg = config(layout(), 1, 0);
    let kv = HybridKvslotsBackend::hybrid(BlockPool::new(128, BS), layout());
    let mx = HybridMutexBackend::hybrid(MutexPool::new(128, BS), layout());
    let (a, b) = (
        engine::run(&kv, &reqs, &cfg, None),
        engine::run(&mx, &reqs, &cfg, None),
    );
    assert!(a.invariants().ok() && b.invariants().ok());
    assert_eq!(a.counts, b.counts);
}

#[test]
fn prefix_hits_happen_across_groups() {
    // Shared system prompts and conversations, 512-token trace blocks in
    // blocks of 16: the windows must hold the end of a shared prefix.
    let reqs = SharedPrefixes::default().generate(300, 9);
    let w = KvGroup::SlidingWindow { window_tokens: 256 };
    let groups = KvGroups::new([KvGroup::Full, w]).unwrap();
    let cfg = EngineConfig {
        chunk: 512,
        ..config(groups.clone(), 2, 0)
    };
    let kv = HybridKvslotsBackend::hybrid(BlockPool::new(4096, 16), groups);
    let s = engine::run(&kv, &reqs, &cfg, None);
    assert!(s.invariants().ok(), "{:?}", s.errors);
    assert!(s.counts.prefix_hit_tokens > 0);
    assert!(s.prefix.hit_blocks > 0);
}

// ---------------------------------------------------------------------------
// A sequence whose windows lie to the engine
// ---------------------------------------------------------------------------

/// The oracle counts out what a window leaves behind and requires those
/// entries to be null afterwards: a sequence that keeps one fails the run,
/// named.
#[test]
fn a_window_that_keeps_a_block_it_said_it_gave_back_fails_the_run() {
    let reqs = small_workload(200, 6);
    let cfg = config(layout(), 1, 0);
    let backend = Lying::new(
        Lie::LateWindows,
        HybridKvslotsBackend::hybrid(BlockPool::new(160, BS), layout()),
    );
    let s = engine::run(&backend, &reqs, &cfg, None);
    assert!(!s.invariants().kv_memory_intact);
    assert!(
        s.errors.iter().any(|e| e.contains("left the window")),
        "{:?}",
        s.errors
    );
}

// ---------------------------------------------------------------------------
// The command line
// ---------------------------------------------------------------------------

fn json_of(args: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run the simulator");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code(), v, err)
}

/// The presets report the model as given and as all full attention, side
/// by side, each on both allocators with `--compare`.
#[test]
fn the_presets_report_hybrid_and_all_full_runs() {
    for (model, groups) in [
        ("gpt-oss-20b", "1 full + 1 sliding 128"),
        ("gemma-3-27b", "1 full + 6 sliding 1024"),
        ("llama-4-scout", "1 full + 3 chunked 8192"),
    ] {
        let (code, v, err) = json_of(&[
            "--model",
            model,
            "--requests",
            "300",
            "--memory-gib",
            "2",
            "--workers",
            "2",
            "--compare",
            "--json",
        ]);
        assert_eq!(code, Some(0), "{model}: {err}");
        assert_eq!(v["invariants_ok"], true);
        assert_eq!(v["layout"]["groups"], groups);
        for run in ["hybrid", "all_full"] {
            for allocator in ["kvslots", "mutex"] {
                let r = &v[run][allocator];
                assert_eq!(r["invariants_ok"], true, "{model} {run} {allocator}");
                assert!(r["running_mean"].as_f64().unwrap() > 0.0);
                assert!(r["kv_bytes_per_request"].as_f64().unwrap() > 0.0);
            }
        }
        assert_eq!(v["all_full"]["kvslots"]["layout"], "1 full");
        assert_eq!(v["hybrid"]["kvslots"]["layout"], groups);
        let ratio = v["hybrid_vs_all_full"]["kv_bytes_per_request"]
            .as_f64()
            .unwrap();
        assert!(ratio > 0.0 && ratio.is_finite());
    }
    // The table names both layouts and the ratio.
    let out = Command::new(BIN)
        .args([
            "--model",
            "gpt-oss-20b",
            "--requests",
            "200",
            "--memory-gib",
            "1",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("kvslots all-full"), "{text}");
    assert!(text.contains("hybrid/all-full"), "{text}");
    assert!(text.contains("KV memory per running request"), "{text}");
}

/// The planted faults fail hybrid runs too (each acts on a sequence's
/// first table).
#[test]
fn planted_faults_fail_hybrid_runs() {
    for fault in [
        Fault::ShortAppend,
        Fault::SharedForkTail,
        Fault::DoubleHandOut,
        Fault::OverAllocate,
        Fault::Leak,
        Fault::EarlyRelease,
    ] {
        let depth = if fault.needs_async() { "2" } else { "0" };
        let (code, v, err) = json_of(&[
            "--model",
            "gpt-oss-20b",
            "--requests",
            "800",
            "--memory-gib",
            "1",
            "--workers",
            "2",
            "--async-depth",
            depth,
            "--plant-fault",
            fault.name(),
            "--json",
        ]);
        assert_eq!(code, Some(1), "{}: {err}", fault.name());
        assert_eq!(v["invariants_ok"], false, "{}", fault.name());
        assert_eq!(
            v["hybrid"]["invariants_ok"],
            false,
            "{}: the hybrid run passed",
            fault.name()
        );
    }
}
