//! `BlockPool::free` of lists beyond the short, pairwise-compared case.
//!
//! * Shared blocks listed exactly as many times as they have references
//!   are accepted, in a short list (compared pairwise) and in a long one
//!   (more than 16 ids, screened through the 4096-bit filter), and so are
//!   two distinct ids that share a filter bit.
//! * A refused `free` of a long list changes nothing that another thread
//!   can observe, not even for a moment: the over-free is found by the
//!   checks made with loads, before any reference is dropped. (The end state
//!   alone cannot tell: a refusal found later, while dropping, undoes its
//!   drops.) An observer thread samples the reference counts while another
//!   thread repeats the refused call.
//! * Long lists: more than 4096 distinct ids, lists spanning several of the
//!   8,192-index windows in which the over-free check tallies repeats
//!   exactly, and ids listed often enough to saturate a tally (see
//!   `BlockPool::first_over_freed`).
//!
//! * A double free racing the `Sequence` that holds the blocks (its drop or
//!   a truncate), with real threads: whichever drops a block's last
//!   reference pushes it, once, and the used count is given back once per
//!   block. Each round starts both threads at a barrier; the freeing thread
//!   or the sequence's waits a random number of spin hints first, so that
//!   the free's drops land before, among and after the sequence's. After
//!   each round the used count equals the held blocks, the given-back
//!   blocks have no reference left, and taking every free block hands out
//!   each block once and none that is held.
//!
//! * Raw double frees racing every other sequence operation (append with
//!   copy-on-write, truncate, reserve, `shrink_to_fit`, fork, drop), with
//!   real threads on an 8-block pool: `free_blocks()` and `used_blocks()`
//!   stay within `num_blocks()` throughout, and once every sequence is gone
//!   the pool is whole. A fork that finds a parent's reference taken by a
//!   raw free panics instead of reviving a block in the free list. A
//!   watchdog aborts the process if a round hangs (a block pushed twice can
//!   make `try_alloc` spin forever).
//!
//! Every refusal is checked twice: the error names the first over-freed id in
//! list order, and no reference count changed.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use kvslots::{BlockId, BlockPool, FreeError, Sequence};

mod common;
use common::{assert_pool_whole, block_refs, StopOnDrop, XorShift};

// ---------------------------------------------------------------------------
// Shared blocks, the repeat filter, and a refusal seen from another thread
// ---------------------------------------------------------------------------

/// More ids than `BlockPool::free` compares pairwise, so that the call
/// screens for repeats through its filter.
const LONG: usize = 18;

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

#[test]
fn free_accepts_a_shared_block_listed_as_often_as_it_has_references_short_list() {
    let pool = Arc::new(BlockPool::new(4, 1));
    let pair = forked_pair(&pool, 2);
    let (a, b) = (pair.0.blocks()[0], pair.0.blocks()[1]);
    // Each block twice, with two references each: every reference goes.
    assert_eq!(pool.free(&[a, b, a, b]), Ok(()));
    forget_pair(pair);
    assert_pool_whole(&pool);
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
    assert_pool_whole(&pool);
}

#[test]
fn free_of_a_block_listed_once_more_than_its_references_is_refused_in_a_long_list() {
    let pool = Arc::new(BlockPool::new(LONG + 2, 1));
    let (parent, child) = forked_pair(&pool, LONG);
    let shared = parent.blocks()[3];
    let mut list = parent.blocks().to_vec();
    list.extend_from_slice(child.blocks());
    list.push(shared);
    let before = block_refs(&pool);
    assert_eq!(pool.free(&list), Err(FreeError::OverFreed { id: shared }));
    assert_eq!(block_refs(&pool), before, "a refused free changed a count");
    assert_eq!(pool.used_blocks(), LONG);
    drop((parent, child));
    assert_pool_whole(&pool);
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
    assert_pool_whole(&pool);
}

/// Calls of the refused free, and probes of the observer, each at least.
const CALLS: usize = 20_000;
const PROBES: usize = 20_000;

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
    // Relaxed loads and counts below (test code): the counters and the flag
    // only pace and end the two loops (each thread raises `stop` when it ends, by
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
    assert!(block_refs(&pool).iter().all(|&r| r == 1));
    pool.free(&held).unwrap();
    assert_pool_whole(&pool);
}

// ---------------------------------------------------------------------------
// Long lists across the exact-check windows
// ---------------------------------------------------------------------------

/// Indices per exact-check window (the check's tallies, 8 KiB).
const WINDOW: u32 = 8192;

