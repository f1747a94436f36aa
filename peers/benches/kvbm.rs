//! kvslots against NVIDIA Dynamo's block manager, `kvbm-logical`, in the
//! same run.
//!
//! | group | one operation |
//! |---|---|
//! | `peer_alloc2_free` | take 2 blocks, all or nothing, and give them back: [`BlockPool::try_alloc`] + [`BlockPool::free`]; `BlockManager::allocate_blocks(2)` + the blocks' drop |
//! | `peer_prompt` | a 2,048-token prompt (128 blocks, all or nothing) taken and given back: [`Sequence::try_append`] + `truncate(0)`, as `benches/pool.rs`'s `prompt`; `allocate_blocks(128)` + the drop; throughput counts blocks |
//! | `peer_replay` | one request of the Mooncake conversation trace: match the cached prefix, allocate the rest, register the new full blocks, drop (`kvslots_peers::replay`) |
//!
//! Rows are `kvslots` and `kvbm_logical`, at 1, 2 and 8 threads (or the
//! counts in `KVSLOTS_BENCH_THREADS`, e.g. `1,2,4,8,16`). Blocks hold 16
//! tokens. The allocation groups use pools of 4,096 blocks, as
//! `benches/pool.rs` does. The replay uses a pool of 512,000 blocks (16,000
//! of the trace's 512-token blocks: about a quarter of the prompt blocks
//! hit with one thread), which each row keeps across its samples while a
//! shared cursor walks the trace in order (wrapping at its end); its time
//! is per prompt block (a request's blocks, matched or allocated), since
//! each row covers as much of the trace as its speed allows and the
//! requests' lengths vary a hundredfold. Keys are computed once, untimed,
//! each side with its own library (`kvslots_peers::trace`).
//!
//! Before the first replay row at each thread count, both sides replay the
//! same requests (the whole trace, or its first `KVSLOTS_REPLAY_PASS`
//! requests; none if 0) from an empty pool at that thread count, outside
//! criterion's timing, and a line starting `peer_replay hits` prints their
//! hit counts, evictions, refusals and wall times side by side.
//!
//! # Timing
//!
//! As in `benches/contention.rs`: the workers are spawned untimed, meet at
//! a barrier, each time its own share of the `iters` operations, and meet
//! again; the measured time runs from the first worker's start to the last
//! one's end, so criterion's time per iteration is the wall time per
//! operation of all threads together.
//!
//! Run: `cd peers && cargo bench` (or `cargo bench -- peer_replay`).

#[path = "../../benches/support/threads.rs"]
mod threads;

use std::cell::OnceCell;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Once, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use kvbm_logical::{BlockManager, MutableBlock, SequenceHash};
use kvslots::{BlockHash, BlockPool, Sequence};
use kvslots_peers::replay::{self, kvbm_manager, Kvbm, Kvslots, PrefixCache, G1};
use kvslots_peers::trace::{self, Keys};
use kvslots_peers::BLOCK_SIZE;
use threads::bench_threads;

/// Thread counts unless `KVSLOTS_BENCH_THREADS` says otherwise.
const THREADS: [usize; 3] = [1, 2, 8];
/// Blocks in the allocation groups' pools.
const BLOCKS: usize = 4096;
/// Tokens of the `peer_prompt` group's prompt: 128 blocks.
const PROMPT: usize = 2048;
/// Blocks in the replay's pools: 16,000 trace blocks of 512 tokens.
const REPLAY_BLOCKS: usize = 16_000 * trace::TRACE_BLOCK / BLOCK_SIZE;

