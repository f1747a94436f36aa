//! Adversarial tests of a sequence's give-back of one run of consecutive
//! fresh blocks (`BlockPool::release`'s fast path, `give_fresh_run`):
//! runs that cross bitmap words, short last words and shard boundaries,
//! truncates into the middle of a run, runs with a counted (forked or
//! published) block inside, lists a forwarding allocator alters, and
//! real-thread churn of sequences beside raw callers and a forking,
//! publishing thread. Every test ends with the pool whole.

mod common;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use common::{assert_pool_whole, XorShift};
use kvslots::{
    BlockAllocator, BlockHash, BlockId, BlockPool, ReserveError, Sequence, SequenceCall,
};

/// Pool shapes whose runs cross words, short last words and shards.
const SHAPES: &[(usize, usize)] = &[
    (64, 1),
    (65, 1),
    (77, 2),
    (129, 2),
    (130, 1),
    (200, 3),
    (1000, 7),
];

/// A pool of `n` one-token blocks over `shards` shards, no prefix cache.
fn plain_pool(n: usize, shards: usize) -> Arc<BlockPool> {
    Arc::new(BlockPool::builder(n, 1).shards(shards).build().unwrap())
}

/// Every block's count is the number of live tables that list it (no
/// prefix cache, no raw holder), and the free count is the rest.
fn assert_counts_match_tables(pool: &BlockPool, seqs: &[Sequence], what: &str) {
    let mut holders: HashMap<BlockId, usize> = HashMap::new();
    for seq in seqs {
        for &id in seq.blocks() {
            *holders.entry(id).or_default() += 1;
        }
    }
    for i in 0..pool.num_blocks() {
        let id = BlockId::new(i as u32);
        let want = holders.get(&id).copied().unwrap_or(0);
        assert_eq!(pool.ref_count(id), Some(want), "{what}: {id}'s count");
    }
    assert_eq!(
        pool.free_blocks(),
        pool.num_blocks() - holders.len(),
        "{what}: free count"
    );
}

/// Random appends, truncates (to any length, so inside fresh runs and
/// words), forks and drops of up to 6 sequences, one thread, every
/// shape: after each step every count matches the tables exactly.
#[test]
fn random_truncates_forks_and_drops_keep_counts_exact() {
    for &(n, shards) in SHAPES {
        let pool = plain_pool(n, shards);
        let mut rng = XorShift::new(0x5eed ^ n as u64 ^ (shards as u64) << 20);
        let mut seqs: Vec<Sequence> = Vec::new();
        for step in 0..600 {
            let what = format!("{n}/{shards} step {step}");
            match rng.below(10) {
                0..=3 if seqs.len() < 6 => {
                    let mut seq = Sequence::new(Arc::clone(&pool));
                    let want = 1 + rng.below(pool.free_blocks().max(1));
                    let _ = seq.try_append(want);
                    seqs.push(seq);
                }
                4 if !seqs.is_empty() => {
                    let i = rng.below(seqs.len());
                    let more = rng.below(pool.free_blocks() + 1);
                    let _ = seqs[i].try_append(more);
                }
                5..=6 if !seqs.is_empty() => {
                    let i = rng.below(seqs.len());
                    let len = rng.below(seqs[i].len() + 1);
                    seqs[i].truncate(len);
                }
                7 if !seqs.is_empty() && seqs.len() < 6 => {
                    let i = rng.below(seqs.len());
                    if let Ok((mut child, _)) = seqs[i].try_fork() {
                        // A fork of part of the table: the child's tail
                        // goes back (counted blocks), the parent's stays.
                        let len = rng.below(child.len() + 1);
                        child.truncate(len);
                        seqs.push(child);
                    }
                }
                _ if !seqs.is_empty() => {
                    let i = rng.below(seqs.len());
                    drop(seqs.swap_remove(i));
                }
                _ => {}
            }
            assert_counts_match_tables(&pool, &seqs, &what);
        }
        seqs.clear();
        assert_pool_whole(&pool);
    }
}

