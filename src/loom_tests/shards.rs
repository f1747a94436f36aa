//! Loom models of a [`BlockPool`](crate::BlockPool) whose free list is
//! cut into two shards (`BlockPool::with_shards`): requests that take from
//! both shards, and frees whose blocks go back to two different shards,
//! racing each other. The checks are those of `pool.rs` (shadow
//! holder counts, conservation, a happens-before witness per block; see
//! `crate::loom_tests::pool_world`), and each model has its negative controls.
//!
//! Run with `scripts/loom shards`.
//!
//! With `span = ceil(num_blocks / 2)` ids per shard, shard 0 owns ids
//! `0..span` and shard 1 the rest; a thread's pops start at its home shard
//! and take from the other one when theirs is short. Threads are numbered
//! in the order they first allocate or free, afresh in every execution, so
//! the first thread to do so starts at shard 0 and the second at shard 1;
//! loom explores both orders. The model descriptions below follow the
//! executions in which the main thread allocates first (its home is
//! shard 0); in the others the two threads swap homes.
//!
//! | model | threads, blocks | `plain_bitmap_take` (a take without a read-modify-write) | `relaxed_free` |
//! |---|---|---|---|
//! | [`steal_after_free`] | 2, 3 | | caught: causality |
//! | [`split_free_vs_alloc`] | 2, 3 | | caught: causality |
//! | [`alloc_vs_steal`] | 2, 5 | caught: handed out twice | |

use std::sync::Arc;

use crate::loom_tests::pool_world::{
    alloc_then_more, check, Allocs, PoolWorld, PLAIN_BITMAP_TAKE, RELAXED_FREE, SOUND,
};
use crate::sync::Faults;
use loom::thread;

/// A pool of `num_blocks` one-slot blocks over two shards.
fn new_world(num_blocks: usize, faults: Faults) -> Arc<PoolWorld> {
    PoolWorld::with_shards(num_blocks, 1, 2, faults, "thread")
}

/// A steal after a free, over a pool of 3 (shard 0 owns ids 0 and 1, shard
/// 1 owns id 2). The spawned thread (home shard 1) allocates one block,
/// which empties its shard, and then one more, which it must take from
/// shard 0. Meanwhile the main thread (home shard 0) allocates one block,
/// writes it and gives it back to shard 0. The spawned thread's second
/// request can be admitted through block 1 (a count older than the main
/// thread's give-back) and still take the main thread's block, the lowest
/// free id of shard 0: only the free list's `Release`/`Acquire` orders the
/// two owners' writes then.
fn steal_after_free(faults: Faults) {
    check(move || {
        let world = new_world(3, faults);
        let other = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                let mut ids = world.alloc(1).expect("one of three");
                ids.extend(
                    world
                        .alloc(1)
                        .expect("two of three, the main thread holding one"),
                );
                world.give_back(&ids);
            })
        };
        let ids = world.alloc(1).expect("one of three");
        world.give_back(&ids);
        other.join().unwrap();
        world.assert_conserved_and_bounded();
    });
}

#[test]
fn steal_after_free_sound() {
    steal_after_free(SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn steal_after_free_relaxed_free_is_caught() {
    steal_after_free(RELAXED_FREE);
}

/// A free that splits vs an allocation, over a pool of 3 (shard 0 owns
/// ids 0 and 1, shard 1 owns id 2). The main thread takes all three,
/// gives block 1 back, and hands blocks 0 and 2 (one per shard) to a thread
/// that frees them in one call: two give-backs, one per owning shard.
/// Meanwhile the main thread allocates one block, admitted through block
/// 1, but taking the lowest free id of the shard it looks at first (block
/// 0, just given back, when the give-back came first): only the free
/// list's `Release`/`Acquire` orders the freer's writes before the new
/// owner's.
fn split_free_vs_alloc(faults: Faults) {
    check(move || {
        let world = new_world(3, faults);
        let mut all = world.alloc(3).expect("a fresh pool of 3");
        all.sort_unstable();
        world.give_back(&all[1..2]);
        let split = vec![all[0], all[2]];
        let freer = {
            let world = Arc::clone(&world);
            thread::spawn(move || world.give_back(&split))
        };
        let got = world.alloc(1).expect("block 0 is free throughout");
        freer.join().unwrap();
        world.give_back(&got);
        world.assert_conserved_and_bounded();
    });
}

#[test]
fn split_free_vs_alloc_sound() {
    split_free_vs_alloc(SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn split_free_vs_alloc_relaxed_free_is_caught() {
    split_free_vs_alloc(RELAXED_FREE);
}

/// Alloc vs steal, over a pool of 5 (ids 0, 1 and 2 in shard 0; 3 and 4 in
/// shard 1). The spawned thread (home shard 1) allocates 4: both of its
/// own and two stolen from shard 0; it gives the first stolen one back
/// (onto shard 0, which owns it) and keeps the rest. The main thread (home
/// shard 0) allocates one block, then one more. Each keeps what it holds
/// until the end.
///
/// The lost update without the CAS: the main thread reads shard 0's word
/// (ids 0, 1 and 2 free) and is preempted; the spawned thread steals 0 and
/// 1; the main thread's store of its take of 0 puts 1 back, and both hold
/// 0. One preemption.
fn alloc_vs_steal(faults: Faults) {
    check(move || alloc_then_more(&new_world(5, faults), 4, 2));
}

#[test]
fn alloc_vs_steal_sound() {
    alloc_vs_steal(SOUND);
}

#[test]
#[should_panic(expected = "handed out twice")]
fn alloc_vs_steal_plain_bitmap_take_is_caught() {
    alloc_vs_steal(PLAIN_BITMAP_TAKE);
}
