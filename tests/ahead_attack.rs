//! Attacks on a match's admission of its revivals in runs (at most 64
//! blocks ahead, and at most what the home shard sees free): long matches
//! (100-500 evictable blocks, several runs) on full and nearly full pools
//! of 1, 4 and 16 shards, with and without KV events, into empty
//! sequences, into reservations, through a forwarding allocator and a
//! `HybridSequence`; with queued waiters (sync and async), evicting
//! allocations, `reset_prefix_cache` and `close` racing them on real
//! threads. Every guarantee is checked after each match and the pool's
//! books after each round. `AHEAD_ATTACK_ROUNDS=N` scales the stress.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

mod common;

use common::shadow::{replay, tag_of, Done, Shadow};
use common::{Forward, XorShift};
use kvslots::{
    BlockAllocator, BlockHash, BlockId, BlockPool, HybridSequence, KvGroup, KvGroups, Sequence,
};

// ---------------------------------------------------------------------
// Keys, tags, helpers
// ---------------------------------------------------------------------

/// A key whose tag (what a block holding it contains) is `t`.
fn key(t: u64) -> BlockHash {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&t.to_le_bytes());
    b[8] = 0x5A;
    BlockHash(b)
}

fn keys(ts: &[u64]) -> Vec<BlockHash> {
    ts.iter().map(|&t| key(t)).collect()
}

fn build(n: usize, bs: usize, shards: usize, events: bool) -> BlockPool {
    let mut b = BlockPool::builder(n, bs).prefix_cache(true).shards(shards);
    if events {
        b = b.kv_events(1 << 16);
    }
    b.build().unwrap()
}

/// The pool's counts: (free, used, cached, evictable).
fn counts(pool: &BlockPool) -> (usize, usize, usize, usize) {
    (
        pool.free_blocks(),
        pool.used_blocks(),
        pool.cached_blocks(),
        pool.evictable_blocks(),
    )
}

/// The books are whole: nothing used, every count zero, every block can
/// be taken exactly once (on an open pool).
fn assert_whole(pool: &BlockPool, what: &str) {
    pool.complete_all();
    assert_eq!(pool.pending_release_blocks(), 0, "{what}");
    assert_eq!(
        pool.used_blocks(),
        0,
        "{what}: used after every holder let go"
    );
    assert_eq!(pool.free_blocks(), pool.num_blocks(), "{what}: free != num");
    for i in 0..pool.num_blocks() as u32 {
        assert_eq!(
            pool.ref_count(BlockId::new(i)),
            Some(0),
            "{what}: block {i}"
        );
    }
    if !pool.is_closed() {
        let mut all = Vec::new();
        pool.try_alloc(pool.num_blocks(), &mut all)
            .unwrap_or_else(|e| panic!("{what}: every block can be taken: {e:?}"));
        let set: HashSet<_> = all.iter().collect();
        assert_eq!(set.len(), pool.num_blocks(), "{what}: distinct ids");
        assert_eq!(pool.free_blocks(), 0, "{what}: a count given back twice");
        assert!(pool.try_alloc(1, &mut Vec::new()).is_err(), "{what}");
        pool.free(&all).unwrap();
        assert_eq!(pool.used_blocks(), 0, "{what}");
        assert_eq!(pool.free_blocks(), pool.num_blocks(), "{what}");
    }
}

/// A sequence holding `ts.len()` full blocks published under `ts`.
fn published<A: BlockAllocator + ?Sized>(pool: &Arc<A>, ts: &[u64]) -> Sequence<A> {
    let mut s = Sequence::new(Arc::clone(pool));
    s.try_append(ts.len() * pool.block_size()).unwrap();
    assert_eq!(s.publish(&keys(ts)), ts.len());
    s
}

/// Runs `f` on a thread of its own (another home shard than the
/// `count` prompts of `len` tags of their own (prompt `m`'s tag `i` is
/// `base + 1000 * m + i`), published and let go: cached and evictable.
fn published_prompts(pool: &Arc<BlockPool>, count: usize, len: usize, base: u64) -> Vec<Vec<u64>> {
    let prompts: Vec<Vec<u64>> = (0..count)
        .map(|m| {
            (0..len as u64)
                .map(|i| base + 1000 * m as u64 + i)
                .collect()
        })
        .collect();
    for ts in &prompts {
        drop(published(pool, ts));
    }
    prompts
}

/// caller's, so that the shards' views of each other go stale).
fn on_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    thread::spawn(f).join().unwrap()
}

fn check_events(pool: &BlockPool, view: &mut HashMap<BlockHash, BlockId>, what: &str) {
    let mut evs = Vec::new();
    pool.drain_events(&mut evs);
    assert!(replay(view, &evs), "{what}: events dropped");
    assert_eq!(view.len(), pool.cached_blocks(), "{what}: events vs cache");
}

struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

fn poll<F: Future + ?Sized>(fut: Pin<&mut F>) -> Poll<F::Output> {
    let waker = Waker::from(Arc::new(Noop));
    fut.poll(&mut Context::from_waker(&waker))
}

// ---------------------------------------------------------------------
// Deterministic: exact counts of long matches
// ---------------------------------------------------------------------

