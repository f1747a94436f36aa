//! Loom models of fresh blocks: a sequence's take of at least
//! `FRESH_MIN` (8) blocks from one word of the free list writes no state
//! word, marks the blocks in the free list's fresh bitmap instead (one
//! `fetch_or` for the word, a store when the take emptied the word), and
//! gives them
//! back by clearing those bits and setting their free bits; a fork or a
//! publish counts the references first (a store of the state word, then a
//! Release clear of the fresh bits). See `refs.rs`, "Fresh blocks".
//!
//! The models of 8 blocks take the whole word (its marks, counts and
//! clears are stores); the models of 16 blocks take part of it
//! (read-modify-writes).
//!
//! Run with `scripts/loom fresh`.
//!
//! After the threads are done, every model checks that every block is
//! free, unreferenced and unmarked, that the used count and the admission
//! counts are exact, and that taking every block hands each out once.
//!
//! | model | threads, blocks | negative control, caught |
//! |---|---|---|
//! | [`two_takes_in_one_word`]: two sequences take 8 fresh blocks each from one bitmap word and give them back | 2, 16 | `plain_fresh_mark`: a mark with a load and a plain store loses the other's mark or clear; `fresh_store_any_word`: a mark or clear that stores the whole word while the other holds part of it does too |
//! | [`fork_of_fresh_blocks`]: a sequence of 8 fresh blocks forks; parent and child drop at once | 2, 8 | `fresh_kept`: the count leaves the fresh bits set, so the parent gives back blocks the child holds |
//! | [`publish_of_a_fresh_block_vs_match`]: a sequence publishes the first of its 8 fresh blocks and drops them while another matches the key | 2, 8 | `fresh_kept`: the published block is given back as fresh while it is cached |
//! | [`ref_count_vs_fork`]: `ref_count` of a fresh block while its sequence forks | 2, 8 | `relaxed_fresh_clear`: the reader sees the bit cleared but the word still bare, and reads 0 |
//! | [`raw_free_vs_fresh_drop`]: a raw free of a fresh block (a double free) while its sequence drops | 2, 8 | `free_ignores_sequence`: the raw free takes the uncounted reference, and the block goes back twice |
//!
//! `two_takes_in_one_word` and `raw_free_vs_fresh_drop` also run with the
//! main thread's sequence retired under a fence that the same thread then
//! completes (`*_one_retired_*`, `raw_free_vs_fresh_retire_*`): a
//! completed fence gives back a run of fresh blocks as the sequence's own
//! release does, with the same controls caught.
//!
//! Two more models put the fence's retire and complete on different
//! threads (the completer sees the fresh bits that the retirer's thread
//! marked only through the fence map's mutex):
//!
//! | model | threads, blocks | negative control, caught |
//! |---|---|---|
//! | [`retire_vs_complete_vs_take`]: a sequence of 8 fresh blocks is retired under fence 1 on one thread while another completes fence 1 and the main thread takes and drops the other 8 blocks of the word | 3, 16 | `plain_fresh_mark`, `fresh_store_any_word` (as above) |
//! | [`two_retirements_vs_complete`]: two sequences of 8 fresh blocks each (the whole word between them) are retired under fence 1 on two threads while the main thread completes it: the fence's list may be one run of the whole word (its fresh bits cleared with a store) or two lists given back by two completes | 3, 16 | `fresh_store_any_word`: the first list's clear stores over the word and wipes the other sequence's marks |
use std::sync::Arc;

use crate::loom_tests::pool_world::{
    check, check_one_preemption, DOUBLE, FREE_IGNORES_SEQUENCE, LOST, SOUND,
};
use crate::sync::Faults;
use crate::{hash_blocks, BlockHash, BlockId, BlockPool, FreeError, Sequence};
use loom::thread;

/// The plain-mark control (see the module doc).
const PLAIN_FRESH_MARK: Faults = Faults {
    plain_fresh_mark: true,
    ..SOUND
};

/// The kept-bit control (see the module doc).
const FRESH_KEPT: Faults = Faults {
    fresh_kept: true,
    ..SOUND
};

/// The store-anywhere control (see the module doc).
const FRESH_STORE_ANY_WORD: Faults = Faults {
    fresh_store_any_word: true,
    ..SOUND
};

