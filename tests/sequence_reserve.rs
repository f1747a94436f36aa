//! `Sequence::try_reserve` / `Sequence::capacity`: reserving blocks ahead of
//! the length (whole-prompt admission, then chunked prefill).

use std::sync::Arc;

use kvslots::{BlockPool, ReserveError, Sequence};

fn pool(blocks: usize, bs: usize) -> Arc<BlockPool> {
    Arc::new(BlockPool::new(blocks, bs))
}

/// Everything observable about a sequence and its pool.
fn snap(seq: &Sequence) -> (usize, usize, Vec<kvslots::BlockId>, usize) {
    (
        seq.len(),
        seq.capacity(),
        seq.blocks().to_vec(),
        seq.pool().used_blocks(),
    )
}

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
    assert_eq!(snap(&seq), (0, 0, vec![], 0));
    seq.try_append(2).unwrap();
    let before = snap(&seq);
    seq.try_reserve(2, 0).unwrap();
    assert_eq!(snap(&seq), before);
}

#[test]
fn refused_reserve_changes_nothing() {
    let pool = pool(4, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(5).unwrap(); // 2 blocks
    let before = snap(&seq);
    // 2 more blocks fit, but not with 1 of headroom.
    assert_eq!(
        seq.try_reserve(11, 1),
        Err(ReserveError::Full {
            requested: 2,
            available: 2
        })
    );
    assert_eq!(snap(&seq), before);
    assert!(matches!(
        seq.try_reserve(usize::MAX, 0),
        Err(ReserveError::NeverFits { .. })
    ));
    assert!(matches!(
        seq.try_reserve(1 + 3, usize::MAX),
        Err(ReserveError::NeverFits { .. })
    ));
    assert_eq!(snap(&seq), before);
    pool.close();
    assert_eq!(seq.try_reserve(11, 0), Err(ReserveError::Closed));
    assert_eq!(snap(&seq), before);
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
    let before = snap(&seq);
    assert_eq!(
        seq.try_reserve(2, 0),
        Err(ReserveError::Full {
            requested: 1,
            available: 0
        })
    );
    assert_eq!(snap(&seq), before);
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
    let before = snap(&seq);
    assert_eq!(seq.shrink_to_fit(), 0);
    assert_eq!(snap(&seq), before);
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
    let before = snap(&seq);
    seq.try_reserve(0, 0).unwrap();
    assert_eq!(snap(&seq), before);
    pool.close();
    assert_eq!(seq.try_reserve(0, 0), Ok(()));
}
