//! Adversarial review of the sealed sequence calls and the sole drop (a
//! load and a plain store of a sequence's block state word), with real
//! threads.
//!
//! The plain store is sound only if no thread but the sole holder writes
//! the word between its load and its store. These tests drive every public
//! writer of a state word at once against sequences that drop on other
//! threads: forks dropped elsewhere, fences completed elsewhere, publishes
//! of the same keys by rivals, matches, truncates into cached blocks,
//! `reset_prefix_cache`, hybrid windows, and raw `free` / `add_refs` of
//! arbitrary ids (which must refuse every sequence's block and never
//! write it), while raw holders share their own blocks with `add_refs`.
//!
//! A shadow count of the references the test's sequences hold per block
//! checks that a block a sequence takes fresh (an allocation, never a
//! match) has no other holder: a block given back twice is handed to two
//! owners, and shows here (or in the free list's debug assertion, which
//! panics a thread). After each run every fence is completed and the pool
//! must be whole: nothing used, the admission counts exact, and every
//! block handed out once by an allocation of all of them.
//!
//! The last test shows the hole the seal leaves by design: an implementor
//! of `BlockAllocator` receives the token and, in safe code, can pass it
//! to its inner pool with ids the sequence never gave it (a breach of the
//! trait's contract), which hands a block to two sequences.

mod common;

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use kvslots::{
    hash_blocks, BlockAllocator, BlockHash, BlockId, BlockPool, FreeError, HybridSequence, KvGroup,
    KvGroups, ReserveError, Sequence, SequenceCall,
};

/// Tokens per block in these pools.
const BS: usize = 4;

/// A small xorshift generator: the same run for the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Per block, how many references the test's sequences hold (decremented
/// before a reference goes back to the pool, incremented after one is
/// taken).
struct Shadow {
    held: Box<[AtomicI32]>,
}

impl Shadow {
    fn new(n: usize) -> Shadow {
        Shadow {
            held: (0..n).map(|_| AtomicI32::new(0)).collect(),
        }
    }

    /// `ids` were just taken fresh by an allocation: nobody else may hold
    /// them.
    fn take_fresh(&self, ids: &[BlockId]) {
        for id in ids {
            // SeqCst: a shadow, not the code under test.
            let prev = self.held[id.index()].fetch_add(1, Ordering::SeqCst);
            assert_eq!(prev, 0, "{id} handed out while another sequence holds it");
        }
    }

    /// `ids` were shared (a fork) or matched: held by one more.
    fn take_shared(&self, ids: &[BlockId]) {
        for id in ids.iter().filter(|id| **id != BlockId::NULL) {
            let prev = self.held[id.index()].fetch_add(1, Ordering::SeqCst);
            assert!(prev >= 0, "{id}: negative shadow");
        }
    }

    /// `ids` are about to go back (a drop, a truncate, a retire).
    fn give(&self, ids: &[BlockId]) {
        for id in ids.iter().filter(|id| **id != BlockId::NULL) {
            let prev = self.held[id.index()].fetch_sub(1, Ordering::SeqCst);
            assert!(
                prev >= 1,
                "{id} given back by a sequence that did not hold it"
            );
        }
    }
}

/// The pool is whole: nothing used, nothing pending, the admission counts
/// exact, every block handed out once.
fn assert_whole(pool: &BlockPool) {
    pool.complete_all();
    assert_eq!(pool.pending_release_blocks(), 0);
    assert_eq!(
        pool.used_blocks(),
        0,
        "used count after every holder let go"
    );
    for i in 0..pool.num_blocks() as u32 {
        assert_eq!(pool.ref_count(BlockId::new(i)), Some(0), "block {i}");
    }
    let mut all = Vec::new();
    pool.try_alloc(pool.num_blocks(), &mut all)
        .expect("every block can be taken");
    assert_eq!(
        pool.free_blocks(),
        0,
        "a block's used count was given back twice"
    );
    let mut distinct = all.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), pool.num_blocks(), "a block twice");
    pool.free(&all).unwrap();
    assert_eq!(pool.free_blocks(), pool.num_blocks());
}

