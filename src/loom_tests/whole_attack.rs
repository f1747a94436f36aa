//! Loom models of whole-word fresh bits on a short word: a pool of 20
//! blocks in one shard has one bitmap word of 20 ids, so a sequence's take
//! of all 20 marks the word with a store, its count of all 20 (a fork)
//! clears it with a `Release` store, and a give-back of part of them (a
//! truncate) is a read-modify-write beside a rival's take of what went
//! back.
//!
//! Run with `scripts/loom whole_attack`.
//!
//! | model | threads, blocks | negative control, caught |
//! |---|---|---|
//! | [`short_word_fork_vs_reader_and_rival`]: a sequence holding a whole short word forks while a reader reads `ref_count` of its first block; then parent and child drop while a rival sequence takes 8 blocks | 3, 20 | `relaxed_fresh_clear`: the reader sees the bit cleared but the word still bare, and reads 0 |
//! | [`short_word_fence_complete_vs_drop_and_rival`]: a sequence holding a whole short word fences its last 8 blocks; the fence completes on one thread while the sequence drops the rest on another and a rival takes 8 blocks on a third | 3, 20 | `fresh_store_any_word`: the completion's clear stores the whole word while the sequence still holds the rest, which then reads as counted |
//! | [`two_shards_whole_and_partial_give_back_vs_rival`]: in a pool of two shards of 8 blocks (a whole word each), a sequence takes both words, gives back one word and half of the other in one truncate, while a rival takes 8 blocks | 2, 16 | `fresh_store_any_word`: the truncate's clear of half a word stores 0 over the sequence's other half |
//! | [`short_word_truncate_then_rest_vs_rival`]: a sequence holding a whole short word gives back 8 of its blocks, then the rest, while a rival sequence takes 8 blocks and gives them back | 2, 20 | `fresh_store_any_word`: the truncate's clear, or the rival's mark or clear, stores the whole word while the other holds part of it |
use std::sync::Arc;

use crate::loom_tests::fresh::{
    assert_whole, fresh_sequence_alone, pool, RELAXED_FRESH_CLEAR, UNHELD,
};
use crate::loom_tests::pool_world::{check, LOST, SOUND};
use crate::sync::Faults;
use crate::{BlockPool, Sequence};
use loom::thread;

/// The store-anywhere control (see the module doc).
const FRESH_STORE_ANY_WORD: Faults = Faults {
    fresh_store_any_word: true,
    ..SOUND
};

/// Blocks in the pool: one word of 20 ids (short: its whole bits are
/// `0xF_FFFF`, not `u64::MAX`).
const N: usize = 20;

/// A rival sequence that takes 8 blocks if they are free (fresh: they come
/// from one word), checks that each reads one reference (a block of the
/// rival's read as unheld is a block the pool lost track of), and drops
/// them.
fn rival(pool: Arc<BlockPool>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut seq = Sequence::new(Arc::clone(&pool));
        if seq.try_append(8 * pool.block_size()).is_ok() {
            for &id in seq.blocks() {
                assert_eq!(
                    pool.ref_count(id),
                    Some(1),
                    "{LOST}: the rival's {id} {UNHELD}"
                );
            }
        }
    })
}

/// A sequence takes the whole short word (a store of its fresh bits),
/// then forks (a count of every block, then a `Release` store of 0) while
/// a reader reads `ref_count` of its first block; then the parent and the
/// child drop (counted blocks) while a rival takes 8 fresh blocks of the
/// same word and gives them back.
fn short_word_fork_vs_reader_and_rival(faults: Faults) {
    check(move || {
        let pool = pool(N, 1, faults);
        let seq = fresh_sequence_alone(&pool, N);
        let id = seq.blocks()[0];
        let reader = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || pool.ref_count(id).expect("in range"))
        };
        let (child, _) = seq.try_fork().expect("full blocks are shared");
        let count = reader.join().expect("the read does not panic");
        assert!((1..=2).contains(&count), "{id} {UNHELD}: ref_count {count}");
        let rival = rival(Arc::clone(&pool));
        drop(seq);
        drop(child);
        rival.join().expect("the rival does not panic");
        assert_whole(&pool);
    });
}

