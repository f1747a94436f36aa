//! The census of the public API's bad inputs: every public function of
//! `kvslots`, called with 0, 1 and `usize::MAX`, out of range, with
//! duplicated ids and with ids of another pool, and after `close`. Each row
//! names the typed outcome it must give (an error, the documented "nothing"
//! value, or a documented panic) and is checked against a world of a
//! counter, a pool with sequences that share, cache and fork blocks, and a
//! second pool: every row must leave everything observable unchanged (free
//! and used counts, every block's reference count, the prefix cache's
//! counts and statistics, every sequence's length and table, the caller's
//! output vectors) and, once the world is dropped, nothing held.
//!
//! A new public function gets its rows here. A pool too large for memory is
//! checked in a child process with an address-space limit
//! (`a_pool_too_large_for_memory_is_a_typed_error`).

// A row records what a call returned, `()` included.
#![allow(clippy::unit_arg)]

mod common;

use std::cell::Cell;
use std::future::Future;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::sync::{Arc, Once};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use common::{
    assert_pool_whole, counter_snap, pool_snap, seq_snap, CounterSnap, PoolSnap, SeqSnap,
};
use kvslots::{
    admit, hash_blocks, table, BlockAllocator, BlockCopy, BlockHash, BlockId, BlockPool,
    ConfigError, FreeError, GroupKeys, HybridError, HybridSequence, KvGroup, KvGroups,
    KvGroupsError, OwnedReservation, PositionError, PrefixStats, ReleaseError, ReserveError,
    Sequence, SlotCounter,
};

// ---------------------------------------------------------------------------
// The world every row runs against
// ---------------------------------------------------------------------------

/// Blocks of the pool, and tokens a block.
const BLOCKS: usize = 8;
const BS: usize = 4;
/// Slots of the counter, and what the world holds of them.
const SLOTS: usize = 8;
const HELD: usize = 5;
/// What the output vectors hold before a row: a refused call leaves them so.
const OUT_SENTINEL: BlockId = BlockId::new(99);
const SLOT_SENTINEL: usize = 77;
const COPY_SENTINEL: BlockCopy = BlockCopy {
    src: OUT_SENTINEL,
    dst: OUT_SENTINEL,
    tokens: 0,
};

struct World {
    counter: Arc<SlotCounter>,
    /// `HELD` of the counter's slots.
    held: Option<OwnedReservation>,
    /// `BLOCKS` blocks of `BS` tokens (one shard, so that the ids are known).
    pool: Arc<BlockPool>,
    /// A second pool (16 blocks), of which `foreign` holds 12.
    other: Arc<BlockPool>,
    foreign: Vec<BlockId>,
    /// 6 tokens: a full block shared with `b`, and a partly filled one.
    a: Sequence,
    /// A fork of `a`: its first block, and a private copy of the tail.
    b: Sequence,
    /// 8 tokens in 2 full blocks, published under `kc`.
    c: Sequence,
    kc: Vec<BlockHash>,
    /// The key of a cached block no one holds (evictable).
    ke: Vec<BlockHash>,
    /// Blocks a row's setup took straight from the pool (given back at the
    /// end).
    taken: Vec<BlockId>,
    out: Vec<BlockId>,
    slots: Vec<usize>,
    keys: Vec<BlockHash>,
    /// The hybrid rows' pool (`BLOCKS` blocks of `BS` tokens, one shard):
    /// `h` and `hk` are there once the `hybrid` setup ran, `htaken` holds
    /// what `hybrid_fill` took.
    hpool: Arc<BlockPool>,
    h: Option<HybridSequence>,
    hk: Option<GroupKeys>,
    htaken: Vec<BlockId>,
    /// The hybrid rows' copies (as `out`: a refused call leaves it so).
    copies: Vec<BlockCopy>,
}

/// Keys of one or two blocks of `BS` tokens under `salt`.
fn keys(salt: &[u8], blocks: usize) -> Vec<BlockHash> {
    let tokens: Vec<u32> = (0..(blocks * BS) as u32).collect();
    let mut out = Vec::new();
    hash_blocks(salt, &tokens, BS, &mut out);
    out
}

impl World {
    fn new() -> World {
        let counter = Arc::new(SlotCounter::new(SLOTS));
        let held = Some(counter.try_reserve_owned(HELD).unwrap());
        let pool = Arc::new(BlockPool::new(BLOCKS, BS));
        let other = Arc::new(BlockPool::new(16, BS));
        let mut foreign = Vec::new();
        other.try_alloc(12, &mut foreign).unwrap();
        let mut a = Sequence::new(Arc::clone(&pool));
        a.try_append(6).unwrap();
        let (b, copy) = a.try_fork().unwrap();
        assert!(copy.is_some());
        let mut c = Sequence::new(Arc::clone(&pool));
        c.try_append(8).unwrap();
        let kc = keys(b"c", 2);
        assert_eq!(c.publish(&kc), 2);
        let ke = keys(b"e", 1);
        let mut e = Sequence::new(Arc::clone(&pool));
        e.try_append(4).unwrap();
        assert_eq!(e.publish(&ke), 1);
        drop(e);
        let w = World {
            counter,
            held,
            pool,
            other,
            foreign,
            a,
            b,
            c,
            kc,
            ke,
            taken: Vec::new(),
            out: vec![OUT_SENTINEL],
            slots: vec![SLOT_SENTINEL],
            keys: vec![BlockHash([9; 32])],
            hpool: Arc::new(BlockPool::new(BLOCKS, BS)),
            h: None,
            hk: None,
            htaken: Vec::new(),
            copies: vec![COPY_SENTINEL],
        };
        // 5 blocks held (a: 2, b: 1 of its own, c: 2), 1 evictable.
        assert_eq!((w.pool.used_blocks(), w.pool.evictable_blocks()), (5, 1));
        w
    }

    /// Closes the counter and the pool.
    fn close(&mut self) {
        self.counter.close();
        self.pool.close();
        self.hpool.close();
    }

    /// Takes every free block (the evictable one too) and holds it: the
    /// free blocks `FREE_ID` and the one after it, then `EVICTABLE_ID`.
    fn fill(&mut self) {
        let free = self.pool.free_blocks();
        self.pool.try_alloc(free, &mut self.taken).unwrap();
    }
}

/// Everything a row may not change.
#[derive(Debug, Clone, PartialEq)]
struct Snap {
    counter: CounterSnap,
    held: Option<usize>,
    counter_waiters: usize,
    pool: PoolSnap,
    cached: usize,
    evictable: usize,
    pending: usize,
    pool_waiters: usize,
    /// The prefix cache's hits and evictions (`queried_blocks` counts the
    /// keys every empty sequence's match looks up, also when the pool lets
    /// it take nothing).
    hits_and_evictions: (u64, u64),
    other: PoolSnap,
    seqs: [SeqSnap; 3],
    out: Vec<BlockId>,
    slots: Vec<usize>,
    keys: Vec<BlockHash>,
    hpool: PoolSnap,
    /// The hybrid pool's cached and evictable blocks, retired ones, and
    /// its prefix cache's hits and evictions.
    hcache: (usize, usize, usize, u64, u64),
    h: Option<HybridSnap>,
    hk: Option<Vec<Vec<BlockHash>>>,
    copies: Vec<BlockCopy>,
}

/// Everything observable about a hybrid sequence (its pool apart).
#[derive(Debug, Clone, PartialEq)]
struct HybridSnap {
    len: usize,
    capacity: usize,
    held: usize,
    /// Each group's table and null entries.
    tables: Vec<(Vec<BlockId>, usize)>,
    needs_copy: bool,
}

fn hybrid_snap(h: &HybridSequence) -> HybridSnap {
    HybridSnap {
        len: h.len(),
        capacity: h.capacity(),
        held: h.held_blocks(),
        tables: (0..h.groups().len())
            .map(|g| (h.blocks(g).unwrap().to_vec(), h.null_blocks(g).unwrap()))
            .collect(),
        needs_copy: h.append_needs_copy(),
    }
}

fn snap(w: &World) -> Snap {
    Snap {
        counter: counter_snap(&w.counter),
        held: w.held.as_ref().map(|r| r.len()),
        counter_waiters: w.counter.waiters(),
        pool: pool_snap(&w.pool),
        cached: w.pool.cached_blocks(),
        evictable: w.pool.evictable_blocks(),
        pending: w.pool.pending_release_blocks(),
        pool_waiters: w.pool.waiters(),
        hits_and_evictions: {
            let PrefixStats {
                hit_blocks,
                evictions,
                ..
            } = w.pool.prefix_stats();
            (hit_blocks, evictions)
        },
        other: pool_snap(&w.other),
        seqs: [seq_snap(&w.a), seq_snap(&w.b), seq_snap(&w.c)],
        out: w.out.clone(),
        slots: w.slots.clone(),
        keys: w.keys.clone(),
        hpool: pool_snap(&w.hpool),
        hcache: {
            let PrefixStats {
                hit_blocks,
                evictions,
                ..
            } = w.hpool.prefix_stats();
            (
                w.hpool.cached_blocks(),
                w.hpool.evictable_blocks(),
                w.hpool.pending_release_blocks(),
                hit_blocks,
                evictions,
            )
        },
        h: w.h.as_ref().map(hybrid_snap),
        hk: w.hk.as_ref().map(|k| {
            (0..k.groups().len())
                .map(|g| k.group(g).unwrap().to_vec())
                .collect()
        }),
        copies: w.copies.clone(),
    }
}