/// A pool of `num_blocks` one-token blocks, every one allocated once.
fn full_pool(num_blocks: usize) -> (BlockPool, Vec<BlockId>) {
    let pool = BlockPool::new(num_blocks, 1);
    let mut all = Vec::new();
    pool.try_alloc(num_blocks, &mut all).unwrap();
    (pool, all)
}

/// The listed ids' reference counts, in list order.
fn counts(pool: &BlockPool, ids: &[BlockId]) -> Vec<Option<usize>> {
    ids.iter().map(|&id| pool.ref_count(id)).collect()
}

/// Checks that `free(list)` is refused as `OverFreed { id }` and changes
/// nothing.
fn assert_over_freed(pool: &BlockPool, list: &[BlockId], id: BlockId) {
    let before = counts(pool, list);
    let used = pool.used_blocks();
    assert_eq!(pool.free(list), Err(FreeError::OverFreed { id }));
    assert_eq!(counts(pool, list), before, "a refused free changed a count");
    assert_eq!(pool.used_blocks(), used);
}

/// The first id in `list` listed more times than `pool` says it has
/// references: the definition, counted the slow way.
fn first_over_freed(pool: &BlockPool, list: &[BlockId]) -> Option<BlockId> {
    (0..list.len())
        .find(|&i| {
            let listed = list[..=i].iter().filter(|&&x| x == list[i]).count();
            listed > pool.ref_count(list[i]).unwrap()
        })
        .map(|i| list[i])
}

#[test]
fn a_free_of_many_distinct_ids_is_accepted_whole() {
    // 70,000 blocks: every id past the 4096th shares a screen bit with an
    // earlier one, and the lists span several windows.
    let (pool, all) = full_pool(70_000);
    let (first, rest) = all.split_at(30_000);
    assert_eq!(pool.free(first), Ok(()));
    assert_eq!(pool.used_blocks(), 40_000);
    assert!(first.iter().all(|&id| pool.ref_count(id) == Some(0)));
    assert!(rest.iter().all(|&id| pool.ref_count(id) == Some(1)));
    assert_eq!(pool.free(rest), Ok(()));
    assert_eq!(pool.free_blocks(), 70_000);
    // Everything came back once: all of it can be taken again, distinct.
    let mut again = Vec::new();
    pool.try_alloc(70_000, &mut again).unwrap();
    again.sort();
    again.dedup();
    assert_eq!(again.len(), 70_000);
    pool.free(&again).unwrap();
}

#[test]
fn a_repeat_at_the_end_of_a_long_list_is_found() {
    let (pool, all) = full_pool(70_000);
    let mut list = all.clone();
    let dup = all[12_345];
    list.push(dup);
    assert_over_freed(&pool, &list, dup);
    pool.free(&all).unwrap();
    assert_eq!(pool.free_blocks(), 70_000);
}

#[test]
fn ids_a_window_or_a_screen_apart_are_not_repeats() {
    let (pool, all) = full_pool(3 * WINDOW as usize + 8);
    // 0, 4096 and 8192 share a screen bit; 0, 8192, 16,384 and 24,576 share
    // a window tally; none is listed twice.
    let mut list: Vec<BlockId> = (1..=16).map(BlockId::new).collect();
    list.extend([0, 4096, WINDOW, 2 * WINDOW, 3 * WINDOW].map(BlockId::new));
    assert_eq!(pool.free(&list), Ok(()));
    assert!(list.iter().all(|&id| pool.ref_count(id) == Some(0)));
    assert_eq!(pool.used_blocks(), pool.num_blocks() - list.len());
    let rest: Vec<BlockId> = all.into_iter().filter(|id| !list.contains(id)).collect();
    pool.free(&rest).unwrap();
    assert_eq!(pool.free_blocks(), pool.num_blocks());
}

#[test]
fn the_first_over_freed_id_in_list_order_is_named_across_windows() {
    let (pool, all) = full_pool(3 * WINDOW as usize);
    let (low, high) = (BlockId::new(5), BlockId::new(2 * WINDOW + 7));
    let filler: Vec<BlockId> = (100..120).map(BlockId::new).collect();
    // The high window is checked last, but its repeat comes first.
    let mut list = vec![low, high];
    list.extend_from_slice(&filler);
    list.extend([high, low]);
    assert_over_freed(&pool, &list, high);
    // And the other way round.
    let mut list = vec![high, low];
    list.extend_from_slice(&filler);
    list.extend([low, high]);
    assert_over_freed(&pool, &list, low);
    // Only the high window's id repeats, behind ids of empty windows' gaps.
    let mut list = filler.clone();
    list.extend([high, BlockId::new(WINDOW + 1), high]);
    assert_over_freed(&pool, &list, high);
    pool.free(&all).unwrap();
    assert_eq!(pool.free_blocks(), pool.num_blocks());
}