/// Runs `iters` operations split over `threads` workers and returns the
/// time from the first worker's start to the last one's end. Each worker
/// calls `prepare()` untimed, then the operation it returned as many times
/// as its share.
fn run_workers<P, O>(threads: usize, iters: u64, prepare: P) -> Duration
where
    P: Fn() -> O + Sync,
    O: FnMut(),
{
    let start = Barrier::new(threads);
    let end = Barrier::new(threads);
    let per = iters / threads as u64;
    let extra = iters % threads as u64;
    let spans: Vec<(Instant, Instant)> = thread::scope(|s| {
        let workers: Vec<_> = (0..threads as u64)
            .map(|worker| {
                let (start, end, prepare) = (&start, &end, &prepare);
                let mine = per + u64::from(worker < extra);
                s.spawn(move || {
                    let mut op = prepare();
                    start.wait();
                    let t0 = Instant::now();
                    for _ in 0..mine {
                        op();
                    }
                    let t1 = Instant::now();
                    end.wait();
                    drop(op);
                    (t0, t1)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("benchmark worker panicked"))
            .collect()
    });
    let first = spans.iter().map(|s| s.0).min().expect("a worker");
    let last = spans.iter().map(|s| s.1).max().expect("a worker");
    last - first
}

/// Benchmarks `prepare`'s operation on `threads` threads as row `name`.
fn row<P, O>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, threads: usize, prepare: P)
where
    P: Fn() -> O + Sync,
    O: FnMut(),
{
    group.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &t| {
        b.iter_custom(|iters| run_workers(t, iters, &prepare))
    });
}

fn bench_alloc2_free(c: &mut Criterion) {
    let mut group = c.benchmark_group("peer_alloc2_free");
    group.throughput(Throughput::Elements(1));
    for threads in bench_threads(&THREADS) {
        let pool = BlockPool::new(BLOCKS, BLOCK_SIZE);
        row(&mut group, Kvslots::NAME, threads, || {
            let mut ids = Vec::with_capacity(2);
            let pool = &pool;
            move || {
                if pool.try_alloc(2, &mut ids).is_ok() {
                    pool.free(black_box(&ids))
                        .expect("the benchmark frees what it took");
                }
                ids.clear();
            }
        });
        let manager: BlockManager<G1> = kvbm_manager(BLOCKS);
        row(&mut group, Kvbm::NAME, threads, || {
            let manager = &manager;
            move || {
                let blocks: Option<Vec<MutableBlock<G1>>> = manager.allocate_blocks(2);
                drop(black_box(blocks));
            }
        });
    }
    group.finish();
}

fn bench_prompt(c: &mut Criterion) {
    let mut group = c.benchmark_group("peer_prompt");
    group.throughput(Throughput::Elements(PROMPT.div_ceil(BLOCK_SIZE) as u64));
    for threads in bench_threads(&THREADS) {
        let pool = Arc::new(BlockPool::new(BLOCKS, BLOCK_SIZE));
        row(&mut group, Kvslots::NAME, threads, || {
            let mut seq = Sequence::with_capacity(Arc::clone(&pool), PROMPT);
            move || {
                if black_box(seq.try_append(PROMPT).is_ok()) {
                    seq.truncate(0);
                }
            }
        });
        let manager: BlockManager<G1> = kvbm_manager(BLOCKS);
        row(&mut group, Kvbm::NAME, threads, || {
            let manager = &manager;
            move || {
                let blocks = manager.allocate_blocks(PROMPT.div_ceil(BLOCK_SIZE));
                drop(black_box(blocks));
            }
        });
    }
    group.finish();
}

/// Both sides' keys for the whole trace, computed on first use (two
/// threads, one a side).
fn trace_keys() -> &'static (Keys<BlockHash>, Keys<SequenceHash>) {
    static KEYS: OnceLock<(Keys<BlockHash>, Keys<SequenceHash>)> = OnceLock::new();
    KEYS.get_or_init(|| {
        let requests = trace::load();
        thread::scope(|s| {
            let kvbm = s.spawn(|| trace::kvbm_keys(&requests));
            let kvslots = trace::kvslots_keys(&requests);
            (kvslots, kvbm.join().expect("kvbm-logical's keys"))
        })
    })
}

/// The environment variable that sets how many requests of the trace
/// (from its start) each side-by-side replay runs.
const PASS_ENV: &str = "KVSLOTS_REPLAY_PASS";

