//! Loom models of a `Sequence` giving back its references while a raw
//! `BlockPool::free` lists the same blocks (a double free, which is
//! misuse). A sequence's blocks carry the sequence flag, which a raw free
//! refuses (`HeldBySequence`), in its checks and in its CAS; a sequence
//! that holds a block alone gives it back with a load and a plain store.
//! Whatever the interleaving, the block goes back once, the used count is
//! given back once, and the free reports `Ok` only if it dropped a
//! reference that was there.
//!
//! Run with `scripts/loom held_drop`.
//!
//! After both threads are done, every model checks that:
//!
//! * no block has a reference but those the model still holds, and the
//!   used count is exactly the number of held blocks, as is the pool's
//!   capacity less the sum of its admission counts taken without the cap
//!   of `free_blocks` (a count given back twice shows there);
//! * taking every free block hands out only blocks nobody holds, each once
//!   (a block given back twice is handed out twice);
//! * once the model gives back what it holds, the whole pool can be taken.
//!
//! The negative control `free_ignores_sequence` lets the raw free take a
//! sequence's reference with its CAS, as it could before the flag: the
//! sequence's sole drop (a load and a plain store) then races the free,
//! and both give the block back.
//!
//! | model | threads, blocks | negative control, caught |
//! |---|---|---|
//! | [`seq_drop_vs_double_free`]: a sequence's drop | 2, 2 | `free_ignores_sequence` |
//! | the same, a third block held elsewhere | 2, 3 | `free_ignores_sequence` |
//! | [`truncate_vs_double_free`]: a truncate that gives a block back | 2, 2 | `free_ignores_sequence` |
//! | [`shrink_to_fit_vs_double_free`]: a reserved block given back | 2, 2 | `free_ignores_sequence` |
//! | [`two_double_frees_vs_seq_drop`]: two raw frees and the drop | 3, 2 | `free_ignores_sequence` |
//! | [`listed_twice_vs_child_drop`]: a shared block listed twice | 2, 2 | `free_ignores_sequence` |
//! | [`retired_cow_source_vs_double_free`]: a copy-on-write's source | 3, 3 | `free_ignores_sequence` |
//! | [`stale_free_vs_sequence_retake`]: a stale raw free of a block a sequence took since | 2, 1 | `free_ignores_sequence` |
//! | [`fork_vs_double_free`]: a fork of the block being freed | 2, 2 | `blind_add_ref` with `free_ignores_sequence` (a fork raises a count of 0) |
//! | [`fork_drop_vs_double_free`]: a fork's shared block | 2, 2 | `free_ignores_sequence` (the free takes one of the two references, and the parent's and the fork's drops then both find the count at 1 and give the block back) |
//!
//! What no model here can promise: once a raw free has taken a raw
//! holder's reference and the block has been handed to a new owner, the
//! holder's next free takes the new owner's reference (reference counts
//! cannot tell holders apart; see `BlockPool::free`).

use std::sync::Arc;

use crate::loom_tests::pool_world::{
    assert_double_free_answer, check, BLIND_ADD_REF, DOUBLE, FREE_IGNORES_SEQUENCE, LOST, SOUND,
};
use crate::sync::Faults;
use crate::{BlockId, BlockPool, FreeError, Sequence};
use loom::thread;

/// A pool of `num_blocks` one-slot blocks, one shard, with `faults`.
fn pool(num_blocks: usize, faults: Faults) -> Arc<BlockPool> {
    pool_with(num_blocks, 1, faults)
}

/// A pool of `num_blocks` blocks of `block_size` slots, one shard.
fn pool_with(num_blocks: usize, block_size: usize, faults: Faults) -> Arc<BlockPool> {
    Arc::new(BlockPool::with_faults(num_blocks, block_size, 1, faults))
}