/// A prefix of `len` evictable blocks, `spare` free blocks besides and
/// every other block held (by another thread): a match of the prefix and
/// one missing key revives all `len` in several runs, whatever the shard
/// count, keeps no credit (exactly `spare` blocks can be taken after it,
/// then none), and its drop gives every block back.
#[test]
fn long_match_on_a_full_pool_is_exact() {
    let n = 600;
    for shards in [1usize, 4, 16] {
        for events in [false, true] {
            for len in [65usize, 129, 300, 500] {
                for spare in [0usize, 1, 63, 64, 65] {
                    if len + spare > n {
                        continue;
                    }
                    let what = format!("shards {shards} events {events} len {len} spare {spare}");
                    let pool = Arc::new(build(n, 1, shards, events));
                    let mut view = HashMap::new();
                    let ts: Vec<u64> = (0..len as u64).map(|i| 10_000 + i).collect();
                    let owner = published(&pool, &ts);
                    let owned = owner.blocks().to_vec();
                    on_thread(move || drop(owner));
                    let p = Arc::clone(&pool);
                    let filler = on_thread(move || {
                        let mut v = Vec::new();
                        p.try_alloc(n - len - spare, &mut v).unwrap();
                        v
                    });
                    assert_eq!(
                        counts(&pool),
                        (len + spare, n - len - spare, len, len),
                        "{what}"
                    );
                    let mut ks = keys(&ts);
                    ks.push(key(1)); // a miss after the prefix
                    let p = Arc::clone(&pool);
                    let w = what.clone();
                    on_thread(move || {
                        let mut s = Sequence::new(Arc::clone(&p));
                        assert_eq!(s.try_match_prefix(&ks), len, "{w}");
                        assert_eq!(s.blocks(), &owned[..], "{w}");
                        assert_eq!(counts(&p), (spare, n - spare, len, 0), "{w}");
                        // No credit kept: exactly `spare` can be taken.
                        let mut rest = Vec::new();
                        if spare > 0 {
                            p.try_alloc(spare, &mut rest).unwrap();
                        }
                        assert!(p.try_alloc(1, &mut Vec::new()).is_err(), "{w}");
                        p.free(&rest).unwrap();
                        // A second match shares, admitting nothing.
                        let mut t = Sequence::new(Arc::clone(&p));
                        assert_eq!(t.try_match_prefix(&ks), len, "{w}");
                        assert_eq!(counts(&p), (spare, n - spare, len, 0), "{w}");
                        drop(t);
                        drop(s);
                    });
                    assert_eq!(
                        counts(&pool),
                        (len + spare, n - len - spare, len, len),
                        "{what}"
                    );
                    assert!(pool.peak_used_blocks() <= n);
                    let p = Arc::clone(&pool);
                    on_thread(move || p.free(&filler).unwrap());
                    assert_eq!(counts(&pool), (n, 0, len, len), "{what}");
                    if events {
                        check_events(&pool, &mut view, &what);
                    }
                    assert_whole(&pool, &what);
                }
            }
        }
    }
}

/// A closed pool revives nothing, however long the match, on every
/// shard count; a block someone holds is still shared.
#[test]
fn a_closed_pool_revives_nothing_of_a_long_prefix() {
    for shards in [1usize, 4, 16] {
        let pool = Arc::new(build(512, 1, shards, true));
        let ts: Vec<u64> = (0..300u64).map(|i| 20_000 + i).collect();
        let owner = published(&pool, &ts);
        // The first 100 stay held, the rest evictable.
        let mut head = Sequence::new(Arc::clone(&pool));
        assert_eq!(head.try_match_prefix(&keys(&ts[..100])), 100);
        drop(owner);
        pool.close();
        let p = Arc::clone(&pool);
        let ks = keys(&ts);
        let k = on_thread(move || {
            let mut s = Sequence::new(p);
            s.try_match_prefix(&ks)
        });
        assert_eq!(k, 100, "{shards} shards: revived on a closed pool");
        assert_eq!(pool.evictable_blocks(), 200);
        drop(head);
        assert_whole(&pool, "closed");
    }
}

/// A match into a reservation of `r` blocks of a prefix of `len`
/// evictable ones, with `extra` free blocks besides and everything else
/// held: the first `min(r, len)` revivals are paid by lent blocks, the
/// rest admitted in runs; the counts are exact after it and after its
/// drop. Through the pool and through a forwarding allocator.
#[test]
fn long_match_into_a_reservation_is_exact() {
    let n = 700;
    for shards in [1usize, 4, 16] {
        for events in [false, true] {
            for len in [100usize, 300, 500] {
                for r in [1usize, 63, 64, 65, 200, 600] {
                    for extra in [0usize, 1, 64] {
                        if len + r + extra > n {
                            continue;
                        }
                        for forward in [false, true] {
                            let what = format!(
                                "shards {shards} events {events} len {len} r {r} extra {extra} forward {forward}"
                            );
                            let inner = build(n, 1, shards, events);
                            if forward {
                                let a = Forward::new(inner);
                                reservation_case(&a, &a.inner, len, r, extra, &what);
                                assert_eq!(
                                    a.lent.load(SeqCst),
                                    r.min(len),
                                    "{what}: lent through the forward"
                                );
                            } else {
                                let a = Arc::new(inner);
                                reservation_case(&a, &a, len, r, extra, &what);
                            }
                        }
                    }
                }
            }
        }
    }
}

