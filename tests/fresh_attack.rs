//! Adversarial tests of fresh blocks (a sequence's take of 8 or more
//! blocks, held through uncounted references marked in the free list's
//! fresh bitmap): raw calls on them, tables that mix counted and fresh
//! blocks (a match, a rival's publish, a small take, a fork, a hybrid
//! window's recycle), truncates into a fresh run, fences, and real-thread
//! races of raw checks against the lazy count of a fork or a publish.
//! Every test ends with the pool whole: every block free, no reference
//! left, every id handed out once.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;

use common::{assert_pool_whole, XorShift};
use kvslots::{
    hash_blocks, BlockHash, BlockId, BlockPool, FreeError, HybridSequence, KvGroup, KvGroups,
    Sequence,
};

/// A pool of `n` one-token blocks over `shards` shards, prefix cache on.
fn pool(n: usize, shards: usize) -> Arc<BlockPool> {
    common::one_token_cached_pool(n, shards)
}

/// The keys of `tokens` in one-token blocks.
fn keys(tokens: &[u32]) -> Vec<BlockHash> {
    common::one_token_keys(b"fresh", tokens)
}

/// Every raw call on every block of `ids`, which sequences (or fences)
/// hold `holders` references to, is refused as a sequence's, and changes
/// nothing.
fn assert_sequences_hold(pool: &BlockPool, ids: &[BlockId], holders: usize) {
    common::assert_sequences_hold(pool, ids, holders);
}

#[test]
fn raw_calls_on_fresh_blocks_are_refused_at_shard_and_word_boundaries() {
    // 200 blocks over 3 shards: spans of 67 (not a multiple of 64), so
    // shard 0's second word holds 3 ids and the last shard 66.
    for &(n, shards, takes) in &[
        (200usize, 3usize, &[8usize, 67, 64, 61][..]),
        (130, 1, &[63, 9, 58]),
        (64, 1, &[8, 8, 48]),
    ] {
        let pool = pool(n, shards);
        let mut seqs = Vec::new();
        for &k in takes {
            let mut seq = Sequence::new(Arc::clone(&pool));
            seq.try_append(k).unwrap();
            assert_sequences_hold(&pool, seq.blocks(), 1);
            seqs.push(seq);
        }
        assert_eq!(pool.free_blocks(), n - takes.iter().sum::<usize>());
        // A raw caller's blocks beside them are its own.
        let mut raw = Vec::new();
        pool.try_alloc(pool.free_blocks(), &mut raw).unwrap();
        for &id in &raw {
            assert_eq!(pool.ref_count(id), Some(1));
        }
        // Raw free of a list that mixes raw blocks and a fresh one is
        // refused whole.
        let fresh = seqs[0].blocks()[3];
        let mut mixed = raw.clone();
        mixed.push(fresh);
        assert_eq!(
            pool.free(&mixed),
            Err(FreeError::HeldBySequence { id: fresh })
        );
        pool.free(&raw).unwrap();
        // Dropped on other threads.
        thread::scope(|s| {
            for seq in seqs.drain(..) {
                s.spawn(move || drop(seq));
            }
        });
        assert_pool_whole(&pool);
    }
}

#[test]
fn a_publish_that_loses_to_a_rival_leaves_earlier_blocks_fresh_and_held() {
    let pool = pool(300, 3);
    let a_tokens: Vec<u32> = (0..25).collect();
    let a_keys = keys(&a_tokens);
    // A: 5 counted blocks (a small take), then 20 fresh; publishes all.
    let mut a = Sequence::new(Arc::clone(&pool));
    a.try_append(5).unwrap();
    a.try_append(20).unwrap();
    assert_eq!(a.publish(&a_keys), 25);
    // Cached: the key's claim aside, one holder each.
    assert_sequences_hold(&pool, a.blocks(), 1);

    // B shares A's first 20 tokens, then goes its own way.
    let b_tokens: Vec<u32> = (0..20).chain(1000..1010).collect();
    let b_keys = keys(&b_tokens);
    let mut b = Sequence::new(Arc::clone(&pool));
    assert_eq!(b.try_match_prefix(&b_keys[..10]), 10);
    // 20 fresh blocks: 10 whose keys A holds, then 10 new ones.
    b.try_append(20).unwrap();
    assert_eq!(b.len(), 30);
    let b_ids = b.blocks().to_vec();
    assert_eq!(&b_ids[..10], &a.blocks()[..10]);
    assert_sequences_hold(&pool, &b_ids[..10], 2);
    assert_sequences_hold(&pool, &b_ids[10..], 1);
    // Blocks 10..20 lose to A's; 20..30 are claimed (counted lazily):
    // 10..20 stay fresh before them.
    let published = b.publish(&b_keys);
    assert_eq!(published, 10, "only B's own keys are new");
    assert_sequences_hold(&pool, &b_ids[10..], 1);

    // A fork shares them all: each of B's own blocks has 2 holders.
    let (c, copy) = b.try_fork().unwrap();
    assert!(copy.is_none());
    assert_eq!(c.blocks(), &b_ids[..]);
    assert_sequences_hold(&pool, &b_ids[..10], 3);
    assert_sequences_hold(&pool, &b_ids[10..], 2);

    // A matcher of B's own keys finds blocks 20..30 (and A's for 10..20).
    let mut d = Sequence::new(Arc::clone(&pool));
    assert_eq!(d.try_match_prefix(&b_keys), 30);
    assert_eq!(&d.blocks()[20..], &b_ids[20..]);
    assert_eq!(&d.blocks()[10..20], &a.blocks()[10..20]);

    // Truncates into the middle of the (now counted) run, then drops in
    // an order that leaves the fork's child last, on another thread.
    b.truncate(15);
    drop(a);
    drop(d);
    assert_sequences_hold(&pool, &b_ids[..15], 2);
    assert_sequences_hold(&pool, &b_ids[15..], 1);
    drop(b);
    thread::spawn(move || drop(c)).join().unwrap();
    assert_eq!(pool.reset_prefix_cache(), 35);
    assert_pool_whole(&pool);
}