/// A sequence takes the whole short word, then gives back its last 8
/// blocks (a clear of part of the word) and then the rest (a clear of the
/// rest), while a rival takes 8 fresh blocks of the word (a mark of part
/// of it) if they are free, and gives them back.
fn short_word_truncate_then_rest_vs_rival(faults: Faults) {
    check(move || {
        let pool = pool(N, 1, faults);
        let mut seq = fresh_sequence_alone(&pool, N);
        let rival = rival(Arc::clone(&pool));
        let bs = pool.block_size();
        assert_eq!(seq.truncate((N - 8) * bs), 8);
        assert_eq!(seq.truncate(0), N - 8);
        drop(seq);
        rival.join().expect("the rival does not panic");
        assert_whole(&pool);
    });
}

/// A sequence takes the whole short word, fences its last 8 blocks (the
/// fence holds their uncounted references); a completer gives them back
/// (a clear of part of the word) while the sequence drops the other 12 (a
/// clear of the rest) and a rival takes 8 fresh blocks if they are free.
fn short_word_fence_complete_vs_drop_and_rival(faults: Faults) {
    check(move || {
        let pool = pool(N, 1, faults);
        let mut seq = fresh_sequence_alone(&pool, N);
        let bs = pool.block_size();
        assert_eq!(seq.truncate_fenced((N - 8) * bs, 1), 8);
        let completer = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || pool.complete(1))
        };
        let rival = rival(Arc::clone(&pool));
        drop(seq);
        assert_eq!(completer.join().expect("the completion does not panic"), 8);
        rival.join().expect("the rival does not panic");
        assert_eq!(pool.pending_release_blocks(), 0, "{LOST}: fenced blocks");
        assert_whole(&pool);
    });
}

#[test]
fn short_word_fence_complete_vs_drop_and_rival_sound() {
    short_word_fence_complete_vs_drop_and_rival(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn short_word_fence_complete_vs_drop_and_rival_fresh_store_any_word_is_caught() {
    short_word_fence_complete_vs_drop_and_rival(FRESH_STORE_ANY_WORD);
}

/// A pool of 16 blocks in two shards of 8 (each shard one word, taken
/// whole by a take of 8): a sequence takes all 16 (two whole words, two
/// stores), gives back 12 in one truncate (a whole word, a store of 0, and
/// half of the other, a read-modify-write) while a rival sequence takes 8
/// fresh blocks if they are free (a whole word) and gives them back; then
/// the sequence forks what it kept (fewer than a word: counted) and both
/// drop.
fn two_shards_whole_and_partial_give_back_vs_rival(faults: Faults) {
    check(move || {
        let pool = Arc::new(BlockPool::with_faults(16, 1, 2, faults));
        let mut seq = fresh_sequence_alone(&pool, 16);
        let rival = rival(Arc::clone(&pool));
        assert_eq!(seq.truncate(4), 12);
        for &id in seq.blocks() {
            assert_eq!(pool.ref_count(id), Some(1), "{LOST}: {id} {UNHELD}");
        }
        let (child, _) = seq.try_fork().expect("full blocks are shared");
        drop(seq);
        drop(child);
        rival.join().expect("the rival does not panic");
        assert_whole(&pool);
    });
}

#[test]
fn two_shards_whole_and_partial_give_back_vs_rival_sound() {
    two_shards_whole_and_partial_give_back_vs_rival(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn two_shards_whole_and_partial_give_back_vs_rival_fresh_store_any_word_is_caught() {
    two_shards_whole_and_partial_give_back_vs_rival(FRESH_STORE_ANY_WORD);
}

#[test]
fn short_word_fork_vs_reader_and_rival_sound() {
    short_word_fork_vs_reader_and_rival(SOUND);
}

#[test]
#[should_panic(expected = "read as unheld")]
fn short_word_fork_vs_reader_and_rival_relaxed_fresh_clear_is_caught() {
    short_word_fork_vs_reader_and_rival(RELAXED_FRESH_CLEAR);
}

#[test]
fn short_word_truncate_then_rest_vs_rival_sound() {
    short_word_truncate_then_rest_vs_rival(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn short_word_truncate_then_rest_vs_rival_fresh_store_any_word_is_caught() {
    short_word_truncate_then_rest_vs_rival(FRESH_STORE_ANY_WORD);
}
