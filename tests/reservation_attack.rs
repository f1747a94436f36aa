//! Attacks on `Sequence::try_match_prefix` into a reservation: the matched
//! blocks take the first reserved blocks' places, a reserved block is lent
//! to pay for each revival, an unused lent credit takes a block back.
//! Deterministic edge cases first, then stress runs with real threads on
//! small pools, checking the documented guarantees after every match and
//! the pool's books after every round. `RESERVATION_ATTACK_ROUNDS=N`
//! scales the rounds and race iterations.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

mod common;

use common::shadow::{replay, Done, Shadow};
use common::{Forward, XorShift};
use kvslots::{BlockAllocator, BlockHash, BlockId, BlockPool, ReserveError, Sequence};

// ---------------------------------------------------------------------
// Keys, tags, helpers
// ---------------------------------------------------------------------

/// A key whose tag (what a block holding it contains) is `t`.
fn key(t: u64) -> BlockHash {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&t.to_le_bytes());
    b[8] = 0xA5;
    BlockHash(b)
}

fn keys(ts: &[u64]) -> Vec<BlockHash> {
    ts.iter().map(|&t| key(t)).collect()
}

/// The books are whole: nothing used, every count zero, every block can
/// be taken once.
fn assert_whole(pool: &BlockPool) {
    pool.complete_all();
    assert_eq!(pool.pending_release_blocks(), 0);
    assert_eq!(pool.used_blocks(), 0, "used after every holder let go");
    assert_eq!(pool.free_blocks(), pool.num_blocks(), "free != num_blocks");
    for i in 0..pool.num_blocks() as u32 {
        assert_eq!(pool.ref_count(BlockId::new(i)), Some(0), "block {i}");
    }
    let mut all = Vec::new();
    let was_closed = pool.is_closed();
    if !was_closed {
        pool.try_alloc(pool.num_blocks(), &mut all)
            .expect("every block can be taken");
        let set: HashSet<_> = all.iter().collect();
        assert_eq!(set.len(), pool.num_blocks(), "distinct ids");
        assert_eq!(pool.free_blocks(), 0, "a used count given back twice");
        assert!(pool.try_alloc(1, &mut Vec::new()).is_err());
        pool.free(&all).unwrap();
        assert_eq!(pool.used_blocks(), 0);
        assert_eq!(pool.free_blocks(), pool.num_blocks());
    }
}

/// A sequence of `blocks` blocks published under `ts` (full blocks).
fn published<A: BlockAllocator + ?Sized>(pool: &Arc<A>, ts: &[u64]) -> Sequence<A> {
    let mut s = Sequence::new(Arc::clone(pool));
    s.try_append(ts.len() * pool.block_size()).unwrap();
    assert_eq!(s.publish(&keys(ts)), ts.len());
    s
}

/// The guarantees right after a match of `k` into a reservation of `r`.
fn check_after_match(pool: &BlockPool, s: &Sequence, r: usize, k: usize, expected: &[BlockId]) {
    let bs = pool.block_size();
    assert_eq!(s.blocks().len(), k + r.saturating_sub(k), "table length");
    assert_eq!(s.len(), k * bs, "len");
    assert!(s.capacity() >= r * bs, "capacity fell");
    let set: HashSet<_> = s.blocks().iter().collect();
    assert_eq!(set.len(), s.blocks().len(), "a block twice in the table");
    if !expected.is_empty() {
        assert_eq!(&s.blocks()[..k], &expected[..k], "matched blocks");
    }
    for &id in &s.blocks()[k..] {
        assert_eq!(pool.ref_count(id), Some(1), "reserved {id} not held alone");
    }
}

// ---------------------------------------------------------------------
// Deterministic edge cases
// ---------------------------------------------------------------------

#[test]
fn edge_every_split_of_reservation_and_match() {
    for bs in [1usize, 2, 4] {
        for n in [4usize, 8, 16] {
            for r in 1..=n / 2 {
                for cached in 0..=n / 2 {
                    for held in [false, true] {
                        let pool = Arc::new(BlockPool::new(n, bs));
                        let ts: Vec<u64> = (1..=cached as u64).collect();
                        let owner = published(&pool, &ts);
                        let owned = owner.blocks().to_vec();
                        let owner = if held {
                            Some(owner)
                        } else {
                            drop(owner);
                            None
                        };
                        let mut s = Sequence::new(Arc::clone(&pool));
                        if s.try_reserve(r * bs, 0).is_err() {
                            continue;
                        }
                        let mut ks = keys(&ts);
                        ks.push(key(999)); // a miss at the end
                        let k = s.try_match_prefix(&ks);
                        assert_eq!(k, cached, "bs {bs} n {n} r {r} cached {cached}");
                        check_after_match(&pool, &s, r, k, &owned);
                        let used = if held { cached } else { 0 } + s.blocks().len()
                            - if held { k } else { 0 };
                        assert_eq!(pool.used_blocks(), used);
                        // Appends up to the old capacity need no allocation,
                        // even with the pool full.
                        let mut rest = Vec::new();
                        let free = pool.free_blocks();
                        pool.try_alloc(free, &mut rest).unwrap();
                        let before = s.blocks().to_vec();
                        let room = r * bs - s.len().min(r * bs);
                        s.try_append(room).unwrap();
                        assert_eq!(s.blocks(), &before[..]);
                        pool.free(&rest).unwrap();
                        drop(s);
                        drop(owner);
                        assert_whole(&pool);
                    }
                }
            }
        }
    }
}

