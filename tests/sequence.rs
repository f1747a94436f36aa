//! Every `Sequence` method, and every bad input: each refusal is checked for
//! its typed error AND for leaving the sequence (length, capacity, block
//! table) and the pool (counts, peak and every block's reference count)
//! unchanged.
//!
//! Also the sharing rules of forks: full blocks are shared, a partly filled
//! tail gets a private copy, nothing is ever written into a block another
//! sequence can read (copy-on-write after truncating into a shared prefix),
//! and dropping gives every reference back. And blocks reserved ahead of the
//! length (`try_reserve`, `capacity`, `shrink_to_fit`): whole-prompt
//! admission, then chunked prefill.

use std::collections::HashSet;
use std::sync::Arc;

use kvslots::{BlockCopy, BlockId, BlockPool, PositionError, ReserveError, Sequence};

mod common;
use common::{pool_snap, seq_snap, PoolSnap, SeqSnap, XorShift};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn pool(num_blocks: usize, block_size: usize) -> Arc<BlockPool> {
    Arc::new(BlockPool::new(num_blocks, block_size))
}

/// Everything observable about a sequence and its pool.
fn state(seq: &Sequence) -> (SeqSnap, PoolSnap) {
    (seq_snap(seq), pool_snap(seq.pool()))
}

/// The formula the slot mapping must follow.
fn expected_slot(seq: &Sequence, position: usize) -> usize {
    let bs = seq.pool().block_size();
    seq.blocks()[position / bs].index() * bs + position % bs
}

/// The table invariant: exactly the blocks `len` tokens need.
fn assert_table_fits(seq: &Sequence) {
    let bs = seq.pool().block_size();
    assert_eq!(
        seq.blocks().len(),
        seq.len().div_ceil(bs),
        "len {} with {} blocks of {bs}",
        seq.len(),
        seq.blocks().len()
    );
    let set: HashSet<BlockId> = seq.blocks().iter().copied().collect();
    assert_eq!(set.len(), seq.blocks().len(), "a block listed twice");
    for &id in seq.blocks() {
        let refs = seq.pool().ref_count(id).expect("in range");
        assert!(refs >= 1, "{id} in a table without a reference");
    }
}

/// Asserts that `try_append(n)` refuses with `expected` and that neither the
/// sequence nor the pool changed.
fn assert_append_refused(seq: &mut Sequence, n: usize, expected: ReserveError) {
    let (seq_before, pool_before) = (seq_snap(seq), pool_snap(seq.pool()));
    // A plain append into a shared tail panics (naming `try_append_cow`)
    // before it changes anything; any other is refused.
    let bs = seq.pool().block_size();
    let shared_tail =
        seq.len() % bs != 0 && seq.pool().ref_count(seq.blocks()[seq.len() / bs]) > Some(1);
    if shared_tail {
        let plain = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| seq.try_append(n)));
        assert!(plain.is_err(), "try_append({n}) into a shared tail");
    } else {
        assert_eq!(seq.try_append(n), Err(expected), "try_append({n})");
    }
    assert_eq!(
        seq_snap(seq),
        seq_before,
        "a refused append changed the table"
    );
    assert_eq!(
        pool_snap(seq.pool()),
        pool_before,
        "a refused append changed the pool"
    );
    assert_eq!(seq.try_append_cow(n), Err(expected), "try_append_cow({n})");
    assert_eq!(seq_snap(seq), seq_before);
    assert_eq!(pool_snap(seq.pool()), pool_before);
}

// ---------------------------------------------------------------------------
// new, with_capacity and the accessors
// ---------------------------------------------------------------------------

#[test]
fn new_is_empty_and_takes_nothing() {
    let pool = pool(4, 8);
    let seq = Sequence::new(Arc::clone(&pool));
    assert_eq!((seq.len(), seq.is_empty()), (0, true));
    assert!(seq.blocks().is_empty());
    assert!(Arc::ptr_eq(seq.pool(), &pool));
    assert_eq!(pool.free_blocks(), 4);
    assert_eq!(seq.slot(0), None);
    drop(seq);
    assert_eq!(pool.free_blocks(), 4);
    assert_eq!(Arc::strong_count(&pool), 1);
}

#[test]
fn with_capacity_never_reallocates_the_table_up_to_that_length() {
    let pool = pool(16, 4);
    let mut seq = Sequence::with_capacity(Arc::clone(&pool), 30); // 8 blocks
    assert!(seq.is_empty());
    assert_eq!(pool.used_blocks(), 0);
    let table = seq.blocks().as_ptr();
    for n in [1, 3, 5, 4, 9, 8] {
        seq.try_append(n).unwrap();
        assert_eq!(seq.blocks().as_ptr(), table, "table reallocated");
    }
    assert_eq!((seq.len(), seq.blocks().len()), (30, 8));
    drop(seq);
    assert_eq!(pool.free_blocks(), 16);
}

#[test]
fn with_capacity_zero_is_new() {
    let pool = pool(4, 4);
    let mut seq = Sequence::with_capacity(Arc::clone(&pool), 0);
    assert!(seq.is_empty());
    seq.try_append(5).unwrap();
    assert_eq!(seq.blocks().len(), 2);
}

#[test]
fn with_capacity_beyond_the_pool_is_only_a_hint() {
    // A hint larger than the pool could ever fill must not reserve (or fail
    // to reserve) a table for it: the table never needs more than
    // `num_blocks` entries.
    let pool = pool(4, 4);
    let mut seq = Sequence::with_capacity(Arc::clone(&pool), usize::MAX);
    assert!(seq.is_empty());
    assert_eq!(pool.used_blocks(), 0);
    assert_eq!(seq.try_append(16).unwrap(), 0..16);
    drop(seq);
    assert_eq!(pool.free_blocks(), 4);
}

#[test]
fn debug_shows_len_and_blocks() {
    let pool = pool(4, 4);
    let mut seq = Sequence::new(pool);
    seq.try_append(5).unwrap();
    let text = format!("{seq:?}");
    assert!(text.contains("len: 5"), "{text}");
    assert!(text.contains(&format!("{:?}", seq.blocks()[1])), "{text}");
}

// ---------------------------------------------------------------------------
// try_append
// ---------------------------------------------------------------------------

