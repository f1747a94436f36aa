//! Every `BlockPool` method and every bad input: each refusal is checked for
//! its typed error AND for leaving everything unchanged (free and used
//! counts, the peak, the closed flag, the reference count of every block,
//! and the caller's `out` vector, contents and length).
//!
//! Also `BlockPool::with_shards` and the sharded free list: the
//! constructor's checks, the default shard count, and that cutting the free
//! list into shards changes nothing a caller can observe (all or nothing
//! across shards, exact `Full`, every block back where a later allocation
//! finds it, from any thread).

use std::collections::{BTreeSet, HashSet};
use std::error::Error;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::thread;

use kvslots::{BlockCopy, BlockId, BlockPool, FreeError, ReserveError, Sequence};

mod common;
use common::{pool_snap, PoolSnap};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Asserts that `free` refuses `ids` with `expected` and that nothing at all
/// changed.
fn assert_free_refused(pool: &BlockPool, ids: &[BlockId], expected: FreeError) {
    let before = pool_snap(pool);
    assert_eq!(pool.free(ids), Err(expected), "free({ids:?})");
    assert_eq!(
        pool_snap(pool),
        before,
        "a refused free({ids:?}) changed the pool"
    );
}

/// Asserts that `try_alloc_with_headroom(n, headroom)` refuses with
/// `expected` and that neither the pool nor `out` changed.
fn assert_alloc_refused(
    pool: &BlockPool,
    n: usize,
    headroom: usize,
    out: &mut Vec<BlockId>,
    expected: ReserveError,
) {
    let before = pool_snap(pool);
    let out_before = out.clone();
    let result = if headroom == 0 {
        pool.try_alloc(n, out)
    } else {
        pool.try_alloc_with_headroom(n, headroom, out)
    };
    assert_eq!(result, Err(expected), "try_alloc({n}, headroom {headroom})");
    assert_eq!(
        pool_snap(pool),
        before,
        "a refused try_alloc changed the pool"
    );
    assert_eq!(*out, out_before, "a refused try_alloc changed `out`");
}

/// Asserts the ids are distinct and in range.
fn assert_distinct_in_range(pool: &BlockPool, ids: &[BlockId]) {
    let set: HashSet<BlockId> = ids.iter().copied().collect();
    assert_eq!(set.len(), ids.len(), "duplicate ids in {ids:?}");
    for id in ids {
        assert!(id.index() < pool.num_blocks(), "{id} out of range");
    }
}

/// A sentinel prefix for `out`, to check that `try_alloc` appends and never
/// touches what was already there.
fn sentinel() -> Vec<BlockId> {
    vec![BlockId::new(u32::MAX - 1), BlockId::new(12345)]
}

// ---------------------------------------------------------------------------
// new and the accessors
// ---------------------------------------------------------------------------

#[test]
fn new_starts_all_free_and_open() {
    for (num_blocks, block_size) in [(0, 1), (1, 1), (3, 16), (64, 4), (1000, 256)] {
        let pool = BlockPool::new(num_blocks, block_size);
        assert_eq!(
            pool_snap(&pool),
            PoolSnap {
                num_blocks,
                block_size,
                free: num_blocks,
                used: 0,
                peak: 0,
                closed: false,
                refs: vec![0; num_blocks],
            }
        );
    }
}

#[test]
fn max_blocks_is_u32_max() {
    // Ids are u32 and one value ends the free list.
    assert_eq!(BlockPool::MAX_BLOCKS, u32::MAX as usize);
}

#[test]
#[should_panic(expected = "block_size must be non-zero")]
fn new_with_zero_block_size_panics() {
    let _ = BlockPool::new(4, 0);
}

#[test]
#[should_panic(expected = "block_size must be non-zero")]
fn new_with_zero_blocks_and_zero_block_size_panics() {
    let _ = BlockPool::new(0, 0);
}

#[test]
#[should_panic(expected = "num_blocks 4294967296 does not fit the block id type (max 4294967295)")]
#[cfg(target_pointer_width = "64")]
fn new_above_max_blocks_panics() {
    let _ = BlockPool::new(BlockPool::MAX_BLOCKS + 1, 1);
}

#[test]
#[should_panic(expected = "does not fit the block id type")]
fn new_with_usize_max_blocks_panics() {
    let _ = BlockPool::new(usize::MAX, 1);
}

#[test]
#[should_panic(expected = "num_blocks * block_size overflows usize")]
fn new_with_overflowing_slot_count_panics() {
    // Checked before any memory is allocated for the blocks.
    let _ = BlockPool::new(2, usize::MAX);
}

#[test]
#[should_panic(expected = "num_blocks * block_size overflows usize")]
#[cfg(target_pointer_width = "64")]
fn new_with_overflowing_slot_count_at_max_blocks_panics() {
    let _ = BlockPool::new(
        BlockPool::MAX_BLOCKS,
        (usize::MAX / BlockPool::MAX_BLOCKS) + 1,
    );
}

#[test]
fn ref_count_out_of_range_is_none() {
    let pool = BlockPool::new(4, 8);
    assert_eq!(pool.ref_count(BlockId::new(3)), Some(0));
    assert_eq!(pool.ref_count(BlockId::new(4)), None);
    assert_eq!(pool.ref_count(BlockId::new(u32::MAX)), None);
    let empty = BlockPool::new(0, 8);
    assert_eq!(empty.ref_count(BlockId::new(0)), None);
}

#[test]
fn debug_shows_the_counts() {
    let pool = BlockPool::new(4, 8);
    let mut ids = Vec::new();
    pool.try_alloc(3, &mut ids).unwrap();
    let text = format!("{pool:?}");
    for part in [
        "num_blocks: 4",
        "block_size: 8",
        "used_blocks: 3",
        "closed: false",
    ] {
        assert!(text.contains(part), "{text:?} lacks {part:?}");
    }
    // A wait shows what it asks, and of which pool.
    let mut more = Vec::new();
    let wait = pool.alloc(2, &mut more);
    let text = format!("{wait:?}");
    for part in ["Alloc {", "n: 2", "BlockPool", "used_blocks: 3"] {
        assert!(text.contains(part), "{text:?} lacks {part:?}");
    }
    drop(wait);
    pool.free(&ids).unwrap();
}

// ---------------------------------------------------------------------------
// try_alloc: successes
// ---------------------------------------------------------------------------