/// Reservations of 8+ blocks from one word are fresh (uncounted
/// references): lending them must still work.
#[test]
fn edge_fresh_reserved_blocks_are_lent() {
    for r in [8usize, 9, 12, 16] {
        for cached in [1usize, 4, 8, 12] {
            let pool = Arc::new(BlockPool::new(32, 2));
            let ts: Vec<u64> = (1..=cached as u64).collect();
            drop(published(&pool, &ts));
            let mut s = Sequence::new(Arc::clone(&pool));
            s.try_reserve(r * 2, 0).unwrap();
            let k = s.try_match_prefix(&keys(&ts));
            assert_eq!(k, cached);
            check_after_match(&pool, &s, r, k, &[]);
            assert_eq!(pool.used_blocks(), s.blocks().len());
            s.try_append(r * 2 - (k * 2).min(r * 2)).unwrap();
            assert_eq!(s.blocks().len(), r.max(k));
            drop(s);
            assert_whole(&pool);
        }
    }
}

#[test]
fn edge_repeated_key_in_a_reservation_match() {
    let pool = Arc::new(BlockPool::new(6, 2));
    drop(published(&pool, &[1, 2]));
    let mut s = Sequence::new(Arc::clone(&pool));
    s.try_reserve(3 * 2, 0).unwrap();
    let k = s.try_match_prefix(&keys(&[1, 1, 2]));
    assert_eq!(k, 1);
    check_after_match(&pool, &s, 3, 1, &[]);
    assert_eq!(pool.used_blocks(), 3);
    drop(s);
    assert_whole(&pool);
}

/// A second match after a miss into the same reservation, and a match
/// after a matched one (not empty: 0).
#[test]
fn edge_match_twice() {
    let pool = Arc::new(BlockPool::new(8, 2));
    drop(published(&pool, &[1, 2, 3]));
    let mut s = Sequence::new(Arc::clone(&pool));
    s.try_reserve(4 * 2, 0).unwrap();
    assert_eq!(s.try_match_prefix(&keys(&[7])), 0);
    assert_eq!(s.blocks().len(), 4);
    assert_eq!(s.try_match_prefix(&keys(&[1, 2, 3])), 3);
    check_after_match(&pool, &s, 4, 3, &[]);
    assert_eq!(s.try_match_prefix(&keys(&[1, 2, 3])), 0);
    drop(s);
    assert_whole(&pool);
}

/// A closed pool revives nothing for a reservation either (as for an
/// empty sequence): the match stops before the first evictable block, and
/// the reservation stays whole.
#[test]
fn a_closed_pool_revives_nothing_for_a_reservation() {
    let pool = Arc::new(BlockPool::new(8, 2));
    drop(published(&pool, &[1, 2, 3]));
    let mut s = Sequence::new(Arc::clone(&pool));
    s.try_reserve(2 * 2, 0).unwrap();
    let table = s.blocks().to_vec();
    pool.close();
    let mut empty = Sequence::new(Arc::clone(&pool));
    assert_eq!(
        empty.try_match_prefix(&keys(&[1, 2, 3])),
        0,
        "empty: closed stops it"
    );
    let before = (
        pool.used_blocks(),
        pool.evictable_blocks(),
        pool.cached_blocks(),
    );
    assert_eq!(s.try_match_prefix(&keys(&[1, 2, 3])), 0);
    assert_eq!((s.len(), s.blocks()), (0, &table[..]));
    assert_eq!(
        (
            pool.used_blocks(),
            pool.evictable_blocks(),
            pool.cached_blocks()
        ),
        before
    );
    drop(s);
    assert_whole(&pool);
}

// ---------------------------------------------------------------------
// Waker panics
// ---------------------------------------------------------------------

const WAKER_PANIC: &str = "a waker that panics (tests/reservation_attack.rs)";

struct Panics;
impl Wake for Panics {
    fn wake(self: Arc<Self>) {
        panic!("{WAKER_PANIC}");
    }
}
struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

fn quiet() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info.payload().downcast_ref::<String>();
            if message.map(String::as_str) != Some(WAKER_PANIC) {
                previous(info);
            }
        }));
    });
}

fn poll<F: Future + ?Sized>(fut: Pin<&mut F>, waker: Waker) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(&waker))
}

