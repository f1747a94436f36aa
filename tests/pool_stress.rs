//! Rayon stress tests for `BlockPool` and `Sequence` (at least 8 threads).
//!
//! 1. **Ownership.** Many tasks allocate and free mixed request sizes
//!    (including sizes that never fit) on a small pool. An ownership array
//!    (one `AtomicBool` per block) proves that no id is ever held by two
//!    owners: taking an id swaps its flag to `true` and must find `false`;
//!    giving it back swaps it to `false` (before the free) and must find
//!    `true`. Refused calls (also deliberately bad frees) must leave the
//!    caller's ids held. At the end every block is free again and
//!    allocating all of them yields every id once.
//! 2. **Sequences.** Many tasks append (multi-token), truncate, fork and
//!    drop sequences over one small pool, handing forked children to other
//!    tasks, so shared blocks are dropped on other threads. Every append is
//!    whole or nothing, every block written into has exactly one reference
//!    (nobody else can read it), and the pool is full again at the end.
//! 3. **A refused free racing a legitimate one.** A free that lists a
//!    shared block before a bad id must change nothing, even while the
//!    block's other holder frees it at the same time.
//!
//! Throughout, an observer thread samples `used_blocks() <= num_blocks()`.
//! Every task has its own tiny deterministic PRNG (xorshift), so each task's
//! operation mix is reproducible (the interleaving is not). The default
//! sizes run in a few seconds in debug builds on 2 cores; the `#[ignore]`d
//! variants run longer.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use crossbeam_queue::SegQueue;
use kvslots::{BlockId, BlockPool, FreeError, ReserveError, Sequence};
use rayon::prelude::*;

mod common;
use common::{run_observed, XorShift};

// ---------------------------------------------------------------------------
// The observer and the thread pool
// ---------------------------------------------------------------------------

/// Runs `work` while a separate std thread samples the pool's invariants
/// (see [`run_observed`]); returns what `work` returned and how many
/// samples the observer took (at least one while `work` may run and one
/// after it ended).
fn observed<R: Send>(pool: &BlockPool, work: impl FnOnce() -> R + Send) -> (R, u64) {
    let num_blocks = pool.num_blocks();
    let sample = || {
        let used = pool.used_blocks();
        assert!(used <= num_blocks, "used {used} > num_blocks {num_blocks}");
        let free = pool.free_blocks();
        assert!(free <= num_blocks, "free {free} > num_blocks {num_blocks}");
        assert!(pool.peak_used_blocks() <= num_blocks);
    };
    run_observed(sample, work)
}

/// A rayon pool of `threads` workers (at least 8, as the issue asks).
fn rayon_pool(threads: usize) -> rayon::ThreadPool {
    assert!(threads >= 8);
    common::rayon_pool(threads)
}

/// Every block free, every count 0, and allocating them all yields every id
/// exactly once.
fn assert_pool_full_again(pool: &BlockPool) {
    let n = pool.num_blocks();
    assert_eq!((pool.free_blocks(), pool.used_blocks()), (n, 0));
    for i in 0..n {
        let id = BlockId::new(i as u32);
        assert_eq!(pool.ref_count(id), Some(0), "{id} still referenced");
    }
    let mut ids = Vec::new();
    pool.try_alloc(n, &mut ids)
        .expect("a full pool hands out all its blocks");
    let distinct: HashSet<BlockId> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), n, "an id handed out twice");
    assert!(ids.iter().all(|id| id.index() < n));
    assert_eq!(pool.try_alloc(1, &mut Vec::new()).is_err(), n > 0);
    pool.free(&ids).unwrap();
    assert_eq!(pool.free_blocks(), n);
}

// ---------------------------------------------------------------------------
// 1. Alloc/free with an ownership array
// ---------------------------------------------------------------------------

/// One flag per block: `true` while some task owns it.
struct Ownership(Vec<AtomicBool>);

impl Ownership {
    fn new(n: usize) -> Self {
        Ownership((0..n).map(|_| AtomicBool::new(false)).collect())
    }

