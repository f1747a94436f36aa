//! The engine on small pools, where preemption, speculative rollback and
//! forks all happen, on both allocators; and on the shared code trace.

use kvslots_sim::backend::{
    HybridKvslotsBackend, HybridMutexBackend, KvBackend, KvslotsBackend, MutexBackend,
};
use kvslots_sim::engine::{
    self, group_blocks, Admission, EngineConfig, IdleWait, OpKind, RunStats,
};
use kvslots_sim::workload::{read_trace, Request, Synthetic};

mod common;

use common::{Lie, Lying};

/// Small requests (prompt ~ e^3.4 = 30 tokens, output ~ e^2.5 = 12), plus
/// every 50th one too large for the pool, so that rejection happens too.
fn small_workload(n: usize, seed: u64) -> Vec<Request> {
    let shape = Synthetic {
        prompt_mu: 3.4,
        prompt_sigma: 0.8,
        output_mu: 2.5,
        output_sigma: 0.7,
        max_prompt: 200,
        max_output: 60,
    };
    let mut reqs = shape.generate(n, seed);
    for r in reqs.iter_mut().step_by(50) {
        r.prompt = 10_000;
    }
    reqs
}

fn small_config(workers: usize) -> EngineConfig {
    EngineConfig {
        workers,
        watermark_blocks: 2,
        chunk: 16,
        spec: 3,
        accept: 0.6,
        samples: 3,
        max_running: 8,
        seed: 11,
        ..EngineConfig::default()
    }
}

/// 96 blocks of 4 tokens: a few groups at a time.
const NB: usize = 96;
const BS: usize = 4;

/// The requests that can never run in a pool of `nb` blocks, counted here
/// independently of the engine.
fn never_runs(r: &Request, cfg: &EngineConfig, nb: usize, bs: usize) -> bool {
    let total = (r.prompt + r.output).div_ceil(bs);
    let private = total - r.prompt / bs;
    r.prompt.div_ceil(bs) + cfg.watermark_blocks > nb || total + (cfg.samples - 1) * private > nb
}

fn expected_rejected(reqs: &[Request], cfg: &EngineConfig, nb: usize, bs: usize) -> u64 {
    reqs.iter().filter(|r| never_runs(r, cfg, nb, bs)).count() as u64
}

/// Lower bounds: every request that ran prefilled its prompt and decoded
/// its output for each sample at least once (more after recomputation).
fn assert_tokens_at_least(s: &RunStats, reqs: &[Request], cfg: &EngineConfig) {
    let ran = || {
        reqs.iter()
            .filter(|r| !never_runs(r, cfg, s.num_blocks, s.block_size))
    };
    let decoded: u64 = ran().map(|r| (r.output * cfg.samples) as u64).sum();
    let prefilled: u64 = ran().map(|r| r.prompt as u64).sum();
    assert!(
        s.counts.tokens_decoded >= decoded,
        "{}: decoded {} < {decoded}",
        s.allocator,
        s.counts.tokens_decoded
    );
    assert!(s.counts.tokens_prefilled >= prefilled);
}

fn assert_all_happened(s: &RunStats, reqs: &[Request], cfg: &EngineConfig) {
    let inv = s.invariants();
    assert!(
        inv.ok(),
        "{}: invariants {inv:?}, errors {:?}",
        s.allocator,
        s.errors
    );
    assert_eq!(s.final_used_blocks, 0);
    assert_eq!(s.requests, reqs.len());
    let rejected = expected_rejected(reqs, cfg, s.num_blocks, s.block_size);
    assert!(rejected > 0);
    assert_eq!(s.counts.requests_rejected, rejected, "{}", s.allocator);
    assert_eq!(s.counts.requests_completed, reqs.len() as u64 - rejected);
    assert!(s.counts.preemptions > 0, "{}: no preemption", s.allocator);
    assert!(
        s.counts.tokens_rolled_back > 0,
        "{}: no rollback",
        s.allocator
    );
    assert!(s.counts.forks > 0, "{}: no fork", s.allocator);
    assert!(s.counts.block_copies > 0, "{}: no block copy", s.allocator);
    assert!(s.counts.block_copies <= s.counts.forks);
    assert!(s.peak_blocks_used <= s.num_blocks);
    assert!(
        s.peak_blocks_used > s.num_blocks / 2,
        "the pool was never under pressure"
    );
    assert!(s.counts.stamps_written > 0 && s.counts.stamps_read >= s.counts.stamps_written);
    assert_eq!(s.counts.kv_failures, 0);
    assert_tokens_at_least(s, reqs, cfg);
    assert!(!s.append_latency.is_empty());
    // The calls by kind add up, and every append was recorded.
    assert_eq!(
        s.ops.iter().map(|o| o.calls).sum::<u64>(),
        s.counts.alloc_calls
    );
    assert_eq!(s.ops[OpKind::Append as usize].calls, s.append_latency.len());
    assert!(s.ops[OpKind::Fork as usize].calls >= s.counts.forks);
    assert!(s.ops[OpKind::Truncate as usize].calls > 0);
    assert!(s.ops[OpKind::Admit as usize].calls >= s.counts.requests_completed);
}

