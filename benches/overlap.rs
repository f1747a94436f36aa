//! The 2-thread figures of `BENCHMARKS.md`, from rounds in which both threads
//! really ran at once.
//!
//! ```text
//! cargo bench --bench overlap             # 20 rounds of 20,000 ops per peer
//! cargo bench --bench overlap -- 40 50000 # rounds, ops per round
//! ```
//!
//! On a 2-core machine shared with other jobs, a 2-thread criterion row
//! (`contention.rs`, `pool.rs`) often times one thread running alone while
//! the other waits for a core: a lock then looks uncontended, and a
//! lock-free structure loses the one thing it is for. This harness runs
//! each peer in rounds of two threads started at a barrier and keeps a
//! round only if
//!
//! * neither thread was preempted during its timed loop (its
//!   `nonvoluntary_ctxt_switches` in `/proc/thread-self/status` did not
//!   move; Linux only: elsewhere no round is discarded for this), and
//! * the two threads started and ended together: the start skew plus the
//!   end skew is under 5% of the round.
//!
//! Peers run in rotating order, one round each in turn, so that a slow
//! spell of the machine hits all of them alike; the figure per peer is the
//! median round, in nanoseconds per operation (both threads' operations
//! together), and the ratio is the peer's time over kvslots' (above 1x:
//! kvslots does more operations per second). Counted too: how many rounds
//! were discarded.
//!
//! Groups: `try_reserve` + drop of 1-4 slots on a `SlotCounter` of 2^20
//! (against a bare `fetch_add`/`fetch_sub` pair, `std::sync::Mutex<usize>`,
//! `parking_lot::Mutex<usize>` and `tokio::sync::Semaphore`), and
//! `try_alloc(2)` + `free` on a pool of 4,096 blocks (against
//! `std::sync::Mutex<Vec<u32>>` and `parking_lot::Mutex<Vec<u32>>` free
//! lists, and a one-shard `BlockPool`); a 2,048-token prompt (128 blocks)
//! appended to a sequence and truncated to 0 on the same pools (against
//! 128 ids taken from those free lists and given back), a tenth as many
//! operations a round; and `benches/prefix.rs`'s mixed request (match a
//! prompt's cached prefix, append the rest, publish, drop) on a 512-block
//! pool (against the same policy under one lock a call), a fiftieth as
//! many operations a round.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use kvslots::{BlockHash, BlockId, BlockPool, Sequence, SlotCounter};

mod support;

use support::cache::{mixed_prompts, Cache, BS, EXTRA, MIXED_POOL, PROMPT_BLOCKS};
use support::{
    Lock, MutexFreeList, PlMutexCounter, PlMutexFreeList, StdMutexCounter, StdMutexFreeList,
};

const THREADS: usize = 2;
const CAPACITY: usize = 1 << 20;
const BLOCKS: usize = 4096;
/// Tokens of the prompt group's prompt: 128 blocks of 16.
const PROMPT: usize = 2048;

/// One thread's share of a round: `ops` operations, given its index.
type Work<'a> = &'a (dyn Fn(usize, u64) + Sync);

