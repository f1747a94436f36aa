//! One operation's cost on one thread, against the locks, as a figure that
//! a busy machine disturbs little: the *minimum* over many short batches of
//! the time per operation (a batch that another process interrupted is
//! slower, never faster), and a fixed number of operations per batch, so
//! that `valgrind --tool=callgrind` counts the instructions per operation
//! (two runs of different lengths, the difference divided by the
//! operations in between).
//!
//! | id | one operation |
//! |---|---|
//! | `prompt` | a 2,048-token prompt (128 blocks) appended to an empty sequence and truncated to 0; the locks: 128 ids taken from a `Mutex<Vec<u32>>` and given back |
//! | `alloc2_free` | `try_alloc(2)` + `free`; the locks: 2 ids taken and given back |
//! | `counter` | `SlotCounter::try_reserve(1..=4)` and the guard's drop; the peer: a bare `fetch_add`/`fetch_sub` pair |
//! | `mixed` | `benches/prefix.rs`'s mixed request (match a prompt's cached prefix, append the rest, publish, drop) on a 512-block pool; the locks: the same policy under one lock a call |
//!
//! Each id runs on `kvslots` and on its peers: `kvslots`, `std_mutex`,
//! `parking_lot` (`fetch_pair` for `counter`).
//!
//! Run: `cargo bench --bench cost` (every row, 200 batches each), or the
//! binary with `ID PEER BATCHES` (e.g. `target/release/deps/cost-* prompt
//! kvslots 200`). Instructions per operation: the binary under
//! `valgrind --tool=callgrind` with 5 batches and with 15, the difference
//! divided by 10 batches' operations (the `ops` it prints per batch).

mod support;

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use kvslots::{BlockHash, BlockId, BlockPool, Sequence, SlotCounter};
use support::cache::{mixed_prompts, Cache, BS, EXTRA, MIXED_POOL, PROMPT_BLOCKS};
use support::{Lock, MutexFreeList, PlMutexFreeList, StdMutexFreeList};

/// Blocks of the `prompt` and `alloc2_free` pools (as in `benches/pool.rs`).
const BLOCKS: usize = 4096;
/// Tokens of the `prompt` row: 128 blocks of 16.
const PROMPT: usize = 2048;

/// A row: its operations per batch, and a batch.
struct Row {
    ops: u64,
    batch: Box<dyn FnMut(u64)>,
}

fn prompt_row(peer: &str) -> Row {
    let batch: Box<dyn FnMut(u64)> = match peer {
        "kvslots" => {
            let pool = Arc::new(BlockPool::new(BLOCKS, BS));
            let mut seq = Sequence::with_capacity(pool, PROMPT);
            Box::new(move |n| {
                for _ in 0..n {
                    if black_box(seq.try_append(PROMPT).is_ok()) {
                        seq.truncate(0);
                    }
                }
            })
        }
        "std_mutex" => locked_prompt(StdMutexFreeList::new(BLOCKS)),
        "parking_lot" => locked_prompt(PlMutexFreeList::new(BLOCKS)),
        _ => unknown(peer),
    };
    Row { ops: 200, batch }
}

fn locked_prompt<L: Lock<Vec<u32>> + 'static>(list: MutexFreeList<L>) -> Box<dyn FnMut(u64)> {
    let mut ids = Vec::with_capacity(PROMPT / BS);
    Box::new(move |n| {
        for _ in 0..n {
            if black_box(list.take(PROMPT / BS, &mut ids)) {
                list.give(&ids);
                ids.clear();
            }
        }
    })
}

fn alloc2_free_row(peer: &str) -> Row {
    let batch: Box<dyn FnMut(u64)> = match peer {
        "kvslots" => {
            let pool = BlockPool::new(BLOCKS, BS);
            let mut ids: Vec<BlockId> = Vec::with_capacity(2);
            Box::new(move |n| {
                for _ in 0..n {
                    if pool.try_alloc(2, &mut ids).is_ok() {
                        pool.free(black_box(&ids)).expect("frees what it took");
                    }
                    ids.clear();
                }
            })
        }
        "std_mutex" => locked_alloc2(StdMutexFreeList::new(BLOCKS)),
        "parking_lot" => locked_alloc2(PlMutexFreeList::new(BLOCKS)),
        _ => unknown(peer),
    };
    Row { ops: 2000, batch }
}

fn locked_alloc2<L: Lock<Vec<u32>> + 'static>(list: MutexFreeList<L>) -> Box<dyn FnMut(u64)> {
    let mut ids = Vec::with_capacity(2);
    Box::new(move |n| {
        for _ in 0..n {
            if list.take(2, &mut ids) {
                list.give(black_box(&ids));
            }
            ids.clear();
        }
    })
}