#[test]
fn a_shared_block_listed_once_per_reference_across_windows_is_accepted() {
    let pool = Arc::new(BlockPool::with_shards(3 * WINDOW as usize, 1, 1));
    // Take the low ids, so that the sequence's blocks sit in the high windows.
    let mut low = Vec::new();
    pool.try_alloc(WINDOW as usize + 10, &mut low).unwrap();
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(40).unwrap();
    assert!(parent
        .blocks()
        .iter()
        .all(|id| id.index() > WINDOW as usize));
    let (child, copy) = parent.try_fork().unwrap();
    assert_eq!(copy, None);
    // Each shared block twice (its two references), and low ids once.
    let mut list = low[..20].to_vec();
    list.extend_from_slice(parent.blocks());
    list.extend_from_slice(child.blocks());
    assert_eq!(pool.free(&list), Ok(()));
    assert!(parent
        .blocks()
        .iter()
        .all(|&id| pool.ref_count(id) == Some(0)));
    // The sequences' references were taken by the free: forget them.
    std::mem::forget((parent, child));
    pool.free(&low[20..]).unwrap();
    assert_eq!(pool.free_blocks(), pool.num_blocks());
}

#[test]
fn random_long_lists_agree_with_counting() {
    // Blocks with one reference, and blocks shared by a fork (two), around
    // the window boundaries; random lists of them with many repeats.
    let pool = Arc::new(BlockPool::with_shards(3 * WINDOW as usize, 1, 1));
    let mut all = Vec::new();
    pool.try_alloc(pool.num_blocks() - 64, &mut all).unwrap();
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(64).unwrap();
    let (child, _) = parent.try_fork().unwrap();
    let mut candidates: Vec<BlockId> = parent.blocks().to_vec();
    for base in [0, WINDOW - 20, 2 * WINDOW - 20] {
        candidates.extend((base..base + 40).map(BlockId::new));
    }
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |bound: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % bound as u64) as usize
    };
    let mut refused = 0;
    for _ in 0..400 {
        let len = 17 + next(200);
        let list: Vec<BlockId> = (0..len)
            .map(|_| candidates[next(candidates.len())])
            .collect();
        // A list the slow count accepts would really free: skip it.
        if let Some(id) = first_over_freed(&pool, &list) {
            assert_over_freed(&pool, &list, id);
            refused += 1;
        }
    }
    assert!(refused > 300, "only {refused} lists had an over-freed id");
    drop((parent, child));
    pool.free(&all).unwrap();
    assert_eq!(pool.free_blocks(), pool.num_blocks());
}

#[test]
fn one_over_freed_id_listed_many_times_is_named() {
    let (pool, all) = full_pool(4);
    // A buggy caller's list: one block, held once, listed 70,000 times. The
    // check stops at the second listing (before this fix, every repeat was
    // counted over the whole list so far: quadratic).
    let list = vec![all[2]; 70_000];
    assert_over_freed(&pool, &list, all[2]);
    pool.free(&all).unwrap();
    assert_eq!(pool.free_blocks(), 4);
}

#[test]
fn an_id_listed_past_its_saturated_tally_is_counted_exactly() {
    // One full block with 300 references (a parent and 299 forks): its
    // tally saturates at 255 listings, and the count goes on the slow way.
    const REFS: usize = 300;
    let pool = Arc::new(BlockPool::new(8, 1));
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(1).unwrap();
    let forks: Vec<Sequence> = (1..REFS).map(|_| parent.try_fork().unwrap().0).collect();
    let shared = parent.blocks()[0];
    assert_eq!(pool.ref_count(shared), Some(REFS));
    let mut single = Vec::new();
    pool.try_alloc(1, &mut single).unwrap();
    let other = single[0];
    // Listed exactly as often as referenced: not over-freed, so the next
    // offender (a block held once, listed twice) is the one named.
    let mut list = vec![shared; REFS];
    list.extend([other, other]);
    assert_over_freed(&pool, &list, other);
    // Listed once more than referenced: named at its 301st listing, before
    // the other offender.
    let mut list = vec![shared; REFS + 1];
    list.extend([other, other]);
    assert_over_freed(&pool, &list, shared);
    drop((parent, forks));
    pool.free(&single).unwrap();
    assert_eq!(pool.free_blocks(), 8);
}