#[test]
fn try_alloc_zero_appends_nothing_and_changes_nothing() {
    let pool = BlockPool::new(4, 8);
    let mut out = sentinel();
    let before = pool_snap(&pool);
    pool.try_alloc(0, &mut out).unwrap();
    assert_eq!(out, sentinel());
    assert_eq!(pool_snap(&pool), before);
}

#[test]
fn try_alloc_one_takes_one_block_with_one_reference() {
    let pool = BlockPool::new(4, 8);
    let mut out = sentinel();
    pool.try_alloc(1, &mut out).unwrap();
    assert_eq!(out.len(), 3);
    assert_eq!(out[..2], sentinel()[..]);
    let id = out[2];
    assert!(id.index() < 4);
    assert_eq!(pool.ref_count(id), Some(1));
    assert_eq!((pool.free_blocks(), pool.used_blocks()), (3, 1));
    assert_eq!(pool.peak_used_blocks(), 1);
    for other in (0..4).map(BlockId::new).filter(|&b| b != id) {
        assert_eq!(pool.ref_count(other), Some(0));
    }
}

#[test]
fn try_alloc_all_blocks_at_once() {
    for num_blocks in [1, 2, 7, 64] {
        let pool = BlockPool::new(num_blocks, 4);
        let mut out = sentinel();
        pool.try_alloc(num_blocks, &mut out).unwrap();
        assert_eq!(out.len(), 2 + num_blocks);
        assert_eq!(out[..2], sentinel()[..]);
        let ids = &out[2..];
        assert_distinct_in_range(&pool, ids);
        let set: BTreeSet<usize> = ids.iter().map(|id| id.index()).collect();
        assert_eq!(set, (0..num_blocks).collect());
        assert_eq!((pool.free_blocks(), pool.used_blocks()), (0, num_blocks));
        assert!(ids.iter().all(|&id| pool.ref_count(id) == Some(1)));
    }
}

#[test]
fn try_alloc_appends_distinct_in_range_ids_across_calls() {
    let pool = BlockPool::new(16, 4);
    let mut out = Vec::new();
    for (n, total) in [(3, 3), (1, 4), (5, 9), (7, 16)] {
        pool.try_alloc(n, &mut out).unwrap();
        assert_eq!(out.len(), total);
        assert_distinct_in_range(&pool, &out);
        assert_eq!(pool.used_blocks(), total);
        assert_eq!(pool.free_blocks(), 16 - total);
    }
    assert!(out.iter().all(|&id| pool.ref_count(id) == Some(1)));
}

#[test]
fn all_ids_come_back() {
    let pool = BlockPool::new(32, 4);
    let mut first = Vec::new();
    pool.try_alloc(32, &mut first).unwrap();
    let first_set: BTreeSet<BlockId> = first.iter().copied().collect();
    assert_eq!(first_set.len(), 32);
    // Free in a scrambled order, in several calls.
    let mut scrambled = first.clone();
    scrambled.reverse();
    scrambled.swap(0, 17);
    for chunk in scrambled.chunks(5) {
        pool.free(chunk).unwrap();
    }
    assert_eq!((pool.free_blocks(), pool.used_blocks()), (32, 0));
    assert!(pool_snap(&pool).refs.iter().all(|&r| r == 0));
    let mut second = Vec::new();
    pool.try_alloc(32, &mut second).unwrap();
    let second_set: BTreeSet<BlockId> = second.iter().copied().collect();
    assert_eq!(second_set, first_set);
    assert_eq!(second_set, (0..32).map(BlockId::new).collect());
    pool.free(&second).unwrap();
}

#[test]
fn freed_blocks_are_reused_and_never_duplicated() {
    let pool = BlockPool::new(8, 4);
    let mut a = Vec::new();
    pool.try_alloc(5, &mut a).unwrap();
    pool.free(&a[1..3]).unwrap();
    let mut b = Vec::new();
    pool.try_alloc(5, &mut b).unwrap();
    // Held now: a[0], a[3], a[4] and b (5 ids): 8 distinct ids.
    let mut held = vec![a[0], a[3], a[4]];
    held.extend_from_slice(&b);
    assert_distinct_in_range(&pool, &held);
    assert_eq!(held.len(), 8);
    assert_eq!(pool.free_blocks(), 0);
    pool.free(&held).unwrap();
    assert_eq!(pool.free_blocks(), 8);
}

#[test]
fn peak_used_blocks_is_the_high_water_mark() {
    let pool = BlockPool::new(8, 4);
    let mut a = Vec::new();
    pool.try_alloc(3, &mut a).unwrap();
    pool.try_alloc(3, &mut a).unwrap();
    pool.free(&a[..4]).unwrap();
    assert_eq!((pool.used_blocks(), pool.peak_used_blocks()), (2, 6));
    let mut b = Vec::new();
    pool.try_alloc(1, &mut b).unwrap();
    assert_eq!(pool.peak_used_blocks(), 6);
    pool.try_alloc(5, &mut b).unwrap();
    assert_eq!(pool.peak_used_blocks(), 8);
    pool.free(&a[4..]).unwrap();
    pool.free(&b).unwrap();
    assert_eq!((pool.used_blocks(), pool.peak_used_blocks()), (0, 8));
}

/// On several shards the peak stays exact for one thread: a refused
/// allocation that gathered from every shard leaves its home shard's view
/// of the others right, and the fast-path allocations after it raise the
/// peak from that view.
#[test]
fn peak_used_blocks_is_exact_for_one_thread_after_a_refused_gather() {
    for shards in [2, 4] {
        let pool = BlockPool::with_shards(64, 4, shards);
        let mut a = Vec::new();
        pool.try_alloc(8, &mut a).unwrap();
        // 56 free: this takes them all from every shard and gives them back
        // to its home shard.
        assert!(matches!(
            pool.try_alloc(57, &mut Vec::new()),
            Err(ReserveError::Full { available: 56, .. })
        ));
        assert_eq!((pool.used_blocks(), pool.peak_used_blocks()), (8, 8));
        let mut b = Vec::new();
        pool.try_alloc(50, &mut b).unwrap();
        assert_eq!(pool.peak_used_blocks(), 58, "{shards} shards");
        pool.free(&b).unwrap();
        pool.free(&a).unwrap();
        assert_eq!((pool.used_blocks(), pool.peak_used_blocks()), (0, 58));
    }
}