fn reservation_case<A: BlockAllocator + Send + Sync + 'static>(
    a: &Arc<A>,
    pool: &BlockPool,
    len: usize,
    r: usize,
    extra: usize,
    what: &str,
) {
    let n = pool.num_blocks();
    let ts: Vec<u64> = (0..len as u64).map(|i| 30_000 + i).collect();
    let owner = published(a, &ts);
    let owned = owner.blocks().to_vec();
    drop(owner);
    let mut filler = Vec::new();
    pool.try_alloc(n - len - r - extra, &mut filler).unwrap();
    let mut s = Sequence::new(Arc::clone(a));
    s.try_reserve(r, 0).unwrap();
    assert_eq!(pool.cached_blocks(), len, "{what}: the reservation evicted");
    let reserved = s.blocks().to_vec();
    assert_eq!(
        counts(pool),
        (extra + len, n - extra - len, len, len),
        "{what}"
    );
    let mut ks = keys(&ts);
    ks.push(key(2));
    let k = s.try_match_prefix(&ks);
    assert_eq!(k, len, "{what}");
    assert_eq!(&s.blocks()[..k], &owned[..], "{what}");
    assert_eq!(s.blocks().len(), len + r.saturating_sub(len), "{what}");
    assert!(s.capacity() >= r, "{what}: capacity fell");
    let set: HashSet<_> = s.blocks().iter().collect();
    assert_eq!(set.len(), s.blocks().len(), "{what}: a block twice");
    for &id in &s.blocks()[k..] {
        assert_eq!(pool.ref_count(id), Some(1), "{what}");
        assert!(reserved.contains(&id), "{what}: a kept block not reserved");
    }
    // Lent blocks went back with their admission kept (the lent
    // revivals take nothing more); the other `len - lent` were admitted.
    let lent = r.min(len);
    assert_eq!(
        counts(pool),
        (extra + lent, n - extra - lent, len, 0),
        "{what}"
    );
    // Nothing kept: exactly that many can be taken.
    let mut rest = Vec::new();
    let avail = pool.free_blocks();
    if avail > 0 {
        pool.try_alloc(avail, &mut rest).unwrap();
    }
    assert!(pool.try_alloc(1, &mut Vec::new()).is_err(), "{what}");
    pool.free(&rest).unwrap();
    drop(s);
    pool.free(&filler).unwrap();
    assert_eq!(counts(pool), (n, 0, len, len), "{what}");
    assert_whole(pool, what);
}

/// With a waiter queued (an async `alloc` of the whole pool, pending), a
/// match revives no evictable block of a long prefix, and a match into
/// a reservation of `r` revives exactly `min(r, len)` (paid by its lent
/// blocks) and stops: no run is admitted past the waiter. Once the
/// waiter goes, a new match takes the rest.
#[test]
fn a_queued_waiter_stops_a_long_match_after_its_lent_blocks() {
    let n = 512;
    let len = 300;
    for shards in [1usize, 4, 16] {
        for events in [false, true] {
            for r in [0usize, 1, 64, 65, 130] {
                let what = format!("shards {shards} events {events} r {r}");
                let pool = Arc::new(build(n, 1, shards, events));
                let ts: Vec<u64> = (0..len as u64).map(|i| 40_000 + i).collect();
                drop(published(&pool, &ts));
                let spare = r + 5;
                let mut filler = Vec::new();
                pool.try_alloc(n - len - spare, &mut filler).unwrap();
                let mut s = Sequence::new(Arc::clone(&pool));
                if r > 0 {
                    s.try_reserve(r, 0).unwrap();
                }
                let mut out = Vec::new();
                let mut fut = Box::pin(pool.alloc(n, &mut out));
                assert!(poll(fut.as_mut()).is_pending(), "{what}");
                assert_eq!(pool.waiters(), 1, "{what}");
                let before = counts(&pool);
                let p = Arc::clone(&pool);
                let ks = keys(&ts);
                let k = on_thread(move || {
                    let mut e = Sequence::new(p);
                    e.try_match_prefix(&ks)
                });
                assert_eq!(k, 0, "{what}: an empty match revived past a waiter");
                assert_eq!(counts(&pool), before, "{what}");
                let k = s.try_match_prefix(&keys(&ts));
                assert_eq!(k, r.min(len), "{what}: a match into a reservation");
                assert_eq!(s.blocks().len(), r.max(k), "{what}");
                assert_eq!(pool.cached_blocks(), len, "{what}");
                assert_eq!(pool.evictable_blocks(), len - k, "{what}");
                assert!(poll(fut.as_mut()).is_pending(), "{what}");
                drop(fut);
                assert!(out.is_empty());
                assert_eq!(pool.waiters(), 0, "{what}");
                let mut t = Sequence::new(Arc::clone(&pool));
                assert_eq!(t.try_match_prefix(&keys(&ts)), len, "{what}");
                assert_eq!(pool.evictable_blocks(), 0, "{what}");
                drop((s, t));
                pool.free(&filler).unwrap();
                assert_whole(&pool, &what);
            }
        }
    }
}

