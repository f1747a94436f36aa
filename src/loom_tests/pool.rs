//! Loom models of [`BlockPool`]: alloc vs alloc, alloc vs free, free vs free
//! of a shared block, and three threads at once, each with its negative
//! control.
//!
//! Run with `scripts/loom pool`.
//!
//! # What every model checks
//!
//! * **No double hand-out.** A [`PoolWorld`] keeps a shadow holder count per
//!   block next to the pool. A thread that gets a block from `try_alloc`
//!   swaps its count to 1 and panics ([`DOUBLE`]) unless it was 0; a
//!   thread that shares one adds 1; a thread about to give a reference back
//!   subtracts 1 first (so the shadow never claims a holder the pool no
//!   longer counts). The shadow's RMWs are `Relaxed` on purpose: only their
//!   atomicity matters, and a stronger ordering would add happens-before
//!   edges that could hide a missing `Release`/`Acquire` in the pool.
//! * **Conservation.** After every thread is joined and every holder has
//!   given its references back: `free_blocks() == num_blocks()`,
//!   `used_blocks() == 0`, every `ref_count` is 0, allocating `num_blocks`
//!   blocks yields that many distinct ids, and one more is refused
//!   ([`LOST`] otherwise). A block pushed twice, or lost, fails this.
//! * **Happens-before.** Each block has a payload, a
//!   `loom::cell::UnsafeCell<usize>`. An owner writes it before giving the
//!   block back, a sharer reads it, and the next owner writes it right
//!   after `try_alloc`. Loom tracks these accesses in `with`/`with_mut`
//!   themselves (before the closure runs), so the model never needs to
//!   dereference the pointer, and stays free of `unsafe`: if the previous
//!   holder's access does not happen-before the next owner's, loom panics
//!   with a "Causality violation". (Reading the stored value would add
//!   nothing: loom runs one thread at a time on real memory, so the value
//!   read is always the latest; only the access tracking sees ordering.)
//!
//! # Models and negative controls
//!
//! Each model shape runs on a sound pool and on a pool built with
//! `BlockPool::with_faults`, which loom
//! must catch (`#[should_panic(expected = ..)]`). The pair shows that the
//! control is caught for the injected fault, not for the model:
//!
//! | model | threads, blocks | `plain_bitmap_take` (a take without a read-modify-write) | `relaxed_free` |
//! |---|---|---|---|
//! | [`alloc_vs_alloc`] | 2, 3 | caught: handed out twice | |
//! | [`alloc_vs_alloc_full_pool`] | 2, 4 | caught: two owners' concurrent writes | caught: causality |
//! | [`alloc_vs_free`] | 2, 1 or 2 | | caught: causality (where the allocation needs the freed block, with `relaxed_count_release` too) |
//! | [`free_vs_free_shared`] | 3, 2 | | caught: causality |
//! | [`free_vs_free_shared_alone`] | 2, 1 | `plain_shared_drop` instead: caught, not conserved | |
//! | [`three_way`] | 3, 2 | | caught: causality |
//!
//! `plain_bitmap_take` takes free ids from a word of the free list's bitmap
//! with a load and a plain store instead of a CAS. `relaxed_free` makes the
//! reference drops and the free list's give-back `Relaxed` instead of
//! `Release`. The pool's `SlotCounter` also
//! synchronises (a `Release` give-back, an `Acquire` admission), so each
//! model that catches it has a schedule where the allocating thread is
//! admitted through slots that were free already (its admission reads a
//! count older than the freer's give-back), and then pops the block the
//! other thread has just given back (a take starts at the lowest free id): only the free
//! list's orderings could then order the two owners' accesses.
//!
//! [`DOUBLE`]: crate::loom_tests::pool_world::DOUBLE
//! [`LOST`]: crate::loom_tests::pool_world::LOST

use std::sync::Arc;

use crate::loom_tests::pool_world::{
    alloc_then_more, check, Allocs, PoolWorld, LOST, PLAIN_BITMAP_TAKE, PLAIN_SHARED_DROP,
    RELAXED_FREE, RELAXED_RELEASES, SOUND,
};
use crate::sync::Faults;
use crate::Sequence;
use loom::thread;

/// Block size of every pool here (the models move whole blocks).
const BLOCK_SIZE: usize = 1;

/// A model's pool of `num_blocks` blocks, with its shadow holder counts and
/// block payloads.
fn new_world(num_blocks: usize, faults: Faults) -> Arc<PoolWorld> {
    PoolWorld::new(num_blocks, BLOCK_SIZE, faults, "thread")
}