// ---------------------------------------------------------------------------
// try_alloc: refusals
// ---------------------------------------------------------------------------

#[test]
fn try_alloc_more_than_num_blocks_never_fits() {
    let pool = BlockPool::new(4, 8);
    let mut out = sentinel();
    for n in [5, 6, 1000, usize::MAX / 2, usize::MAX - 1, usize::MAX] {
        assert_alloc_refused(
            &pool,
            n,
            0,
            &mut out,
            ReserveError::NeverFits {
                requested: n,
                capacity: 4,
            },
        );
    }
    // Also while some are held.
    let mut held = Vec::new();
    pool.try_alloc(2, &mut held).unwrap();
    assert_alloc_refused(
        &pool,
        5,
        0,
        &mut out,
        ReserveError::NeverFits {
            requested: 5,
            capacity: 4,
        },
    );
    pool.free(&held).unwrap();
}

#[test]
fn try_alloc_usize_max_into_empty_out_leaves_it_empty() {
    let pool = BlockPool::new(4, 8);
    let mut out = Vec::new();
    assert_alloc_refused(
        &pool,
        usize::MAX,
        0,
        &mut out,
        ReserveError::NeverFits {
            requested: usize::MAX,
            capacity: 4,
        },
    );
    assert!(out.is_empty());
}

#[test]
fn try_alloc_full_reports_what_was_available() {
    let pool = BlockPool::new(8, 4);
    let mut held = Vec::new();
    pool.try_alloc(5, &mut held).unwrap();
    let mut out = sentinel();
    for n in [4, 5, 8] {
        assert_alloc_refused(
            &pool,
            n,
            0,
            &mut out,
            ReserveError::Full {
                requested: n,
                available: 3,
            },
        );
    }
    // Exactly what is left still fits.
    pool.try_alloc(3, &mut out).unwrap();
    assert_eq!(out.len(), 5);
    assert_alloc_refused(
        &pool,
        1,
        0,
        &mut out,
        ReserveError::Full {
            requested: 1,
            available: 0,
        },
    );
    pool.free(&out[2..]).unwrap();
    pool.free(&held).unwrap();
    assert_eq!(pool.free_blocks(), 8);
}

#[test]
fn try_alloc_full_is_retryable_and_never_fits_is_not() {
    let pool = BlockPool::new(2, 4);
    let mut held = Vec::new();
    pool.try_alloc(2, &mut held).unwrap();
    let full = pool.try_alloc(1, &mut Vec::new()).unwrap_err();
    assert!(full.is_retryable());
    let never = pool.try_alloc(3, &mut Vec::new()).unwrap_err();
    assert!(!never.is_retryable());
    pool.free(&held).unwrap();
    // After the release the same request fits.
    pool.try_alloc(1, &mut held).unwrap();
    pool.free(&held[2..]).unwrap();
}

#[test]
fn try_alloc_with_headroom_keeps_room_free() {
    let pool = BlockPool::new(8, 4);
    let mut out = sentinel();
    // used + n + headroom <= 8
    pool.try_alloc_with_headroom(5, 3, &mut out).unwrap();
    assert_eq!(out.len(), 7);
    assert_distinct_in_range(&pool, &out[2..]);
    assert_eq!(pool.used_blocks(), 5);
    assert_alloc_refused(
        &pool,
        1,
        3,
        &mut out,
        ReserveError::Full {
            requested: 1,
            available: 3,
        },
    );
    // With less headroom it fits.
    pool.try_alloc_with_headroom(1, 2, &mut out).unwrap();
    assert_eq!(pool.used_blocks(), 6);
    // Zero blocks with more headroom than is free: refused, nothing changes.
    assert_alloc_refused(
        &pool,
        0,
        3,
        &mut out,
        ReserveError::Full {
            requested: 0,
            available: 2,
        },
    );
    // Zero blocks with headroom that is free: fine, appends nothing.
    let before = out.clone();
    pool.try_alloc_with_headroom(0, 2, &mut out).unwrap();
    assert_eq!(out, before);
    pool.free(&out[2..]).unwrap();
    assert_eq!(pool.free_blocks(), 8);
}

#[test]
fn try_alloc_with_headroom_beyond_capacity_never_fits() {
    let pool = BlockPool::new(8, 4);
    let mut out = sentinel();
    for (n, headroom) in [
        (1, 8),
        (5, 4),
        (0, 9),
        (1, usize::MAX),
        (0, usize::MAX),
        (usize::MAX, usize::MAX),
        (usize::MAX, 1),
        (8, 1),
    ] {
        assert_alloc_refused(
            &pool,
            n,
            headroom,
            &mut out,
            ReserveError::NeverFits {
                requested: n,
                capacity: 8,
            },
        );
    }
}

#[test]
fn try_alloc_with_zero_headroom_is_try_alloc() {
    let pool = BlockPool::new(4, 4);
    let mut out = Vec::new();
    pool.try_alloc_with_headroom(4, 0, &mut out).unwrap();
    assert_distinct_in_range(&pool, &out);
    assert_eq!(pool.free_blocks(), 0);
    pool.free(&out).unwrap();
}

#[test]
fn closed_pool_refuses_allocation_but_frees_still_work() {
    let pool = BlockPool::new(8, 4);
    let mut held = Vec::new();
    pool.try_alloc(3, &mut held).unwrap();
    assert!(!pool.is_closed());
    pool.close();
    assert!(pool.is_closed());
    let mut out = sentinel();
    for n in [0, 1, 5] {
        assert_alloc_refused(&pool, n, 0, &mut out, ReserveError::Closed);
        assert_alloc_refused(&pool, n, 1, &mut out, ReserveError::Closed);
    }
    // Closed wins, even over requests that could never fit.
    for (n, headroom) in [
        (9, 0),
        (usize::MAX, 0),
        (1, usize::MAX),
        (usize::MAX, usize::MAX),
    ] {
        assert_alloc_refused(&pool, n, headroom, &mut out, ReserveError::Closed);
    }
    // Closing twice is harmless.
    pool.close();
    assert!(pool.is_closed());
    // Draining works.
    pool.free(&held).unwrap();
    assert_eq!((pool.free_blocks(), pool.used_blocks()), (8, 0));
    assert!(pool_snap(&pool).refs.iter().all(|&r| r == 0));
    assert_alloc_refused(&pool, 1, 0, &mut out, ReserveError::Closed);
}

