//! Edges that the mutation run (`cargo mutants -p kvslots`, see
//! `.cargo/mutants.toml`) found no other test checking.
//!
//! * `BlockPool::free` of a shared block listed exactly as many times as it
//!   has references: it must be accepted, in a short list (compared
//!   pairwise) and in a long one (more than 16 ids, screened through the
//!   4096-bit filter), and so must two distinct ids that share a filter bit.
//! * A refused `free` of a long list must change nothing that another thread
//!   can observe, not even for a moment: the over-free must be found by the
//!   checks made with loads, before any reference is dropped. (The end state
//!   alone cannot tell: a refusal found later, while dropping, undoes its
//!   drops.) An observer thread samples the reference counts while another
//!   thread repeats the refused call.
//! * The free list's generation tag: a storm of small takes and single
//!   frees on a small pool, on more threads than cores, where an untagged
//!   head would let a stale pop hand out a held block (the loom models
//!   prove the tag; this catches its loss in an ordinary test run too).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use kvslots::{BlockId, BlockPool, FreeError, Sequence};

/// More ids than `BlockPool::free` compares pairwise, so that the call
/// screens for repeats through its filter.
const LONG: usize = 18;

/// Every block's reference count, in id order.
fn refs(pool: &BlockPool) -> Vec<usize> {
    (0..pool.num_blocks())
        .map(|i| pool.ref_count(BlockId::new(i as u32)).unwrap())
        .collect()
}

/// A parent sequence of `blocks` full one-token blocks and one fork of it,
/// so that every block has exactly two references.
fn forked_pair(pool: &Arc<BlockPool>, blocks: usize) -> (Sequence, Sequence) {
    let mut parent = Sequence::new(Arc::clone(pool));
    parent.try_append(blocks).unwrap();
    let (child, copy) = parent.try_fork().unwrap();
    assert_eq!(copy, None, "a fork on a block boundary copies nothing");
    assert!(parent
        .blocks()
        .iter()
        .all(|&id| pool.ref_count(id) == Some(2)));
    (parent, child)
}

/// `free` took both sequences' references (as documented: reference counts
/// cannot tell holders apart), so neither may drop them again. Forgetting
/// them leaks only their table and their `Arc` of the pool.
fn forget_pair(pair: (Sequence, Sequence)) {
    std::mem::forget(pair);
}

/// Checks that the pool is whole again: every block free and handed out
/// once by an allocation of all of them.
fn assert_whole(pool: &BlockPool) {
    assert_eq!(pool.used_blocks(), 0);
    assert_eq!(pool.free_blocks(), pool.num_blocks());
    assert!(refs(pool).iter().all(|&r| r == 0));
    let mut all = Vec::new();
    pool.try_alloc(pool.num_blocks(), &mut all).unwrap();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), pool.num_blocks(), "a block came out twice");
    pool.free(&all).unwrap();
}

#[test]
fn free_accepts_a_shared_block_listed_as_often_as_it_has_references_short_list() {
    let pool = Arc::new(BlockPool::new(4, 1));
    let pair = forked_pair(&pool, 2);
    let (a, b) = (pair.0.blocks()[0], pair.0.blocks()[1]);
    // Each block twice, with two references each: every reference goes.
    assert_eq!(pool.free(&[a, b, a, b]), Ok(()));
    forget_pair(pair);
    assert_whole(&pool);
}

#[test]
fn free_accepts_a_shared_block_listed_as_often_as_it_has_references_long_list() {
    let pool = Arc::new(BlockPool::new(LONG + 2, 1));
    let pair = forked_pair(&pool, LONG);
    // Both tables back to back: each block twice, over 16 ids in all.
    let mut list = pair.0.blocks().to_vec();
    list.extend_from_slice(pair.1.blocks());
    assert!(list.len() > 16);
    assert_eq!(pool.free(&list), Ok(()));
    forget_pair(pair);
    assert_whole(&pool);
}

#[test]
fn free_of_a_block_listed_once_more_than_its_references_is_refused_in_a_long_list() {
    let pool = Arc::new(BlockPool::new(LONG + 2, 1));
    let (parent, child) = forked_pair(&pool, LONG);
    let shared = parent.blocks()[3];
    let mut list = parent.blocks().to_vec();
    list.extend_from_slice(child.blocks());
    list.push(shared);
    let before = refs(&pool);
    assert_eq!(pool.free(&list), Err(FreeError::OverFreed { id: shared }));
    assert_eq!(refs(&pool), before, "a refused free changed a count");
    assert_eq!(pool.used_blocks(), LONG);
    drop((parent, child));
    assert_whole(&pool);
}

#[test]
fn distinct_ids_sharing_a_filter_bit_are_not_a_repeat() {
    // Ids 4096 apart fall on the same bit of the 4096-bit filter.
    let pool = BlockPool::new(4096 + LONG, 1);
    let mut all = Vec::new();
    pool.try_alloc(pool.num_blocks(), &mut all).unwrap();
    let mut list: Vec<BlockId> = (0..LONG as u32).map(BlockId::new).collect();
    list.push(BlockId::new(4096));
    list.push(BlockId::new(4096 + 1));
    assert_eq!(pool.free(&list), Ok(()));
    assert_eq!(pool.used_blocks(), pool.num_blocks() - list.len());
    for id in &list {
        assert_eq!(pool.ref_count(*id), Some(0));
    }
    // The rest, and then the pool is whole.
    let rest: Vec<BlockId> = all.into_iter().filter(|id| !list.contains(id)).collect();
    pool.free(&rest).unwrap();
    assert_whole(&pool);
}