/// Replays the trace's first `$KVSLOTS_REPLAY_PASS` requests (the whole
/// trace if unset; nothing if 0) once on each side at `threads` threads,
/// and prints the counts side by side.
fn print_side_by_side(threads: usize) {
    let (kv_keys, kvbm_keys) = trace_keys();
    let requests = match std::env::var(PASS_ENV) {
        Err(_) => kv_keys.len(),
        Ok(n) => n
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{PASS_ENV}={n:?}: {e}")),
    };
    if requests == 0 {
        return;
    }
    let kvslots = Kvslots::with_blocks(REPLAY_BLOCKS);
    let (kv, kv_time) = replay::replay(&kvslots, kv_keys, requests, threads);
    let kvbm_cache = Kvbm::with_blocks(REPLAY_BLOCKS);
    let (kvbm, kvbm_time) = replay::replay(&kvbm_cache, kvbm_keys, requests, threads);
    println!(
        "peer_replay hits, threads {threads}, the trace's first {} requests ({} full blocks; \
         pool of {REPLAY_BLOCKS} blocks): kvslots {} ({:.2}%), kvbm_logical {} ({:.2}%); \
         evictions {} / {}; refused {} / {}; wall {:.3} s / {:.3} s (kvslots {:.2}x)",
        kv.requests,
        kv.full_blocks,
        kv.hit_blocks,
        kv.hit_rate(),
        kvbm.hit_blocks,
        kvbm.hit_rate(),
        kv.evictions,
        kvbm.evictions,
        kv.refused,
        kvbm.refused,
        kv_time.as_secs_f64(),
        kvbm_time.as_secs_f64(),
        kvbm_time.as_secs_f64() / kv_time.as_secs_f64(),
    );
}

/// A replay row's cache and its place in the trace, kept across samples.
struct ReplayState<C> {
    cache: C,
    cursor: AtomicUsize,
}

/// Benchmarks one side's replay at `threads` threads, in nanoseconds per
/// prompt block (see the file's docs).
fn replay_row<C: PrefixCache>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    threads: usize,
    side_by_side: &Once,
    keys: impl Fn() -> &'static Keys<C::Key>,
) {
    let state: OnceCell<ReplayState<C>> = OnceCell::new();
    group.bench_with_input(BenchmarkId::new(C::NAME, threads), &threads, |b, &t| {
        side_by_side.call_once(|| print_side_by_side(t));
        let keys = keys();
        let state = state.get_or_init(|| ReplayState {
            cache: C::with_blocks(REPLAY_BLOCKS),
            cursor: AtomicUsize::new(0),
        });
        b.iter_custom(|iters| {
            let done = AtomicU64::new(0);
            let took = run_workers(t, t as u64, || {
                let (state, done) = (state, &done);
                // This worker's share of the `iters` blocks, in whole
                // requests: the last one may overshoot it.
                let share = iters.div_ceil(t as u64);
                move || {
                    let mut blocks = 0;
                    while blocks < share {
                        // Relaxed: only hands out trace positions; the
                        // caches order their own data.
                        let i = state.cursor.fetch_add(1, Ordering::Relaxed) % keys.len();
                        let (prompt, request_keys) = keys.request(i);
                        black_box(state.cache.request(prompt, request_keys));
                        blocks += prompt.div_ceil(BLOCK_SIZE) as u64;
                    }
                    // Relaxed: read after the workers are joined.
                    done.fetch_add(blocks, Ordering::Relaxed);
                }
            });
            // The time `iters` blocks take at the rate measured.
            took.mul_f64(iters as f64 / done.into_inner() as f64)
        })
    });
}

fn bench_replay(c: &mut Criterion) {
    let mut group = c.benchmark_group("peer_replay");
    group.throughput(Throughput::Elements(1));
    for threads in bench_threads(&THREADS) {
        let side_by_side = Once::new();
        replay_row::<Kvslots>(&mut group, threads, &side_by_side, || &trace_keys().0);
        replay_row::<Kvbm>(&mut group, threads, &side_by_side, || &trace_keys().1);
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = bench_alloc2_free, bench_prompt, bench_replay
}
criterion_main!(benches);
