//! Fenced release: `Sequence::retire`, `Sequence::truncate_fenced`,
//! `BlockPool::complete`, `BlockPool::complete_all` and the
//! `pending_release_blocks` gauge. A block retired under a fence is never
//! handed out before that fence completes, whatever order the fences
//! complete in; it counts as used meanwhile; and a real-thread stress with
//! threads retiring and completing at once ends with every block back.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use common::{assert_pool_whole, pool_snap, seq_snap, XorShift};
use kvslots::{hash_blocks, BlockId, BlockPool, ReserveError, Sequence};

/// A sequence of `tokens` tokens over `pool`.
fn seq_of(pool: &Arc<BlockPool>, tokens: usize) -> Sequence {
    let mut seq = Sequence::new(Arc::clone(pool));
    seq.try_append(tokens).unwrap();
    seq
}

/// Allocates every free block and returns them (the pool is then full).
fn take_all_free(pool: &BlockPool) -> Vec<BlockId> {
    let mut ids = Vec::new();
    pool.try_alloc(pool.free_blocks(), &mut ids).unwrap();
    ids
}

#[test]
fn retired_blocks_are_not_reallocated_until_their_fence_completes_out_of_order() {
    let pool = Arc::new(BlockPool::new(6, 4));
    let a = seq_of(&pool, 8); // 2 blocks
    let b = seq_of(&pool, 12); // 3 blocks
    let (a_ids, b_ids): (Vec<_>, Vec<_>) = (a.blocks().to_vec(), b.blocks().to_vec());
    assert_eq!(a.retire(1), 2);
    assert_eq!(b.retire(2), 3);
    assert_eq!(pool.pending_release_blocks(), 5);
    assert_eq!(pool.used_blocks(), 5);
    assert_eq!(pool.free_blocks(), 1);
    // Only the one block never retired can be had.
    let first = take_all_free(&pool);
    assert_eq!(first.len(), 1);
    assert!(!a_ids.contains(&first[0]) && !b_ids.contains(&first[0]));
    // Fence 2 completes first: exactly b's blocks come back, a's stay.
    assert_eq!(pool.complete(2), 3);
    assert_eq!(pool.pending_release_blocks(), 2);
    let second = take_all_free(&pool);
    assert_eq!(
        second.iter().copied().collect::<HashSet<_>>(),
        b_ids.iter().copied().collect::<HashSet<_>>()
    );
    for id in &a_ids {
        assert_eq!(pool.ref_count(*id), Some(1), "{id} is still retired");
    }
    assert_eq!(pool.complete(1), 2);
    let third = take_all_free(&pool);
    assert_eq!(
        third.iter().copied().collect::<HashSet<_>>(),
        a_ids.iter().copied().collect::<HashSet<_>>()
    );
    assert_eq!(pool.pending_release_blocks(), 0);
    assert_eq!(pool.peak_pending_release_blocks(), 5);
    for ids in [first, second, third] {
        pool.free(&ids).unwrap();
    }
    assert_pool_whole(&pool);
}

/// The fence gives back what its sequences took, however they took it:
/// runs of fresh blocks (a whole bitmap word, part of one, two words),
/// counted blocks, shared blocks and cached ones, one sequence under a
/// fence or several.
#[test]
fn a_completed_fence_gives_back_fresh_runs_and_counted_blocks_alike() {
    let pool = Arc::new(BlockPool::new(512, 1));
    // One sequence a fence: a whole word, part of one, two words.
    for (fence, tokens) in [(1, 64), (2, 20), (3, 128), (4, 3)] {
        let seq = seq_of(&pool, tokens);
        let ids = seq.blocks().to_vec();
        assert_eq!(seq.retire(fence), tokens);
        assert_eq!(pool.used_blocks(), tokens);
        assert_eq!(pool.complete(fence), tokens);
        assert_eq!(pool.pending_release_blocks(), 0);
        for id in ids {
            assert_eq!(pool.ref_count(id), Some(0), "{id} back after its fence");
        }
        assert_pool_whole(&pool);
    }
    // Several under one fence: two fresh runs that meet (one run in the
    // fence's list), a forked pair that shares blocks, a cached prompt.
    let first = seq_of(&pool, 32);
    let second = seq_of(&pool, 32);
    let parent = seq_of(&pool, 40);
    let (child, copy) = parent.try_fork().unwrap();
    assert!(copy.is_none());
    let mut keys = Vec::new();
    hash_blocks(b"", &[7; 16], 1, &mut keys);
    let mut cached = seq_of(&pool, 16);
    assert_eq!(cached.publish(&keys), 16);
    let held = 32 + 32 + 40 + 16;
    let references = held + 40;
    assert_eq!(
        first.retire(9) + second.retire(9) + parent.retire(9) + child.retire(9) + cached.retire(9),
        references
    );
    assert_eq!(pool.used_blocks(), held);
    assert_eq!(pool.complete(9), references);
    assert_eq!(pool.cached_blocks(), 16, "the prompt stays cached");
    assert_eq!(pool.evictable_blocks(), 16);
    let mut hit = Sequence::new(Arc::clone(&pool));
    assert_eq!(hit.try_match_prefix(&keys), 16);
    drop(hit);
    assert_eq!(pool.reset_prefix_cache(), 16);
    assert_pool_whole(&pool);
}