#[test]
fn empty_pool_refuses_everything() {
    let pool = BlockPool::new(0, 16);
    let mut out = sentinel();
    // Asking for nothing is not an allocation: it succeeds with nothing.
    let before = pool_snap(&pool);
    pool.try_alloc(0, &mut out).unwrap();
    assert_eq!((out.clone(), pool_snap(&pool)), (sentinel(), before));
    for n in [1, 2, usize::MAX] {
        assert_alloc_refused(
            &pool,
            n,
            0,
            &mut out,
            ReserveError::NeverFits {
                requested: n,
                capacity: 0,
            },
        );
    }
    assert_alloc_refused(
        &pool,
        0,
        1,
        &mut out,
        ReserveError::NeverFits {
            requested: 0,
            capacity: 0,
        },
    );
    for id in [0, 1, u32::MAX] {
        assert_free_refused(
            &pool,
            &[BlockId::new(id)],
            FreeError::OutOfRange {
                id: BlockId::new(id),
                num_blocks: 0,
            },
        );
    }
    pool.free(&[]).unwrap();
    pool.close();
    assert_alloc_refused(&pool, 0, 0, &mut out, ReserveError::Closed);
    assert_alloc_refused(&pool, 1, 0, &mut out, ReserveError::Closed);
    assert_eq!((pool.free_blocks(), pool.used_blocks()), (0, 0));
}

// ---------------------------------------------------------------------------
// free
// ---------------------------------------------------------------------------

#[test]
fn free_empty_slice_is_a_no_op() {
    let pool = BlockPool::new(4, 4);
    let before = pool_snap(&pool);
    pool.free(&[]).unwrap();
    assert_eq!(pool_snap(&pool), before);
    let mut held = Vec::new();
    pool.try_alloc(2, &mut held).unwrap();
    let before = pool_snap(&pool);
    pool.free(&[]).unwrap();
    assert_eq!(pool_snap(&pool), before);
    pool.free(&held).unwrap();
}

#[test]
fn free_returns_exactly_the_listed_blocks() {
    let pool = BlockPool::new(6, 4);
    let mut held = Vec::new();
    pool.try_alloc(6, &mut held).unwrap();
    pool.free(&[held[4], held[1]]).unwrap();
    assert_eq!((pool.free_blocks(), pool.used_blocks()), (2, 4));
    for (i, &id) in held.iter().enumerate() {
        let expected = if i == 1 || i == 4 { 0 } else { 1 };
        assert_eq!(pool.ref_count(id), Some(expected), "{id}");
    }
    // The two freed blocks are the two that come back.
    let mut again = Vec::new();
    pool.try_alloc(2, &mut again).unwrap();
    let again: BTreeSet<BlockId> = again.into_iter().collect();
    assert_eq!(again, [held[1], held[4]].into_iter().collect());
}

#[test]
fn free_out_of_range_changes_nothing() {
    let pool = BlockPool::new(4, 4);
    let mut held = Vec::new();
    pool.try_alloc(2, &mut held).unwrap();
    for raw in [4, 5, 1000, u32::MAX - 1, u32::MAX] {
        let id = BlockId::new(raw);
        assert_free_refused(&pool, &[id], FreeError::OutOfRange { id, num_blocks: 4 });
        // Also after a valid id, and before one.
        assert_free_refused(
            &pool,
            &[held[0], id],
            FreeError::OutOfRange { id, num_blocks: 4 },
        );
        assert_free_refused(
            &pool,
            &[id, held[1]],
            FreeError::OutOfRange { id, num_blocks: 4 },
        );
    }
    pool.free(&held).unwrap();
    assert_eq!(pool.free_blocks(), 4);
}

#[test]
fn free_never_allocated_changes_nothing() {
    let pool = BlockPool::new(4, 4);
    for raw in 0..4 {
        let id = BlockId::new(raw);
        assert_free_refused(&pool, &[id], FreeError::NotAllocated { id });
    }
    let mut held = Vec::new();
    pool.try_alloc(2, &mut held).unwrap();
    let unheld: Vec<BlockId> = (0..4)
        .map(BlockId::new)
        .filter(|id| !held.contains(id))
        .collect();
    for &id in &unheld {
        assert_free_refused(&pool, &[id], FreeError::NotAllocated { id });
    }
    pool.free(&held).unwrap();
}

#[test]
fn double_free_changes_nothing() {
    let pool = BlockPool::new(4, 4);
    let mut held = Vec::new();
    pool.try_alloc(3, &mut held).unwrap();
    pool.free(&held[..1]).unwrap();
    assert_free_refused(&pool, &held[..1], FreeError::NotAllocated { id: held[0] });
    // Freeing the whole list again fails on its first, already freed id.
    assert_free_refused(&pool, &held, FreeError::NotAllocated { id: held[0] });
    assert_eq!(pool.ref_count(held[1]), Some(1));
    assert_eq!(pool.ref_count(held[2]), Some(1));
    pool.free(&held[1..]).unwrap();
    assert_free_refused(&pool, &held, FreeError::NotAllocated { id: held[0] });
    assert_eq!(pool.free_blocks(), 4);
}

#[test]
fn id_listed_twice_with_one_reference_is_over_freed() {
    let pool = BlockPool::new(4, 4);
    let mut held = Vec::new();
    pool.try_alloc(2, &mut held).unwrap();
    let (a, b) = (held[0], held[1]);
    assert_free_refused(&pool, &[a, a], FreeError::OverFreed { id: a });
    assert_free_refused(&pool, &[a, b, a], FreeError::OverFreed { id: a });
    assert_free_refused(&pool, &[b, a, b, a], FreeError::OverFreed { id: b });
    assert_eq!(pool.ref_count(a), Some(1));
    assert_eq!(pool.ref_count(b), Some(1));
    assert_eq!(pool.free_blocks(), 2);
    pool.free(&held).unwrap();
    assert_eq!(pool.free_blocks(), 4);
}

