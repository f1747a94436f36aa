//! Prefix caching: worker threads serve multi-turn conversations that all
//! start with one shared system prompt. Each request matches the cached
//! blocks of its prompt, prefills only the rest, publishes its full blocks
//! and lets go; the next turn of the conversation (which re-sends the whole
//! history) finds them cached. The pool is small, so unreferenced cached
//! blocks are evicted, least recently released first.
//!
//! Run it with `cargo run --release --example prefix_cache`.

use std::sync::Arc;
use std::thread;

use kvslots::{hash_blocks, BlockPool, Sequence};

/// Tokens per block.
const BLOCK_SIZE: usize = 16;
/// Blocks in the pool.
const BLOCKS: usize = 256;
/// The shared system prompt's length in tokens.
const SYSTEM: usize = 100;
/// Worker threads, conversations per worker, and turns per conversation.
const WORKERS: u32 = 4;
const CONVERSATIONS: u32 = 6;
const TURNS: u32 = 5;

fn main() {
    let pool = Arc::new(BlockPool::new(BLOCKS, BLOCK_SIZE));
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let (mut prompt_tokens, mut prefilled) = (0, 0);
                let mut keys = Vec::new();
                for c in 0..CONVERSATIONS {
                    // The system prompt, then this conversation's turns.
                    let mut history: Vec<u32> = (0..SYSTEM as u32).collect();
                    for turn in 0..TURNS {
                        let user = 1_000_000 * (w + 1) + 10_000 * c + 100 * turn;
                        history.extend(user..user + 40);
                        keys.clear();
                        hash_blocks(b"tenant", &history, BLOCK_SIZE, &mut keys);
                        let mut seq = Sequence::new(Arc::clone(&pool));
                        let hit = seq.try_match_prefix(&keys);
                        debug_assert_eq!(seq.len(), hit * BLOCK_SIZE);
                        let rest = history.len() - seq.len();
                        if seq.try_append(rest).is_err() {
                            continue; // the pool is full for now: skip this turn
                        }
                        // ... the model prefills `rest` tokens here, into
                        // the blocks after the `hit` matched ones ...
                        seq.publish(&keys);
                        prompt_tokens += history.len();
                        prefilled += rest;
                        // The model's answer joins the history.
                        history.extend(user + 50..user + 70);
                    }
                }
                (prompt_tokens, prefilled)
            })
        })
        .collect();
    let (mut prompt_tokens, mut prefilled) = (0, 0);
    for w in workers {
        let (p, f) = w.join().expect("worker panicked");
        prompt_tokens += p;
        prefilled += f;
    }
    let stats = pool.prefix_stats();
    println!("prompt tokens:        {prompt_tokens}");
    println!(
        "served from cache:    {} ({:.1}%)",
        prompt_tokens - prefilled,
        100.0 * (prompt_tokens - prefilled) as f64 / prompt_tokens as f64
    );
    println!(
        "blocks queried / hit: {} / {}",
        stats.queried_blocks, stats.hit_blocks
    );
    println!("evictions:            {}", stats.evictions);
    println!(
        "cached blocks:        {} ({} evictable)",
        pool.cached_blocks(),
        pool.evictable_blocks()
    );
    assert_eq!(pool.used_blocks(), 0, "every sequence gave its blocks back");
    assert_eq!(pool.free_blocks(), BLOCKS);
}
