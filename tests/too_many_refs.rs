//! The largest reference count (`2^29 - 1`): `BlockPool::add_refs` past it
//! is refused with `FreeError::TooManyRefs` and changes nothing, also when
//! the list crosses it midway (the references the call added are dropped
//! again), and the block comes back whole once every reference is freed.
//! About half a billion reference adds and drops, too long for the
//! README's test command: with debug assertions on the test is ignored, so
//! `cargo test --workspace --test too_many_refs -- --ignored` runs it (as
//! `.ci/run` does) and a `--release` build runs it outright.

use kvslots::{BlockId, BlockPool, FreeError};

/// The most references a block can have.
const MAX: usize = (1 << 29) - 1;

/// Adds `n` references to `id` in lists of up to `chunk.len()`.
fn add(pool: &BlockPool, chunk: &[BlockId], mut n: usize) {
    while n > 0 {
        let k = n.min(chunk.len());
        pool.add_refs(&chunk[..k]).unwrap();
        n -= k;
    }
}

/// Frees `n` references to `id` in lists of up to `chunk.len()`.
fn free(pool: &BlockPool, chunk: &[BlockId], mut n: usize) {
    while n > 0 {
        let k = n.min(chunk.len());
        pool.free(&chunk[..k]).unwrap();
        n -= k;
    }
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "half a billion reference adds: run with --ignored (or --release)"
)]
fn add_refs_past_the_largest_count_is_refused_and_changes_nothing() {
    let pool = BlockPool::new(4, 16);
    let mut ids = Vec::new();
    pool.try_alloc(2, &mut ids).unwrap();
    let (id, other) = (ids[0], ids[1]);
    let chunk = vec![id; 1 << 22];
    add(&pool, &chunk, MAX - 1);
    assert_eq!(pool.ref_count(id), Some(MAX));

    // One more: refused, nothing changed.
    assert_eq!(pool.add_refs(&[id]), Err(FreeError::TooManyRefs { id }));
    assert_eq!(pool.ref_count(id), Some(MAX));
    // A list whose first id can take one more and whose second cannot:
    // the first's reference is dropped again.
    assert_eq!(
        pool.add_refs(&[other, id]),
        Err(FreeError::TooManyRefs { id })
    );
    assert_eq!(pool.ref_count(other), Some(1));
    assert_eq!(pool.ref_count(id), Some(MAX));
    assert_eq!((pool.used_blocks(), pool.free_blocks()), (2, 2));

    // Below the largest count again, it takes one more.
    pool.free(&[id]).unwrap();
    pool.add_refs(&[id]).unwrap();
    assert_eq!(pool.ref_count(id), Some(MAX));

    // Every reference freed: the block is free again, and whole.
    free(&pool, &chunk, MAX);
    assert_eq!(pool.ref_count(id), Some(0));
    pool.free(&[other]).unwrap();
    assert_eq!(pool.free_blocks(), 4);
    let mut again = Vec::new();
    pool.try_alloc(4, &mut again).unwrap();
    assert!(again.iter().all(|&b| pool.ref_count(b) == Some(1)));
    pool.free(&again).unwrap();
}