/// A `HybridSequence` of two full-attention groups matches 2 x 250 blocks
/// (several runs) on a full pool of every shard count, and the drop gives
/// them all back.
#[test]
fn a_long_hybrid_match_on_a_full_pool() {
    for shards in [1usize, 4, 16] {
        for events in [false, true] {
            let what = format!("hybrid shards {shards} events {events}");
            let n = 600;
            let pool = Arc::new(build(n, 1, shards, events));
            let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
            let base = keys(&(0..250u64).map(|i| 50_000 + i).collect::<Vec<_>>());
            let gk = groups.keys(&base);
            let mut first = HybridSequence::new(Arc::clone(&pool), groups.clone());
            first.try_append(250).unwrap();
            assert_eq!(first.publish(&gk), Ok(500), "{what}");
            let b0 = first.blocks(0).unwrap().to_vec();
            let b1 = first.blocks(1).unwrap().to_vec();
            on_thread(move || drop(first));
            let mut filler = Vec::new();
            pool.try_alloc(100, &mut filler).unwrap();
            assert_eq!(counts(&pool), (500, 100, 500, 500), "{what}");
            let mut more = base.clone();
            more.push(key(3));
            let gk2 = groups.keys(&more);
            let p = Arc::clone(&pool);
            let g = groups.clone();
            let (k, m0, m1) = on_thread(move || {
                let mut s = HybridSequence::new(p, g);
                let k = s.try_match_prefix(&gk2).unwrap();
                let r = (
                    k,
                    s.blocks(0).unwrap().to_vec(),
                    s.blocks(1).unwrap().to_vec(),
                );
                drop(s);
                r
            });
            assert_eq!(k, 250, "{what}");
            assert_eq!((m0, m1), (b0, b1), "{what}");
            // Matched and dropped: all back and evictable.
            assert_eq!(counts(&pool), (500, 100, 500, 500), "{what}");
            // Matched and held: every block taken, none left.
            let mut s = HybridSequence::new(Arc::clone(&pool), groups.clone());
            assert_eq!(s.try_match_prefix(&gk), Ok(250), "{what}");
            assert_eq!(s.held_blocks(), 500);
            assert_eq!(counts(&pool), (0, 600, 500, 0), "{what}");
            assert!(pool.try_alloc(1, &mut Vec::new()).is_err());
            drop(s);
            pool.free(&filler).unwrap();
            assert_whole(&pool, &what);
        }
    }
}

// ---------------------------------------------------------------------
// Waiters against long matches: FIFO, not starved
// ---------------------------------------------------------------------

/// Two async waiters queued in order (a big one, then a small one) while
/// matcher threads revive and drop long prefixes of their own over and
/// over: the small one is never granted before the big one (FIFO), and
/// both are granted (the matches stop reviving behind them, so their
/// blocks come back).
#[test]
fn waiters_are_granted_in_order_while_long_matches_run() {
    for shards in [1usize, 4, 16] {
        for events in [false, true] {
            let what = format!("fifo shards {shards} events {events}");
            let n = 512;
            let pool = Arc::new(build(n, 1, shards, events));
            let matchers = 3;
            let len = 130;
            let prompts = published_prompts(&pool, matchers, len, 60_000);
            let stop = Arc::new(AtomicBool::new(false));
            let barrier = Arc::new(Barrier::new(matchers + 1));
            let revived = Arc::new(AtomicUsize::new(0));
            let hs: Vec<_> = prompts
                .iter()
                .map(|ts| {
                    let pool = Arc::clone(&pool);
                    let ks = keys(ts);
                    let stop = Arc::clone(&stop);
                    let barrier = Arc::clone(&barrier);
                    let revived = Arc::clone(&revived);
                    thread::spawn(move || {
                        barrier.wait();
                        while !stop.load(SeqCst) {
                            let mut s = Sequence::new(Arc::clone(&pool));
                            let k = s.try_match_prefix(&ks);
                            assert!(k <= ks.len());
                            revived.fetch_add(k, SeqCst);
                            thread::yield_now();
                            drop(s);
                        }
                    })
                })
                .collect();
            barrier.wait();
            // Let the matchers get going (observed, not timed).
            while revived.load(SeqCst) < 4 * len {
                thread::yield_now();
            }
            for round in 0..10 {
                let mut big_out = Vec::new();
                let mut small_out = Vec::new();
                let big_n = 400 + round;
                let mut big = Box::pin(pool.alloc(big_n, &mut big_out));
                let mut small = Box::pin(pool.alloc(3, &mut small_out));
                let mut big_done = poll(big.as_mut()).is_ready();
                let mut small_done = false;
                loop {
                    if !small_done && poll(small.as_mut()).is_ready() {
                        small_done = true;
                        if !big_done {
                            // Granted after the big one: its grant is done.
                            assert!(
                                poll(big.as_mut()).is_ready(),
                                "{what}: the small waiter was granted before the big one"
                            );
                            big_done = true;
                        }
                    }
                    if !big_done && poll(big.as_mut()).is_ready() {
                        big_done = true;
                    }
                    if big_done && small_done {
                        break;
                    }
                    thread::yield_now();
                }
                drop((big, small));
                assert_eq!(big_out.len(), big_n, "{what}");
                assert_eq!(small_out.len(), 3, "{what}");
                let set: HashSet<_> = big_out.iter().chain(&small_out).collect();
                assert_eq!(set.len(), big_n + 3, "{what}: a block granted twice");
                pool.free(&big_out).unwrap();
                pool.free(&small_out).unwrap();
            }
            stop.store(true, SeqCst);
            for h in hs {
                h.join().unwrap();
            }
            assert_eq!(pool.waiters(), 0);
            assert_whole(&pool, &what);
        }
    }
}