#[test]
fn truncate_into_a_fresh_run_then_regrow_reserve_and_shrink() {
    let pool = pool(200, 3);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(40).unwrap();
    let first = seq.blocks().to_vec();
    assert_eq!(seq.truncate(13), 27);
    assert_eq!(pool.free_blocks(), 200 - 13);
    for &id in &first[13..] {
        assert_eq!(pool.ref_count(id), Some(0), "{id} given back");
    }
    assert_sequences_hold(&pool, seq.blocks(), 1);
    // The blocks given back are free, not fresh: a raw take holds them
    // as its own.
    let mut raw = Vec::new();
    pool.try_alloc(pool.free_blocks(), &mut raw).unwrap();
    for &id in &first[13..] {
        assert!(raw.contains(&id));
        assert_eq!(pool.ref_count(id), Some(1));
    }
    pool.free(&raw).unwrap();
    // Small (counted) and large (fresh) takes after a truncate.
    seq.try_append(3).unwrap();
    seq.try_append(20).unwrap();
    // Reserve ahead, append part of it, shrink.
    seq.try_reserve(30, 0).unwrap();
    assert_eq!(seq.capacity(), 66);
    seq.try_append(5).unwrap();
    assert_eq!(seq.shrink_to_fit(), 25);
    assert_eq!(seq.blocks().len(), 41);
    assert_sequences_hold(&pool, seq.blocks(), 1);
    let (child, _) = seq.try_fork().unwrap();
    assert_sequences_hold(&pool, seq.blocks(), 2);
    // Truncate the parent into the middle: the shared blocks stay held.
    seq.truncate(20);
    assert_sequences_hold(&pool, &child.blocks()[..20], 2);
    assert_sequences_hold(&pool, &child.blocks()[20..], 1);
    drop(child);
    assert_sequences_hold(&pool, seq.blocks(), 1);
    drop(seq);
    assert_pool_whole(&pool);
}

#[test]
fn fenced_fresh_blocks_are_held_until_their_fence_completes() {
    let pool = pool(200, 3);
    let mut a = Sequence::new(Arc::clone(&pool));
    a.try_append(30).unwrap();
    let a_ids = a.blocks().to_vec();
    assert_eq!(a.truncate_fenced(10, 1), 20);
    assert_sequences_hold(&pool, &a_ids, 1);
    let mut b = Sequence::new(Arc::clone(&pool));
    b.try_append(70).unwrap();
    let b_ids = b.blocks().to_vec();
    assert_eq!(b.retire(2), 70);
    assert_eq!(a.retire(2), 10);
    assert_sequences_hold(&pool, &a_ids, 1);
    assert_sequences_hold(&pool, &b_ids, 1);
    assert_eq!(pool.pending_release_blocks(), 100);
    // Fence 2 completes on another thread first.
    let p = Arc::clone(&pool);
    assert_eq!(thread::spawn(move || p.complete(2)).join().unwrap(), 80);
    assert_sequences_hold(&pool, &a_ids[10..], 1);
    assert_eq!(pool.complete(1), 20);
    assert_pool_whole(&pool);
}

#[test]
fn hybrid_window_recycles_fresh_blocks_and_forks_them() {
    let pool = pool(256, 3);
    let groups =
        KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 16 }]).unwrap();
    let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    // Chunks of 12: each takes 8 or more blocks (fresh) and slides the
    // window, whose blocks are recycled into the full group's table.
    let mut forks = Vec::new();
    for round in 0..8 {
        seq.try_append(12).unwrap();
        if round % 3 == 1 {
            let mut copies = Vec::new();
            forks.push(seq.try_fork(&mut copies).unwrap());
        }
        for g in 0..2 {
            let held = seq.blocks(g).unwrap().to_vec();
            for id in held.into_iter().filter(|&id| id != BlockId::NULL) {
                let refs = pool.ref_count(id).unwrap();
                assert!(refs >= 1, "{id} of group {g}: ref_count 0");
                assert_eq!(
                    pool.free(&[id]),
                    Err(FreeError::HeldBySequence { id }),
                    "round {round}: {id}"
                );
            }
        }
    }
    seq.truncate(90).unwrap();
    let p = Arc::clone(&pool);
    let h = thread::spawn(move || {
        drop(forks);
        p.used_blocks()
    });
    h.join().unwrap();
    drop(seq);
    assert_pool_whole(&pool);
}

/// A raw observer checks a sequence's blocks while their holder counts
/// them lazily (a fork's add, a publish's claim) and a third thread takes
/// and gives back blocks of the same bitmap words: each check reads the
/// blocks as a sequence's, held (`ref_count >= 1`, raw `free` and
/// `add_refs` refused as `HeldBySequence`), never free.
#[test]
fn raw_checks_racing_the_lazy_count_see_a_held_block() {
    const ROUNDS: usize = 3000;
    let pool = pool(200, 3);
    let ids = Mutex::new(Vec::<BlockId>::new());
    let ready = AtomicUsize::new(0);
    let counted = AtomicUsize::new(0);
    let acked = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let checks = AtomicUsize::new(0);
    thread::scope(|s| {
        // The holder.
        s.spawn(|| {
            let mut rng = XorShift::new(7);
            for r in 1..=ROUNDS {
                let mut seq = Sequence::new(Arc::clone(&pool));
                if r % 3 == 0 {
                    seq.try_append(1 + rng.below(7)).unwrap();
                }
                seq.try_append(8 + rng.below(60)).unwrap();
                *ids.lock().unwrap() = seq.blocks().to_vec();
                // Release (test code): the take above happens-before the
                // checker's calls of round `r`.
                ready.store(r, Ordering::Release);
                // The lazy count, while the observer checks.
                let tokens: Vec<u32> = (0..seq.len() as u32)
                    .map(|t| t + 10_000 * r as u32)
                    .collect();
                let (fork, fenced) = match r % 4 {
                    0 => (Some(seq.try_fork().unwrap().0), None),
                    1 => {
                        seq.publish(&keys(&tokens));
                        (None, None)
                    }
                    2 => {
                        let child = seq.try_fork().unwrap().0;
                        seq.publish(&keys(&tokens));
                        (Some(child), None)
                    }
                    _ => {
                        // Retired under a fence: held on its behalf.
                        let fence = r as u64;
                        seq.truncate_fenced(seq.len() / 2, fence);
                        (None, Some(fence))
                    }
                };
                counted.store(r, Ordering::Release);
                // Acquire (test code): the checker's calls of round `r`
                // happen-before the next change.
                common::wait_until(|| acked.load(Ordering::Acquire) == r);
                drop(fork);
                drop(seq);
                if let Some(fence) = fenced {
                    pool.complete(fence);
                }
            }
            // Release (test code): ends the checker's loop; orders nothing it
            // reads.
            stop.store(true, Ordering::Release);
        });
        // The observer.
        s.spawn(|| {
            for r in 1..=ROUNDS {
                common::wait_until(|| ready.load(Ordering::Acquire) == r);
                let held = ids.lock().unwrap().clone();
                loop {
                    let last = counted.load(Ordering::Acquire) == r;
                    for &id in &held {
                        assert!(
                            pool.ref_count(id).unwrap() >= 1,
                            "round {r}: {id} held throughout reads 0"
                        );
                        assert_eq!(
                            pool.free(&[id]),
                            Err(FreeError::HeldBySequence { id }),
                            "round {r}: raw free of a held {id}"
                        );
                        assert_eq!(
                            pool.add_refs(&[id]),
                            Err(FreeError::HeldBySequence { id }),
                            "round {r}: raw add_refs of a held {id}"
                        );
                        // Relaxed (test code): a count read after the threads
                        // are joined.
                        checks.fetch_add(1, Ordering::Relaxed);
                    }
                    if last {
                        break;
                    }
                }
                // Release (test code): this round's checks happen-before the
                // owner's next change.
                acked.store(r, Ordering::Release);
            }
        });
        // The churner: takes (fresh and counted) and gives back in the
        // same words.
        s.spawn(|| {
            let mut rng = XorShift::new(11);
            let mut held: Vec<Sequence> = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let mut seq = Sequence::new(Arc::clone(&pool));
                if seq.try_append(1 + rng.below(40)).is_ok() {
                    held.push(seq);
                }
                if held.len() > 2 || rng.below(2) == 0 {
                    let i = rng.below(held.len().max(1));
                    if i < held.len() {
                        let mut seq = held.swap_remove(i);
                        let keep = rng.below(seq.len() + 1);
                        seq.truncate(keep);
                    }
                }
            }
        });
    });
    // Relaxed (test code): the threads are joined.
    assert!(checks.load(Ordering::Relaxed) >= ROUNDS * 8);
    assert_pool_whole(&pool);
}