/// Alloc vs alloc over a pool of 3 (ids 0, 1, 2, in one bitmap word).
///
/// Thread A allocates one block, then one more. Thread B allocates two and
/// gives the first back. Each keeps what it holds until the end, when the
/// main thread frees it and checks conservation. Either allocation may be
/// refused (`Full`) when the other thread holds enough; nothing else may.
///
/// The lost update this exposes without the CAS: A reads the word (ids 0,
/// 1 and 2 free) and is preempted; B takes 0 and 1; A stores its take of
/// 0 over B's, so 0 is handed to both (and 1 is free again while B holds
/// it). One preemption.
fn alloc_vs_alloc(faults: Faults) {
    check(move || alloc_then_more(&new_world(3, faults), 2, 0));
}

#[test]
fn alloc_vs_alloc_sound() {
    alloc_vs_alloc(SOUND);
}

/// The free list's control: caught by the shadow when a block is handed to
/// A while B holds it. (In a debug build the pool's own debug assertion,
/// in the same words, may fire first.)
#[test]
#[should_panic(expected = "handed out twice")]
fn alloc_vs_alloc_plain_bitmap_take_is_caught() {
    alloc_vs_alloc(PLAIN_BITMAP_TAKE);
}

/// Alloc vs alloc with reuse: two threads each allocate two blocks of a
/// pool of 4, write them and give them back, and the main thread then
/// allocates two more while the other may still hold its two, so all four
/// blocks are out at once and the freed ones are reused.
fn alloc_vs_alloc_full_pool(faults: Faults) {
    check(move || {
        let world = new_world(4, faults);
        let other = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                let ids = world.alloc(2).expect("two of four");
                world.give_back(&ids);
            })
        };
        let ids = world.alloc(2).expect("two of four");
        world.give_back(&ids);
        let again = world.alloc(2).expect("two of four, the other holding two");
        world.give_back(&again);
        other.join().unwrap();
        world.assert_conserved_and_bounded();
    });
}

#[test]
fn alloc_vs_alloc_full_pool_sound() {
    alloc_vs_alloc_full_pool(SOUND);
}