// ---------------------------------------------------------------------------
// Outcomes
// ---------------------------------------------------------------------------

/// What a call gave: a typed error, a documented panic, or a value (the
/// documented "nothing": `None`, 0, an empty range), by its `Debug` form.
#[derive(Debug, Clone, PartialEq)]
enum Got {
    Reserve(ReserveError),
    Release(ReleaseError),
    Free(FreeError),
    Config(ConfigError),
    Position(PositionError),
    Hybrid(HybridError),
    Groups(KvGroupsError),
    /// A panic, with its message (an expected one names words of it).
    Panic(String),
    Value(String),
}

fn value(v: impl std::fmt::Debug) -> Got {
    Got::Value(format!("{v:?}"))
}

/// `Ok` as a value, `Err` as the typed error.
fn reserve<T: std::fmt::Debug>(r: Result<T, ReserveError>) -> Got {
    r.map_or_else(Got::Reserve, value)
}

fn free(r: Result<(), FreeError>) -> Got {
    r.map_or_else(Got::Free, value)
}

/// Polls a future once: a refusal must come at once, not after a wait.
fn poll_once<F: Future>(f: F) -> Poll<F::Output> {
    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    let waker = Waker::from(Arc::new(Noop));
    pin!(f).as_mut().poll(&mut Context::from_waker(&waker))
}

/// A future's first poll, as a reservation's outcome.
fn polled<T: std::fmt::Debug>(f: impl Future<Output = Result<T, ReserveError>>) -> Got {
    match poll_once(f) {
        Poll::Ready(r) => reserve(r),
        Poll::Pending => Got::Value("Pending".into()),
    }
}

/// No wait at all: a blocking call's timeout.
const NOW: Option<Duration> = Some(Duration::ZERO);

const NEVER: ReserveError = ReserveError::Closed;

fn never_fits(requested: usize, capacity: usize) -> Got {
    Got::Reserve(ReserveError::NeverFits {
        requested,
        capacity,
    })
}

fn full(requested: usize, available: usize) -> Got {
    Got::Reserve(ReserveError::Full {
        requested,
        available,
    })
}

fn closed() -> Got {
    Got::Reserve(NEVER)
}

fn panics(words: &str) -> Got {
    Got::Panic(words.into())
}

/// `Ok` as a value, `Err` as the typed error.
fn hybrid<T: std::fmt::Debug>(r: Result<T, HybridError>) -> Got {
    r.map_or_else(Got::Hybrid, value)
}

fn position(position: usize, len: usize) -> Got {
    Got::Position(PositionError { position, len })
}

fn id(i: u32) -> BlockId {
    BlockId::new(i)
}

// ---------------------------------------------------------------------------
// The rows
// ---------------------------------------------------------------------------

struct Row {
    name: &'static str,
    /// Run before the snapshot: the state the call is refused in.
    setup: fn(&mut World),
    call: fn(&mut World) -> Got,
    expect: Got,
}

fn none(_: &mut World) {}

fn close(w: &mut World) {
    w.close();
}

fn fill(w: &mut World) {
    w.fill();
}

/// `a` truncated into the block it shares with `b`: its next append needs
/// a copy-on-write.
fn truncate_into_shared(w: &mut World) {
    assert_eq!(w.a.truncate(2), 1);
}

macro_rules! rows {
    ($( $name:literal, $setup:expr, |$w:ident| $call:expr => $expect:expr; )*) => {
        vec![$(Row {
            name: $name,
            setup: $setup,
            call: |$w: &mut World| $call,
            expect: $expect,
        }),*]
    };
}

/// The free functions, the counter and its guards.
fn counter_rows() -> Vec<Row> {
    rows![
        "admit: empty request", none, |_w| value(admit(4, 0, 0)) => value(0usize);
        "admit: negative request", none, |_w| value(admit(4, 0, -1)) => value(0usize);
        "admit: isize::MIN", none, |_w| value(admit(4, 0, isize::MIN)) => value(0usize);
        "admit: one too many", none, |_w| value(admit(4, 1, 4)) => value(0usize);
        "admit: overcommitted state", none, |_w| value(admit(1, 2, 1)) => value(0usize);
        "admit: zero capacity", none, |_w| value(admit(0, 0, 1)) => value(0usize);
        "admit: usize::MAX used of usize::MAX", none, |_w| value(admit(usize::MAX, usize::MAX, 1)) => value(0usize);
        "SlotCounter::new: MAX_CAPACITY + 1", none,
            |_w| value(SlotCounter::new(SlotCounter::MAX_CAPACITY + 1)) => panics("exceeds MAX_CAPACITY");
        "SlotCounter::new: usize::MAX", none,
            |_w| value(SlotCounter::new(usize::MAX)) => panics("capacity 18446744073709551615 exceeds MAX_CAPACITY");
        "SlotCounter::admit: 0", none, |w| value(w.counter.admit(0)) => value(0usize);
        "SlotCounter::admit: -1", none, |w| value(w.counter.admit(-1)) => value(0usize);
        "SlotCounter::admit: isize::MIN", none, |w| value(w.counter.admit(isize::MIN)) => value(0usize);
        "SlotCounter::admit: isize::MAX", none, |w| value(w.counter.admit(isize::MAX)) => value(0usize);
        "SlotCounter::admit: one more than free", none, |w| value(w.counter.admit(4)) => value(0usize);
        "SlotCounter::admit: closed", close, |w| value(w.counter.admit(1)) => value(0usize);
        "SlotCounter::release: 0", none, |w| value(w.counter.release(0)) => value(Ok::<(), ReleaseError>(()));
        "SlotCounter::release: more than used", none,
            |w| w.counter.release(HELD + 1).map_or_else(Got::Release, value)
            => Got::Release(ReleaseError::ExceedsUsed { released: HELD + 1, used: HELD });
        "SlotCounter::release: usize::MAX", none,
            |w| w.counter.release(usize::MAX).map_or_else(Got::Release, value)
            => Got::Release(ReleaseError::ExceedsUsed { released: usize::MAX, used: HELD });
        "SlotCounter::release: more than used, closed", close,
            |w| w.counter.release(HELD + 1).map_or_else(Got::Release, value)
            => Got::Release(ReleaseError::ExceedsUsed { released: HELD + 1, used: HELD });
        "SlotCounter::try_reserve: 0", none, |w| reserve(w.counter.try_reserve(0).map(|r| r.len())) => value(0usize);
        "SlotCounter::try_reserve: one more than free", none,
            |w| reserve(w.counter.try_reserve(4).map(|r| r.len())) => full(4, 3);
        "SlotCounter::try_reserve: capacity + 1", none,
            |w| reserve(w.counter.try_reserve(SLOTS + 1).map(|r| r.len())) => never_fits(SLOTS + 1, SLOTS);
        "SlotCounter::try_reserve: usize::MAX", none,
            |w| reserve(w.counter.try_reserve(usize::MAX).map(|r| r.len())) => never_fits(usize::MAX, SLOTS);
        "SlotCounter::try_reserve: 0, closed", close, |w| reserve(w.counter.try_reserve(0).map(|r| r.len())) => closed();
        "SlotCounter::try_reserve: usize::MAX, closed", close,
            |w| reserve(w.counter.try_reserve(usize::MAX).map(|r| r.len())) => closed();
        "SlotCounter::try_reserve_owned: one more than free", none,
            |w| reserve(w.counter.try_reserve_owned(4).map(|r| r.len())) => full(4, 3);
        "SlotCounter::try_reserve_owned: usize::MAX", none,
            |w| reserve(w.counter.try_reserve_owned(usize::MAX).map(|r| r.len())) => never_fits(usize::MAX, SLOTS);
        "SlotCounter::try_reserve_owned: closed", close,
            |w| reserve(w.counter.try_reserve_owned(1).map(|r| r.len())) => closed();
        "SlotCounter::try_reserve_with_headroom: headroom past capacity", none,
            |w| reserve(w.counter.try_reserve_with_headroom(1, SLOTS).map(|r| r.len())) => never_fits(1, SLOTS);
        "SlotCounter::try_reserve_with_headroom: usize::MAX twice", none,
            |w| reserve(w.counter.try_reserve_with_headroom(usize::MAX, usize::MAX).map(|r| r.len()))
            => never_fits(usize::MAX, SLOTS);
        "SlotCounter::try_reserve_with_headroom: headroom not free", none,
            |w| reserve(w.counter.try_reserve_with_headroom(1, 3).map(|r| r.len())) => full(1, 3);
        "SlotCounter::try_reserve_with_headroom: closed", close,
            |w| reserve(w.counter.try_reserve_with_headroom(1, 0).map(|r| r.len())) => closed();
        "SlotCounter::reserve: capacity + 1", none,
            |w| polled(w.counter.reserve(SLOTS + 1)) => never_fits(SLOTS + 1, SLOTS);
        "SlotCounter::reserve: usize::MAX", none,
            |w| polled(w.counter.reserve(usize::MAX)) => never_fits(usize::MAX, SLOTS);
        "SlotCounter::reserve: closed", close, |w| polled(w.counter.reserve(1)) => closed();
        "SlotCounter::reserve_owned: usize::MAX", none,
            |w| polled(w.counter.reserve_owned(usize::MAX)) => never_fits(usize::MAX, SLOTS);
        "SlotCounter::reserve_owned: closed", close, |w| polled(w.counter.reserve_owned(1)) => closed();
        "SlotCounter::reserve_blocking: usize::MAX", none,
            |w| reserve(w.counter.reserve_blocking(usize::MAX, None).map(|r| r.len())) => never_fits(usize::MAX, SLOTS);
        "SlotCounter::reserve_blocking: one more than free, no wait", none,
            |w| reserve(w.counter.reserve_blocking(4, NOW).map(|r| r.len())) => full(4, 3);
        "SlotCounter::reserve_blocking: closed", close,
            |w| reserve(w.counter.reserve_blocking(1, None).map(|r| r.len())) => closed();
        "SlotCounter::reserve_owned_blocking: usize::MAX", none,
            |w| reserve(w.counter.reserve_owned_blocking(usize::MAX, None).map(|r| r.len())) => never_fits(usize::MAX, SLOTS);
        "SlotCounter::reserve_owned_blocking: one more than free, no wait", none,
            |w| reserve(w.counter.reserve_owned_blocking(4, NOW).map(|r| r.len())) => full(4, 3);
        "SlotCounter::reserve_owned_blocking: closed", close,
            |w| reserve(w.counter.reserve_owned_blocking(1, None).map(|r| r.len())) => closed();
        "SlotCounter::close: twice", close, |w| value(w.counter.close()) => value(());
        "OwnedReservation::split: one more than held", none,
            |w| value(w.held.as_mut().unwrap().split(HELD + 1).map(|r| r.len())) => value(None::<usize>);
        "OwnedReservation::split: usize::MAX", none,
            |w| value(w.held.as_mut().unwrap().split(usize::MAX).map(|r| r.len())) => value(None::<usize>);
        "OwnedReservation::shrink_to: its length", none,
            |w| value(w.held.as_mut().unwrap().shrink_to(HELD)) => value(());
        "OwnedReservation::shrink_to: usize::MAX", none,
            |w| value(w.held.as_mut().unwrap().shrink_to(usize::MAX)) => value(());
        "OwnedReservation::try_grow: 0", none, |w| reserve(w.held.as_mut().unwrap().try_grow(0)) => value(());
        "OwnedReservation::try_grow: one more than free", none,
            |w| reserve(w.held.as_mut().unwrap().try_grow(4)) => full(4, 3);
        "OwnedReservation::try_grow: usize::MAX", none,
            |w| reserve(w.held.as_mut().unwrap().try_grow(usize::MAX)) => never_fits(usize::MAX, SLOTS);
        "OwnedReservation::try_grow: closed", close,
            |w| reserve(w.held.as_mut().unwrap().try_grow(1)) => closed();
        "OwnedReservation::merge: from another counter", none,
            |w| {
                let stranger = Arc::new(SlotCounter::new(4));
                let r = stranger.try_reserve_owned(2).unwrap();
                w.held.as_mut().unwrap().merge(r);
                value(stranger.used())
            } => panics("cannot merge reservations from different counters");
        "Reservation::merge: from another counter", none,
            |w| {
                let stranger = SlotCounter::new(4);
                let mut mine = w.counter.try_reserve(0).unwrap();
                mine.merge(stranger.try_reserve(2).unwrap());
                value(mine.len())
            } => panics("cannot merge reservations from different counters");
        "Reservation::split, shrink_to, try_grow: usize::MAX", none,
            |w| {
                let mut r = w.counter.try_reserve(0).unwrap();
                let split = r.split(usize::MAX).map(|s| s.len());
                r.shrink_to(usize::MAX);
                value((split, r.try_grow(usize::MAX), r.len()))
            } => value((None::<usize>, Err::<(), _>(ReserveError::NeverFits { requested: usize::MAX, capacity: SLOTS }), 0usize));
        "ReserveError::is_retryable: NeverFits and Closed", none,
            |_w| value((ReserveError::NeverFits { requested: 1, capacity: 0 }.is_retryable(), ReserveError::Closed.is_retryable()))
            => value((false, false));
    ]
}