#[test]
fn id_listed_more_times_than_its_references_is_over_freed() {
    let pool = BlockPool::new(4, 2);
    let mut held = Vec::new();
    pool.try_alloc(2, &mut held).unwrap();
    let (a, b) = (held[0], held[1]);
    assert_eq!(pool.ref_count(a), Some(1));
    assert_free_refused(&pool, &[a, a], FreeError::OverFreed { id: a });
    assert_free_refused(&pool, &[b, a, b, b], FreeError::OverFreed { id: b });
    assert_eq!((pool.ref_count(a), pool.ref_count(b)), (Some(1), Some(1)));
    assert_eq!(pool.used_blocks(), 2);
    pool.free(&held).unwrap();
    assert_eq!(pool.free_blocks(), 4);
}

/// A block that sequences hold, shared or not, is theirs to give back: a
/// raw free of it is a double free, refused before anything changes.
#[test]
fn a_sequence_s_block_is_refused_by_free() {
    let pool = Arc::new(BlockPool::new(4, 2));
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(4).unwrap();
    let (child, copy) = parent.try_fork().unwrap();
    assert_eq!(copy, None);
    let (a, b) = (parent.blocks()[0], parent.blocks()[1]);
    assert_eq!(pool.ref_count(a), Some(2));
    assert_free_refused(&pool, &[a], FreeError::HeldBySequence { id: a });
    assert_free_refused(&pool, &[b, a, b, b], FreeError::HeldBySequence { id: b });
    drop(child);
    assert_eq!(pool.ref_count(a), Some(1));
    assert_free_refused(&pool, &[a], FreeError::HeldBySequence { id: a });
    drop(parent);
    assert_eq!(pool.free_blocks(), 4);
    // Given back, the blocks are free: a free of them is `NotAllocated`.
    assert_free_refused(&pool, &[a], FreeError::NotAllocated { id: a });
}

#[test]
fn a_valid_id_before_a_bad_one_keeps_its_reference() {
    let pool = BlockPool::new(6, 4);
    let mut held = Vec::new();
    pool.try_alloc(3, &mut held).unwrap();
    let free_id = (0..6)
        .map(BlockId::new)
        .find(|id| !held.contains(id))
        .unwrap();
    let out_of_range = BlockId::new(6);
    // Each valid id here is the block's only reference: dropping it and not
    // undoing would return the block to the pool.
    assert_free_refused(
        &pool,
        &[held[0], held[1], free_id],
        FreeError::NotAllocated { id: free_id },
    );
    assert_free_refused(
        &pool,
        &[held[2], held[0], out_of_range],
        FreeError::OutOfRange {
            id: out_of_range,
            num_blocks: 6,
        },
    );
    assert_free_refused(
        &pool,
        &[held[0], held[1], held[2], held[1]],
        FreeError::OverFreed { id: held[1] },
    );
    assert!(held.iter().all(|&id| pool.ref_count(id) == Some(1)));
    // The refused calls pushed nothing into the free list: exactly the three
    // free blocks come out, and then nothing more.
    let mut rest = Vec::new();
    pool.try_alloc(3, &mut rest).unwrap();
    let mut all = held.clone();
    all.extend_from_slice(&rest);
    assert_distinct_in_range(&pool, &all);
    assert_eq!(
        pool.try_alloc(1, &mut Vec::new()),
        Err(ReserveError::Full {
            requested: 1,
            available: 0,
        })
    );
    pool.free(&all).unwrap();
    assert_eq!(pool.free_blocks(), 6);
}

#[test]
fn a_shared_valid_id_before_a_bad_one_keeps_both_references() {
    let pool = Arc::new(BlockPool::new(4, 2));
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(2).unwrap();
    let (child, _) = parent.try_fork().unwrap();
    let shared = parent.blocks()[0];
    assert_eq!(pool.ref_count(shared), Some(2));
    let unallocated = (0..4).map(BlockId::new).find(|&id| id != shared).unwrap();
    // Not allocated is checked before held by a sequence.
    assert_free_refused(
        &pool,
        &[shared, unallocated],
        FreeError::NotAllocated { id: unallocated },
    );
    assert_free_refused(
        &pool,
        &[shared, shared, shared],
        FreeError::HeldBySequence { id: shared },
    );
    assert_eq!(pool.ref_count(shared), Some(2));
    drop(parent);
    assert_eq!(pool.ref_count(shared), Some(1));
    assert_eq!(pool.used_blocks(), 1);
    drop(child);
    assert_eq!(pool.free_blocks(), 4);
}

#[test]
fn refused_frees_never_make_free_blocks_exceed_num_blocks() {
    let pool = BlockPool::new(3, 4);
    let mut held = Vec::new();
    pool.try_alloc(3, &mut held).unwrap();
    pool.free(&held).unwrap();
    for _ in 0..3 {
        assert!(pool.free(&held).is_err());
        assert!(pool.free(&held[..1]).is_err());
        assert_eq!(pool.free_blocks(), 3);
        assert_eq!(pool.used_blocks(), 0);
    }
    // The free list was not corrupted by the refused frees: three distinct
    // ids, then Full.
    let mut again = Vec::new();
    pool.try_alloc(3, &mut again).unwrap();
    assert_distinct_in_range(&pool, &again);
    assert!(pool.try_alloc(1, &mut Vec::new()).is_err());
    pool.free(&again).unwrap();
}

// ---------------------------------------------------------------------------
// BlockId
// ---------------------------------------------------------------------------

#[test]
fn block_id_new_and_index_round_trip() {
    for raw in [0u32, 1, 7, 1000, u32::MAX - 1, u32::MAX] {
        assert_eq!(BlockId::new(raw).index(), raw as usize);
    }
    const ID: BlockId = BlockId::new(9);
    const INDEX: usize = ID.index();
    assert_eq!(INDEX, 9);
}

#[test]
fn block_id_orders_by_index() {
    let mut ids: Vec<BlockId> = [5u32, 0, u32::MAX, 3, 1]
        .into_iter()
        .map(BlockId::new)
        .collect();
    ids.sort();
    let indices: Vec<usize> = ids.iter().map(|id| id.index()).collect();
    assert_eq!(indices, [0, 1, 3, 5, u32::MAX as usize]);
    assert!(BlockId::new(2) < BlockId::new(3));
    assert!(BlockId::new(3) > BlockId::new(2));
    assert_eq!(
        BlockId::new(4).cmp(&BlockId::new(4)),
        std::cmp::Ordering::Equal
    );
    assert_eq!(BlockId::new(4).max(BlockId::new(8)), BlockId::new(8));
}