fn run<B: KvBackend>(backend: &B, reqs: &[Request], cfg: &EngineConfig) -> RunStats {
    engine::run(backend, reqs, cfg, None)
}

#[test]
fn kvslots_small_pool_preempts_rolls_back_forks_and_conserves() {
    let reqs = small_workload(600, 1);
    let cfg = small_config(4);
    let s = run(&KvslotsBackend::new(NB, BS), &reqs, &cfg);
    assert_all_happened(&s, &reqs, &cfg);
}

#[test]
fn mutex_small_pool_preempts_rolls_back_forks_and_conserves() {
    let reqs = small_workload(600, 1);
    let cfg = small_config(4);
    let s = run(&MutexBackend::new(NB, BS), &reqs, &cfg);
    assert_all_happened(&s, &reqs, &cfg);
}

/// Check-only admission (one block kept, the rest checked) keeps every
/// invariant too; the prompt's other blocks are then taken chunk by
/// chunk.
#[test]
fn check_admission_conserves_on_both_allocators() {
    let reqs = small_workload(400, 6);
    let cfg = EngineConfig {
        admission: Admission::Check,
        ..small_config(4)
    };
    assert_all_happened(&run(&KvslotsBackend::new(NB, BS), &reqs, &cfg), &reqs, &cfg);
    assert_all_happened(&run(&MutexBackend::new(NB, BS), &reqs, &cfg), &reqs, &cfg);
}

/// With one worker the schedule is deterministic, so both allocators must
/// make exactly the same decisions: same preemptions, rollbacks, forks,
/// copies, calls and peak. (Their block ids may differ; their counts may
/// not.)
#[test]
fn one_worker_runs_are_identical_on_both_allocators() {
    let reqs = small_workload(300, 2);
    let cfg = small_config(1);
    let a = run(&KvslotsBackend::new(NB, BS), &reqs, &cfg);
    let b = run(&MutexBackend::new(NB, BS), &reqs, &cfg);
    assert_all_happened(&a, &reqs, &cfg);
    assert_all_happened(&b, &reqs, &cfg);
    let key = |s: &RunStats| {
        (
            s.counts.requests_completed,
            s.counts.requests_rejected,
            s.counts.preemptions,
            s.counts.tokens_prefilled,
            s.counts.tokens_decoded,
            s.counts.tokens_rolled_back,
            s.counts.forks,
            s.counts.block_copies,
            s.counts.alloc_calls,
            s.peak_blocks_used,
            s.append_latency.len(),
        )
    };
    assert_eq!(key(&a), key(&b));
    // And a second run of the same allocator repeats itself.
    let again = run(&KvslotsBackend::new(NB, BS), &reqs, &cfg);
    assert_eq!(key(&a), key(&again));
}

