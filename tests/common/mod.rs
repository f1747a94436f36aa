//! What the integration tests share: snapshots of everything observable
//! about a counter, a pool and a sequence (what a refusal must leave
//! unchanged), the check that a pool is whole again, a tiny deterministic
//! PRNG, an exact-LRU reference of one thread's eviction order
//! (`lru_model`), the hybrid attacks' helpers (`hybrid`), and for the real-thread tests the rendezvous of a
//! round's threads (`meet`, `wait_until`), the stop flag, the observer
//! thread that samples a structure's invariants while the workers run,
//! and the worker pool.
//!
//! The test binaries are named for what they test: an API's unit tests by
//! the type or call (`counter`, `reservation`, `pool`, `pool_free`,
//! `sequence`), a whole-crate suite by its technique (`fixtures`,
//! `linearizability`, `model`, `shuttle`, `stress`, `zero_alloc`).
//!
//! A binary that needs this module includes it with `mod common;` (a
//! directory module, so that cargo does not build it as a test of its own)
//! and uses a part of it, hence the `dead_code` allowance: what one binary
//! leaves unused another uses.

#![allow(dead_code)]

pub mod chains;
pub mod hybrid;
pub mod lru_model;
pub mod shadow;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::thread;

use std::sync::{Arc, Mutex, OnceLock};

use kvslots::{
    BlockAllocator, BlockHash, BlockId, BlockPool, ReserveError, Sequence, SequenceCall,
    SlotCounter,
};

// ---------------------------------------------------------------------------
// Rendezvous
// ---------------------------------------------------------------------------

/// How many spin hints [`wait_until`] spends before it yields at each
/// check: threads on cores of their own meet well within them.
const SPINS: u32 = 1 << 10;

/// Counts this thread in at `arrived` and waits until `n` threads have
/// arrived, so that the threads of one round start their racing calls
/// together (see [`wait_until`]).
pub fn meet(arrived: &AtomicUsize, n: usize) {
    // SeqCst (both): a rendezvous of the test's threads, not the code under
    // test.
    arrived.fetch_add(1, Ordering::SeqCst);
    wait_until(|| arrived.load(Ordering::SeqCst) >= n);
}

/// Waits until `cond()` holds (a condition another of the test's threads
/// makes true). It spins for a short while, so that threads running on
/// cores of their own go on within a few hints of each other and their
/// next accesses race; then it yields the core at each check: where more
/// threads wait than there are cores (the test harness runs tests in
/// parallel), a thread that only spins would keep its core for a whole
/// scheduler time slice while the thread it waits for cannot run.
pub fn wait_until(mut cond: impl FnMut() -> bool) {
    let mut spins = 0;
    while !cond() {
        if spins < SPINS {
            spins += 1;
            std::hint::spin_loop();
        } else {
            thread::yield_now();
        }
    }
}

// ---------------------------------------------------------------------------
// Snapshots
// ---------------------------------------------------------------------------

/// Everything observable about a counter's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterSnap {
    pub capacity: usize,
    pub used: usize,
    pub available: usize,
    pub peak_used: usize,
    pub closed: bool,
}

pub fn counter_snap(c: &SlotCounter) -> CounterSnap {
    CounterSnap {
        capacity: c.capacity(),
        used: c.used(),
        available: c.available(),
        peak_used: c.peak_used(),
        closed: c.is_closed(),
    }
}

/// Everything observable about a pool's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSnap {
    pub num_blocks: usize,
    pub block_size: usize,
    pub free: usize,
    pub used: usize,
    pub peak: usize,
    pub closed: bool,
    /// `ref_count` of every block, in id order.
    pub refs: Vec<usize>,
}

pub fn pool_snap(pool: &BlockPool) -> PoolSnap {
    PoolSnap {
        num_blocks: pool.num_blocks(),
        block_size: pool.block_size(),
        free: pool.free_blocks(),
        used: pool.used_blocks(),
        peak: pool.peak_used_blocks(),
        closed: pool.is_closed(),
        refs: block_refs(pool),
    }
}

/// `ref_count` of every block of `pool`, in id order.
pub fn block_refs(pool: &BlockPool) -> Vec<usize> {
    (0..pool.num_blocks())
        .map(|i| {
            pool.ref_count(BlockId::new(i as u32))
                .expect("in-range id has a count")
        })
        .collect()
}

