//! Loom models of a [`BlockPool`](crate::BlockPool)'s per-shard
//! admission: the fast path (one CAS on the home shard's count) racing a
//! gather that takes from that shard, two gathers racing each other,
//! where each can hold counts in transit while the other looks (the
//! transit window), and a close racing an allocation. The checks are
//! those of `pool.rs` (shadow holder counts, conservation, which also sums
//! the shards' counts without the cap of `free_blocks`, and a
//! happens-before witness per block; see `crate::loom_tests::pool_world`),
//! plus a check that every `Full` is justified.
//!
//! Run with `scripts/loom admission`.
//!
//! Threads are numbered in the order they first admit or release blocks,
//! afresh in every execution, so which thread calls which shard home
//! varies; loom explores both orders, and the models hold in each.
//!
//! | model | threads, blocks, shards | `racy_take` | `keep_refused` |
//! |---|---|---|---|
//! | [`fast_vs_gather`] | 2, 4, 2 | caught: not conserved | |
//! | [`gather_vs_gather`] | 2, 2, 2 | | caught: unjustified `Full` |
//!
//! [`alloc_vs_close`] (2 threads, 2 blocks, 2 shards) has its own control,
//! `close_keeps_admission`: caught, not conserved.

use std::sync::Arc;

use crate::loom_tests::pool_world::{
    check, Allocs, PoolWorld, CLOSE_KEEPS_ADMISSION, KEEP_REFUSED, RACY_TAKE, SOUND,
};
use crate::sync::{AtomicUsize, Faults, Ordering};
use crate::ReserveError;
use loom::thread;

/// A refusal that nothing running could justify.
const UNJUSTIFIED: &str = "unjustified Full";

/// A pool of `num_blocks` one-slot blocks over two shards, whose
/// admission counts start as the free list's ids: `num_blocks / 2` each.
fn new_world(num_blocks: usize, faults: Faults) -> Arc<PoolWorld> {
    PoolWorld::with_shards(num_blocks, 1, 2, faults, "thread")
}

/// Fast path vs gather, over 4 blocks (2 counted in each shard). One
/// thread allocates 1 block and frees it: its home shard has 2, so it
/// takes with one CAS on that shard's count. The other allocates 3: its
/// home has 2, so it gathers the third from the first thread's home shard,
/// racing that CAS. Both fit (1 + 3 = 4) whatever the order, so both must
/// succeed; the freed block then goes back and everything is conserved.
///
/// Under `racy_take` the fast path takes with a load and a plain store:
/// when the gather's take lands between the two, the store erases it, the
/// shard counts one block twice, and the admission counts sum to 5 once
/// everything is back.
fn fast_vs_gather(faults: Faults) {
    check(move || {
        let world = new_world(4, faults);
        let other = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                let ids = world.alloc(1).expect("1 of 4, the other thread taking 3");
                world.give_back(&ids);
            })
        };
        let ids = world.alloc(3).expect("3 of 4, the other thread taking 1");
        other.join().unwrap();
        world.give_back(&ids);
        world.assert_conserved_and_bounded();
    });
}