/// The pool: its builder and constructors, allocation, frees, fences.
fn pool_rows() -> Vec<Row> {
    let max = BlockPool::MAX_BLOCKS;
    rows![
        "BlockPool::builder: zero block size", none,
            |_w| BlockPool::builder(BLOCKS, 0).build().map_or_else(Got::Config, |p| value(p.num_blocks()))
            => Got::Config(ConfigError::ZeroBlockSize);
        "BlockPool::builder: zero blocks, zero block size", none,
            |_w| BlockPool::builder(0, 0).build().map_or_else(Got::Config, |p| value(p.num_blocks()))
            => Got::Config(ConfigError::ZeroBlockSize);
        "BlockPool::builder: MAX_BLOCKS + 1", none,
            |_w| BlockPool::builder(BlockPool::MAX_BLOCKS + 1, 1).build().map_or_else(Got::Config, |p| value(p.num_blocks()))
            => Got::Config(ConfigError::TooManyBlocks { num_blocks: max + 1, max });
        "BlockPool::builder: usize::MAX blocks", none,
            |_w| BlockPool::builder(usize::MAX, 1).build().map_or_else(Got::Config, |p| value(p.num_blocks()))
            => Got::Config(ConfigError::TooManyBlocks { num_blocks: usize::MAX, max });
        "BlockPool::builder: usize::MAX block size", none,
            |_w| BlockPool::builder(2, usize::MAX).build().map_or_else(Got::Config, |p| value(p.num_blocks()))
            => Got::Config(ConfigError::SlotCountOverflow { num_blocks: 2, block_size: usize::MAX });
        "BlockPool::builder: slots past usize::MAX at MAX_BLOCKS", none,
            |_w| BlockPool::builder(BlockPool::MAX_BLOCKS, usize::MAX / BlockPool::MAX_BLOCKS + 1).build().map_or_else(Got::Config, |p| value(p.num_blocks()))
            => Got::Config(ConfigError::SlotCountOverflow { num_blocks: max, block_size: usize::MAX / max + 1 });
        "BlockPool::builder: 0 shards", none,
            |_w| BlockPool::builder(BLOCKS, BS).shards(0).build().map_or_else(Got::Config, |p| value(p.shards()))
            => Got::Config(ConfigError::BadShardCount { shards: 0, max: BlockPool::MAX_SHARDS });
        "BlockPool::builder: MAX_SHARDS + 1 shards", none,
            |_w| BlockPool::builder(BLOCKS, BS).shards(BlockPool::MAX_SHARDS + 1).build().map_or_else(Got::Config, |p| value(p.shards()))
            => Got::Config(ConfigError::BadShardCount { shards: BlockPool::MAX_SHARDS + 1, max: BlockPool::MAX_SHARDS });
        "BlockPool::builder: usize::MAX shards", none,
            |_w| BlockPool::builder(BLOCKS, BS).shards(usize::MAX).build().map_or_else(Got::Config, |p| value(p.shards()))
            => Got::Config(ConfigError::BadShardCount { shards: usize::MAX, max: BlockPool::MAX_SHARDS });
        "BlockPool::builder: a zero block size is checked before the shards", none,
            |_w| BlockPool::builder(BLOCKS, 0).shards(0).build().map_or_else(Got::Config, |p| value(p.shards()))
            => Got::Config(ConfigError::ZeroBlockSize);
        "BlockPool::new: zero block size", none,
            |_w| value(BlockPool::new(BLOCKS, 0)) => panics("block_size must be non-zero");
        "BlockPool::new: MAX_BLOCKS + 1", none,
            |_w| value(BlockPool::new(BlockPool::MAX_BLOCKS + 1, 1))
            => panics("num_blocks 4294967296 does not fit the block id type (max 4294967295)");
        "BlockPool::new: slots past usize::MAX", none,
            |_w| value(BlockPool::new(2, usize::MAX)) => panics("num_blocks * block_size overflows usize");
        "BlockPool::with_shards: 0 shards", none,
            |_w| value(BlockPool::with_shards(BLOCKS, BS, 0)) => panics("shards must be in 1..=1024, got 0");
        "BlockPool::with_shards: usize::MAX shards", none,
            |_w| value(BlockPool::with_shards(BLOCKS, BS, usize::MAX)) => panics("shards must be in 1..=1024");
        "BlockPool::default_shards: 0 and usize::MAX blocks", none,
            |_w| value((BlockPool::default_shards(0), BlockPool::default_shards(usize::MAX))) => value((1usize, 16usize));
        "BlockPool::try_alloc: 0", none, |w| reserve(w.pool.try_alloc(0, &mut w.out)) => value(());
        "BlockPool::try_alloc: one more than free", none,
            |w| reserve(w.pool.try_alloc(4, &mut w.out)) => full(4, 3);
        "BlockPool::try_alloc: num_blocks + 1", none,
            |w| reserve(w.pool.try_alloc(BLOCKS + 1, &mut w.out)) => never_fits(BLOCKS + 1, BLOCKS);
        "BlockPool::try_alloc: usize::MAX", none,
            |w| reserve(w.pool.try_alloc(usize::MAX, &mut w.out)) => never_fits(usize::MAX, BLOCKS);
        "BlockPool::try_alloc: 1, full pool", fill, |w| reserve(w.pool.try_alloc(1, &mut w.out)) => full(1, 0);
        "BlockPool::try_alloc: 0, closed", close, |w| reserve(w.pool.try_alloc(0, &mut w.out)) => closed();
        "BlockPool::try_alloc: usize::MAX, closed", close,
            |w| reserve(w.pool.try_alloc(usize::MAX, &mut w.out)) => closed();
        "BlockPool::try_alloc_with_headroom: headroom past capacity", none,
            |w| reserve(w.pool.try_alloc_with_headroom(1, BLOCKS, &mut w.out)) => never_fits(1, BLOCKS);
        "BlockPool::try_alloc_with_headroom: usize::MAX twice", none,
            |w| reserve(w.pool.try_alloc_with_headroom(usize::MAX, usize::MAX, &mut w.out)) => never_fits(usize::MAX, BLOCKS);
        "BlockPool::try_alloc_with_headroom: headroom not free", none,
            |w| reserve(w.pool.try_alloc_with_headroom(1, 3, &mut w.out)) => full(1, 3);
        "BlockPool::try_alloc_with_headroom: closed", close,
            |w| reserve(w.pool.try_alloc_with_headroom(1, 0, &mut w.out)) => closed();
        "BlockPool::alloc: num_blocks + 1", none,
            |w| polled(w.pool.alloc(BLOCKS + 1, &mut w.out)) => never_fits(BLOCKS + 1, BLOCKS);
        "BlockPool::alloc: usize::MAX", none,
            |w| polled(w.pool.alloc(usize::MAX, &mut w.out)) => never_fits(usize::MAX, BLOCKS);
        "BlockPool::alloc: closed", close, |w| polled(w.pool.alloc(1, &mut w.out)) => closed();
        "BlockPool::alloc_blocking: usize::MAX", none,
            |w| reserve(w.pool.alloc_blocking(usize::MAX, &mut w.out, None)) => never_fits(usize::MAX, BLOCKS);
        "BlockPool::alloc_blocking: one more than free, no wait", none,
            |w| reserve(w.pool.alloc_blocking(4, &mut w.out, NOW)) => full(4, 3);
        "BlockPool::alloc_blocking: closed", close,
            |w| reserve(w.pool.alloc_blocking(1, &mut w.out, None)) => closed();
        "BlockPool::free: nothing", none, |w| free(w.pool.free(&[])) => value(());
        "BlockPool::free: id num_blocks", none,
            |w| free(w.pool.free(&[id(BLOCKS as u32)])) => Got::Free(FreeError::OutOfRange { id: id(BLOCKS as u32), num_blocks: BLOCKS });
        "BlockPool::free: id u32::MAX", none,
            |w| free(w.pool.free(&[id(u32::MAX)])) => Got::Free(FreeError::OutOfRange { id: id(u32::MAX), num_blocks: BLOCKS });
        "BlockPool::free: a held block, then one out of range", none,
            |w| free(w.pool.free(&[w.c.blocks()[0], id(BLOCKS as u32)])) => Got::Free(FreeError::OutOfRange { id: id(BLOCKS as u32), num_blocks: BLOCKS });
        "BlockPool::free: a free block", none,
            |w| { let f = free_block(w); free(w.pool.free(&[f])) } => Got::Free(FreeError::NotAllocated { id: id(FREE_ID) });
        "BlockPool::free: a held block, then a free one", none,
            |w| { let f = free_block(w); free(w.pool.free(&[w.c.blocks()[0], f])) } => Got::Free(FreeError::NotAllocated { id: id(FREE_ID) });
        "BlockPool::free: the evictable cached block", none,
            |w| { let e = evictable_block(w); free(w.pool.free(&[e])) } => Got::Free(FreeError::NotAllocated { id: id(EVICTABLE_ID) });
        "BlockPool::free: a sequence's block", none,
            |w| free(w.pool.free(&[w.c.blocks()[1]])) => Got::Free(FreeError::HeldBySequence { id: id(C1_ID) });
        "BlockPool::free: a block two sequences share", none,
            |w| { let s = w.a.blocks()[0]; free(w.pool.free(&[s])) } => Got::Free(FreeError::HeldBySequence { id: id(SHARED_ID) });
        "BlockPool::free: a taken block, then a sequence's block", fill,
            |w| free(w.pool.free(&[w.taken[0], w.c.blocks()[1]])) => Got::Free(FreeError::HeldBySequence { id: id(C1_ID) });
        "BlockPool::free: a sequence's block, then a free one", none,
            |w| { let f = free_block(w); free(w.pool.free(&[w.c.blocks()[1], f])) } => Got::Free(FreeError::NotAllocated { id: id(FREE_ID) });
        "BlockPool::free: a taken block, twice", fill,
            |w| free(w.pool.free(&[w.taken[0], w.taken[0]])) => Got::Free(FreeError::OverFreed { id: id(FREE_ID) });
        "BlockPool::free: 17 ids, one listed twice (the long check)", fill,
            |w| {
                let (t0, t1, t2) = (w.taken[0], w.taken[1], w.taken[2]);
                let mut ids = vec![t0, t1];
                ids.extend(std::iter::repeat(t2).take(15));
                free(w.pool.free(&ids))
            } => Got::Free(FreeError::OverFreed { id: id(EVICTABLE_ID) });
        "BlockPool::free: a foreign id in range, free here", none,
            |w| free(w.pool.free(&[w.foreign[FREE_ID as usize]])) => Got::Free(FreeError::NotAllocated { id: id(FREE_ID) });
        "BlockPool::free: a foreign id out of range", none,
            |w| free(w.pool.free(&[w.foreign[11]])) => Got::Free(FreeError::OutOfRange { id: id(11), num_blocks: BLOCKS });
        "BlockPool::free: a free block, closed", close,
            |w| { let f = free_block(w); free(w.pool.free(&[f])) } => Got::Free(FreeError::NotAllocated { id: id(FREE_ID) });
        "BlockPool::ref_count: id num_blocks", none, |w| value(w.pool.ref_count(id(BLOCKS as u32))) => value(None::<usize>);
        "BlockPool::ref_count: id u32::MAX", none, |w| value(w.pool.ref_count(id(u32::MAX))) => value(None::<usize>);
        "BlockPool::complete: a fence never used", none, |w| value(w.pool.complete(999)) => value(0usize);
        "BlockPool::complete: u64::MAX", none, |w| value(w.pool.complete(u64::MAX)) => value(0usize);
        "BlockPool::complete_all: nothing retired", none, |w| value(w.pool.complete_all()) => value(0usize);
        "BlockPool::complete: closed", close, |w| value(w.pool.complete(0)) => value(0usize);
        "BlockPool::close: twice", close, |w| value(w.pool.close()) => value(());
        "BlockId::new: u32::MAX", none, |_w| value(id(u32::MAX).index()) => value(u32::MAX as usize);
        "BlockPoolBuilder::prefix_cache(false): a publish caches nothing, a match misses", none,
            |w| {
                let core = Arc::new(BlockPool::builder(BLOCKS, BS).build().unwrap());
                let mut s = Sequence::new(Arc::clone(&core));
                s.try_append(2 * BS).unwrap();
                let published = s.publish(&w.kc);
                let matched = Sequence::new(Arc::clone(&core)).try_match_prefix(&w.kc);
                value((published, matched, core.cached_blocks(), core.prefix_stats()))
            } => value((0usize, 0usize, 0usize, PrefixStats::default()));
        "BlockPoolBuilder::prefix_cache(false): a reset drops nothing", none,
            |_w| value(BlockPool::builder(BLOCKS, BS).build().unwrap().reset_prefix_cache()) => value(0usize);
        "BlockPool::add_refs: nothing", none, |w| free(w.pool.add_refs(&[])) => value(());
        "BlockPool::add_refs: a free block", none,
            |w| { let f = free_block(w); free(w.pool.add_refs(&[f])) } => Got::Free(FreeError::NotAllocated { id: id(FREE_ID) });
        "BlockPool::add_refs: a sequence's block", none,
            |w| free(w.pool.add_refs(&[w.c.blocks()[1]])) => Got::Free(FreeError::HeldBySequence { id: id(C1_ID) });
        "BlockPool::add_refs: a shared sequence's block", none,
            |w| free(w.pool.add_refs(&[w.a.blocks()[0]])) => Got::Free(FreeError::HeldBySequence { id: id(SHARED_ID) });
        "BlockPool::add_refs: a taken block, then a sequence's block", fill,
            |w| free(w.pool.add_refs(&[w.taken[0], w.c.blocks()[1]])) => Got::Free(FreeError::HeldBySequence { id: id(C1_ID) });
        "BlockPool::add_refs: a sequence's block, then a free one", none,
            |w| { let f = free_block(w); free(w.pool.add_refs(&[w.c.blocks()[1], f])) } => Got::Free(FreeError::NotAllocated { id: id(FREE_ID) });
        "BlockPool::add_refs: an evictable block", none,
            |w| { let e = evictable_block(w); free(w.pool.add_refs(&[e])) } => Got::Free(FreeError::NotAllocated { id: id(EVICTABLE_ID) });
        "BlockPool::add_refs: a taken block, then one out of range", fill,
            |w| free(w.pool.add_refs(&[w.taken[0], id(BLOCKS as u32)])) => Got::Free(FreeError::OutOfRange { id: id(BLOCKS as u32), num_blocks: BLOCKS });
        "BlockPool::add_refs: a foreign id out of range", none,
            |w| free(w.pool.add_refs(&[w.foreign[11]])) => Got::Free(FreeError::OutOfRange { id: id(11), num_blocks: BLOCKS });
        "BlockPool::add_refs: id u32::MAX", none,
            |w| free(w.pool.add_refs(&[id(u32::MAX)])) => Got::Free(FreeError::OutOfRange { id: id(u32::MAX), num_blocks: BLOCKS });
        "BlockPool::add_refs: a free block, closed", close,
            |w| { let f = free_block(w); free(w.pool.add_refs(&[f])) } => Got::Free(FreeError::NotAllocated { id: id(FREE_ID) });
        "BlockAllocator::needs_copy: id num_blocks", none,
            |w| value(w.pool.needs_copy(id(BLOCKS as u32))) => panics("block 8 is out of range");
    ]
}