/// Holders per block as the test counts them: a take raises 0 to 1 (a
/// block handed out while the test counts a holder was handed to two
/// owners), a fork adds one per shared block, a give-back lowers them
/// before the call that gives the blocks back.
struct Holders(Vec<AtomicUsize>);

impl Holders {
    fn new(n: usize) -> Holders {
        Holders((0..n).map(|_| AtomicUsize::new(0)).collect())
    }

    fn taken(&self, ids: &[BlockId], who: &str) {
        for &id in ids {
            // AcqRel/Acquire (test code): a block's shadow count passes between
            // threads with the block, which the pool's own orderings hand over;
            // these only make the counts' reads exact.
            let prev =
                self.0[id.index()].compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire);
            assert_eq!(prev, Ok(0), "{who}: {id} handed out while held");
        }
    }

    fn shared(&self, ids: &[BlockId]) {
        for &id in ids.iter().filter(|&&id| id != BlockId::NULL) {
            // AcqRel (test code): as in `taken`.
            assert!(self.0[id.index()].fetch_add(1, Ordering::AcqRel) >= 1);
        }
    }

    fn released(&self, ids: &[BlockId]) {
        for &id in ids.iter().filter(|&&id| id != BlockId::NULL) {
            assert!(
                // AcqRel (test code): as in `taken`.
                self.0[id.index()].fetch_sub(1, Ordering::AcqRel) >= 1,
                "{id}"
            );
        }
    }
}

/// Appends `n` tokens to `seq` (one-token blocks), counting the blocks
/// taken.
fn append(seq: &mut Sequence, n: usize, holders: &Holders, who: &str) -> bool {
    let before = seq.blocks().len();
    if seq.try_append(n).is_err() {
        assert_eq!(
            seq.blocks().len(),
            before,
            "{who}: a refused append took blocks"
        );
        return false;
    }
    holders.taken(&seq.blocks()[before..], who);
    true
}