/// The keys of a prompt of `blocks` full blocks drawn from a few prompts,
/// so that sequences on different threads publish and match the same keys.
fn prompt_keys(rng: &mut Rng, blocks: usize) -> (Vec<u32>, Vec<BlockHash>) {
    let family = rng.below(3) as u32;
    let tokens: Vec<u32> = (0..(blocks * BS) as u32)
        .map(|t| family * 1000 + t)
        .collect();
    let mut keys = Vec::new();
    hash_blocks(b"", &tokens, BS, &mut keys);
    (tokens, keys)
}

/// What a worker sends to the other threads: a fork to drop there, or a
/// fence to complete there.
enum Work {
    Drop(Sequence, Vec<BlockId>),
    Complete(u64),
}

/// One worker's life of sequences: appends (fresh blocks, checked against
/// the shadow), publishes, matches, truncates into cached blocks, forks
/// (sent to another thread to drop), fenced retires (completed by another
/// thread) and plain drops.
fn worker(
    pool: &Arc<BlockPool>,
    shadow: &Shadow,
    seed: u64,
    rounds: usize,
    out: &mpsc::Sender<Work>,
    fences: &AtomicU64,
) {
    let mut rng = Rng(seed | 1);
    for _ in 0..rounds {
        let blocks = 1 + rng.below(4);
        let (_, keys) = prompt_keys(&mut rng, blocks);
        let mut seq = Sequence::new(Arc::clone(pool));
        // A match of the prompt (shared or revived blocks).
        let k = seq.try_match_prefix(&keys);
        shadow.take_shared(&seq.blocks()[..k]);
        // The rest of the prompt, fresh, in full blocks.
        let before = seq.blocks().len();
        match seq.try_append((blocks - k) * BS) {
            Ok(_) => shadow.take_fresh(&seq.blocks()[before..]),
            Err(ReserveError::Full { .. } | ReserveError::BehindWaiters { .. }) => {
                shadow.give(seq.blocks());
                drop(seq);
                continue;
            }
            Err(e) => panic!("{e:?}"),
        }
        if rng.below(2) == 0 {
            seq.publish(&keys);
        }
        match rng.below(5) {
            0 => {
                // A fork, dropped on another thread; the parent drops here.
                let (child, copy) = seq.try_fork().unwrap();
                assert!(copy.is_none(), "full blocks are shared");
                shadow.take_shared(child.blocks());
                let ids = child.blocks().to_vec();
                if out.send(Work::Drop(child, ids)).is_err() {
                    unreachable!("the receiver lives until the workers are done");
                }
            }
            1 => {
                // Retired under a fence another thread completes.
                let fence = fences.fetch_add(1, Ordering::Relaxed);
                shadow.give(seq.blocks());
                seq.retire(fence);
                let _ = out.send(Work::Complete(fence));
                continue;
            }
            2 if seq.len() > 1 => {
                // A truncate into the last (perhaps cached) block: the key
                // goes if we hold it alone (`uncache_if_sole`); the blocks
                // past it go back.
                let len = seq.len() - 1 - rng.below(seq.len() - 1);
                let keep = len.div_ceil(BS);
                shadow.give(&seq.blocks()[keep..]);
                seq.truncate(len);
            }
            // More tokens: the tail is full, so no copy.
            3 if seq.len() % BS == 0 => {
                let before = seq.blocks().len();
                if seq.try_append(BS).is_ok() {
                    shadow.take_fresh(&seq.blocks()[before..]);
                }
            }
            _ => {}
        }
        shadow.give(seq.blocks());
        drop(seq);
    }
}