#[test]
fn a_fenced_pool_is_full_and_says_how_much_is_available() {
    let pool = Arc::new(BlockPool::new(3, 4));
    let seq = seq_of(&pool, 12);
    seq.retire(9);
    let mut out = Vec::new();
    assert_eq!(
        pool.try_alloc(1, &mut out),
        Err(ReserveError::Full {
            requested: 1,
            available: 0
        })
    );
    assert!(out.is_empty());
    assert_eq!(pool.free_blocks(), 0);
    assert_eq!(pool.used_blocks(), 3);
    assert_eq!(pool.complete(9), 3);
    pool.try_alloc(3, &mut out).unwrap();
    pool.free(&out).unwrap();
    assert_pool_whole(&pool);
}

#[test]
fn completing_an_unknown_or_completed_fence_releases_nothing_and_changes_nothing() {
    let pool = Arc::new(BlockPool::new(4, 4));
    let seq = seq_of(&pool, 8);
    seq.retire(3);
    let before = pool_snap(&pool);
    assert_eq!(pool.complete(4), 0);
    assert_eq!(pool.complete(u64::MAX), 0);
    assert_eq!(pool_snap(&pool), before);
    assert_eq!(pool.pending_release_blocks(), 2);
    assert_eq!(pool.complete(3), 2);
    let after = pool_snap(&pool);
    assert_eq!(pool.complete(3), 0, "a completed fence has nothing left");
    assert_eq!(pool_snap(&pool), after);
    // A retirement after its fence completed waits for the next complete.
    seq_of(&pool, 4).retire(3);
    assert_eq!(pool.used_blocks(), 1);
    assert_eq!(pool.complete(3), 1);
    assert_pool_whole(&pool);
}

#[test]
fn fences_that_share_a_map_are_kept_apart() {
    // Fences 1 and 9 land in the same map (8 maps): completing one must
    // not give back the other's blocks.
    let pool = Arc::new(BlockPool::new(4, 4));
    seq_of(&pool, 4).retire(1);
    seq_of(&pool, 8).retire(9);
    seq_of(&pool, 4).retire(9);
    assert_eq!(pool.pending_release_blocks(), 4);
    assert_eq!(pool.complete(9), 3);
    assert_eq!(pool.used_blocks(), 1);
    assert_eq!(pool.complete(1), 1);
    assert_pool_whole(&pool);
}

#[test]
fn truncate_fenced_keeps_the_dropped_blocks_until_the_fence() {
    let pool = Arc::new(BlockPool::new(5, 4));
    let mut seq = seq_of(&pool, 4 + 12); // 4 blocks
    let dropped: Vec<_> = seq.blocks()[2..].to_vec();
    assert_eq!(seq.truncate_fenced(6, 7), 2);
    assert_eq!((seq.len(), seq.blocks().len()), (6, 2));
    assert_eq!(pool.pending_release_blocks(), 2);
    assert_eq!((pool.used_blocks(), pool.free_blocks()), (4, 1));
    for id in &dropped {
        assert_eq!(pool.ref_count(*id), Some(1));
    }
    // Growing back needs the retired blocks: refused until the fence.
    let snap = seq_snap(&seq);
    assert!(matches!(
        seq.try_append(10),
        Err(ReserveError::Full {
            requested: 2,
            available: 1
        })
    ));
    assert_eq!(seq_snap(&seq), snap);
    assert_eq!(pool.complete(7), 2);
    assert_eq!(seq.try_append(10).unwrap(), 6..16);
    // A no-op truncate (at or past the length) retires nothing.
    let (snap, pool_before) = (seq_snap(&seq), pool_snap(&pool));
    assert_eq!(seq.truncate_fenced(16, 8), 0);
    assert_eq!(seq.truncate_fenced(100, 8), 0);
    assert_eq!((seq_snap(&seq), pool_snap(&pool)), (snap, pool_before));
    assert_eq!(pool.pending_release_blocks(), 0);
    drop(seq);
    assert_pool_whole(&pool);
}