/// A waiter for `want` blocks whose waker panics: the match's give-back
/// of the surplus reserved blocks (those that shared blocks replace)
/// grants it. `h` matched blocks are held by their owner, `e` evictable.
#[test]
fn waker_panic_out_of_the_surplus_give_back() {
    quiet();
    for (n, r, h, e, want) in [
        (6usize, 4usize, 2usize, 0usize, 2usize),
        (8, 4, 2, 1, 2),
        (8, 5, 3, 0, 1),
        (10, 5, 3, 2, 3),
        (20, 10, 4, 3, 4),
        (24, 10, 6, 4, 5),
        (18, 9, 8, 1, 8),
    ] {
        let pool = Arc::new(BlockPool::new(n, 2));
        let ts: Vec<u64> = (1..=(h + e) as u64).collect();
        let mut owner = published(&pool, &ts);
        owner.truncate(h * 2); // the last `e` evictable
        let mut s = Sequence::new(Arc::clone(&pool));
        s.try_reserve(r * 2, 0).unwrap();
        // Take what is free but the evictable blocks.
        let mut filler = Vec::new();
        pool.try_alloc(pool.free_blocks() - e, &mut filler).unwrap();
        assert_eq!(pool.free_blocks(), e);
        let mut ids = Vec::new();
        {
            let mut fut = Box::pin(pool.alloc(want, &mut ids));
            assert!(poll(fut.as_mut(), Waker::from(Arc::new(Panics))).is_pending());
            let res = catch_unwind(AssertUnwindSafe(|| s.try_match_prefix(&keys(&ts))));
            let payload = res.expect_err("the waker's panic comes out");
            assert_eq!(
                payload.downcast_ref::<String>().map(String::as_str),
                Some(WAKER_PANIC)
            );
            let granted = poll(fut.as_mut(), Waker::from(Arc::new(Noop)));
            assert!(matches!(granted, Poll::Ready(Ok(()))), "{granted:?}");
        }
        // The sequence is whole: the match counted.
        let k = s.len() / 2;
        assert_eq!(k, h + e, "n {n} r {r}");
        check_after_match(&pool, &s, r, k, &[]);
        let mine: HashSet<_> = s.blocks().iter().collect();
        for id in ids.iter().chain(&filler) {
            assert!(!mine.contains(id), "{id} granted to another and kept");
        }
        assert_eq!(pool.used_blocks(), h + (r - h) + filler.len() + ids.len());
        s.try_append((r - k) * 2).unwrap();
        assert_eq!(s.blocks().len(), r);
        pool.free(&ids).unwrap();
        pool.free(&filler).unwrap();
        drop(s);
        drop(owner);
        assert_whole(&pool);
    }
}

// ---------------------------------------------------------------------
// Custom allocators
// ---------------------------------------------------------------------

#[test]
fn custom_allocator_with_and_without_lending() {
    for lend in [false, true] {
        for (n, r, cached, held) in [
            (8usize, 3usize, 2usize, false),
            (8, 3, 2, true),
            (8, 2, 4, false),
            (16, 9, 5, false),
            (16, 9, 12, false),
        ] {
            let fwd = Forward::new(BlockPool::new(n, 2));
            fwd.lend.store(lend, SeqCst);
            let pool = &fwd.inner;
            let ts: Vec<u64> = (1..=cached as u64).collect();
            let owner = published(&fwd, &ts);
            let owner = if held {
                Some(owner)
            } else {
                drop(owner);
                None
            };
            let mut s = Sequence::new(Arc::clone(&fwd));
            s.try_reserve(r * 2, 0).unwrap();
            let k = s.try_match_prefix(&keys(&ts));
            assert!(k <= cached);
            let bs = 2;
            assert_eq!(s.blocks().len(), k + r.saturating_sub(k));
            assert_eq!(s.len(), k * bs);
            assert!(s.capacity() >= r * bs);
            for &id in &s.blocks()[k..] {
                assert_eq!(pool.ref_count(id), Some(1));
            }
            s.try_append(r * bs - (k * bs).min(r * bs)).unwrap();
            drop(s);
            drop(owner);
            assert_whole(pool);
            if !lend {
                assert_eq!(fwd.lent.load(SeqCst), 0);
            }
        }
    }
}

/// A forwarding allocator that hands the pool a lendable id the pool never
/// handed out (past its end, in the first reserved block's place, which a
/// match lends last): the match panics naming it, before anything
/// changes, and the sequence is whole after it.
#[test]
fn a_foreign_lendable_id_panics_before_anything_changes() {
    let fwd = Forward::new(BlockPool::new(8, 2));
    let pool = &fwd.inner;
    drop(published(&fwd, &[1, 2]));
    let mut s = Sequence::new(Arc::clone(&fwd));
    s.try_reserve(3 * 2, 0).unwrap();
    let reserved = s.blocks().to_vec();
    let books = |pool: &BlockPool| {
        (
            pool.free_blocks(),
            pool.evictable_blocks(),
            pool.cached_blocks(),
        )
    };
    let before = books(pool);
    fwd.foreign_lendable.store(true, SeqCst);
    let panic = catch_unwind(AssertUnwindSafe(|| s.try_match_prefix(&keys(&[1, 2]))))
        .expect_err("a foreign id");
    fwd.foreign_lendable.store(false, SeqCst);
    let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        msg.contains("8 is out of range for a pool of 8 blocks"),
        "{msg}"
    );
    assert_eq!(books(pool), before);
    assert_eq!((s.blocks(), s.len()), (&reserved[..], 0));
    for &id in &reserved {
        assert_eq!(pool.ref_count(id), Some(1));
    }
    assert_eq!(fwd.lent.load(SeqCst), 0);
    // With the pool's own ids, the same match.
    assert_eq!(s.try_match_prefix(&keys(&[1, 2])), 2);
    drop(s);
    assert_whole(pool);
}

/// Over the default (no lending), behind a queued waiter, a match into a
/// reservation revives nothing, and still keeps the capacity.
#[test]
fn custom_allocator_without_lending_behind_waiters() {
    let fwd = Forward::new(BlockPool::new(8, 2));
    fwd.lend.store(false, SeqCst);
    let pool = &fwd.inner;
    drop(published(&fwd, &[1, 2, 3]));
    let mut s = Sequence::new(Arc::clone(&fwd));
    s.try_reserve(4 * 2, 0).unwrap();
    let mut ids = Vec::new();
    let mut fut = Box::pin(pool.alloc(8, &mut ids));
    assert!(poll(fut.as_mut(), Waker::from(Arc::new(Noop))).is_pending());
    let k = s.try_match_prefix(&keys(&[1, 2, 3]));
    assert_eq!(k, 0);
    assert_eq!(s.blocks().len(), 4);
    drop(s);
    let granted = poll(fut.as_mut(), Waker::from(Arc::new(Noop)));
    assert!(matches!(granted, Poll::Ready(Ok(()))));
    drop(fut);
    pool.free(&ids).unwrap();
    assert_whole(pool);
}