/// Plain decoding (no speculation, no fork): nothing is rolled back or
/// forked, and the decoded count is exact when nothing was preempted.
#[test]
fn plain_decode_on_a_roomy_pool_is_exact() {
    let reqs: Vec<Request> = small_workload(200, 3)
        .into_iter()
        .enumerate()
        .map(|(id, r)| Request {
            id,
            prompt: r.prompt.min(200),
            ..r
        })
        .collect();
    let cfg = EngineConfig {
        workers: 4,
        watermark_blocks: 4,
        chunk: 64,
        ..EngineConfig::default()
    };
    let s = run(&KvslotsBackend::new(100_000, 16), &reqs, &cfg);
    assert!(s.invariants().ok(), "{:?} {:?}", s.invariants(), s.errors);
    assert_eq!(s.counts.preemptions, 0);
    assert_eq!(
        (
            s.counts.tokens_rolled_back,
            s.counts.forks,
            s.counts.block_copies
        ),
        (0, 0, 0)
    );
    assert_eq!(s.counts.requests_completed, 200);
    assert_eq!(
        s.counts.tokens_decoded,
        reqs.iter().map(|r| r.output as u64).sum::<u64>()
    );
    assert_eq!(
        s.counts.tokens_prefilled,
        reqs.iter().map(|r| r.prompt as u64).sum::<u64>()
    );
}

/// A run that stops early (here: the stall guard at its most impatient)
/// fails its invariants instead of hanging, and still gives every block
/// back.
#[test]
fn an_aborted_run_fails_its_invariants_and_frees_everything() {
    let reqs = small_workload(200, 4);
    let cfg = EngineConfig {
        stall_limit: 0,
        ..small_config(2)
    };
    for s in [
        run(&KvslotsBackend::new(NB, BS), &reqs, &cfg),
        run(&MutexBackend::new(NB, BS), &reqs, &cfg),
    ] {
        assert!(s.stalled, "{}", s.allocator);
        let inv = s.invariants();
        assert!(!inv.all_completed && !inv.ok());
        assert!(inv.pool_full_again && inv.kv_memory_intact);
        assert!(s.counts.requests_completed + s.counts.requests_rejected < reqs.len() as u64);
    }
}

#[test]
fn group_blocks_counts_shared_prefix_once() {
    // 10 prompt + 6 output tokens, blocks of 4: 4 blocks each; the 2 full
    // prompt blocks are shared, so each extra sample needs 2 more.
    assert_eq!(group_blocks(10, 6, 1, 4), 4);
    assert_eq!(group_blocks(10, 6, 3, 4), 8);
    // On a block boundary the whole prompt is shared.
    assert_eq!(group_blocks(8, 4, 2, 4), 4);
}

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../traces/azure-llm-2023-code.csv"
);

/// The real code trace (first 400 requests) on a pool of 400 blocks of 16
/// tokens (6,400 tokens: the longest prompts, up to 7,437 tokens, never
/// fit), with speculative decoding (4 drafts) and 4 samples per request.
fn trace_config(workers: usize) -> EngineConfig {
    EngineConfig {
        workers,
        watermark_blocks: 1,
        chunk: 512,
        spec: 4,
        accept: 0.7,
        samples: 4,
        max_running: 16,
        seed: 5,
        ..EngineConfig::default()
    }
}

fn trace_sample() -> Vec<Request> {
    let mut all = read_trace(std::path::Path::new(TRACE)).expect("the shared code trace parses");
    assert_eq!(all.len(), 8819);
    all.truncate(400);
    all
}

#[test]
fn code_trace_on_a_small_pool_on_both_allocators() {
    let reqs = trace_sample();
    let cfg = trace_config(4);
    for s in [
        run(&KvslotsBackend::new(400, 16), &reqs, &cfg),
        run(&MutexBackend::new(400, 16), &reqs, &cfg),
    ] {
        assert_all_happened_trace(&s, &reqs, &cfg);
    }
}

#[test]
fn code_trace_with_one_worker_is_identical_on_both_allocators() {
    let reqs = trace_sample();
    let cfg = trace_config(1);
    let a = run(&KvslotsBackend::new(400, 16), &reqs, &cfg);
    let b = run(&MutexBackend::new(400, 16), &reqs, &cfg);
    assert_all_happened_trace(&a, &reqs, &cfg);
    assert_all_happened_trace(&b, &reqs, &cfg);
    assert_eq!(
        (
            a.counts.preemptions,
            a.counts.tokens_rolled_back,
            a.counts.forks,
            a.counts.block_copies,
            a.counts.alloc_calls
        ),
        (
            b.counts.preemptions,
            b.counts.tokens_rolled_back,
            b.counts.forks,
            b.counts.block_copies,
            b.counts.alloc_calls
        )
    );
}