/// Sequences in threads take 8 or more blocks (fresh) and fewer
/// (counted) from the same words, fork, truncate into fresh runs, retire
/// under fences completed later, and hand sequences to another thread to
/// drop; a raw thread takes and frees its own blocks and tries raw calls
/// on every other block. No block is handed to two owners, a raw call
/// never frees or shares a block it does not hold, a held block never
/// reads 0 references, and the pool ends whole.
#[test]
fn fresh_and_counted_takes_share_words_without_double_handouts() {
    const STEPS: usize = 20000;
    // 3 shards of 134 ids: each shard's third word holds 6.
    const N: usize = 402;
    let pool = Arc::new(BlockPool::with_shards(N, 1, 3));
    let holders = Holders::new(N);
    // Bounded: a thread that hands over a sequence waits for the dropper
    // to take it, so that the sequences in flight stay few.
    let (to_dropper, dropped) = mpsc::sync_channel::<Sequence>(1);
    let fences = AtomicUsize::new(1);
    let fresh_takes = AtomicUsize::new(0);
    thread::scope(|s| {
        let holders = &holders;
        let fences = &fences;
        let fresh_takes = &fresh_takes;
        s.spawn(move || {
            for seq in dropped {
                holders.released(seq.blocks());
                drop(seq);
            }
        });
        for t in 0..2u64 {
            let to_dropper = to_dropper.clone();
            let pool = &pool;
            s.spawn(move || {
                let who = format!("thread {t}");
                let mut rng = XorShift::new(100 + t);
                let mut seqs: Vec<Sequence> = Vec::new();
                let mut fenced: Vec<(usize, Vec<BlockId>)> = Vec::new();
                for step in 0..STEPS {
                    let op = if fenced.len() > 2 {
                        9
                    } else if seqs.len() > 3
                        || seqs.iter().map(|s| s.blocks().len()).sum::<usize>() > 100
                    {
                        8
                    } else {
                        rng.below(10)
                    };
                    match op {
                        0..=3 => {
                            let mut seq = Sequence::new(Arc::clone(pool));
                            let n = if rng.below(2) == 0 {
                                8 + rng.below(40)
                            } else {
                                1 + rng.below(7)
                            };
                            if append(&mut seq, n, holders, &who) {
                                if n >= 8 {
                                    // Relaxed (test code): a count read after
                                    // the threads are joined.
                                    fresh_takes.fetch_add(1, Ordering::Relaxed);
                                }
                                seqs.push(seq);
                            }
                        }
                        4 if !seqs.is_empty() => {
                            let i = rng.below(seqs.len());
                            let n = 1 + rng.below(if seqs[i].len() < 60 { 20 } else { 2 });
                            append(&mut seqs[i], n, holders, &who);
                        }
                        5 if !seqs.is_empty() => {
                            let i = rng.below(seqs.len());
                            if let Ok((child, _)) = seqs[i].try_fork() {
                                holders.shared(child.blocks());
                                seqs.push(child);
                            }
                        }
                        6 if !seqs.is_empty() => {
                            let i = rng.below(seqs.len());
                            let seq = &mut seqs[i];
                            let keep = rng.below(seq.len() + 1);
                            holders.released(&seq.blocks()[keep..]);
                            seq.truncate(keep);
                        }
                        7 if !seqs.is_empty() => {
                            let i = rng.below(seqs.len());
                            let seq = &mut seqs[i];
                            let keep = rng.below(seq.len() + 1);
                            // Relaxed (test code): only unique fence numbers.
                            let fence = fences.fetch_add(1, Ordering::Relaxed);
                            let tail = seq.blocks()[keep..].to_vec();
                            seq.truncate_fenced(keep, fence as u64);
                            fenced.push((fence, tail));
                        }
                        8 if !seqs.is_empty() => {
                            let seq = seqs.swap_remove(rng.below(seqs.len()));
                            to_dropper.send(seq).unwrap();
                        }
                        _ if !fenced.is_empty() => {
                            let (fence, tail) = fenced.swap_remove(rng.below(fenced.len()));
                            for &id in &tail {
                                assert!(pool.ref_count(id).unwrap() >= 1, "{who}: fenced {id}");
                            }
                            holders.released(&tail);
                            pool.complete(fence as u64);
                        }
                        _ => {}
                    }
                    // Every block this thread holds is held.
                    if step % 16 == 0 {
                        for seq in &seqs {
                            for &id in seq.blocks() {
                                assert!(pool.ref_count(id).unwrap() >= 1, "{who}: {id} reads 0");
                                assert_eq!(
                                    pool.free(&[id]),
                                    Err(FreeError::HeldBySequence { id }),
                                    "{who}: raw free of its {id}"
                                );
                            }
                        }
                    }
                }
                for (fence, tail) in fenced {
                    holders.released(&tail);
                    pool.complete(fence as u64);
                }
                for seq in seqs {
                    to_dropper.send(seq).unwrap();
                }
            });
        }
        drop(to_dropper);
        // The raw thread.
        let pool = &pool;
        s.spawn(move || {
            let mut rng = XorShift::new(999);
            let mut own: Vec<BlockId> = Vec::new();
            for _ in 0..STEPS {
                if own.len() < 16 {
                    let mut got = Vec::new();
                    if pool.try_alloc(1 + rng.below(4), &mut got).is_ok() {
                        holders.taken(&got, "raw");
                        own.extend(got);
                    }
                }
                for &id in &own {
                    assert_eq!(pool.ref_count(id), Some(1), "raw: its own {id}");
                }
                let id = BlockId::new(rng.below(N) as u32);
                if !own.contains(&id) {
                    // No other raw caller: the block is free, or a
                    // sequence's (fresh or counted), or on its way between.
                    for (call, got) in [("free", pool.free(&[id])), ("add_refs", pool.add_refs(&[id]))] {
                        assert!(
                            matches!(
                                got,
                                Err(FreeError::NotAllocated { id: i } | FreeError::HeldBySequence { id: i }) if i == id
                            ),
                            "raw {call} of {id}, not its own: {got:?}"
                        );
                    }
                }
                if !own.is_empty() && rng.below(3) == 0 {
                    let id = own.swap_remove(rng.below(own.len()));
                    holders.released(&[id]);
                    pool.free(&[id]).unwrap();
                }
            }
            holders.released(&own);
            pool.free(&own).unwrap();
        });
    });
    // Relaxed (test code): the threads are joined.
    assert!(holders.0.iter().all(|h| h.load(Ordering::Relaxed) == 0));
    assert_eq!(pool.pending_release_blocks(), 0);
    assert_pool_whole(&pool);
    // Relaxed (test code): the threads are joined.
    let fresh_takes = fresh_takes.load(Ordering::Relaxed);
    assert!(fresh_takes >= STEPS / 10, "{fresh_takes} fresh takes");
}

/// A sequence whose fresh blocks come before counted ones that a matcher
/// shares (its first blocks lost their keys to a rival's, its later ones
/// were claimed) gives the fresh ones back one by one after the shared
/// ones (the drop's slow path), each once, their fresh bits cleared: a
/// raw take and free of every block afterwards leaves no reference.
#[test]
fn fresh_blocks_before_shared_ones_go_back_once_through_the_slow_path() {
    for shards in [1, 3] {
        let pool = pool(190, shards);
        let a_tokens: Vec<u32> = (0..10).collect();
        let mut a = Sequence::new(Arc::clone(&pool));
        a.try_append(10).unwrap();
        assert_eq!(a.publish(&keys(&a_tokens)), 10);
        // B: one take of 30 fresh blocks, its first 10 tokens A's.
        let b_tokens: Vec<u32> = (0..10).chain(500..520).collect();
        let b_keys = keys(&b_tokens);
        let mut b = Sequence::new(Arc::clone(&pool));
        b.try_append(30).unwrap();
        let b_ids = b.blocks().to_vec();
        assert_eq!(b.publish(&b_keys), 20);
        let mut m = Sequence::new(Arc::clone(&pool));
        assert_eq!(m.try_match_prefix(&b_keys), 30);
        assert_eq!(&m.blocks()[10..], &b_ids[10..]);
        assert_sequences_hold(&pool, &b_ids[..10], 1);
        assert_sequences_hold(&pool, &b_ids[10..], 2);
        let free_before = pool.free_blocks();
        drop(b);
        assert_eq!(pool.free_blocks(), free_before + 10);
        for &id in &b_ids[..10] {
            assert_eq!(pool.ref_count(id), Some(0), "{id} given back");
        }
        assert_sequences_hold(&pool, &b_ids[10..], 1);
        // Every free block raw-taken and freed: none reads held after.
        let mut raw = Vec::new();
        pool.try_alloc(pool.free_blocks(), &mut raw).unwrap();
        for &id in &b_ids[..10] {
            assert!(raw.contains(&id));
        }
        pool.free(&raw).unwrap();
        for &id in &raw {
            assert_eq!(pool.ref_count(id), Some(0), "{id}: a fresh bit left set");
        }
        drop(m);
        drop(a);
        assert_eq!(pool.reset_prefix_cache(), 30);
        assert_pool_whole(&pool);
    }
}