/// The ids the world's layout gives (checked by `layout_is_as_the_rows_assume`).
const SHARED_ID: u32 = 0;
const C1_ID: u32 = 4;
const EVICTABLE_ID: u32 = 5;
const FREE_ID: u32 = 6;
/// The blocks sequence `a` holds: a sequence's `NeverFits` counts the pool
/// less its own blocks.
const A_HOLDS: usize = 2;

/// A block of the pool that no one holds and no key names.
fn free_block(w: &World) -> BlockId {
    let f = id(FREE_ID);
    assert_eq!(w.pool.ref_count(f), Some(0));
    f
}

/// The cached block no one holds.
fn evictable_block(w: &World) -> BlockId {
    let e = id(EVICTABLE_ID);
    assert_eq!(w.pool.ref_count(e), Some(0));
    e
}

/// Sequences: appends, reservations, prefix matches and publishes, slots,
/// truncates, retirements, forks.
fn sequence_rows() -> Vec<Row> {
    rows![
        "Sequence::with_capacity: usize::MAX tokens", none,
            |w| { let s = Sequence::with_capacity(Arc::clone(&w.pool), usize::MAX); value((s.len(), s.blocks().len())) }
            => value((0usize, 0usize));
        "Sequence::try_append: 0", none, |w| reserve(w.a.try_append(0)) => value(6..6usize);
        "Sequence::try_append: one block more than free", none,
            |w| reserve(w.a.try_append(2 + 3 * BS + 1)) => full(4, 3);
        "Sequence::try_append: usize::MAX", none,
            |w| reserve(w.a.try_append(usize::MAX)) => never_fits(BEYOND, BLOCKS - A_HOLDS);
        "Sequence::try_append: a new block, full pool", fill, |w| reserve(w.a.try_append(3)) => full(1, 0);
        "Sequence::try_append: a new block, closed", close, |w| reserve(w.a.try_append(3)) => closed();
        "Sequence::try_append: into a shared tail", truncate_into_shared,
            |w| reserve(w.a.try_append(1)) => panics("append with Sequence::try_append_cow");
        "Sequence::try_append_cow: usize::MAX", none,
            |w| reserve(w.a.try_append_cow(usize::MAX)) => never_fits(BEYOND, BLOCKS - A_HOLDS);
        "Sequence::try_append_cow: into a shared tail, full pool", |w| { truncate_into_shared(w); fill(w) },
            |w| reserve(w.a.try_append_cow(1)) => full(1, 0);
        "Sequence::try_append_cow: into a shared tail, closed", |w| { truncate_into_shared(w); close(w) },
            |w| reserve(w.a.try_append_cow(1)) => closed();
        "Sequence::try_reserve: 0 tokens, usize::MAX headroom", none,
            |w| reserve(w.a.try_reserve(0, usize::MAX)) => value(());
        "Sequence::try_reserve: usize::MAX tokens", none,
            |w| reserve(w.a.try_reserve(usize::MAX, 0)) => never_fits(BEYOND, BLOCKS - A_HOLDS);
        "Sequence::try_reserve: usize::MAX headroom", none,
            |w| reserve(w.a.try_reserve(3, usize::MAX)) => never_fits(1, BLOCKS - A_HOLDS);
        "Sequence::try_reserve: one block more than free", none,
            |w| reserve(w.a.try_reserve(2 + 3 * BS + 1, 0)) => full(4, 3);
        "Sequence::try_reserve: headroom not free", none,
            |w| reserve(w.a.try_reserve(3, 3)) => full(1, 3);
        "Sequence::try_reserve: closed", close, |w| reserve(w.a.try_reserve(3, 0)) => closed();
        "Sequence::reserve: usize::MAX tokens", none,
            |w| polled(w.a.reserve(usize::MAX, 0)) => never_fits(BEYOND, BLOCKS - A_HOLDS);
        "Sequence::reserve: usize::MAX headroom", none,
            |w| polled(w.a.reserve(3, usize::MAX)) => never_fits(1, BLOCKS - A_HOLDS);
        "Sequence::reserve: closed", close, |w| polled(w.a.reserve(3, 0)) => closed();
        "Sequence::reserve_blocking: usize::MAX tokens", none,
            |w| reserve(w.a.reserve_blocking(usize::MAX, 0, None)) => never_fits(BEYOND, BLOCKS - A_HOLDS);
        "Sequence::reserve_blocking: one block more than free, no wait", none,
            |w| reserve(w.a.reserve_blocking(2 + 3 * BS + 1, 0, NOW)) => full(4, 3);
        "Sequence::reserve_blocking: closed", close,
            |w| reserve(w.a.reserve_blocking(3, 0, None)) => closed();
        "Sequence::try_match_prefix: no keys", none,
            |w| { let mut s = Sequence::new(Arc::clone(&w.pool)); value(s.try_match_prefix(&[])) } => value(0usize);
        "Sequence::try_match_prefix: a sequence that holds tokens", none,
            |w| { let kc = w.kc.clone(); value(w.a.try_match_prefix(&kc)) } => value(0usize);
        "Sequence::try_match_prefix: the evictable key, closed", close,
            |w| { let mut s = Sequence::new(Arc::clone(&w.pool)); value((s.try_match_prefix(&w.ke), s.blocks().len())) }
            => value((0usize, 0usize));
        "Sequence::try_match_prefix: the evictable key, full pool", fill,
            |w| { let mut s = Sequence::new(Arc::clone(&w.pool)); value((s.try_match_prefix(&w.ke), s.blocks().len())) }
            => value((0usize, 0usize));
        "Sequence::publish: no keys", none, |w| value(w.c.publish(&[])) => value(0usize);
        "Sequence::publish: blocks already cached, more keys than blocks", none,
            |w| { let mut k = w.kc.clone(); k.extend(keys(b"extra", 2)); value(w.c.publish(&k)) } => value(0usize);
        "Sequence::publish: a key another block holds", none,
            |w| { let k = vec![w.kc[0]]; value(w.a.publish(&k)) } => value(0usize);
        "Sequence::publish: a key the evictable block holds", none,
            |w| { let k = w.ke.clone(); value(w.a.publish(&k)) } => value(0usize);
        "Sequence::publish: no full block", none,
            |w| { let mut s = Sequence::new(Arc::clone(&w.pool)); value(s.publish(&w.ke)) } => value(0usize);
        "Sequence::slot: len", none, |w| value(w.a.slot(6)) => value(None::<usize>);
        "Sequence::slot: usize::MAX", none, |w| value(w.a.slot(usize::MAX)) => value(None::<usize>);
        "Sequence::slot: an empty sequence", none,
            |w| value(Sequence::new(Arc::clone(&w.pool)).slot(0)) => value(None::<usize>);
        "Sequence::extend_slots: one past len", none,
            |w| w.a.extend_slots(6..7, &mut w.slots).map_or_else(Got::Position, value) => position(6, 6);
        "Sequence::extend_slots: 0..usize::MAX", none,
            |w| w.a.extend_slots(0..usize::MAX, &mut w.slots).map_or_else(Got::Position, value) => position(usize::MAX - 1, 6);
        "Sequence::extend_slots: empty at usize::MAX", none,
            |w| w.a.extend_slots(usize::MAX..usize::MAX, &mut w.slots).map_or_else(Got::Position, value) => value(());
        "Sequence::extend_slots: reversed", none,
            |w| w.a.extend_slots(backwards(), &mut w.slots).map_or_else(Got::Position, value) => value(());
        "Sequence::truncate: len", none, |w| value(w.a.truncate(6)) => value(0usize);
        "Sequence::truncate: usize::MAX", none, |w| value(w.a.truncate(usize::MAX)) => value(0usize);
        "Sequence::truncate_fenced: usize::MAX, fence u64::MAX", none,
            |w| value(w.a.truncate_fenced(usize::MAX, u64::MAX)) => value(0usize);
        "Sequence::retire_copy_source: none kept", none, |w| value(w.a.retire_copy_source(3)) => value(0usize);
        "Sequence::retire: an empty sequence, fence u64::MAX", none,
            |w| value(Sequence::new(Arc::clone(&w.pool)).retire(u64::MAX)) => value(0usize);
        "Sequence::shrink_to_fit: nothing reserved", none, |w| value(w.a.shrink_to_fit()) => value(0usize);
        "Sequence::try_fork: a partly filled tail, full pool", fill,
            |w| reserve(w.a.try_fork().map(|(child, copy)| (child.len(), copy))) => full(1, 0);
        "Sequence::try_fork: a partly filled tail, closed", close,
            |w| reserve(w.a.try_fork().map(|(child, copy)| (child.len(), copy))) => closed();
    ]
}

