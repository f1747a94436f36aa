//! Loom model of a free that finds a listed block freed by another thread
//! after its checks passed (a racing double free): it must neither
//! resurrect a block that is back in the free list nor touch a block that
//! was freed and reallocated in the meantime.
//!
//! Run with `scripts/loom refused_free`.
//!
//! Block `x` has two references (A's and B's), block `y` one (B's). A
//! frees `[x, y]`, listing `y`, which it does not hold (a double free),
//! while B frees `y`, then `x`, then allocates a block if `x` went back
//! to the pool. In the
//! interleaving that matters, A's checks pass, A drops `x` (2 to 1), B
//! frees `y` and `x` (`x` reaches 0 and goes back to the pool) and may get
//! `x` again, and A's drop of `y` fails: A must then report
//! `FreeError::Raced` and leave `x` alone. Whatever the interleaving:
//!
//! * A's result says what it still holds: nothing after `Ok` or `Raced`,
//!   everything it listed but `y` after a refusal by the checks;
//! * B's new block has exactly B's reference;
//! * every block with a reference is counted as used, and no other, and
//!   taking every free block hands out only blocks with no reference
//!   ("handed out twice" otherwise);
//! * once every holder has freed what it holds, the whole pool can be
//!   taken again.
//!
//! | model | threads, blocks | `blind_undo` (adds the dropped references back) |
//! |---|---|---|
//! | [`refused_free_vs_free`] | 2, 2 | caught |
//! | the same, A also freeing a block of its own first | 2, 3 | caught |
//!
//! The same race for a raw share: [`add_refs_vs_free`], where A adds a
//! reference to `x` (its own) and `y` (B's, a misuse) while B frees `y`
//! and takes a block if one is free. A refusal after the checks (`Raced`)
//! drops the reference A added to `x` again; whatever the interleaving,
//! A's result says what it holds, and the books stay exact. Its control,
//! `blind_add_ref` (a reference added to a block with none), revives `y`
//! in the free list: a block with a reference that the used count does
//! not count, or one handed out twice.

use std::sync::Arc;

use crate::loom_tests::pool_world::{check, BLIND_ADD_REF, BLIND_UNDO, DOUBLE, LOST, SOUND};
use crate::sync::Faults;
use crate::{BlockId, BlockPool, FreeError};
use loom::thread;

/// The model over a pool of `num_blocks` one-slot blocks (one shard).
/// With `own`, A also holds a block `z` alone and lists it first: its drop
/// is a last one, which a `Raced` free still gives back.
fn refused_free_vs_free(num_blocks: usize, own: bool, faults: Faults) {
    check(move || {
        let pool = Arc::new(BlockPool::with_faults(num_blocks, 1, 1, faults));
        let x = shared_block(&pool);
        let mut ids = Vec::new();
        pool.try_alloc(1, &mut ids).expect("a second block");
        let y = ids[0];
        if own {
            pool.try_alloc(1, &mut ids).expect("a third block");
        }
        let z = ids.get(1).copied();
        let a = {
            let pool = Arc::clone(&pool);
            // A holds one reference to x (and z), and wrongly lists y too.
            thread::spawn(move || match z {
                Some(z) => pool.free(&[z, x, y]),
                None => pool.free(&[x, y]),
            })
        };
        // B holds y and the other reference to x and frees both. If x is
        // back in the pool then (A dropped its reference first, so A is past
        // its checks and can only fail on y now), B allocates again: the
        // lowest free id, x itself (the first id allocated) whatever A gave
        // back.
        let b_y = pool.free(&[y]);
        let b_x = pool.free(&[x]);
        let mut fresh = Vec::new();
        if pool.ref_count(x) == Some(0) {
            pool.try_alloc(1, &mut fresh).expect("x is free");
        }
        let a = a.join().expect("A does not panic");
        // Exactly one of A and B freed y.
        assert!(a.is_ok() != b_y.is_ok(), "y freed {a:?} {b_y:?}");
        assert_eq!(b_x, Ok(()), "B held a reference to x");
        for &id in &fresh {
            assert_eq!(pool.ref_count(id), Some(1), "{id} {DOUBLE}");
        }
        // What A still holds, by its result.
        let a_holds: Vec<BlockId> = match a {
            Ok(()) | Err(FreeError::Raced { id: _ }) => vec![],
            Err(FreeError::NotAllocated { id }) if id == y => z.into_iter().chain([x]).collect(),
            Err(e) => panic!("unexpected {e:?}"),
        };
        assert_consistent(&pool);
        pool.free(&a_holds).expect("A frees what it holds");
        pool.free(&fresh).expect("B frees its new block, if any");
        assert_eq!(pool.free_blocks(), num_blocks, "{LOST}");
        let mut all = Vec::new();
        pool.try_alloc(num_blocks, &mut all).expect(LOST);
        all.sort();
        all.dedup();
        assert_eq!(all.len(), num_blocks, "{LOST}");
    });
}