/// Blocking waiters for most of the pool against long matches of
/// distinct prefixes: every waiter is granted (no timeout), while the
/// matchers keep running.
#[test]
fn blocking_waiters_are_not_starved_by_long_matches() {
    for shards in [1usize, 4, 16] {
        let what = format!("starve shards {shards}");
        let n = 1024;
        let pool = Arc::new(build(n, 1, shards, false));
        let matchers = 4;
        let len = 200;
        let prompts = published_prompts(&pool, matchers, len, 70_000);
        let stop = Arc::new(AtomicBool::new(false));
        let barrier = Arc::new(Barrier::new(matchers + 2));
        let mut hs: Vec<_> = prompts
            .iter()
            .map(|ts| {
                let pool = Arc::clone(&pool);
                let ks = keys(ts);
                let stop = Arc::clone(&stop);
                let barrier = Arc::clone(&barrier);
                thread::spawn(move || {
                    barrier.wait();
                    while !stop.load(SeqCst) {
                        let mut s = Sequence::new(Arc::clone(&pool));
                        let k = s.try_match_prefix(&ks);
                        assert!(k <= ks.len());
                        drop(s);
                    }
                })
            })
            .collect();
        let granted = Arc::new(AtomicUsize::new(0));
        for w in 0..2 {
            let pool = Arc::clone(&pool);
            let barrier = Arc::clone(&barrier);
            let granted = Arc::clone(&granted);
            let what = what.clone();
            hs.push(thread::spawn(move || {
                barrier.wait();
                for i in 0..15 {
                    let want = 700 + 10 * w + i;
                    let mut ids = Vec::new();
                    pool.alloc_blocking(want, &mut ids, None)
                        .unwrap_or_else(|e| panic!("{what}: waiter refused: {e:?}"));
                    assert_eq!(ids.len(), want);
                    granted.fetch_add(1, SeqCst);
                    pool.free(&ids).unwrap();
                }
            }));
        }
        while granted.load(SeqCst) < 30 {
            thread::yield_now();
        }
        stop.store(true, SeqCst);
        for h in hs {
            h.join().unwrap();
        }
        assert_whole(&pool, &what);
    }
}

/// Matchers of long prefixes of their own against a close: a match that
/// begins after `close` returned revives nothing (every block of its
/// prefix is evictable or gone when it starts); conservation after.
#[test]
fn matches_begun_after_a_close_revive_nothing() {
    for shards in [1usize, 4, 16] {
        for events in [false, true] {
            for round in 0..4 {
                let what = format!("close shards {shards} events {events} round {round}");
                let n = 1024;
                let pool = Arc::new(build(n, 1, shards, events));
                let matchers = 3;
                let len = 300;
                let prompts = published_prompts(&pool, matchers, len, 80_000);
                let closed = Arc::new(AtomicBool::new(false));
                let matched = Arc::new(AtomicUsize::new(0));
                let barrier = Arc::new(Barrier::new(matchers + 2));
                let mut hs: Vec<_> = prompts
                    .iter()
                    .map(|ts| {
                        let pool = Arc::clone(&pool);
                        let ks = keys(ts);
                        let closed = Arc::clone(&closed);
                        let matched = Arc::clone(&matched);
                        let barrier = Arc::clone(&barrier);
                        let what = what.clone();
                        thread::spawn(move || {
                            barrier.wait();
                            let mut after = 0;
                            while after < 20 {
                                let was_closed = closed.load(SeqCst);
                                let mut s = Sequence::new(Arc::clone(&pool));
                                let k = s.try_match_prefix(&ks);
                                if was_closed {
                                    assert_eq!(k, 0, "{what}: revived after the close");
                                    after += 1;
                                }
                                matched.fetch_add(1, SeqCst);
                                drop(s);
                            }
                        })
                    })
                    .collect();
                {
                    // An evicting allocator too.
                    let pool = Arc::clone(&pool);
                    let barrier = Arc::clone(&barrier);
                    let closed = Arc::clone(&closed);
                    hs.push(thread::spawn(move || {
                        barrier.wait();
                        let mut i = 0usize;
                        while !closed.load(SeqCst) {
                            let mut ids = Vec::new();
                            if pool.try_alloc(100 + i % 300, &mut ids).is_ok() {
                                pool.free(&ids).unwrap();
                            }
                            i += 1;
                        }
                    }));
                }
                barrier.wait();
                while matched.load(SeqCst) < 10 + 10 * round {
                    thread::yield_now();
                }
                pool.close();
                closed.store(true, SeqCst);
                for h in hs {
                    h.join().unwrap();
                }
                assert_whole(&pool, &what);
            }
        }
    }
}