fn assert_all_happened_trace(s: &RunStats, reqs: &[Request], cfg: &EngineConfig) {
    let inv = s.invariants();
    assert!(
        inv.ok(),
        "{}: invariants {inv:?}, errors {:?}",
        s.allocator,
        s.errors
    );
    let rejected = expected_rejected(reqs, cfg, s.num_blocks, s.block_size);
    assert!(
        rejected > 0,
        "the sample has no prompt too long for the pool"
    );
    assert_eq!(s.counts.requests_rejected, rejected);
    assert_eq!(s.counts.requests_completed, reqs.len() as u64 - rejected);
    assert!(s.counts.preemptions > 0, "{}: no preemption", s.allocator);
    assert!(s.counts.tokens_rolled_back > 0);
    // Every completed request forked 3 children at least once.
    assert!(s.counts.forks >= 3 * s.counts.requests_completed);
    assert!(s.counts.block_copies > 0 && s.counts.block_copies <= s.counts.forks);
    assert_eq!(s.peak_blocks_used, 400, "the pool was never full");
    assert_tokens_at_least(s, reqs, cfg);
}

/// The default mix on a small pool exercises every allocator path the
/// engine has: appends that take two or more blocks, drafts truncated,
/// forks that copy a partly filled tail, check-only admission, preemption;
/// and the oracle reads back at least every stamp written.
#[test]
fn the_mix_exercises_every_allocator_path_on_both_allocators() {
    let reqs = small_workload(600, 9);
    let cfg = EngineConfig {
        mix: true,
        ..small_config(3)
    };
    for s in [
        run(&KvslotsBackend::new(NB, BS), &reqs, &cfg),
        run(&MutexBackend::new(NB, BS), &reqs, &cfg),
    ] {
        let (inv, c) = (s.invariants(), &s.counts);
        assert!(inv.ok(), "{}: {inv:?} {:?}", s.allocator, s.errors);
        assert!(c.multi_block_appends > 0, "{}: {c:?}", s.allocator);
        assert!(c.tokens_rolled_back > 0, "{}: {c:?}", s.allocator);
        assert!(c.forks > 0 && c.block_copies > 0, "{}: {c:?}", s.allocator);
        assert!(c.preemptions > 0, "{}: {c:?}", s.allocator);
        assert!(s.ops[OpKind::Truncate as usize].calls > 0);
        assert!(c.stamps_read >= c.stamps_written && c.stamps_written > 0);
    }
    // Every class of the mix occurs.
    let profiles: std::collections::HashSet<_> = reqs
        .iter()
        .map(|r| {
            let p = cfg.profile(r.id, BS);
            (p.admission == Admission::Check, p.spec > 0, p.samples > 1)
        })
        .collect();
    assert_eq!(profiles.len(), 4, "{profiles:?}");
}

/// Asynchronous scheduling (`async_depth` 2): every give-back is retired
/// under its step's fence and goes back two steps later (or when the worker
/// waits for the device), with the oracle checking that no block is handed
/// out or written while a step in flight reads it. Every invariant holds on
/// both allocators, the fences are used, and with one worker both make the
/// same decisions.
#[test]
fn async_depth_two_retires_under_fences_and_conserves_on_both_allocators() {
    let reqs = small_workload(400, 4);
    for workers in [4, 1] {
        let cfg = EngineConfig {
            async_depth: 2,
            ..small_config(workers)
        };
        let a = run(&KvslotsBackend::new(NB, BS), &reqs, &cfg);
        let b = run(&MutexBackend::new(NB, BS), &reqs, &cfg);
        for s in [&a, &b] {
            assert_all_happened(s, &reqs, &cfg);
            assert!(
                s.counts.blocks_retired > 0,
                "{}: nothing retired",
                s.allocator
            );
            assert!(s.pending_release_peak > 0, "{}", s.allocator);
            assert!(s.ops[OpKind::Complete as usize].calls > 0);
        }
        if workers == 1 {
            let key = |s: &RunStats| {
                (
                    s.counts.preemptions,
                    s.counts.device_syncs,
                    s.counts.blocks_retired,
                    s.counts.tokens_rolled_back,
                    s.counts.block_copies,
                    s.counts.alloc_calls,
                    s.peak_blocks_used,
                    s.pending_release_peak,
                )
            };
            assert_eq!(key(&a), key(&b));
        }
    }
    // Without it nothing is retired.
    let s = run(&KvslotsBackend::new(NB, BS), &reqs, &small_config(4));
    assert_eq!((s.counts.blocks_retired, s.pending_release_peak), (0, 0));
}

