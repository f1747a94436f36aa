//! Shuttle schedules of racing publishes of one key (see `scripts/shuttle`):
//! the real-thread race in `tests/prefix_publish.rs`, explored by the random
//! and PCT schedulers, which reach the narrow windows real threads rarely
//! hit.
//!
//! Three threads on a pool of one-token blocks: one publishes the key, lets
//! its block go, drops every unreferenced key and publishes the key again
//! on a new block; two others publish it once each. Every thread keeps its
//! last sequence, so afterwards the key must be cached on exactly one
//! block, cached by exactly one of those publishes, and a match must find
//! it. The schedule that loses the key: a rival claims before the first
//! holder commits, loses to it in its rescan, and while its claim stands
//! the holder goes and the last publish defers to the rival's claim (the
//! lower block id wins); the rival must look again before it gives up.
//! Shuttle's atomics are sequentially consistent, so this checks the
//! protocol's logic; loom (`src/loom_tests/prefix_misuse.rs`) checks the
//! same race under the weaker orderings, with a negative control.
#![cfg(kvslots_shuttle)]

use std::sync::Arc;

use kvslots::{BlockHash, BlockPool, Sequence};
use shuttle::thread;

mod common;
mod shuttle_runner;
use common::one_block_sequences;
use shuttle_runner::{check_pct, check_random, iterations};

const KEY: BlockHash = BlockHash([7; 32]);

fn three_publishers() {
    let pool = Arc::new(BlockPool::new(6, 1));
    // The last publish gets the highest block id, so that it defers to a
    // rival's claim rather than killing it.
    let mut seqs = one_block_sequences(&pool, 4);
    let mut last = seqs.pop().unwrap();
    let mut first = seqs.remove(0);
    let resetter = {
        let pool = Arc::clone(&pool);
        thread::spawn(move || {
            first.publish(&[KEY]);
            drop(first);
            pool.reset_prefix_cache();
            let n = last.publish(&[KEY]);
            (last, n)
        })
    };
    let rivals: Vec<_> = seqs
        .into_iter()
        .map(|mut seq| {
            thread::spawn(move || {
                let n = seq.publish(&[KEY]);
                (seq, n)
            })
        })
        .collect();
    let (last, last_n) = resetter.join().unwrap();
    let rivals: Vec<(Sequence, usize)> = rivals.into_iter().map(|r| r.join().unwrap()).collect();
    let published = last_n + rivals.iter().map(|(_, n)| n).sum::<usize>();
    assert_eq!(
        (pool.cached_blocks(), published),
        (1, 1),
        "the key is on {} blocks after publishes that returned {last_n} and {:?}",
        pool.cached_blocks(),
        rivals.iter().map(|(_, n)| n).collect::<Vec<_>>()
    );
    let mut matcher = Sequence::new(Arc::clone(&pool));
    assert_eq!(matcher.try_match_prefix(&[KEY]), 1);
    drop((matcher, last, rivals));
    assert_eq!(pool.used_blocks(), 0);
}

#[test]
fn three_publishers_leave_the_key_on_one_block_random() {
    check_random(three_publishers, iterations(2_000));
}

#[test]
fn three_publishers_leave_the_key_on_one_block_pct() {
    check_pct(three_publishers, iterations(20_000));
}