/// Everything observable about a sequence (its pool apart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqSnap {
    pub len: usize,
    pub capacity: usize,
    pub blocks: Vec<BlockId>,
}

pub fn seq_snap(seq: &Sequence) -> SeqSnap {
    SeqSnap {
        len: seq.len(),
        capacity: seq.capacity(),
        blocks: seq.blocks().to_vec(),
    }
}

/// Checks that the pool is whole again: every block free, every count 0,
/// and allocating them all yields every id exactly once.
pub fn assert_pool_whole(pool: &BlockPool) {
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
// A tiny deterministic PRNG
// ---------------------------------------------------------------------------

/// Marsaglia's xorshift64.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        // Spread small seeds over the word; the state must not be 0.
        XorShift(seed.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A generator started at `state` as given (1 for 0, which the
    /// generator never leaves): for a test that mixes its own seed.
    pub fn from_state(state: u64) -> Self {
        XorShift(state.max(1))
    }

    /// Uniform enough in `0..n` for a test's operation mix (0 for
    /// `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// `true` with a chance of about `pct` in 100.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }
}

// ---------------------------------------------------------------------------
// The observer and the thread pool
// ---------------------------------------------------------------------------

/// Sets the stop flag when dropped, also while its thread unwinds from a
/// failed assertion, so that the other thread's loop ends too (instead of
/// leaving the scope waiting for it forever).
pub struct StopOnDrop<'a>(pub &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        // Release: pairs with the observer's Acquire load in
        // `run_observed`; it orders nothing the loops check, it only ends
        // them.
        self.0.store(true, Ordering::Release);
    }
}

/// Runs `work` while a separate std thread calls `sample` (which asserts
/// the invariants) over and over; returns what `work` returned and how many
/// samples the observer took (at least one while `work` may run, and one
/// after it ended).
///
/// # Panics
///
/// Panics with "observer saw a broken invariant" if `sample` panicked.
pub fn run_observed<R: Send>(
    mut sample: impl FnMut() + Send,
    work: impl FnOnce() -> R + Send,
) -> (R, u64) {
    let stop = AtomicBool::new(false);
    let started = Barrier::new(2);
    let (stop, started) = (&stop, &started);
    thread::scope(|s| {
        let observer = s.spawn(move || {
            let mut samples = 0u64;
            started.wait();
            loop {
                // Acquire: pairs with the Release store in `StopOnDrop`; it
                // orders nothing the samples depend on, it only ends the
                // loop.
                let stopping = stop.load(Ordering::Acquire);
                sample();
                samples += 1;
                if stopping {
                    break;
                }
            }
            samples
        });
        let result = {
            let _stop = StopOnDrop(stop);
            started.wait();
            work()
        };
        let samples = observer.join().expect("observer saw a broken invariant");
        (result, samples)
    })
}

/// A rayon pool of `threads` workers: at least 8, the stress tests' floor.
pub fn rayon_pool(threads: usize) -> rayon::ThreadPool {
    assert!(threads >= 8);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("rayon pool")
}

// ---------------------------------------------------------------------------
// Prefix-cache content
// ---------------------------------------------------------------------------

/// What a block holding `key`'s tokens contains, as a stamp standing for
/// its KV data (never 0, so an unwritten block never looks like one).
pub fn key_stamp(key: &kvslots::BlockHash) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&key.0[..8]);
    u64::from_le_bytes(bytes) | 1
}

/// `n` sequences of `pool` holding one block each, in ascending block id
/// order (the races of publishes pick their roles by block id).
pub fn one_block_sequences(pool: &std::sync::Arc<BlockPool>, n: usize) -> Vec<Sequence> {
    let mut seqs: Vec<Sequence> = (0..n)
        .map(|_| {
            let mut seq = Sequence::new(std::sync::Arc::clone(pool));
            seq.try_append(1).unwrap();
            seq
        })
        .collect();
    seqs.sort_by_key(|s| s.blocks()[0]);
    seqs
}

