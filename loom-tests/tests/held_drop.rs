//! Loom models of a `Sequence` giving back its references while a raw
//! `BlockPool::free` lists the same blocks (a double free, which is
//! misuse): whatever the interleaving, exactly one of the two drops the last
//! reference and pushes the block, the used count is given back once, and
//! the free reports `Ok` only if it dropped a reference that was there.
//!
//! Run with `RUSTFLAGS="--cfg kvslots_loom" LOOM_MAX_PREEMPTIONS=2
//! CARGO_TARGET_DIR=target/loom cargo test -p loom-tests --release --test
//! held_drop`.
//!
//! After both threads are done, every model checks that:
//!
//! * no block has a reference but those the model still holds, and the
//!   used count is exactly the number of held blocks (a count given back
//!   twice wraps it, or reads one short);
//! * taking every free block hands out only blocks nobody holds, each once
//!   (a block pushed twice is handed out twice);
//! * once the model gives back what it holds, the whole pool can be taken.
//!
//! | model | threads, blocks | `plain_held_drop` (count 1 cleared by a store) |
//! |---|---|---|
//! | [`seq_drop_vs_double_free`]: a sequence's drop | 2, 2 | caught |
//! | the same, a third block held elsewhere | 2, 3 | caught |
//! | [`truncate_vs_double_free`]: a truncate that frees a block | 2, 2 | caught |
//! | [`fork_drop_vs_double_free`]: a fork's shared block | 2, 2 | (the shared count is never 1 on the racing drop) |
#![cfg(kvslots_loom)]
#![forbid(unsafe_code)]

use std::sync::Arc;

use kvslots::__model::{pool_with_faults, Faults};
use kvslots::{BlockId, BlockPool, FreeError, Sequence};
use loom::thread;
use loom_tests::pool_world::{check, DOUBLE, LOST, PLAIN_HELD_DROP, SOUND};

/// A pool of `num_blocks` one-slot blocks, one stack, with `faults`.
fn pool(num_blocks: usize, faults: Faults) -> Arc<BlockPool> {
    Arc::new(pool_with_faults(num_blocks, 1, 1, faults))
}

/// What a racing double free may answer: `Ok` if it dropped the reference
/// before the sequence did, `Raced` if the sequence dropped it first (its
/// checks saw the reference, its drop found none), `NotAllocated` if the
/// block was already back when it checked.
fn assert_double_free_answer(r: Result<(), FreeError>, id: BlockId) {
    match r {
        Ok(()) => {}
        Err(FreeError::Raced { id: raced }) | Err(FreeError::NotAllocated { id: raced }) => {
            assert_eq!(raced, id, "the refusal names the doubly freed block");
        }
        Err(e) => panic!("unexpected {e:?}"),
    }
}

/// The pool after the race, `held` still held by the model: used count,
/// reference counts and the free list agree, and no free block is held.
fn assert_consistent(pool: &BlockPool, held: &[BlockId], r: &Result<(), FreeError>) {
    let n = pool.num_blocks();
    assert!(
        pool.free_blocks() <= n,
        "{LOST}: free_blocks above num_blocks"
    );
    assert_eq!(
        pool.used_blocks(),
        held.len(),
        "{LOST}: used blocks after both (free() said {r:?})"
    );
    for i in 0..n {
        let id = BlockId::new(i as u32);
        let want = usize::from(held.contains(&id));
        assert_eq!(pool.ref_count(id), Some(want), "{LOST}: {id}'s count");
    }
    let mut free = Vec::new();
    pool.try_alloc(pool.free_blocks(), &mut free)
        .expect("every free block can be taken");
    let mut distinct = free.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        free.len(),
        "{DOUBLE}: {free:?} (free() said {r:?})"
    );
    for id in &free {
        assert!(!held.contains(id), "{id} {DOUBLE}");
    }
    pool.free(&free).expect("just taken");
}