/// A prompt's run with one block in the middle counted (a fork of a
/// one-block slice is not public, so: a fork then the parent truncated
/// and regrown, and a publish of a middle block): the truncate inside
/// the run and the drop give every block back once.
#[test]
fn a_run_with_a_counted_block_inside_goes_back_once() {
    for &(n, shards) in SHAPES {
        let pool = common::one_token_cached_pool(n, shards);
        let take = n.min(150);
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(take).unwrap();
        // Publish the blocks of the first 40 tokens: they are counted and
        // cached; the rest stay fresh.
        let tokens: Vec<u32> = (0..take as u32).collect();
        let keys = common::one_token_keys(b"run", &tokens);
        let cut = 40.min(take);
        seq.publish(&keys[..cut]);
        // A second sequence matches a part of them.
        let mut other = Sequence::new(Arc::clone(&pool));
        let matched = other.try_match_prefix(&keys[..cut / 2]);
        assert_eq!(matched, cut / 2);
        // Truncate to inside the fresh tail, then to inside the cached
        // part (a list of counted and fresh ids), then drop all.
        seq.truncate(take - take / 3);
        seq.truncate(cut / 3);
        drop(other);
        drop(seq);
        assert_eq!(pool.reset_prefix_cache(), cut, "{n}/{shards}");
        assert_pool_whole(&pool);
    }
}

/// A forwarding allocator that alters the lists `release` is given:
/// reversed, split in two calls, or with an out-of-range id appended.
struct Altering {
    inner: BlockPool,
    mode: AtomicUsize,
}

const AS_IS: usize = 0;
const REVERSED: usize = 1;
const SPLIT: usize = 2;
const PAST_END: usize = 3;
const SWAP_ENDS: usize = 4;

impl BlockAllocator for Altering {
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn try_alloc_with_headroom(
        &self,
        by: &SequenceCall<'_>,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        BlockAllocator::try_alloc_with_headroom(&self.inner, by, n, headroom, out)
    }
    fn try_alloc_growth(
        &self,
        by: &SequenceCall<'_>,
        n: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        BlockAllocator::try_alloc_growth(&self.inner, by, n, out)
    }
    fn alloc_with_headroom_blocking(
        &self,
        by: &SequenceCall<'_>,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
        timeout: Option<std::time::Duration>,
    ) -> Result<(), ReserveError> {
        BlockAllocator::alloc_with_headroom_blocking(&self.inner, by, n, headroom, out, timeout)
    }
    fn add_refs(&self, by: &SequenceCall<'_>, ids: &[BlockId]) -> usize {
        BlockAllocator::add_refs(&self.inner, by, ids)
    }
    fn release(&self, by: &SequenceCall<'_>, ids: &[BlockId]) {
        // Relaxed: a switch set on the test's thread.
        match self.mode.load(Ordering::Relaxed) {
            REVERSED => {
                let mut v = ids.to_vec();
                v.reverse();
                BlockAllocator::release(&self.inner, by, &v);
            }
            SPLIT => {
                let mid = ids.len() / 2;
                BlockAllocator::release(&self.inner, by, &ids[mid..]);
                BlockAllocator::release(&self.inner, by, &ids[..mid]);
            }
            PAST_END => {
                let mut v = ids.to_vec();
                v.push(BlockId::new(self.inner.num_blocks() as u32));
                BlockAllocator::release(&self.inner, by, &v);
            }
            SWAP_ENDS => {
                let mut v = ids.to_vec();
                let last = v.len() - 1;
                v.swap(0, last);
                BlockAllocator::release(&self.inner, by, &v);
            }
            _ => BlockAllocator::release(&self.inner, by, ids),
        }
    }
    fn needs_copy(&self, id: BlockId) -> bool {
        BlockAllocator::needs_copy(&self.inner, id)
    }
    fn match_prefix(
        &self,
        by: &SequenceCall<'_>,
        keys: &[BlockHash],
        out: &mut Vec<BlockId>,
    ) -> usize {
        BlockAllocator::match_prefix(&self.inner, by, keys, out)
    }
    fn retire(&self, by: &SequenceCall<'_>, fence: u64, ids: &[BlockId]) -> usize {
        BlockAllocator::retire(&self.inner, by, fence, ids)
    }
}