/// A raw block with two references: allocated, and a reference added
/// through `BlockPool::add_refs` (a block that no sequence holds, so
/// that a raw free may drop both).
fn shared_block(pool: &Arc<BlockPool>) -> BlockId {
    let mut ids = Vec::new();
    pool.try_alloc(1, &mut ids).expect("an empty pool has room");
    let x = ids[0];
    pool.add_refs(&[x]).expect("a raw block the caller holds");
    assert_eq!(pool.ref_count(x), Some(2));
    x
}

/// Used blocks are exactly those with references, and taking every free
/// block hands out none that has one.
fn assert_consistent(pool: &BlockPool) {
    let n = pool.num_blocks();
    let referenced: Vec<bool> = (0..n)
        .map(|i| pool.ref_count(BlockId::new(i as u32)).expect("in range") > 0)
        .collect();
    let mut free = Vec::new();
    pool.try_alloc(pool.free_blocks(), &mut free)
        .expect("every free block can be taken");
    for id in &free {
        assert!(!referenced[id.index()], "{id} {DOUBLE}");
    }
    let held = referenced.iter().filter(|&&r| r).count();
    assert_eq!(pool.used_blocks(), held + free.len(), "{LOST}");
    pool.free(&free).expect("just taken");
}

/// A raw `add_refs` of `[x, y]`, where A holds `x` and B holds `y`,
/// racing B's free of `y` and B's allocation of a block if one is free.
fn add_refs_vs_free(faults: Faults) {
    check(move || {
        let pool = Arc::new(BlockPool::with_faults(2, 1, 1, faults));
        let mut ids = Vec::new();
        pool.try_alloc(2, &mut ids).expect("an empty pool has room");
        let (x, y) = (ids[0], ids[1]);
        let a = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let r = pool.add_refs(&[x, y]);
                // What A holds now: x, and one more reference to x and to
                // y if the share went through.
                let held = match r {
                    Ok(()) => vec![x, x, y],
                    Err(FreeError::Raced { id } | FreeError::NotAllocated { id }) => {
                        assert_eq!(id, y, "only y can be gone");
                        vec![x]
                    }
                    Err(e) => panic!("unexpected {e:?}"),
                };
                pool.free(&held).expect("A gives back what it holds");
            })
        };
        pool.free(&[y]).expect("B holds y");
        let mut got = Vec::new();
        if pool.try_alloc(1, &mut got).is_ok() {
            assert_eq!(pool.ref_count(got[0]), Some(1), "{DOUBLE}");
            pool.free(&got).expect("just taken");
        }
        a.join().expect("A does not panic");
        assert_consistent(&pool);
        assert_eq!(pool.used_blocks(), 0, "{LOST}");
    });
}

#[test]
fn add_refs_vs_free_sound() {
    add_refs_vs_free(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn add_refs_vs_free_blind_add_ref_is_caught() {
    add_refs_vs_free(BLIND_ADD_REF);
}

#[test]
fn refused_free_vs_free_sound() {
    refused_free_vs_free(2, false, SOUND);
}

#[test]
fn refused_free_vs_free_own_block_sound() {
    refused_free_vs_free(3, true, SOUND);
}

#[test]
#[should_panic(expected = "handed out twice")]
fn refused_free_vs_free_blind_undo_is_caught() {
    refused_free_vs_free(2, false, BLIND_UNDO);
}

#[test]
#[should_panic(expected = "handed out twice")]
fn refused_free_vs_free_own_block_blind_undo_is_caught() {
    refused_free_vs_free(3, true, BLIND_UNDO);
}