/// This thread's involuntary context switches so far (0 off Linux).
fn preemptions() -> u64 {
    std::fs::read_to_string("/proc/thread-self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// One round of `ops` operations on each thread: its length, or `None` if
/// a thread was preempted or the threads did not overlap.
fn round(work: Work<'_>, ops: u64) -> Option<Duration> {
    let start = Barrier::new(THREADS);
    let clean = AtomicBool::new(true);
    let spans: Vec<(Instant, Instant)> = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (start, clean) = (&start, &clean);
                s.spawn(move || {
                    start.wait();
                    let before = preemptions();
                    let began = Instant::now();
                    work(t, ops);
                    let ended = Instant::now();
                    if preemptions() != before {
                        // Relaxed: read after the scope joins the threads.
                        clean.store(false, Ordering::Relaxed);
                    }
                    (began, ended)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let first = spans.iter().map(|s| s.0).min()?;
    let last = spans.iter().map(|s| s.1).max()?;
    let skew =
        (spans.iter().map(|s| s.0).max()? - first) + (last - spans.iter().map(|s| s.1).min()?);
    let length = last - first;
    // Relaxed: the threads were joined above.
    (clean.load(Ordering::Relaxed) && skew * 20 <= length).then_some(length)
}

/// Runs `peers` in rotating order for `rounds` kept rounds each and prints
/// the median of each, relative to the first.
fn compare(group: &str, peers: &[(&str, Work<'_>)], rounds: usize, ops: u64) {
    let mut kept: Vec<Vec<f64>> = vec![Vec::new(); peers.len()];
    let mut discarded = 0usize;
    for r in 0..rounds {
        for k in 0..peers.len() {
            let i = (k + r) % peers.len();
            loop {
                match round(peers[i].1, ops) {
                    Some(d) => {
                        kept[i].push(d.as_nanos() as f64 / (ops * THREADS as u64) as f64);
                        break;
                    }
                    None => discarded += 1,
                }
            }
        }
    }
    let medians: Vec<f64> = kept
        .iter_mut()
        .map(|v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        })
        .collect();
    println!("{group}: {THREADS} threads, {rounds} kept rounds of {ops} ops per thread per peer, {discarded} rounds discarded");
    for ((name, _), median) in peers.iter().zip(&medians) {
        println!(
            "  {name:<22} {median:8.1} ns/op   kvslots {:.2}x",
            median / medians[0]
        );
    }
}

/// Request sizes 1-4, different on each thread and iteration.
fn size(t: usize, i: u64) -> usize {
    1 + (t + i as usize) % 4
}

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .filter_map(|a| a.parse::<u64>().ok());
    let rounds = args.next().unwrap_or(20) as usize;
    let ops = args.next().unwrap_or(20_000);

    let counter = SlotCounter::new(CAPACITY);
    let fetch = CachePadded::new(AtomicUsize::new(0));
    let std_counter = StdMutexCounter::new(CAPACITY);
    let pl_counter = PlMutexCounter::new(CAPACITY);
    let semaphore = tokio::sync::Semaphore::new(CAPACITY);
    compare(
        "try_reserve + drop",
        &[
            ("kvslots", &|t, n| {
                for i in 0..n {
                    black_box(counter.try_reserve(size(t, i)).is_ok());
                }
            }),
            ("fetch_add/fetch_sub", &|t, n| {
                for i in 0..n {
                    let k = size(t, i);
                    // AcqRel/Release: the orderings an admission and a
                    // release would need.
                    if fetch.fetch_add(k, Ordering::AcqRel) + k <= CAPACITY {
                        black_box(());
                    }
                    fetch.fetch_sub(k, Ordering::Release);
                }
            }),
            ("std_mutex", &|t, n| {
                for i in 0..n {
                    let k = size(t, i);
                    if black_box(std_counter.take(k)) {
                        std_counter.give(k);
                    }
                }
            }),
            ("parking_lot_mutex", &|t, n| {
                for i in 0..n {
                    let k = size(t, i);
                    if black_box(pl_counter.take(k)) {
                        pl_counter.give(k);
                    }
                }
            }),
            ("tokio_semaphore", &|t, n| {
                for i in 0..n {
                    black_box(semaphore.try_acquire_many(size(t, i) as u32).is_ok());
                }
            }),
        ],
        rounds,
        ops,
    );

    let pool = BlockPool::new(BLOCKS, 16);
    let one_shard = BlockPool::with_shards(BLOCKS, 16, 1);
    let std_list = StdMutexFreeList::new(BLOCKS);
    let pl_list = PlMutexFreeList::new(BLOCKS);
    let alloc_free = |pool: &BlockPool, n: u64| {
        let mut ids: Vec<BlockId> = Vec::with_capacity(2);
        for _ in 0..n {
            if pool.try_alloc(2, &mut ids).is_ok() {
                pool.free(black_box(&ids)).unwrap();
            }
            ids.clear();
        }
    };
    compare(
        "try_alloc(2) + free",
        &[
            ("kvslots", &|_, n| alloc_free(&pool, n)),
            ("kvslots_1_shard", &|_, n| alloc_free(&one_shard, n)),
            ("std_mutex", &|_, n| {
                let mut ids: Vec<u32> = Vec::with_capacity(2);
                for _ in 0..n {
                    if std_list.take(2, &mut ids) {
                        std_list.give(black_box(&ids));
                    }
                    ids.clear();
                }
            }),
            ("parking_lot_mutex", &|_, n| {
                let mut ids: Vec<u32> = Vec::with_capacity(2);
                for _ in 0..n {
                    if pl_list.take(2, &mut ids) {
                        pl_list.give(black_box(&ids));
                    }
                    ids.clear();
                }
            }),
        ],
        rounds,
        ops,
    );

    let (pool, one_shard) = (Arc::new(pool), Arc::new(one_shard));
    let prompt = |pool: &Arc<BlockPool>, n: u64| {
        let mut seq = Sequence::with_capacity(Arc::clone(pool), PROMPT);
        for _ in 0..n {
            if black_box(seq.try_append(PROMPT).is_ok()) {
                seq.truncate(0);
            }
        }
    };
    compare(
        "prompt: 128 blocks appended, truncated to 0",
        &[
            ("kvslots", &|_, n| prompt(&pool, n)),
            ("kvslots_1_shard", &|_, n| prompt(&one_shard, n)),
            ("std_mutex", &|_, n| locked_prompt(&std_list, n)),
            ("parking_lot_mutex", &|_, n| locked_prompt(&pl_list, n)),
        ],
        rounds,
        (ops / 10).max(1),
    );

    let prompts = mixed_prompts();
    let mixed_pool = Arc::new(BlockPool::new(MIXED_POOL, BS));
    let std_cache = std::sync::Mutex::new(Cache::new(MIXED_POOL));
    let pl_cache = parking_lot::Mutex::new(Cache::new(MIXED_POOL));
    compare(
        "mixed: match, append, publish, drop",
        &[
            ("kvslots", &|t, n| {
                let mut seq =
                    Sequence::with_capacity(Arc::clone(&mixed_pool), PROMPT_BLOCKS * BS + EXTRA);
                for i in 0..n {
                    let keys = &prompts[prompt_of(t, i, prompts.len())];
                    let k = seq.try_match_prefix(keys);
                    if seq.try_append(PROMPT_BLOCKS * BS + EXTRA - k * BS).is_ok() {
                        seq.publish(keys);
                    }
                    black_box(seq.truncate(0));
                }
            }),
            ("std_mutex", &|t, n| {
                locked_mixed(&std_cache, &prompts, t, n)
            }),
            ("parking_lot_mutex", &|t, n| {
                locked_mixed(&pl_cache, &prompts, t, n)
            }),
        ],
        rounds,
        (ops / 50).max(1),
    );
}

/// `n` prompts' 128 ids taken from a locked free list and given back.
fn locked_prompt<L: Lock<Vec<u32>>>(list: &MutexFreeList<L>, n: u64) {
    let mut ids: Vec<u32> = Vec::with_capacity(PROMPT / BS);
    for _ in 0..n {
        if black_box(list.take(PROMPT / BS, &mut ids)) {
            list.give(&ids);
            ids.clear();
        }
    }
}

/// The prompt of thread `t`'s `i`-th mixed request: each thread walks the
/// prompts from its own offset, as in `benches/prefix.rs`.
fn prompt_of(t: usize, i: u64, prompts: usize) -> usize {
    ((i * 7 + t as u64 * 13) % prompts as u64) as usize
}

/// `n` mixed requests of thread `t` on a locked cache: four calls, one
/// lock each, as the library is called.
fn locked_mixed<L: Lock<Cache>>(cache: &L, prompts: &[Vec<BlockHash>], t: usize, n: u64) {
    let mut table = Vec::with_capacity(PROMPT_BLOCKS + 1);
    let blocks = (PROMPT_BLOCKS * BS + EXTRA).div_ceil(BS);
    for i in 0..n {
        let keys = &prompts[prompt_of(t, i, prompts.len())];
        table.clear();
        let k = cache.with(|c| c.match_prefix(keys, &mut table));
        if cache.with(|c| c.allocate(blocks - k, &mut table)) {
            cache.with(|c| c.publish(&table[..keys.len()], keys));
        }
        cache.with(|c| c.release(&table));
        black_box(&table);
    }
}