/// Caught as two owners writing one block at once (loom's race detector on
/// the block's payload fires before the shadow's check).
#[test]
#[should_panic(expected = "Concurrent write accesses")]
fn alloc_vs_alloc_full_pool_plain_bitmap_take_is_caught() {
    alloc_vs_alloc_full_pool(PLAIN_BITMAP_TAKE);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn alloc_vs_alloc_full_pool_relaxed_free_is_caught() {
    alloc_vs_alloc_full_pool(RELAXED_FREE);
}

/// Alloc vs free over a pool of `num_blocks`: the main thread holds `held`
/// blocks from before the spawn, a thread writes and frees them, and the
/// main thread meanwhile allocates `want` (refused only while it does not
/// fit), writes them and keeps them until the end.
///
/// With `num_blocks = 2, held = 1, want = 1` the allocation is admitted
/// through the block that was free already, so the SlotCounter orders
/// nothing; the allocator may still take the block just freed (a take
/// starts at the lowest free id), and then only the free list's
/// Release/Acquire orders the freer's write before the allocator's.
fn alloc_vs_free(num_blocks: usize, held: usize, want: usize, faults: Faults) {
    check(move || {
        let world = new_world(num_blocks, faults);
        let ids = world.alloc(held).expect("the first allocation");
        let freer = {
            let world = Arc::clone(&world);
            thread::spawn(move || world.give_back(&ids))
        };
        let got = world.alloc(want);
        if got.is_err() {
            assert!(
                want > num_blocks - held,
                "refused {want} with {} free at worst",
                num_blocks - held
            );
        }
        freer.join().unwrap();
        if let Ok(got) = got {
            world.give_back(&got);
        }
        world.assert_conserved_and_bounded();
    });
}

#[test]
fn alloc_vs_free_sound() {
    alloc_vs_free(2, 1, 1, SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn alloc_vs_free_relaxed_free_is_caught() {
    alloc_vs_free(2, 1, 1, RELAXED_FREE);
}

/// The allocation needs the block being freed (ordered by the counter too).
#[test]
fn alloc_vs_free_needs_the_freed_block_sound() {
    alloc_vs_free(1, 1, 1, SOUND);
    alloc_vs_free(2, 1, 2, SOUND);
}

// `relaxed_free` alone is not caught here: the admission count's give-back
// (`AcqRel`) orders the freer before the allocator that needs its block.
// Without that `Release` too, nothing does.
#[test]
#[should_panic(expected = "Causality violation")]
fn alloc_vs_free_needs_the_freed_block_relaxed_releases_is_caught() {
    alloc_vs_free(1, 1, 1, RELAXED_RELEASES);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn alloc_vs_free_needs_both_blocks_relaxed_releases_is_caught() {
    alloc_vs_free(2, 1, 2, RELAXED_RELEASES);
}

/// Free vs free of a shared block. A pool of 2: block `s` is shared by a
/// sequence and its fork (two references), the other block is free. Two
/// threads each read `s` and drop their sequence (one reference each) while
/// the main thread allocates one block, which is `s` (id 0, the lowest)
/// whenever both drops are done before its take, and writes it.
///
/// Exactly one give-back of `s` must happen (conservation fails otherwise:
/// its count given back twice, or lost), and both readers' reads must
/// happen-before the new owner's write: the non-last dropper's `Release`
/// decrement, the last dropper's `Acquire` on it and its `Release`
/// give-back, and the take's `Acquire`. The main thread is admitted through the block that was free
/// already, so the counter orders none of it.
fn free_vs_free_shared(faults: Faults) {
    check(move || {
        let world = new_world(2, faults);
        let mut parent = Sequence::new(Arc::clone(&world.pool));
        parent.try_append(BLOCK_SIZE).expect("one block");
        let s = parent.blocks()[0];
        world.take(s);
        world.write(s);
        let (child, copy) = parent.try_fork().expect("a fork on a block boundary");
        assert_eq!(copy, None, "a fork on a block boundary copies nothing");
        assert_eq!(child.blocks(), &[s], "the fork shares the full block");
        world.share(s);
        assert_eq!(world.pool.ref_count(s), Some(2));
        let holders: Vec<_> = [parent, child]
            .into_iter()
            .map(|seq| {
                let world = Arc::clone(&world);
                thread::spawn(move || {
                    world.read(s);
                    world.drop_ref(s);
                    drop(seq);
                })
            })
            .collect();
        let got = world.alloc(1).expect("one block is always free");
        for h in holders {
            h.join().unwrap();
        }
        world.give_back(&got);
        world.assert_conserved_and_bounded();
    });
}

#[test]
fn free_vs_free_shared_sound() {
    free_vs_free_shared(SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn free_vs_free_shared_relaxed_free_is_caught() {
    free_vs_free_shared(RELAXED_FREE);
}

/// Free vs free of a shared block, with nobody allocating: two references
/// dropped at once on a pool of 1 give the block back exactly once.
fn free_vs_free_shared_alone(faults: Faults) {
    check(move || {
        let world = new_world(1, faults);
        let mut parent = Sequence::new(Arc::clone(&world.pool));
        parent.try_append(BLOCK_SIZE).expect("one block");
        let (child, _) = parent.try_fork().expect("a fork on a block boundary");
        let s = parent.blocks()[0];
        let other = thread::spawn(move || drop(child));
        drop(parent);
        other.join().unwrap();
        assert_eq!(world.pool.ref_count(s), Some(0), "{LOST}: {s}");
        world.assert_conserved_and_bounded();
    });
}

#[test]
fn free_vs_free_shared_alone_sound() {
    free_vs_free_shared_alone(SOUND);
}

// Both drops read a count of 2 and store 1: the block stays referenced.
#[test]
#[should_panic(expected = "blocks not conserved")]
fn free_vs_free_shared_alone_plain_shared_drop_is_caught() {
    free_vs_free_shared_alone(PLAIN_SHARED_DROP);
}

/// Three threads on a pool of 2: each allocates one block and, if it got
/// one, writes it and gives it back. At most two can hold a block at once;
/// the third is refused or reuses a block another has just given back.
fn three_way(faults: Faults) {
    check(move || {
        let world = new_world(2, faults);
        let others: Vec<_> = (0..2)
            .map(|_| {
                let world = Arc::clone(&world);
                thread::spawn(move || {
                    if let Ok(ids) = world.alloc(1) {
                        world.give_back(&ids);
                    }
                })
            })
            .collect();
        if let Ok(ids) = world.alloc(1) {
            world.give_back(&ids);
        }
        for t in others {
            t.join().unwrap();
        }
        world.assert_conserved_and_bounded();
    });
}

#[test]
fn three_way_sound() {
    three_way(SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn three_way_relaxed_free_is_caught() {
    three_way(RELAXED_FREE);
}