// ---------------------------------------------------------------------------
// A double free racing the sequence that holds the blocks
// ---------------------------------------------------------------------------

/// How one round gives the sequence's blocks back.
#[derive(Clone, Copy, Debug)]
enum GiveBack {
    /// The whole sequence is dropped.
    Drop,
    /// The sequence is truncated to one token, keeping its first block.
    Truncate,
}

/// Runs `rounds` rounds of a `seq_blocks`-block sequence (one-slot blocks)
/// given back `how` while the other thread frees the same ids, with
/// `other_held` blocks held elsewhere throughout.
fn race(rounds: usize, seq_blocks: usize, other_held: usize, how: GiveBack) {
    let pool = Arc::new(BlockPool::new(other_held + seq_blocks, 1));
    let mut held = Vec::new();
    pool.try_alloc(other_held, &mut held)
        .expect("room for the held blocks");
    let start = Barrier::new(2);
    let mut rng = XorShift::new(seq_blocks as u64 ^ rounds as u64);
    for round in 0..rounds {
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(seq_blocks)
            .expect("the sequence's blocks are free");
        let ids = seq.blocks().to_vec();
        // Which side starts late, and by how many spin hints: the free's
        // checks (a pass over the list) come before its drops, so its drops
        // meet the sequence's when either side starts a little late.
        let span = 8 * seq_blocks;
        let delay = rng.below(2 * span);
        let (free_delay, give_delay) = if delay < span {
            (delay, 0)
        } else {
            (0, delay - span)
        };
        let (seq, answer) = thread::scope(|s| {
            let giver = s.spawn(|| {
                start.wait();
                spin(give_delay);
                match how {
                    GiveBack::Drop => {
                        drop(seq);
                        None
                    }
                    GiveBack::Truncate => {
                        seq.truncate(1);
                        Some(seq)
                    }
                }
            });
            start.wait();
            spin(free_delay);
            // The blocks the sequence gives back (all of them for a drop).
            let answer = match how {
                GiveBack::Drop => pool.free(&ids),
                GiveBack::Truncate => pool.free(&ids[1..]),
            };
            (giver.join().expect("giving back does not panic"), answer)
        });
        check_round(&pool, &ids, seq.as_ref(), &answer, round);
        drop(seq);
        check_whole(&pool, &held, round);
    }
    pool.free(&held).expect("the held blocks go back");
    assert_eq!(pool.free_blocks(), pool.num_blocks());
}

/// Waits `hints` spin hints (not a synchronisation: it only shifts where
/// one thread's accesses land among the other's).
fn spin(hints: usize) {
    for _ in 0..hints {
        std::hint::spin_loop();
    }
}

/// The state after one round: the free's answer names a listed block, the
/// sequence's remaining blocks (if it was truncated) are referenced, every
/// other listed block has no reference, and the used count is exact.
fn check_round(
    pool: &BlockPool,
    ids: &[BlockId],
    seq: Option<&Sequence>,
    answer: &Result<(), FreeError>,
    round: usize,
) {
    match answer {
        Ok(()) => {}
        Err(FreeError::Raced { id }) | Err(FreeError::NotAllocated { id }) => {
            assert!(
                ids.contains(id),
                "round {round}: {answer:?} names no listed block"
            );
        }
        Err(e) => panic!("round {round}: unexpected {e:?}"),
    }
    let kept: &[BlockId] = seq.map_or(&[], |s| s.blocks());
    for id in ids {
        let refs = pool.ref_count(*id).expect("in range");
        // A kept block is referenced unless the free took its reference.
        if !kept.contains(id) {
            assert_eq!(refs, 0, "round {round}: {id} still referenced ({answer:?})");
        }
    }
    let referenced = ids
        .iter()
        .filter(|id| pool.ref_count(**id) != Some(0))
        .count();
    assert_eq!(
        pool.used_blocks(),
        pool.num_blocks() - ids.len() + referenced,
        "round {round}: used count (free() said {answer:?})"
    );
}