#[test]
fn truncate_fenced_into_a_shared_block_copies_on_write_and_fences_the_source() {
    let pool = Arc::new(BlockPool::new(8, 4));
    let parent = seq_of(&pool, 8);
    let (mut child, _) = parent.try_fork().unwrap();
    let shared = child.blocks()[1];
    // Back into the shared second block, fenced: nothing leaves but the
    // table keeps the shared block, which the next append copies.
    assert_eq!(child.truncate_fenced(6, 1), 0);
    let (range, copy) = child.try_append_cow(1).unwrap();
    assert_eq!(range, 6..7);
    let copy = copy.expect("the shared tail is copied on write");
    assert_eq!(copy.src, shared);
    // The child keeps the copy's source (the parent's reference and its
    // own) until its next shortening truncate, which, fenced, keeps it
    // until the fence.
    assert_eq!(pool.ref_count(shared), Some(2));
    assert_eq!(child.truncate_fenced(5, 2), 0);
    assert_eq!(
        pool.ref_count(shared),
        Some(2),
        "the source waits for fence 2"
    );
    assert_eq!(pool.pending_release_blocks(), 1);
    assert_eq!(pool.complete(2), 1);
    assert_eq!(pool.ref_count(shared), Some(1));
    drop((parent, child));
    assert_pool_whole(&pool);
}

#[test]
fn truncate_fenced_into_a_cached_block_held_alone_drops_its_key() {
    let pool = Arc::new(BlockPool::new(8, 4));
    let mut keys = Vec::new();
    hash_blocks(b"", &[3; 16], 4, &mut keys);
    let mut seq = seq_of(&pool, 16);
    assert_eq!(seq.publish(&keys), 4);
    let tail = seq.blocks()[1];
    assert_eq!(seq.truncate_fenced(6, 4), 2);
    // The tail will be written: its key is gone (no copy needed); the two
    // cached blocks that left stay cached and become evictable at the fence.
    assert!(seq.try_append(1).is_ok());
    assert_eq!(seq.blocks()[1], tail);
    assert_eq!(pool.cached_blocks(), 3);
    assert_eq!(pool.evictable_blocks(), 0, "retired, not yet released");
    assert_eq!(pool.complete(4), 2);
    assert_eq!(pool.evictable_blocks(), 2);
    let mut other = Sequence::new(Arc::clone(&pool));
    assert_eq!(
        other.try_match_prefix(&keys),
        1,
        "the tail's key was dropped"
    );
    drop((seq, other));
    assert_eq!(pool.free_blocks(), 8);
}

#[test]
fn a_retired_cached_block_becomes_evictable_at_its_fence_and_can_be_matched_before() {
    let pool = Arc::new(BlockPool::new(4, 4));
    let mut keys = Vec::new();
    hash_blocks(b"t", &[1; 8], 4, &mut keys);
    let mut seq = seq_of(&pool, 8);
    assert_eq!(seq.publish(&keys), 2);
    seq.retire(5);
    assert_eq!((pool.cached_blocks(), pool.evictable_blocks()), (2, 0));
    assert_eq!(pool.free_blocks(), 2);
    // Reading a retired cached block is sharing it: allowed before the fence.
    let mut reader = Sequence::new(Arc::clone(&pool));
    assert_eq!(reader.try_match_prefix(&keys), 2);
    assert_eq!(pool.complete(5), 2);
    assert_eq!(pool.evictable_blocks(), 0, "the reader holds them");
    drop(reader);
    assert_eq!((pool.evictable_blocks(), pool.free_blocks()), (2, 4));
}

#[test]
fn retire_and_complete_work_on_a_closed_pool() {
    let pool = Arc::new(BlockPool::new(4, 4));
    let mut seq = seq_of(&pool, 16);
    pool.close();
    assert_eq!(seq.truncate_fenced(4, 1), 3);
    assert_eq!(seq.retire(2), 1);
    assert_eq!(pool.complete(2), 1);
    assert_eq!(pool.complete_all(), 3);
    assert_eq!(pool.used_blocks(), 0);
    assert_eq!(pool.pending_release_blocks(), 0);
}

#[test]
fn dropping_the_pool_with_retirements_pending_frees_them() {
    let pool = Arc::new(BlockPool::new(4, 4));
    seq_of(&pool, 16).retire(1);
    let weak = Arc::downgrade(&pool);
    drop(pool);
    assert!(
        weak.upgrade().is_none(),
        "no retirement keeps the pool alive"
    );
}