/// The pool after the race, `held` still held: counts agree, every free
/// block comes out once and none that is held.
fn assert_consistent(pool: &BlockPool, held: &[BlockId], what: &str) {
    let n = pool.num_blocks();
    assert!(
        pool.free_blocks() <= n,
        "{LOST}: free_blocks above num_blocks ({what})"
    );
    assert_eq!(
        pool.used_blocks(),
        held.len(),
        "{LOST}: used blocks ({what})"
    );
    assert_eq!(
        pool.admission_free_uncapped(),
        n - held.len(),
        "{LOST}: the admission counts ({what})"
    );
    for i in 0..n {
        let id = BlockId::new(i as u32);
        let want = held.iter().filter(|&&h| h == id).count();
        assert_eq!(
            pool.ref_count(id),
            Some(want),
            "{LOST}: {id}'s count ({what})"
        );
    }
    let mut free = Vec::new();
    pool.try_alloc(pool.free_blocks(), &mut free)
        .expect("every free block can be taken");
    let mut distinct = free.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), free.len(), "{DOUBLE}: {free:?} ({what})");
    for id in &free {
        assert!(!held.contains(id), "{id} {DOUBLE} ({what})");
    }
    pool.free(&free).expect("just taken");
}

/// After a racing free: allocates a block if one is free, while the other
/// thread may still be giving its block back, and frees it again. (A
/// refused free writes nothing; this gives the model's two threads
/// something to race besides the give-back, and checks that the block
/// handed out is one nobody holds.)
fn alloc_one_and_back(pool: &BlockPool) {
    let mut got = Vec::new();
    if pool.try_alloc(1, &mut got).is_ok() {
        assert_eq!(pool.ref_count(got[0]), Some(1), "{} {DOUBLE}", got[0]);
        pool.free(&got).expect("just taken");
    }
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
        alloc_one_and_back(&pool);
        t.join().expect("the drop does not panic");
        assert_double_free_answer(r, id);
        assert_consistent(&pool, &held, &format!("free said {r:?}"));
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
        alloc_one_and_back(&pool);
        let seq = t.join().expect("the truncate does not panic");
        assert_eq!(seq.blocks(), [kept], "the truncate kept the first block");
        assert_double_free_answer(r, id);
        assert_consistent(&pool, &[kept], &format!("free said {r:?}"));
        drop(seq);
        assert_whole(&pool, &[]);
    });
}

/// A full block shared by a parent and its fork: the fork is dropped on one
/// thread while this one frees the block through the pool (misuse: it is
/// the sequences') and then drops the parent: the block must end with no
/// reference and go back once.
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
        // The parent holds the block throughout the free: refused, nothing
        // changed. (With the flag ignored, the free drops one reference,
        // the parent's, and its own drop then finds none left.) Its drop
        // races the child's.
        drop(parent);
        t.join().expect("the drop does not panic");
        assert_double_free_answer(r, id);
        assert_consistent(&pool, &[], &format!("free said {r:?}"));
        assert_whole(&pool, &[]);
    });
}

fn answer_ok_or_refused(r: Result<(), FreeError>) {
    assert!(
        matches!(
            r,
            Ok(())
                | Err(FreeError::Raced { .. })
                | Err(FreeError::NotAllocated { .. })
                | Err(FreeError::HeldBySequence { .. })
        ),
        "unexpected {r:?}"
    );
}

/// A reserved (unfilled) block given back by `shrink_to_fit` on one thread
/// while this one frees it through the pool.
fn shrink_to_fit_vs_double_free(faults: Faults) {
    check(move || {
        let pool = pool_with(2, 1, faults);
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(1).unwrap();
        seq.try_reserve(1, 0).unwrap();
        let (kept, id) = (seq.blocks()[0], seq.blocks()[1]);
        let t = thread::spawn(move || {
            assert_eq!(seq.shrink_to_fit(), 1);
            seq
        });
        let r = pool.free(&[id]);
        alloc_one_and_back(&pool);
        let seq = t.join().unwrap();
        answer_ok_or_refused(r);
        assert_consistent(&pool, &[kept], &format!("free said {r:?}"));
        drop(seq);
        assert_consistent(&pool, &[], "after the drop");
    });
}