/// Taking every free block hands out each once and none of `held`; then
/// they go back.
fn check_whole(pool: &BlockPool, held: &[BlockId], round: usize) {
    assert_eq!(
        pool.used_blocks(),
        held.len(),
        "round {round}: used count after the sequence is gone"
    );
    let mut free = Vec::new();
    pool.try_alloc(pool.free_blocks(), &mut free)
        .expect("every free block can be taken");
    let mut distinct = free.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        free.len(),
        "round {round}: a block was handed out twice"
    );
    assert!(
        free.iter().all(|id| pool.ref_count(*id) == Some(1)),
        "round {round}: a free block was still referenced"
    );
    assert_eq!(
        free.len() + held.len(),
        pool.num_blocks(),
        "round {round}: blocks lost"
    );
    pool.free(&free).expect("just taken");
}

#[test]
fn seq_drop_races_double_free() {
    race(2_000, 256, 1024, GiveBack::Drop);
}

#[test]
fn truncate_races_double_free() {
    race(2_000, 256, 1024, GiveBack::Truncate);
}

/// The heavy variant: the sizes that caught the race within 1,200 rounds of
/// a release build (run with `cargo test --release -- --ignored`).
#[test]
#[ignore = "heavy: run with --release -- --ignored"]
fn seq_drop_races_double_free_heavy() {
    race(20_000, 512, 8_192, GiveBack::Drop);
}

#[test]
#[ignore = "heavy: run with --release -- --ignored"]
fn truncate_races_double_free_heavy() {
    race(20_000, 512, 8_192, GiveBack::Truncate);
}

// ---------------------------------------------------------------------------
// Raw double frees racing every sequence operation
// ---------------------------------------------------------------------------

/// The panic of a fork whose parent lost a reference to a raw free.
fn assert_stolen_reference_panic(panic: &(dyn std::any::Any + Send)) {
    let msg = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or_default();
    assert!(msg.contains("no reference left"), "unexpected panic: {msg}");
}

/// The parent's only reference was taken by a raw free (the block is back
/// in the pool, count 0); forking the parent then adds a reference to a
/// free block (0 -> 1), and dropping the child pushes it a second time and
/// gives the used count back a second time: the fork must refuse.
#[test]
fn fork_after_stolen_reference_does_not_revive_a_free_block() {
    let pool = Arc::new(BlockPool::with_shards(2, 1, 1));
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(1).unwrap();
    let id = parent.blocks()[0];
    assert_eq!(pool.free(&[id]), Ok(())); // misuse: the parent holds it
    assert_eq!(pool.ref_count(id), Some(0));
    // The fork panics, naming the double free, rather than give a child a
    // reference to a block in the free list.
    let forked = catch_unwind(AssertUnwindSafe(|| parent.try_fork()));
    match forked {
        Err(panic) => assert_stolen_reference_panic(&*panic),
        Ok(r) => panic!("the fork went on: {r:?}"),
    }
    assert_eq!(pool.ref_count(id), Some(0), "a free block got a reference");
    drop(parent);
    assert_pool_whole(&pool);
}

/// Threads of a round of the misuse stress.
const THREADS: usize = 3;

/// One thread's share of a round: `ops` random operations on up to three
/// sequences; with `misuse`, it also raw-frees ids other threads published.
fn worker(
    pool: &Arc<BlockPool>,
    published: &Mutex<Vec<BlockId>>,
    seed: u64,
    ops: usize,
    misuse: bool,
    forks: bool,
) {
    let mut rng = XorShift::new(seed);
    let mut seqs: Vec<Sequence> = Vec::new();
    let bs = pool.block_size();
    for _ in 0..ops {
        let pick = |rng: &mut XorShift, n: usize| rng.below(n.max(1));
        match rng.below(10) {
            0 if seqs.len() < 3 => {
                let mut s = Sequence::new(Arc::clone(pool));
                let _ = s.try_append(1 + rng.below(3 * bs));
                seqs.push(s);
            }
            1 | 2 if !seqs.is_empty() => {
                let i = pick(&mut rng, seqs.len());
                let _ = seqs[i].try_append_cow(1 + rng.below(2 * bs));
            }
            3 if !seqs.is_empty() => {
                let i = pick(&mut rng, seqs.len());
                let len = seqs[i].len();
                seqs[i].truncate(rng.below(len + 1));
            }
            4 if !seqs.is_empty() => {
                let i = pick(&mut rng, seqs.len());
                let _ = seqs[i].try_reserve(1 + rng.below(2 * bs), 0);
            }
            5 if !seqs.is_empty() => {
                let i = pick(&mut rng, seqs.len());
                seqs[i].shrink_to_fit();
            }
            6 if forks && !seqs.is_empty() && seqs.len() < 3 => {
                let i = pick(&mut rng, seqs.len());
                // A fork panics if a raw free took one of the parent's
                // references to a full block (it must not share a block that
                // may be back in the free list); the child gives back what
                // it took.
                let forked = catch_unwind(AssertUnwindSafe(|| seqs[i].try_fork()));
                match forked {
                    Ok(Ok((child, _))) => seqs.push(child),
                    Ok(Err(_)) => {}
                    Err(panic) => assert_stolen_reference_panic(&*panic),
                }
            }
            7 if !seqs.is_empty() => {
                let i = pick(&mut rng, seqs.len());
                drop(seqs.swap_remove(i));
            }
            8 if misuse => {
                let ids: Vec<BlockId> = {
                    let p = published.lock().unwrap();
                    if p.is_empty() {
                        continue;
                    }
                    let a = p[rng.below(p.len())];
                    if rng.below(4) == 0 {
                        vec![a, p[rng.below(p.len())]]
                    } else {
                        vec![a]
                    }
                };
                let _ = pool.free(&ids);
            }
            _ => {
                // Publish what this thread's sequences list now.
                let mut p = published.lock().unwrap();
                p.clear();
                for s in &seqs {
                    p.extend_from_slice(s.blocks());
                }
            }
        }
        let n = pool.num_blocks();
        assert!(pool.free_blocks() <= n, "free_blocks above num_blocks");
        assert!(pool.used_blocks() <= n, "used_blocks above num_blocks");
    }
}

