//! Real threads racing publishes of one key: a publish never ends with the
//! key on no block while a holder is gone only because a rival trusted a
//! doomed claim.
//!
//! Each round, on a fresh pool of one-token blocks, three threads start
//! together. One publishes the key on a block, lets the block go, drops
//! every unreferenced key (`reset_prefix_cache`) and then publishes the key
//! again on a new block; the two others publish it once each. Every thread
//! keeps its last sequence until the round ends, so once all have returned
//! nothing can have taken the key away after the last publish began: the
//! key must be cached on exactly one block, exactly one of the held
//! sequences' publishes must have cached it, and a match must find it. A
//! rival whose claim lost to the first holder, and which a later publish
//! deferred to, must look again before it gives up; without that the key
//! can end on no block.

use std::sync::{Arc, Barrier};
use std::thread;

use kvslots::{BlockHash, BlockPool, Sequence};

mod common;
use common::one_block_sequences;

/// Rounds of the race (shrunk by `KVSLOTS_STRESS_ROUNDS` for quick runs).
fn rounds() -> usize {
    std::env::var("KVSLOTS_STRESS_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3_000)
}

#[test]
fn a_publish_that_begins_after_the_last_holder_went_leaves_its_key_cached() {
    let key = BlockHash([7; 32]);
    for round in 0..rounds() {
        let pool = Arc::new(BlockPool::new(6, 1));
        // The last publish gets the highest block id, so that it defers to
        // a rival's claim rather than killing it.
        let mut seqs = one_block_sequences(&pool, 4);
        let mut last = seqs.pop().unwrap();
        let mut first = seqs.remove(0);
        let start = Arc::new(Barrier::new(3));
        let resetter = {
            let (pool, start) = (Arc::clone(&pool), Arc::clone(&start));
            thread::spawn(move || {
                start.wait();
                first.publish(&[key]);
                drop(first);
                pool.reset_prefix_cache();
                let n = last.publish(&[key]);
                (last, n)
            })
        };
        let rivals: Vec<_> = seqs
            .into_iter()
            .map(|mut seq| {
                let start = Arc::clone(&start);
                thread::spawn(move || {
                    start.wait();
                    let n = seq.publish(&[key]);
                    (seq, n)
                })
            })
            .collect();
        let (last, last_n) = resetter.join().unwrap();
        let rivals: Vec<(Sequence, usize)> =
            rivals.into_iter().map(|r| r.join().unwrap()).collect();
        let published = last_n + rivals.iter().map(|(_, n)| n).sum::<usize>();
        assert_eq!(
            (pool.cached_blocks(), published),
            (1, 1),
            "round {round}: the key is on {} blocks after publishes that \
             returned {last_n} and {:?}",
            pool.cached_blocks(),
            rivals.iter().map(|(_, n)| n).collect::<Vec<_>>()
        );
        let mut matcher = Sequence::new(Arc::clone(&pool));
        assert_eq!(matcher.try_match_prefix(&[key]), 1, "round {round}");
        drop((matcher, last, rivals));
        assert_eq!(pool.used_blocks(), 0, "round {round}");
    }
}