/// A waker that counts its wakes.
#[derive(Default)]
pub struct Counting(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Counting {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A counting waker and the count it bumps.
pub fn waker() -> (std::task::Waker, std::sync::Arc<Counting>) {
    let count = std::sync::Arc::new(Counting::default());
    (std::task::Waker::from(std::sync::Arc::clone(&count)), count)
}

/// How many times `count`'s waker was woken.
pub fn wakes(count: &Counting) -> usize {
    count.0.load(std::sync::atomic::Ordering::SeqCst)
}

/// Polls `fut` once with `waker`.
pub fn poll_once<F: std::future::Future + ?Sized>(
    fut: std::pin::Pin<&mut F>,
    waker: &std::task::Waker,
) -> std::task::Poll<F::Output> {
    fut.poll(&mut std::task::Context::from_waker(waker))
}

/// A pool of `n` one-token blocks over `shards` shards, prefix cache on.
pub fn one_token_cached_pool(n: usize, shards: usize) -> std::sync::Arc<BlockPool> {
    std::sync::Arc::new(
        BlockPool::builder(n, 1)
            .shards(shards)
            .prefix_cache(true)
            .build()
            .unwrap(),
    )
}

/// The keys of `tokens` in one-token blocks, under `salt`.
pub fn one_token_keys(salt: &[u8], tokens: &[u32]) -> Vec<kvslots::BlockHash> {
    let mut out = Vec::new();
    kvslots::hash_blocks(salt, tokens, 1, &mut out);
    out
}

/// Every block of `ids` has `holders` references, all sequences', and
/// every raw call on it is refused as a sequence's and changes nothing.
pub fn assert_sequences_hold(pool: &BlockPool, ids: &[BlockId], holders: usize) {
    for &id in ids {
        assert_eq!(pool.ref_count(id), Some(holders), "{id}: ref_count");
        assert_eq!(
            pool.free(&[id]),
            Err(kvslots::FreeError::HeldBySequence { id }),
            "{id}: raw free"
        );
        assert_eq!(
            pool.add_refs(&[id]),
            Err(kvslots::FreeError::HeldBySequence { id }),
            "{id}: raw add_refs"
        );
        assert_eq!(
            pool.ref_count(id),
            Some(holders),
            "{id}: changed by a refusal"
        );
    }
}

// ---------------------------------------------------------------------------
// Pools of the KV events' tests, and a forwarding allocator
// ---------------------------------------------------------------------------

/// The prompts of the stress tests: `families` prompts of 4 blocks of 2
/// tokens, sharing their first block by fours and their second by twos,
/// so that chains share parents and publishes of one key race.
pub fn families(families: u32) -> Vec<Vec<BlockHash>> {
    (0..families)
        .map(|f| {
            let tokens: Vec<u32> = (0..8u32)
                .map(|t| match t / 2 {
                    0 => f / 4 * 100 + t,
                    1 => f / 2 * 100 + t,
                    _ => f * 100 + t,
                })
                .collect();
            let mut keys = Vec::new();
            kvslots::hash_blocks(b"", &tokens, 2, &mut keys);
            keys
        })
        .collect()
}

/// A pool of `num_blocks` blocks of `block_size` tokens over `shards`
/// shards, with the prefix cache and KV event rings of `capacity` records.
pub fn events_pool(
    num_blocks: usize,
    block_size: usize,
    shards: usize,
    capacity: usize,
) -> Arc<BlockPool> {
    Arc::new(
        BlockPool::builder(num_blocks, block_size)
            .shards(shards)
            .prefix_cache(true)
            .kv_events(capacity)
            .build()
            .unwrap(),
    )
}

/// An allocator that forwards every call to a `BlockPool`, passing the
/// token it receives to the same call: what a wrapper (metrics, tracing)
/// does. It cannot build a token, so it cannot call the pool's sealed
/// calls on its own; its sequences keep every rule. It records the group
/// each publish names (`SequenceCall::group`), as a tracing wrapper would.
pub struct Forward {
    pub inner: BlockPool,
    /// The groups the publishes named, in order.
    pub groups: Mutex<Vec<Option<usize>>>,
    /// How many blocks each publish offered, in order.
    pub offered: Mutex<Vec<usize>>,
    /// Whether `publish_after` forwards the blocks after the first in
    /// reverse order, each with its own key (the same pairs, so the same
    /// effect on each block: a forward the contract allows).
    pub reorder: AtomicBool,
    /// Whether `match_prefix_lending` is forwarded (the default: `true`);
    /// `false` runs the trait's default, which lends nothing.
    pub lend: AtomicBool,
    /// The reserved blocks the pool lent through forwarded matches.
    pub lent: AtomicUsize,
    /// Whether `match_prefix_lending` hands the pool an id it never
    /// handed out (past its end) in the first lendable block's place, and
    /// puts the caller's id back after the call (or its panic).
    pub foreign_lendable: AtomicBool,
    /// What runs the pool's `match_prefix_lending` when set (it calls the
    /// function it is given once): a test's measure of the call.
    pub around_lending: OnceLock<fn(&mut dyn FnMut())>,
}

impl Forward {
    pub fn new(inner: BlockPool) -> Arc<Forward> {
        Arc::new(Forward {
            inner,
            groups: Mutex::new(Vec::new()),
            offered: Mutex::new(Vec::new()),
            reorder: AtomicBool::new(false),
            lend: AtomicBool::new(true),
            lent: AtomicUsize::new(0),
            foreign_lendable: AtomicBool::new(false),
            around_lending: OnceLock::new(),
        })
    }
}

impl BlockAllocator for Forward {
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
        BlockAllocator::release(&self.inner, by, ids);
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
    fn match_prefix_lending(
        &self,
        by: &SequenceCall<'_>,
        keys: &[BlockHash],
        out: &mut Vec<BlockId>,
        lendable: usize,
        lent: &mut usize,
    ) -> usize {
        // Relaxed (all three): switches the test sets before the match,
        // and a tally read after it on the same thread; they order
        // nothing.
        if !self.lend.load(Ordering::Relaxed) {
            return BlockAllocator::match_prefix(&self.inner, by, keys, out);
        }
        let swapped = (self.foreign_lendable.load(Ordering::Relaxed) && lendable > 0).then(|| {
            let i = out.len() - lendable.min(out.len());
            let foreign = BlockId::new(self.inner.num_blocks() as u32);
            (i, std::mem::replace(&mut out[i], foreign))
        });
        let matched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut k = 0;
            let mut call = || {
                k = BlockAllocator::match_prefix_lending(
                    &self.inner,
                    by,
                    keys,
                    out,
                    lendable,
                    lent,
                );
            };
            match self.around_lending.get() {
                Some(around) => around(&mut call),
                None => call(),
            }
            k
        }));
        if let Some((i, own)) = swapped {
            out[i] = own;
        }
        let k = matched.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        self.lent.fetch_add(*lent, Ordering::Relaxed);
        k
    }
    fn publish(&self, by: &SequenceCall<'_>, blocks: &[BlockId], keys: &[BlockHash]) -> usize {
        BlockAllocator::publish(&self.inner, by, blocks, keys)
    }
    fn publish_after(
        &self,
        by: &SequenceCall<'_>,
        parent: Option<&BlockHash>,
        blocks: &[BlockId],
        keys: &[BlockHash],
    ) -> usize {
        self.groups.lock().unwrap().push(by.group());
        self.offered.lock().unwrap().push(blocks.len());
        // Relaxed: a switch the test sets on the thread that publishes; it
        // orders nothing.
        if self.reorder.load(Ordering::Relaxed) && blocks.len() > 1 {
            let n = blocks.len().min(keys.len());
            let mut b: Vec<BlockId> = blocks[..n].to_vec();
            let mut k: Vec<BlockHash> = keys[..n].to_vec();
            b[1..].reverse();
            k[1..].reverse();
            return BlockAllocator::publish_after(&self.inner, by, parent, &b, &k);
        }
        BlockAllocator::publish_after(&self.inner, by, parent, blocks, keys)
    }
    fn uncache_if_sole(&self, by: &SequenceCall<'_>, id: BlockId) {
        BlockAllocator::uncache_if_sole(&self.inner, by, id);
    }
    fn retire(&self, by: &SequenceCall<'_>, fence: u64, ids: &[BlockId]) -> usize {
        BlockAllocator::retire(&self.inner, by, fence, ids)
    }
    fn retire_owned(&self, by: &SequenceCall<'_>, fence: u64, ids: Vec<BlockId>) -> usize {
        BlockAllocator::retire_owned(&self.inner, by, fence, ids)
    }
}