// ---------------------------------------------------------------------
// Forks and fences of a matched reservation
// ---------------------------------------------------------------------

#[test]
fn fork_and_fence_a_matched_reservation() {
    for fork_first in [false, true] {
        let pool = Arc::new(BlockPool::new(12, 2));
        drop(published(&pool, &[1, 2, 3]));
        let mut s = Sequence::new(Arc::clone(&pool));
        s.try_reserve(5 * 2, 0).unwrap();
        if fork_first {
            // A fork of a reserved-only sequence shares nothing.
            let (child, copy) = s.try_fork().unwrap();
            assert!(copy.is_none());
            assert!(child.blocks().is_empty());
        }
        assert_eq!(s.try_match_prefix(&keys(&[1, 2, 3])), 3);
        let (mut child, copy) = s.try_fork().unwrap();
        assert!(copy.is_none());
        assert_eq!(child.blocks(), &s.blocks()[..3]);
        // The parent's reserved blocks stay its own.
        for &id in &s.blocks()[3..] {
            assert_eq!(pool.ref_count(id), Some(1));
        }
        let before = s.blocks().to_vec();
        s.try_append(3).unwrap();
        assert_eq!(s.blocks(), &before[..]);
        s.truncate_fenced(7, 9);
        assert_eq!(pool.complete(9), 1, "the fifth block goes");
        s.truncate_fenced(2, 10);
        child.try_append(5).unwrap();
        child.publish(&keys(&[1, 2, 3, 4]));
        assert!(pool.pending_release_blocks() > 0);
        pool.complete(10);
        let r = s.retire(11);
        assert!(r > 0);
        drop(child);
        pool.complete(11);
        assert_whole(&pool);
    }
}

// ---------------------------------------------------------------------
// Stress
// ---------------------------------------------------------------------

/// The prompt family: prompt `p`'s block `i` has tag `i + 1` for the
/// first `p % 3` blocks (a shared prefix), else a tag of its own.
fn prompt(p: usize, len: usize) -> Vec<u64> {
    (0..len)
        .map(|i| {
            if i < p % 3 {
                i as u64 + 1
            } else {
                1000 * (p as u64 + 1) + i as u64
            }
        })
        .collect()
}

/// The shadow of the pool's blocks, and what the attack counts.
struct World {
    pool: Arc<BlockPool>,
    shadow: Shadow,
    matches_into_reservations: AtomicUsize,
    matched_blocks: AtomicUsize,
    lent_paths: AtomicUsize,
}

impl std::ops::Deref for World {
    type Target = Shadow;
    fn deref(&self) -> &Shadow {
        &self.shadow
    }
}

impl World {
    fn new(pool: Arc<BlockPool>) -> Arc<World> {
        let shadow = Shadow::new(pool.num_blocks());
        Arc::new(World {
            pool,
            shadow,
            matches_into_reservations: AtomicUsize::new(0),
            matched_blocks: AtomicUsize::new(0),
            lent_paths: AtomicUsize::new(0),
        })
    }
}