#[test]
fn block_id_eq_and_hash_agree() {
    let state = std::collections::hash_map::RandomState::new();
    let hash = |id: BlockId| state.hash_one(id);
    assert_eq!(BlockId::new(17), BlockId::new(17));
    assert_ne!(BlockId::new(17), BlockId::new(18));
    assert_eq!(hash(BlockId::new(17)), hash(BlockId::new(17)));
    let set: HashSet<BlockId> = [1, 2, 2, 3, 1].into_iter().map(BlockId::new).collect();
    assert_eq!(set.len(), 3);
    assert!(set.contains(&BlockId::new(2)));
    assert!(!set.contains(&BlockId::new(4)));
}

#[test]
fn block_id_is_copy_and_debug() {
    let a = BlockId::new(3);
    let b = a; // Copy
    #[allow(clippy::clone_on_copy)]
    let c = a.clone();
    assert_eq!((a, b), (c, c));
    let debug = format!("{a:?}");
    assert!(debug.contains('3'), "{debug}");
}

#[test]
fn block_id_display_names_the_block() {
    assert_eq!(BlockId::new(0).to_string(), "block 0");
    assert_eq!(BlockId::new(42).to_string(), "block 42");
    // u32::MAX is no pool's block: the null entry of a hybrid table.
    assert_eq!(BlockId::new(u32::MAX), BlockId::NULL);
    assert_eq!(BlockId::NULL.to_string(), "the null block");
}

// ---------------------------------------------------------------------------
// FreeError
// ---------------------------------------------------------------------------

#[test]
fn free_error_display_names_the_id() {
    let id = BlockId::new(37);
    let cases = [
        FreeError::OutOfRange { id, num_blocks: 8 },
        FreeError::NotAllocated { id },
        FreeError::OverFreed { id },
        FreeError::Raced { id },
    ];
    for e in cases {
        let text = e.to_string();
        assert!(text.contains("block 37"), "{text:?} does not name the id");
    }
    assert!(FreeError::OutOfRange { id, num_blocks: 8 }
        .to_string()
        .contains('8'));
    assert!(FreeError::Raced { id }
        .to_string()
        .contains("a free dropped the other listed references"));
    // The four are told apart.
    let texts: HashSet<String> = cases.iter().map(|e| e.to_string()).collect();
    assert_eq!(texts.len(), 4);
}

#[test]
fn free_error_is_an_error_and_copy_eq() {
    fn as_error(e: &(dyn Error + Send + Sync + 'static)) -> String {
        assert!(e.source().is_none());
        e.to_string()
    }
    let e = FreeError::NotAllocated {
        id: BlockId::new(1),
    };
    let copy = e;
    assert_eq!(e, copy);
    assert_ne!(
        e,
        FreeError::OverFreed {
            id: BlockId::new(1)
        }
    );
    assert_ne!(
        e,
        FreeError::NotAllocated {
            id: BlockId::new(2)
        }
    );
    assert_eq!(as_error(&e), e.to_string());
    let boxed: Box<dyn Error + Send + Sync> = Box::new(e);
    assert_eq!(boxed.to_string(), e.to_string());
    assert!(format!("{e:?}").contains("NotAllocated"));
}

#[test]
fn free_error_from_pool_names_the_first_offender() {
    let pool = BlockPool::new(4, 4);
    let err = pool.free(&[BlockId::new(2), BlockId::new(1)]).unwrap_err();
    assert_eq!(
        err,
        FreeError::NotAllocated {
            id: BlockId::new(2)
        }
    );
    assert!(err.to_string().contains("block 2"));
}

// ---------------------------------------------------------------------------
// Send / Sync, and sharing as Arc<BlockPool>
// ---------------------------------------------------------------------------

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    const fn assert_send<T: Send>() {}
    assert_send_sync::<BlockPool>();
    assert_send_sync::<Arc<BlockPool>>();
    assert_send_sync::<BlockId>();
    assert_send_sync::<FreeError>();
    assert_send_sync::<BlockCopy>();
    assert_send::<Sequence>();
};

#[test]
fn pool_is_shared_across_threads_as_arc() {
    let pool = Arc::new(BlockPool::new(8, 4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                let mut ids = Vec::new();
                pool.try_alloc(2, &mut ids).unwrap();
                ids
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().unwrap());
    }
    assert_distinct_in_range(&pool, &all);
    assert_eq!(pool.free_blocks(), 0);
    pool.free(&all).unwrap();
    assert_eq!(pool.free_blocks(), 8);
}

// ---------------------------------------------------------------------------
// with_shards and the sharded free list
// ---------------------------------------------------------------------------

/// Free, used and every reference count: what a refusal must leave alone
/// and what giving every block back restores (the peak stays raised).
fn state(pool: &BlockPool) -> (usize, usize, Vec<Option<usize>>) {
    let refs = (0..pool.num_blocks())
        .map(|i| pool.ref_count(BlockId::new(i as u32)))
        .collect();
    (pool.free_blocks(), pool.used_blocks(), refs)
}

/// Asserts that `ids` are `n` distinct in-range ids.
fn assert_distinct(ids: &[BlockId], n: usize, num_blocks: usize) {
    let set: BTreeSet<_> = ids.iter().copied().collect();
    assert_eq!(set.len(), n, "duplicates in {ids:?}");
    assert_eq!(ids.len(), n);
    assert!(ids.iter().all(|id| id.index() < num_blocks), "{ids:?}");
}

#[test]
#[should_panic(expected = "shards must be in 1..=1024, got 0")]
fn zero_shards_panics() {
    let _ = BlockPool::with_shards(4, 16, 0);
}

#[test]
#[should_panic(expected = "shards must be in 1..=1024, got 1025")]
fn more_than_max_shards_panics() {
    let _ = BlockPool::with_shards(4, 16, BlockPool::MAX_SHARDS + 1);
}

#[test]
#[should_panic(expected = "shards must be in 1..=1024")]
fn usize_max_shards_panics() {
    let _ = BlockPool::with_shards(4, 16, usize::MAX);
}

#[test]
#[should_panic(expected = "block_size must be non-zero")]
fn with_shards_checks_the_block_size_too() {
    let _ = BlockPool::with_shards(4, 0, 2);
}