// ---------------------------------------------------------------------
// Stress with a shadow of holders and contents
// ---------------------------------------------------------------------

const PROMPTS: usize = 8;

/// Prompt `p`: its first `(p % 3) * 40` blocks shared with the other
/// prompts of the family, then tags of its own; `len` between 100 and
/// 500 (capped by the pool).
fn prompt(p: usize, len: usize) -> Vec<u64> {
    let shared = (p % 3) * 40;
    (0..len)
        .map(|i| {
            if i < shared {
                1 + i as u64
            } else {
                1_000_000 * (p as u64 + 1) + i as u64
            }
        })
        .collect()
}

/// The shadow of the pool's blocks, and what the attack counts.
struct World {
    pool: Arc<BlockPool>,
    shadow: Shadow,
    matched: AtomicUsize,
    long_matches: AtomicUsize,
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
            matched: AtomicUsize::new(0),
            long_matches: AtomicUsize::new(0),
        })
    }

    fn note_match(&self, k: usize) {
        self.matched.fetch_add(k, SeqCst);
        if k > 64 {
            self.long_matches.fetch_add(1, SeqCst);
        }
    }
}

fn prompt_for(w: &World, rng: &mut XorShift) -> Vec<u64> {
    let n = w.pool.num_blocks() / w.pool.block_size().max(1);
    let len = (100 + rng.below(401)).min(n);
    prompt(rng.below(PROMPTS), len)
}

/// An empty sequence matches a long prompt; checks; maybe appends the
/// rest (evicting) and publishes.
fn matcher(w: &World, rng: &mut XorShift) {
    let pool = &w.pool;
    let bs = pool.block_size();
    let ts = prompt_for(w, rng);
    let ks = keys(&ts);
    let mut s = Sequence::new(Arc::clone(pool));
    let k = s.try_match_prefix(&ks);
    assert!(k <= ks.len());
    assert_eq!(s.blocks().len(), k);
    assert_eq!(s.len(), k * bs);
    let matched = s.blocks().to_vec();
    let set: HashSet<_> = matched.iter().collect();
    assert_eq!(set.len(), k, "a block twice in a match");
    w.take_shared(&matched);
    w.check_tags(&matched, &ks, "empty match");
    w.note_match(k);
    if rng.chance(50) {
        let want = (ts.len() - k) * bs;
        if want > 0 && s.try_append(want).is_ok() {
            let new = s.blocks()[k..].to_vec();
            let stamp = w.take_fresh(&new, "append after match");
            w.check_stamp(&new, stamp, "append after match");
            w.write_tags(&new, &ts[k..]);
            s.publish(&ks);
        }
    }
    w.check_tags(&s.blocks()[..k], &ks, "empty match, later");
    let all = s.blocks().to_vec();
    w.give(&all);
    drop(s);
}

/// A reservation, then a match of a long prompt into it.
fn reserving_matcher(w: &World, rng: &mut XorShift) {
    let pool = &w.pool;
    let bs = pool.block_size();
    let n = pool.num_blocks();
    let r = 1 + rng.below(150.min(n));
    let mut s = Sequence::new(Arc::clone(pool));
    if s.try_reserve(r * bs, 0).is_err() {
        assert!(s.blocks().is_empty());
        return;
    }
    assert_eq!(s.blocks().len(), r);
    let reserved = s.blocks().to_vec();
    let stamp = w.take_fresh(&reserved, "reservation");
    w.check_stamp(&reserved, stamp, "reservation");
    w.give(&reserved);
    let ts = prompt_for(w, rng);
    let ks = keys(&ts);
    let k = s.try_match_prefix(&ks);
    assert!(k <= ks.len());
    let blocks = s.blocks().to_vec();
    assert_eq!(blocks.len(), k + r.saturating_sub(k), "table (r {r} k {k})");
    assert_eq!(s.len(), k * bs);
    assert!(s.capacity() >= r * bs, "capacity fell");
    let set: HashSet<_> = blocks.iter().collect();
    assert_eq!(set.len(), blocks.len(), "a block twice in the table");
    w.take_shared(&blocks[..k]);
    w.check_tags(&blocks[..k], &ks, "reservation match");
    let stamp2 = w.take_fresh(&blocks[k..], "kept reserved");
    for &id in &blocks[k..] {
        assert_eq!(pool.ref_count(id), Some(1), "reserved {id} not held alone");
    }
    w.note_match(k);
    let room = (r * bs).saturating_sub(k * bs);
    s.try_append(room).expect("append into the reservation");
    assert_eq!(s.blocks(), &blocks[..], "the append allocated");
    w.check_stamp(&blocks[k..], stamp2, "kept reserved, later");
    w.check_tags(&blocks[..k], &ks, "reservation match, later");
    let full = (s.len() / bs).min(ts.len());
    if full > k && rng.chance(60) {
        w.write_tags(&blocks[k..full], &ts[k..full]);
        s.publish(&ks[..full]);
    }
    let all = s.blocks().to_vec();
    w.give(&all);
    drop(s);
}

