//! Loom model of a refused [`BlockPool::free`] racing another holder's
//! free: the undo of the drops it already made must never resurrect a
//! block that is back in the free list.
//!
//! Run with
//! `RUSTFLAGS="--cfg kvslots_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test -p loom-tests --release --test refused_free`.
//!
//! Block `x` has two references (A's and B's), block `y` one (B's). A
//! frees `[x, y]`, listing `y`, which it does not hold (a double free),
//! while B frees `y` and then `x`. In the interleaving that matters, A's
//! checks pass, A drops `x` (2 to 1), B frees `y` and `x` (`x` reaches 0
//! and goes back to the pool), and A's drop of `y` fails: A must not give
//! `x` its reference back then. Whatever the interleaving, afterwards:
//!
//! * every block with a reference is counted as used, and no other
//!   (`used_blocks()` equals the number of blocks whose count is not 0);
//! * taking every free block hands out only blocks with no reference
//!   ("handed out twice" otherwise);
//! * once every reference is dropped, the whole pool can be taken again.
//!
//! | model | threads, blocks | `blind_undo` |
//! |---|---|---|
//! | [`refused_free_vs_free`] | 2, 2 | caught: handed out twice |
//! | the same, A also freeing a block of its own first | 2, 3 | caught: handed out twice |
#![cfg(kvslots_loom)]
#![forbid(unsafe_code)]

use std::sync::Arc;

use kvslots::{BlockId, BlockPool, Faults, Sequence};
use loom::thread;
use loom_tests::pool_world::{check, BLIND_UNDO, DOUBLE, LOST, SOUND};

/// The model over a pool of `num_blocks` one-slot blocks (one stack).
/// With `own`, A also holds a block `z` alone and lists it first: its drop
/// is a last one, which a refusal must take back out of A's private chain.
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
        // B holds y and the other reference to x.
        let b_y = pool.free(&[y]);
        let b_x = pool.free(&[x]);
        let a = a.join().expect("A does not panic");
        // Exactly one of A and B freed y.
        assert!(a.is_ok() != b_y.is_ok(), "y freed {a:?} {b_y:?}");
        assert_eq!(b_x, Ok(()), "B held a reference to x");
        if let (Some(z), Err(_)) = (z, &a) {
            assert_eq!(pool.ref_count(z), Some(1), "a refused free keeps z");
        }
        assert_consistent(&pool);
        // Drop whatever references remain (A's to x, if it kept it).
        for index in 0..num_blocks {
            let id = BlockId::new(index as u32);
            while pool.ref_count(id).expect("in range") > 0 {
                pool.free(&[id]).expect("a held reference");
            }
        }
        let mut all = Vec::new();
        pool.try_alloc(num_blocks, &mut all).expect(LOST);
        all.sort();
        all.dedup();
        assert_eq!(all.len(), num_blocks, "{LOST}");
    });
}

/// A block with two references, as a fork leaves a full block: a
/// one-token sequence and its fork, both forgotten, so that the model
/// holds the two references as raw ids.
fn shared_block(pool: &Arc<BlockPool>) -> BlockId {
    let mut parent = Sequence::new(Arc::clone(pool));
    parent.try_append(1).expect("an empty pool has room");
    let (child, copy) = parent.try_fork().expect("a full block is shared");
    assert_eq!(copy, None, "a fork on a block boundary copies nothing");
    let x = parent.blocks()[0];
    assert_eq!(pool.ref_count(x), Some(2));
    std::mem::forget(parent);
    std::mem::forget(child);
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