/// Two raw frees of the same block race the sequence's drop (three
/// parties): one of the three pushes it, once.
fn two_double_frees_vs_seq_drop(faults: Faults) {
    check(move || {
        let pool = pool_with(2, 1, faults);
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(1).unwrap();
        let id = seq.blocks()[0];
        let p = Arc::clone(&pool);
        let t1 = thread::spawn(move || drop(seq));
        let t2 = thread::spawn(move || p.free(&[id]));
        let r1 = pool.free(&[id]);
        t1.join().unwrap();
        let r2 = t2.join().unwrap();
        answer_ok_or_refused(r1);
        answer_ok_or_refused(r2);
        assert!(
            !(r1.is_ok() && r2.is_ok()),
            "both frees Ok for one reference held by the sequence"
        );
        assert_consistent(&pool, &[], &format!("frees said {r1:?}, {r2:?}"));
    });
}

/// A block shared by parent and child, listed twice in one free (which
/// passes the over-free check while both references are there) while the
/// child drops: the block is pushed once, and the free reports `Raced` if
/// it found a reference missing.
fn listed_twice_vs_child_drop(faults: Faults) {
    check(move || {
        let pool = pool_with(2, 1, faults);
        let mut parent = Sequence::new(Arc::clone(&pool));
        parent.try_append(1).unwrap();
        let (child, _) = parent.try_fork().unwrap();
        let id = parent.blocks()[0];
        let p = Arc::clone(&pool);
        let t = thread::spawn(move || {
            drop(child);
            alloc_one_and_back(&p);
        });
        let r = pool.free(&[id, id]);
        alloc_one_and_back(&pool);
        t.join().unwrap();
        assert!(
            matches!(
                r,
                Ok(())
                    | Err(FreeError::Raced { .. })
                    | Err(FreeError::OverFreed { .. })
                    | Err(FreeError::HeldBySequence { .. })
            ),
            "unexpected {r:?}"
        );
        if let Err(FreeError::OverFreed { .. } | FreeError::HeldBySequence { .. }) = r {
            // Refused by the checks: nothing changed, the parent still holds.
            assert_consistent(&pool, &[id], "refused");
        } else {
            assert_consistent(&pool, &[], &format!("free said {r:?}"));
        }
        drop(parent);
        assert_consistent(&pool, &[], "after the parent's drop");
    });
}

/// Copy-on-write: the parent truncates into a block shared with its child
/// and appends (the shared block becomes the retired copy source, its
/// reference kept for the copy). The child is dropped on one thread while
/// this one frees the source through the pool, then the parent's next
/// change gives back the retired reference.
fn retired_cow_source_vs_double_free(faults: Faults) {
    check(move || {
        let pool = pool_with(3, 2, faults);
        let mut parent = Sequence::new(Arc::clone(&pool));
        parent.try_append(2).unwrap(); // one full block
        let (child, _) = parent.try_fork().unwrap();
        let src = parent.blocks()[0];
        parent.truncate(1); // back into the shared block
        let (_, copy) = parent.try_append_cow(1).unwrap();
        let copy = copy.expect("a shared partly filled tail is copied");
        assert_eq!(copy.src, src);
        let dst = parent.blocks()[0];
        let t = thread::spawn(move || {
            drop(child);
        });
        let t2 = thread::spawn(move || {
            parent.truncate(1); // a change: gives back the retired source
            parent
        });
        let r = pool.free(&[src]);
        t.join().unwrap();
        let parent = t2.join().unwrap();
        answer_ok_or_refused(r);
        assert_consistent(&pool, &[dst], &format!("free said {r:?}"));
        drop(parent);
        assert_consistent(&pool, &[], "after the parent's drop");
    });
}