#[test]
fn max_shards_is_accepted() {
    let pool = BlockPool::with_shards(3, 1, BlockPool::MAX_SHARDS);
    assert_eq!(pool.shards(), BlockPool::MAX_SHARDS);
    let mut ids = Vec::new();
    pool.try_alloc(3, &mut ids).unwrap();
    assert_distinct(&ids, 3, 3);
    pool.free(&ids).unwrap();
    assert_eq!(pool.free_blocks(), 3);
}

#[test]
fn new_picks_one_shard_per_64_blocks_up_to_16() {
    for (num_blocks, shards) in [
        (0, 1),
        (1, 1),
        (63, 1),
        (64, 1),
        (127, 1),
        (128, 2),
        (640, 10),
        (1024, 16),
        (1025, 16),
        (1_000_000, 16),
    ] {
        assert_eq!(
            BlockPool::new(num_blocks, 16).shards(),
            shards,
            "{num_blocks}"
        );
    }
    assert_eq!(BlockPool::DEFAULT_SHARDS, 16);
    assert_eq!(BlockPool::BLOCKS_PER_SHARD, 64);
}

#[test]
fn debug_shows_the_shard_count() {
    let text = format!("{:?}", BlockPool::with_shards(8, 4, 3));
    assert!(text.contains("shards: 3"), "{text}");
}

/// Every pool size up to 10 under every shard count up to 12 (so more
/// shards than blocks too): one at a time and all at once, every block
/// comes out exactly once, one more is refused with the exact count and
/// nothing changes, and freeing restores the fresh pool.
#[test]
fn every_block_comes_out_once_whatever_the_shard_count() {
    for num_blocks in 0..=10 {
        for shards in 1..=12 {
            let pool = BlockPool::with_shards(num_blocks, 2, shards);
            let fresh = state(&pool);
            let mut ids = Vec::new();
            for _ in 0..num_blocks {
                pool.try_alloc(1, &mut ids).unwrap();
            }
            assert_distinct(&ids, num_blocks, num_blocks);
            let before = state(&pool);
            let mut out = vec![BlockId::new(7)];
            let expected = if num_blocks == 0 {
                ReserveError::NeverFits {
                    requested: 1,
                    capacity: 0,
                }
            } else {
                ReserveError::Full {
                    requested: 1,
                    available: 0,
                }
            };
            assert_eq!(pool.try_alloc(1, &mut out), Err(expected));
            assert_eq!(out, [BlockId::new(7)], "a refusal touched out");
            assert_eq!(state(&pool), before, "a refusal changed the pool");
            pool.free(&ids).unwrap();
            assert_eq!(state(&pool), fresh);

            let mut all = Vec::new();
            pool.try_alloc(num_blocks, &mut all).unwrap();
            assert_distinct(&all, num_blocks, num_blocks);
            pool.free(&all).unwrap();
            assert_eq!(state(&pool), fresh, "{num_blocks} blocks, {shards} shards");
        }
    }
}

/// A request larger than any one shard takes from several, all or nothing:
/// the refused request leaves `out` and the pool as they were.
#[test]
fn a_request_spanning_shards_is_all_or_nothing() {
    let pool = BlockPool::with_shards(8, 16, 4);
    let mut held = Vec::new();
    pool.try_alloc(3, &mut held).unwrap();
    let before = state(&pool);
    let mut out = vec![BlockId::new(99)];
    assert_eq!(
        pool.try_alloc(6, &mut out),
        Err(ReserveError::Full {
            requested: 6,
            available: 5
        })
    );
    assert_eq!(out, [BlockId::new(99)]);
    assert_eq!(state(&pool), before);
    pool.try_alloc(5, &mut held).unwrap();
    assert_distinct(&held, 8, 8);
    pool.free(&held).unwrap();
    assert_eq!(pool.free_blocks(), 8);
}

/// Blocks taken by one thread and freed by another go back to the shards
/// that own them, where a third thread (another home shard) finds them.
#[test]
fn blocks_freed_on_another_thread_are_found_from_any_thread() {
    const N: usize = 1024;
    let pool = Arc::new(BlockPool::with_shards(N, 16, 16));
    for _round in 0..3 {
        let taken = thread::scope(|s| {
            s.spawn(|| {
                let mut ids = Vec::new();
                pool.try_alloc(N, &mut ids).unwrap();
                ids
            })
            .join()
            .unwrap()
        });
        assert_distinct(&taken, N, N);
        assert_eq!(pool.free_blocks(), 0);
        thread::scope(|s| {
            s.spawn(|| pool.free(&taken).unwrap()).join().unwrap();
        });
        assert_eq!(pool.free_blocks(), N);
    }
    // And in small pieces from several threads at once.
    let pieces: Vec<Vec<BlockId>> = thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut ids = Vec::new();
                    for _ in 0..N / 4 / 8 {
                        pool.try_alloc(8, &mut ids).unwrap();
                    }
                    ids
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all: Vec<BlockId> = pieces.concat();
    assert_distinct(&all, N, N);
    pool.free(&all).unwrap();
    assert_eq!(pool.free_blocks(), N);
}

/// Sequences over a sharded pool: appends spanning shards, a fork sharing
/// blocks, truncation, and the pool full again once they are dropped.
#[test]
fn sequences_over_a_sharded_pool() {
    let pool = Arc::new(BlockPool::with_shards(12, 4, 5));
    let mut parent = Sequence::new(Arc::clone(&pool));
    assert_eq!(parent.try_append(30).unwrap(), 0..30); // 8 blocks
    let (mut child, copy) = parent.try_fork().unwrap();
    let copy = copy.expect("30 tokens end inside a block");
    assert_eq!(copy.tokens, 2);
    assert_eq!(pool.used_blocks(), 9);
    assert_eq!(child.try_append(10).unwrap(), 30..40);
    assert_eq!(pool.used_blocks(), 11);
    assert!(parent.try_append(16).is_err(), "needs 4 blocks, 1 free");
    assert_eq!(parent.len(), 30);
    // The parent keeps its first block; of the 7 it lets go, the 6 full
    // ones stay with the child and its private tail block is freed.
    parent.truncate(4);
    assert_eq!(pool.used_blocks(), 10);
    drop(parent);
    assert_eq!(pool.used_blocks(), 10, "the child still holds block 0");
    drop(child);
    assert_eq!(pool.free_blocks(), 12);
    let mut all = Vec::new();
    pool.try_alloc(12, &mut all).unwrap();
    assert_distinct(&all, 12, 12);
}