/// A matcher into a reservation: reserve `r` blocks, match a prompt,
/// check every guarantee, append up to the old capacity, publish, maybe
/// fork and fence, drop.
fn matcher(w: &World, rng: &mut XorShift, max_r: usize, blocking: bool, fence: &AtomicU64) {
    let pool = &w.pool;
    let bs = pool.block_size();
    let n = pool.num_blocks();
    let r = 1 + rng.below(max_r.min(n));
    let mut s = Sequence::new(Arc::clone(pool));
    let got = if blocking && rng.chance(15) {
        s.reserve_blocking(r * bs, 0, Some(Duration::from_micros(200)))
    } else if blocking && rng.chance(15) {
        // The async reserve, polled until granted or for a few rounds of
        // wakes (then dropped: the sequence is unchanged).
        let flag = Arc::new(Flag(AtomicBool::new(false), thread::current()));
        let mut fut = Box::pin(s.reserve(r * bs, 0));
        let mut out = Err(ReserveError::Closed);
        for _ in 0..4 {
            flag.0.store(false, SeqCst);
            match poll(fut.as_mut(), Waker::from(Arc::clone(&flag))) {
                Poll::Ready(res) => {
                    out = res;
                    break;
                }
                Poll::Pending => {
                    if !flag.0.load(SeqCst) {
                        thread::park_timeout(Duration::from_micros(100));
                    }
                }
            }
        }
        drop(fut);
        out
    } else {
        s.try_reserve(r * bs, 0)
    };
    if got.is_err() {
        assert!(s.blocks().is_empty());
        return;
    }
    assert_eq!(s.blocks().len(), r);
    let reserved = s.blocks().to_vec();
    let stamp = w.take_fresh(&reserved, "reservation");
    let p = rng.below(6);
    let ts = prompt(p, 1 + rng.below(n));
    let ks = keys(&ts);
    // Checked once the pool cannot hand them out legitimately any more.
    w.check_stamp(&reserved, stamp, "reserved before the match");
    w.give(&reserved);
    let k = s.try_match_prefix(&ks);
    w.matches_into_reservations.fetch_add(1, SeqCst);
    w.matched_blocks.fetch_add(k, SeqCst);
    assert!(k <= ts.len());
    let blocks = s.blocks().to_vec();
    assert_eq!(
        blocks.len(),
        k + r.saturating_sub(k),
        "table length (r {r} k {k})"
    );
    assert_eq!(s.len(), k * bs);
    assert!(s.capacity() >= r * bs, "capacity fell");
    let set: HashSet<_> = blocks.iter().collect();
    assert_eq!(set.len(), blocks.len(), "a block twice in the table");
    w.take_shared(&blocks[..k]);
    w.check_tags(&blocks[..k], &ks, "after the match");
    let stamp2 = w.take_fresh(&blocks[k..], "kept reserved");
    if blocks[k..].iter().any(|id| !reserved.contains(id)) {
        w.lent_paths.fetch_add(1, SeqCst);
    }
    for &id in &blocks[k..] {
        assert_eq!(pool.ref_count(id), Some(1), "reserved {id} not held alone");
    }
    // Appends up to the old capacity: no allocation.
    let room = r * bs - (k * bs).min(r * bs);
    s.try_append(room).expect("append into the reservation");
    assert_eq!(s.blocks(), &blocks[..], "the append allocated");
    w.check_stamp(&blocks[k..], stamp2, "reserved after the append");
    w.check_tags(&blocks[..k], &ks, "matched after the append");
    // Write the prompt's tags into the full blocks beyond the match and
    // publish them.
    let full = (s.len() / bs).min(ts.len());
    if full > k && rng.chance(70) {
        w.write_tags(&blocks[k..full], &ts[k..full]);
        s.publish(&ks[..full]);
    }
    // Maybe a fork and a fenced rollback.
    if rng.chance(20) && s.len() % bs == 0 {
        if let Ok((child, copy)) = s.try_fork() {
            assert!(copy.is_none());
            assert_eq!(child.blocks(), &s.blocks()[..child.blocks().len()]);
            w.take_shared(child.blocks());
            let ids = child.blocks().to_vec();
            w.give(&ids);
            drop(child);
        }
    }
    if rng.chance(20) && !s.is_empty() {
        let f = fence.fetch_add(1, SeqCst);
        let to = rng.below(s.len());
        // The blocks leaving are given back (to the fence) now.
        let keep = to.div_ceil(bs);
        let leaving = s.blocks()[keep..].to_vec();
        w.give(&leaving);
        s.truncate_fenced(to, f);
        assert_eq!(s.blocks().len(), keep);
        if rng.chance(50) {
            pool.complete(f);
        }
        let rest = s.blocks().to_vec();
        w.give(&rest);
        if rng.chance(50) {
            s.retire(f);
        } else {
            drop(s);
        }
        if rng.chance(50) {
            pool.complete(f);
        }
        return;
    }
    let rest = s.blocks().to_vec();
    w.give(&rest);
    drop(s);
}

/// An evicting appender: an empty sequence matches what it can, appends
/// the rest of a prompt (evicting cached blocks), writes it, publishes.
fn appender(w: &World, rng: &mut XorShift) {
    let pool = &w.pool;
    let bs = pool.block_size();
    let n = pool.num_blocks();
    let p = rng.below(6);
    let ts = prompt(p, 1 + rng.below(n));
    let ks = keys(&ts);
    let mut s = Sequence::new(Arc::clone(pool));
    let k = if rng.chance(50) {
        s.try_match_prefix(&ks)
    } else {
        0
    };
    let matched = s.blocks().to_vec();
    w.take_shared(&matched);
    w.check_tags(&matched, &ks, "empty match");
    let want = ts.len() * bs - k * bs;
    if want > 0 && s.try_append(want).is_ok() {
        let new = s.blocks()[k..].to_vec();
        w.take_fresh(&new, "append");
        w.write_tags(&new, &ts[k..]);
        s.publish(&ks);
    }
    let all = s.blocks().to_vec();
    w.give(&all);
    drop(s);
}

/// A raw allocation with a blocking wait (a waiter in the queue).
fn waiter(w: &World, rng: &mut XorShift) {
    let pool = &w.pool;
    let n = pool.num_blocks();
    let want = 1 + rng.below(n);
    let mut ids = Vec::new();
    let got = pool.alloc_blocking(want, &mut ids, Some(Duration::from_micros(300)));
    w.end_raw_alloc(pool, got, want, &ids);
}

#[derive(Clone, Copy, Debug)]
struct Config {
    n: usize,
    bs: usize,
    shards: usize,
    events: bool,
    matchers: usize,
    appenders: usize,
    waiters: usize,
    resets: bool,
    close_at: Option<usize>,
    rounds: usize,
    ops: usize,
    max_r: usize,
}