/// A fence in flight and the ids retired under it.
type InFlight = (u64, Vec<BlockId>);

/// Threads append, truncate fenced and retire sequences under fences of
/// their own "steps", and complete them some steps later, in shuffled
/// order, with other threads completing fences too; an ownership table
/// proves no block is handed out while it is retired (or held). At the end
/// every fence is completed and the pool is whole.
#[test]
fn stress_threads_retire_and_complete_concurrently() {
    const THREADS: u64 = 8;
    const STEPS: u64 = 20_000;
    const BS: usize = 4;
    let pool = Arc::new(BlockPool::with_shards(64, BS, 4));
    // Per block: references the test knows of (live tables plus pending
    // retirements); a hand-out must find 0.
    let refs: Arc<Vec<AtomicU64>> = Arc::new((0..64).map(|_| AtomicU64::new(0)).collect());
    // Fences a thread asks any thread to complete, with what they hold.
    let handoff: Arc<Mutex<Vec<InFlight>>> = Arc::new(Mutex::new(Vec::new()));
    let failed = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (pool, refs, handoff, failed) = (
                Arc::clone(&pool),
                Arc::clone(&refs),
                Arc::clone(&handoff),
                Arc::clone(&failed),
            );
            thread::spawn(move || {
                let mut rng = XorShift::new(t + 1);
                // Retired ids per own in-flight fence, oldest first.
                let mut in_flight: Vec<InFlight> = Vec::new();
                let mut seqs: Vec<Sequence> = Vec::new();
                for step in 0..STEPS {
                    let fence = step * THREADS + t;
                    let mut retired = Vec::new();
                    match rng.below(4) {
                        0 | 1 => {
                            let mut seq = Sequence::new(Arc::clone(&pool));
                            if seq.try_append(1 + rng.below(12)).is_ok() {
                                for id in seq.blocks() {
                                    // Relaxed: only the RMW's atomicity
                                    // matters; the pool orders the owners.
                                    let before = refs[id.index()].fetch_add(1, Ordering::Relaxed);
                                    if before != 0 {
                                        failed.store(true, Ordering::Relaxed);
                                    }
                                }
                                seqs.push(seq);
                            }
                        }
                        2 if seqs.iter().any(|s| !s.is_empty()) => {
                            let i = seqs.iter().position(|s| !s.is_empty()).unwrap();
                            let seq = &mut seqs[i];
                            let len = rng.below(seq.len());
                            let keep = len.div_ceil(BS);
                            retired.extend_from_slice(&seq.blocks()[keep..]);
                            seq.truncate_fenced(len, fence);
                        }
                        _ if !seqs.is_empty() => {
                            let seq = seqs.swap_remove(rng.below(seqs.len()));
                            retired.extend_from_slice(seq.blocks());
                            seq.retire(fence);
                        }
                        _ => {}
                    }
                    in_flight.push((fence, retired));
                    // The device runs up to 3 steps behind; fences complete
                    // out of order, some on another thread.
                    while in_flight.len() > 3 {
                        let (f, ids) = in_flight.remove(rng.below(2));
                        if rng.below(4) == 0 {
                            handoff.lock().unwrap().push((f, ids));
                        } else {
                            for id in &ids {
                                // Relaxed: as above; lowered before the
                                // pool can hand the block out again.
                                refs[id.index()].fetch_sub(1, Ordering::Relaxed);
                            }
                            pool.complete(f);
                        }
                    }
                    let theirs = handoff.lock().unwrap().pop();
                    if let Some((f, ids)) = theirs {
                        for id in &ids {
                            // Relaxed: as above.
                            refs[id.index()].fetch_sub(1, Ordering::Relaxed);
                        }
                        pool.complete(f);
                    }
                }
                for (f, ids) in in_flight {
                    for id in &ids {
                        // Relaxed: as above.
                        refs[id.index()].fetch_sub(1, Ordering::Relaxed);
                    }
                    pool.complete(f);
                }
                for seq in seqs {
                    for id in seq.blocks() {
                        // Relaxed: as above.
                        refs[id.index()].fetch_sub(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    for (f, ids) in handoff.lock().unwrap().drain(..) {
        for id in &ids {
            refs[id.index()].fetch_sub(1, Ordering::Relaxed);
        }
        pool.complete(f);
    }
    assert!(
        !failed.load(Ordering::Relaxed),
        "a block was handed out while retired or held"
    );
    assert!(refs.iter().all(|r| r.load(Ordering::Relaxed) == 0));
    assert_eq!(pool.pending_release_blocks(), 0);
    assert!(pool.peak_pending_release_blocks() > 0);
    assert_pool_whole(&pool);
}