/// Requests that each take most of a pool of 16 blocks of 16 tokens (a
/// prompt of 10 or 11 blocks with 2 of watermark, 13 or 14 blocks in all):
/// one runs at a time.
fn one_at_a_time(n: usize) -> Vec<Request> {
    (0..n)
        .map(|id| Request::new(id, 160 + id % 5, 40))
        .collect()
}

const TINY_NB: usize = 16;
const TINY_BS: usize = 16;

fn one_at_a_time_config(admission: Admission, async_depth: usize) -> EngineConfig {
    EngineConfig {
        admission,
        async_depth,
        workers: 4,
        watermark_blocks: 2,
        chunk: 16,
        max_running: 8,
        seed: 5,
        ..EngineConfig::default()
    }
}

/// Runs `reqs` while the test holds 8 of the pool's blocks, so that no
/// request fits and every worker, with nothing running, must wait; a
/// helper gives the blocks back once `waiters` is above 0 (a worker seen
/// waiting in the allocator, or another sign that one has waited), or
/// once the run has ended without it, so that the test fails instead of
/// hanging.
fn run_held<B: KvBackend>(
    backend: &B,
    waiters: impl Fn() -> usize + Sync,
    reqs: &[Request],
    cfg: &EngineConfig,
) -> RunStats {
    let mut held = Vec::new();
    backend.try_alloc_with_headroom(8, 0, &mut held).unwrap();
    let ended = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            // Relaxed: a flag set once that orders nothing (the run has
            // returned; only the helper's exit depends on it).
            while waiters() == 0 && !ended.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::yield_now();
            }
            backend.free(&held).unwrap();
        });
        let s = run(backend, reqs, cfg);
        // Relaxed: see the load.
        ended.store(true, std::sync::atomic::Ordering::Relaxed);
        s
    })
}

/// The run finished whole, and its idle workers waited in the allocator:
/// every wait counted is a blocking call into it.
fn assert_waited_in_the_allocator(s: &RunStats, reqs: &[Request]) {
    let inv = s.invariants();
    assert!(
        inv.ok(),
        "{}: invariants {inv:?}, errors {:?}",
        s.allocator,
        s.errors
    );
    assert_eq!(s.counts.requests_completed, reqs.len() as u64);
    assert_eq!(s.final_used_blocks, 0);
    assert!(s.counts.idle_waits > 0, "{}: no worker waited", s.allocator);
    assert!(
        s.ops[OpKind::Wait as usize].calls >= s.counts.idle_waits,
        "{}: {} waits counted, {} blocking calls",
        s.allocator,
        s.counts.idle_waits,
        s.ops[OpKind::Wait as usize].calls
    );
    // A wait follows a refused admission, and a grant follows a wait.
    let c = &s.counts;
    assert!(c.waited_admissions <= c.idle_waits);
    assert!(c.refused_full + c.refused_behind_waiters >= c.idle_waits);
    if s.allocator == "mutex" {
        // The baseline has no queue to be behind.
        assert_eq!(c.refused_behind_waiters, 0);
    }
}