/// Threads prefill, publish (against rivals: the prompts share a few
/// system prefixes), match, fork and drop sequences whose tables mix
/// matched, counted and fresh blocks, while another thread resets the
/// prefix cache; every sequence's blocks read held by raw checks while it
/// holds them, and the pool ends whole.
#[test]
fn publishes_matches_forks_and_resets_race_on_fresh_blocks() {
    const STEPS: usize = 3000;
    let pool = pool(334, 3);
    let stop = AtomicBool::new(false);
    let fresh_publishes = AtomicUsize::new(0);
    thread::scope(|s| {
        let mut workers = Vec::new();
        for t in 0..2u64 {
            let pool = &pool;
            let fresh_publishes = &fresh_publishes;
            workers.push(s.spawn(move || {
                let mut rng = XorShift::new(40 + t);
                let mut seqs: Vec<Sequence> = Vec::new();
                for step in 0..STEPS {
                    // A prompt: one of 3 system prefixes, then a tail of
                    // one of 4 users.
                    let sys = rng.below(3) as u32;
                    let user = rng.below(4) as u32;
                    let len = 8 + rng.below(40);
                    let tokens: Vec<u32> = (0..len as u32)
                        .map(|i| {
                            if i < 12 {
                                sys * 100 + i
                            } else {
                                10_000 + user * 100 + i
                            }
                        })
                        .collect();
                    let prompt = keys(&tokens);
                    match rng.below(6) {
                        0 | 1 => {
                            let mut seq = Sequence::new(Arc::clone(pool));
                            let hit = if rng.below(2) == 0 {
                                seq.try_match_prefix(&prompt)
                            } else {
                                0
                            };
                            if seq.try_append(len - hit).is_ok() {
                                if len - hit >= 8 {
                                    // Relaxed (test code): a count read after
                                    // the threads are joined.
                                    fresh_publishes.fetch_add(1, Ordering::Relaxed);
                                }
                                seq.publish(&prompt);
                                seqs.push(seq);
                            }
                        }
                        2 if !seqs.is_empty() => {
                            let i = rng.below(seqs.len());
                            if let Ok((child, _)) = seqs[i].try_fork() {
                                seqs.push(child);
                            }
                        }
                        3 if !seqs.is_empty() => {
                            let i = rng.below(seqs.len());
                            let keep = rng.below(seqs[i].len() + 1);
                            seqs[i].truncate(keep);
                            if seqs[i].try_append(8 + rng.below(10)).is_ok() && rng.below(2) == 0 {
                                let (child, _) = match seqs[i].try_fork() {
                                    Ok(f) => f,
                                    Err(_) => continue,
                                };
                                seqs.push(child);
                            }
                        }
                        _ => {
                            if !seqs.is_empty() {
                                let seq = seqs.swap_remove(rng.below(seqs.len()));
                                if rng.below(2) == 0 {
                                    thread::spawn(move || drop(seq)).join().unwrap();
                                }
                            }
                        }
                    }
                    while seqs.len() > 4 {
                        seqs.swap_remove(0);
                    }
                    if step % 8 == 0 {
                        for seq in &seqs {
                            for &id in seq.blocks() {
                                assert!(pool.ref_count(id).unwrap() >= 1, "{id} reads 0");
                                assert_eq!(
                                    pool.free(&[id]),
                                    Err(FreeError::HeldBySequence { id }),
                                    "raw free of a held {id}"
                                );
                            }
                        }
                    }
                }
            }));
        }
        s.spawn(|| {
            // Acquire (test code): pairs with the stop's Release; ends the
            // loop.
            while !stop.load(Ordering::Acquire) {
                pool.reset_prefix_cache();
                thread::yield_now();
            }
        });
        for w in workers {
            w.join().unwrap();
        }
        // Release (test code): ends the checker's loop after the workers' last
        // calls.
        stop.store(true, Ordering::Release);
    });
    // Relaxed (test code): the threads are joined.
    assert!(fresh_publishes.load(Ordering::Relaxed) >= STEPS / 10);
    pool.reset_prefix_cache();
    assert_pool_whole(&pool);
}

/// A fork that finds no block for its private tail fails and changes
/// nothing: the parent's fresh blocks read held (counted by the failed
/// fork or not), and everything goes back once.
#[test]
fn a_failed_fork_of_fresh_blocks_leaves_them_held_and_whole() {
    // Blocks of 4 slots: 34 tokens are 9 blocks (one take, fresh), the
    // last partial.
    let pool = Arc::new(
        BlockPool::builder(64, 4)
            .shards(2)
            .prefix_cache(true)
            .build()
            .unwrap(),
    );
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(34).unwrap();
    let ids = seq.blocks().to_vec();
    assert_eq!(ids.len(), 9);
    let mut raw = Vec::new();
    pool.try_alloc(pool.free_blocks(), &mut raw).unwrap();
    assert!(seq.try_fork().is_err());
    assert_sequences_hold(&pool, &ids, 1);
    pool.free(&raw).unwrap();
    // Now it fits: the child copies the tail, shares the rest.
    let (mut child, copy) = seq.try_fork().unwrap();
    assert!(copy.is_some());
    assert_sequences_hold(&pool, &ids[..8], 2);
    assert_sequences_hold(&pool, &ids[8..], 1);
    // The child's append writes its own tail; the parent's copy-on-write
    // append needs no copy (its tail is its own).
    child.try_append(40).unwrap();
    assert!(!seq.append_needs_copy());
    seq.try_append(2).unwrap();
    assert_sequences_hold(&pool, &ids[..8], 2);
    drop(seq);
    assert_sequences_hold(&pool, &ids[..8], 1);
    thread::spawn(move || drop(child)).join().unwrap();
    assert_pool_whole(&pool);
}

/// Every block `seq` holds (its null entries aside) reads held by the raw
/// calls.
fn assert_hybrid_held(pool: &BlockPool, seq: &HybridSequence) {
    for g in 0..seq.groups().len() {
        for &id in seq.blocks(g).unwrap() {
            if id == BlockId::NULL {
                continue;
            }
            assert!(pool.ref_count(id).unwrap() >= 1, "group {g}: {id} reads 0");
            assert_eq!(
                pool.free(&[id]),
                Err(FreeError::HeldBySequence { id }),
                "group {g}: raw free of a held {id}"
            );
        }
    }
}

