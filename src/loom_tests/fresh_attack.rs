//! Loom models of raw reads of fresh blocks against the count that a
//! publish makes (not a fork's), and against a count whose fresh word
//! another sequence's give-back changes too: a reader that acquires the
//! give-back's `Relaxed` clear of the word must still see the count,
//! through the release sequence that the count's `Release` clear heads.
//!
//! Run with `scripts/loom fresh_attack`.
//!
//! | model | threads, blocks | negative control, caught |
//! |---|---|---|
//! | [`ref_count_vs_publish`]: `ref_count` of a fresh block while its sequence publishes it | 2, 8 | `relaxed_fresh_clear`: the reader reads 0 |
//! | [`ref_count_vs_fork_beside_a_give_back`]: `ref_count` of a fresh block while its sequence forks and another gives back its fresh blocks of the same word | 3, 16 | `relaxed_fresh_clear`: the reader reads 0 |
use std::sync::Arc;

use crate::loom_tests::fresh::{
    assert_whole, fresh_sequence_alone, pool, RELAXED_FRESH_CLEAR, UNHELD,
};
use crate::loom_tests::pool_world::{check, SOUND};
use crate::sync::Faults;
use crate::{hash_blocks, BlockHash};
use loom::thread;

/// `ref_count` of a fresh block while its sequence publishes it (counts
/// it, then claims and commits it) on another thread: the read finds the
/// fresh bit set, or the count.
fn ref_count_vs_publish(faults: Faults) {
    check(move || {
        let pool = pool(8, 1, faults);
        let mut keys: Vec<BlockHash> = Vec::new();
        hash_blocks(b"", &[7], 1, &mut keys);
        let mut seq = fresh_sequence_alone(&pool, 8);
        let id = seq.blocks()[0];
        let reader = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || pool.ref_count(id).expect("in range"))
        };
        assert_eq!(seq.publish(&keys), 1);
        let count = reader.join().expect("the read does not panic");
        assert_eq!(count, 1, "{id} {UNHELD}: ref_count {count}");
        drop(seq);
        assert_eq!(pool.reset_prefix_cache(), 1);
        assert_whole(&pool);
    });
}

/// Two sequences hold 8 fresh blocks each of one bitmap word; one forks
/// (counting its blocks: a store of each word, then a `Release` clear of
/// its bits) while the other gives its blocks back (a `Relaxed` clear of
/// its bits, in the same word) and a third thread reads `ref_count` of
/// the forking sequence's first block.
fn ref_count_vs_fork_beside_a_give_back(faults: Faults) {
    check(move || {
        let pool = pool(16, 1, faults);
        let seq = fresh_sequence_alone(&pool, 8);
        let other = fresh_sequence_alone(&pool, 8);
        let id = seq.blocks()[0];
        let reader = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || pool.ref_count(id).expect("in range"))
        };
        let giver = thread::spawn(move || drop(other));
        let (child, _) = seq.try_fork().expect("full blocks are shared");
        let count = reader.join().expect("the read does not panic");
        giver.join().expect("the drop does not panic");
        drop((seq, child));
        assert!((1..=2).contains(&count), "{id} {UNHELD}: ref_count {count}");
        assert_whole(&pool);
    });
}

#[test]
fn ref_count_vs_publish_sound() {
    ref_count_vs_publish(SOUND);
}

#[test]
#[should_panic(expected = "read as unheld")]
fn ref_count_vs_publish_relaxed_fresh_clear_is_caught() {
    ref_count_vs_publish(RELAXED_FRESH_CLEAR);
}

#[test]
fn ref_count_vs_fork_beside_a_give_back_sound() {
    ref_count_vs_fork_beside_a_give_back(SOUND);
}

#[test]
#[should_panic(expected = "read as unheld")]
fn ref_count_vs_fork_beside_a_give_back_relaxed_fresh_clear_is_caught() {
    ref_count_vs_fork_beside_a_give_back(RELAXED_FRESH_CLEAR);
}
