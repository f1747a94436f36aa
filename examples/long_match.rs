//! The time of one long prefix match: a chain of `BLOCKS` cached blocks
//! in a pool of `POOL` blocks of one token, matched whole by a new
//! sequence, the median of `RUNS` matches (BENCHMARKS.md, "64-bit release
//! stamps and a match filter sized to the pool"). With `--spread`, the
//! chain's blocks are ids spread over the pool (four sequences appended
//! in turn, as decoding ones take blocks), not one run.
//!
//! `cargo run --release --example long_match -- POOL BLOCKS [RUNS] [--spread]`
//! (defaults: 65536 40000 7).

use std::sync::Arc;
use std::time::Instant;

use kvslots::{hash_blocks, BlockPool, Sequence};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let spread = args.iter().any(|a| a == "--spread");
    let nums: Vec<usize> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(|a| a.parse().expect("POOL BLOCKS [RUNS]: numbers"))
        .collect();
    let pool_blocks = nums.first().copied().unwrap_or(65_536);
    let blocks = nums.get(1).copied().unwrap_or(40_000);
    let runs = nums.get(2).copied().unwrap_or(7).max(1);
    assert!(blocks <= pool_blocks, "the chain must fit the pool");
    let pool = Arc::new(BlockPool::new(pool_blocks, 1));
    let tokens: Vec<u32> = (0..blocks as u32).collect();
    let mut keys = Vec::new();
    hash_blocks(b"long", &tokens, 1, &mut keys);
    // The chain, published: one sequence, or the first of four that take
    // blocks in turn (its blocks then lie every fourth id or so).
    let mut seqs: Vec<Sequence> = (0..if spread { 4 } else { 1 })
        .map(|_| Sequence::with_capacity(Arc::clone(&pool), blocks))
        .collect();
    for _ in 0..blocks {
        for seq in &mut seqs {
            if seq.len() < blocks && pool.free_blocks() > 0 {
                seq.try_append(1).expect("room in the pool");
            }
        }
    }
    assert_eq!(seqs[0].publish(&keys), blocks);
    drop(seqs);
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let mut seq = Sequence::with_capacity(Arc::clone(&pool), blocks);
            let began = Instant::now();
            let hit = seq.try_match_prefix(&keys);
            let took = began.elapsed().as_secs_f64();
            assert_eq!(hit, blocks);
            took
        })
        .collect();
    times.sort_by(f64::total_cmp);
    println!(
        "pool {pool_blocks}, match of {blocks} blocks{}: median {:.3} ms ({runs} runs)",
        if spread { " (spread ids)" } else { "" },
        times[runs / 2] * 1e3
    );
}