/// Workers with nothing running wait on the allocator (the library's queue,
/// the baseline's condition variable), with either admission: a worker is
/// seen waiting there, the run finishes, every invariant holds, and nobody
/// is left waiting.
#[test]
fn idle_workers_wait_in_the_allocator_on_both_allocators() {
    let reqs = one_at_a_time(40);
    for admission in [Admission::Reserve, Admission::Check] {
        let cfg = one_at_a_time_config(admission, 0);
        let kv = KvslotsBackend::new(TINY_NB, TINY_BS);
        let s = run_held(&kv, || kv.pool().waiters(), &reqs, &cfg);
        assert_waited_in_the_allocator(&s, &reqs);
        assert_eq!(kv.pool().waiters(), 0, "{admission}: a waiter was left");
        let mutex = MutexBackend::new(TINY_NB, TINY_BS);
        let s = run_held(&mutex, || mutex.pool().waiters(), &reqs, &cfg);
        assert_waited_in_the_allocator(&s, &reqs);
        assert_eq!(mutex.pool().waiters(), 0, "{admission}: a waiter was left");
    }
}

/// With [`IdleWait::Poll`] an idle worker retries its admission instead
/// of waiting in the allocator, on both allocators. One worker running
/// one request at a time on 72 blocks of 16 tokens; each request names
/// its 1,024-token prompt's content (64 keys, so that every admission
/// attempt queries the prefix cache) and needs 65 blocks plus the
/// watermark's 2, which do not fit beside the 8 blocks the test holds
/// until the worker has made its third attempt at the first request (its
/// second was refused with nothing running, so it waited). The run
/// finishes whole, the waits are counted, none is a blocking call, and
/// kvslots' queue never holds the worker (no admission is refused behind
/// a waiter).
#[test]
fn idle_workers_poll_outside_the_allocator_with_idle_wait_poll() {
    let reqs: Vec<Request> = (0..6)
        .map(|id| Request {
            hash_ids: Some(vec![2 * id as u64 + 100, 2 * id as u64 + 101].into()),
            ..Request::new(id, 1024, 2)
        })
        .collect();
    const KEYS: u64 = 1024 / 16;
    for admission in [Admission::Reserve, Admission::Check] {
        let cfg = EngineConfig {
            admission,
            idle_wait: IdleWait::Poll,
            workers: 1,
            watermark_blocks: 2,
            chunk: 512,
            max_running: 1,
            mix: false,
            prefix_cache: true,
            ..EngineConfig::default()
        };
        let kv = KvslotsBackend::new(72, 16);
        let most_waiters = std::sync::atomic::AtomicUsize::new(0);
        let third_attempt = || {
            // Relaxed: a maximum of snapshots, read after the run.
            most_waiters.fetch_max(kv.pool().waiters(), std::sync::atomic::Ordering::Relaxed);
            usize::from(kv.prefix_stats().queried_blocks >= 3 * KEYS)
        };
        let a = run_held(&kv, third_attempt, &reqs, &cfg);
        assert_eq!(most_waiters.into_inner(), 0, "{admission}: a worker queued");
        let mutex = MutexBackend::new(72, 16);
        let b = run_held(
            &mutex,
            || usize::from(mutex.prefix_stats().queried_blocks >= 3 * KEYS),
            &reqs,
            &cfg,
        );
        for s in [&a, &b] {
            let inv = s.invariants();
            assert!(inv.ok(), "{}: {inv:?}, {:?}", s.allocator, s.errors);
            assert_eq!(s.counts.requests_completed, reqs.len() as u64);
            assert_eq!(s.final_used_blocks, 0);
            assert!(s.counts.idle_waits > 0, "{}: no worker waited", s.allocator);
            assert_eq!(
                s.ops[OpKind::Wait as usize].calls,
                0,
                "{}: a blocking call",
                s.allocator
            );
            assert_eq!(s.counts.refused_behind_waiters, 0, "{}", s.allocator);
            assert!(s.counts.waited_admissions <= s.counts.idle_waits);
        }
    }
}

/// With steps in flight, an idle worker completes them before it waits
/// (otherwise it could wait for blocks its own fences keep retired): the
/// run finishes on both allocators, with fenced blocks and waits.
#[test]
fn idle_workers_drain_their_fences_before_waiting_with_async_depth_two() {
    let reqs = one_at_a_time(40);
    for admission in [Admission::Reserve, Admission::Check] {
        let cfg = one_at_a_time_config(admission, 2);
        let kv = KvslotsBackend::new(TINY_NB, TINY_BS);
        let a = run_held(&kv, || kv.pool().waiters(), &reqs, &cfg);
        assert_eq!(kv.pool().waiters(), 0, "{admission}: a waiter was left");
        let mutex = MutexBackend::new(TINY_NB, TINY_BS);
        let b = run_held(&mutex, || mutex.pool().waiters(), &reqs, &cfg);
        assert_eq!(mutex.pool().waiters(), 0, "{admission}: a waiter was left");
        for s in [&a, &b] {
            assert_waited_in_the_allocator(s, &reqs);
            assert!(
                s.counts.blocks_retired > 0,
                "{}: nothing retired",
                s.allocator
            );
            assert!(s.pending_release_peak > 0, "{}", s.allocator);
        }
    }
}