/// The relaxed-clear control (see the module doc).
pub(super) const RELAXED_FRESH_CLEAR: Faults = Faults {
    relaxed_fresh_clear: true,
    ..SOUND
};

/// What a model asserts when `ref_count` reads no reference on a block
/// that a sequence holds throughout.
pub(super) const UNHELD: &str = "read as unheld";

/// A pool of `num_blocks` blocks of `block_size` slots, one shard (one
/// bitmap word), built with `faults`.
pub(super) fn pool(num_blocks: usize, block_size: usize, faults: Faults) -> Arc<BlockPool> {
    Arc::new(BlockPool::with_faults(num_blocks, block_size, 1, faults))
}

/// A sequence over `pool` holding `blocks` fresh blocks (as many full
/// blocks' tokens).
fn fresh_sequence(pool: &Arc<BlockPool>, blocks: usize) -> Sequence {
    let mut seq = Sequence::new(Arc::clone(pool));
    seq.try_append(blocks * pool.block_size())
        .expect("room for the sequence");
    seq
}

/// [`fresh_sequence`], on a thread with no other: checks that its blocks
/// are marked fresh.
pub(super) fn fresh_sequence_alone(pool: &Arc<BlockPool>, blocks: usize) -> Sequence {
    let seq = fresh_sequence(pool, blocks);
    assert!(
        seq.blocks().iter().all(|&id| pool.is_fresh(id)),
        "a take of {blocks} blocks is fresh"
    );
    seq
}

/// The pool once everything is back: every block free, unreferenced and
/// unmarked, the books exact, and every block handed out once.
pub(super) fn assert_whole(pool: &BlockPool) {
    let n = pool.num_blocks();
    for i in 0..n {
        let id = BlockId::new(i as u32);
        assert_eq!(pool.ref_count(id), Some(0), "{LOST}: {id}'s count");
        assert!(!pool.is_fresh(id), "{LOST}: {id} still marked fresh");
    }
    assert_eq!(pool.used_blocks(), 0, "{LOST}: used blocks");
    assert_eq!(
        pool.admission_free_uncapped(),
        n,
        "{LOST}: admission counts"
    );
    let mut all = Vec::new();
    pool.try_alloc(n, &mut all)
        .unwrap_or_else(|e| panic!("{LOST}: the whole pool cannot be taken: {e}"));
    let mut sorted = all.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), n, "{DOUBLE}");
    pool.free(&all).expect("just taken");
}

/// How a model's sequence gives its blocks back.
#[derive(Clone, Copy)]
enum GiveBack {
    /// Dropped.
    Drop,
    /// Retired under fence 1, which the same thread then completes (an
    /// asynchronous scheduler's finished request).
    Retire,
}

impl GiveBack {
    /// Gives `seq`'s blocks back to `pool` this way.
    fn give(self, pool: &BlockPool, seq: Sequence) {
        match self {
            GiveBack::Drop => drop(seq),
            GiveBack::Retire => {
                let held = seq.blocks().len();
                assert_eq!(seq.retire(1), held, "every block retired");
                assert_eq!(pool.complete(1), held, "{LOST}: the fence's blocks");
            }
        }
    }
}

/// Two sequences each take 8 fresh blocks of the same bitmap word (a
/// 16-block pool) and give them back, on two threads (the main thread's
/// dropped or retired and its fence completed): their marks and clears of
/// the fresh word interleave with each other's takes and give-backs.
/// Under `plain_fresh_mark` a mark can overwrite the other's mark or
/// clear: a fresh block then reads as counted and is never given back, or
/// a given-back one stays marked.
fn two_takes_in_one_word(faults: Faults, how: GiveBack) {
    check(move || {
        let pool = pool(16, 1, faults);
        let other = Arc::clone(&pool);
        let t = thread::spawn(move || drop(fresh_sequence(&other, 8)));
        how.give(&pool, fresh_sequence(&pool, 8));
        t.join().expect("the other sequence does not panic");
        assert_whole(&pool);
    });
}