/// A run altered by the forwarder (reversed, split, its ends swapped) is
/// not one run any more, or is two: every block goes back once all the
/// same; with an id past the end appended the release panics naming it
/// and changes nothing.
#[test]
fn altered_release_lists_give_back_once_or_panic_unchanged() {
    for &(n, shards) in SHAPES {
        for mode in [AS_IS, REVERSED, SPLIT, SWAP_ENDS] {
            let alloc = Arc::new(Altering {
                inner: BlockPool::builder(n, 1).shards(shards).build().unwrap(),
                mode: AtomicUsize::new(mode),
            });
            let mut a = Sequence::new(Arc::clone(&alloc));
            a.try_append(n / 2).unwrap();
            let mut b = Sequence::new(Arc::clone(&alloc));
            b.try_append(n - n / 2).unwrap();
            a.truncate(n / 5);
            assert_eq!(
                alloc.inner.free_blocks(),
                n / 2 - n / 5,
                "{n}/{shards}/{mode}"
            );
            for &id in a.blocks().iter().chain(b.blocks()) {
                assert_eq!(alloc.inner.ref_count(id), Some(1));
            }
            drop(b);
            drop(a);
            assert_pool_whole(&alloc.inner);
        }
        // An id past the end appended to a fresh run.
        let alloc = Arc::new(Altering {
            inner: BlockPool::builder(n, 1).shards(shards).build().unwrap(),
            mode: AtomicUsize::new(AS_IS),
        });
        let mut a = Sequence::new(Arc::clone(&alloc));
        a.try_append(n).unwrap();
        let held = a.blocks().to_vec();
        alloc.mode.store(PAST_END, Ordering::Relaxed);
        let panic = catch_unwind(AssertUnwindSafe(|| a.truncate(n / 3))).expect_err("past end");
        let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("is out of range"), "{n}/{shards}: {msg}");
        assert_eq!(alloc.inner.free_blocks(), 0, "{n}/{shards}: changed");
        for &id in &held {
            assert_eq!(alloc.inner.ref_count(id), Some(1), "{n}/{shards}: {id}");
        }
        // Hand the blocks back as the sequence held them.
        alloc.mode.store(AS_IS, Ordering::Relaxed);
        std::mem::forget(a);
        let mut all = Sequence::new(Arc::clone(&alloc));
        assert!(all.try_append(1).is_err(), "{n}/{shards}: none free");
        drop(all);
    }
}

/// Marks of exclusive holders: 0, or the holder's tag.
struct Marks(Vec<AtomicU32>);

impl Marks {
    fn new(n: usize) -> Marks {
        Marks((0..n).map(|_| AtomicU32::new(0)).collect())
    }
    /// Marks `ids` as `tag`'s; panics if any is another holder's.
    fn take(&self, ids: &[BlockId], tag: u32) {
        for &id in ids {
            // AcqRel: a race between two holders shows as a failed CAS.
            let prev =
                self.0[id.index()].compare_exchange(0, tag, Ordering::AcqRel, Ordering::Acquire);
            if let Err(other) = prev {
                panic!("{id} handed to {tag} while {other} holds it");
            }
        }
    }
    /// Unmarks `ids` (before they are given back).
    fn give(&self, ids: &[BlockId], tag: u32) {
        for &id in ids {
            let prev = self.0[id.index()].swap(0, Ordering::AcqRel);
            assert_eq!(prev, tag, "{id} unmarked by {tag}");
        }
    }
    /// Panics if any of `ids` is an exclusive holder's.
    fn none_held(&self, ids: &[BlockId], who: &str) {
        for &id in ids {
            let t = self.0[id.index()].load(Ordering::Acquire);
            assert_eq!(t, 0, "{who} holds {id} while {t} holds it");
        }
    }
}