/// Request 0 (one trace block, 32 pool blocks) and request 1 (the same
/// trace block and another, 64 blocks), run by one worker one at a time
/// with prefix caching, in a pool of 72 blocks.
fn waited_scene() -> ([Request; 2], EngineConfig) {
    let reqs = [
        Request {
            hash_ids: Some(vec![11u64].into()),
            ..Request::new(0, 512, 1)
        },
        Request {
            hash_ids: Some(vec![11u64, 12].into()),
            ..Request::new(1, 1024, 1)
        },
    ];
    let cfg = EngineConfig {
        workers: 1,
        watermark_blocks: 2,
        chunk: 512,
        max_running: 1,
        mix: false,
        prefix_cache: true,
        ..EngineConfig::default()
    };
    (reqs, cfg)
}

/// A request refused while its prefix is cached waits with nothing held
/// (it gives the prefix back), and its grant then matches the prefix into
/// the blocks it was granted: a hit, on both allocators, under plain and
/// hybrid sequences. One worker that
/// runs one request at a time, a pool of 72 blocks of 16 tokens: request
/// 0 (one trace block, 32 pool blocks) runs first and leaves its blocks
/// cached; request 1 (the same trace block and another, 64 blocks) does
/// not fit beside the 8 blocks the test holds, so the worker waits until
/// they are given back.
#[test]
fn a_waited_admission_matches_its_prefix_into_its_grant() {
    let (reqs, cfg) = waited_scene();
    fn check(s: &RunStats) {
        let inv = s.invariants();
        assert!(inv.ok(), "{}: {inv:?}, {:?}", s.allocator, s.errors);
        assert_eq!(s.counts.requests_completed, 2, "{}", s.allocator);
        assert_eq!(s.counts.waited_admissions, 1, "{}", s.allocator);
        // Only the second request can hit, and only after its wait. The
        // grant took the free blocks first: some of the cached blocks are
        // left for the match, at least one.
        assert!(
            s.counts.prefix_hit_tokens >= 16,
            "{}: the waited admission hit {} tokens",
            s.allocator,
            s.counts.prefix_hit_tokens
        );
        assert_eq!(s.counts.waited_hit_tokens, s.counts.prefix_hit_tokens);
    }
    let kv = KvslotsBackend::new(72, 16);
    check(&run_held(&kv, || kv.pool().waiters(), &reqs, &cfg));
    let mutex = MutexBackend::new(72, 16);
    check(&run_held(&mutex, || mutex.pool().waiters(), &reqs, &cfg));
    // The same through hybrid sequences (one group of full attention).
    let full = || kvslots::KvGroups::new([kvslots::KvGroup::Full]).unwrap();
    let kv = HybridKvslotsBackend::hybrid(kvslots::BlockPool::new(72, 16), full());
    check(&run_held(&kv, || kv.pool().waiters(), &reqs, &cfg));
    let mutex = HybridMutexBackend::hybrid(kvslots_sim::baseline::MutexPool::new(72, 16), full());
    check(&run_held(&mutex, || mutex.pool().waiters(), &reqs, &cfg));
}