/// A sequence of 8 fresh blocks forks (the fork counts the parent's
/// references, then adds the child's); the parent and the child drop on
/// two threads. Under `fresh_kept` the blocks stay marked after the count:
/// the parent gives them back as fresh while the child holds them.
fn fork_of_fresh_blocks(faults: Faults) {
    // Two drops of references to a run of eight blocks (the smallest run
    // taken fresh): one preemption (see `check_one_preemption`).
    check_one_preemption(move || {
        let pool = pool(8, 1, faults);
        let parent = fresh_sequence_alone(&pool, 8);
        let (child, copy) = parent.try_fork().expect("full blocks are shared");
        assert!(copy.is_none());
        for &id in parent.blocks() {
            assert_eq!(pool.ref_count(id), Some(2), "{id} shared");
        }
        let t = thread::spawn(move || drop(child));
        drop(parent);
        t.join().expect("the child's drop does not panic");
        assert_whole(&pool);
    });
}

/// A sequence holds 8 fresh blocks of 2 slots; on one thread it publishes
/// the key of its first block (counted first, then claimed and cached)
/// and drops all 8 (the cached one becomes evictable, the 7 fresh ones go
/// back to the free list); on another, a new sequence matches that key
/// and drops what it matched. Then the key is evicted by taking the whole
/// pool. Under `fresh_kept` the published block stays marked, and the
/// drop gives it back to the free list while it is cached.
fn publish_of_a_fresh_block_vs_match(faults: Faults) {
    check(move || {
        let pool = pool(8, 2, faults);
        let mut keys: Vec<BlockHash> = Vec::new();
        hash_blocks(b"", &[1, 2], 2, &mut keys);
        let mut seq = fresh_sequence_alone(&pool, 8);
        let matcher = {
            let pool = Arc::clone(&pool);
            let keys = keys.clone();
            thread::spawn(move || {
                let mut other = Sequence::new(pool);
                let hit = other.try_match_prefix(&keys);
                assert!(hit <= 1);
            })
        };
        assert_eq!(seq.publish(&keys), 1, "the first block is published");
        drop(seq);
        matcher.join().expect("the match does not panic");
        assert_eq!(pool.evictable_blocks(), 1, "{LOST}: the cached block");
        assert_whole(&pool);
    });
}

/// `ref_count` of a fresh block reads a reference while the sequence that
/// holds it forks on another thread (and keeps both sequences until the
/// read is done): the count is written into the state word, then the
/// fresh bit cleared. A read that finds the bit clear reads the word
/// again, and must find the count: under `relaxed_fresh_clear` it need
/// not, and reads 0.
fn ref_count_vs_fork(faults: Faults) {
    check(move || {
        let pool = pool(8, 1, faults);
        let seq = fresh_sequence_alone(&pool, 8);
        let id = seq.blocks()[0];
        let reader = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || pool.ref_count(id).expect("in range"))
        };
        let (child, _) = seq.try_fork().expect("full blocks are shared");
        let count = reader.join().expect("the read does not panic");
        drop((seq, child));
        assert!((1..=2).contains(&count), "{id} {UNHELD}: ref_count {count}");
        assert_whole(&pool);
    });
}

/// A raw free lists a fresh block of a sequence (a double free: the
/// caller does not hold it) while the sequence drops (or is retired and
/// its fence completed) on another thread: the free is refused
/// (`HeldBySequence`, or `NotAllocated` once the block is back) and drops
/// nothing. Under `free_ignores_sequence` it takes the uncounted
/// reference, and the block goes back twice.
fn raw_free_vs_fresh_drop(faults: Faults, how: GiveBack) {
    check(move || {
        let pool = pool(8, 1, faults);
        let seq = fresh_sequence_alone(&pool, 8);
        let id = seq.blocks()[3];
        let freer = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || pool.free(&[id]))
        };
        how.give(&pool, seq);
        let freed = freer.join().expect("the free does not panic");
        match freed {
            Err(FreeError::HeldBySequence { id: e } | FreeError::NotAllocated { id: e }) => {
                assert_eq!(e, id);
            }
            other => panic!("{DOUBLE}: a raw free of a fresh block returned {other:?}"),
        }
        assert_whole(&pool);
    });
}