/// Hybrid sequences (a full group and a sliding window) prefill in chunks
/// of 8 or more (fresh blocks spread over the groups), publish against
/// each other, match, fork, slide their windows (recycling fresh blocks
/// into the full group's table) and retire under fences, on two threads;
/// their blocks read held throughout and the pool ends whole.
#[test]
fn hybrid_sequences_race_on_fresh_blocks() {
    const STEPS: usize = 1500;
    let pool = pool(402, 3);
    let groups =
        KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 12 }]).unwrap();
    let completed = Mutex::new(Vec::<u64>::new());
    let (made, forked) = (AtomicUsize::new(0), AtomicUsize::new(0));
    thread::scope(|s| {
        for t in 0..2u64 {
            let (pool, groups, completed) = (&pool, &groups, &completed);
            let (made, forked) = (&made, &forked);
            s.spawn(move || {
                let mut rng = XorShift::new(70 + t);
                let mut seqs: Vec<HybridSequence> = Vec::new();
                let mut fence = (t + 1) << 40;
                for step in 0..STEPS {
                    let sys = rng.below(2) as u32;
                    let len = 8 + rng.below(30);
                    let tokens: Vec<u32> = (0..len as u32)
                        .map(|i| {
                            if i < 10 {
                                sys * 100 + i
                            } else {
                                5000 + (t as u32) * 1000 + i
                            }
                        })
                        .collect();
                    let mut base = Vec::new();
                    hash_blocks(b"", &tokens, 1, &mut base);
                    let keys = groups.keys(&base);
                    match rng.below(6) {
                        0 | 1 => {
                            let mut seq = HybridSequence::new(Arc::clone(pool), groups.clone());
                            let hit = if rng.below(2) == 0 {
                                seq.try_match_prefix(&keys).unwrap()
                            } else {
                                0
                            };
                            let mut ok = true;
                            let mut at = hit;
                            while ok && at < len {
                                let chunk = (8 + rng.below(8)).min(len - at);
                                ok = seq.try_append(chunk).is_ok();
                                at += chunk;
                            }
                            if ok {
                                // Relaxed (test code): a count read after the
                                // threads are joined.
                                made.fetch_add(1, Ordering::Relaxed);
                                let _ = seq.publish(&keys);
                                seqs.push(seq);
                            }
                        }
                        2 if !seqs.is_empty() => {
                            let i = rng.below(seqs.len());
                            let mut copies = Vec::new();
                            if let Ok(child) = seqs[i].try_fork(&mut copies) {
                                // Relaxed (test code): a count read after the
                                // threads are joined.
                                forked.fetch_add(1, Ordering::Relaxed);
                                seqs.push(child);
                            }
                        }
                        3 if !seqs.is_empty() => {
                            let i = rng.below(seqs.len());
                            fence += 1;
                            if seqs[i]
                                .try_append_fenced(8 + rng.below(8), fence, &mut Vec::new())
                                .is_ok()
                            {
                                completed.lock().unwrap().push(fence);
                            } else {
                                pool.complete(fence);
                            }
                        }
                        4 if !seqs.is_empty() => {
                            let i = rng.below(seqs.len());
                            let len = seqs[i].len();
                            let _ = seqs[i].truncate(len - rng.below(4).min(len));
                        }
                        _ => {
                            if !seqs.is_empty() {
                                let seq = seqs.swap_remove(rng.below(seqs.len()));
                                if rng.below(2) == 0 {
                                    thread::spawn(move || drop(seq)).join().unwrap();
                                }
                            }
                            let done: Vec<u64> = std::mem::take(&mut *completed.lock().unwrap());
                            for f in done {
                                pool.complete(f);
                            }
                        }
                    }
                    while seqs.len() > 3 {
                        seqs.swap_remove(0);
                    }
                    if step % 4 == 0 {
                        for seq in &seqs {
                            assert_hybrid_held(pool, seq);
                        }
                    }
                }
            });
        }
    });
    for f in std::mem::take(&mut *completed.lock().unwrap()) {
        pool.complete(f);
    }
    assert_eq!(pool.complete_all(), 0);
    let (made, forked) = (made.into_inner(), forked.into_inner());
    assert!(
        made >= STEPS / 5 && forked >= STEPS / 20,
        "{made} made, {forked} forked"
    );
    pool.reset_prefix_cache();
    assert_pool_whole(&pool);
}

/// One take of 50 for a sequence from a pool with 34 free blocks and 30
/// evictable ones: 34 fresh from the free list, 16 evicted (counted). The
/// table mixes them; a publish, a truncate into the middle, a fork and
/// the drops keep every block held while it is, and the pool whole.
#[test]
fn a_take_that_evicts_mixes_fresh_and_counted_blocks() {
    let pool = pool(64, 1);
    let a_tokens: Vec<u32> = (0..30).collect();
    let mut a = Sequence::new(Arc::clone(&pool));
    a.try_append(30).unwrap();
    assert_eq!(a.publish(&keys(&a_tokens)), 30);
    drop(a);
    assert_eq!((pool.free_blocks(), pool.evictable_blocks()), (64, 30));
    let mut b = Sequence::new(Arc::clone(&pool));
    b.try_append(50).unwrap();
    assert_eq!(pool.evictable_blocks(), 14, "16 evicted");
    let ids = b.blocks().to_vec();
    assert_sequences_hold(&pool, &ids, 1);
    let b_tokens: Vec<u32> = (900..950).collect();
    assert_eq!(b.publish(&keys(&b_tokens)), 50);
    assert_sequences_hold(&pool, &ids, 1);
    b.truncate(25);
    let (c, _) = b.try_fork().unwrap();
    assert_sequences_hold(&pool, &ids[..25], 2);
    for &id in &ids[25..] {
        assert_eq!(pool.ref_count(id), Some(0), "{id} given back (evictable)");
    }
    drop(b);
    assert_sequences_hold(&pool, &ids[..25], 1);
    thread::spawn(move || drop(c)).join().unwrap();
    pool.reset_prefix_cache();
    assert_pool_whole(&pool);

    // The same without a publish: the fresh and evicted blocks go back
    // through the drop's runs.
    let mut a = Sequence::new(Arc::clone(&pool));
    a.try_append(30).unwrap();
    assert_eq!(a.publish(&keys(&a_tokens)), 30);
    drop(a);
    let mut b = Sequence::new(Arc::clone(&pool));
    b.try_append(50).unwrap();
    let ids = b.blocks().to_vec();
    assert_sequences_hold(&pool, &ids, 1);
    b.truncate(17);
    for &id in &ids[17..] {
        assert_eq!(pool.ref_count(id), Some(0));
    }
    drop(b);
    assert_eq!(pool.reset_prefix_cache(), 14);
    assert_pool_whole(&pool);
}