#[test]
fn fast_vs_gather_sound() {
    fast_vs_gather(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn fast_vs_gather_racy_take_is_caught() {
    fast_vs_gather(RACY_TAKE);
}

/// Whether a thread is inside a call or holding blocks: a ghost counter,
/// odd while busy, so that another thread can tell whether that was so at
/// some point of its own call.
struct Busy(AtomicUsize);

impl Busy {
    fn new() -> Busy {
        Busy(AtomicUsize::new(0))
    }

    /// Enters or leaves the busy state.
    fn flip(&self) {
        // SeqCst (both): the ghost must order against the other thread's
        // reads; it is outside the pool, whose orderings the payloads
        // check.
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    fn read(&self) -> usize {
        // SeqCst: as in `flip`.
        self.0.load(Ordering::SeqCst)
    }
}

/// Checks that a refusal of `n` blocks between ghost reads `before` and
/// `after` of the other thread's [`Busy`] was justified: the other thread
/// was inside a call or held blocks at some point of it (with nothing else
/// running and nothing held, every block was free).
fn assert_justified(
    result: &Result<Vec<crate::BlockId>, ReserveError>,
    before: usize,
    after: usize,
) {
    if let Err(ReserveError::Full { available, .. }) = result {
        let overlapped = before % 2 == 1 || after != before;
        assert!(
            overlapped,
            "{UNJUSTIFIED}: reported {available} free while the other thread \
             was idle throughout"
        );
    }
}

/// Gather vs gather, over 2 blocks (1 counted in each shard). Both
/// threads allocate 2: each takes its home shard's block and then looks
/// at the other shard, which the other thread may have emptied into its
/// own transit. So both may be refused, each justified by the other's
/// blocks in transit, or one wins and the other is refused while the
/// winner holds both. A refusal must have overlapped the other thread's
/// call or holding (ghost counters), must report fewer than 2, and
/// changes nothing. Then the main thread, alone, allocates 2 again, which
/// must succeed.
///
/// Under `keep_refused` a refused gather keeps what it took: in the
/// schedules where both are refused, the spawned thread's block stays in
/// transit after it returned, and the main thread's last allocation, made
/// while nothing runs, is refused: caught as an unjustified `Full`.
fn gather_vs_gather(faults: Faults) {
    check(move || {
        let world = new_world(2, faults);
        let main_busy = Arc::new(Busy::new());
        let other_busy = Arc::new(Busy::new());
        let other = {
            let (world, main_busy, other_busy) = (
                Arc::clone(&world),
                Arc::clone(&main_busy),
                Arc::clone(&other_busy),
            );
            thread::spawn(move || {
                other_busy.flip();
                let before = main_busy.read();
                let got = world.alloc(2);
                let after = main_busy.read();
                assert_justified(&got, before, after);
                if let Ok(ids) = got {
                    world.give_back(&ids);
                }
                other_busy.flip();
            })
        };
        main_busy.flip();
        let before = other_busy.read();
        let got = world.alloc(2);
        let after = other_busy.read();
        assert_justified(&got, before, after);
        if let Ok(ids) = got {
            world.give_back(&ids);
        }
        main_busy.flip();
        other.join().unwrap();
        // Alone now: every block is free.
        let before = other_busy.read();
        let got = world.alloc(2);
        assert_justified(&got, before, other_busy.read());
        world.give_back(&got.expect("2 of 2, alone"));
        world.assert_conserved_and_bounded();
    });
}

#[test]
fn gather_vs_gather_sound() {
    gather_vs_gather(SOUND);
}

#[test]
#[should_panic(expected = "unjustified Full")]
fn gather_vs_gather_keep_refused_is_caught() {
    gather_vs_gather(KEEP_REFUSED);
}

/// Allocations vs a close, over 2 blocks (1 counted in each shard). One
/// thread closes the pool. The other allocates 1 block (its home shard's,
/// on the fast path) and then 2 more, which it cannot have while it holds
/// the first: a gather over both shards, refused. Each call reads the
/// closed flag before its take and again after it, so it either took its
/// blocks before the close or fails `Closed` and gives back what it took,
/// and a refusal gives back all it gathered, whether or not the close
/// came meanwhile. Once both are done and the first block (if any) is
/// freed, every count is whole again: nothing admitted stays behind, and
/// nothing is given back twice (the shards' counts, uncapped, sum to 2).
///
/// Under `close_keeps_admission`, a call whose re-check finds the close
/// that came after its take reports `Closed` and keeps the block it took:
/// caught, not conserved.
fn alloc_vs_close(faults: Faults) {
    check(move || {
        let world = new_world(2, faults);
        let closer = {
            let world = Arc::clone(&world);
            thread::spawn(move || world.pool.close())
        };
        let mut ids = Vec::new();
        let first = world.pool.try_alloc(1, &mut ids);
        match first {
            Ok(()) => assert_eq!(ids.len(), 1, "partial allocation"),
            Err(ReserveError::Closed) => assert!(ids.is_empty(), "a refusal changed `out`"),
            Err(e) => panic!("1 of 2: unexpected {e:?}"),
        }
        for &id in &ids {
            world.take(id);
            world.write(id);
        }
        let mut out = Vec::new();
        let more = world.pool.try_alloc(2, &mut out);
        assert!(
            matches!(more, Err(ReserveError::Full { .. } | ReserveError::Closed)),
            "2 more beside {first:?}: {more:?}"
        );
        assert!(out.is_empty(), "a refusal changed `out`");
        world.give_back(&ids);
        closer.join().unwrap();
        assert!(world.pool.is_closed());
        world.assert_counts_whole();
    });
}

#[test]
fn alloc_vs_close_sound() {
    alloc_vs_close(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn alloc_vs_close_close_keeps_admission_is_caught() {
    alloc_vs_close(CLOSE_KEEPS_ADMISSION);
}