/// The blocks `usize::MAX` more tokens add to `a` (6 tokens in 2 blocks
/// of 4: the 2 free slots of its tail take the first 2).
const BEYOND: usize = (usize::MAX - 2).div_ceil(BS);

/// An empty range that starts after it ends.
#[allow(clippy::reversed_empty_ranges)]
fn backwards() -> Range<usize> {
    5..3
}

/// The block-table arithmetic and block keys.
fn table_and_hash_rows() -> Vec<Row> {
    rows![
        "table::blocks_for: zero block size", none, |_w| value(table::blocks_for(1, 0)) => panics("by zero");
        "table::tail: zero block size", none, |_w| value(table::tail(1, 0)) => panics("by zero");
        "table::growth: zero block size", none, |_w| value(table::growth(0, 0, 1, 0)) => panics("by zero");
        "table::entries: zero block size", none, |_w| value(table::entries(1, 0, 8)) => panics("by zero");
        "table::blocks_for: usize::MAX tokens", none,
            |_w| value((table::blocks_for(usize::MAX, 1), table::blocks_for(usize::MAX, usize::MAX)))
            => value((usize::MAX, 1usize));
        "table::tail: usize::MAX tokens", none, |_w| value(table::tail(usize::MAX, 1)) => value((usize::MAX, 0usize));
        "table::growth: slots past usize::MAX", none,
            |_w| value(table::growth(0, 2, 1, usize::MAX)) => value((0usize, 1usize));
        "table::growth: tokens past usize::MAX", none,
            |_w| value(table::growth(usize::MAX, 0, usize::MAX, 1)) => value((usize::MAX, 0usize));
        "table::growth: a table too short for its tokens", none,
            |_w| value(table::growth(9, 1, 0, 4)) => value((2usize, 0usize));
        "table::entries: usize::MAX everything", none,
            |_w| value(table::entries(usize::MAX, 1, usize::MAX)) => value(usize::MAX);
        "hash_blocks: zero block size", none,
            |w| value(hash_blocks(b"", &[1, 2, 3], 0, &mut w.keys)) => panics("block_size must be non-zero");
        "hash_blocks: no tokens", none,
            |w| value(hash_blocks(b"", &[], BS, &mut w.keys)) => value(());
        "hash_blocks: fewer tokens than a block", none,
            |w| value(hash_blocks(b"", &[1, 2, 3], BS, &mut w.keys)) => value(());
        "hash_blocks: usize::MAX block size", none,
            |w| value(hash_blocks(b"", &[1, 2, 3], usize::MAX, &mut w.keys)) => value(());
        "BlockHash::first: no token", none,
            |_w| value(BlockHash::first(b"", &[])) => panics("a block must hold a token");
        "BlockHash::next: no token", none,
            |_w| value(BlockHash([0; 32]).next(&[])) => panics("a block must hold a token");
    ]
}