/// Gives back what the model held and takes the whole pool: nothing lost.
fn assert_whole(pool: &BlockPool, held: &[BlockId]) {
    pool.free(held).expect("the model frees what it holds");
    let n = pool.num_blocks();
    let mut all = Vec::new();
    pool.try_alloc(n, &mut all).expect(LOST);
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "{DOUBLE}");
    pool.free(&all).expect("just taken");
}

/// A one-token sequence is dropped on one thread while this one frees its
/// block through the pool. With `other`, a second block stays held by the
/// model throughout (a count given back twice then reads one short instead
/// of wrapping).
fn seq_drop_vs_double_free(other: bool, faults: Faults) {
    check(move || {
        let pool = pool(if other { 3 } else { 2 }, faults);
        let mut held = Vec::new();
        if other {
            pool.try_alloc(1, &mut held)
                .expect("room for the held block");
        }
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(1).expect("room for the sequence");
        let id = seq.blocks()[0];
        let t = thread::spawn(move || drop(seq));
        let r = pool.free(&[id]); // a double free: the sequence holds it
        t.join().expect("the drop does not panic");
        assert_double_free_answer(r, id);
        assert_consistent(&pool, &held, &r);
        assert_whole(&pool, &held);
    });
}

/// A two-token sequence truncated to one token on one thread (giving back
/// its second block) while this one frees that block through the pool.
fn truncate_vs_double_free(faults: Faults) {
    check(move || {
        let pool = pool(2, faults);
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(2).expect("room for the sequence");
        let (kept, id) = (seq.blocks()[0], seq.blocks()[1]);
        let t = thread::spawn(move || {
            assert_eq!(seq.truncate(1), 1, "one block given back");
            seq
        });
        let r = pool.free(&[id]);
        let seq = t.join().expect("the truncate does not panic");
        assert_eq!(seq.blocks(), [kept], "the truncate kept the first block");
        assert_double_free_answer(r, id);
        assert_consistent(&pool, &[kept], &r);
        drop(seq);
        assert_whole(&pool, &[]);
    });
}

/// A full block shared by a parent and its fork: the fork is dropped on one
/// thread while this one frees the block through the pool (taking the
/// parent's reference, which is misuse), then the parent is forgotten: the
/// block must end with no reference and be pushed once.
fn fork_drop_vs_double_free(faults: Faults) {
    check(move || {
        let pool = pool(2, faults);
        let mut parent = Sequence::new(Arc::clone(&pool));
        parent.try_append(1).expect("room for the parent");
        let (child, copy) = parent.try_fork().expect("a full block is shared");
        assert_eq!(copy, None, "a fork on a block boundary copies nothing");
        let id = parent.blocks()[0];
        let t = thread::spawn(move || drop(child));
        let r = pool.free(&[id]);
        t.join().expect("the drop does not panic");
        assert_eq!(r, Ok(()), "two references, one listed: the free drops one");
        // The parent's reference went with the free; its own drop now finds
        // none left and gives back nothing.
        drop(parent);
        assert_consistent(&pool, &[], &r);
        assert_whole(&pool, &[]);
    });
}

#[test]
fn seq_drop_vs_double_free_sound() {
    seq_drop_vs_double_free(false, SOUND);
}

#[test]
fn seq_drop_vs_double_free_other_held_sound() {
    seq_drop_vs_double_free(true, SOUND);
}

#[test]
fn truncate_vs_double_free_sound() {
    truncate_vs_double_free(SOUND);
}

#[test]
fn fork_drop_vs_double_free_sound() {
    fork_drop_vs_double_free(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn seq_drop_vs_double_free_plain_held_drop_is_caught() {
    seq_drop_vs_double_free(false, PLAIN_HELD_DROP);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn seq_drop_vs_double_free_other_held_plain_held_drop_is_caught() {
    seq_drop_vs_double_free(true, PLAIN_HELD_DROP);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn truncate_vs_double_free_plain_held_drop_is_caught() {
    truncate_vs_double_free(PLAIN_HELD_DROP);
}