    /// Marks `id` as ours, after the allocation that handed it to us.
    fn take(&self, id: BlockId) {
        // SeqCst: the array is the test's oracle; the strongest ordering
        // adds no doubt of its own. Only the pool's Acquire allocation and
        // Release free order one owner's swap before the next one's.
        let was = self.0[id.index()].swap(true, Ordering::SeqCst);
        assert!(!was, "{id} handed out while another task owns it");
    }

    /// Marks `id` as no longer ours, before the free that gives it back.
    fn give_back(&self, id: BlockId) {
        // SeqCst: see `take`.
        let was = self.0[id.index()].swap(false, Ordering::SeqCst);
        assert!(was, "{id} given back by a task that did not own it");
    }

    fn owned(&self, id: BlockId) -> bool {
        // SeqCst: see `take`.
        self.0[id.index()].load(Ordering::SeqCst)
    }
}

/// Counts what the tasks did, so the test can check that every kind of
/// operation really happened.
#[derive(Default)]
struct Tally {
    allocs: AtomicU64,
    full: AtomicU64,
    never_fits: AtomicU64,
    frees: AtomicU64,
    bad_frees: AtomicU64,
}

impl Tally {
    fn bump(counter: &AtomicU64) {
        // Relaxed: a statistic, read after the rayon scope has joined.
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn get(counter: &AtomicU64) -> u64 {
        // Relaxed: read after every task has joined.
        counter.load(Ordering::Relaxed)
    }
}

/// One task of the ownership test: `ops` random operations.
fn ownership_task(pool: &BlockPool, own: &Ownership, tally: &Tally, seed: u64, ops: usize) {
    let n_blocks = pool.num_blocks();
    let mut rng = XorShift::new(seed);
    // The chunks this task holds, each from one successful allocation.
    let mut held: Vec<Vec<BlockId>> = Vec::new();
    for _ in 0..ops {
        match rng.below(10) {
            // Allocate a mixed size: mostly small, sometimes too large.
            0..=4 => {
                let n = match rng.below(20) {
                    0 => usize::MAX,
                    1 => n_blocks + 1 + rng.below(4),
                    2 => n_blocks,
                    _ => rng.below(n_blocks.min(6) + 1),
                };
                let mut out = vec![BlockId::new(u32::MAX)];
                match pool.try_alloc(n, &mut out) {
                    Ok(()) => {
                        assert_eq!(out.len(), 1 + n, "try_alloc({n}) appended a wrong count");
                        assert_eq!(out[0], BlockId::new(u32::MAX));
                        out.remove(0);
                        for &id in &out {
                            assert!(id.index() < n_blocks, "{id} out of range");
                            own.take(id);
                            assert_eq!(pool.ref_count(id), Some(1));
                        }
                        if !out.is_empty() {
                            held.push(out);
                        }
                        Tally::bump(&tally.allocs);
                    }
                    Err(e) => {
                        assert_eq!(out, [BlockId::new(u32::MAX)], "refused but `out` changed");
                        match e {
                            ReserveError::NeverFits {
                                requested,
                                capacity,
                            } => {
                                assert_eq!((requested, capacity), (n, n_blocks));
                                assert!(n > n_blocks);
                                Tally::bump(&tally.never_fits);
                            }
                            ReserveError::Full {
                                requested,
                                available,
                            } => {
                                assert_eq!(requested, n);
                                assert!(n <= n_blocks && available < n, "{e}");
                                Tally::bump(&tally.full);
                            }
                            ReserveError::Closed => panic!("the pool was never closed"),
                        }
                    }
                }
            }
            // Free a whole chunk, or part of one.
            5..=7 => {
                if held.is_empty() {
                    continue;
                }
                let i = rng.below(held.len());
                let k = 1 + rng.below(held[i].len());
                let chunk: Vec<BlockId> = held[i].drain(..k).collect();
                if held[i].is_empty() {
                    held.swap_remove(i);
                }
                for &id in &chunk {
                    own.give_back(id);
                }
                pool.free(&chunk).expect("freeing owned blocks");
                Tally::bump(&tally.frees);
            }
            // A bad free listing owned ids first: refused, nothing changes.
            8 => {
                let Some(chunk) = held.last() else { continue };
                let mut list = chunk.clone();
                let expected = if rng.below(2) == 0 {
                    // Listed twice with one reference.
                    let dup = list[rng.below(list.len())];
                    list.push(dup);
                    FreeError::OverFreed { id: dup }
                } else {
                    let id = BlockId::new((n_blocks + rng.below(3)) as u32);
                    list.push(id);
                    FreeError::OutOfRange {
                        id,
                        num_blocks: n_blocks,
                    }
                };
                assert_eq!(pool.free(&list), Err(expected));
                for &id in chunk {
                    assert!(own.owned(id));
                    assert_eq!(pool.ref_count(id), Some(1), "a refused free dropped {id}");
                }
                Tally::bump(&tally.bad_frees);
            }
            // Free everything this task holds.
            _ => {
                let all: Vec<BlockId> = held.drain(..).flatten().collect();
                for &id in &all {
                    own.give_back(id);
                }
                pool.free(&all).expect("freeing owned blocks");
                Tally::bump(&tally.frees);
            }
        }
    }
    let all: Vec<BlockId> = held.into_iter().flatten().collect();
    for &id in &all {
        own.give_back(id);
    }
    pool.free(&all).expect("freeing owned blocks");
}

fn run_ownership(num_blocks: usize, shards: usize, threads: usize, tasks: u64, ops: usize) {
    let pool = BlockPool::with_shards(num_blocks, 16, shards);
    let own = Ownership::new(num_blocks);
    let tally = Tally::default();
    let workers = rayon_pool(threads);
    let ((), samples) = observed(&pool, || {
        workers.install(|| {
            (0..tasks)
                .into_par_iter()
                .for_each(|seed| ownership_task(&pool, &own, &tally, seed, ops));
        })
    });
    eprintln!(
        "ownership, {num_blocks} blocks in {shards} shards: {} allocs, {} full, {} never fit, {} frees, \
         {} bad frees, {samples} observer samples, peak {}",
        Tally::get(&tally.allocs),
        Tally::get(&tally.full),
        Tally::get(&tally.never_fits),
        Tally::get(&tally.frees),
        Tally::get(&tally.bad_frees),
        pool.peak_used_blocks(),
    );
    assert!(samples > 0, "the observer took no sample");
    // Every kind of operation happened (the PRNG mix guarantees it at these
    // sizes).
    assert!(Tally::get(&tally.allocs) > 0);
    assert!(Tally::get(&tally.never_fits) > 0);
    assert!(Tally::get(&tally.frees) > 0);
    assert!(Tally::get(&tally.bad_frees) > 0);
    for i in 0..num_blocks {
        assert!(!own.owned(BlockId::new(i as u32)), "block {i} still owned");
    }
    assert!(pool.peak_used_blocks() <= num_blocks);
    assert_pool_full_again(&pool);
}

#[test]
fn alloc_free_never_hands_an_id_to_two_owners() {
    for num_blocks in [8, 16, 64] {
        run_ownership(num_blocks, 1, 8, 64, 6_000);
    }
}

/// The same over sharded free lists: threads start their pops at different
/// stacks, steal from the others when theirs runs short, and give every
/// block back to the stack that owns it (3 shards split 16 ids unevenly;
/// 16 shards over 8 ids leave half the stacks without an id of their own).
#[test]
fn alloc_free_never_hands_an_id_to_two_owners_sharded() {
    for (num_blocks, shards) in [(16, 3), (64, 8), (8, 16)] {
        run_ownership(num_blocks, shards, 8, 64, 4_000);
    }
}

#[test]
fn alloc_free_on_a_one_block_pool() {
    run_ownership(1, 1, 8, 32, 4_000);
}

#[test]
#[ignore = "heavy: run with --ignored (ideally --release)"]
fn alloc_free_never_hands_an_id_to_two_owners_heavy() {
    for num_blocks in [2, 8, 13, 32, 64] {
        run_ownership(num_blocks, 4, 16, 128, 20_000);
    }
}

// ---------------------------------------------------------------------------
// 2. Sequences appending, truncating, forking and dropping
// ---------------------------------------------------------------------------

/// What every sequence task shares: the pool, a queue of forked children
/// handed to whichever task takes them next, and counts.
struct SeqShared {
    pool: Arc<BlockPool>,
    handoff: SegQueue<Sequence>,
    appends: AtomicU64,
    refused: AtomicU64,
    forks: AtomicU64,
    copies: AtomicU64,
}

/// Appends `n` to `seq` and checks whole-or-nothing and that every block
/// written into is held by this sequence alone. Returns whether the pool
/// was full (a scheduler would preempt something).
fn checked_append(seq: &mut Sequence, n: usize, shared: &SeqShared) -> bool {
    let bs = seq.pool().block_size();
    let num_blocks = seq.pool().num_blocks();
    let (len, blocks) = (seq.len(), seq.blocks().to_vec());
    match seq.try_append_cow(n) {
        Ok((range, copy)) => {
            assert_eq!(range, len..len + n, "append({n}) at {len}");
            assert_eq!(seq.len(), len + n, "append({n}) grew by a wrong count");
            assert_eq!(seq.blocks().len(), seq.len().div_ceil(bs));
            // The blocks before the tail are untouched.
            let kept = len / bs;
            assert_eq!(seq.blocks()[..kept], blocks[..kept]);
            // Nobody else can read what we are about to write.
            for p in range {
                let block = seq.blocks()[p / bs];
                assert_eq!(
                    seq.pool().ref_count(block),
                    Some(1),
                    "writing position {p} into shared {block}"
                );
            }
            if let Some(copy) = copy {
                assert_eq!(copy.tokens, len % bs);
                assert_eq!(copy.src, blocks[kept]);
                assert_eq!(copy.dst, seq.blocks()[kept]);
                Tally::bump(&shared.copies);
            }
            Tally::bump(&shared.appends);
            false
        }
        Err(e) => {
            assert_eq!(seq.len(), len, "a refused append changed the length");
            assert_eq!(
                seq.blocks(),
                &blocks[..],
                "a refused append changed the table"
            );
            match e {
                ReserveError::NeverFits {
                    requested,
                    capacity,
                } => assert!(requested > capacity && capacity == num_blocks, "{e}"),
                ReserveError::Full {
                    requested,
                    available,
                } => assert!(requested <= num_blocks && available < requested, "{e}"),
                ReserveError::Closed => panic!("the pool was never closed"),
            }
            Tally::bump(&shared.refused);
            e.is_retryable()
        }
    }
}

/// One task: `ops` random operations on its own sequences and on children
/// other tasks forked.
fn sequence_task(shared: &SeqShared, seed: u64, ops: usize) {
    let pool = &shared.pool;
    let bs = pool.block_size();
    let capacity_tokens = pool.num_blocks() * bs;
    let mut rng = XorShift::new(seed);
    let mut seqs: Vec<Sequence> = Vec::new();
    for _ in 0..ops {
        if seqs.is_empty() {
            seqs.push(
                shared
                    .handoff
                    .pop()
                    .unwrap_or_else(|| Sequence::new(Arc::clone(pool))),
            );
        }
        let i = rng.below(seqs.len());
        match rng.below(16) {
            // Appends: decode steps, draft batches, prefill chunks, and
            // sizes that never fit.
            0..=6 => {
                let n = match rng.below(24) {
                    0 => usize::MAX,
                    1 => capacity_tokens + 1 + rng.below(bs),
                    2 => bs * (2 + rng.below(4)),
                    _ => 1 + rng.below(bs + 2),
                };
                let full = checked_append(&mut seqs[i], n, shared);
                // Preempt another sequence (it may share blocks with
                // sequences on other threads) half of the time.
                if full && seqs.len() > 1 && rng.below(2) == 0 {
                    let j = (i + 1 + rng.below(seqs.len() - 1)) % seqs.len();
                    drop(seqs.swap_remove(j));
                }
            }
            // Roll back (rejected drafts, preemption).
            7..=9 => {
                let seq = &mut seqs[i];
                let (len, blocks) = (seq.len(), seq.blocks().len());
                let to = if rng.below(4) == 0 {
                    0
                } else {
                    len.saturating_sub(rng.below(2 * bs + 1))
                };
                let given = seq.truncate(to);
                assert_eq!(seq.len(), to.min(len));
                assert_eq!(seq.blocks().len(), seq.len().div_ceil(bs));
                assert_eq!(given, blocks - seq.blocks().len());
            }
            // Fork; keep the child or hand it to another task.
            10..=12 => {
                let parent = &seqs[i];
                let (len, blocks) = (parent.len(), parent.blocks().to_vec());
                match parent.try_fork() {
                    Ok((child, copy)) => {
                        assert_eq!(child.len(), len);
                        assert_eq!(parent.blocks(), &blocks[..], "a fork changed the parent");
                        let full = len / bs;
                        assert_eq!(child.blocks()[..full], blocks[..full]);
                        assert_eq!(child.blocks().len(), blocks.len());
                        assert_eq!(copy.is_some(), len % bs != 0);
                        if let Some(copy) = copy {
                            assert_eq!(copy.src, blocks[full]);
                            assert_eq!(copy.dst, child.blocks()[full]);
                            assert_eq!(copy.tokens, len % bs);
                            assert!(!blocks.contains(&copy.dst));
                        }
                        Tally::bump(&shared.forks);
                        if rng.below(2) == 0 && seqs.len() < 4 {
                            seqs.push(child);
                        } else if shared.handoff.len() < 8 {
                            shared.handoff.push(child);
                        } else {
                            // Beam search pruning a candidate right away.
                            drop(child);
                        }
                    }
                    Err(e) => {
                        assert!(matches!(e, ReserveError::Full { .. }), "{e}");
                        assert_eq!(parent.blocks(), &blocks[..]);
                        assert_eq!(parent.len(), len);
                    }
                }
            }
            // Drop a sequence (possibly sharing blocks with another thread's).
            13 | 14 => drop(seqs.swap_remove(i)),
            // Adopt a child some other task forked.
            _ => {
                if let Some(seq) = shared.handoff.pop() {
                    if seqs.len() < 4 {
                        seqs.push(seq);
                    } else {
                        // Dropped on another thread than its parent's.
                        drop(seq);
                    }
                }
            }
        }
    }
}

fn run_sequences(
    (num_blocks, shards): (usize, usize),
    block_size: usize,
    threads: usize,
    tasks: u64,
    ops: usize,
) {
    let shared = SeqShared {
        pool: Arc::new(BlockPool::with_shards(num_blocks, block_size, shards)),
        handoff: SegQueue::new(),
        appends: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        forks: AtomicU64::new(0),
        copies: AtomicU64::new(0),
    };
    let workers = rayon_pool(threads);
    let ((), samples) = observed(&shared.pool, || {
        workers.install(|| {
            (0..tasks)
                .into_par_iter()
                .for_each(|seed| sequence_task(&shared, seed, ops));
        })
    });
    eprintln!(
        "sequences, {num_blocks} blocks of {block_size} in {shards} shards: {} appends, {} refused, {} forks, \
         {} copies-on-write, {samples} observer samples, peak {}",
        Tally::get(&shared.appends),
        Tally::get(&shared.refused),
        Tally::get(&shared.forks),
        Tally::get(&shared.copies),
        shared.pool.peak_used_blocks(),
    );
    assert!(samples > 0, "the observer took no sample");
    assert!(Tally::get(&shared.appends) > 0);
    assert!(Tally::get(&shared.refused) > 0);
    assert!(Tally::get(&shared.forks) > 0);
    // Children nobody adopted still hold references until dropped.
    while let Some(seq) = shared.handoff.pop() {
        drop(seq);
    }
    assert_eq!(Arc::strong_count(&shared.pool), 1, "a sequence leaked");
    assert_pool_full_again(&shared.pool);
}

#[test]
fn sequences_append_truncate_fork_and_drop_concurrently() {
    run_sequences((32, 1), 4, 8, 64, 6_000);
    run_sequences((12, 1), 1, 8, 32, 3_000);
    run_sequences((48, 1), 16, 8, 32, 3_000);
}

/// The same over sharded free lists (forks, copies-on-write and drops free
/// chains whose blocks belong to several stacks).
#[test]
fn sequences_append_truncate_fork_and_drop_concurrently_sharded() {
    run_sequences((32, 4), 4, 8, 48, 4_000);
    run_sequences((48, 5), 16, 8, 32, 3_000);
}

#[test]
#[ignore = "heavy: run with --ignored (ideally --release)"]
fn sequences_append_truncate_fork_and_drop_concurrently_heavy() {
    for (num_blocks, bs) in [(8, 2), (32, 4), (64, 16), (16, 1)] {
        for shards in [1, 4] {
            run_sequences((num_blocks, shards), bs, 16, 128, 20_000);
        }
    }
}

// ---------------------------------------------------------------------------
// 3. A refused free racing a legitimate free of a shared block
// ---------------------------------------------------------------------------

/// A parent of `blocks` full blocks and a child forked on the boundary share
/// every block (two references each). One thread frees the parent's blocks
/// followed by a never-allocated id (refused: nothing may change) while
/// another drops the child at the same time. Afterwards the parent must
/// still hold one reference to each block and the pool must count them as
/// used: the refused free may not turn the child's drop into a "last" drop
/// that returns the parent's blocks to the free list.
fn race_refused_free_with_legit_free(blocks: usize, rounds: usize) {
    let pool = Arc::new(BlockPool::new(blocks + 1, 1));
    for round in 0..rounds {
        let mut parent = Sequence::new(Arc::clone(&pool));
        parent.try_append(blocks).unwrap();
        let (child, copy) = parent.try_fork().unwrap();
        assert_eq!(copy, None);
        let unallocated = (0..=blocks as u32)
            .map(BlockId::new)
            .find(|&id| pool.ref_count(id) == Some(0))
            .unwrap();
        let mut bad = parent.blocks().to_vec();
        bad.push(unallocated);
        let start = Barrier::new(2);
        let refused = thread::scope(|s| {
            let dropper = s.spawn(|| {
                start.wait();
                drop(child);
            });
            start.wait();
            let refused = pool.free(&bad);
            dropper.join().unwrap();
            refused
        });
        let used = pool.used_blocks();
        let wrong: Vec<BlockId> = parent
            .blocks()
            .iter()
            .copied()
            .filter(|&id| pool.ref_count(id) != Some(1))
            .collect();
        if refused != Err(FreeError::NotAllocated { id: unallocated })
            || used != blocks
            || !wrong.is_empty()
        {
            // The pool is corrupt; dropping the parent would free its blocks
            // a second time (and panic while unwinding).
            std::mem::forget(parent);
            panic!(
                "round {round}: the refused free returned {refused:?} and changed the pool: \
                 used_blocks {used} (expected {blocks}: the parent still holds them all), \
                 free_blocks {} (expected 1), {} of the parent's blocks without exactly one \
                 reference",
                pool.free_blocks(),
                wrong.len()
            );
        }
        drop(parent);
        assert_eq!(pool.free_blocks(), blocks + 1);
    }
}

#[test]
fn a_refused_free_racing_a_legit_free_of_a_shared_block_changes_nothing() {
    race_refused_free_with_legit_free(2048, 200);
}