/// Raw calls on arbitrary ids while only sequences (and this thread's own
/// raw blocks) hold blocks: a sequence's block is refused, and a raw call
/// succeeds only on this thread's raw blocks. `Ok` on a listed id that
/// is not ours would be a raw call that wrote a sequence's (or a free)
/// block.
fn raw_attacker(pool: &BlockPool, seed: u64, start: &Barrier, stop: &AtomicBool) -> usize {
    let mut rng = Rng(seed | 1);
    let n = pool.num_blocks();
    let mut refused = 0;
    let mut mine: Vec<BlockId> = Vec::new();
    start.wait();
    // Runs until told to stop and refused at least once: a scheduler may
    // hold this thread back until the workers are done.
    while refused == 0 || !stop.load(Ordering::SeqCst) {
        if mine.is_empty() {
            let _ = pool.try_alloc(1 + rng.below(2), &mut mine);
        }
        let victim = BlockId::new(rng.below(n) as u32);
        if mine.contains(&victim) {
            continue;
        }
        // Our raw blocks first, then a block that is not ours: all or
        // nothing, so a refusal must leave ours at one reference.
        let mut list = mine.clone();
        list.push(victim);
        let r = if rng.below(2) == 0 {
            pool.add_refs(&list)
        } else {
            pool.free(&[victim])
        };
        match r {
            Err(FreeError::HeldBySequence { id } | FreeError::NotAllocated { id })
            | Err(FreeError::Raced { id }) => {
                assert_eq!(id, victim, "{r:?} names another block");
                refused += 1;
            }
            other => panic!("a raw call on {victim} (not a raw holder's) gave {other:?}"),
        }
        for id in &mine {
            assert_eq!(
                pool.ref_count(*id),
                Some(1),
                "a refused add_refs left a reference on {id}"
            );
        }
        if rng.below(16) == 0 {
            pool.free(&mine).unwrap();
            mine.clear();
        }
    }
    if !mine.is_empty() {
        pool.free(&mine).unwrap();
    }
    refused
}

