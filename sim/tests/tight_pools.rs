//! Tight pools where every request that fits runs alone, but few run at
//! once, with and without waiting in the allocator. Each configuration
//! (the CLI flags it stands for are in its test's doc) runs many times on
//! both allocators over
//! the small trace `tests/fixtures/tight-pool-small.csv` (48 requests,
//! prompts of 1 to 100 tokens; read ten times over, so that workers
//! contend), and every run must finish with every invariant holding and
//! with progress bounded by allocator calls: no worker makes more than
//! [`CALLS_WITHOUT_PROGRESS`] calls in a row while no request finishes
//! anywhere (a livelock makes that count grow without bound; the stall
//! guard, lowered here, ends such a run instead of letting it hang).

use std::path::Path;

use kvslots_sim::backend::{KvslotsBackend, MutexBackend};
use kvslots_sim::engine::{self, Admission, EngineConfig, RunStats};
use kvslots_sim::workload::{read_trace, Request};

/// The fixture: 48 requests, half with prompts of 1 to 12 tokens and
/// outputs of 1 to 4, half with prompts of 1 to 100 and outputs of 1 to 24
/// (generated for these tests; see `tests/fixtures/README.md`).
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/tight-pool-small.csv"
);

/// How many times each configuration runs, per allocator.
const RUNS: usize = 12;

/// The most allocator calls one worker may make in a row while no
/// request finishes anywhere: far above what a run that makes progress
/// needs, far below what a livelock makes before the stall guard ends it.
const CALLS_WITHOUT_PROGRESS: u64 = 200_000;

/// The fixture, read `times` times over (the ids renumbered).
fn requests(times: usize) -> Vec<Request> {
    let one = read_trace(Path::new(FIXTURE)).expect("the fixture parses");
    assert_eq!(one.len(), 48);
    (0..times)
        .flat_map(|_| one.iter())
        .enumerate()
        .map(|(id, r)| Request::new(id, r.prompt, r.output))
        .collect()
}

/// What `kvslots-sim --trace T --memory-gib G --workers W [flags]` runs:
/// `num_blocks` blocks of 16 tokens of llama-3-8b (2 MiB a block, so
/// `--memory-gib 0.001953125` is 1 block), the CLI's defaults otherwise
/// (watermark `num_blocks / 100`, chunk 512, 64 running, seed 42; the mix
/// when no profile flag is given), and a stall guard lowered so that a
/// livelock ends the run in seconds.
struct Tight {
    num_blocks: usize,
    cfg: EngineConfig,
}

fn tight(num_blocks: usize, workers: usize, admission: Option<Admission>) -> Tight {
    Tight {
        num_blocks,
        cfg: EngineConfig {
            admission: admission.unwrap_or(Admission::Reserve),
            mix: admission.is_none(),
            workers,
            watermark_blocks: num_blocks / 100,
            chunk: 512,
            max_running: 64,
            seed: 42,
            stall_limit: 2_000_000,
            ..EngineConfig::default()
        },
    }
}

/// Every run of `t` on both allocators finishes whole, with progress
/// bounded by allocator calls.
fn runs_finish(t: &Tight) {
    let reqs = requests(10);
    let fitting = reqs
        .iter()
        .filter(|r| {
            let profile = t.cfg.profile(r.id, 16);
            !engine::never_fits(r, &profile, &t.cfg, t.num_blocks, 16)
        })
        .count() as u64;
    assert!(fitting > 0, "no request fits a pool of {}", t.num_blocks);
    for run in 0..RUNS {
        let kv = engine::run(&KvslotsBackend::new(t.num_blocks, 16), &reqs, &t.cfg, None);
        check(&kv, &reqs, fitting, run);
        if run % 4 == 0 {
            let mutex = engine::run(&MutexBackend::new(t.num_blocks, 16), &reqs, &t.cfg, None);
            check(&mutex, &reqs, fitting, run);
        }
    }
}

fn check(s: &RunStats, reqs: &[Request], fitting: u64, run: usize) {
    let inv = s.invariants();
    assert!(
        inv.ok(),
        "{} run {run}: invariants {inv:?}, errors {:?}",
        s.allocator,
        s.errors
    );
    assert!(!s.stalled, "{} run {run}: stalled", s.allocator);
    assert_eq!(s.counts.requests_completed, fitting, "{}", s.allocator);
    assert_eq!(
        s.counts.requests_completed + s.counts.requests_rejected,
        reqs.len() as u64
    );
    assert_eq!(s.final_used_blocks, 0);
    assert!(
        s.longest_calls_without_progress <= CALLS_WITHOUT_PROGRESS,
        "{} run {run}: a worker made {} allocator calls in a row with no request finishing",
        s.allocator,
        s.longest_calls_without_progress
    );
}

/// `--memory-gib 0.001953125 --workers 8 --admission check`: one block,
/// check-only admission (an idle worker's waited check keeps its block as
/// the prompt's first, or the next waiter would get it first, every time).
#[test]
fn one_block_check_only_admission_finishes() {
    runs_finish(&tight(1, 8, Some(Admission::Check)));
}

/// The same without `--admission check` (the mix).
#[test]
fn one_block_mixed_profiles_finish() {
    runs_finish(&tight(1, 8, None));
}

/// A pool of 2 blocks, both admissions and the mix.
#[test]
fn two_blocks_finish() {
    for admission in [Some(Admission::Check), Some(Admission::Reserve), None] {
        runs_finish(&tight(2, 8, admission));
    }
}

/// `--memory-gib 0.03125 --workers 16 --admission check`: 16 blocks.
#[test]
fn sixteen_blocks_sixteen_workers_check_only_finish() {
    runs_finish(&tight(16, 16, Some(Admission::Check)));
}

/// `--memory-gib 0.015625 --workers 64 --admission reserve --spec 4
/// --max-running 2 --watermark 0`: 8 blocks, 64 workers, speculative
/// decoding.
#[test]
fn eight_blocks_sixty_four_workers_speculative_finish() {
    let mut t = tight(8, 64, Some(Admission::Reserve));
    t.cfg.spec = 4;
    t.cfg.max_running = 2;
    t.cfg.watermark_blocks = 0;
    runs_finish(&t);
}

/// `--plant-fault leak` on a pool of 3 blocks, 1 and 4 workers: a dropped
/// sequence's blocks never come back, so the request that holds priority
/// is refused with nothing else running anywhere. The run must stall (and
/// the final sweep name the leak) with few allocator calls in a row: the
/// refused priority group waits, and its waits count toward the stall
/// guard's limit on blocking waits (`stall_limit / 1000`), not toward its
/// `stall_limit` iterations.
#[test]
fn a_leak_on_a_tight_pool_stalls_the_run_after_waits() {
    use kvslots_sim::cli::Fault;
    use kvslots_sim::fault::Faulty;
    let reqs = requests(10);
    for workers in [1, 4] {
        let t = tight(3, workers, Some(Admission::Reserve));
        let backend = Faulty::new(KvslotsBackend::new(t.num_blocks, 16), Fault::Leak);
        let s = engine::run(&backend, &reqs, &t.cfg, None);
        assert!(backend.fired(), "{workers} workers: the leak never fired");
        assert!(s.stalled, "{workers} workers: the run did not stall");
        assert!(
            !s.invariants().ok(),
            "{workers} workers: the leak went unseen"
        );
        assert!(
            s.longest_calls_without_progress <= CALLS_WITHOUT_PROGRESS,
            "{workers} workers: {} allocator calls in a row with no request finishing",
            s.longest_calls_without_progress
        );
    }
}