/// A grant that the match into it leaves short (as a race can: a block
/// the match revived and let go of, shared meanwhile, with the pool full)
/// is topped up before the prompt goes in; where the top-up is refused the
/// grant goes back whole and the request is admitted later. Either way
/// the oracle finds every table holding what its length and reservation
/// need. The scene of the test above, with the matches' reserved blocks
/// given back after each match into a grant.
#[test]
fn a_grant_the_match_leaves_short_is_topped_up_or_given_back() {
    let (reqs, cfg) = waited_scene();
    let full = || kvslots::KvGroups::new([kvslots::KvGroup::Full]).unwrap();
    for (lie, refused) in [(Lie::ShortGrants, 0), (Lie::ShortGrantsRefused, 1)] {
        let kv = HybridKvslotsBackend::hybrid(kvslots::BlockPool::new(72, 16), full());
        let pool = kv.pool().clone();
        let lying = Lying::new(lie, kv);
        let s = run_held(&lying, || pool.waiters(), &reqs, &cfg);
        let inv = s.invariants();
        assert!(inv.ok(), "{lie:?}: {inv:?}, {:?}", s.errors);
        assert_eq!(s.counts.requests_completed, 2, "{lie:?}");
        assert_eq!(s.counts.waited_admissions, 1, "{lie:?}");
        assert_eq!(s.counts.short_grants, 1, "{lie:?}");
        assert_eq!(s.counts.refused_short_grants, refused, "{lie:?}");
        assert!(s.counts.prefix_hit_tokens >= 16, "{lie:?}");
        // A grant given back counts no hit: the request's hits are those
        // of its admission after.
        let waited = if refused == 0 {
            s.counts.prefix_hit_tokens
        } else {
            0
        };
        assert_eq!(s.counts.waited_hit_tokens, waited, "{lie:?}");
    }
}

/// A check-only admission keeps the prompt's block past its cached prefix,
/// so that its prefill chunks are the growth of a running sequence: a
/// first chunk that were a new admission would be refused behind any
/// waiter queued since the check (this backend refuses every new
/// admission's append so), and its group preempted, again and again.
#[test]
fn a_check_only_admission_keeps_its_first_block() {
    let reqs: Vec<Request> = (0..6).map(|i| Request::new(i, 300, 20)).collect();
    let cfg = EngineConfig {
        workers: 1,
        admission: Admission::Check,
        chunk: 64,
        max_running: 2,
        mix: false,
        stall_limit: 10_000,
        ..EngineConfig::default()
    };
    let full = || kvslots::KvGroups::new([kvslots::KvGroup::Full]).unwrap();
    let kv = HybridKvslotsBackend::hybrid(kvslots::BlockPool::new(128, 16), full());
    let s = run(&Lying::new(Lie::NewWorkBehindWaiters, kv), &reqs, &cfg);
    let inv = s.invariants();
    assert!(inv.ok(), "{inv:?}, {:?}", s.errors);
    assert_eq!(s.counts.requests_completed, 6);
    assert_eq!(s.counts.preemptions, 0);
}

/// A check-only admission after a prefix hit on a hybrid layout checks
/// what the prompt holds at once beside what the match put in its tables:
/// a sliding group's matched window counts toward the window and chunk
/// its prefill holds, not on top of them. The waited-admission scene
/// (watermark 2) in a pool of 96 blocks, a full group and a 256-token
/// window, 64-token chunks: request 1 matches request 0's 512 tokens (32
/// blocks in the full group, the window's 16 in the sliding one) and then
/// holds at most 32 + 5 more at once, which fit with the watermark beside
/// its 48; counted twice, the window made it 53, more than the 48 left,
/// and the check `NeverFits` (a failed run).
#[test]
fn a_check_after_a_hybrid_hit_counts_the_matched_window_once() {
    let (reqs, cfg) = waited_scene();
    let groups = kvslots::KvGroups::new([
        kvslots::KvGroup::Full,
        kvslots::KvGroup::SlidingWindow { window_tokens: 256 },
    ])
    .unwrap();
    let cfg = EngineConfig {
        admission: Admission::Check,
        chunk: 64,
        groups: groups.clone(),
        ..cfg
    };
    let kv = HybridKvslotsBackend::hybrid(kvslots::BlockPool::new(96, 16), groups);
    let s = run(&kv, &reqs, &cfg);
    let inv = s.invariants();
    assert!(inv.ok(), "{inv:?}, {:?}", s.errors);
    assert_eq!(s.counts.requests_rejected, 0, "{:?}", s.counts);
    assert_eq!(s.counts.requests_completed, 2);
    assert_eq!(s.counts.prefix_hit_tokens, 512);
}