/// Sets its flag when dropped: a test's stop signal for its endless
/// threads, given also when the test panics (so that the scope's join
/// does not wait forever).
struct Stop<'a>(&'a AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Drops what the workers send (forks' sequences) and completes the
/// fences they retire under, on a thread of its own.
fn drainer(pool: &BlockPool, shadow: &Shadow, rx: mpsc::Receiver<Work>) {
    for work in rx {
        match work {
            Work::Drop(seq, ids) => {
                shadow.give(&ids);
                drop(seq);
            }
            Work::Complete(fence) => {
                pool.complete(fence);
            }
        }
    }
}

/// Everything at once on a small prefix-cached pool: two workers, a
/// drainer (fork drops, fence completions), a raw attacker, and a thread
/// that resets the prefix cache.
fn mixed_run(num_blocks: usize, shards: usize, seed: u64, rounds: usize) {
    let pool = Arc::new(
        BlockPool::builder(num_blocks, BS)
            .shards(shards)
            .prefix_cache(true)
            .build()
            .unwrap(),
    );
    let shadow = Shadow::new(num_blocks);
    let fences = AtomicU64::new(1);
    let stop = AtomicBool::new(false);
    let resets = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel();
    // The attacker, the resetter and the two workers start together.
    let start = Barrier::new(4);
    thread::scope(|s| {
        let drain = s.spawn(|| drainer(&pool, &shadow, rx));
        let attack = s.spawn(|| raw_attacker(&pool, seed ^ 0xA5A5, &start, &stop));
        let reset = s.spawn(|| {
            start.wait();
            while !stop.load(Ordering::SeqCst) {
                resets.fetch_add(pool.reset_prefix_cache(), Ordering::Relaxed);
                thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..2u64)
            .map(|w| {
                let tx = tx.clone();
                let (pool, shadow, fences, start) = (&pool, &shadow, &fences, &start);
                s.spawn(move || {
                    start.wait();
                    worker(pool, shadow, seed + 7919 * w, rounds, &tx, fences)
                })
            })
            .collect();
        drop(tx);
        // Stops the attacker and the resets also when a join below panics.
        let stopper = Stop(&stop);
        for w in workers {
            w.join().expect("a worker panicked");
        }
        drain.join().expect("the drainer panicked");
        drop(stopper);
        assert!(attack.join().expect("the attacker panicked") > 0);
        reset.join().expect("the reset panicked");
    });
    for (i, h) in shadow.held.iter().enumerate() {
        assert_eq!(h.load(Ordering::SeqCst), 0, "block {i} still shadowed");
    }
    assert_whole(&pool);
}

#[test]
fn every_writer_at_once_hands_no_block_out_twice() {
    for seed in 1..=4u64 {
        mixed_run(24, 1, seed * 0x9E37_79B9, 3_000);
    }
}

#[test]
fn every_writer_at_once_over_shards_hands_no_block_out_twice() {
    for seed in 1..=3u64 {
        mixed_run(48, 4, seed * 0x51_7CC1_B727, 3_000);
    }
}

/// A fork's child dropped on another thread while the parent, holding the
/// same blocks, is retired under a fence that a third thread completes:
/// whoever reads a count of 1 stores, the other CASes. Many rounds, each
/// ending with a whole pool.
#[test]
fn a_fork_drop_races_a_fence_completion_of_the_parent() {
    let pool = Arc::new(BlockPool::with_shards(64, 1, 1));
    for round in 0..1_500u64 {
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(64).unwrap();
        let (child, _) = seq.try_fork().unwrap();
        assert_eq!(seq.retire(round), 64);
        let go = AtomicUsize::new(0);
        let meet = || common::meet(&go, 2);
        thread::scope(|s| {
            let a = s.spawn(|| {
                meet();
                drop(child);
            });
            let b = s.spawn(|| {
                meet();
                for _ in 0..(round % 61) {
                    std::hint::spin_loop();
                }
                assert_eq!(pool.complete(round), 64);
            });
            a.join().expect("the child's drop panicked");
            b.join().expect("the completion panicked");
        });
        assert_eq!(pool.used_blocks(), 0, "round {round}");
        assert_eq!(pool.free_blocks(), 64, "round {round}");
    }
    assert_whole(&pool);
}

/// A cached, shared prompt: one holder truncates into the last block and
/// drops, the other drops, while a third thread resets the prefix cache
/// and a fourth matches the prompt (reviving what is evictable). The
/// block that was cached a moment ago is then held alone, uncached, and
/// goes back with the plain store, racing a reset's or a match's CAS from
/// the cached state it read.
#[test]
fn reset_and_match_race_a_sole_drop_of_a_block_cached_a_moment_ago() {
    let pool = Arc::new(
        BlockPool::builder(8, BS)
            .shards(1)
            .prefix_cache(true)
            .build()
            .unwrap(),
    );
    let tokens: Vec<u32> = (0..(2 * BS) as u32).collect();
    let mut keys = Vec::new();
    hash_blocks(b"", &tokens, BS, &mut keys);
    for round in 0..800usize {
        let mut a = Sequence::new(Arc::clone(&pool));
        let k = a.try_match_prefix(&keys);
        a.try_append((2 - k) * BS).unwrap();
        a.publish(&keys);
        let mut b = Sequence::new(Arc::clone(&pool));
        b.try_match_prefix(&keys);
        let go = AtomicUsize::new(0);
        let meet = || common::meet(&go, 4);
        thread::scope(|s| {
            let hs = [
                s.spawn(|| {
                    meet();
                    // Into the last block: uncached if `a` holds it alone
                    // (after `b`'s drop), then the plain store.
                    a.truncate(BS + 1);
                    drop(a);
                }),
                s.spawn(|| {
                    meet();
                    drop(b);
                }),
                s.spawn(|| {
                    meet();
                    for _ in 0..(round % 37) {
                        std::hint::spin_loop();
                    }
                    pool.reset_prefix_cache();
                }),
                s.spawn(|| {
                    meet();
                    for _ in 0..(round % 23) {
                        std::hint::spin_loop();
                    }
                    let mut c = Sequence::new(Arc::clone(&pool));
                    c.try_match_prefix(&keys);
                    let full = c.blocks().len();
                    if c.try_append(BS).is_ok() {
                        // The fresh block is not one of the matched ones.
                        let fresh = c.blocks()[full];
                        assert!(!c.blocks()[..full].contains(&fresh));
                    }
                }),
            ];
            for h in hs {
                h.join().expect("a thread panicked");
            }
        });
        assert_eq!(pool.used_blocks(), 0, "round {round}");
    }
    assert_whole(&pool);
}

/// Rival publishers of the same keys on different blocks (each claim is
/// `BUSY`, a rival's deferral or kill CASes it) while each publisher's
/// fork is dropped on another thread: a publisher's block is never held
/// alone while its claim is there, and once the claims are gone the last
/// holder's plain store meets no rival's stale CAS.
#[test]
fn rival_publishers_race_their_forks_drops() {
    let pool = Arc::new(
        BlockPool::builder(32, BS)
            .shards(1)
            .prefix_cache(true)
            .build()
            .unwrap(),
    );
    let tokens: Vec<u32> = (0..(3 * BS) as u32).collect();
    let mut keys = Vec::new();
    hash_blocks(b"", &tokens, BS, &mut keys);
    for round in 0..600usize {
        let go = AtomicUsize::new(0);
        let meet = || common::meet(&go, 4);
        let mut pubs = Vec::new();
        for _ in 0..2 {
            let mut s = Sequence::new(Arc::clone(&pool));
            s.try_append(3 * BS).unwrap();
            let (child, _) = s.try_fork().unwrap();
            pubs.push((s, child));
        }
        let published = AtomicUsize::new(0);
        thread::scope(|sc| {
            let mut hs = Vec::new();
            for (i, (mut parent, child)) in pubs.into_iter().enumerate() {
                let (meet, keys, published) = (&meet, &keys, &published);
                hs.push(sc.spawn(move || {
                    meet();
                    published.fetch_add(parent.publish(keys), Ordering::SeqCst);
                    drop(parent);
                }));
                hs.push(sc.spawn(move || {
                    meet();
                    for _ in 0..((round + i * 13) % 41) {
                        std::hint::spin_loop();
                    }
                    drop(child);
                }));
            }
            for h in hs {
                h.join().expect("a thread panicked");
            }
        });
        // First wins per key: at most one block per key is cached.
        assert!(published.load(Ordering::SeqCst) <= 3, "round {round}");
        assert!(pool.cached_blocks() <= 3, "round {round}");
        assert_eq!(pool.used_blocks(), 0, "round {round}");
        pool.reset_prefix_cache();
    }
    assert_whole(&pool);
}

/// Hybrid sequences with a sliding window: each append moves the window,
/// whose blocks held alone are reused in the same call (no pool call) and
/// whose shared blocks go back, while forks taken before are dropped on
/// another thread. A block that lands in a new place of a table (fresh,
/// or a window's block reused) must have no other holder: a reused block
/// is written by the new tokens, so reusing one that a fork still holds
/// would hand it to two writers. Checked against the shadow.
#[test]
fn hybrid_window_reuse_races_fork_drops() {
    let num_blocks = 64;
    let pool = Arc::new(BlockPool::with_shards(num_blocks, BS, 1));
    let groups = KvGroups::new([
        KvGroup::SlidingWindow {
            window_tokens: 2 * BS,
        },
        KvGroup::Full,
    ])
    .unwrap();
    let shadow = Shadow::new(num_blocks);
    /// Every held block with its place: (group, index, id).
    fn places(seq: &HybridSequence) -> Vec<(usize, usize, BlockId)> {
        (0..2)
            .flat_map(|g| {
                seq.blocks(g)
                    .unwrap()
                    .iter()
                    .enumerate()
                    .filter(|(_, id)| **id != BlockId::NULL)
                    .map(move |(i, id)| (g, i, *id))
                    .collect::<Vec<_>>()
            })
            .collect()
    }
    fn ids(places: &[(usize, usize, BlockId)]) -> Vec<BlockId> {
        places.iter().map(|p| p.2).collect()
    }
    let (tx, rx) = mpsc::channel::<(HybridSequence, Vec<BlockId>)>();
    thread::scope(|s| {
        let drain = s.spawn(|| {
            for (child, ids) in rx {
                shadow.give(&ids);
                drop(child);
            }
        });
        let mut workers = Vec::new();
        for w in 0..2u64 {
            let tx = tx.clone();
            let (pool, groups, shadow) = (&pool, &groups, &shadow);
            workers.push(s.spawn(move || {
                let mut rng = Rng(0x1234_5678 + w);
                let mut reused = 0usize;
                for _ in 0..1_500 {
                    let mut seq = HybridSequence::new(Arc::clone(pool), groups.clone());
                    if seq.try_append(2 * BS).is_err() {
                        continue;
                    }
                    shadow.take_fresh(&ids(&places(&seq)));
                    for _ in 0..1 + rng.below(4) {
                        if rng.below(2) == 0 {
                            let mut copies = Vec::new();
                            let child = seq.try_fork(&mut copies).unwrap();
                            assert!(copies.is_empty(), "full tails are shared");
                            let held = ids(&places(&child));
                            shadow.take_shared(&held);
                            let _ = tx.send((child, held));
                        }
                        // Full blocks only: no copy. Everything is given up
                        // in the shadow first; afterwards a block in the
                        // same place is kept, any other is taken fresh.
                        let before = places(&seq);
                        shadow.give(&ids(&before));
                        match seq.try_append(BS) {
                            Ok(_) => {
                                let after = places(&seq);
                                let (kept, moved): (Vec<(usize, usize, BlockId)>, Vec<_>) = after
                                    .iter()
                                    .partition(|p: &&(usize, usize, BlockId)| before.contains(p));
                                reused += moved
                                    .iter()
                                    .filter(|p| before.iter().any(|b| b.2 == p.2))
                                    .count();
                                shadow.take_shared(&ids(&kept));
                                shadow.take_fresh(&ids(&moved));
                            }
                            Err(_) => shadow.take_shared(&ids(&before)),
                        }
                    }
                    shadow.give(&ids(&places(&seq)));
                    drop(seq);
                }
                reused
            }));
        }
        drop(tx);
        let reused: usize = workers
            .into_iter()
            .map(|w| w.join().expect("a worker panicked"))
            .sum();
        assert!(reused > 0, "no window block was reused");
        drain.join().expect("the drainer panicked");
    });
    for (i, h) in shadow.held.iter().enumerate() {
        assert_eq!(h.load(Ordering::SeqCst), 0, "block {i} still shadowed");
    }
    assert_whole(&pool);
}

/// A `BlockAllocator` that forwards to a `BlockPool` and, against the
/// trait's contract, also releases a victim's blocks with the token it was
/// given (safe code: the token is only borrowed, but during the call it
/// works on any id).
struct Replaying {
    inner: Arc<BlockPool>,
    victim: Mutex<Vec<BlockId>>,
}

impl BlockAllocator for Replaying {
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
        BlockAllocator::try_alloc_with_headroom(&*self.inner, by, n, headroom, out)
    }
    fn alloc_with_headroom_blocking(
        &self,
        by: &SequenceCall<'_>,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
        timeout: Option<std::time::Duration>,
    ) -> Result<(), ReserveError> {
        BlockAllocator::alloc_with_headroom_blocking(&*self.inner, by, n, headroom, out, timeout)
    }
    fn add_refs(&self, by: &SequenceCall<'_>, ids: &[BlockId]) -> usize {
        BlockAllocator::add_refs(&*self.inner, by, ids)
    }
    fn release(&self, by: &SequenceCall<'_>, ids: &[BlockId]) {
        BlockAllocator::release(&*self.inner, by, ids);
        // The breach: ids the sequence never listed.
        let victim = std::mem::take(&mut *self.victim.lock().unwrap());
        BlockAllocator::release(&*self.inner, by, &victim);
    }
    fn needs_copy(&self, id: BlockId) -> bool {
        BlockAllocator::needs_copy(&*self.inner, id)
    }
    fn retire(&self, by: &SequenceCall<'_>, fence: u64, ids: &[BlockId]) -> usize {
        BlockAllocator::retire(&*self.inner, by, fence, ids)
    }
}

/// The hole the seal leaves, by design (the trait's contract, "The
/// token"): a forwarding implementor can release another sequence's block
/// through the token it was given. The victim's block is then free while
/// the victim holds it, and the next allocation hands it to a second
/// sequence. This test pins that the breach does what the contract warns
/// of (so that the docs' "no code outside the crate changes a
/// sequence-held block's reference count" is read with that exception).
#[test]
fn a_forwarding_implementor_that_breaks_the_contract_double_hands_a_block() {
    let pool = Arc::new(BlockPool::with_shards(2, BS, 1));
    let replaying = Arc::new(Replaying {
        inner: Arc::clone(&pool),
        victim: Mutex::new(Vec::new()),
    });
    let mut victim = Sequence::new(Arc::clone(&pool));
    victim.try_append(BS).unwrap();
    let stolen = victim.blocks()[0];
    *replaying.victim.lock().unwrap() = vec![stolen];
    let mut accomplice = Sequence::new(Arc::clone(&replaying));
    accomplice.try_append(BS).unwrap();
    drop(accomplice); // releases its own block, and the victim's
    assert_eq!(
        pool.ref_count(stolen),
        Some(0),
        "the victim's reference is gone"
    );
    let mut other = Sequence::new(Arc::clone(&pool));
    other.try_append(2 * BS).unwrap();
    assert!(
        other.blocks().contains(&stolen),
        "the victim's block is handed to a second sequence"
    );
    // Both now hold `stolen` on one reference; give it back once.
    std::mem::forget(victim);
}

/// A raw `add_refs` whose checks passed while a raw caller held the block,
/// and which finds it freed and taken by a sequence since, must refuse it
/// in its CAS (`Raced`): the reference it would add is one the sequence
/// does not know of, so the sequence's last drop would not be its sole
/// drop, and the raw caller could never give it back (a raw free refuses
/// a sequence's block). One thread takes every block raw and frees them
/// one by one, one appends to and drops sequences, and a third shares
/// blocks with `add_refs` (one block listed many times, so that its checks
/// and adds take a while, then another) and gives the references straight
/// back: every `add_refs` that succeeds must be followed by a successful
/// `free` of the same list.
#[test]
fn a_stale_raw_add_refs_never_lands_on_a_block_a_sequence_took_since() {
    for _ in 0..12 {
        stale_raw_add_refs_round();
    }
}

/// One run of the test above, on a fresh pool.
fn stale_raw_add_refs_round() {
    const N: usize = 4;
    let pool = Arc::new(BlockPool::with_shards(N, 1, 1));
    let stop = AtomicBool::new(false);
    let hint = [AtomicU32::new(0), AtomicU32::new(1)];
    // Set by the sharer once it has seen both outcomes: the raw thread
    // goes on until then, however the threads are scheduled.
    let seen = AtomicBool::new(false);
    let start = Barrier::new(2);
    let (mut added, mut refused) = (0usize, 0usize);
    thread::scope(|s| {
        let raw = s.spawn(|| {
            let mut ids = Vec::new();
            let mut taken = 0;
            start.wait();
            while taken < 50_000 || !(seen.load(Ordering::SeqCst) || stop.load(Ordering::SeqCst)) {
                if pool.try_alloc(2, &mut ids).is_ok() {
                    taken += 1;
                    // A hint for the sharer (Relaxed: only which ids to try).
                    hint[0].store(ids[0].index() as u32, Ordering::Relaxed);
                    hint[1].store(ids[1].index() as u32, Ordering::Relaxed);
                    for _ in 0..taken % 64 {
                        std::hint::spin_loop();
                    }
                    for id in ids.drain(..).rev() {
                        pool.free(&[id]).unwrap();
                    }
                }
            }
        });
        let seqs = s.spawn(|| {
            while !stop.load(Ordering::SeqCst) {
                let mut seq = Sequence::new(Arc::clone(&pool));
                let _ = seq.try_append(1);
            }
        });
        // Stops the sequences' thread also when an assertion below fails.
        let _stop = Stop(&stop);
        let mut rng = Rng(0xC0FFEE);
        start.wait();
        while !raw.is_finished() {
            let x = BlockId::new(hint[0].load(Ordering::Relaxed));
            let y = BlockId::new(hint[1].load(Ordering::Relaxed));
            let mut list = vec![x; 1 + rng.below(48)];
            list.push(y);
            match pool.add_refs(&list) {
                Ok(()) => {
                    added += 1;
                    assert_eq!(
                        pool.free(&list),
                        Ok(()),
                        "add_refs added a reference that no free can take"
                    );
                }
                Err(
                    FreeError::HeldBySequence { .. }
                    | FreeError::NotAllocated { .. }
                    | FreeError::Raced { .. },
                ) => refused += 1,
                Err(e) => panic!("{e:?}"),
            }
            if added > 0 && refused > 0 {
                seen.store(true, Ordering::SeqCst);
            }
        }
        drop(_stop);
        raw.join().unwrap();
        seqs.join().unwrap();
    });
    assert!(added > 0 && refused > 0, "{added} added, {refused} refused");
    assert_whole(&pool);
}

/// A truncate into a cached block (its key dropped by `uncache_if_sole`,
/// a CAS from the cached state) and the sole drop that follows, in a loop
/// on one thread, while another thread matches the same prompt (a revival
/// is a CAS from the cached state too) and appends fresh blocks, and a
/// third resets the prefix cache. A key dropped over a matcher's revival
/// would lose the matcher's reference, and the truncating sequence's sole
/// drop would then free a block the matcher holds: the shadow sees the
/// block handed out again while held.
#[test]
fn uncache_and_sole_drop_loop_against_matchers_and_resets() {
    let num_blocks = 8;
    let pool = Arc::new(
        BlockPool::builder(num_blocks, BS)
            .shards(1)
            .prefix_cache(true)
            .build()
            .unwrap(),
    );
    let shadow = Shadow::new(num_blocks);
    let tokens: Vec<u32> = (0..(2 * BS) as u32).collect();
    let mut keys = Vec::new();
    hash_blocks(b"", &tokens, BS, &mut keys);
    let stop = AtomicBool::new(false);
    let (pool, shadow, keys, stop) = (&pool, &shadow, &keys, &stop);
    thread::scope(|s| {
        let truncater = s.spawn(move || {
            for _ in 0..40_000 {
                let mut a = Sequence::new(Arc::clone(pool));
                let k = a.try_match_prefix(keys);
                shadow.take_shared(&a.blocks()[..k]);
                if a.try_append((2 - k) * BS).is_err() {
                    shadow.give(a.blocks());
                    continue;
                }
                shadow.take_fresh(&a.blocks()[k..]);
                a.publish(keys);
                // Into the last block: its key goes if `a` holds it alone.
                a.truncate(BS + 1);
                shadow.give(a.blocks());
                drop(a);
            }
        });
        let matcher = s.spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let mut c = Sequence::new(Arc::clone(pool));
                let k = c.try_match_prefix(keys);
                shadow.take_shared(&c.blocks()[..k]);
                let before = c.blocks().len();
                if c.len() % BS == 0 && c.try_append(BS).is_ok() {
                    shadow.take_fresh(&c.blocks()[before..]);
                }
                shadow.give(c.blocks());
                drop(c);
            }
        });
        let reset = s.spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                pool.reset_prefix_cache();
                thread::yield_now();
            }
        });
        let r = truncater.join();
        stop.store(true, Ordering::SeqCst);
        matcher.join().expect("the matcher panicked");
        reset.join().expect("the reset panicked");
        r.expect("the truncater panicked");
    });
    assert_whole(pool);
}