fn stress(cfg: Config, seed: u64) {
    let mut b = BlockPool::builder(cfg.n, cfg.bs)
        .prefix_cache(true)
        .shards(cfg.shards);
    if cfg.events {
        b = b.kv_events(1 << 14);
    }
    let mut pool = Arc::new(b.build().unwrap());
    let mut w = World::new(Arc::clone(&pool));
    let mut view = HashMap::new();
    let mut evs = Vec::new();
    let fence = Arc::new(AtomicU64::new(1));
    let (mut total_m, mut total_k, mut total_lent) = (0, 0, 0);
    for round in 0..cfg.rounds {
        if cfg.close_at.is_some() && round > 0 {
            // A fresh pool a round: the last one was closed.
            let mut b = BlockPool::builder(cfg.n, cfg.bs)
                .prefix_cache(true)
                .shards(cfg.shards);
            if cfg.events {
                b = b.kv_events(1 << 14);
            }
            pool = Arc::new(b.build().unwrap());
            w = World::new(Arc::clone(&pool));
            view.clear();
        }
        let threads = cfg.matchers + cfg.appenders + cfg.waiters + usize::from(cfg.resets);
        let barrier = Arc::new(Barrier::new(threads));
        let done = Arc::new(AtomicUsize::new(0));
        let workers = cfg.matchers + cfg.appenders;
        let mut hs = Vec::new();
        for t in 0..threads {
            let w = Arc::clone(&w);
            let barrier = Arc::clone(&barrier);
            let done = Arc::clone(&done);
            let fence = Arc::clone(&fence);
            hs.push(thread::spawn(move || {
                let mut rng = XorShift::from_state(
                    seed ^ ((round as u64) << 20)
                        ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                );
                barrier.wait();
                if t < cfg.matchers {
                    // Counted also when the worker panics, so that the
                    // waiters and the resets stop and the test fails.
                    let _done = Done(&done);
                    for i in 0..cfg.ops {
                        if cfg.close_at == Some(i) && t == 0 {
                            w.pool.close();
                        }
                        matcher(&w, &mut rng, cfg.max_r, cfg.waiters > 0, &fence);
                    }
                } else if t < workers {
                    let _done = Done(&done);
                    for _ in 0..cfg.ops {
                        appender(&w, &mut rng);
                    }
                } else if t < workers + cfg.waiters {
                    while done.load(SeqCst) < workers {
                        waiter(&w, &mut rng);
                    }
                } else {
                    while done.load(SeqCst) < workers {
                        w.pool.reset_prefix_cache();
                        thread::yield_now();
                    }
                }
            }));
        }
        let mut panicked = None;
        for h in hs {
            if let Err(e) = h.join() {
                panicked.get_or_insert(e);
            }
        }
        if let Some(e) = panicked {
            eprintln!("round {round} of {cfg:?} seed {seed}");
            std::panic::resume_unwind(e);
        }
        // Nothing pending beyond the fences' blocks.
        pool.complete_all();
        for (i, h) in w.held.iter().enumerate() {
            assert_eq!(h.load(SeqCst), 0, "shadow holder of block {i}");
        }
        if cfg.events {
            evs.clear();
            pool.drain_events(&mut evs);
            assert!(replay(&mut view, &evs), "events dropped");
            assert_eq!(
                view.len(),
                pool.cached_blocks(),
                "events' view vs cached blocks"
            );
        }
        // Everything cached is evictable now.
        assert_eq!(pool.evictable_blocks(), pool.cached_blocks());
        // A blocking waiter for the whole pool is granted now.
        if !pool.is_closed() && round % 4 == 0 {
            let mut ids = Vec::new();
            pool.alloc_blocking(cfg.n, &mut ids, Some(Duration::from_secs(10)))
                .expect("a waiter for the whole pool once everything went back");
            let set: HashSet<_> = ids.iter().collect();
            assert_eq!(set.len(), cfg.n);
            pool.free(&ids).unwrap();
            if cfg.events {
                evs.clear();
                pool.drain_events(&mut evs);
                assert!(replay(&mut view, &evs), "events dropped");
                assert!(view.is_empty());
            }
        }
        assert_eq!(pool.used_blocks(), 0);
        assert_eq!(pool.free_blocks(), cfg.n);
        for i in 0..cfg.n as u32 {
            assert_eq!(pool.ref_count(BlockId::new(i)), Some(0), "block {i}");
        }
        total_m += w.matches_into_reservations.swap(0, SeqCst);
        total_k += w.matched_blocks.swap(0, SeqCst);
        total_lent += w.lent_paths.swap(0, SeqCst);
    }
    assert_whole(&pool);
    eprintln!(
        "{cfg:?}: {total_m} matches into reservations, {total_k} blocks matched, {total_lent} took a block back or kept a lent one's place"
    );
}