/// The hybrid rows' groups: a full-attention group and a sliding window of
/// one block.
fn hgroups() -> KvGroups {
    KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: BS }]).unwrap()
}

/// `h`: 12 tokens published in both groups (under `hk`), then one more,
/// whose window (positions 9..=12) lets the sliding group give back its
/// cached blocks 0 and 1 (evictable now): the full group holds 4 blocks,
/// the sliding group `[NULL, NULL, b2, b3]`, and the pool's other 2 blocks
/// are the evictable ones.
fn hybrid_seq(w: &mut World) {
    let groups = hgroups();
    let mut h = HybridSequence::new(Arc::clone(&w.hpool), groups.clone());
    h.try_append(3 * BS).unwrap();
    let hk = groups.keys(&keys(b"h", 3));
    assert_eq!(h.publish(&hk), Ok(6));
    assert_eq!(h.try_append(1).unwrap(), 12..13);
    w.h = Some(h);
    w.hk = Some(hk);
}

/// `h`, and every free block of its pool taken (the evictable ones too:
/// the sliding group's blocks 0 and 1 lose their keys).
fn hybrid_fill(w: &mut World) {
    hybrid_seq(w);
    let free = w.hpool.free_blocks();
    w.hpool.try_alloc(free, &mut w.htaken).unwrap();
}

/// `h`, and one of its pool's 2 free blocks taken.
fn hybrid_one_free(w: &mut World) {
    hybrid_seq(w);
    w.hpool.try_alloc(1, &mut w.htaken).unwrap();
}

/// `h`, its pool closed.
fn hybrid_closed(w: &mut World) {
    hybrid_seq(w);
    w.close();
}

fn h(w: &mut World) -> &mut HybridSequence {
    w.h.as_mut().unwrap()
}

/// The blocks `usize::MAX` more tokens add to each of `h`'s groups (13
/// tokens: the 3 free slots of each tail take the first 3).
const H_BEYOND: usize = (usize::MAX - 3).div_ceil(BS);
/// What `h` may ever take: the pool less the 6 blocks it holds.
const H_ROOM: usize = BLOCKS - 6;
/// The block of `h`'s sliding group at entry 2.
const H_SLIDING2_ID: u32 = 5;
/// Block 0 of `h`'s sliding group, which its window gave back (evictable).
const H_GIVEN_BACK_ID: u32 = 3;