/// An evicting appender: a whole prompt's blocks, fresh (evicting cached
/// ones), written and published.
fn appender(w: &World, rng: &mut XorShift) {
    let pool = &w.pool;
    let bs = pool.block_size();
    let ts = prompt_for(w, rng);
    let ks = keys(&ts);
    let mut s = Sequence::new(Arc::clone(pool));
    if s.try_append(ts.len() * bs).is_ok() {
        let new = s.blocks().to_vec();
        let stamp = w.take_fresh(&new, "append");
        w.check_stamp(&new, stamp, "append");
        w.write_tags(&new, &ts);
        s.publish(&ks);
        let all = s.blocks().to_vec();
        w.give(&all);
    } else {
        assert!(s.blocks().is_empty());
    }
    drop(s);
}

/// A `HybridSequence` of two full-attention groups: matches a long
/// prompt (two revivals a block), checks each group's blocks against its
/// derived keys, maybe appends the rest (evicting) and publishes.
fn hybrid_worker(w: &World, rng: &mut XorShift) {
    let pool = &w.pool;
    let bs = pool.block_size();
    let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    let mut ts = prompt_for(w, rng);
    ts.truncate((pool.num_blocks() / 2).max(1));
    let gk = groups.keys(&keys(&ts));
    let mut s = HybridSequence::new(Arc::clone(pool), groups);
    let k = s.try_match_prefix(&gk).unwrap();
    assert!(k <= ts.len());
    assert_eq!(s.len(), k * bs);
    let mut all = Vec::new();
    for g in 0..2 {
        let b = s.blocks(g).unwrap().to_vec();
        assert_eq!(b.len(), k, "hybrid group {g} table");
        w.check_tags(&b, gk.group(g).unwrap(), "hybrid match");
        all.extend(b);
    }
    let set: HashSet<_> = all.iter().collect();
    assert_eq!(set.len(), 2 * k, "hybrid: a block twice");
    w.take_shared(&all);
    w.note_match(2 * k);
    if rng.chance(50) && ts.len() > k && s.try_append((ts.len() - k) * bs).is_ok() {
        for g in 0..2 {
            let new = s.blocks(g).unwrap()[k..].to_vec();
            let stamp = w.take_fresh(&new, "hybrid append");
            w.check_stamp(&new, stamp, "hybrid append");
            w.write_tags(
                &new,
                &gk.group(g).unwrap()[k..]
                    .iter()
                    .map(tag_of)
                    .collect::<Vec<_>>(),
            );
            all.extend(new);
        }
        s.publish(&gk).unwrap();
    }
    w.give(&all);
    drop(s);
}

/// A raw allocation: try (all or nothing) or a blocking wait.
fn waiter(w: &World, rng: &mut XorShift) {
    let pool = &w.pool;
    let n = pool.num_blocks();
    let want = 1 + rng.below(n / 2);
    let mut ids = Vec::new();
    let got = if rng.chance(50) {
        pool.alloc_blocking(want, &mut ids, Some(Duration::from_micros(500)))
    } else {
        pool.try_alloc(want, &mut ids)
    };
    w.end_raw_alloc(pool, got, want, &ids);
}

#[derive(Clone, Copy, Debug)]
struct Config {
    n: usize,
    bs: usize,
    shards: usize,
    events: bool,
    matchers: usize,
    reservers: usize,
    appenders: usize,
    waiters: usize,
    resets: bool,
    hybrid: bool,
    close_at: Option<usize>,
    rounds: usize,
    ops: usize,
}