/// Calls of the refused free, and probes of the observer, each at least.
const CALLS: usize = 20_000;
const PROBES: usize = 20_000;

/// Raises `stop` when dropped, also while its thread unwinds from a failed
/// assertion, so that the other thread's loop ends too.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        // Relaxed (test code): only ends the other loop.
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn a_refused_long_free_changes_nothing_another_thread_can_observe() {
    // Ids 65 apart: each alone in its 64-bit word of the filter, and none at
    // a word's bit 0. The last one is listed twice with one reference.
    let pool = BlockPool::new(65 * LONG + 1, 1);
    let mut held = Vec::new();
    pool.try_alloc(pool.num_blocks(), &mut held).unwrap();
    let mut list: Vec<BlockId> = (0..LONG as u32).map(|k| BlockId::new(65 * k + 1)).collect();
    let dup = list[LONG - 1];
    list.push(dup);

    let barrier = Barrier::new(2);
    let calls = AtomicUsize::new(0);
    let probes = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    // Relaxed everywhere below (test code): the counters and the flag only
    // pace and end the two loops (each thread raises `stop` when it ends, by
    // failing or not); what is checked is each call's result and each
    // sampled count, which order nothing.
    let (refused_as_expected, observed) = thread::scope(|s| {
        let freer = s.spawn(|| {
            let _stop = StopOnDrop(&stop);
            barrier.wait();
            // Keep calling until the observer has sampled enough too, so
            // that its probes overlap the calls.
            while !stop.load(Ordering::Relaxed)
                && (calls.load(Ordering::Relaxed) < CALLS
                    || probes.load(Ordering::Relaxed) < PROBES)
            {
                let result = pool.free(&list);
                if result != Err(FreeError::OverFreed { id: dup }) {
                    return Err(format!("free(list) returned {result:?}"));
                }
                calls.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        });
        let observer = s.spawn(|| {
            let _stop = StopOnDrop(&stop);
            barrier.wait();
            while !stop.load(Ordering::Relaxed)
                && (probes.load(Ordering::Relaxed) < PROBES
                    || calls.load(Ordering::Relaxed) < CALLS)
            {
                // Every listed block is held by this test alone, and only the
                // refused calls touch the pool: nothing may move.
                for &id in &list {
                    let count = pool.ref_count(id);
                    if count != Some(1) {
                        return Some(format!(
                            "{id} had {count:?} references during a refused free"
                        ));
                    }
                }
                if pool.used_blocks() != pool.num_blocks() {
                    return Some(format!(
                        "{} blocks in use during a refused free",
                        pool.used_blocks()
                    ));
                }
                probes.fetch_add(1, Ordering::Relaxed);
            }
            None
        });
        (freer.join().unwrap(), observer.join().unwrap())
    });
    assert_eq!(refused_as_expected, Ok(()));
    assert_eq!(observed, None);
    assert!(calls.load(Ordering::Relaxed) >= CALLS);
    assert!(probes.load(Ordering::Relaxed) >= PROBES);
    assert!(refs(&pool).iter().all(|&r| r == 1));
    pool.free(&held).unwrap();
    assert_whole(&pool);
}

/// Rounds of the free-list storm per thread.
const STORM_ROUNDS: usize = 50_000;
/// More threads than most CI machines have cores, so that threads are
/// preempted in the middle of their pops and pushes.
const STORM_THREADS: usize = 16;
/// Blocks in the storm's pool, and the most one take asks for.
const STORM_BLOCKS: usize = 16;
const STORM_MAX_TAKE: usize = 4;

#[test]
fn a_storm_of_takes_and_single_frees_never_hands_a_block_out_twice() {
    // The free list's ABA shape: while one thread has read the head `x` and
    // walked the links below it, others take `x` and the blocks below, and
    // give `x` back on top of something else. A pop whose compare-and-swap
    // then still matched would install its stale link and hand out a block
    // that is held (caught here, or by the pool's own debug assertion), or
    // lose blocks from the list (the storm then never ends: a pop of blocks
    // that were admitted but are missing from the list spins). The
    // generation tag in the head word is what makes that CAS fail. Small
    // takes of 1 to 4 blocks, each given back one at a time, last first,
    // keep the same few ids coming back to the top of the list.
    let pool = BlockPool::new(STORM_BLOCKS, 1);
    let owned: Vec<AtomicBool> = (0..STORM_BLOCKS).map(|_| AtomicBool::new(false)).collect();
    let barrier = Barrier::new(STORM_THREADS);
    thread::scope(|s| {
        for t in 0..STORM_THREADS {
            let (pool, owned, barrier) = (&pool, &owned, &barrier);
            s.spawn(move || {
                let mut ids = Vec::with_capacity(STORM_MAX_TAKE);
                barrier.wait();
                for round in 0..STORM_ROUNDS {
                    let k = 1 + (round + t) % STORM_MAX_TAKE;
                    if pool.try_alloc(k, &mut ids).is_err() {
                        continue;
                    }
                    for id in &ids {
                        // Relaxed (test code): only the swap's atomicity
                        // matters.
                        assert!(
                            !owned[id.index()].swap(true, Ordering::Relaxed),
                            "{id} handed out twice"
                        );
                    }
                    while let Some(id) = ids.pop() {
                        // Relaxed: as above; cleared before the block can be
                        // taken again.
                        assert!(owned[id.index()].swap(false, Ordering::Relaxed));
                        pool.free(&[id]).unwrap();
                    }
                }
            });
        }
    });
    assert_whole(&pool);
}