/// Groups, group keys and hybrid sequences: appends, reservations, slots,
/// truncates, forks, prefix matches and publishes.
fn hybrid_rows() -> Vec<Row> {
    let max = KvGroups::MAX_GROUPS;
    rows![
        "KvGroups::new: no group", none,
            |_w| KvGroups::new([]).map_or_else(Got::Groups, |g| value(g.len())) => Got::Groups(KvGroupsError::Empty);
        "KvGroups::new: MAX_GROUPS + 1", none,
            |_w| KvGroups::new(std::iter::repeat(KvGroup::Full).take(KvGroups::MAX_GROUPS + 1)).map_or_else(Got::Groups, |g| value(g.len()))
            => Got::Groups(KvGroupsError::TooManyGroups { max });
        "KvGroups::new: a window of 0 tokens", none,
            |_w| KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 0 }]).map_or_else(Got::Groups, |g| value(g.len()))
            => Got::Groups(KvGroupsError::ZeroWindow { group: 1 });
        "KvGroups::new: a chunk of 0 tokens", none,
            |_w| KvGroups::new([KvGroup::Full, KvGroup::ChunkedLocal { chunk_tokens: 0 }]).map_or_else(Got::Groups, |g| value(g.len()))
            => Got::Groups(KvGroupsError::ZeroChunk { group: 1 });
        "KvGroups::get: past the last group", none, |_w| value(hgroups().get(2)) => value(None::<KvGroup>);
        "KvGroups::key: past the last group", none,
            |_w| value(hgroups().key(usize::MAX, &BlockHash([1; 32]))) => value(None::<BlockHash>);
        "KvGroups::keys: no key", none, |_w| value(hgroups().keys(&[]).blocks()) => value(0usize);
        "KvGroup::first_needed_block: zero block size", none,
            |_w| value(KvGroup::Full.first_needed_block(1, 0)) => panics("by zero");
        "KvGroup::first_needed_block: usize::MAX tokens", none,
            |_w| value((
                KvGroup::SlidingWindow { window_tokens: 1 }.first_needed_block(usize::MAX, 1),
                KvGroup::SlidingWindow { window_tokens: usize::MAX }.first_needed_block(usize::MAX, 1),
            )) => value((usize::MAX, 1usize));
        "GroupKeys::group: past the last group", none,
            |_w| value(GroupKeys::new(&hgroups()).group(2).map(<[BlockHash]>::len)) => value(None::<usize>);
        "GroupKeys::truncate: usize::MAX", hybrid_seq,
            |w| { let hk = w.hk.as_mut().unwrap(); hk.truncate(usize::MAX); value(hk.blocks()) } => value(3usize);
        "HybridSequence::with_capacity: usize::MAX tokens", none,
            |w| { let s = HybridSequence::with_capacity(Arc::clone(&w.hpool), hgroups(), usize::MAX); value((s.len(), s.held_blocks())) }
            => value((0usize, 0usize));
        "HybridSequence::blocks: past the last group", hybrid_seq,
            |w| value((h(w).blocks(2).is_none(), h(w).null_blocks(usize::MAX))) => value((true, None::<usize>));
        "HybridSequence::slot: past the last group", hybrid_seq, |w| value(h(w).slot(2, 0)) => value(None::<usize>);
        "HybridSequence::slot: len", hybrid_seq, |w| value(h(w).slot(0, 13)) => value(None::<usize>);
        "HybridSequence::slot: a given-back block", hybrid_seq, |w| value(h(w).slot(1, 7)) => value(None::<usize>);
        "HybridSequence::extend_slots: past the last group", hybrid_seq,
            |w| { let h = w.h.as_ref().unwrap(); hybrid(h.extend_slots(2, 0..1, &mut w.slots)) }
            => Got::Hybrid(HybridError::NoSuchGroup { group: 2, groups: 2 });
        "HybridSequence::extend_slots: one past len", hybrid_seq,
            |w| { let h = w.h.as_ref().unwrap(); hybrid(h.extend_slots(0, 12..14, &mut w.slots)) }
            => Got::Hybrid(HybridError::Position(PositionError { position: 13, len: 13 }));
        "HybridSequence::extend_slots: 0..usize::MAX", hybrid_seq,
            |w| { let h = w.h.as_ref().unwrap(); hybrid(h.extend_slots(1, 0..usize::MAX, &mut w.slots)) }
            => Got::Hybrid(HybridError::Position(PositionError { position: usize::MAX - 1, len: 13 }));
        "HybridSequence::extend_slots: from a given-back block", hybrid_seq,
            |w| { let h = w.h.as_ref().unwrap(); hybrid(h.extend_slots(1, 7..13, &mut w.slots)) }
            => Got::Hybrid(HybridError::OutsideWindow { group: 1, position: 7, first_held: 8 });
        "HybridSequence::extend_slots: reversed, past the last group", hybrid_seq,
            |w| { let h = w.h.as_ref().unwrap(); hybrid(h.extend_slots(2, backwards(), &mut w.slots)) }
            => Got::Hybrid(HybridError::NoSuchGroup { group: 2, groups: 2 });
        "HybridSequence::extend_slots: reversed", hybrid_seq,
            |w| { let h = w.h.as_ref().unwrap(); hybrid(h.extend_slots(1, backwards(), &mut w.slots)) } => value(());
        "HybridSequence::try_append: 0", hybrid_seq, |w| reserve(h(w).try_append(0)) => value(13..13usize);
        "HybridSequence::try_append: usize::MAX", hybrid_seq,
            |w| reserve(h(w).try_append(usize::MAX)) => never_fits(2 * H_BEYOND, H_ROOM);
        "HybridSequence::try_append: more than the pool holds beside it", hybrid_seq,
            |w| reserve(h(w).try_append(3 + BS + 1)) => never_fits(4, H_ROOM);
        "HybridSequence::try_append: a block in each group, one free", hybrid_one_free,
            |w| reserve(h(w).try_append(3 + 1)) => full(2, 1);
        "HybridSequence::try_append: a new block, full pool", hybrid_fill,
            |w| reserve(h(w).try_append(3 + 1)) => full(2, 0);
        "HybridSequence::try_append: a new block, closed", hybrid_closed,
            |w| reserve(h(w).try_append(3 + 1)) => closed();
        "HybridSequence::try_append_cow: usize::MAX", hybrid_seq,
            |w| reserve(w.h.as_mut().unwrap().try_append_cow(usize::MAX, &mut w.copies)) => never_fits(2 * H_BEYOND, H_ROOM);
        "HybridSequence::try_append_fenced: usize::MAX, fence u64::MAX", hybrid_seq,
            |w| reserve(h(w).try_append_fenced(usize::MAX, u64::MAX, &mut Vec::new())) => never_fits(2 * H_BEYOND, H_ROOM);
        "HybridSequence::try_append_fenced: a new block, full pool", hybrid_fill,
            |w| reserve(h(w).try_append_fenced(3 + 1, 0, &mut Vec::new())) => full(2, 0);
        "HybridSequence::try_reserve: 0 tokens, usize::MAX headroom", hybrid_seq,
            |w| reserve(h(w).try_reserve(0, usize::MAX)) => value(());
        "HybridSequence::try_reserve: usize::MAX tokens", hybrid_seq,
            |w| reserve(h(w).try_reserve(usize::MAX, 0)) => never_fits(2 * H_BEYOND, H_ROOM);
        "HybridSequence::try_reserve: usize::MAX headroom", hybrid_seq,
            |w| reserve(h(w).try_reserve(3 + 1, usize::MAX)) => never_fits(2, H_ROOM);
        "HybridSequence::try_reserve: more than the pool holds beside it", hybrid_seq,
            |w| reserve(h(w).try_reserve(3 + BS + 1, 0)) => never_fits(4, H_ROOM);
        "HybridSequence::try_reserve: a block in each group, one free", hybrid_one_free,
            |w| reserve(h(w).try_reserve(3 + 1, 0)) => full(2, 1);
        "HybridSequence::try_reserve: closed", hybrid_closed,
            |w| reserve(h(w).try_reserve(3 + 1, 0)) => closed();
        "HybridSequence::reserve: usize::MAX tokens", hybrid_seq,
            |w| polled(h(w).reserve(usize::MAX, 0)) => never_fits(2 * H_BEYOND, H_ROOM);
        "HybridSequence::reserve: closed", hybrid_closed, |w| polled(h(w).reserve(3 + 1, 0)) => closed();
        "HybridSequence::reserve_blocking: a block in each group, one free, no wait", hybrid_one_free,
            |w| reserve(h(w).reserve_blocking(3 + 1, 0, NOW)) => full(2, 1);
        "HybridSequence::reserve_blocking: closed", hybrid_closed,
            |w| reserve(h(w).reserve_blocking(3 + 1, 0, None)) => closed();
        "HybridSequence::truncate: len", hybrid_seq, |w| hybrid(h(w).truncate(13)) => value(0usize);
        "HybridSequence::truncate: usize::MAX", hybrid_seq, |w| hybrid(h(w).truncate(usize::MAX)) => value(0usize);
        "HybridSequence::truncate: into given-back blocks", hybrid_seq,
            |w| hybrid(h(w).truncate(5)) => Got::Hybrid(HybridError::TruncateOutsideWindow { len: 5, min_len: 11 });
        "HybridSequence::truncate_fenced: into given-back blocks, fence u64::MAX", hybrid_seq,
            |w| hybrid(h(w).truncate_fenced(10, u64::MAX)) => Got::Hybrid(HybridError::TruncateOutsideWindow { len: 10, min_len: 11 });
        "HybridSequence::retire_copy_source: none kept", hybrid_seq, |w| value(h(w).retire_copy_source(3)) => value(0usize);
        "HybridSequence::retire: an empty sequence, fence u64::MAX", none,
            |w| value(HybridSequence::new(Arc::clone(&w.hpool), hgroups()).retire(u64::MAX)) => value(0usize);
        "HybridSequence::shrink_to_fit: nothing reserved", hybrid_seq, |w| value(h(w).shrink_to_fit()) => value(0usize);
        "BlockPool::free: a hybrid sequence's block", hybrid_seq,
            |w| { let b = h(w).blocks(1).unwrap()[2]; free(w.hpool.free(&[b])) } => Got::Free(FreeError::HeldBySequence { id: id(H_SLIDING2_ID) });
        "BlockPool::free: a block a hybrid sequence's window gave back", hybrid_seq,
            |w| free(w.hpool.free(&[id(H_GIVEN_BACK_ID)])) => Got::Free(FreeError::NotAllocated { id: id(H_GIVEN_BACK_ID) });
        "HybridSequence::try_fork: partly filled tails, one block free", hybrid_one_free,
            |w| reserve(w.h.as_ref().unwrap().try_fork(&mut w.copies).map(|c| c.len())) => full(2, 1);
        "HybridSequence::try_fork: partly filled tails, closed", hybrid_closed,
            |w| reserve(w.h.as_ref().unwrap().try_fork(&mut w.copies).map(|c| c.len())) => closed();
        "HybridSequence::try_match_prefix: no keys", none,
            |w| {
                let mut s = HybridSequence::new(Arc::clone(&w.hpool), hgroups());
                hybrid(s.try_match_prefix(&GroupKeys::new(&hgroups())).map(|k| (k, s.held_blocks())))
            } => value((0usize, 0usize));
        "HybridSequence::try_match_prefix: a sequence that holds tokens", hybrid_seq,
            |w| { let hk = w.hk.clone().unwrap(); hybrid(h(w).try_match_prefix(&hk)) } => value(0usize);
        "HybridSequence::try_match_prefix: keys of other groups", hybrid_seq,
            |w| {
                let mut s = HybridSequence::new(Arc::clone(&w.hpool), KvGroups::new([KvGroup::Full]).unwrap());
                hybrid(s.try_match_prefix(w.hk.as_ref().unwrap()).map(|k| (k, s.held_blocks())))
            } => Got::Hybrid(HybridError::OtherGroups);
        "HybridSequence::try_match_prefix: the groups' order swapped", hybrid_seq,
            |w| {
                let swapped = KvGroups::new([KvGroup::SlidingWindow { window_tokens: BS }, KvGroup::Full]).unwrap();
                let mut s = HybridSequence::new(Arc::clone(&w.hpool), swapped);
                hybrid(s.try_match_prefix(w.hk.as_ref().unwrap()).map(|k| (k, s.held_blocks())))
            } => Got::Hybrid(HybridError::OtherGroups);
        "HybridSequence::try_match_prefix: keys no group holds, full pool", hybrid_fill,
            |w| {
                let mut s = HybridSequence::new(Arc::clone(&w.hpool), hgroups());
                let hk = hgroups().keys(&keys(b"x", 3));
                hybrid(s.try_match_prefix(&hk).map(|k| (k, s.held_blocks())))
            } => value((0usize, 0usize));
        "HybridSequence::publish: keys of other groups", hybrid_seq,
            |w| {
                let keys = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap().keys(&keys(b"h", 3));
                hybrid(h(w).publish(&keys))
            } => Got::Hybrid(HybridError::OtherGroups);
        "HybridSequence::publish: blocks already cached, more keys than blocks", hybrid_seq,
            |w| {
                let mut hk = w.hk.clone().unwrap();
                hk.extend(&keys(b"more", 2));
                hybrid(h(w).publish(&hk))
            } => value(0usize);
        "HybridSequence::publish: no full block", hybrid_seq,
            |w| {
                let mut s = HybridSequence::new(Arc::clone(&w.hpool), hgroups());
                hybrid(s.publish(w.hk.as_ref().unwrap()))
            } => value(0usize);
        "HybridSequence::append_needs_copy: tails held alone", hybrid_seq, |w| value(h(w).append_needs_copy()) => value(false);
    ]
}

// ---------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------

thread_local! {
    /// Set while a row runs: its panic is an outcome, not a failure, and
    /// is not printed.
    static IN_ROW: Cell<bool> = const { Cell::new(false) };
}

/// Installs a panic hook that stays quiet for the rows' panics.
fn quiet_rows() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_ROW.with(Cell::get) {
                default(info);
            }
        }));
    });
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string payload".into())
}