/// A raw block `b` is freed by its holder while a stale double free of it
/// (its checks passed while the holder held it) races; a sequence takes the
/// block as soon as it is free and gives it back with its sole drop. The
/// stale free's CAS must refuse the sequence's block (`Raced`): were it to
/// take the sequence's reference, both would give the block back (under
/// the control, whose sole drop is a plain store).
fn stale_free_vs_sequence_retake(faults: Faults) {
    check(move || {
        let pool = pool(1, faults);
        let mut ids = Vec::new();
        pool.try_alloc(1, &mut ids).expect("the one block");
        let b = ids[0];
        let p = Arc::clone(&pool);
        let owner = thread::spawn(move || {
            let freed = p.free(&[b]);
            let mut seq = Sequence::new(Arc::clone(&p));
            let took = seq.try_append(1).is_ok();
            drop(seq);
            (freed, took)
        });
        let stale = pool.free(&[b]);
        let (freed, took) = owner.join().expect("the owner does not panic");
        answer_ok_or_refused(freed);
        answer_ok_or_refused(stale);
        assert!(
            !(freed.is_ok() && stale.is_ok()),
            "{LOST}: both frees Ok for one reference"
        );
        assert_consistent(
            &pool,
            &[],
            &format!("frees said {freed:?}, {stale:?}, took {took}"),
        );
        assert_whole(&pool, &[]);
    });
}

/// `try_fork` races a raw free of the parent's full block (a double free;
/// refused, as the block is the parent's). Under the `free_ignores_sequence`
/// fault the free can take the parent's reference: a fork that finds it
/// gone must not add one to a block the free may already have given back;
/// it panics, naming the double free, and its child gives back what it
/// took.
fn fork_vs_double_free(faults: Faults) {
    check(move || {
        let pool = pool(2, faults);
        let mut parent = Sequence::new(Arc::clone(&pool));
        parent.try_append(1).unwrap();
        let id = parent.blocks()[0];
        let p = Arc::clone(&pool);
        let t = thread::spawn(move || p.free(&[id]));
        let forked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parent.try_fork()));
        let r = t.join().unwrap();
        answer_ok_or_refused(r);
        match forked {
            Ok(child) => drop(child.expect("a free block for the fork")),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .unwrap_or_default();
                assert!(msg.contains("no reference left"), "unexpected panic: {msg}");
            }
        }
        drop(parent);
        assert_consistent(&pool, &[], &format!("free said {r:?}"));
    });
}

#[test]
fn stale_free_vs_sequence_retake_sound() {
    stale_free_vs_sequence_retake(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn stale_free_vs_sequence_retake_free_ignores_sequence_is_caught() {
    stale_free_vs_sequence_retake(FREE_IGNORES_SEQUENCE);
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
fn fork_drop_vs_double_free_free_ignores_sequence_is_caught() {
    fork_drop_vs_double_free(FREE_IGNORES_SEQUENCE);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn seq_drop_vs_double_free_free_ignores_sequence_is_caught() {
    seq_drop_vs_double_free(false, FREE_IGNORES_SEQUENCE);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn seq_drop_vs_double_free_other_held_free_ignores_sequence_is_caught() {
    seq_drop_vs_double_free(true, FREE_IGNORES_SEQUENCE);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn truncate_vs_double_free_free_ignores_sequence_is_caught() {
    truncate_vs_double_free(FREE_IGNORES_SEQUENCE);
}

#[test]
fn shrink_to_fit_vs_double_free_sound() {
    shrink_to_fit_vs_double_free(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn shrink_to_fit_vs_double_free_free_ignores_sequence_is_caught() {
    shrink_to_fit_vs_double_free(FREE_IGNORES_SEQUENCE);
}

#[test]
fn two_double_frees_vs_seq_drop_sound() {
    two_double_frees_vs_seq_drop(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn two_double_frees_vs_seq_drop_free_ignores_sequence_is_caught() {
    two_double_frees_vs_seq_drop(FREE_IGNORES_SEQUENCE);
}

#[test]
fn retired_cow_source_vs_double_free_sound() {
    retired_cow_source_vs_double_free(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn retired_cow_source_vs_double_free_free_ignores_sequence_is_caught() {
    retired_cow_source_vs_double_free(FREE_IGNORES_SEQUENCE);
}

#[test]
fn listed_twice_vs_child_drop_sound() {
    listed_twice_vs_child_drop(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn listed_twice_vs_child_drop_free_ignores_sequence_is_caught() {
    listed_twice_vs_child_drop(FREE_IGNORES_SEQUENCE);
}

#[test]
fn fork_vs_double_free_sound() {
    fork_vs_double_free(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn fork_vs_double_free_blind_add_ref_is_caught() {
    fork_vs_double_free(BLIND_ADD_REF);
}