/// Sequences of varied prompts on `seq_threads` threads (each mark its
/// blocks as its own: a take of an id another holder has marked fails),
/// a raw `try_alloc`/`free` thread (marked too), and a thread whose
/// sequences fork, publish, match, truncate and reset the prefix cache
/// (checking that none of its blocks is marked). The pool ends whole.
fn churn(n: usize, shards: usize, seq_threads: u32, rounds: usize) {
    // `RUN_ATTACK_ROUNDS` raises the rounds for a longer run.
    let rounds = std::env::var("RUN_ATTACK_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(rounds);
    let pool = common::one_token_cached_pool(n, shards);
    let marks = Marks::new(n);
    let max = (n / (seq_threads as usize + 2)).max(9);
    thread::scope(|s| {
        for t in 1..=seq_threads {
            let (pool, marks) = (&pool, &marks);
            s.spawn(move || {
                let mut rng = XorShift::new(u64::from(t) * 7919);
                let mut seqs: Vec<Sequence> = Vec::new();
                for _ in 0..rounds {
                    match rng.below(6) {
                        0..=2 if seqs.len() < 3 => {
                            let mut seq = Sequence::new(Arc::clone(pool));
                            if seq.try_append(1 + rng.below(max)).is_ok() {
                                marks.take(seq.blocks(), t);
                                seqs.push(seq);
                            }
                        }
                        3 if !seqs.is_empty() => {
                            let i = rng.below(seqs.len());
                            let seq = &mut seqs[i];
                            let len = rng.below(seq.len() + 1);
                            marks.give(&seq.blocks()[len..], t);
                            seq.truncate(len);
                        }
                        4 if !seqs.is_empty() => {
                            let i = rng.below(seqs.len());
                            let seq = &mut seqs[i];
                            let before = seq.blocks().len();
                            if seq.try_append(1 + rng.below(max / 2 + 1)).is_ok() {
                                marks.take(&seq.blocks()[before..], t);
                            }
                        }
                        _ if !seqs.is_empty() => {
                            let seq = seqs.swap_remove(rng.below(seqs.len()));
                            marks.give(seq.blocks(), t);
                            drop(seq);
                        }
                        _ => {}
                    }
                }
                for seq in seqs {
                    marks.give(seq.blocks(), t);
                }
            });
        }
        let raw_tag = seq_threads + 1;
        {
            let (pool, marks) = (&pool, &marks);
            s.spawn(move || {
                let mut rng = XorShift::new(99);
                let mut held: Vec<Vec<BlockId>> = Vec::new();
                for _ in 0..rounds {
                    if held.len() < 3 && rng.below(2) == 0 {
                        let mut out = Vec::new();
                        if pool.try_alloc(1 + rng.below(max), &mut out).is_ok() {
                            marks.take(&out, raw_tag);
                            held.push(out);
                        }
                    } else if !held.is_empty() {
                        let ids = held.swap_remove(rng.below(held.len()));
                        marks.give(&ids, raw_tag);
                        pool.free(&ids).unwrap();
                    }
                }
                for ids in held {
                    marks.give(&ids, raw_tag);
                    pool.free(&ids).unwrap();
                }
            });
        }
        {
            let (pool, marks) = (&pool, &marks);
            s.spawn(move || {
                let mut rng = XorShift::new(4242);
                for i in 1..=(rounds / 3) as u32 {
                    let len = 1 + rng.below(max);
                    let tokens: Vec<u32> = (0..len as u32).map(|x| x + i % 3).collect();
                    let keys = common::one_token_keys(b"churn", &tokens);
                    let mut seq = Sequence::new(Arc::clone(pool));
                    let got = seq.try_match_prefix(&keys);
                    if seq.try_append(len - got).is_err() {
                        continue;
                    }
                    marks.none_held(seq.blocks(), "the forker");
                    if let Ok((mut child, _)) = seq.try_fork() {
                        let cut = rng.below(seq.len() + 1);
                        seq.truncate(cut);
                        if rng.below(2) == 0 {
                            child.publish(&keys);
                        }
                        marks.none_held(child.blocks(), "the fork");
                        let cut = rng.below(child.len() + 1);
                        child.truncate(cut);
                    }
                    marks.none_held(seq.blocks(), "the forker");
                    if rng.below(4) == 0 {
                        seq.publish(&keys[..seq.blocks().len().min(keys.len())]);
                    }
                    if i % 17 == 0 {
                        pool.reset_prefix_cache();
                    }
                }
            });
        }
    });
    pool.reset_prefix_cache();
    assert_pool_whole(&pool);
}

#[test]
fn sequences_raw_callers_and_a_forker_churn_two_threads() {
    churn(200, 3, 1, 3000);
}

#[test]
fn sequences_raw_callers_and_a_forker_churn_four_threads() {
    churn(1000, 7, 3, 3000);
}

#[test]
fn sequences_raw_callers_and_a_forker_churn_eight_threads() {
    churn(130, 1, 6, 2000);
}

/// Hybrid sequences (a full group and a sliding window) and plain ones on
/// two threads each append, truncate (plain and fenced, into fresh runs),
/// fork and drop, while a third completes fences; the pool ends whole.
#[test]
fn hybrid_and_fenced_give_backs_race_completions() {
    use kvslots::{HybridSequence, KvGroup, KvGroups};
    let pool = common::one_token_cached_pool(700, 2);
    let groups =
        KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 12 }]).unwrap();
    let fence = AtomicUsize::new(1);
    let done = AtomicUsize::new(0);
    thread::scope(|s| {
        for t in 0..2u64 {
            let (pool, groups, fence, done) = (&pool, &groups, &fence, &done);
            s.spawn(move || {
                let mut rng = XorShift::new(31 + t);
                let mut hy: Vec<HybridSequence> = Vec::new();
                let mut seqs: Vec<Sequence> = Vec::new();
                let mut ops = 0;
                for _ in 0..3000 {
                    let f = fence.load(Ordering::Relaxed) as u64;
                    if rng.below(32) == 0 {
                        pool.complete(f.saturating_sub(1));
                    }
                    match rng.below(8) {
                        0 if hy.len() < 3 => {
                            let mut h = HybridSequence::new(Arc::clone(pool), groups.clone());
                            let _ = h.try_append(1 + rng.below(40));
                            hy.push(h);
                        }
                        1 if !hy.is_empty() => {
                            let i = rng.below(hy.len());
                            let len = rng.below(hy[i].len() + 1);
                            if rng.below(2) == 0 {
                                let _ = hy[i].truncate_fenced(len, f);
                            } else {
                                let _ = hy[i].truncate(len);
                            }
                            if hy[i].len() < 50 {
                                let _ = hy[i].try_append(rng.below(20));
                            }
                        }
                        2 if !hy.is_empty() && hy.len() < 3 => {
                            let i = rng.below(hy.len());
                            if let Ok(c) = hy[i].try_fork(&mut Vec::new()) {
                                hy.push(c);
                            }
                        }
                        3 if seqs.len() < 3 => {
                            let mut q = Sequence::new(Arc::clone(pool));
                            let _ = q.try_append(1 + rng.below(40));
                            seqs.push(q);
                        }
                        4 if !seqs.is_empty() => {
                            let i = rng.below(seqs.len());
                            let len = rng.below(seqs[i].len() + 1);
                            seqs[i].truncate_fenced(len, f);
                            if seqs[i].len() < 50 {
                                let _ = seqs[i].try_append(rng.below(20));
                            }
                        }
                        5 if !seqs.is_empty() => {
                            let i = rng.below(seqs.len());
                            let len = rng.below(seqs[i].len() + 1);
                            seqs[i].truncate(len);
                        }
                        6 if !hy.is_empty() => drop(hy.swap_remove(rng.below(hy.len()))),
                        _ if !seqs.is_empty() => {
                            let q = seqs.swap_remove(rng.below(seqs.len()));
                            if rng.below(2) == 0 {
                                q.retire(f);
                            }
                        }
                        _ => continue,
                    }
                    ops += 1;
                }
                assert!(ops > 1000, "{t}: {ops} steps");
                done.fetch_add(1, Ordering::Release);
            });
        }
        let (pool, fence, done) = (&pool, &fence, &done);
        s.spawn(move || {
            while done.load(Ordering::Acquire) < 2 {
                // The fence the threads retire to now, then (a step
                // later) any a late retire still named.
                let f = fence.fetch_add(1, Ordering::Relaxed) as u64;
                pool.complete(f);
                if f % 8 == 0 {
                    pool.complete_all();
                }
                thread::yield_now();
            }
        });
    });
    pool.complete_all();
    assert_eq!(pool.pending_release_blocks(), 0);
    pool.reset_prefix_cache();
    assert_pool_whole(&pool);
}