fn stress(cfg: Config, seed: u64) {
    let mut total = (0, 0);
    // Rounds whose events were replayed whole, and rounds that dropped.
    let mut replayed = (0, 0);
    for round in 0..cfg.rounds {
        let pool = Arc::new(build(cfg.n, cfg.bs, cfg.shards, cfg.events));
        let w = World::new(Arc::clone(&pool));
        let mut view = HashMap::new();
        let workers = cfg.matchers + cfg.reservers + cfg.appenders;
        let threads = workers + cfg.waiters + usize::from(cfg.resets);
        let barrier = Arc::new(Barrier::new(threads));
        let done = Arc::new(AtomicUsize::new(0));
        let mut hs = Vec::new();
        for t in 0..threads {
            let w = Arc::clone(&w);
            let barrier = Arc::clone(&barrier);
            let done = Arc::clone(&done);
            hs.push(thread::spawn(move || {
                let mut rng = XorShift::from_state(
                    seed ^ ((round as u64) << 24)
                        ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                );
                barrier.wait();
                if t < workers {
                    let _done = Done(&done);
                    for i in 0..cfg.ops {
                        if t == 0 && cfg.close_at == Some(i) {
                            w.pool.close();
                        }
                        if t < cfg.matchers {
                            matcher(&w, &mut rng);
                        } else if t < cfg.matchers + cfg.reservers {
                            if cfg.hybrid && rng.chance(30) {
                                hybrid_worker(&w, &mut rng);
                            } else {
                                reserving_matcher(&w, &mut rng);
                            }
                        } else {
                            appender(&w, &mut rng);
                        }
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
        // The events' consumer: drains while the workers run.
        let drainer = cfg.events.then(|| {
            let pool = Arc::clone(&pool);
            let done = Arc::clone(&done);
            thread::spawn(move || {
                let mut view = HashMap::new();
                let mut evs = Vec::new();
                let mut whole = true;
                while done.load(SeqCst) < workers {
                    evs.clear();
                    pool.drain_events(&mut evs);
                    // Once events were dropped, the view is lost.
                    whole = whole && replay(&mut view, &evs);
                    thread::yield_now();
                }
                (view, whole)
            })
        });
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
        let mut whole = true;
        if let Some(d) = drainer {
            let (v, w) = d.join().unwrap();
            view = v;
            whole = w;
        }
        pool.complete_all();
        for (i, h) in w.held.iter().enumerate() {
            assert_eq!(h.load(SeqCst), 0, "shadow holder of block {i}");
        }
        assert_eq!(pool.used_blocks(), 0, "{cfg:?} round {round}");
        assert_eq!(pool.free_blocks(), cfg.n, "{cfg:?} round {round}");
        assert_eq!(pool.evictable_blocks(), pool.cached_blocks());
        assert_eq!(pool.waiters(), 0);
        if cfg.events {
            let mut evs = Vec::new();
            pool.drain_events(&mut evs);
            whole = whole && replay(&mut view, &evs);
            if whole {
                assert_eq!(view.len(), pool.cached_blocks(), "events vs cache");
                replayed.0 += 1;
            } else {
                replayed.1 += 1;
            }
        }
        // Every cached key still matches its own tags: a match of every
        // prompt at rest on an open pool revives exactly what is cached
        // of it, each block with the right contents.
        if !pool.is_closed() {
            let mut all = Vec::new();
            for p in 0..PROMPTS {
                let ts = prompt(p, cfg.n / cfg.bs);
                let ks = keys(&ts);
                let mut s = Sequence::new(Arc::clone(&pool));
                let peek = pool.peek_prefix(&ks);
                let k = s.try_match_prefix(&ks);
                assert_eq!(k, peek, "peek vs match at rest");
                w.check_tags(s.blocks(), &ks, "match at rest");
                all.push(s);
            }
            drop(all);
        }
        assert_whole(&pool, &format!("{cfg:?} round {round}"));
        total.0 += w.matched.load(SeqCst);
        total.1 += w.long_matches.load(SeqCst);
    }
    // Printed, not asserted: a schedule may legally evict or reset every
    // prefix before it is matched (the exact tests above make long matches
    // deterministically).
    eprintln!(
        "{cfg:?}: {} blocks matched, {} matches of more than 64, events replayed/dropped {replayed:?}",
        total.0, total.1
    );
}

fn rounds(default: usize) -> usize {
    std::env::var("AHEAD_ATTACK_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

const BASE: Config = Config {
    n: 1024,
    bs: 1,
    shards: 1,
    events: false,
    matchers: 2,
    reservers: 1,
    appenders: 1,
    waiters: 0,
    resets: false,
    hybrid: true,
    close_at: None,
    rounds: 30,
    ops: 60,
};

#[test]
fn stress_long_matches_one_shard() {
    stress(BASE.with_rounds(rounds(BASE.rounds)), 0x1111);
}

#[test]
fn stress_long_matches_sixteen_shards_events() {
    let cfg = Config {
        shards: 16,
        events: true,
        ..BASE
    };
    stress(cfg.with_rounds(rounds(cfg.rounds)), 0x2222);
}

#[test]
fn stress_long_matches_four_shards_waiters_resets() {
    let cfg = Config {
        shards: 4,
        waiters: 2,
        resets: true,
        bs: 2,
        ..BASE
    };
    stress(cfg.with_rounds(rounds(cfg.rounds)), 0x3333);
}

#[test]
fn stress_long_matches_nearly_full_small_pool_many_shards() {
    // 520 blocks and prompts of up to 500: every long match is on a pool
    // that is nearly full.
    let cfg = Config {
        n: 520,
        shards: 16,
        events: true,
        waiters: 1,
        matchers: 2,
        reservers: 2,
        appenders: 2,
        ..BASE
    };
    stress(cfg.with_rounds(rounds(cfg.rounds)), 0x4444);
}

#[test]
fn stress_long_matches_with_a_close() {
    for (i, shards) in [1usize, 4, 16].into_iter().enumerate() {
        let cfg = Config {
            shards,
            events: i == 1,
            waiters: 1,
            resets: i == 2,
            close_at: Some(20),
            rounds: 12,
            ..BASE
        };
        stress(cfg.with_rounds(rounds(cfg.rounds)), 0x5555 + i as u64);
    }
}

impl Config {
    fn with_rounds(self, rounds: usize) -> Config {
        Config { rounds, ..self }
    }
}