/// Two threads take 32 fresh blocks each from one 64-block word and give
/// them back (drop, truncate into the run), over and over, while a raw
/// thread frees, shares and counts every block of the word: each raw
/// call is refused as `NotAllocated` or `HeldBySequence` (never done, never
/// another error), `ref_count` reads 0 or 1, and the pool ends whole.
#[test]
fn raw_calls_hammer_a_word_of_fresh_takes_and_give_backs() {
    const ROUNDS: usize = 20_000;
    let pool = Arc::new(BlockPool::new(64, 1));
    let done = AtomicUsize::new(0);
    let (held_seen, free_seen) = (AtomicUsize::new(0), AtomicUsize::new(0));
    thread::scope(|s| {
        for t in 0..2u64 {
            let (pool, done) = (&pool, &done);
            let (held_seen, free_seen) = (&held_seen, &free_seen);
            s.spawn(move || {
                let mut rng = XorShift::new(300 + t);
                // At least ROUNDS, and on until the raw thread has seen
                // blocks both held and free (however the threads run).
                let mut round = 0;
                while round < ROUNDS
                    || held_seen.load(Ordering::Relaxed) < 1000
                    || free_seen.load(Ordering::Relaxed) < 1000
                {
                    round += 1;
                    let mut seq = Sequence::new(Arc::clone(pool));
                    seq.try_append(8 + rng.below(25)).unwrap();
                    if rng.below(2) == 0 {
                        let keep = rng.below(seq.len());
                        seq.truncate(keep);
                    }
                    if rng.below(4) == 0 {
                        let (child, _) = seq.try_fork().unwrap();
                        drop(seq);
                        drop(child);
                    }
                }
                // Release (test code): this worker's calls happen-before the
                // checker's end.
                done.fetch_add(1, Ordering::Release);
            });
        }
        s.spawn(|| {
            let mut rng = XorShift::new(301);
            let (held_seen, free_seen) = (&held_seen, &free_seen);
            // Acquire (test code): pairs with the workers' Release; ends the
            // loop.
            while done.load(Ordering::Acquire) < 2 {
                let id = BlockId::new(rng.below(64) as u32);
                for (call, got) in [
                    ("free", pool.free(&[id])),
                    ("add_refs", pool.add_refs(&[id])),
                ] {
                    match got {
                        Err(FreeError::NotAllocated { id: e }) if e == id => {
                            // Relaxed (test code): a count read after the
                            // threads are joined.
                            free_seen.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(FreeError::HeldBySequence { id: e }) if e == id => {
                            // Relaxed (test code): a count read after the
                            // threads are joined.
                            held_seen.fetch_add(1, Ordering::Relaxed);
                        }
                        other => panic!("raw {call} of {id}: {other:?}"),
                    }
                }
                let count = pool.ref_count(id).unwrap();
                assert!(count <= 2, "{id}: ref_count {count}");
            }
        });
    });
    assert!(held_seen.into_inner() >= 1000 && free_seen.into_inner() >= 1000);
    assert_pool_whole(&pool);
}

/// A sequence that waits (`reserve_blocking`) for blocks that another
/// sequence holds fresh is granted them when that one is dropped on its
/// thread, and takes them fresh in turn: they read held by it, and go back
/// once.
#[test]
fn a_waiter_granted_blocks_given_back_fresh_takes_them_fresh() {
    let pool = Arc::new(BlockPool::with_shards(100, 1, 3));
    for round in 0..50 {
        let mut holder = Sequence::new(Arc::clone(&pool));
        holder.try_append(90).unwrap();
        let held = holder.blocks().to_vec();
        thread::scope(|s| {
            let waiter = s.spawn(|| {
                let mut seq = Sequence::new(Arc::clone(&pool));
                seq.reserve_blocking(40, 0, None).unwrap();
                assert_sequences_hold(&pool, seq.blocks(), 1);
                seq.try_append(40).unwrap();
                seq
            });
            common::wait_until(|| pool.waiters() == 1 || waiter.is_finished());
            assert_sequences_hold(&pool, &held, 1);
            drop(holder);
            let seq = waiter.join().unwrap();
            assert_eq!(seq.blocks().len(), 40, "round {round}");
            assert_sequences_hold(&pool, seq.blocks(), 1);
        });
    }
    assert_pool_whole(&pool);
}

/// With KV events on, a publish of fresh blocks (some losing their keys
/// to a rival's) reports exactly the blocks it cached, and their eviction
/// exactly those keys; nothing is reported of the blocks left fresh.
#[test]
fn kv_events_report_exactly_the_fresh_blocks_a_publish_caches() {
    let pool = Arc::new(
        BlockPool::builder(128, 1)
            .shards(2)
            .prefix_cache(true)
            .kv_events(1024)
            .build()
            .unwrap(),
    );
    let a_tokens: Vec<u32> = (0..12).collect();
    let mut a = Sequence::new(Arc::clone(&pool));
    a.try_append(12).unwrap();
    assert_eq!(a.publish(&keys(&a_tokens)), 12);
    let b_tokens: Vec<u32> = (0..12).chain(40..60).collect();
    let b_keys = keys(&b_tokens);
    let mut b = Sequence::new(Arc::clone(&pool));
    b.try_append(32).unwrap();
    let b_ids = b.blocks().to_vec();
    assert_eq!(b.publish(&b_keys), 20);
    let mut events = Vec::new();
    pool.drain_events(&mut events);
    let mut stored: Vec<(BlockHash, BlockId)> = Vec::new();
    for e in &events {
        if let kvslots::KvEvent::BlockStored {
            keys, block_ids, ..
        } = e
        {
            stored.extend(keys.iter().copied().zip(block_ids.iter().copied()));
        }
    }
    let expected: Vec<(BlockHash, BlockId)> = keys(&a_tokens)
        .into_iter()
        .zip(a.blocks().iter().copied())
        .chain(
            b_keys[12..]
                .iter()
                .copied()
                .zip(b_ids[12..].iter().copied()),
        )
        .collect();
    let (mut got, mut want) = (stored.clone(), expected.clone());
    got.sort_by_key(|&(_, id)| id);
    want.sort_by_key(|&(_, id)| id);
    assert_eq!(got, want, "stored events");
    assert_sequences_hold(&pool, &b_ids[..12], 1);
    drop((a, b));
    assert_eq!(pool.reset_prefix_cache(), 32);
    events.clear();
    pool.drain_events(&mut events);
    let mut removed: Vec<BlockHash> = Vec::new();
    for e in &events {
        match e {
            kvslots::KvEvent::BlockRemoved { keys, .. } => removed.extend(keys.iter().copied()),
            kvslots::KvEvent::AllBlocksCleared => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    for k in &removed {
        assert!(
            expected.iter().any(|(e, _)| e == k),
            "removed a key never stored"
        );
    }
    if !events
        .iter()
        .any(|e| matches!(e, kvslots::KvEvent::AllBlocksCleared))
    {
        removed.sort();
        let mut want: Vec<BlockHash> = expected.iter().map(|&(k, _)| k).collect();
        want.sort();
        assert_eq!(removed, want, "removed events");
    }
    assert_pool_whole(&pool);
}

/// A sequence in [`ref_counts_match_a_shadow_of_holders`], with its tokens.
struct Shadowed {
    seq: Sequence,
    tokens: Vec<u32>,
    uid: u32,
}

/// Token `p` of a prompt of family `f` (shared for the first 20
/// positions, the sequence's own after).
fn token(f: u32, uid: u32, p: u32) -> u32 {
    if p < 20 {
        f * 1000 + p
    } else {
        100_000 + uid * 1000 + p
    }
}

/// One thread, random calls (takes of every size, matches, publishes
/// against rivals, forks, truncates, fences, reservations and shrinks,
/// raw takes and frees, resets): after every call each block's
/// `ref_count` equals the number of holders the test counts (sequence
/// tables, fences' lists, the raw caller's list), and the blocks no one
/// holds are refused by a raw free as `NotAllocated`.
#[test]
fn ref_counts_match_a_shadow_of_holders() {
    for seed in 0..4 {
        shadow_run(seed);
    }
}

/// One run of [`ref_counts_match_a_shadow_of_holders`].
fn shadow_run(seed: u64) {
    const N: usize = 150;
    let pool = pool(N, 2);
    let mut rng = XorShift::new(2024 + seed);
    let (mut fresh_takes, mut forks, mut cached) = (0, 0, 0);
    let mut seqs: Vec<Shadowed> = Vec::new();
    let mut fenced: Vec<(u64, Vec<BlockId>)> = Vec::new();
    let mut raw: Vec<BlockId> = Vec::new();
    let (mut next_fence, mut next_uid) = (1u64, 0u32);
    for step in 0..2500 {
        let op = rng.below(12);
        match op {
            0..=2 => {
                next_uid += 1;
                let (f, uid) = (rng.below(4) as u32, next_uid);
                let len = 1 + rng.below(40);
                let prompt: Vec<u32> = (0..len as u32).map(|p| token(f, uid, p)).collect();
                let mut seq = Sequence::new(Arc::clone(&pool));
                let hit = if rng.below(2) == 0 {
                    seq.try_match_prefix(&keys(&prompt))
                } else {
                    0
                };
                if seq.try_append(len - hit).is_ok() {
                    fresh_takes += usize::from(len - hit >= 8);
                    if rng.below(2) == 0 {
                        cached += seq.publish(&keys(&prompt));
                    }
                    seqs.push(Shadowed {
                        seq,
                        tokens: prompt,
                        uid,
                    });
                }
            }
            3 if !seqs.is_empty() => {
                let pick = rng.below(seqs.len());
                let s = &mut seqs[pick];
                let n = 1 + rng.below(20);
                let start = s.tokens.len() as u32;
                if s.seq.try_append(n).is_ok() {
                    let f = s.tokens.first().map_or(0, |t| t / 1000 % 100);
                    s.tokens
                        .extend((start..start + n as u32).map(|p| token(f, s.uid, p)));
                }
            }
            4 if !seqs.is_empty() => {
                let i = rng.below(seqs.len());
                if let Ok((child, _)) = seqs[i].seq.try_fork() {
                    forks += 1;
                    let tokens = seqs[i].tokens.clone();
                    let uid = seqs[i].uid;
                    seqs.push(Shadowed {
                        seq: child,
                        tokens,
                        uid,
                    });
                }
            }
            5 if !seqs.is_empty() => {
                let pick = rng.below(seqs.len());
                let s = &mut seqs[pick];
                cached += s.seq.publish(&keys(&s.tokens));
            }
            6 if !seqs.is_empty() => {
                let pick = rng.below(seqs.len());
                let s = &mut seqs[pick];
                let keep = rng.below(s.tokens.len() + 1);
                s.seq.truncate(keep);
                s.tokens.truncate(keep);
            }
            7 if !seqs.is_empty() => {
                let pick = rng.below(seqs.len());
                let s = &mut seqs[pick];
                let keep = rng.below(s.tokens.len() + 1);
                let tail = s.seq.blocks()[keep..].to_vec();
                s.seq.truncate_fenced(keep, next_fence);
                s.tokens.truncate(keep);
                fenced.push((next_fence, tail));
                next_fence += 1;
            }
            8 if !seqs.is_empty() => {
                let pick = rng.below(seqs.len());
                let s = &mut seqs[pick];
                if s.seq.try_reserve(8 + rng.below(20), 0).is_ok() {
                    let n = rng.below(10);
                    let start = s.tokens.len() as u32;
                    if s.seq.try_append(n).is_ok() {
                        let f = s.tokens.first().map_or(0, |t| t / 1000 % 100);
                        s.tokens
                            .extend((start..start + n as u32).map(|p| token(f, s.uid, p)));
                    }
                    s.seq.shrink_to_fit();
                }
            }
            9 if !fenced.is_empty() => {
                let (f, _) = fenced.swap_remove(rng.below(fenced.len()));
                pool.complete(f);
            }
            10 => {
                if raw.len() < 10 && rng.below(2) == 0 {
                    let _ = pool.try_alloc(1 + rng.below(10), &mut raw);
                } else if !raw.is_empty() {
                    let k = rng.below(raw.len()) + 1;
                    let gone: Vec<BlockId> = raw.drain(..k).collect();
                    pool.free(&gone).unwrap();
                }
            }
            _ => {
                if !seqs.is_empty() && rng.below(3) > 0 {
                    seqs.swap_remove(rng.below(seqs.len()));
                } else {
                    pool.reset_prefix_cache();
                }
            }
        }
        while seqs.len() > 6 {
            seqs.swap_remove(0);
        }
        // The shadow: holders per block.
        let mut holders = vec![0usize; N];
        for s in &seqs {
            assert!(s.seq.blocks().len() >= s.tokens.len());
            for &id in s.seq.blocks() {
                holders[id.index()] += 1;
            }
        }
        for (_, tail) in &fenced {
            for &id in tail {
                holders[id.index()] += 1;
            }
        }
        for &id in &raw {
            holders[id.index()] += 1;
        }
        for (i, &h) in holders.iter().enumerate() {
            let id = BlockId::new(i as u32);
            assert_eq!(pool.ref_count(id), Some(h), "step {step} (op {op}): {id}");
            if h == 0 {
                assert_eq!(
                    pool.free(&[id]),
                    Err(FreeError::NotAllocated { id }),
                    "step {step} (op {op}): {id} held by no one"
                );
            }
        }
        assert_eq!(
            pool.used_blocks(),
            holders.iter().filter(|&&h| h > 0).count(),
            "step {step} (op {op}): used blocks"
        );
    }
    drop(seqs);
    for (f, _) in fenced {
        pool.complete(f);
    }
    pool.free(&raw).unwrap();
    pool.reset_prefix_cache();
    assert_pool_whole(&pool);
    assert!(
        fresh_takes > 100 && forks > 100 && cached > 200,
        "seed {seed}: {fresh_takes} fresh takes, {forks} forks, {cached} blocks cached"
    );
}