/// The shard a fresh pool of one block per shard serves the calling thread
/// from: the id `try_alloc(1)` returns.
fn home_shard() -> usize {
    let pool = BlockPool::with_shards(1024, 1, 1024);
    let mut ids = Vec::new();
    pool.try_alloc(1, &mut ids).unwrap();
    ids[0].index()
}

/// Threads start their pops at shards of their own: two threads get
/// different blocks from fresh pools of one block per shard (1,024
/// shards; two threads could share a home shard only if 1,024 other
/// threads had started in between). A thread keeps its home.
#[test]
fn threads_start_at_different_shards() {
    let a = thread::spawn(|| (home_shard(), home_shard()))
        .join()
        .unwrap();
    let b = thread::spawn(|| (home_shard(), home_shard()))
        .join()
        .unwrap();
    assert_eq!(a.0, a.1, "a thread's home shard moved");
    assert_eq!(b.0, b.1, "a thread's home shard moved");
    assert_ne!(a.0, b.0, "two threads started at the same shard");
}

/// A freed block goes back to the shard that owns it, not to the freer's:
/// with one block per shard, blocks 5 and 7 freed one at a time sit in
/// shards 5 and 7, and the next allocation takes whichever comes first
/// when counting on from the thread's home shard.
#[test]
fn freed_blocks_go_back_to_the_shard_that_owns_them() {
    let home = home_shard();
    let pool = BlockPool::with_shards(1024, 1, 1024);
    let mut all = Vec::new();
    pool.try_alloc(1024, &mut all).unwrap();
    let (five, seven) = (BlockId::new(5), BlockId::new(7));
    pool.free(&[five]).unwrap();
    pool.free(&[seven]).unwrap();
    // Shards are searched from home upwards, wrapping around.
    let distance = |shard: usize| (shard + 1024 - home) % 1024;
    let expected = if distance(5) < distance(7) {
        five
    } else {
        seven
    };
    let mut got = Vec::new();
    pool.try_alloc(1, &mut got).unwrap();
    assert_eq!(got, [expected], "home shard {home}");
}

/// One free of blocks that belong to different shards splits them: each
/// goes back to its own shard, as if freed one at a time.
#[test]
fn a_free_spanning_shards_gives_each_block_back_to_its_own() {
    let home = home_shard();
    let pool = BlockPool::with_shards(1024, 1, 1024);
    let mut all = Vec::new();
    pool.try_alloc(1024, &mut all).unwrap();
    let (five, six, nine) = (BlockId::new(5), BlockId::new(6), BlockId::new(9));
    pool.free(&[five, nine, six]).unwrap();
    let distance = |id: BlockId| (id.index() + 1024 - home) % 1024;
    let mut expected = vec![five, six, nine];
    expected.sort_by_key(|&id| distance(id));
    let mut got = Vec::new();
    for _ in 0..3 {
        pool.try_alloc(1, &mut got).unwrap();
    }
    assert_eq!(got, expected, "home shard {home}");
}

/// The shards as the documentation describes them: shard `s` owns ids
/// `s * span .. (s + 1) * span`, a freed id goes back to its owner's
/// shard, and an allocation of one block takes the lowest free id of the
/// first non-empty shard counting on from the thread's home.
struct Shards {
    span: usize,
    shards: Vec<Vec<BlockId>>,
}

impl Shards {
    fn free(&mut self, ids: &[BlockId]) {
        for &id in ids {
            self.shards[id.index() / self.span].push(id);
        }
    }

    fn alloc_one(&mut self, home: usize) -> Option<BlockId> {
        let n = self.shards.len();
        (0..n).find_map(|k| {
            let shard = &mut self.shards[(home + k) % n];
            let lowest = (0..shard.len()).min_by_key(|&i| shard[i])?;
            Some(shard.swap_remove(lowest))
        })
    }
}

/// Frees of chains that lie in one shard, in two, and in three, on a pool
/// of 4 shards of 4 ids, then single allocations: every block comes back
/// from where the model of the shards says, on several threads (so that
/// several home shards are tried).
#[test]
fn shards_of_four_ids_follow_the_model() {
    let run = || {
        let reveal = BlockPool::with_shards(16, 1, 4);
        let mut first = Vec::new();
        reveal.try_alloc(1, &mut first).unwrap();
        let home = first[0].index() / 4;

        let pool = BlockPool::with_shards(16, 1, 4);
        let mut all = Vec::new();
        pool.try_alloc(16, &mut all).unwrap();
        let mut model = Shards {
            span: 4,
            shards: vec![Vec::new(); 4],
        };
        let ids = |list: &[u32]| list.iter().map(|&i| BlockId::new(i)).collect::<Vec<_>>();
        for chain in [&[5, 9][..], &[6, 7], &[3, 4], &[2, 13, 10], &[15, 1, 8]] {
            let chain = ids(chain);
            pool.free(&chain).unwrap();
            model.free(&chain);
        }
        for _ in 0..12 {
            let mut got = Vec::new();
            pool.try_alloc(1, &mut got).unwrap();
            assert_eq!(Some(got[0]), model.alloc_one(home), "home shard {home}");
        }
        assert_eq!(pool.free_blocks(), 0);
    };
    for _ in 0..4 {
        thread::spawn(run).join().unwrap();
    }
}

#[test]
fn free_error_display_texts() {
    let id = BlockId::new(3);
    let texts = [
        (
            FreeError::OutOfRange { id, num_blocks: 2 },
            "block 3 is out of range for a pool of 2 blocks",
        ),
        (
            FreeError::NotAllocated { id },
            "block 3 is not allocated (never allocated, or a double free)",
        ),
        (
            FreeError::HeldBySequence { id },
            "block 3 is held by a sequence, which gives it back itself (a double free)",
        ),
        (
            FreeError::OverFreed { id },
            "block 3 is listed more times than it has references",
        ),
        (
            FreeError::TooManyRefs { id },
            "block 3 has as many references as a block can have",
        ),
        // The one variant both `free` and `add_refs` return, which differ
        // in what they did: the message says what each did.
        (
            FreeError::Raced { id },
            "block 3 was freed by another thread during this call (a racing double free): \
             a free dropped the other listed references, an add_refs changed nothing",
        ),
    ];
    for (err, text) in texts {
        assert_eq!(err.to_string(), text);
    }
}