fn rounds(default: usize) -> usize {
    std::env::var("RESERVATION_ATTACK_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

const BASE: Config = Config {
    n: 8,
    bs: 2,
    shards: 1,
    events: false,
    matchers: 2,
    appenders: 2,
    waiters: 0,
    resets: false,
    close_at: None,
    rounds: 200,
    ops: 60,
    max_r: 4,
};

#[test]
fn stress_matchers_and_evicting_appenders() {
    for (n, bs) in [(2usize, 1usize), (4, 1), (6, 2), (8, 4), (16, 2)] {
        stress(
            Config {
                n,
                bs,
                rounds: rounds(150),
                max_r: n / 2 + 1,
                ..BASE
            },
            n as u64 * 31 + bs as u64,
        );
    }
}

#[test]
fn stress_with_waiters_and_resets() {
    for (n, bs) in [(3usize, 1usize), (6, 2), (12, 1), (16, 4)] {
        stress(
            Config {
                n,
                bs,
                waiters: 1,
                resets: true,
                rounds: rounds(100),
                max_r: n / 2 + 1,
                ..BASE
            },
            7 + n as u64,
        );
    }
}

#[test]
fn stress_shards_and_events() {
    for (n, bs, shards) in [(8usize, 1usize, 4usize), (16, 2, 4), (12, 4, 2)] {
        stress(
            Config {
                n,
                bs,
                shards,
                events: true,
                waiters: 1,
                resets: true,
                rounds: rounds(100),
                max_r: n / 2,
                ..BASE
            },
            99 + n as u64,
        );
    }
}

/// Pools big enough for fresh (uncounted) reserved runs of 8+ blocks.
#[test]
fn stress_fresh_reservations() {
    for (n, bs, shards) in [(32usize, 1usize, 1usize), (64, 2, 4)] {
        stress(
            Config {
                n,
                bs,
                shards,
                waiters: 1,
                resets: true,
                events: shards > 1,
                rounds: rounds(60),
                max_r: n / 2,
                ..BASE
            },
            4242 + n as u64,
        );
    }
}

#[test]
fn stress_three_matchers_one_evictor_tiny_pools() {
    for (n, bs) in [(2usize, 1usize), (3, 2), (4, 1), (5, 3)] {
        stress(
            Config {
                n,
                bs,
                matchers: 3,
                appenders: 1,
                rounds: rounds(200),
                max_r: 2,
                ops: 80,
                ..BASE
            },
            1234 + n as u64,
        );
    }
}

#[test]
fn stress_close_concurrently() {
    for (n, bs) in [(6usize, 2usize), (16, 1)] {
        stress(
            Config {
                n,
                bs,
                waiters: 1,
                resets: true,
                close_at: Some(20),
                rounds: rounds(80),
                ops: 40,
                max_r: n / 2,
                ..BASE
            },
            555 + n as u64,
        );
    }
}

// ---------------------------------------------------------------------
// Async waiters behind a matching reservation (no panics): every waiter
// that is woken is granted, none starves.
// ---------------------------------------------------------------------

struct Flag(AtomicBool, thread::Thread);
impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, SeqCst);
        self.1.unpark();
    }
}

#[test]
fn async_waiters_granted_while_reservations_match() {
    for round in 0..rounds(200) {
        let n = 6 + round % 5;
        let pool = Arc::new(BlockPool::new(n, 2));
        drop(published(&pool, &[1, 2, 3]));
        let w = World::new(Arc::clone(&pool));
        let barrier = Barrier::new(3);
        thread::scope(|sc| {
            // An async waiter for most of the pool.
            sc.spawn(|| {
                let mut ids = Vec::new();
                let want = n - 1;
                let flag = Arc::new(Flag(AtomicBool::new(false), thread::current()));
                let mut fut = Box::pin(pool.alloc(want, &mut ids));
                barrier.wait();
                let deadline = std::time::Instant::now() + Duration::from_secs(120);
                loop {
                    flag.0.store(false, SeqCst);
                    match poll(fut.as_mut(), Waker::from(Arc::clone(&flag))) {
                        Poll::Ready(r) => {
                            r.unwrap();
                            break;
                        }
                        Poll::Pending => {
                            while !flag.0.load(SeqCst) {
                                assert!(std::time::Instant::now() < deadline, "waiter starved");
                                thread::park_timeout(Duration::from_millis(50));
                            }
                        }
                    }
                }
                drop(fut);
                w.take_fresh(&ids, "async waiter");
                w.give(&ids);
                pool.free(&ids).unwrap();
            });
            for t in 0..2 {
                let (w, barrier) = (&w, &barrier);
                sc.spawn(move || {
                    let mut rng = XorShift::from_state(round as u64 * 77 + t + 1);
                    barrier.wait();
                    for _ in 0..20 {
                        let mut s = Sequence::new(Arc::clone(&w.pool));
                        let r = 1 + rng.below(3);
                        if s.try_reserve(r * 2, 0).is_err() {
                            continue;
                        }
                        let res = s.blocks().to_vec();
                        w.take_fresh(&res, "res");
                        w.give(&res);
                        let k = s.try_match_prefix(&keys(&[1, 2, 3]));
                        let b = s.blocks().to_vec();
                        assert_eq!(b.len(), k + r.saturating_sub(k));
                        w.take_shared(&b[..k]);
                        w.take_fresh(&b[k..], "kept");
                        w.give(&b);
                    }
                });
            }
        });
        assert_whole(&pool);
    }
}

// ---------------------------------------------------------------------
// The lend's race, aimed at: a match of one evictable block into a
// reservation of one, against an allocation that must evict that block
// (the loom model's shape, on real threads, many times). Outcomes: a hit,
// a miss keeping the reserved block, or a miss whose lent block's credit
// took another block back.
// ---------------------------------------------------------------------

/// Two threads that start each iteration together (spinning, no sleeps).
fn lockstep(
    iters: usize,
    a: impl Fn(usize) + Sync,
    b: impl Fn(usize) + Sync,
    mut between: impl FnMut(usize),
) {
    let go = AtomicUsize::new(0);
    let ready = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    thread::scope(|sc| {
        let side = |f: &(dyn Fn(usize) + Sync)| {
            for i in 0..iters {
                while go.load(SeqCst) != i + 1 {
                    thread::yield_now();
                }
                ready.fetch_add(1, SeqCst);
                let mut spins = 0u32;
                while ready.load(SeqCst) < 2 * (i + 1) {
                    spins += 1;
                    if spins < 200 {
                        std::hint::spin_loop();
                    } else {
                        thread::yield_now();
                    }
                }
                f(i);
                finished.fetch_add(1, SeqCst);
            }
        };
        let (a, b) = (&a, &b);
        sc.spawn(move || side(a));
        sc.spawn(move || side(b));
        for i in 0..iters {
            go.store(i + 1, SeqCst);
            while finished.load(SeqCst) < 2 * (i + 1) {
                thread::yield_now();
            }
            between(i);
        }
    });
}

