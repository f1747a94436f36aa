//! An async scheduler on tokio: every request is a task that waits in the
//! pool's queue until its whole prompt fits (`Sequence::reserve`), then
//! prefills and decodes with the lock-free `try_*` calls. More prompts
//! arrive than the cache holds at once, so most of them wait; each is
//! admitted whole, in arrival order, and everything is back at the end.
//!
//! Run it with `cargo run --example async_worker`.

use std::sync::Arc;

use kvslots::{BlockPool, Sequence};

/// The cache: 16 blocks of 16 token slots.
const BLOCKS: usize = 16;
const BLOCK_SIZE: usize = 16;
/// Blocks a new prompt leaves free for the running sequences' growth.
const HEADROOM: usize = 1;
/// Tokens each request decodes after its prompt.
const DECODE: usize = 8;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let pool = Arc::new(BlockPool::new(BLOCKS, BLOCK_SIZE));
    let prompts = [100, 40, 180, 64, 90, 120, 30, 150, 75, 60];
    let tasks: Vec<_> = prompts
        .iter()
        .map(|&prompt| {
            let pool = Arc::clone(&pool);
            tokio::spawn(async move {
                let mut seq = Sequence::new(pool);
                // Wait for the whole prompt (plus the decode), in arrival order.
                seq.reserve(prompt + DECODE, HEADROOM).await.unwrap();
                seq.try_append(prompt).unwrap(); // prefill: no allocation
                for _ in 0..DECODE {
                    tokio::task::yield_now().await; // a decode step
                    seq.try_append(1).unwrap();
                }
                seq.len()
            }) // the sequence drops here: its blocks go to the next waiter
        })
        .collect();
    let mut served = 0;
    for (task, prompt) in tasks.into_iter().zip(prompts) {
        assert_eq!(task.await.unwrap(), prompt + DECODE);
        served += 1;
    }
    println!(
        "served {served} requests; peak {} of {BLOCKS} blocks in use",
        pool.peak_used_blocks()
    );
    assert_eq!(served, prompts.len());
    assert_eq!((pool.free_blocks(), pool.waiters()), (BLOCKS, 0));
}