#[test]
fn two_takes_in_one_word_sound() {
    two_takes_in_one_word(SOUND, GiveBack::Drop);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn two_takes_in_one_word_plain_fresh_mark_is_caught() {
    two_takes_in_one_word(PLAIN_FRESH_MARK, GiveBack::Drop);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn two_takes_in_one_word_fresh_store_any_word_is_caught() {
    two_takes_in_one_word(FRESH_STORE_ANY_WORD, GiveBack::Drop);
}

#[test]
fn two_takes_in_one_word_one_retired_sound() {
    two_takes_in_one_word(SOUND, GiveBack::Retire);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn two_takes_in_one_word_one_retired_plain_fresh_mark_is_caught() {
    two_takes_in_one_word(PLAIN_FRESH_MARK, GiveBack::Retire);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn two_takes_in_one_word_one_retired_fresh_store_any_word_is_caught() {
    two_takes_in_one_word(FRESH_STORE_ANY_WORD, GiveBack::Retire);
}

#[test]
fn fork_of_fresh_blocks_sound() {
    fork_of_fresh_blocks(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn fork_of_fresh_blocks_fresh_kept_is_caught() {
    fork_of_fresh_blocks(FRESH_KEPT);
}

#[test]
fn publish_of_a_fresh_block_vs_match_sound() {
    publish_of_a_fresh_block_vs_match(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn publish_of_a_fresh_block_vs_match_fresh_kept_is_caught() {
    publish_of_a_fresh_block_vs_match(FRESH_KEPT);
}

#[test]
fn ref_count_vs_fork_sound() {
    ref_count_vs_fork(SOUND);
}

#[test]
#[should_panic(expected = "read as unheld")]
fn ref_count_vs_fork_relaxed_fresh_clear_is_caught() {
    ref_count_vs_fork(RELAXED_FRESH_CLEAR);
}

#[test]
fn raw_free_vs_fresh_drop_sound() {
    raw_free_vs_fresh_drop(SOUND, GiveBack::Drop);
}

#[test]
#[should_panic(expected = "handed out twice")]
fn raw_free_vs_fresh_drop_free_ignores_sequence_is_caught() {
    raw_free_vs_fresh_drop(FREE_IGNORES_SEQUENCE, GiveBack::Drop);
}

#[test]
fn raw_free_vs_fresh_retire_sound() {
    raw_free_vs_fresh_drop(SOUND, GiveBack::Retire);
}

#[test]
#[should_panic(expected = "handed out twice")]
fn raw_free_vs_fresh_retire_free_ignores_sequence_is_caught() {
    raw_free_vs_fresh_drop(FREE_IGNORES_SEQUENCE, GiveBack::Retire);
}

/// See the module doc. A complete that runs before the retire gives back
/// nothing; the main thread completes again at the end.
fn retire_vs_complete_vs_take(faults: Faults) {
    check(move || {
        let pool = pool(16, 1, faults);
        let seq = fresh_sequence_alone(&pool, 8);
        let retirer = thread::spawn(move || seq.retire(1));
        let completer = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || pool.complete(1))
        };
        drop(fresh_sequence(&pool, 8));
        assert_eq!(retirer.join().unwrap(), 8, "the retirement");
        let first = completer.join().unwrap();
        assert_eq!(first + pool.complete(1), 8, "{LOST}: the fence's blocks");
        assert_whole(&pool);
    });
}

/// See the module doc.
fn two_retirements_vs_complete(faults: Faults) {
    check(move || {
        let pool = pool(16, 1, faults);
        let a = fresh_sequence(&pool, 8);
        let b = fresh_sequence(&pool, 8);
        let ta = thread::spawn(move || a.retire(1));
        let tb = thread::spawn(move || b.retire(1));
        let first = pool.complete(1);
        assert_eq!(
            ta.join().unwrap() + tb.join().unwrap(),
            16,
            "the retirements"
        );
        assert_eq!(first + pool.complete(1), 16, "{LOST}: the fence's blocks");
        assert_whole(&pool);
    });
}

#[test]
fn retire_vs_complete_vs_take_sound() {
    retire_vs_complete_vs_take(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn retire_vs_complete_vs_take_plain_fresh_mark_is_caught() {
    retire_vs_complete_vs_take(PLAIN_FRESH_MARK);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn retire_vs_complete_vs_take_fresh_store_any_word_is_caught() {
    retire_vs_complete_vs_take(FRESH_STORE_ANY_WORD);
}

#[test]
fn two_retirements_vs_complete_sound() {
    two_retirements_vs_complete(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn two_retirements_vs_complete_fresh_store_any_word_is_caught() {
    two_retirements_vs_complete(FRESH_STORE_ANY_WORD);
}
