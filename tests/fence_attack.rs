//! Fenced release under real threads: completed fences give back runs of
//! fresh blocks a bitmap word at a time (`FreeList::give_fresh_run`) and
//! any other list block by block, while sequences take, fork, publish,
//! match, truncate fenced and retire, other threads complete the same
//! fences at once, and raw calls misuse retired blocks. Every take is
//! checked against a side table of owners; at quiescence every reference
//! retired was given back once and the pool is whole.
//!
//! Iterations scale with `FENCE_ATTACK_ITERS` (default 1).

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::{assert_pool_whole, XorShift};
use kvslots::{hash_blocks, BlockHash, BlockId, BlockPool, FreeError, Sequence};

/// Decrements its counter when dropped (also when its thread panics, so
/// that the threads that wait on the counter stop).
struct Dec<'a>(&'a AtomicUsize);
impl Drop for Dec<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}
/// Adds one to its counter when dropped.
struct Inc<'a>(&'a AtomicUsize);
impl Drop for Inc<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

fn iters(base: usize) -> usize {
    let k: usize = std::env::var("FENCE_ATTACK_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    base * k.max(1)
}

fn pool(n: usize, bs: usize, shards: usize) -> Arc<BlockPool> {
    Arc::new(
        BlockPool::builder(n, bs)
            .shards(shards)
            .prefix_cache(true)
            .build()
            .unwrap(),
    )
}

/// Pools of several sizes and shard counts (spans not multiples of 64,
/// last words partial, shard boundaries inside runs).
const CONFIGS: &[(usize, usize)] = &[
    (64, 1),
    (100, 1),
    (130, 2),
    (200, 3),
    (256, 4),
    (300, 7),
    (1000, 5),
    (129, 2),
];

/// Misuse: a raw free / add_refs of a block held through a fence must be
/// refused with HeldBySequence and change nothing.
fn assert_misuse_refused(pool: &BlockPool, id: BlockId) {
    let before = pool.ref_count(id);
    assert_eq!(
        pool.free(&[id]),
        Err(FreeError::HeldBySequence { id }),
        "free {id}"
    );
    assert_eq!(
        pool.add_refs(&[id]),
        Err(FreeError::HeldBySequence { id }),
        "add {id}"
    );
    assert_eq!(pool.ref_count(id), before, "{id} changed by a refused call");
}

// ---------------------------------------------------------------------------
// 1. Deterministic: adjacent fresh runs of several sequences under one fence
// ---------------------------------------------------------------------------

/// Fills the pool with sequences of these sizes (consecutive runs, many of
/// them fresh), retires them all under one fence in take order (one long
/// run in the fence's list, across words and shards), with truncate_fenced
/// tails, empty sequences, forks and cached blocks mixed in by `mix`.
fn adjacent_runs_one_fence(n: usize, shards: usize, sizes: &[usize], mix: u32, reverse: bool) {
    let bs = 1;
    let pool = pool(n, bs, shards);
    let mut seqs = Vec::new();
    let mut i = 0;
    loop {
        let want = sizes[i % sizes.len()];
        i += 1;
        let take = want.min(pool.free_blocks());
        if take == 0 {
            break;
        }
        let mut s = Sequence::new(Arc::clone(&pool));
        s.try_append(take).unwrap();
        seqs.push(s);
    }
    assert_eq!(pool.free_blocks(), 0);
    let all: Vec<BlockId> = seqs.iter().flat_map(|s| s.blocks().to_vec()).collect();
    assert_eq!(all.len(), n);
    assert_eq!(all.iter().copied().collect::<HashSet<_>>().len(), n);
    let mut refs = 0;
    let mut extra = Vec::new();
    if mix & 1 != 0 {
        // A fork of the second sequence: its blocks shared (counted).
        if seqs.len() > 2 {
            let (child, copy) = seqs[1].try_fork().unwrap();
            assert!(copy.is_none());
            extra.push(child);
        }
    }
    if mix & 2 != 0 && seqs.len() > 3 {
        // The fourth sequence publishes its blocks (counted, cached).
        let len = seqs[3].len();
        let toks: Vec<u32> = (0..len as u32).map(|t| t + 77).collect();
        let mut keys = Vec::new();
        hash_blocks(b"adj", &toks, bs, &mut keys);
        assert_eq!(seqs[3].publish(&keys), len);
    }
    let fence = 5;
    if mix & 4 != 0 {
        // Partial tails of every other sequence go under the same fence
        // first (so the list starts with tails, not in take order).
        for s in seqs.iter_mut().step_by(2) {
            let len = s.len();
            if len > 1 {
                refs += s.truncate_fenced(len / 2, fence);
            }
        }
    }
    // Empty sequences retired under the fence, and under unused fences.
    refs += Sequence::new(Arc::clone(&pool)).retire(fence);
    assert_eq!(Sequence::new(Arc::clone(&pool)).retire(99), 0);
    if reverse {
        seqs.reverse();
    }
    for s in seqs {
        refs += s.retire(fence);
        refs += Sequence::new(Arc::clone(&pool)).retire(fence);
    }
    for c in extra {
        refs += c.retire(fence);
    }
    assert_eq!(pool.pending_release_blocks(), refs);
    assert_eq!(pool.used_blocks(), n);
    assert_eq!(pool.free_blocks(), 0);
    for &id in &all {
        assert!(
            matches!(pool.ref_count(id), Some(1) | Some(2)),
            "{id}: {:?}",
            pool.ref_count(id)
        );
        assert_misuse_refused(&pool, id);
    }
    assert_eq!(pool.complete(99), 0);
    assert_eq!(pool.complete(fence + 8), 0, "same fence shard, other fence");
    assert_eq!(pool.complete(fence), refs, "{n}/{shards} mix {mix}");
    assert_eq!(pool.complete(fence), 0, "double complete");
    assert_eq!(pool.complete_all(), 0);
    assert_eq!(pool.pending_release_blocks(), 0);
    for &id in &all {
        assert_eq!(pool.ref_count(id), Some(0), "{id} back after its fence");
    }
    pool.reset_prefix_cache();
    assert_pool_whole(&pool);
}

#[test]
fn adjacent_fresh_runs_of_many_sequences_under_one_fence() {
    let size_sets: &[&[usize]] = &[
        &[64],
        &[32, 32],
        &[8, 56, 8, 56],
        &[13, 51, 9, 70],
        &[9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9],
        &[100, 28, 3, 5, 8],
        &[130],
        &[1, 2, 8, 200],
    ];
    for &(n, shards) in CONFIGS {
        for sizes in size_sets {
            for mix in 0..8 {
                for reverse in [false, true] {
                    adjacent_runs_one_fence(n, shards, sizes, mix, reverse);
                }
            }
        }
    }
}

/// Fresh runs whose fence list is one run and then a duplicate id (a fork
/// of a one-block sequence adjacent to it): not a run, must fall back.
#[test]
fn fence_list_that_is_a_run_plus_a_shared_duplicate() {
    for &(n, shards) in CONFIGS {
        let pool = pool(n, 1, shards);
        let mut a = Sequence::new(Arc::clone(&pool));
        a.try_append(16).unwrap();
        let (b, _) = a.try_fork().unwrap();
        let ids = a.blocks().to_vec();
        assert_eq!(a.retire(3) + b.retire(3), 32);
        for &id in &ids {
            assert_eq!(pool.ref_count(id), Some(2));
            assert_misuse_refused(&pool, id);
        }
        // A list mixing a raw block and a retired one: refused as a whole,
        // the raw block untouched.
        let mut raw = Vec::new();
        pool.try_alloc(1, &mut raw).unwrap();
        let (r, x) = (raw[0], ids[5]);
        assert_eq!(pool.free(&[r, x]), Err(FreeError::HeldBySequence { id: x }));
        assert_eq!(
            pool.add_refs(&[r, x]),
            Err(FreeError::HeldBySequence { id: x })
        );
        assert_eq!(
            pool.free(&[x, x, x]),
            Err(FreeError::HeldBySequence { id: x })
        );
        assert_eq!((pool.ref_count(r), pool.ref_count(x)), (Some(1), Some(2)));
        assert_eq!(pool.complete(3), 32);
        assert_eq!(pool.free(&[r, x]), Err(FreeError::NotAllocated { id: x }));
        assert_eq!(pool.ref_count(r), Some(1));
        pool.free(&raw).unwrap();
        assert_pool_whole(&pool);
        // A truncate_fenced piece and the rest retired: the list is the
        // tail then the head (one run only if reordered).
        let mut c = Sequence::new(Arc::clone(&pool));
        c.try_append(40.min(n)).unwrap();
        let len = c.len();
        assert_eq!(c.truncate_fenced(len - 10, 4), 10);
        assert_eq!(c.retire(4), len - 10);
        assert_eq!(pool.complete(4), len);
        assert_pool_whole(&pool);
    }
}

// ---------------------------------------------------------------------------
// Ownership side table
// ---------------------------------------------------------------------------

const FENCED: u64 = 1 << 63;
const FENCES: usize = 6;

/// Who holds each block, as the test sees it: 0 (no one), an owner's tag,
/// or FENCED | fence << 32 | (completes of that fence ended before the
/// retire). A take that finds a fenced block is legal only if a complete
/// of its fence started since (else the pool handed out a block before its
/// fence could have completed).
struct Owners {
    slot: Vec<AtomicU64>,
    started: Vec<AtomicU64>,
    ended: Vec<AtomicU64>,
}

impl Owners {
    fn new(n: usize) -> Owners {
        Owners {
            slot: (0..n).map(|_| AtomicU64::new(0)).collect(),
            started: (0..FENCES).map(|_| AtomicU64::new(0)).collect(),
            ended: (0..FENCES).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn take(&self, id: BlockId, owner: u64, what: &str) {
        let s = &self.slot[id.index()];
        let mut cur = s.load(SeqCst);
        loop {
            let ok = cur == 0
                || (cur & FENCED != 0 && {
                    let f = ((cur >> 32) & 0x7fff_ffff) as usize;
                    self.started[f].load(SeqCst) > (cur & 0xffff_ffff)
                });
            assert!(
                ok,
                "{what}: {id} handed to owner {owner:#x} while held by {cur:#x} \
                 (fenced: {}, fence {}, stamp {})",
                cur & FENCED != 0,
                (cur >> 32) & 0x7fff_ffff,
                cur & 0xffff_ffff
            );
            match s.compare_exchange(cur, owner, SeqCst, SeqCst) {
                Ok(_) => return,
                Err(v) => cur = v,
            }
        }
    }

    fn fence(&self, id: BlockId, owner: u64, f: usize) {
        // The completes of `f` that had ended before the retire: a complete
        // that gives the retirement back ends after it, and started before
        // the give-back, so a legal take sees started > this stamp.
        let s0 = self.ended[f].load(SeqCst);
        let r = self.slot[id.index()].compare_exchange(
            owner,
            FENCED | (f as u64) << 32 | s0,
            SeqCst,
            SeqCst,
        );
        assert_eq!(r, Ok(owner), "fence of {id} by {owner:#x}");
    }

    fn release(&self, id: BlockId, owner: u64) {
        let r = self.slot[id.index()].compare_exchange(owner, 0, SeqCst, SeqCst);
        assert_eq!(r, Ok(owner), "release of {id} by {owner:#x}");
    }

    fn start_complete(&self, f: usize) {
        self.started[f].fetch_add(1, SeqCst);
    }

    fn end_complete(&self, f: usize) {
        self.ended[f].fetch_add(1, SeqCst);
    }
}

/// A sequence (and maybe its fork) and the blocks the test tracks as taken
/// for it (matched blocks are not tracked: others may hold them).
struct Family {
    seqs: Vec<Sequence>,
    tracked: Vec<BlockId>,
    owner: u64,
    forked: bool,
    published: bool,
    matched: bool,
}

impl Family {
    fn new(pool: &Arc<BlockPool>, owner: u64) -> Family {
        Family {
            seqs: vec![Sequence::new(Arc::clone(pool))],
            tracked: Vec::new(),
            owner,
            forked: false,
            published: false,
            matched: false,
        }
    }

    /// Tracks the blocks of seq `i` not in `before`.
    fn track_new(&mut self, owners: &Owners, i: usize, before: &[BlockId], what: &str) {
        let old: HashSet<BlockId> = before.iter().copied().collect();
        let known: HashSet<BlockId> = self.tracked.iter().copied().collect();
        for &id in self.seqs[i].blocks() {
            if !old.contains(&id) && !known.contains(&id) {
                owners.take(id, self.owner, what);
                self.tracked.push(id);
            }
        }
    }
}

struct Shared {
    pool: Arc<BlockPool>,
    owners: Owners,
    retired: AtomicUsize,
    completed: AtomicUsize,
    workers_left: AtomicUsize,
    keys: Vec<Vec<BlockHash>>,
}

impl Shared {
    fn new(n: usize, bs: usize, shards: usize, workers: usize) -> Shared {
        let keys = (0..4u32)
            .map(|k| {
                let toks: Vec<u32> = (0..(24 * bs) as u32).map(|t| t * 7 + k).collect();
                let mut out = Vec::new();
                hash_blocks(b"att", &toks, bs, &mut out);
                out
            })
            .collect();
        Shared {
            pool: pool(n, bs, shards),
            owners: Owners::new(n),
            retired: AtomicUsize::new(0),
            completed: AtomicUsize::new(0),
            workers_left: AtomicUsize::new(workers),
            keys,
        }
    }

    fn complete(&self, f: usize) {
        self.owners.start_complete(f);
        let n = self.pool.complete(f as u64);
        self.owners.end_complete(f);
        self.completed.fetch_add(n, SeqCst);
    }

    fn complete_all(&self) {
        for f in 0..FENCES {
            self.owners.start_complete(f);
        }
        let n = self.pool.complete_all();
        for f in 0..FENCES {
            self.owners.end_complete(f);
        }
        self.completed.fetch_add(n, SeqCst);
    }

    /// Ends a family: dropped, or retired under fence `f`.
    fn end(&self, fam: Family, f: Option<usize>) {
        let Family {
            seqs,
            tracked,
            owner,
            ..
        } = fam;
        match f {
            None => {
                for &id in &tracked {
                    self.owners.release(id, owner);
                }
                drop(seqs);
            }
            Some(f) => {
                for &id in &tracked {
                    self.owners.fence(id, owner, f);
                }
                let mut n = 0;
                for s in seqs {
                    let held = s.blocks().len();
                    let r = s.retire(f as u64);
                    assert_eq!(r, held, "retire returns the references");
                    n += r;
                }
                self.retired.fetch_add(n, SeqCst);
            }
        }
    }

    /// One worker: builds families and ends them, with raw allocations.
    fn worker(&self, t: u64, iters: usize, raw: bool) {
        let pool = &self.pool;
        let bs = pool.block_size();
        let mut rng = XorShift::new(t * 7919 + 1);
        let mut live: Vec<Family> = Vec::new();
        for i in 0..iters as u64 {
            let owner = (t + 1) << 24 | (i + 1);
            match rng.below(10) {
                0..=4 => {
                    // A new family: a prompt (fresh if >= 8 blocks from a word).
                    let mut fam = Family::new(pool, owner);
                    let blocks = [1, 3, 8, 9, 16, 24, 40, 64, 70][rng.below(9)];
                    let tokens = blocks * bs - rng.below(bs);
                    let mut m = 0;
                    let ok = if rng.below(4) == 0 {
                        fam.seqs[0]
                            .reserve_blocking(tokens, 0, Some(Duration::from_micros(200)))
                            .is_ok()
                            && fam.seqs[0].try_append(tokens).is_ok()
                    } else if rng.below(3) == 0 {
                        let k = &self.keys[rng.below(self.keys.len())];
                        m = fam.seqs[0].try_match_prefix(&k[..blocks.min(k.len())]);
                        fam.matched = m > 0;
                        fam.seqs[0]
                            .try_append(tokens.saturating_sub(m * bs).max(1))
                            .is_ok()
                    } else {
                        fam.seqs[0].try_append(tokens).is_ok()
                    };
                    if !ok && fam.seqs[0].blocks().is_empty() {
                        // Retire an empty sequence under a fence now and then.
                        if rng.below(2) == 0 {
                            let f = rng.below(FENCES);
                            assert_eq!(fam.seqs.pop().unwrap().retire(f as u64), 0);
                        }
                        continue;
                    }
                    // Track what the family took itself (not the matched
                    // prefix, which others may hold).
                    let matched = fam.seqs[0].blocks()[..m].to_vec();
                    fam.track_new(&self.owners, 0, &matched, "take");
                    if !fam.matched {
                        for &id in &fam.tracked {
                            assert_eq!(pool.ref_count(id), Some(1), "{id} just taken");
                        }
                    }
                    live.push(fam);
                }
                5 => {
                    // Fork a family that has not published.
                    if let Some(fam) = live
                        .iter_mut()
                        .find(|f| !f.forked && !f.published && !f.matched && !f.seqs[0].is_empty())
                    {
                        let parent = fam.seqs[0].blocks().to_vec();
                        if let Ok((child, _copy)) = fam.seqs[0].try_fork() {
                            fam.seqs.push(child);
                            fam.forked = true;
                            fam.track_new(&self.owners, 1, &parent, "fork");
                            let child_ids: HashSet<BlockId> =
                                fam.seqs[1].blocks().iter().copied().collect();
                            for id in parent.iter().filter(|id| child_ids.contains(id)) {
                                let rc = pool.ref_count(*id).unwrap();
                                assert!(rc >= 2, "shared {id} reads {rc}");
                            }
                        }
                    }
                }
                6 => {
                    // Publish a family's full blocks under shared keys.
                    if let Some(fam) = live
                        .iter_mut()
                        .find(|f| !f.forked && !f.published && !f.matched)
                    {
                        let full = fam.seqs[0].len() / bs;
                        let k = &self.keys[rng.below(self.keys.len())];
                        let full = full.min(k.len());
                        fam.seqs[0].publish(&k[..full]);
                        fam.published = true;
                    }
                }
                7 => {
                    // truncate_fenced a partial tail of a lone family.
                    if let Some(pos) = live
                        .iter()
                        .position(|f| f.seqs.len() == 1 && f.seqs[0].len() > 1)
                    {
                        let f = rng.below(FENCES);
                        let fam = &mut live[pos];
                        let len = fam.seqs[0].len();
                        let new_len = 1 + rng.below(len - 1);
                        let keep = new_len.div_ceil(bs);
                        let leaving: Vec<BlockId> = fam.seqs[0].blocks()[keep..].to_vec();
                        let tracked: HashSet<BlockId> = fam.tracked.iter().copied().collect();
                        for id in leaving.iter().filter(|id| tracked.contains(id)) {
                            self.owners.fence(*id, fam.owner, f);
                        }
                        let left: HashSet<BlockId> = leaving.iter().copied().collect();
                        fam.tracked.retain(|id| !left.contains(id));
                        let r = fam.seqs[0].truncate_fenced(new_len, f as u64);
                        assert_eq!(r, leaving.len());
                        self.retired.fetch_add(r, SeqCst);
                        // The seq is not appended to again (its tail may
                        // need a copy); it ends later.
                        fam.matched = true;
                    }
                }
                8 if raw => {
                    // Raw blocks, freed at once.
                    let mut ids = Vec::new();
                    if pool.try_alloc(1 + rng.below(12), &mut ids).is_ok() {
                        for &id in &ids {
                            self.owners.take(id, owner, "raw");
                            assert_eq!(pool.ref_count(id), Some(1));
                        }
                        for &id in &ids {
                            self.owners.release(id, owner);
                        }
                        pool.free(&ids).unwrap();
                    }
                }
                _ => {}
            }
            // End families: most retired under a random fence.
            while live.len() > 3 || (!live.is_empty() && rng.below(3) == 0) {
                let i = rng.below(live.len());
                let fam = live.swap_remove(i);
                let f = if rng.below(5) == 0 {
                    None
                } else {
                    Some(rng.below(FENCES))
                };
                // Several families under one fence, in take order.
                self.end(fam, f);
            }
        }
        // Retire what is left, adjacent families together under one fence.
        let f = rng.below(FENCES);
        for fam in live {
            self.end(fam, Some(f));
        }
    }
}

/// Workers take, fork, publish, match, truncate_fenced and retire (several
/// families under each fence) while completers complete the same fences
/// from several threads at once, and complete_all, all racing. Every take
/// is checked against the ownership side table.
fn hammer(
    n: usize,
    bs: usize,
    shards: usize,
    workers: usize,
    completers: usize,
    it: usize,
    raw: bool,
) {
    let sh = Shared::new(n, bs, shards, workers);
    thread::scope(|s| {
        for t in 0..workers as u64 {
            let sh = &sh;
            s.spawn(move || {
                let _d = Dec(&sh.workers_left);
                sh.worker(t, it, raw);
            });
        }
        for c in 0..completers as u64 {
            let sh = &sh;
            s.spawn(move || {
                let mut rng = XorShift::new(1000 + c);
                while sh.workers_left.load(SeqCst) > 0 {
                    match rng.below(12) {
                        0 => sh.complete_all(),
                        _ => sh.complete(rng.below(FENCES - 1)), // the last fence only by complete_all
                    }
                    // Sanity of the gauges while racing.
                    let (free, used) = (sh.pool.free_blocks(), sh.pool.used_blocks());
                    assert!(free <= n && used <= n, "{free} {used}");
                    let id = BlockId::new(rng.below(n) as u32);
                    let rc = sh.pool.ref_count(id).unwrap();
                    assert!(rc < 64, "{id} reads {rc}");
                    thread::yield_now();
                }
            });
        }
    });
    // Quiescence: every fence completed.
    sh.complete_all();
    assert_eq!(sh.pool.complete_all(), 0);
    assert_eq!(sh.pool.pending_release_blocks(), 0);
    assert_eq!(
        sh.completed.load(SeqCst),
        sh.retired.load(SeqCst),
        "references completed vs retired"
    );
    let p = &sh.pool;
    assert_eq!(p.free_blocks() + p.used_blocks(), n, "conservation");
    assert_eq!(
        p.used_blocks(),
        0,
        "nothing held (cached blocks are evictable, counted free)"
    );
    p.reset_prefix_cache();
    assert_pool_whole(p);
    assert!(sh.owners.slot.iter().all(|s| {
        let v = s.load(SeqCst);
        v == 0 || v & FENCED != 0
    }));
}

#[test]
fn hammer_fresh_fences_bs1() {
    for (i, &(n, shards)) in CONFIGS.iter().enumerate() {
        for r in 0..iters(2) {
            let _ = r;
            hammer(n, 1, shards, 3, 2, 300, i % 2 == 0);
        }
    }
}

#[test]
fn hammer_fresh_fences_bs2_many_completers() {
    for &(n, shards) in CONFIGS {
        for _ in 0..iters(2) {
            hammer(n, 2, shards, 2, 3, 300, true);
        }
    }
}

// ---------------------------------------------------------------------------
// 3. Misuse racing a completion
// ---------------------------------------------------------------------------

/// Sequences with adjacent fresh runs retire under one fence; misusers
/// free / add_refs retired ids (alone and in lists) while several threads
/// complete the fence (and complete_all) and sequence allocators take the
/// blocks as they come back. Every misuse is refused (HeldBySequence, or
/// NotAllocated while the block is free) and changes nothing; the fence's
/// references are given back exactly once in total.
#[test]
fn raw_misuse_of_retired_blocks_races_complete() {
    for &(n, shards) in CONFIGS {
        for round in 0..iters(30) {
            let pool = pool(n, 1, shards);
            let fence = 3u64;
            let mut ids = Vec::new();
            let mut refs = 0;
            let mut seqs = Vec::new();
            while pool.free_blocks() > 0 {
                let mut s = Sequence::new(Arc::clone(&pool));
                s.try_append((8 + round % 50).min(pool.free_blocks()))
                    .unwrap();
                ids.extend_from_slice(s.blocks());
                seqs.push(s);
            }
            for s in seqs {
                refs += s.retire(fence);
            }
            let completed = AtomicUsize::new(0);
            let go = AtomicBool::new(false);
            let finished = AtomicUsize::new(0);
            let takers_hold: Mutex<Vec<Sequence>> = Mutex::new(Vec::new());
            thread::scope(|s| {
                for c in 0..2 {
                    let (pool, completed, go, finished) = (&pool, &completed, &go, &finished);
                    s.spawn(move || {
                        let _i = Inc(finished);
                        common::wait_until(|| go.load(SeqCst));
                        let k = if c == 0 {
                            pool.complete(fence)
                        } else {
                            pool.complete_all()
                        };
                        completed.fetch_add(k, SeqCst);
                        completed.fetch_add(pool.complete(fence), SeqCst);
                    });
                }
                for m in 0..2u64 {
                    let (pool, ids, go, finished) = (&pool, &ids, &go, &finished);
                    s.spawn(move || {
                        let mut rng = XorShift::new(round as u64 * 31 + m);
                        go.store(true, SeqCst);
                        let mut spins = 0;
                        while finished.load(SeqCst) < 2 || spins < 200 {
                            spins += 1;
                            let i = rng.below(ids.len());
                            let j = (i + 1 + rng.below(20)).min(ids.len());
                            let list = &ids[i..j];
                            let r = if rng.below(2) == 0 {
                                pool.free(list)
                            } else {
                                pool.add_refs(list)
                            };
                            match r {
                                Err(FreeError::HeldBySequence { .. })
                                | Err(FreeError::NotAllocated { .. }) => {}
                                other => panic!("misuse of {list:?}: {other:?}"),
                            }
                        }
                    });
                }
                {
                    let (pool, finished, hold) = (&pool, &finished, &takers_hold);
                    s.spawn(move || {
                        while finished.load(SeqCst) < 2 {
                            let mut q = Sequence::new(Arc::clone(pool));
                            if q.try_append(9).is_ok() {
                                hold.lock().unwrap().push(q);
                            }
                        }
                        let mut q = Sequence::new(Arc::clone(pool));
                        while q.try_append(1).is_ok() {}
                        hold.lock().unwrap().push(q);
                    });
                }
            });
            assert_eq!(completed.load(SeqCst), refs, "{n}/{shards} round {round}");
            assert_eq!(pool.pending_release_blocks(), 0);
            // The takers got every block, each once.
            let hold = takers_hold.into_inner().unwrap();
            let held: Vec<BlockId> = hold.iter().flat_map(|s| s.blocks().to_vec()).collect();
            assert_eq!(held.len(), n, "every block back and taken");
            assert_eq!(held.iter().copied().collect::<HashSet<_>>().len(), n);
            for id in &held {
                assert_eq!(pool.ref_count(*id), Some(1));
            }
            drop(hold);
            assert_pool_whole(&pool);
        }
    }
}

/// Retirements under one fence racing several completes of it and
/// complete_all: each retirement is given back once, by a complete that
/// follows it, and the sums agree.
#[test]
fn retirements_race_completes_of_the_same_fence() {
    for &(n, shards) in CONFIGS {
        for round in 0..iters(20) {
            let pool = pool(n, 1, shards);
            let retired = AtomicUsize::new(0);
            let completed = AtomicUsize::new(0);
            let left = AtomicUsize::new(3);
            thread::scope(|s| {
                for t in 0..3u64 {
                    let (pool, retired, left) = (&pool, &retired, &left);
                    s.spawn(move || {
                        let _d = Dec(left);
                        let mut rng = XorShift::new(round as u64 * 17 + t);
                        for _ in 0..200 {
                            let mut a = Sequence::new(Arc::clone(pool));
                            let k = [8, 9, 16, 32, 64, 1][rng.below(6)];
                            if a.try_append(k).is_err() {
                                retired.fetch_add(a.retire(0), SeqCst);
                                continue;
                            }
                            let mut r = 0;
                            if rng.below(3) == 0 && a.len() > 2 {
                                let l = a.len();
                                r += a.truncate_fenced(l / 2, 0);
                            }
                            r += a.retire(0);
                            retired.fetch_add(r, SeqCst);
                        }
                    });
                }
                for c in 0..2 {
                    let (pool, completed, left) = (&pool, &completed, &left);
                    s.spawn(move || {
                        while left.load(SeqCst) > 0 {
                            let k = if c == 0 {
                                pool.complete(0)
                            } else {
                                pool.complete_all()
                            };
                            completed.fetch_add(k, SeqCst);
                            assert!(pool.used_blocks() <= n);
                        }
                    });
                }
            });
            completed.fetch_add(pool.complete(0), SeqCst);
            assert_eq!(completed.load(SeqCst), retired.load(SeqCst));
            assert_eq!(pool.pending_release_blocks(), 0);
            assert_pool_whole(&pool);
        }
    }
}

// ---------------------------------------------------------------------------
// 4. Hybrid sequences: a window's blocks retired by try_append_fenced and
//    the rest by retire, under the same fences (one run in the list when
//    the groups took consecutive ids), racing completes.
// ---------------------------------------------------------------------------

#[test]
fn hybrid_window_retirements_race_completes() {
    use kvslots::{HybridSequence, KvGroup, KvGroups};
    for &(n, shards) in CONFIGS {
        for round in 0..iters(10) {
            let pool = pool(n, 1, shards);
            let left = AtomicUsize::new(3);
            let completed = AtomicUsize::new(0);
            thread::scope(|s| {
                for t in 0..3u64 {
                    let (pool, left) = (&pool, &left);
                    s.spawn(move || {
                        let _d = Dec(left);
                        let mut rng = XorShift::new(round as u64 * 101 + t);
                        let mut copies = Vec::new();
                        for _ in 0..60 {
                            let w = [8, 9, 16, 30][rng.below(4)];
                            let groups = KvGroups::new([
                                KvGroup::SlidingWindow { window_tokens: w },
                                KvGroup::Full,
                            ])
                            .unwrap();
                            let mut h = HybridSequence::new(Arc::clone(pool), groups);
                            let f = rng.below(3) as u64;
                            if h.try_append(8 + rng.below(24)).is_err() {
                                assert_eq!(h.retire(f), 0);
                                continue;
                            }
                            for _ in 0..rng.below(4) {
                                let _ = h.try_append_fenced(1 + rng.below(16), f, &mut copies);
                            }
                            if rng.below(3) == 0 && h.len() > 2 {
                                let l = h.len();
                                let _ = h.truncate_fenced(l - 1, f);
                            }
                            for g in 0..2 {
                                let nulls = h.null_blocks(g).unwrap();
                                for &id in &h.blocks(g).unwrap()[nulls..] {
                                    let rc = pool.ref_count(id).unwrap();
                                    assert!((1..=2).contains(&rc), "{id}: {rc}");
                                }
                            }
                            let held = h.held_blocks();
                            assert_eq!(h.retire(f), held);
                        }
                    });
                }
                for c in 0..2 {
                    let (pool, completed, left) = (&pool, &completed, &left);
                    s.spawn(move || {
                        let mut f = c as u64;
                        while left.load(SeqCst) > 0 {
                            let k = if f % 7 == 6 {
                                pool.complete_all()
                            } else {
                                pool.complete(f % 3)
                            };
                            completed.fetch_add(k, SeqCst);
                            f += 1;
                        }
                    });
                }
            });
            pool.complete_all();
            assert_eq!(pool.pending_release_blocks(), 0);
            assert_eq!(pool.used_blocks(), 0);
            pool.reset_prefix_cache();
            assert_pool_whole(&pool);
        }
    }
}