/// The pool once every sequence is gone: whole.
fn check_whole_after_misuse(pool: &BlockPool, round: usize) {
    let n = pool.num_blocks();
    let counts: Vec<_> = (0..n)
        .map(|i| pool.ref_count(BlockId::new(i as u32)).unwrap())
        .collect();
    assert_eq!(
        pool.used_blocks(),
        0,
        "round {round}: used blocks (counts {counts:?}, free {})",
        pool.free_blocks()
    );
    for i in 0..n {
        let id = BlockId::new(i as u32);
        assert_eq!(pool.ref_count(id), Some(0), "round {round}: {id}'s count");
    }
    let mut all = Vec::new();
    pool.try_alloc(n, &mut all).expect("the whole pool");
    let mut distinct = all.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        n,
        "round {round}: handed out twice: {all:?}"
    );
    pool.free(&all).expect("just taken");
}

/// `rounds` rounds of `ops` random operations per thread on an 8-block
/// pool with `shards` shards; thread 0 raw-frees thread 1's blocks with
/// `misuse`; sequences fork with `forks`.
fn misuse_rounds(rounds: usize, ops: usize, misuse: bool, forks: bool, shards: usize) {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = thread::spawn(move || {
        // A timeout, not a synchronisation: the rounds finish in well under
        // a second each; a round that does not finish is a hang.
        if let Err(mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(Duration::from_secs(120))
        {
            eprintln!("pool_free: a misuse round hung (a block pushed twice?)");
            std::process::abort();
        }
    });
    let pool = Arc::new(BlockPool::with_shards(8, 2, shards));
    let published: Vec<Mutex<Vec<BlockId>>> =
        (0..THREADS).map(|_| Mutex::new(Vec::new())).collect();
    for round in 0..rounds {
        let start = Barrier::new(THREADS);
        thread::scope(|s| {
            for t in 0..THREADS {
                let (pool, published, start) = (&pool, &published, &start);
                s.spawn(move || {
                    start.wait();
                    // Thread 0 misuses: it raw-frees what thread 1 listed.
                    let list = if t == 0 { &published[1] } else { &published[t] };
                    worker(
                        pool,
                        list,
                        (round * THREADS + t) as u64 + 1,
                        ops,
                        misuse && t == 0,
                        forks,
                    );
                });
            }
        });
        for p in &published {
            p.lock().unwrap().clear();
        }
        check_whole_after_misuse(&pool, round);
    }
    let _ = done_tx.send(());
    watchdog.join().unwrap();
}

#[test]
fn random_ops_no_misuse() {
    misuse_rounds(300, 200, false, true, 2);
}

#[test]
fn random_ops_raw_double_frees_without_forks() {
    misuse_rounds(3_000, 400, true, false, 1);
}

#[test]
fn random_ops_raw_double_frees_with_forks() {
    misuse_rounds(300, 200, true, true, 2);
}

/// Heavier: run with `cargo test --release --test pool_free -- --ignored`.
#[test]
#[ignore = "heavy: run with --release -- --ignored"]
fn random_ops_raw_double_frees_with_forks_heavy() {
    for shards in [1, 2] {
        misuse_rounds(5_000, 400, true, true, shards);
    }
}