/// Runs one row on a fresh world and returns what is wrong, if anything.
fn check(row: &Row) -> Result<(), String> {
    let mut w = World::new();
    (row.setup)(&mut w);
    let before = snap(&w);
    IN_ROW.with(|f| f.set(true));
    let got = catch_unwind(AssertUnwindSafe(|| (row.call)(&mut w)));
    IN_ROW.with(|f| f.set(false));
    let got = got.unwrap_or_else(|p| Got::Panic(panic_message(&*p)));
    match (&got, &row.expect) {
        (Got::Panic(msg), Got::Panic(words)) if msg.contains(words.as_str()) => {}
        (got, expect) if got == expect => {}
        (got, expect) => return Err(format!("got {got:?}, expected {expect:?}")),
    }
    let after = snap(&w);
    if after != before {
        return Err(format!(
            "the state changed:\n  before {before:?}\n  after  {after:?}"
        ));
    }
    teardown(w)
}

/// Drops everything the world holds and checks that the pools are whole
/// again and the counter empty.
fn teardown(w: World) -> Result<(), String> {
    let World {
        counter,
        held,
        pool,
        other,
        foreign,
        a,
        b,
        c,
        taken,
        hpool,
        h,
        htaken,
        ..
    } = w;
    drop((held, a, b, c, h));
    hpool
        .free(&htaken)
        .map_err(|e| format!("hybrid taken blocks: {e}"))?;
    if hpool.complete_all() != 0 || hpool.pending_release_blocks() != 0 {
        return Err("hybrid references were left retired".into());
    }
    let hrefs: Vec<_> = (0..BLOCKS as u32).map(|i| hpool.ref_count(id(i))).collect();
    if hpool.free_blocks() != BLOCKS || hrefs.iter().any(|r| *r != Some(0)) {
        return Err(format!(
            "hybrid blocks still held: {} free, counts {hrefs:?}",
            hpool.free_blocks()
        ));
    }
    if !hpool.is_closed() {
        assert_pool_whole(&hpool);
    }
    pool.free(&taken)
        .map_err(|e| format!("taken blocks: {e}"))?;
    other
        .free(&foreign)
        .map_err(|e| format!("foreign blocks: {e}"))?;
    if pool.complete_all() != 0 || pool.pending_release_blocks() != 0 {
        return Err("references were left retired".into());
    }
    if counter.used() != 0 {
        return Err(format!("the counter kept {} slots", counter.used()));
    }
    let refs: Vec<_> = (0..BLOCKS as u32).map(|i| pool.ref_count(id(i))).collect();
    if pool.free_blocks() != BLOCKS || refs.iter().any(|r| *r != Some(0)) {
        return Err(format!(
            "blocks still held: {} free, counts {refs:?}",
            pool.free_blocks()
        ));
    }
    if !pool.is_closed() {
        assert_pool_whole(&pool);
    }
    assert_pool_whole(&other);
    Ok(())
}

/// Runs every row of a table; fails naming each row that did not hold.
fn census(rows: Vec<Row>) {
    quiet_rows();
    let mut names = std::collections::HashSet::new();
    let failed: Vec<String> = rows
        .iter()
        .inspect(|row| assert!(names.insert(row.name), "two rows named {}", row.name))
        .filter_map(|row| check(row).err().map(|e| format!("{}: {e}", row.name)))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} rows failed:\n{}",
        failed.len(),
        rows.len(),
        failed.join("\n")
    );
}

#[test]
fn layout_is_as_the_rows_assume() {
    let w = World::new();
    assert_eq!(w.a.blocks()[0], id(SHARED_ID));
    assert_eq!(w.a.blocks().len(), A_HOLDS);
    assert_eq!(w.b.blocks()[0], id(SHARED_ID));
    assert_eq!(w.c.blocks()[1], id(C1_ID));
    assert_eq!(w.pool.ref_count(id(SHARED_ID)), Some(2));
    assert_eq!(w.pool.ref_count(id(C1_ID)), Some(1));
    assert_eq!(w.pool.ref_count(id(EVICTABLE_ID)), Some(0));
    assert_eq!(w.pool.evictable_blocks(), 1);
    assert_eq!(w.pool.ref_count(id(FREE_ID)), Some(0));
    assert_eq!(w.foreign[FREE_ID as usize], id(FREE_ID));
    assert_eq!(w.pool.free_blocks(), 3);
    assert_eq!(w.counter.available(), SLOTS - HELD);
    teardown(w).unwrap();
}

#[test]
fn census_of_the_counter() {
    census(counter_rows());
}

#[test]
fn census_of_the_pool() {
    census(pool_rows());
}

#[test]
fn census_of_sequences() {
    census(sequence_rows());
}

#[test]
fn census_of_tables_and_keys() {
    census(table_and_hash_rows());
}

#[test]
fn census_of_hybrid_sequences() {
    census(hybrid_rows());
}

#[test]
fn hybrid_layout_is_as_the_rows_assume() {
    let mut w = World::new();
    hybrid_seq(&mut w);
    let h = w.h.as_ref().unwrap();
    assert_eq!((h.len(), h.held_blocks()), (13, 6));
    assert_eq!(h.blocks(1).unwrap()[..2], [BlockId::NULL; 2]);
    assert_eq!(h.null_blocks(1), Some(2));
    assert_eq!(h.blocks(0).unwrap().len(), 4);
    assert_eq!(w.hpool.used_blocks(), 6);
    assert_eq!(w.hpool.free_blocks(), 2);
    assert_eq!(w.hpool.evictable_blocks(), 2);
    teardown(w).unwrap();
}

/// A row that does not hold is reported: the harness itself can fail.
#[test]
fn the_census_catches_a_wrong_outcome_and_a_changed_state() {
    quiet_rows();
    let wrong_outcome = Row {
        name: "wrong outcome",
        setup: none,
        call: |w| reserve(w.pool.try_alloc(4, &mut w.out)),
        expect: full(4, 2),
    };
    assert!(check(&wrong_outcome)
        .unwrap_err()
        .contains("got Reserve(Full"));
    let changed = Row {
        name: "a call that takes a block",
        setup: none,
        call: |w| reserve(w.pool.try_alloc(1, &mut w.out)),
        expect: value(()),
    };
    assert!(check(&changed).unwrap_err().contains("the state changed"));
    let leaked = Row {
        name: "a call that leaks a block",
        setup: none,
        call: |w| {
            let mut s = Sequence::new(Arc::clone(&w.pool));
            s.try_append(1).unwrap();
            std::mem::forget(s);
            value(())
        },
        expect: value(()),
    };
    assert!(check(&leaked).unwrap_err().contains("the state changed"));
    let mut w = World::new();
    let mut s = Sequence::new(Arc::clone(&w.pool));
    s.try_append(1).unwrap();
    std::mem::forget(s);
    w.out.clear();
    assert!(teardown(w).unwrap_err().contains("blocks still held"));
    let wrong_panic = Row {
        name: "another panic",
        setup: none,
        call: |_w| value(table::tail(1, 0)),
        expect: panics("something else"),
    };
    assert!(check(&wrong_panic).unwrap_err().contains("by zero"));
}

/// A pool too large for memory is refused with `OutOfMemory` (and `new`
/// panics, catchably), never an abort: run in a child process whose
/// address space is limited to 4 GiB, so that the refusal does not depend
/// on the machine's memory.
#[test]
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn a_pool_too_large_for_memory_is_a_typed_error() {
    const CHILD: &str = "KVSLOTS_CENSUS_OOM_CHILD";
    if std::env::var_os(CHILD).is_some() {
        return oom_child();
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 4194304 && exec \"$0\" \"$@\"")
        .arg(exe)
        .args([
            "--exact",
            "a_pool_too_large_for_memory_is_a_typed_error",
            "--test-threads",
            "1",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("oom child: done"), "{text}");
}

/// The child's part: under a 4 GiB address-space limit.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn oom_child() {
    /// The process's address space, in kB.
    fn vm_size() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
    quiet_rows();
    let before = vm_size();
    let oom = |builder: kvslots::BlockPoolBuilder| {
        let bytes = builder.memory_bytes();
        assert_eq!(
            builder.build().map(|p| p.num_blocks()),
            Err(ConfigError::OutOfMemory { bytes })
        );
    };
    // The documented maximum: about 35 GB of bookkeeping for the core
    // pool, 293 GB with the prefix cache.
    oom(BlockPool::builder(BlockPool::MAX_BLOCKS, 1));
    oom(BlockPool::builder(BlockPool::MAX_BLOCKS, 1).prefix_cache(true));
    // 100M blocks with the prefix cache: room for the keys (3.2 GB) is
    // granted under the limit, for the rest not; the keys' room is freed.
    oom(BlockPool::builder(100_000_000, 16).prefix_cache(true));
    IN_ROW.with(|f| f.set(true));
    let new = catch_unwind(|| BlockPool::new(BlockPool::MAX_BLOCKS, 1).num_blocks());
    IN_ROW.with(|f| f.set(false));
    let msg = panic_message(&*new.unwrap_err());
    assert!(msg.contains("out of memory"), "{msg}");
    // Nothing the refusals reserved is left.
    let grown = vm_size().saturating_sub(before);
    assert!(grown < 64 << 10, "the address space grew by {grown} kB");
    let pool = BlockPool::builder(1 << 20, 16).build().unwrap();
    assert_eq!(pool.free_blocks(), 1 << 20);
    println!("oom child: done");
}