fn counter_row(peer: &str) -> Row {
    let batch: Box<dyn FnMut(u64)> = match peer {
        "kvslots" => {
            let counter = SlotCounter::new(1 << 20);
            Box::new(move |n| {
                for i in 0..n {
                    let held = counter.try_reserve(1 + (i as usize & 3));
                    black_box(&held);
                }
            })
        }
        "fetch_pair" => {
            let used = AtomicUsize::new(0);
            Box::new(move |n| {
                for i in 0..n {
                    let k = 1 + (i as usize & 3);
                    // Acquire and Release, as an admission and a give-back
                    // of slots order.
                    used.fetch_add(k, Ordering::Acquire);
                    black_box(&used);
                    used.fetch_sub(k, Ordering::Release);
                }
            })
        }
        _ => unknown(peer),
    };
    Row { ops: 5000, batch }
}

fn mixed_row(peer: &str) -> Row {
    let prompts = mixed_prompts();
    let mut i = 0usize;
    let mut next = move || {
        i = (i + 7) % prompts.len();
        prompts[i].clone()
    };
    // The prompts' keys, in the order the batches use them (the same order
    // for every peer).
    let order: Vec<Vec<BlockHash>> = (0..128).map(|_| next()).collect();
    let batch: Box<dyn FnMut(u64)> = match peer {
        "kvslots" => {
            let pool = Arc::new(BlockPool::new(MIXED_POOL, BS));
            let mut seq = Sequence::with_capacity(pool, PROMPT_BLOCKS * BS + EXTRA);
            let mut r = 0;
            Box::new(move |n| {
                for _ in 0..n {
                    let keys = &order[r % order.len()];
                    r += 1;
                    let k = seq.try_match_prefix(keys);
                    if seq.try_append(PROMPT_BLOCKS * BS + EXTRA - k * BS).is_ok() {
                        seq.publish(keys);
                    }
                    black_box(seq.truncate(0));
                }
            })
        }
        "std_mutex" => locked_mixed(std::sync::Mutex::new(Cache::new(MIXED_POOL)), order),
        "parking_lot" => locked_mixed(parking_lot::Mutex::new(Cache::new(MIXED_POOL)), order),
        _ => unknown(peer),
    };
    Row { ops: 100, batch }
}

fn locked_mixed<L: Lock<Cache> + 'static>(
    cache: L,
    order: Vec<Vec<BlockHash>>,
) -> Box<dyn FnMut(u64)> {
    let mut table = Vec::with_capacity(PROMPT_BLOCKS + 1);
    let mut r = 0;
    Box::new(move |n| {
        for _ in 0..n {
            let keys = &order[r % order.len()];
            r += 1;
            table.clear();
            // One lock a call, as the library is called.
            let k = cache.with(|c| c.match_prefix(keys, &mut table));
            let blocks = (PROMPT_BLOCKS * BS + EXTRA).div_ceil(BS);
            if cache.with(|c| c.allocate(blocks - k, &mut table)) {
                cache.with(|c| c.publish(&table[..keys.len()], keys));
            }
            cache.with(|c| c.release(&table));
            black_box(&table);
        }
    })
}

fn unknown(peer: &str) -> ! {
    eprintln!("unknown peer {peer}");
    std::process::exit(2)
}

/// The minimum and the median of `batches` batches, in ns per operation.
fn measure(row: &mut Row, batches: usize) -> (f64, f64) {
    (row.batch)(row.ops); // warm up
    let mut times: Vec<f64> = (0..batches)
        .map(|_| {
            let began = Instant::now();
            (row.batch)(row.ops);
            began.elapsed().as_nanos() as f64 / row.ops as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[0], times[batches / 2])
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument picks a row.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let rows: &[(&str, &[&str])] = &[
        ("prompt", &["kvslots", "std_mutex", "parking_lot"]),
        ("alloc2_free", &["kvslots", "std_mutex", "parking_lot"]),
        ("counter", &["kvslots", "fetch_pair"]),
        ("mixed", &["kvslots", "std_mutex", "parking_lot"]),
    ];
    let run = |id: &str, peer: &str, batches: usize| {
        let mut row = match id {
            "prompt" => prompt_row(peer),
            "alloc2_free" => alloc2_free_row(peer),
            "counter" => counter_row(peer),
            "mixed" => mixed_row(peer),
            _ => unknown(id),
        };
        let (min, median) = measure(&mut row, batches);
        println!(
            "{id}/{peer}: min {min:.1} ns, median {median:.1} ns ({} ops a batch)",
            row.ops
        );
    };
    match args.as_slice() {
        [id, peer, batches] => run(id, peer, batches.parse().expect("BATCHES")),
        [] => {
            for (id, peers) in rows {
                for peer in *peers {
                    run(id, peer, 200);
                }
            }
        }
        _ => {
            eprintln!("usage: cost [ID PEER BATCHES]");
            std::process::exit(2);
        }
    }
}