#[test]
fn append_zero_returns_an_empty_range_and_changes_nothing() {
    let pool = pool(4, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    for len in [0, 3, 4] {
        seq.truncate(0);
        seq.try_append(len).unwrap();
        let (s, p) = (seq_snap(&seq), pool_snap(&pool));
        assert_eq!(seq.try_append(0).unwrap(), len..len);
        assert_eq!(seq.try_append_cow(0).unwrap(), (len..len, None));
        assert_eq!((seq_snap(&seq), pool_snap(&pool)), (s, p));
    }
    // Even on a closed pool and on a pool with no blocks.
    pool.close();
    assert_eq!(seq.try_append(0).unwrap(), 4..4);
    let mut empty = Sequence::new(self::pool(0, 4));
    assert_eq!(empty.try_append(0).unwrap(), 0..0);
    assert!(empty.blocks().is_empty());
}

#[test]
fn append_within_the_tail_block_takes_no_block() {
    let pool = pool(4, 8);
    let mut seq = Sequence::new(Arc::clone(&pool));
    assert_eq!(seq.try_append(3).unwrap(), 0..3);
    assert_eq!((seq.blocks().len(), pool.used_blocks()), (1, 1));
    let first = seq.blocks()[0];
    assert_eq!(seq.try_append(2).unwrap(), 3..5);
    assert_eq!(seq.try_append(1).unwrap(), 5..6);
    assert_eq!(seq.blocks(), [first]);
    assert_eq!((seq.len(), pool.used_blocks()), (6, 1));
    assert_table_fits(&seq);
}

#[test]
fn append_exactly_filling_a_block_takes_no_extra_block() {
    let pool = pool(4, 8);
    let mut seq = Sequence::new(Arc::clone(&pool));
    assert_eq!(seq.try_append(8).unwrap(), 0..8);
    assert_eq!((seq.blocks().len(), pool.used_blocks()), (1, 1));
    assert_eq!(seq.try_append(5).unwrap(), 8..13);
    assert_eq!(seq.try_append(3).unwrap(), 13..16);
    assert_eq!((seq.blocks().len(), pool.used_blocks()), (2, 2));
    // The next token needs a new block.
    assert_eq!(seq.try_append(1).unwrap(), 16..17);
    assert_eq!((seq.blocks().len(), pool.used_blocks()), (3, 3));
    assert_table_fits(&seq);
}

#[test]
fn append_spanning_several_blocks_takes_them_all_at_once() {
    let pool = pool(8, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(1).unwrap();
    let first = seq.blocks()[0];
    // 1 + 14 = 15 tokens: 4 blocks, 3 of them new.
    assert_eq!(seq.try_append(14).unwrap(), 1..15);
    assert_eq!(seq.blocks()[0], first);
    assert_eq!((seq.blocks().len(), pool.used_blocks()), (4, 4));
    assert_table_fits(&seq);
    // A prefill of the whole rest of the pool.
    assert_eq!(seq.try_append(17).unwrap(), 15..32);
    assert_eq!((seq.blocks().len(), pool.free_blocks()), (8, 0));
    assert_table_fits(&seq);
    drop(seq);
    assert_eq!(pool.free_blocks(), 8);
}

#[test]
fn append_with_block_size_one() {
    let pool = pool(5, 1);
    let mut seq = Sequence::new(Arc::clone(&pool));
    assert_eq!(seq.try_append(3).unwrap(), 0..3);
    assert_eq!(seq.blocks().len(), 3);
    assert_eq!(seq.try_append(2).unwrap(), 3..5);
    // The whole pool is its own: a sixth block can never come.
    assert_append_refused(
        &mut seq,
        1,
        ReserveError::NeverFits {
            requested: 1,
            capacity: 0,
        },
    );
    for p in 0..5 {
        assert_eq!(seq.slot(p), Some(seq.blocks()[p].index()));
    }
}

#[test]
fn append_that_does_not_fit_now_is_full_and_changes_nothing() {
    let pool = pool(4, 4);
    let mut other = Sequence::new(Arc::clone(&pool));
    other.try_append(8).unwrap(); // 2 of 4 blocks
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(5).unwrap(); // 2 blocks, 3 slots of room
    assert_eq!(pool.free_blocks(), 0);
    // 4 tokens need 1 new block (room is 3): counted in blocks.
    assert_append_refused(
        &mut seq,
        4,
        ReserveError::Full {
            requested: 1,
            available: 0,
        },
    );
    drop(other);
    // 9 tokens need 2 new blocks; with a third holder's block only 1 is
    // free.
    let mut third = Sequence::new(Arc::clone(&pool));
    third.try_append(1).unwrap();
    assert_append_refused(
        &mut seq,
        9,
        ReserveError::Full {
            requested: 2,
            available: 1,
        },
    );
    drop(third);
    // 13 tokens need 3 new blocks, and only 2 are not its own.
    assert_append_refused(
        &mut seq,
        13,
        ReserveError::NeverFits {
            requested: 3,
            capacity: 2,
        },
    );
    // The room left still takes 3 tokens, and then 8 more fit exactly.
    assert_eq!(seq.try_append(3).unwrap(), 5..8);
    assert_eq!(seq.try_append(8).unwrap(), 8..16);
    assert_eq!(pool.free_blocks(), 0);
}

#[test]
fn append_larger_than_the_pool_never_fits_and_changes_nothing() {
    let pool = pool(4, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    assert_append_refused(
        &mut seq,
        17,
        ReserveError::NeverFits {
            requested: 5,
            capacity: 4,
        },
    );
    seq.try_append(3).unwrap(); // room 1, and 3 blocks left beside its 1
    assert_append_refused(
        &mut seq,
        18,
        ReserveError::NeverFits {
            requested: 5,
            capacity: 3,
        },
    );
    assert_append_refused(
        &mut seq,
        usize::MAX,
        ReserveError::NeverFits {
            requested: (usize::MAX - 1).div_ceil(4),
            capacity: 3,
        },
    );
    assert_append_refused(
        &mut seq,
        usize::MAX - 3,
        ReserveError::NeverFits {
            requested: (usize::MAX - 4).div_ceil(4),
            capacity: 3,
        },
    );
    assert_eq!((seq.len(), seq.blocks().len()), (3, 1));
}

#[test]
fn append_usize_max_with_block_size_one_changes_nothing() {
    let pool = pool(3, 1);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(2).unwrap(); // 1 block left beside its 2
    assert_append_refused(
        &mut seq,
        usize::MAX,
        ReserveError::NeverFits {
            requested: usize::MAX,
            capacity: 1,
        },
    );
    assert_append_refused(
        &mut seq,
        usize::MAX - 2,
        ReserveError::NeverFits {
            requested: usize::MAX - 2,
            capacity: 1,
        },
    );
}

#[test]
fn append_on_a_pool_without_blocks_never_fits() {
    let mut seq = Sequence::new(pool(0, 4));
    assert_append_refused(
        &mut seq,
        1,
        ReserveError::NeverFits {
            requested: 1,
            capacity: 0,
        },
    );
    assert_append_refused(
        &mut seq,
        usize::MAX,
        ReserveError::NeverFits {
            requested: usize::MAX.div_ceil(4),
            capacity: 0,
        },
    );
}

#[test]
fn append_needing_a_block_on_a_closed_pool_is_refused() {
    let pool = pool(4, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(4).unwrap();
    pool.close();
    assert_append_refused(&mut seq, 1, ReserveError::Closed);
    assert_append_refused(&mut seq, 9, ReserveError::Closed);
    // Closed wins over never fitting.
    assert_append_refused(&mut seq, 100, ReserveError::Closed);
    assert_append_refused(&mut seq, usize::MAX, ReserveError::Closed);
}

#[test]
fn append_within_held_blocks_works_on_a_closed_pool() {
    // Closing a pool stops new allocations so that workers can drain; a
    // running sequence that needs no new block allocates nothing and must
    // be able to finish its block (as `try_fork` on a block boundary and
    // `try_append(0)` also work on a closed pool).
    let pool = pool(4, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(2).unwrap();
    pool.close();
    let before = pool_snap(&pool);
    assert_eq!(seq.try_append(2), Ok(2..4));
    assert_eq!(pool_snap(&pool), before);
    assert_eq!(seq.blocks().len(), 1);
}

#[test]
fn appends_take_distinct_blocks_across_sequences() {
    let pool = pool(12, 4);
    let mut seqs: Vec<Sequence> = (0..3).map(|_| Sequence::new(Arc::clone(&pool))).collect();
    for (i, n) in [5, 9, 3, 7, 4, 12].into_iter().enumerate() {
        seqs[i % 3].try_append(n).unwrap();
    }
    let mut all = HashSet::new();
    for seq in &seqs {
        assert_table_fits(seq);
        for &id in seq.blocks() {
            assert!(all.insert(id), "{id} in two tables");
            assert_eq!(pool.ref_count(id), Some(1));
        }
    }
    assert_eq!(all.len(), pool.used_blocks());
}

// ---------------------------------------------------------------------------
// slot and extend_slots
// ---------------------------------------------------------------------------

#[test]
fn slot_follows_the_formula_at_every_position() {
    for bs in [1, 3, 4, 16] {
        let pool = pool(64, bs);
        let mut noise = Sequence::new(Arc::clone(&pool));
        let mut seq = Sequence::new(Arc::clone(&pool));
        // Interleave with another sequence so the blocks are not 0, 1, 2...
        for n in [1, 2 * bs + 1, bs, 3, 1] {
            seq.try_append(n).unwrap();
            noise.try_append(bs).unwrap();
        }
        for p in 0..seq.len() {
            assert_eq!(seq.slot(p), Some(expected_slot(&seq, p)), "position {p}");
            assert!(seq.slot(p).unwrap() < 64 * bs);
        }
        // All slots distinct (no two positions share a slot).
        let slots: HashSet<usize> = (0..seq.len()).map(|p| seq.slot(p).unwrap()).collect();
        assert_eq!(slots.len(), seq.len());
        for p in [seq.len(), seq.len() + 1, usize::MAX] {
            assert_eq!(seq.slot(p), None, "position {p}");
        }
    }
}

#[test]
fn slot_is_none_on_an_empty_sequence_and_past_a_truncation() {
    let pool = pool(4, 4);
    let mut seq = Sequence::new(pool);
    assert_eq!(seq.slot(0), None);
    seq.try_append(7).unwrap();
    let s5 = seq.slot(5);
    seq.truncate(5);
    assert_eq!(seq.slot(5), None);
    assert_eq!(seq.slot(6), None);
    assert_eq!(seq.slot(4), Some(expected_slot(&seq, 4)));
    seq.try_append(1).unwrap();
    assert_eq!(seq.slot(5), s5); // same block, same offset
}

#[test]
fn extend_slots_matches_slot_for_every_range() {
    let pool = pool(16, 4);
    let mut noise = Sequence::new(Arc::clone(&pool));
    let mut seq = Sequence::new(Arc::clone(&pool));
    for n in [3, 6, 1, 4] {
        seq.try_append(n).unwrap();
        noise.try_append(3).unwrap();
    }
    let len = seq.len();
    assert_eq!(len, 14);
    for start in 0..=len {
        for end in start..=len {
            let mut out = vec![usize::MAX, 7];
            seq.extend_slots(start..end, &mut out).unwrap();
            let expected: Vec<usize> = [usize::MAX, 7]
                .into_iter()
                .chain((start..end).map(|p| seq.slot(p).unwrap()))
                .collect();
            assert_eq!(out, expected, "range {start}..{end}");
        }
    }
}

#[test]
fn extend_slots_of_an_empty_range_appends_nothing() {
    let pool = pool(4, 4);
    let mut seq = Sequence::new(pool);
    let mut out = vec![1, 2, 3];
    // Empty ranges anywhere, even past the end, are fine and append nothing.
    for r in [0..0, 5..5, usize::MAX..usize::MAX] {
        seq.extend_slots(r.clone(), &mut out).unwrap();
        assert_eq!(out, [1, 2, 3], "{r:?}");
    }
    seq.try_append(6).unwrap();
    #[allow(clippy::reversed_empty_ranges)]
    for r in [3..3, 6..6, 5..2, 100..7] {
        seq.extend_slots(r.clone(), &mut out).unwrap();
        assert_eq!(out, [1, 2, 3], "{r:?}");
    }
}

#[test]
fn extend_slots_past_len_is_an_error_and_leaves_out_unchanged() {
    let pool = pool(4, 4);
    let mut seq = Sequence::new(pool);
    let mut out = vec![9, 8, 7];
    assert_eq!(
        seq.extend_slots(0..1, &mut out),
        Err(PositionError {
            position: 0,
            len: 0
        })
    );
    seq.try_append(6).unwrap();
    for (range, position) in [
        (0..7, 6),
        (5..7, 6),
        (6..7, 6),
        (2..100, 99),
        (6..usize::MAX, usize::MAX - 1),
        (0..usize::MAX, usize::MAX - 1),
        (usize::MAX - 1..usize::MAX, usize::MAX - 1),
    ] {
        assert_eq!(
            seq.extend_slots(range.clone(), &mut out),
            Err(PositionError { position, len: 6 }),
            "{range:?}"
        );
        assert_eq!(out, [9, 8, 7], "{range:?} changed out");
    }
    // The longest valid range still works.
    seq.extend_slots(0..6, &mut out).unwrap();
    assert_eq!(out.len(), 9);
}

#[test]
fn position_error_displays_position_and_len() {
    let e = PositionError {
        position: 12,
        len: 10,
    };
    let text = e.to_string();
    assert!(text.contains("12") && text.contains("10"), "{text}");
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(e);
    assert_eq!(boxed.to_string(), text);
}

// ---------------------------------------------------------------------------
// truncate
// ---------------------------------------------------------------------------

#[test]
fn truncate_at_or_past_len_is_a_no_op() {
    let pool = pool(4, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    assert_eq!(seq.truncate(0), 0);
    assert_eq!(seq.truncate(usize::MAX), 0);
    seq.try_append(6).unwrap();
    let (s, p) = (seq_snap(&seq), pool_snap(&pool));
    for len in [6, 7, 8, 100, usize::MAX] {
        assert_eq!(seq.truncate(len), 0, "truncate({len})");
        assert_eq!((seq_snap(&seq), pool_snap(&pool)), (s.clone(), p.clone()));
    }
}

#[test]
fn truncate_into_the_middle_of_a_block_keeps_it() {
    let pool = pool(4, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(11).unwrap(); // 3 blocks
    let kept = seq.blocks()[..2].to_vec();
    let gone = seq.blocks()[2];
    assert_eq!(seq.truncate(6), 1);
    assert_eq!((seq.len(), seq.blocks()), (6, &kept[..]));
    assert_eq!(pool.ref_count(gone), Some(0));
    assert_eq!((pool.used_blocks(), pool.free_blocks()), (2, 2));
    // Within the same block: nothing given back.
    assert_eq!(seq.truncate(5), 0);
    assert_eq!((seq.len(), seq.blocks()), (5, &kept[..]));
    assert_eq!(pool.used_blocks(), 2);
    assert_table_fits(&seq);
}

#[test]
fn truncate_to_a_block_boundary_gives_back_the_blocks_after_it() {
    let pool = pool(8, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(18).unwrap(); // 5 blocks
    let blocks = seq.blocks().to_vec();
    assert_eq!(seq.truncate(8), 3);
    assert_eq!(seq.blocks(), &blocks[..2]);
    assert_eq!(pool.used_blocks(), 2);
    for &id in &blocks[2..] {
        assert_eq!(pool.ref_count(id), Some(0));
    }
    assert_eq!(seq.truncate(4), 1);
    assert_eq!(seq.blocks(), &blocks[..1]);
    assert_eq!(pool.used_blocks(), 1);
    assert_table_fits(&seq);
    // Appending again fills the kept block first.
    assert_eq!(seq.try_append(1).unwrap(), 4..5);
    assert_eq!(seq.blocks().len(), 2);
}

#[test]
fn truncate_to_zero_gives_back_everything() {
    let pool = pool(8, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(13).unwrap();
    assert_eq!(seq.truncate(0), 4);
    assert!(seq.is_empty() && seq.blocks().is_empty());
    assert_eq!(pool.free_blocks(), 8);
    assert!(pool_snap(&pool).refs.iter().all(|&r| r == 0));
    assert_eq!(seq.slot(0), None);
    // The sequence is reusable.
    assert_eq!(seq.try_append(3).unwrap(), 0..3);
}

#[test]
fn truncate_count_matches_the_pool_for_many_lengths() {
    let pool = pool(16, 4);
    for start in 0..=40 {
        for to in 0..=start {
            let mut seq = Sequence::new(Arc::clone(&pool));
            seq.try_append(start).unwrap();
            let used = pool.used_blocks();
            let given = seq.truncate(to);
            assert_eq!(given, start.div_ceil(4) - to.div_ceil(4), "{start} -> {to}");
            assert_eq!(pool.used_blocks(), used - given);
            assert_eq!(seq.len(), to);
            assert_table_fits(&seq);
        }
    }
    assert_eq!(pool.free_blocks(), 16);
}

// ---------------------------------------------------------------------------
// try_fork
// ---------------------------------------------------------------------------

#[test]
fn fork_of_an_empty_sequence_is_empty() {
    let pool = pool(2, 4);
    let seq = Sequence::new(Arc::clone(&pool));
    let before = pool_snap(&pool);
    let (child, copy) = seq.try_fork().unwrap();
    assert_eq!(copy, None);
    assert!(child.is_empty() && child.blocks().is_empty());
    assert!(Arc::ptr_eq(child.pool(), &pool));
    assert_eq!(pool_snap(&pool), before);
}

#[test]
fn fork_on_a_block_boundary_shares_everything_and_allocates_nothing() {
    let pool = pool(4, 4);
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(8).unwrap();
    let before = pool_snap(&pool);
    let (child, copy) = parent.try_fork().unwrap();
    assert_eq!(copy, None);
    assert_eq!(child.len(), 8);
    assert_eq!(child.blocks(), parent.blocks());
    assert_eq!((pool.used_blocks(), pool.free_blocks()), (2, 2));
    for &id in parent.blocks() {
        assert_eq!(pool.ref_count(id), Some(2));
    }
    for p in 0..8 {
        assert_eq!(child.slot(p), parent.slot(p));
    }
    drop(child);
    assert_eq!(pool_snap(&pool), before);
}

#[test]
fn fork_on_a_boundary_works_even_with_no_free_block_or_a_closed_pool() {
    let pool = pool(2, 4);
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(8).unwrap();
    assert_eq!(pool.free_blocks(), 0);
    let (child, copy) = parent.try_fork().unwrap();
    assert_eq!((copy, child.blocks()), (None, parent.blocks()));
    pool.close();
    let (grandchild, copy) = child.try_fork().unwrap();
    assert_eq!(copy, None);
    for &id in parent.blocks() {
        assert_eq!(pool.ref_count(id), Some(3));
    }
    drop((parent, child, grandchild));
    assert_eq!(pool.free_blocks(), 2);
}

#[test]
fn fork_with_a_partial_tail_copies_it_into_a_private_block() {
    let pool = pool(8, 4);
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(10).unwrap(); // 2 full blocks + 2 tokens
    let parent_blocks = parent.blocks().to_vec();
    let (child, copy) = parent.try_fork().unwrap();
    let copy = copy.expect("a partial tail needs a copy");
    assert_eq!(
        copy,
        BlockCopy {
            src: parent_blocks[2],
            dst: child.blocks()[2],
            tokens: 2,
        }
    );
    assert_ne!(copy.src, copy.dst);
    // The parent's table is unchanged.
    assert_eq!(parent.blocks(), &parent_blocks[..]);
    assert_eq!((parent.len(), child.len()), (10, 10));
    // Full blocks shared, tails private.
    assert_eq!(child.blocks()[..2], parent_blocks[..2]);
    for &id in &parent_blocks[..2] {
        assert_eq!(pool.ref_count(id), Some(2));
    }
    assert_eq!(pool.ref_count(parent_blocks[2]), Some(1));
    assert_eq!(pool.ref_count(copy.dst), Some(1));
    assert_eq!(pool.used_blocks(), 4);
    assert_table_fits(&child);
    // Same slots for the shared part, the child's own for the tail.
    for p in 0..8 {
        assert_eq!(child.slot(p), parent.slot(p));
    }
    for p in 8..10 {
        assert_eq!(child.slot(p), Some(copy.dst.index() * 4 + p % 4));
    }
    drop(parent);
    assert_eq!(pool.used_blocks(), 3);
    drop(child);
    assert_eq!(pool.free_blocks(), 8);
}

#[test]
fn fork_of_a_single_partial_block_shares_nothing() {
    let pool = pool(4, 4);
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(3).unwrap();
    let (child, copy) = parent.try_fork().unwrap();
    let copy = copy.unwrap();
    assert_eq!((copy.src, copy.tokens), (parent.blocks()[0], 3));
    assert_eq!(child.blocks(), [copy.dst]);
    let set: HashSet<BlockId> = parent.blocks().iter().copied().collect();
    assert!(!set.contains(&copy.dst));
}

#[test]
fn fork_without_a_free_block_for_the_tail_fails_and_changes_nothing() {
    let pool = pool(4, 4);
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(10).unwrap(); // 3 blocks, partial tail
    let mut other = Sequence::new(Arc::clone(&pool));
    other.try_append(1).unwrap(); // the fourth
    let (s, p) = (seq_snap(&parent), pool_snap(&pool));
    assert_eq!(
        parent.try_fork().unwrap_err(),
        ReserveError::Full {
            requested: 1,
            available: 0,
        }
    );
    assert_eq!(
        (seq_snap(&parent), pool_snap(&pool)),
        (s.clone(), p.clone())
    );
    // With the whole pool its own, the tail's block can never come.
    drop(other);
    parent.try_append(4).unwrap(); // 14 tokens in 4 blocks
    let (s, p) = (seq_snap(&parent), pool_snap(&pool));
    assert_eq!(
        parent.try_fork().unwrap_err(),
        ReserveError::NeverFits {
            requested: 1,
            capacity: 0,
        }
    );
    assert_eq!(
        (seq_snap(&parent), pool_snap(&pool)),
        (s.clone(), p.clone())
    );
    pool.close();
    let p = pool_snap(&pool);
    assert_eq!(parent.try_fork().unwrap_err(), ReserveError::Closed);
    assert_eq!((seq_snap(&parent), pool_snap(&pool)), (s, p));
}

#[test]
fn fork_refused_on_a_closed_pool_with_free_blocks_changes_nothing() {
    let pool = pool(4, 4);
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(6).unwrap();
    pool.close();
    let (s, p) = (seq_snap(&parent), pool_snap(&pool));
    assert_eq!(parent.try_fork().unwrap_err(), ReserveError::Closed);
    assert_eq!((seq_snap(&parent), pool_snap(&pool)), (s, p));
}

#[test]
fn forks_of_forks_count_references() {
    let pool = pool(8, 4);
    let mut root = Sequence::new(Arc::clone(&pool));
    root.try_append(8).unwrap();
    let shared = root.blocks().to_vec();
    let mut family = vec![root];
    for generation in 2..=5 {
        let (child, copy) = family.last().unwrap().try_fork().unwrap();
        assert_eq!(copy, None);
        family.push(child);
        for &id in &shared {
            assert_eq!(pool.ref_count(id), Some(generation));
        }
    }
    assert_eq!(pool.used_blocks(), 2);
    while let Some(seq) = family.pop() {
        drop(seq);
        for &id in &shared {
            assert_eq!(pool.ref_count(id), Some(family.len()));
        }
    }
    assert_eq!(pool.free_blocks(), 8);
}

// ---------------------------------------------------------------------------
// Never writing into a block another side can read
// ---------------------------------------------------------------------------

/// Appends `n` to `seqs[i]` and checks that every block the new positions
/// land in is held by nobody else: not in any other table, and with one
/// reference only.
fn append_and_check_private(seqs: &mut [Sequence], i: usize, n: usize) -> bool {
    let before = seq_snap(&seqs[i]);
    let pool = Arc::clone(seqs[i].pool());
    let Ok((range, copy)) = seqs[i].try_append_cow(n) else {
        assert_eq!(
            seq_snap(&seqs[i]),
            before,
            "a refused append changed the table"
        );
        return false;
    };
    assert_eq!(range, before.len..before.len + n);
    assert_table_fits(&seqs[i]);
    let bs = pool.block_size();
    let others: HashSet<BlockId> = seqs
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != i)
        .flat_map(|(_, s)| s.blocks().iter().copied())
        .collect();
    for p in range {
        let slot = seqs[i].slot(p).unwrap();
        let block = BlockId::new((slot / bs) as u32);
        assert_eq!(block, seqs[i].blocks()[p / bs]);
        assert!(
            !others.contains(&block),
            "sequence {i} writes position {p} into {block}, held by another"
        );
        assert_eq!(
            pool.ref_count(block),
            Some(1),
            "writing into shared {block}"
        );
    }
    // The copy-on-write (if any) is a copy into this sequence's own block.
    if let Some(copy) = copy {
        assert!(seqs[i].blocks().contains(&copy.dst));
        assert!(!seqs[i].blocks().contains(&copy.src));
        assert!(!others.contains(&copy.dst));
        assert!(copy.tokens > 0 && copy.tokens < bs);
    }
    true
}

#[test]
fn after_a_fork_on_a_boundary_neither_side_writes_into_the_other() {
    let pool = pool(16, 4);
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(8).unwrap();
    let (child, _) = parent.try_fork().unwrap();
    let mut seqs = vec![parent, child];
    for (i, n) in [(0, 1), (1, 1), (0, 3), (1, 6), (0, 5), (1, 2)] {
        assert!(append_and_check_private(&mut seqs, i, n));
    }
}

#[test]
fn after_a_fork_with_a_partial_tail_neither_side_writes_into_the_other() {
    let pool = pool(16, 4);
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(6).unwrap();
    let (child, copy) = parent.try_fork().unwrap();
    assert!(copy.is_some());
    let mut seqs = vec![parent, child];
    for (i, n) in [(0, 1), (1, 1), (0, 1), (1, 5), (0, 9), (1, 2)] {
        assert!(append_and_check_private(&mut seqs, i, n));
    }
}

#[test]
fn random_appends_truncates_and_forks_never_write_into_shared_blocks() {
    for seed in 0..40u64 {
        let mut rng = XorShift::new(seed);
        let bs = 1 + rng.below(5);
        let pool = pool(24, bs);
        let mut seqs = vec![Sequence::new(Arc::clone(&pool))];
        for _ in 0..200 {
            let i = rng.below(seqs.len());
            match rng.below(10) {
                0..=4 => {
                    let n = rng.below(3 * bs + 2);
                    append_and_check_private(&mut seqs, i, n);
                }
                5 | 6 => {
                    let len = seqs[i].len();
                    let to = rng.below(len + 2);
                    let before = seqs[i].blocks().len();
                    let given = seqs[i].truncate(to);
                    assert_eq!(given, before - seqs[i].blocks().len());
                    assert_eq!(seqs[i].len(), to.min(len));
                    assert_table_fits(&seqs[i]);
                }
                7 | 8 if seqs.len() < 6 => {
                    let before = pool_snap(&pool);
                    match seqs[i].try_fork() {
                        Ok((child, copy)) => {
                            assert_eq!(child.len(), seqs[i].len());
                            assert_eq!(copy.is_some(), seqs[i].len() % bs != 0);
                            assert_table_fits(&child);
                            seqs.push(child);
                        }
                        Err(e) => {
                            assert!(matches!(e, ReserveError::Full { .. }), "{e}");
                            assert_eq!(pool_snap(&pool), before);
                        }
                    }
                }
                _ => {
                    if seqs.len() > 1 {
                        seqs.swap_remove(i);
                    }
                }
            }
            // Conservation: every reference is one table entry or one block
            // kept for a pending copy-on-write.
            let table_refs: usize = seqs.iter().map(|s| s.blocks().len()).sum();
            let refs: usize = pool_snap(&pool).refs.iter().sum();
            assert!(refs >= table_refs && refs <= table_refs + seqs.len());
            let distinct: HashSet<BlockId> = seqs
                .iter()
                .flat_map(|s| s.blocks().iter().copied())
                .collect();
            assert!(pool.used_blocks() >= distinct.len());
            assert_eq!(pool.used_blocks() + pool.free_blocks(), 24);
        }
        drop(seqs);
        assert_eq!(pool.free_blocks(), 24, "seed {seed}");
        assert!(pool_snap(&pool).refs.iter().all(|&r| r == 0), "seed {seed}");
    }
}

// ---------------------------------------------------------------------------
// Copy-on-write after truncating into a shared prefix
// ---------------------------------------------------------------------------

/// A parent of `len` tokens (a multiple of 4, block size 4) and a child
/// forked on the boundary, sharing every block.
fn shared_pair(num_blocks: usize, len: usize) -> (Arc<BlockPool>, Sequence, Sequence) {
    let pool = pool(num_blocks, 4);
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(len).unwrap();
    let (child, copy) = parent.try_fork().unwrap();
    assert_eq!(copy, None);
    (pool, parent, child)
}

#[test]
fn try_append_cow_copies_a_shared_tail_before_writing() {
    let (pool, mut parent, child) = shared_pair(8, 8);
    let shared = child.blocks().to_vec();
    assert_eq!(parent.truncate(6), 0); // back into the second, shared block
    assert_eq!(parent.blocks(), &shared[..]);
    let (range, copy) = parent.try_append_cow(1).unwrap();
    assert_eq!(range, 6..7);
    let copy = copy.expect("a shared partial tail must be copied");
    assert_eq!(copy.src, shared[1]);
    assert_eq!(copy.tokens, 2);
    assert_eq!(parent.blocks(), [shared[0], copy.dst]);
    assert!(!child.blocks().contains(&copy.dst));
    // The child's view is untouched.
    assert_eq!(child.blocks(), &shared[..]);
    assert_eq!(child.len(), 8);
    // The replaced block keeps the parent's reference until the next change,
    // so the device copy can still read it.
    assert_eq!(pool.ref_count(shared[1]), Some(2));
    assert_eq!(pool.ref_count(shared[0]), Some(2));
    assert_eq!(pool.ref_count(copy.dst), Some(1));
    assert_eq!(pool.used_blocks(), 3);
    // The next change releases it.
    assert_eq!(parent.try_append_cow(1).unwrap(), (7..8, None));
    assert_eq!(pool.ref_count(shared[1]), Some(1));
    assert_eq!(pool.used_blocks(), 3);
    for p in 4..8 {
        assert_eq!(parent.slot(p), Some(copy.dst.index() * 4 + p % 4));
    }
    drop(child);
    assert_eq!(pool.used_blocks(), 2);
    drop(parent);
    assert_eq!(pool.free_blocks(), 8);
}

#[test]
fn try_append_panics_rather_than_lose_a_copy_on_write() {
    let (pool, mut parent, child) = shared_pair(8, 8);
    let shared = child.blocks().to_vec();
    parent.truncate(5);
    let before = (seq_snap(&parent), pool_snap(&pool));
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parent.try_append(2)))
        .expect_err("a plain append into a shared tail must not go unnoticed");
    let message = panic
        .downcast_ref::<&str>()
        .map(|m| m.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(message.contains("try_append_cow"), "{message}");
    // Nothing changed: the copy-on-write append still works.
    assert_eq!((seq_snap(&parent), pool_snap(&pool)), before);
    let (range, copy) = parent.try_append_cow(2).unwrap();
    assert_eq!(range, 5..7);
    assert_eq!(
        copy,
        Some(BlockCopy {
            src: shared[1],
            dst: parent.blocks()[1],
            tokens: 1,
        })
    );
    assert_eq!(pool.ref_count(shared[1]), Some(2));
    // The tail is private now: a plain append is fine, and releases the
    // copy's source.
    parent.try_append(1).unwrap();
    assert_eq!(pool.ref_count(shared[1]), Some(1));
    // Empty appends never need a copy.
    let (_, mut other, _child) = shared_pair(8, 8);
    other.truncate(5);
    assert_eq!(other.try_append(0).unwrap(), 5..5);
}

#[test]
fn append_needs_copy_is_true_exactly_when_try_append_would_panic() {
    // Shared with a fork: true while the child holds the tail.
    let (forked, mut parent, child) = shared_pair(8, 8);
    assert!(!parent.append_needs_copy(), "on a block boundary");
    parent.truncate(6);
    assert!(parent.append_needs_copy());
    let before = (seq_snap(&parent), pool_snap(&forked));
    assert!(parent.append_needs_copy(), "a query changes nothing");
    assert_eq!((seq_snap(&parent), pool_snap(&forked)), before);
    drop(child);
    assert!(!parent.append_needs_copy(), "the child let go");
    assert_eq!(parent.try_append(1).unwrap(), 6..7);
    // Cached and shared with a matcher: still true once the matcher lets
    // go, since the block keeps its key.
    let cache = pool(8, 4);
    let mut keys = Vec::new();
    kvslots::hash_blocks(b"", &[3; 8], 4, &mut keys);
    let mut first = Sequence::new(Arc::clone(&cache));
    first.try_append(8).unwrap();
    assert_eq!(first.publish(&keys), 2);
    let mut matcher = Sequence::new(Arc::clone(&cache));
    assert_eq!(matcher.try_match_prefix(&keys), 2);
    first.truncate(6);
    assert!(first.append_needs_copy());
    drop(matcher);
    assert!(first.append_needs_copy(), "a cached tail is copied");
    let (_, copy) = first.try_append_cow(1).unwrap();
    assert!(copy.is_some());
    assert!(!first.append_needs_copy());
    // Random appends, truncates and forks: the query and the panic agree.
    for seed in 0..20u64 {
        let mut rng = XorShift::new(seed);
        let shared = pool(16, 1 + rng.below(4));
        let mut seqs = vec![Sequence::new(Arc::clone(&shared))];
        for _ in 0..150 {
            let i = rng.below(seqs.len());
            match rng.below(6) {
                0 | 1 => {
                    let needs = seqs[i].append_needs_copy();
                    let n = 1 + rng.below(3);
                    let seq = &mut seqs[i];
                    let plain = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        seq.try_append(n)
                    }));
                    assert_eq!(plain.is_err(), needs, "seed {seed}");
                    if needs {
                        let _ = seqs[i].try_append_cow(n);
                    }
                }
                2 | 3 => {
                    let to = rng.below(seqs[i].len() + 1);
                    seqs[i].truncate(to);
                }
                4 if seqs.len() < 5 => {
                    if let Ok((child, _)) = seqs[i].try_fork() {
                        seqs.push(child);
                    }
                }
                _ if seqs.len() > 1 => {
                    seqs.swap_remove(i);
                }
                _ => {}
            }
        }
    }
}

#[test]
fn copy_on_write_with_new_blocks_takes_them_all_at_once() {
    let (pool, mut parent, child) = shared_pair(8, 8);
    let shared = child.blocks().to_vec();
    parent.truncate(6);
    // 2 slots of room in the copy, 3 more tokens in one new block.
    let (range, copy) = parent.try_append_cow(5).unwrap();
    assert_eq!(range, 6..11);
    let copy = copy.unwrap();
    assert_eq!((copy.src, copy.tokens), (shared[1], 2));
    assert_eq!(parent.blocks().len(), 3);
    assert_eq!(parent.blocks()[1], copy.dst);
    assert_table_fits(&parent);
    let others: HashSet<BlockId> = child.blocks().iter().copied().collect();
    for p in 6..11 {
        assert!(!others.contains(&parent.blocks()[p / 4]));
    }
    assert_eq!(pool.used_blocks(), 4);
}

#[test]
fn copy_on_write_that_does_not_fit_changes_nothing() {
    let (pool, mut parent, child) = shared_pair(2, 8);
    parent.truncate(6);
    // The copy alone needs a block and none is free.
    assert_append_refused(
        &mut parent,
        1,
        ReserveError::Full {
            requested: 1,
            available: 0,
        },
    );
    assert_eq!(parent.blocks(), child.blocks());
    assert!(child
        .blocks()
        .iter()
        .all(|&id| pool.ref_count(id) == Some(2)));
    // Once the child is gone the block is not shared: no copy, no block.
    drop(child);
    assert_eq!(parent.try_append_cow(2).unwrap(), (6..8, None));
    assert_eq!(pool.used_blocks(), 2);
}

#[test]
fn a_refused_append_keeps_the_retired_block_for_the_pending_copy() {
    let (pool, mut parent, child) = shared_pair(3, 8);
    let shared = child.blocks().to_vec();
    parent.truncate(6);
    let (_, copy) = parent.try_append_cow(1).unwrap();
    let copy = copy.unwrap();
    assert_eq!(pool.free_blocks(), 0);
    assert_eq!(pool.ref_count(shared[1]), Some(2));
    // Needs a new block, and none is free (2 in the parent's table, the
    // copy's source it keeps): refused as Full, since the source goes back
    // once the copy is made; the retired reference stays.
    assert_append_refused(
        &mut parent,
        2,
        ReserveError::Full {
            requested: 1,
            available: 0,
        },
    );
    assert_eq!(pool.ref_count(shared[1]), Some(2));
    assert_eq!(pool.ref_count(copy.dst), Some(1));
    drop(child);
    // The parent's retired reference is the last one now.
    assert_eq!(pool.ref_count(shared[1]), Some(1));
    assert_eq!(pool.used_blocks(), 3);
    // Truncating is a change: it lets go of the retired block too.
    assert_eq!(parent.truncate(5), 0);
    assert_eq!(pool.ref_count(shared[1]), Some(0));
    assert_eq!(pool.used_blocks(), 2);
}

#[test]
fn dropping_a_sequence_with_a_retired_block_returns_it() {
    let (pool, mut parent, child) = shared_pair(4, 8);
    parent.truncate(7);
    assert!(parent.try_append_cow(1).unwrap().1.is_some());
    assert_eq!(pool.used_blocks(), 3);
    drop(child);
    drop(parent);
    assert_eq!(pool.free_blocks(), 4);
    assert!(pool_snap(&pool).refs.iter().all(|&r| r == 0));
}

#[test]
fn truncating_a_shared_prefix_to_a_boundary_needs_no_copy() {
    let (pool, mut parent, child) = shared_pair(8, 12);
    let shared = child.blocks().to_vec();
    assert_eq!(parent.truncate(4), 2);
    assert_eq!(pool.ref_count(shared[1]), Some(1));
    assert_eq!(pool.ref_count(shared[2]), Some(1));
    assert_eq!(parent.try_append_cow(3).unwrap().1, None);
    assert!(!child.blocks().contains(&parent.blocks()[1]));
    assert_eq!(pool.ref_count(shared[0]), Some(2));
}

#[test]
fn the_child_can_copy_on_write_too() {
    let (pool, parent, mut child) = shared_pair(8, 8);
    let shared = parent.blocks().to_vec();
    child.truncate(2);
    let (range, copy) = child.try_append_cow(1).unwrap();
    assert_eq!(range, 2..3);
    let copy = copy.unwrap();
    assert_eq!((copy.src, copy.tokens), (shared[0], 2));
    assert_eq!(child.blocks(), [copy.dst]);
    assert_eq!(parent.blocks(), &shared[..]);
    assert_eq!(pool.ref_count(shared[0]), Some(2)); // parent + retired
    assert_eq!(pool.ref_count(shared[1]), Some(1));
}

// ---------------------------------------------------------------------------
// Drop
// ---------------------------------------------------------------------------

#[test]
fn dropping_every_sequence_fills_the_pool_again() {
    let pool = pool(10, 4);
    let mut a = Sequence::new(Arc::clone(&pool));
    a.try_append(13).unwrap();
    let (mut b, _) = a.try_fork().unwrap();
    b.try_append(6).unwrap();
    let (c, _) = b.try_fork().unwrap();
    a.truncate(9);
    assert!(a.try_append_cow(2).unwrap().1.is_some());
    assert!(pool.used_blocks() > 0);
    drop(b);
    drop(a);
    assert!(pool.used_blocks() > 0);
    drop(c);
    assert_eq!(pool.free_blocks(), 10);
    assert!(pool_snap(&pool).refs.iter().all(|&r| r == 0));
    // Every block can be allocated again, all distinct.
    let mut ids = Vec::new();
    pool.try_alloc(10, &mut ids).unwrap();
    assert_eq!(ids.iter().copied().collect::<HashSet<_>>().len(), 10);
    pool.free(&ids).unwrap();
}

#[test]
fn sequences_can_move_between_threads() {
    let pool = pool(8, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(5).unwrap();
    let seq = std::thread::spawn(move || {
        seq.try_append(4).unwrap();
        seq
    })
    .join()
    .unwrap();
    assert_eq!(seq.len(), 9);
    std::thread::spawn(move || drop(seq)).join().unwrap();
    assert_eq!(pool.free_blocks(), 8);
}

const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<Sequence>();
};

#[test]
fn block_copy_is_plain_data() {
    let a = BlockCopy {
        src: BlockId::new(1),
        dst: BlockId::new(2),
        tokens: 3,
    };
    let b = a; // Copy
    assert_eq!(a, b);
    assert_ne!(a, BlockCopy { tokens: 4, ..a });
    let text = format!("{a:?}");
    assert!(text.contains("src") && text.contains("tokens: 3"), "{text}");
}

#[test]
fn a_copy_source_is_kept_until_the_next_change() {
    // Until the next append: the copy's source may be freed from then on.
    let pool = Arc::new(BlockPool::new(8, 4));
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(8).unwrap();
    let (child, _) = parent.try_fork().unwrap();
    parent.truncate(6);
    let copy = parent.try_append_cow(1).unwrap().1.expect("copy-on-write");
    drop(child);
    assert_eq!(pool.ref_count(copy.src), Some(1));
    assert_eq!(parent.try_append_cow(1).unwrap().1, None); // no copy
    assert_eq!(pool.ref_count(copy.src), Some(0));

    // Until a truncate that gives the copy's destination back.
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(8).unwrap();
    let (_child, _) = parent.try_fork().unwrap();
    parent.truncate(6);
    let copy = parent.try_append_cow(1).unwrap().1.expect("copy-on-write");
    assert_eq!(pool.ref_count(copy.src), Some(2));
    parent.truncate(2);
    assert_eq!(pool.ref_count(copy.dst), Some(0));
    assert_eq!(pool.ref_count(copy.src), Some(1));

    // A zero append or a no-op truncate changes nothing: it is kept.
    parent.truncate(0);
    parent.try_append(8).unwrap();
    let (_child2, _) = parent.try_fork().unwrap();
    parent.truncate(6);
    let copy = parent.try_append_cow(1).unwrap().1.expect("copy-on-write");
    parent.try_append(0).unwrap();
    parent.truncate(100);
    assert_eq!(copy.dst, parent.blocks()[1]);
    assert_eq!(pool.ref_count(copy.src), Some(2));
}

#[test]
fn a_fork_with_a_private_tail_lists_it_last() {
    let pool = Arc::new(BlockPool::new(8, 4));
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(10).unwrap();
    let (child, copy) = parent.try_fork().unwrap();
    let copy = copy.expect("a partly filled tail");
    assert_eq!(&child.blocks()[..2], &parent.blocks()[..2]);
    assert_eq!(child.blocks()[2], copy.dst);
    assert_eq!((copy.src, copy.tokens), (parent.blocks()[2], 2));
    assert_eq!(child.len(), 10);
}

// ---------------------------------------------------------------------------
// try_reserve, capacity and shrink_to_fit: blocks reserved ahead of the
// length (whole-prompt admission, then chunked prefill)
// ---------------------------------------------------------------------------

#[test]
fn reserve_takes_exactly_the_missing_blocks_and_appends_then_take_none() {
    let pool = pool(8, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(3).unwrap(); // 1 block, room for 1 more token
    seq.try_reserve(10, 0).unwrap(); // 1 fits, 9 more need 3 blocks
    assert_eq!(seq.len(), 3);
    assert_eq!(seq.blocks().len(), 4);
    assert_eq!(seq.capacity(), 16);
    assert_eq!(pool.used_blocks(), 4);
    // Appending the reserved tokens takes nothing more, in any chunking.
    assert_eq!(seq.try_append(4).unwrap(), 3..7);
    assert_eq!(seq.try_append(6).unwrap(), 7..13);
    assert_eq!(pool.used_blocks(), 4);
    // Slots of reserved-then-filled positions follow the table.
    for p in 0..seq.len() {
        assert_eq!(seq.slot(p), Some(seq.blocks()[p / 4].index() * 4 + p % 4));
    }
    assert_eq!(seq.slot(13), None);
}

#[test]
fn reserve_of_nothing_or_of_what_fits_takes_nothing() {
    let pool = pool(4, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_reserve(0, 0).unwrap();
    assert_eq!(
        seq_snap(&seq),
        SeqSnap {
            len: 0,
            capacity: 0,
            blocks: vec![]
        }
    );
    assert_eq!(pool.used_blocks(), 0);
    seq.try_append(2).unwrap();
    let before = state(&seq);
    seq.try_reserve(2, 0).unwrap();
    assert_eq!(state(&seq), before);
}

#[test]
fn refused_reserve_changes_nothing() {
    let pool = pool(4, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(5).unwrap(); // 2 blocks
    let before = state(&seq);
    // 2 more blocks fit beside its own 2, but never with 1 of headroom.
    assert_eq!(
        seq.try_reserve(11, 1),
        Err(ReserveError::NeverFits {
            requested: 2,
            capacity: 2
        })
    );
    assert_eq!(state(&seq), before);
    // With another holder's block, 1 more fits, but not now with 1 free.
    let mut other = Sequence::new(Arc::clone(&pool));
    other.try_append(1).unwrap();
    let held = state(&seq);
    assert_eq!(
        seq.try_reserve(7, 1),
        Err(ReserveError::Full {
            requested: 1,
            available: 1
        })
    );
    assert_eq!(state(&seq), held);
    drop(other);
    let before = state(&seq);
    assert!(matches!(
        seq.try_reserve(usize::MAX, 0),
        Err(ReserveError::NeverFits { .. })
    ));
    assert!(matches!(
        seq.try_reserve(1 + 3, usize::MAX),
        Err(ReserveError::NeverFits { .. })
    ));
    assert_eq!(state(&seq), before);
    pool.close();
    let closed = state(&seq);
    assert_eq!(closed.0, before.0);
    assert_eq!(seq.try_reserve(11, 0), Err(ReserveError::Closed));
    assert_eq!(state(&seq), closed);
    // Filling what is already held still works on a closed pool.
    assert_eq!(seq.try_append(3).unwrap(), 5..8);
}

#[test]
fn fork_never_shares_reserved_blocks() {
    let pool = pool(8, 4);
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(6).unwrap(); // 1 full block, 1 with 2 tokens
    parent.try_reserve(10, 0).unwrap(); // + 2 reserved blocks
    assert_eq!(parent.blocks().len(), 4);
    let (child, copy) = parent.try_fork().unwrap();
    let copy = copy.unwrap();
    assert_eq!(copy.src, parent.blocks()[1]);
    assert_eq!(copy.tokens, 2);
    assert_eq!(child.blocks().len(), 2);
    assert_eq!(child.blocks()[0], parent.blocks()[0]);
    for reserved in &parent.blocks()[2..] {
        assert!(!child.blocks().contains(reserved));
        assert_eq!(pool.ref_count(*reserved), Some(1));
    }
    assert_eq!(pool.ref_count(parent.blocks()[0]), Some(2));
}

#[test]
fn copy_on_write_replaces_the_tail_not_a_reserved_block() {
    let pool = pool(8, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(8).unwrap();
    let (child, _) = seq.try_fork().unwrap(); // both blocks shared
    seq.truncate(6); // back into the shared second block
    seq.try_reserve(6, 0).unwrap(); // 2 free in the tail + 1 reserved block
    let shared_tail = seq.blocks()[1];
    let reserved = seq.blocks()[2];
    let (range, copy) = seq.try_append_cow(1).unwrap();
    assert_eq!(range, 6..7);
    let copy = copy.expect("the tail is shared and partly filled");
    assert_eq!((copy.src, copy.tokens), (shared_tail, 2));
    assert_eq!(seq.blocks()[1], copy.dst);
    assert_eq!(
        seq.blocks()[2],
        reserved,
        "the reserved block stays in place"
    );
    assert_eq!(seq.blocks().len(), 3);
    assert_eq!(child.blocks()[1], shared_tail);
    // The new token lands in the private copy, never in the child's block.
    assert_eq!(seq.slot(6), Some(copy.dst.index() * 4 + 2));
}

#[test]
fn truncate_and_drop_give_reserved_blocks_back() {
    let pool = pool(8, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(2).unwrap();
    seq.try_reserve(20, 0).unwrap();
    assert_eq!(pool.used_blocks(), 6);
    assert_eq!(seq.truncate(1), 5);
    assert_eq!((seq.len(), seq.capacity(), pool.used_blocks()), (1, 4, 1));
    seq.try_reserve(20, 0).unwrap();
    drop(seq);
    assert_eq!(pool.free_blocks(), 8);
}

#[test]
fn reserve_after_truncating_into_a_shared_block_keeps_a_block_for_the_copy() {
    let pool = pool(4, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(8).unwrap();
    let (child, _) = seq.try_fork().unwrap(); // shares both full blocks
    seq.truncate(6); // back into the shared second block
    assert_eq!(pool.used_blocks(), 2);
    // 2 more tokens fit in the blocks held, but the shared tail needs a
    // private copy first: one block is reserved for it.
    seq.try_reserve(2, 0).unwrap();
    assert_eq!(
        (seq.len(), seq.blocks().len(), pool.used_blocks()),
        (6, 3, 3)
    );
    // Someone takes every other block: the reserved appends still succeed.
    let mut other = Vec::new();
    pool.try_alloc(1, &mut other).unwrap();
    assert_eq!(pool.free_blocks(), 0);
    let (range, copy) = seq.try_append_cow(2).unwrap();
    assert_eq!(range, 6..8);
    let copy = copy.expect("the shared tail is copied");
    assert_eq!((copy.src, copy.tokens), (child.blocks()[1], 2));
    assert_eq!(seq.blocks(), &[child.blocks()[0], copy.dst]);
    // The copy's source stays referenced until the next change.
    assert_eq!(pool.ref_count(copy.src), Some(2));
    assert_eq!(pool.used_blocks(), 4);
    seq.truncate(0);
    assert_eq!(pool.ref_count(copy.src), Some(1));
    drop(child);
    pool.free(&other).unwrap();
    drop(seq);
    assert_eq!(pool.free_blocks(), 4);
}

#[test]
fn reserve_counts_the_copy_only_when_no_reserved_block_is_spare() {
    let pool = pool(8, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(8).unwrap();
    let (_child, _) = seq.try_fork().unwrap();
    seq.truncate(6);
    // 6 more tokens: 2 fit in the tail, 4 need a block, and the copy one
    // more.
    seq.try_reserve(6, 0).unwrap();
    assert_eq!((seq.blocks().len(), pool.used_blocks()), (4, 4));
    // Already enough (one block spare for the copy): nothing more.
    seq.try_reserve(2, 0).unwrap();
    assert_eq!((seq.blocks().len(), pool.used_blocks()), (4, 4));
    let (_, copy) = seq.try_append_cow(6).unwrap();
    assert!(copy.is_some());
    assert_eq!(
        (seq.len(), seq.blocks().len(), pool.used_blocks()),
        (12, 3, 4)
    );
}

#[test]
fn reserve_for_the_copy_is_refused_whole_and_changes_nothing() {
    let pool = pool(3, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(8).unwrap();
    let (_child, _) = seq.try_fork().unwrap();
    seq.truncate(6);
    let mut other = Vec::new();
    pool.try_alloc(1, &mut other).unwrap(); // the last free block
    let before = state(&seq);
    assert_eq!(
        seq.try_reserve(2, 0),
        Err(ReserveError::Full {
            requested: 1,
            available: 0
        })
    );
    assert_eq!(state(&seq), before);
}

#[test]
fn shrink_to_fit_gives_back_only_blocks_without_tokens() {
    let pool = pool(8, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    // Nothing held: nothing to give back.
    assert_eq!(seq.shrink_to_fit(), 0);
    seq.try_reserve(20, 0).unwrap(); // 5 blocks
    seq.try_append(5).unwrap(); // 2 of them hold tokens
    let filled = seq.blocks()[..2].to_vec();
    let slots: Vec<_> = (0..5).map(|p| seq.slot(p)).collect();
    assert_eq!(seq.shrink_to_fit(), 3);
    assert_eq!(seq.blocks(), &filled[..]);
    assert_eq!((seq.len(), seq.capacity(), pool.used_blocks()), (5, 8, 2));
    assert_eq!((0..5).map(|p| seq.slot(p)).collect::<Vec<_>>(), slots);
    // Already tight: a no-op that changes nothing.
    let before = state(&seq);
    assert_eq!(seq.shrink_to_fit(), 0);
    assert_eq!(state(&seq), before);
    // Appends go on as usual; an empty sequence gives everything back.
    assert_eq!(seq.try_append(4).unwrap(), 5..9);
    seq.truncate(0);
    seq.try_reserve(8, 0).unwrap();
    assert_eq!(seq.shrink_to_fit(), 2);
    assert_eq!(pool.free_blocks(), 8);
}

#[test]
fn shrink_to_fit_gives_back_the_block_reserved_for_a_copy() {
    let pool = pool(4, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(8).unwrap();
    let (child, _) = seq.try_fork().unwrap();
    seq.truncate(6);
    seq.try_reserve(2, 0).unwrap(); // one block for the copy
    assert_eq!(pool.used_blocks(), 3);
    assert_eq!(seq.shrink_to_fit(), 1);
    assert_eq!(pool.used_blocks(), 2);
    // The copy-on-write then allocates its block at the append.
    let (_, copy) = seq.try_append_cow(1).unwrap();
    assert_eq!(copy.expect("still shared").src, child.blocks()[1]);
    assert_eq!(pool.used_blocks(), 3);
}

#[test]
fn reserve_of_zero_takes_nothing_even_with_a_shared_tail() {
    let pool = pool(8, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(8).unwrap();
    let (_child, _) = seq.try_fork().unwrap();
    seq.truncate(6);
    let before = state(&seq);
    seq.try_reserve(0, 0).unwrap();
    assert_eq!(state(&seq), before);
    pool.close();
    assert_eq!(seq.try_reserve(0, 0), Ok(()));
}