#[test]
fn race_lend_vs_evicting_allocation() {
    for (n, shards, events) in [
        (3usize, 1usize, false),
        (3, 1, true),
        (8, 4, false),
        (4, 2, true),
    ] {
        let mut b = BlockPool::builder(n, 1).prefix_cache(true).shards(shards);
        if events {
            b = b.kv_events(1 << 12);
        }
        let pool = Arc::new(b.build().unwrap());
        let outcomes: [AtomicUsize; 3] = Default::default();
        let iters = rounds(6_000);
        let w = World::new(Arc::clone(&pool));
        let mut evs = Vec::new();
        let mut view = HashMap::new();
        // Setup of an iteration: key 1 cached, evictable; the rest free.
        let setup = || {
            if pool.peek_prefix(&[key(1)]) == 1 {
                return;
            }
            let s = published(&pool, &[1]);
            let id = s.blocks()[0];
            w.content[id.index()].store(1, SeqCst);
            drop(s);
        };
        setup();
        lockstep(
            iters,
            |_| {
                let mut m = Sequence::new(Arc::clone(&pool));
                m.try_reserve(1, 0).expect("free blocks");
                let reserved = m.blocks()[0];
                let k = m.try_match_prefix(&[key(1)]);
                assert_eq!((m.blocks().len(), m.len()), (1, k));
                let id = m.blocks()[0];
                if k == 1 {
                    w.take_shared(&[id]);
                    w.check_tags(&[id], &[key(1)], "hit");
                    outcomes[0].fetch_add(1, SeqCst);
                } else {
                    assert_eq!(pool.ref_count(id), Some(1));
                    let st = w.take_fresh(&[id], "miss");
                    m.try_append(1).unwrap();
                    assert_eq!(m.blocks(), &[id]);
                    w.check_stamp(&[id], st, "miss");
                    outcomes[if id == reserved { 1 } else { 2 }].fetch_add(1, SeqCst);
                }
                w.give(&[id]);
                drop(m);
            },
            |_| {
                // Take every block but one (the matcher's): evicts key 1
                // unless the matcher revived it.
                let mut s = Sequence::new(Arc::clone(&pool));
                if s.try_append(n - 1).is_ok() {
                    let ids = s.blocks().to_vec();
                    let st = w.take_fresh(&ids, "evictor");
                    w.check_stamp(&ids, st, "evictor");
                    w.give(&ids);
                }
                drop(s);
            },
            |_| {
                assert_eq!(pool.used_blocks(), 0);
                assert_eq!(pool.free_blocks(), n);
                if events {
                    evs.clear();
                    pool.drain_events(&mut evs);
                    assert!(replay(&mut view, &evs), "events dropped");
                    assert_eq!(view.len(), pool.cached_blocks());
                }
                setup();
            },
        );
        assert_whole(&pool);
        let o: Vec<usize> = outcomes.iter().map(|a| a.load(SeqCst)).collect();
        eprintln!("n {n} shards {shards} events {events}: hits {}, misses keeping the reserved block {}, misses with a block taken back {}", o[0], o[1], o[2]);
    }
}

/// The same race with a waiter queued for every free block: the lend must
/// let the match revive, the waiter must get only blocks no one holds and
/// be granted once the others let go.
#[test]
fn race_lend_vs_evicting_allocation_behind_a_waiter() {
    let n = 4;
    let pool = Arc::new(BlockPool::builder(n, 1).prefix_cache(true).build().unwrap());
    let w = World::new(Arc::clone(&pool));
    let iters = rounds(3_000);
    let hits = AtomicUsize::new(0);
    let setup = || {
        if pool.peek_prefix(&keys(&[1, 2])) == 2 {
            return;
        }
        pool.reset_prefix_cache();
        let s = published(&pool, &[1, 2]);
        for (i, id) in s.blocks().iter().enumerate() {
            w.content[id.index()].store(i as u64 + 1, SeqCst);
        }
        drop(s);
    };
    setup();
    lockstep(
        iters,
        |_| {
            let mut m = Sequence::new(Arc::clone(&pool));
            // Blocking: the waiter may hold 3 blocks first.
            m.reserve_blocking(2, 0, Some(Duration::from_secs(10)))
                .expect("granted once the waiter let go");
            let k = m.try_match_prefix(&keys(&[1, 2]));
            let b = m.blocks().to_vec();
            assert_eq!(b.len(), 2);
            w.take_shared(&b[..k]);
            w.check_tags(&b[..k], &keys(&[1, 2]), "hit");
            w.take_fresh(&b[k..], "kept");
            hits.fetch_add(k, SeqCst);
            m.try_append(2 - k).unwrap();
            assert_eq!(m.blocks(), &b[..]);
            w.give(&b);
            drop(m);
        },
        |i| {
            // A blocking waiter for 3 blocks: queued while the matcher
            // holds 2 (or grabbing the evictable ones first).
            let mut ids = Vec::new();
            pool.alloc_blocking(3 - i % 2, &mut ids, Some(Duration::from_secs(10)))
                .expect("granted once the matcher let go");
            w.take_fresh(&ids, "waiter");
            w.give(&ids);
            pool.free(&ids).unwrap();
        },
        |_| {
            assert_eq!(pool.used_blocks(), 0);
            setup();
        },
    );
    assert_whole(&pool);
    eprintln!(
        "behind a waiter: {} blocks hit in {iters} matches",
        hits.load(SeqCst)
    );
}
