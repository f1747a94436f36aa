//! Attacks on `HybridSequence::try_match_prefix` into a reservation (a
//! sequence holding only reserved blocks after `try_reserve`,
//! `reserve_blocking` or the async `reserve`): the reserved blocks are
//! lent to pay for revivals, the matched blocks a shorter group lets go of
//! keep their places as credits, and `refill_reservation` gives every
//! group its `k` match entries followed by as many blocks as it reserved
//! beyond them.
//!
//! What is attacked, and how:
//!
//! * the hit into a reservation is the hit into an empty sequence, block
//!   for block and in `prefix_stats`, and the brute-force hit of the
//!   cache's state (random full, sliding and chunked groups, block sizes,
//!   shard counts, evictions, owners holding prompts);
//! * the layout after the match (`k` entries, the window's, null entries
//!   before, then the reserved blocks beyond `k`, each held alone), the
//!   capacity kept, appends up to it with no pool call while the pool is
//!   full or owed to waiters;
//! * the pool's books (used / free / cached, every block taken once) and
//!   waiters: not granted what the reservation keeps, granted what the
//!   match leaves over;
//! * refusals that change nothing (no hit, other groups' keys, a
//!   sequence holding tokens, a closed pool's evictable blocks), and a
//!   reservation over another allocator than `BlockPool` (nothing lent);
//! * wakers that panic out of the give-backs of what is left over;
//! * real threads: matchers into reservations (try, blocking and async
//!   reservations), evicting appenders and publishers, raw waiters,
//!   `reset_prefix_cache`, `close`, KV events replayed, over a shadow of
//!   every block's holders and contents (`tests/common/shadow.rs`), and
//!   two lockstep races (a lend against an evicting allocation, two
//!   matchers of one prompt where a sliding group cuts the hit).
//!
//! One finding, fixed: behind a waiter, the first full group lent every
//! reserved block and the hit was 0 where the reservation paid for one
//! (`behind_a_waiter_the_reservation_pays_for_every_groups_share_of_the_hit`).
//! `HYBRID_RESERVATION_ATTACK_ROUNDS=N` scales the rounds.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

mod common;

use common::hybrid::{assert_whole, flag, group_keys, groups, held, publisher, sliding, tables};
use common::shadow::{replay, tag_of, Done, Shadow};
use common::{Forward, XorShift};
use kvslots::{
    BlockAllocator, BlockHash, BlockId, BlockPool, GroupKeys, HybridError, HybridSequence, KvGroup,
    KvGroups, ReserveError,
};

// ---------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------

fn rounds(default: usize) -> usize {
    std::env::var("HYBRID_RESERVATION_ATTACK_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn chunked(chunk_tokens: usize) -> KvGroup {
    KvGroup::ChunkedLocal { chunk_tokens }
}

fn build(n: usize, bs: usize, shards: usize, events: bool) -> Arc<BlockPool> {
    let mut b = BlockPool::builder(n, bs).prefix_cache(true).shards(shards);
    if events {
        b = b.kv_events(1 << 14);
    }
    Arc::new(b.build().unwrap())
}

/// Prompt `p` of `len` tokens: the first `(p % 3) * 2 * bs` tokens are
/// shared by the prompts of one family, the rest are `p`'s own.
fn prompt(p: usize, len: usize, bs: usize) -> Vec<u32> {
    let shared = (p % 3) * 2 * bs;
    (0..len)
        .map(|i| {
            if i < shared {
                i as u32
            } else {
                1_000_000 * (p as u32 + 1) + i as u32
            }
        })
        .collect()
}

/// The longest hit the cache can serve now, by brute force: the largest
/// `k` for which every group's needed blocks are cached.
fn brute_hit(pool: &BlockPool, g: &KvGroups, keys: &GroupKeys) -> usize {
    let bs = pool.block_size();
    let cached: Vec<Vec<bool>> = (0..g.len())
        .map(|gi| {
            keys.group(gi)
                .unwrap()
                .iter()
                .map(|k| pool.peek_prefix(std::slice::from_ref(k)) == 1)
                .collect()
        })
        .collect();
    (0..=keys.blocks())
        .rev()
        .find(|&k| {
            g.as_slice()
                .iter()
                .enumerate()
                .all(|(gi, kind)| (kind.first_needed_block(k * bs, bs)..k).all(|b| cached[gi][b]))
        })
        .unwrap()
}

/// The layout promised after a match of `k` into a reservation of `r`
/// blocks a group: each group's `k` entries (null before the window of
/// position `k * block_size`, its window's blocks after), then at most
/// `max(k, r) - k` blocks held alone; with `whole`, exactly that many.
/// Returns whether every group got them all.
fn check_layout(
    pool: &BlockPool,
    seq: &HybridSequence,
    keys: &GroupKeys,
    r: usize,
    k: usize,
    whole: bool,
    what: &str,
) -> bool {
    let bs = pool.block_size();
    assert_eq!(seq.len(), k * bs, "{what}: len");
    let mut all = HashSet::new();
    let mut full = true;
    for (gi, kind) in seq.groups().as_slice().iter().enumerate() {
        let t = seq.blocks(gi).unwrap();
        let null = seq.null_blocks(gi).unwrap();
        let need = kind.first_needed_block(k * bs, bs).min(k);
        assert_eq!(null, need, "{what}: group {gi} null entries");
        assert!(
            t.len() >= k,
            "{what}: group {gi} holds fewer than k entries"
        );
        assert!(
            t.len() <= k.max(r),
            "{what}: group {gi} holds {} entries, more than max(k {k}, r {r})",
            t.len()
        );
        if t.len() < k.max(r) {
            full = false;
        }
        assert!(
            t[..null].iter().all(|id| id.is_null()),
            "{what}: group {gi}"
        );
        assert!(
            t[null..].iter().all(|id| !id.is_null()),
            "{what}: group {gi}"
        );
        // The window's blocks hold the group's keys (cached now).
        let gk = keys.group(gi).unwrap();
        for (i, id) in t.iter().enumerate().take(k).skip(null) {
            assert!(pool.ref_count(*id).unwrap() >= 1, "{what}: {id}");
            assert_eq!(
                pool.peek_prefix(std::slice::from_ref(&gk[i])),
                1,
                "{what}: group {gi} entry {i} not cached"
            );
        }
        for id in &t[k..] {
            assert_eq!(
                pool.ref_count(*id),
                Some(1),
                "{what}: group {gi}: reserved {id} not held alone"
            );
        }
        for id in &t[null..] {
            assert!(all.insert(*id), "{what}: {id} twice in the tables");
        }
    }
    assert_eq!(all.len(), seq.held_blocks(), "{what}: held_blocks");
    if whole {
        assert!(full, "{what}: a group lost reserved blocks");
        assert!(seq.capacity() >= r * bs, "{what}: capacity fell");
    }
    assert!(seq.capacity() >= k * bs, "{what}: capacity below the hit");
    full
}

/// Distinct blocks held by these sequences.
fn distinct_held(seqs: &[&HybridSequence]) -> usize {
    seqs.iter()
        .flat_map(|s| held(s))
        .collect::<HashSet<_>>()
        .len()
}

fn check_events(pool: &BlockPool, view: &mut HashMap<BlockHash, BlockId>) {
    let mut evs = Vec::new();
    pool.drain_events(&mut evs);
    assert!(replay(view, &evs), "events dropped");
    assert_eq!(view.len(), pool.cached_blocks(), "events' view vs cached");
}

// Wakers

const WAKER_PANIC: &str = "a waker that panics (tests/hybrid_reservation_attack.rs)";

struct Panics;
impl Wake for Panics {
    fn wake(self: Arc<Self>) {
        panic!("{WAKER_PANIC}");
    }
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

/// A group configuration drawn at random: 1 to 3 groups of every kind.
fn random_groups(rng: &mut XorShift, bs: usize) -> KvGroups {
    let count = 1 + rng.below(3);
    let kinds: Vec<KvGroup> = (0..count)
        .map(|_| match rng.below(3) {
            0 => KvGroup::Full,
            1 => sliding(1 + rng.below(3 * bs + 2)),
            _ => chunked(1 + rng.below(3 * bs + 2)),
        })
        .collect();
    groups(&kinds)
}

// ---------------------------------------------------------------------
// One thread: the hit into a reservation is the hit into an empty
// sequence, and the brute force's
// ---------------------------------------------------------------------

/// A random cache: up to 4 prompts of one family published (the first
/// maybe still held by its owner), then some cached blocks evicted.
struct Scene {
    pool: Arc<BlockPool>,
    g: KvGroups,
    owner: Option<HybridSequence>,
    keys: GroupKeys,
    r: usize,
    view: HashMap<BlockHash, BlockId>,
    events: bool,
}

fn scene(rng: &mut XorShift, case: usize) -> Scene {
    let bs = [1usize, 2, 4][rng.below(3)];
    let shards = [1usize, 2, 4][rng.below(3)];
    let events = rng.chance(50);
    let g = random_groups(rng, bs);
    let gn = g.len();
    let prompts = 1 + rng.below(4);
    let max_blocks = 12;
    let r = 1 + rng.below(14);
    let n = gn * (prompts * (max_blocks + 1) + r + 2) + 8;
    let pool = build(n, bs, shards, events);
    let mut owner = None;
    let base = case * 7;
    let mut lens = Vec::new();
    for i in 0..prompts {
        let len = 1 + rng.below(max_blocks * bs);
        lens.push(len);
        let s = publisher(&pool, &g, &prompt(base + i, len, bs));
        if i == 0 && rng.chance(40) {
            owner = Some(s);
        }
    }
    // Evict some cached blocks: take every uncached free block and `e`
    // more.
    let evictable = pool.evictable_blocks();
    let e = rng.below(evictable + 1);
    let uncached = pool.free_blocks() - evictable;
    let mut hog = Vec::new();
    pool.try_alloc(uncached + e, &mut hog).unwrap();
    pool.free(&hog).unwrap();
    // The query: one of the prompts, maybe longer or shorter.
    let p = rng.below(prompts);
    let len = (lens[p] + rng.below(3 * bs)).saturating_sub(rng.below(2 * bs));
    let keys = group_keys(&g, &prompt(base + p, len, bs), bs);
    let mut view = HashMap::new();
    if events {
        check_events(&pool, &mut view);
    }
    Scene {
        pool,
        g,
        owner,
        keys,
        r,
        view,
        events,
    }
}

#[test]
fn a_reservation_hits_what_an_empty_sequence_hits_block_for_block() {
    let mut rng = XorShift::from_state(0x5EED_1234_ABCD);
    let (mut lent_cases, mut hits) = (0, 0);
    for case in 0..rounds(400) {
        let Scene {
            pool,
            g,
            owner,
            keys,
            r,
            mut view,
            events,
        } = scene(&mut rng, case);
        let bs = pool.block_size();
        let what = format!("case {case}: {g:?} bs {bs} r {r}");
        let want = brute_hit(&pool, &g, &keys);
        // Into an empty sequence.
        let s0 = pool.prefix_stats();
        let mut empty = HybridSequence::new(Arc::clone(&pool), g.clone());
        let ke = empty.try_match_prefix(&keys).unwrap();
        let s1 = pool.prefix_stats();
        assert_eq!(ke, want, "{what}: empty vs brute force");
        let te = tables(&empty);
        drop(empty);
        // Into a reservation of `r` blocks a group.
        let evictions = pool.prefix_stats().evictions;
        let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
        seq.try_reserve(r * bs, 0).unwrap();
        assert_eq!(pool.prefix_stats().evictions, evictions, "{what}: setup");
        assert_eq!(seq.capacity(), r * bs);
        let reserved: HashSet<BlockId> = held(&seq).into_iter().collect();
        let s2 = pool.prefix_stats();
        let k = seq.try_match_prefix(&keys).unwrap();
        let s3 = pool.prefix_stats();
        assert_eq!(k, ke, "{what}: reservation vs empty");
        hits += usize::from(k > 0);
        for (gi, t) in te.iter().enumerate() {
            assert_eq!(&seq.blocks(gi).unwrap()[..k], &t[..k], "{what}: group {gi}");
        }
        // Planned first (nothing running meanwhile), the match into the
        // reservation looks up exactly the blocks it keeps, every one a
        // hit: no more than the empty sequence's search.
        let kept: u64 = (0..g.len())
            .map(|gi| {
                seq.blocks(gi).unwrap()[..k]
                    .iter()
                    .filter(|b| !b.is_null())
                    .count() as u64
            })
            .sum();
        let (queried, hit) = (
            s3.queried_blocks - s2.queried_blocks,
            s3.hit_blocks - s2.hit_blocks,
        );
        assert_eq!((queried, hit), (kept, kept), "{what}: prefix_stats");
        assert!(
            queried <= s1.queried_blocks - s0.queried_blocks
                && hit <= s1.hit_blocks - s0.hit_blocks,
            "{what}: prefix_stats against the empty sequence's"
        );
        check_layout(&pool, &seq, &keys, r, k, true, &what);
        if held(&seq)
            .iter()
            .any(|id| !reserved.contains(id) && !te.iter().any(|t| t[..k].contains(id)))
        {
            lent_cases += 1;
        }
        let mut holders = vec![&seq];
        holders.extend(owner.as_ref());
        assert_eq!(pool.used_blocks(), distinct_held(&holders), "{what}: used");
        if events {
            check_events(&pool, &mut view);
        }
        // The capacity is the reservation's: appends up to it need no
        // block, also with the pool full.
        let mut hog = Vec::new();
        pool.try_alloc(pool.free_blocks(), &mut hog).unwrap();
        let before = tables(&seq);
        let room = seq.capacity() - seq.len();
        seq.try_append(room)
            .unwrap_or_else(|e| panic!("{what}: append of {room} into the reservation: {e:?}"));
        assert_eq!(
            tables(&seq),
            before,
            "{what}: the append changed the tables"
        );
        pool.free(&hog).unwrap();
        drop(seq);
        drop(owner);
        assert_whole(&pool);
        if events {
            check_events(&pool, &mut view);
        }
    }
    eprintln!("{hits} hits, {lent_cases} with a reserved block taken back or replaced");
}

/// The same scenes with the rest of the pool owed to a queued waiter:
/// only the reserved blocks can pay for revivals. The waiter is granted
/// exactly when what the match leaves over lets it in, the appends up to
/// the capacity need no block, and the hit is never more than the brute
/// force's.
#[test]
fn behind_a_waiter_the_reservation_keeps_its_capacity_and_leaves_the_rest() {
    let mut rng = XorShift::from_state(0xBEEF_0042);
    let (mut granted_by_match, mut short) = (0, 0);
    for case in 0..rounds(300) {
        let Scene {
            pool,
            g,
            owner,
            keys,
            r,
            mut view,
            events,
        } = scene(&mut rng, case);
        let bs = pool.block_size();
        let n = pool.num_blocks();
        let what = format!("case {case}: {g:?} bs {bs} r {r}");
        let want = brute_hit(&pool, &g, &keys);
        let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
        seq.try_reserve(r * bs, 0).unwrap();
        // Every uncached free block taken: what is free is evictable.
        let mut hog = Vec::new();
        pool.try_alloc(pool.free_blocks() - pool.evictable_blocks(), &mut hog)
            .unwrap();
        let owed = pool.free_blocks() + 1 + rng.below(2);
        let mut ids = Vec::new();
        let woken = flag();
        let mut fut = Box::pin(pool.alloc(owed, &mut ids));
        assert!(poll(fut.as_mut(), Waker::from(Arc::clone(&woken))).is_pending());
        assert_eq!(pool.waiters(), 1);
        let k = seq.try_match_prefix(&keys).unwrap();
        assert!(k <= want, "{what}: {k} past the brute force's {want}");
        short += usize::from(k < want);
        check_layout(&pool, &seq, &keys, r, k, true, &what);
        let mut holders = vec![&seq];
        holders.extend(owner.as_ref());
        let mine = distinct_held(&holders) + hog.len();
        // Granted iff what is left lets it in.
        let fits = n - mine >= owed;
        assert_eq!(woken.0.load(SeqCst), fits, "{what}: waiter woken");
        assert_eq!(
            pool.used_blocks(),
            mine + if fits { owed } else { 0 },
            "{what}: used"
        );
        granted_by_match += usize::from(fits);
        if fits {
            let got = poll(fut.as_mut(), Waker::from(flag()));
            assert!(matches!(got, Poll::Ready(Ok(()))), "{what}: {got:?}");
        } else {
            assert!(poll(fut.as_mut(), Waker::from(Arc::clone(&woken))).is_pending());
        }
        assert_eq!(pool.waiters(), usize::from(!fits), "{what}: waiters");
        // Appends up to the capacity take nothing from the waiter.
        let before = tables(&seq);
        let room = seq.capacity() - seq.len();
        seq.try_append(room)
            .unwrap_or_else(|e| panic!("{what}: append of {room} behind the waiter: {e:?}"));
        assert_eq!(
            tables(&seq),
            before,
            "{what}: the append changed the tables"
        );
        assert_eq!(
            pool.waiters(),
            usize::from(!fits),
            "{what}: after the append"
        );
        assert!(
            fits || !woken.0.load(SeqCst),
            "{what}: the append granted the waiter"
        );
        if events {
            check_events(&pool, &mut view);
        }
        drop(seq);
        pool.free(&hog).unwrap();
        if !fits {
            assert!(woken.0.load(SeqCst), "{what}: not woken once all went back");
            let got = poll(fut.as_mut(), Waker::from(flag()));
            assert!(matches!(got, Poll::Ready(Ok(()))), "{what}: {got:?}");
        }
        drop(fut);
        assert_eq!(ids.len(), owed);
        pool.free(&ids).unwrap();
        drop(owner);
        assert_whole(&pool);
        if events {
            check_events(&pool, &mut view);
        }
    }
    eprintln!(
        "{granted_by_match} waiters granted by the match, {short} hits short of the brute force"
    );
}

// ---------------------------------------------------------------------
// Refusals change nothing
// ---------------------------------------------------------------------

/// Everything a refused match must leave as it was.
#[derive(Debug, PartialEq, Eq)]
struct Books {
    tables: Vec<Vec<BlockId>>,
    len: usize,
    capacity: usize,
    used: usize,
    free: usize,
    cached: usize,
    evictable: usize,
    hits: u64,
    evictions: u64,
}

fn books<A: BlockAllocator + ?Sized>(pool: &BlockPool, seq: &HybridSequence<A>) -> Books {
    let stats = pool.prefix_stats();
    Books {
        tables: tables(seq),
        len: seq.len(),
        capacity: seq.capacity(),
        used: pool.used_blocks(),
        free: pool.free_blocks(),
        cached: pool.cached_blocks(),
        evictable: pool.evictable_blocks(),
        hits: stats.hit_blocks,
        evictions: stats.evictions,
    }
}

const KINDS: [&[KvGroup]; 6] = [
    &[KvGroup::Full],
    &[KvGroup::SlidingWindow { window_tokens: 6 }, KvGroup::Full],
    &[KvGroup::ChunkedLocal { chunk_tokens: 8 }, KvGroup::Full],
    &[
        KvGroup::Full,
        KvGroup::ChunkedLocal { chunk_tokens: 5 },
        KvGroup::SlidingWindow { window_tokens: 3 },
    ],
    &[KvGroup::SlidingWindow { window_tokens: 9 }],
    &[
        KvGroup::ChunkedLocal { chunk_tokens: 4 },
        KvGroup::Full,
        KvGroup::Full,
    ],
];

#[test]
fn refusals_and_misses_change_nothing() {
    let bs = 4;
    for kinds in KINDS {
        for shards in [1, 4] {
            let g = groups(kinds);
            let pool = build(96, bs, shards, true);
            let mut view = HashMap::new();
            let tokens: Vec<u32> = (0..37).collect();
            drop(publisher(&pool, &g, &tokens));
            let keys = group_keys(&g, &tokens, bs);
            check_events(&pool, &mut view);
            let what = format!("{kinds:?} shards {shards}");
            let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
            seq.try_reserve(24, 0).unwrap();
            // A miss: no block of any group cached.
            let other = group_keys(&g, &(500..540).collect::<Vec<u32>>(), bs);
            let before = books(&pool, &seq);
            assert_eq!(seq.try_match_prefix(&other), Ok(0), "{what}");
            assert_eq!(books(&pool, &seq), before, "{what}: a miss");
            // No keys.
            assert_eq!(seq.try_match_prefix(&GroupKeys::new(&g)), Ok(0));
            assert_eq!(books(&pool, &seq), before, "{what}: no keys");
            // Keys of other groups.
            let alien = groups(&[KvGroup::Full, sliding(7)]);
            let alien_keys = group_keys(&alien, &tokens, bs);
            assert_eq!(
                seq.try_match_prefix(&alien_keys),
                Err(HybridError::OtherGroups),
                "{what}"
            );
            assert_eq!(books(&pool, &seq), before, "{what}: other groups");
            // Nothing happened: no event.
            let mut evs = Vec::new();
            pool.drain_events(&mut evs);
            assert!(evs.is_empty(), "{what}: {evs:?}");
            // A sequence that holds a token matches nothing.
            let mut running = HybridSequence::new(Arc::clone(&pool), g.clone());
            running.try_reserve(24, 0).unwrap();
            running.try_append(1).unwrap();
            let before_running = books(&pool, &running);
            assert_eq!(running.try_match_prefix(&keys), Ok(0));
            assert_eq!(books(&pool, &running), before_running, "{what}: running");
            drop(running);
            // After the miss the same reservation still matches, once.
            let k = seq.try_match_prefix(&keys).unwrap();
            assert_eq!(k, brute_hit(&pool, &g, &keys), "{what}");
            assert!(k > 0, "{what}");
            check_layout(&pool, &seq, &keys, 6, k, true, &what);
            let after = books(&pool, &seq);
            assert_eq!(seq.try_match_prefix(&keys), Ok(0), "{what}: a second match");
            assert_eq!(books(&pool, &seq), after, "{what}: a second match");
            check_events(&pool, &mut view);
            drop(seq);
            assert_whole(&pool);
            check_events(&pool, &mut view);
        }
    }
}

/// A closed pool revives nothing into a reservation: with every cached
/// block evictable the match changes nothing; blocks an owner holds still
/// match (no revival), and the reservation keeps its capacity.
#[test]
fn a_closed_pool_revives_nothing_into_a_reservation() {
    let bs = 4;
    for kinds in KINDS {
        for owned in [false, true] {
            let g = groups(kinds);
            let pool = build(96, bs, 2, false);
            let tokens: Vec<u32> = (0..41).collect();
            let owner = publisher(&pool, &g, &tokens);
            let keys = group_keys(&g, &tokens, bs);
            let owner = owned.then_some(owner);
            let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
            seq.try_reserve(16, 0).unwrap(); // 4 blocks a group
            pool.close();
            let what = format!("{kinds:?} owned {owned}");
            let before = books(&pool, &seq);
            let k = seq.try_match_prefix(&keys).unwrap();
            if owned {
                assert_eq!(k, 10, "{what}: held blocks match on a closed pool");
                check_layout(&pool, &seq, &keys, 4, k, true, &what);
                let mut holders = vec![&seq];
                holders.extend(owner.as_ref());
                assert_eq!(pool.used_blocks(), distinct_held(&holders), "{what}");
                assert_eq!(pool.cached_blocks(), before.cached, "{what}");
            } else {
                assert_eq!(k, 0, "{what}");
                assert_eq!(
                    books(&pool, &seq),
                    before,
                    "{what}: revived on a closed pool"
                );
            }
            drop(seq);
            drop(owner);
            assert_whole(&pool);
        }
    }
}

/// Over another allocator than `BlockPool` (a forwarding wrapper), a
/// reservation lends nothing (with the forwarder's lending on or off): its
/// revivals are admitted as into an empty sequence, so with room in the
/// pool it hits what an empty sequence hits, and every group keeps as many
/// blocks as it reserved beyond the hit.
#[test]
fn over_another_allocator_a_reservation_lends_nothing_and_keeps_its_capacity() {
    let bs = 4;
    for kinds in KINDS {
        for lend in [true, false] {
            let g = groups(kinds);
            let fwd = Forward::new(BlockPool::new(96, bs));
            fwd.lend.store(lend, SeqCst);
            let pool = &fwd.inner;
            let tokens: Vec<u32> = (0..33).collect();
            {
                let mut p = HybridSequence::new(Arc::clone(&fwd), g.clone());
                p.try_append(tokens.len()).unwrap();
                p.publish(&group_keys(&g, &tokens, bs)).unwrap();
            }
            let keys = group_keys(&g, &tokens, bs);
            let want = brute_hit(pool, &g, &keys);
            assert!(want > 0);
            let what = format!("{kinds:?} lend {lend}");
            let mut seq = HybridSequence::new(Arc::clone(&fwd), g.clone());
            seq.try_reserve(40, 0).unwrap();
            let capacity = seq.capacity();
            assert_eq!(seq.try_match_prefix(&keys), Ok(want), "{what}");
            assert_eq!(fwd.lent.load(SeqCst), 0, "{what}");
            assert!(seq.capacity() >= capacity, "{what}");
            for t in tables(&seq) {
                assert_eq!(t.len(), want.max(10), "{what}");
            }
            assert_eq!(pool.used_blocks(), seq.held_blocks(), "{what}");
            // Its appends up to the capacity take nothing from the pool.
            let used = pool.used_blocks();
            let room = seq.capacity() - seq.len();
            seq.try_append(room).unwrap();
            assert!(pool.used_blocks() <= used, "{what}");
            drop(seq);
            assert_whole(pool);
        }
    }
}

// ---------------------------------------------------------------------
// Reservations granted after a wait
// ---------------------------------------------------------------------

/// `reserve_blocking` and the async `reserve`, each granted once another
/// request lets go, then a match into what they got.
#[test]
fn reservations_granted_after_a_wait_match_and_keep_their_capacity() {
    let bs = 2;
    for kinds in KINDS {
        for blocking in [true, false] {
            let g = groups(kinds);
            let gn = g.len();
            let tokens: Vec<u32> = (0..23).collect(); // 11 blocks
            let n = gn * 11 + gn * 8;
            let pool = build(n, bs, 2, true);
            drop(publisher(&pool, &g, &tokens));
            let keys = group_keys(&g, &tokens, bs);
            let want = brute_hit(&pool, &g, &keys);
            // The hog takes every uncached block: the 11 a group cached
            // are all that is left.
            let mut hog = HybridSequence::new(Arc::clone(&pool), g.clone());
            hog.try_reserve(8 * bs, 0).unwrap();
            assert_eq!(pool.free_blocks(), pool.evictable_blocks());
            let what = format!("{kinds:?} blocking {blocking}");
            let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
            // 16 blocks a group: more than the evictable ones, so it
            // waits for the hog.
            let r = 16;
            thread::scope(|sc| {
                let pool = &pool;
                let waiting = sc.spawn(|| {
                    if blocking {
                        seq.reserve_blocking(r * bs, 0, Some(Duration::from_secs(30)))
                    } else {
                        let woken = flag();
                        let mut fut = Box::pin(seq.reserve(r * bs, 0));
                        loop {
                            match poll(fut.as_mut(), Waker::from(Arc::clone(&woken))) {
                                Poll::Ready(res) => break res,
                                Poll::Pending => {
                                    while !woken.0.swap(false, SeqCst) {
                                        thread::park();
                                    }
                                }
                            }
                        }
                    }
                });
                common::wait_until(|| pool.waiters() == 1 || waiting.is_finished());
                drop(hog);
                waiting.join().unwrap().unwrap();
            });
            assert_eq!(seq.capacity(), r * bs);
            let k = seq.try_match_prefix(&keys).unwrap();
            // The reservation evicted what it had to: the hit is what is
            // left cached.
            assert_eq!(k, brute_hit(&pool, &g, &keys).max(k), "{what}");
            assert!(k <= want, "{what}");
            check_layout(&pool, &seq, &keys, r, k, true, &what);
            assert_eq!(pool.used_blocks(), seq.held_blocks(), "{what}");
            let room = seq.capacity() - seq.len();
            let mut full = Vec::new();
            pool.try_alloc(pool.free_blocks(), &mut full).unwrap();
            let before = tables(&seq);
            seq.try_append(room).unwrap();
            assert_eq!(tables(&seq), before, "{what}");
            pool.free(&full).unwrap();
            drop(seq);
            assert_whole(&pool);
        }
    }
}

// ---------------------------------------------------------------------
// Waker panics out of the give-backs
// ---------------------------------------------------------------------

/// The reserved blocks a held prefix replaces go back at the end of the
/// match and grant a waiter whose waker panics: the panic comes out of
/// the match with the sequence whole and counted.
#[test]
fn a_waker_panic_out_of_the_leftover_give_back_leaves_the_match_whole() {
    quiet();
    let bs = 2;
    let mut panics = 0;
    for kinds in KINDS {
        for (r, want) in [(3usize, 1usize), (4, 3), (8, 5), (12, 2)] {
            let g = groups(kinds);
            let gn = g.len();
            let tokens: Vec<u32> = (0..13).collect(); // 6 blocks
            let pool = build(gn * 6 + gn * r + 3, bs, 1, true);
            let mut view = HashMap::new();
            let owner = publisher(&pool, &g, &tokens);
            let keys = group_keys(&g, &tokens, bs);
            let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
            seq.try_reserve(r * bs, 0).unwrap();
            let mut filler = Vec::new();
            pool.try_alloc(pool.free_blocks(), &mut filler).unwrap();
            let what = format!("{kinds:?} r {r} want {want}");
            let mut ids = Vec::new();
            {
                let mut fut = Box::pin(pool.alloc(want, &mut ids));
                assert!(poll(fut.as_mut(), Waker::from(Arc::new(Panics))).is_pending());
                let res = catch_unwind(AssertUnwindSafe(|| seq.try_match_prefix(&keys)));
                // The held prefix matches with no revival: the reserved
                // blocks it replaces, gn * min(r, k) of them, go back.
                let k = seq.len() / bs;
                assert_eq!(k, brute_hit(&pool, &g, &keys), "{what}");
                let left = gn * r.min(k);
                if left >= want {
                    panics += 1;
                    let payload = res.expect_err("the waker's panic comes out");
                    assert_eq!(
                        payload.downcast_ref::<String>().map(String::as_str),
                        Some(WAKER_PANIC)
                    );
                    let got = poll(fut.as_mut(), Waker::from(flag()));
                    assert!(matches!(got, Poll::Ready(Ok(()))), "{what}: {got:?}");
                } else {
                    assert_eq!(res.unwrap(), Ok(k));
                }
            }
            let k = seq.len() / bs;
            check_layout(&pool, &seq, &keys, r, k, true, &what);
            let mine: HashSet<_> = held(&seq).into_iter().collect();
            for id in ids.iter().chain(&filler) {
                assert!(!mine.contains(id), "{what}: {id} granted and kept");
            }
            assert_eq!(
                pool.used_blocks(),
                distinct_held(&[&seq, &owner]) + filler.len() + ids.len(),
                "{what}"
            );
            let before = tables(&seq);
            seq.try_append(seq.capacity() - seq.len()).unwrap();
            assert_eq!(tables(&seq), before, "{what}");
            check_events(&pool, &mut view);
            pool.free(&ids).unwrap();
            pool.free(&filler).unwrap();
            drop(seq);
            drop(owner);
            assert_whole(&pool);
            check_events(&pool, &mut view);
        }
    }
    assert!(panics > 10, "only {panics} wakers panicked");
}

/// The places kept for the blocks a shorter sliding group lets go of,
/// left over once the reservation is refilled, go back last and grant a
/// waiter whose waker panics.
#[test]
fn a_waker_panic_out_of_the_credits_give_back_leaves_the_match_whole() {
    quiet();
    let bs = 4;
    let (mut panics, mut cases) = (0, 0);
    for (kinds, cut_from) in [
        (&[KvGroup::Full, sliding(6)][..], 4usize),
        (&[KvGroup::Full, chunked(8)][..], 5),
        (&[KvGroup::Full, KvGroup::Full, sliding(5)][..], 3),
    ] {
        for r in [2usize, 4, 6, 10] {
            for extra in [1usize, 2] {
                let g = groups(kinds);
                let gn = g.len();
                let last = gn - 1;
                let tokens: Vec<u32> = (0..32).collect(); // 8 blocks
                let keys = group_keys(&g, &tokens, bs);
                let pool = build(gn * 8 + gn * r, bs, 1, true);
                let mut view = HashMap::new();
                drop(publisher(&pool, &g, &tokens));
                // The last group's blocks from `cut_from` on: uncached.
                for b in cut_from..8 {
                    let key = keys.group(last).unwrap()[b];
                    let mut s = kvslots::Sequence::new(Arc::clone(&pool));
                    assert_eq!(s.try_match_prefix(&[key]), 1);
                    s.truncate(1);
                }
                let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
                seq.try_reserve(r * bs, 0).unwrap();
                let mut filler = Vec::new();
                pool.try_alloc(pool.free_blocks() - pool.evictable_blocks(), &mut filler)
                    .unwrap();
                let what = format!("{kinds:?} r {r} extra {extra}");
                let free = pool.free_blocks();
                let want = free + extra;
                let mut ids = Vec::new();
                let mut fut = Box::pin(pool.alloc(want, &mut ids));
                assert!(poll(fut.as_mut(), Waker::from(Arc::new(Panics))).is_pending());
                let res = catch_unwind(AssertUnwindSafe(|| seq.try_match_prefix(&keys)));
                let k = seq.len() / bs;
                check_layout(&pool, &seq, &keys, r, k, true, &what);
                let mine = distinct_held(&[&seq]) + filler.len();
                let fits = pool.num_blocks() - mine >= want;
                cases += 1;
                if fits {
                    panics += 1;
                    let payload = res.expect_err("the waker's panic comes out");
                    assert_eq!(
                        payload.downcast_ref::<String>().map(String::as_str),
                        Some(WAKER_PANIC)
                    );
                    let got = poll(fut.as_mut(), Waker::from(flag()));
                    assert!(matches!(got, Poll::Ready(Ok(()))), "{what}: {got:?}");
                } else {
                    assert_eq!(res.unwrap(), Ok(k), "{what}");
                    assert!(poll(fut.as_mut(), Waker::from(flag())).is_pending());
                }
                drop(fut);
                assert_eq!(pool.used_blocks(), mine + ids.len(), "{what}");
                let before = tables(&seq);
                seq.try_append(seq.capacity() - seq.len()).unwrap();
                assert_eq!(tables(&seq), before, "{what}");
                check_events(&pool, &mut view);
                pool.free(&ids).unwrap();
                pool.free(&filler).unwrap();
                drop(seq);
                assert_whole(&pool);
                check_events(&pool, &mut view);
            }
        }
    }
    assert!(
        panics > 0 && panics < cases,
        "{panics} of {cases} wakers panicked"
    );
}

// ---------------------------------------------------------------------
// Real threads over a shadow of the pool
// ---------------------------------------------------------------------

/// The shadow of the pool's blocks, and what the attack counts.
struct World {
    pool: Arc<BlockPool>,
    g: KvGroups,
    shadow: Shadow,
    /// Whether no other thread can take a block a match lets go of while
    /// it is held (one matcher, appenders that never match): then every
    /// group keeps all its reserved blocks beyond the hit.
    strict: bool,
    matches: AtomicUsize,
    matched_blocks: AtomicUsize,
    /// Matches after which a group held fewer blocks beyond the hit than
    /// it reserved (the documented race).
    short: AtomicUsize,
    /// Matched entries taken by every match (for `prefix_stats`).
    entries: AtomicUsize,
}

impl std::ops::Deref for World {
    type Target = Shadow;
    fn deref(&self) -> &Shadow {
        &self.shadow
    }
}

/// The tags of `keys` (what blocks holding them contain).
fn tags(keys: &[BlockHash]) -> Vec<u64> {
    keys.iter().map(tag_of).collect()
}

/// Takes the matched entries of every group into the shadow and checks
/// they hold their keys' tags; returns how many.
fn take_matched(w: &World, s: &HybridSequence, keys: &GroupKeys, k: usize, what: &str) -> usize {
    let mut count = 0;
    for gi in 0..s.groups().len() {
        let t = s.blocks(gi).unwrap();
        let null = s.null_blocks(gi).unwrap();
        let gk = keys.group(gi).unwrap();
        w.take_shared(&t[null..k]);
        w.check_tags(&t[null..k], &gk[null..k], what);
        count += k - null;
    }
    count
}

/// Writes the tags of every group's full blocks from `from` on (blocks
/// this sequence wrote) before a publish.
fn write_full(w: &World, s: &HybridSequence, keys: &GroupKeys, from: usize) {
    let bs = s.pool().block_size();
    let full = (s.len() / bs).min(keys.blocks());
    for gi in 0..s.groups().len() {
        let t = s.blocks(gi).unwrap();
        let start = s.null_blocks(gi).unwrap().max(from);
        if full > start {
            let gk = keys.group(gi).unwrap();
            w.write_tags(&t[start..full], &tags(&gk[start..full]));
        }
    }
}

/// Reserves `r` blocks a group (try, blocking, or async polled a few
/// times), or returns `None`.
fn reserve(
    s: &mut HybridSequence,
    rng: &mut XorShift,
    tokens: usize,
    blocking: bool,
) -> Option<()> {
    let got = if blocking && rng.chance(20) {
        s.reserve_blocking(tokens, 0, Some(Duration::from_micros(300)))
    } else if blocking && rng.chance(20) {
        let woken = flag();
        let mut fut = Box::pin(s.reserve(tokens, 0));
        let mut out = Err(ReserveError::Closed);
        for _ in 0..4 {
            woken.0.store(false, SeqCst);
            match poll(fut.as_mut(), Waker::from(Arc::clone(&woken))) {
                Poll::Ready(res) => {
                    out = res;
                    break;
                }
                Poll::Pending => {
                    if !woken.0.load(SeqCst) {
                        thread::park_timeout(Duration::from_micros(100));
                    }
                }
            }
        }
        drop(fut);
        out
    } else {
        s.try_reserve(tokens, 0)
    };
    got.ok()
}

/// A matcher into a reservation: reserves, matches a prompt, checks every
/// promise, appends up to the capacity, publishes, drops.
fn matcher(w: &World, rng: &mut XorShift, max_r: usize, max_tokens: usize, blocking: bool) {
    let pool = &w.pool;
    let bs = pool.block_size();
    let r = 1 + rng.below(max_r);
    let mut s = HybridSequence::new(Arc::clone(pool), w.g.clone());
    if reserve(&mut s, rng, r * bs, blocking).is_none() {
        assert!(held(&s).is_empty(), "a refused reservation holds blocks");
        return;
    }
    for gi in 0..s.groups().len() {
        assert_eq!(s.blocks(gi).unwrap().len(), r);
    }
    let reserved = held(&s);
    let stamp = w.take_fresh(&reserved, "reservation");
    let tokens = prompt(rng.below(6), 1 + rng.below(max_tokens), bs);
    let keys = group_keys(&w.g, &tokens, bs);
    // Checked once the pool could not hand them out legitimately.
    w.check_stamp(&reserved, stamp, "reserved before the match");
    w.give(&reserved);
    let k = s.try_match_prefix(&keys).unwrap();
    assert!(k <= keys.blocks());
    w.matches.fetch_add(1, SeqCst);
    w.matched_blocks.fetch_add(k, SeqCst);
    let whole = check_layout(pool, &s, &keys, r, k, w.strict, "matcher");
    if !whole {
        w.short.fetch_add(1, SeqCst);
    }
    let taken = take_matched(w, &s, &keys, k, "after the match");
    w.entries.fetch_add(taken, SeqCst);
    let mut tails = Vec::new();
    for gi in 0..s.groups().len() {
        tails.extend_from_slice(&s.blocks(gi).unwrap()[k..]);
    }
    let stamp = w.take_fresh(&tails, "kept reserved");
    // Appends up to the capacity: no block taken, nothing given back.
    let before = tables(&s);
    let room = s.capacity() - s.len();
    s.try_append(room).expect("an append into the reservation");
    assert_eq!(tables(&s), before, "the append changed the tables");
    w.check_stamp(&tails, stamp, "reserved after the append");
    take_matched(w, &s, &keys, k, "matched after the append");
    let matched_again: Vec<BlockId> = (0..s.groups().len())
        .flat_map(|gi| {
            let t = s.blocks(gi).unwrap();
            t[s.null_blocks(gi).unwrap()..k].to_vec()
        })
        .collect();
    w.give(&matched_again);
    if rng.chance(70) {
        write_full(w, &s, &keys, k);
        s.publish(&keys).unwrap();
    }
    w.give(&held(&s));
    drop(s);
}

/// An evicting appender: an empty sequence (that may match first unless
/// the world is strict) appends the rest of a prompt, writes it,
/// publishes it.
fn appender(w: &World, rng: &mut XorShift, max_tokens: usize) {
    let pool = &w.pool;
    let bs = pool.block_size();
    let tokens = prompt(rng.below(6), 1 + rng.below(max_tokens), bs);
    let keys = group_keys(&w.g, &tokens, bs);
    let mut s = HybridSequence::new(Arc::clone(pool), w.g.clone());
    let k = if !w.strict && rng.chance(50) {
        s.try_match_prefix(&keys).unwrap()
    } else {
        0
    };
    check_layout(pool, &s, &keys, 0, k, true, "appender's match");
    let taken = take_matched(w, &s, &keys, k, "appender's match");
    w.entries.fetch_add(taken, SeqCst);
    let nulls: Vec<usize> = (0..s.groups().len())
        .map(|gi| s.null_blocks(gi).unwrap())
        .collect();
    let want = tokens.len() - k * bs;
    if want > 0 && s.try_append(want).is_ok() {
        let mut new = Vec::new();
        for (gi, &null) in nulls.iter().enumerate() {
            assert_eq!(s.null_blocks(gi), Some(null), "an append moved the window");
            new.extend_from_slice(&s.blocks(gi).unwrap()[null.max(k)..]);
        }
        w.take_fresh(&new, "append");
        write_full(w, &s, &keys, k);
        s.publish(&keys).unwrap();
    }
    w.give(&held(&s));
    drop(s);
}

/// A raw allocation with a blocking wait (a waiter in the queue).
fn waiter(w: &World, rng: &mut XorShift) {
    let pool = &w.pool;
    let want = 1 + rng.below(pool.num_blocks());
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
    max_tokens: usize,
    strict: bool,
}

fn stress(cfg: Config, seed: u64) {
    let (mut total_m, mut total_k, mut total_short) = (0, 0, 0);
    for round in 0..cfg.rounds {
        let pool = build(cfg.n, cfg.bs, cfg.shards, cfg.events);
        let g = groups(KINDS[round % KINDS.len()]);
        let w = Arc::new(World {
            pool: Arc::clone(&pool),
            g: g.clone(),
            shadow: Shadow::new(cfg.n),
            strict: cfg.strict,
            matches: AtomicUsize::new(0),
            matched_blocks: AtomicUsize::new(0),
            short: AtomicUsize::new(0),
            entries: AtomicUsize::new(0),
        });
        let mut view = HashMap::new();
        if cfg.events {
            check_events(&pool, &mut view);
        }
        let threads = cfg.matchers + cfg.appenders + cfg.waiters + usize::from(cfg.resets);
        let barrier = Barrier::new(threads);
        let done = AtomicUsize::new(0);
        let workers = cfg.matchers + cfg.appenders;
        let stats0 = pool.prefix_stats();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            thread::scope(|sc| {
                for t in 0..threads {
                    let (w, barrier, done) = (&w, &barrier, &done);
                    sc.spawn(move || {
                        let mut rng = XorShift::from_state(
                            seed ^ ((round as u64) << 20)
                                ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                        );
                        barrier.wait();
                        if t < cfg.matchers {
                            // Counted also when the worker panics, so that
                            // the waiters and the resets stop.
                            let _done = Done(done);
                            for i in 0..cfg.ops {
                                if cfg.close_at == Some(i) && t == 0 {
                                    w.pool.close();
                                }
                                matcher(w, &mut rng, cfg.max_r, cfg.max_tokens, cfg.waiters > 0);
                            }
                        } else if t < workers {
                            let _done = Done(done);
                            for _ in 0..cfg.ops {
                                appender(w, &mut rng, cfg.max_tokens);
                            }
                        } else if t < workers + cfg.waiters {
                            while done.load(SeqCst) < workers {
                                waiter(w, &mut rng);
                            }
                        } else {
                            while done.load(SeqCst) < workers {
                                w.pool.reset_prefix_cache();
                                thread::yield_now();
                            }
                        }
                    });
                }
            });
        }));
        if let Err(e) = outcome {
            eprintln!("round {round} of {cfg:?} ({g:?}) seed {seed}");
            std::panic::resume_unwind(e);
        }
        pool.complete_all();
        for (i, h) in w.held.iter().enumerate() {
            assert_eq!(h.load(SeqCst), 0, "shadow holder of block {i}");
        }
        let stats = pool.prefix_stats();
        let hits = stats.hit_blocks - stats0.hit_blocks;
        assert!(
            hits >= w.entries.load(SeqCst) as u64,
            "hits below the entries taken"
        );
        assert!(stats.queried_blocks - stats0.queried_blocks >= hits);
        if cfg.events {
            check_events(&pool, &mut view);
        }
        assert_eq!(pool.evictable_blocks(), pool.cached_blocks());
        assert_eq!(pool.used_blocks(), 0);
        assert_eq!(pool.free_blocks(), cfg.n);
        if !pool.is_closed() && round % 3 == 0 {
            // A waiter for the whole pool is granted now.
            let mut ids = Vec::new();
            pool.alloc_blocking(cfg.n, &mut ids, Some(Duration::from_secs(10)))
                .expect("a waiter for the whole pool once everything went back");
            assert_eq!(ids.iter().collect::<HashSet<_>>().len(), cfg.n);
            pool.free(&ids).unwrap();
            if cfg.events {
                check_events(&pool, &mut view);
                assert!(view.is_empty());
            }
        }
        assert_whole(&pool);
        total_m += w.matches.load(SeqCst);
        total_k += w.matched_blocks.load(SeqCst);
        total_short += w.short.load(SeqCst);
    }
    eprintln!(
        "{cfg:?}: {total_m} matches into reservations, {total_k} blocks hit, {total_short} short of the reservation"
    );
}

const BASE: Config = Config {
    n: 24,
    bs: 2,
    shards: 1,
    events: false,
    matchers: 2,
    appenders: 2,
    waiters: 0,
    resets: false,
    close_at: None,
    rounds: 36,
    ops: 40,
    max_r: 5,
    max_tokens: 20,
    strict: false,
};

#[test]
fn stress_matchers_and_evicting_appenders() {
    for (n, bs, shards) in [(12usize, 1usize, 1usize), (24, 2, 2), (40, 4, 4)] {
        stress(
            Config {
                n,
                bs,
                shards,
                rounds: rounds(40),
                max_r: n / 6 + 1,
                max_tokens: n / 2 * bs,
                ..BASE
            },
            n as u64 * 31 + bs as u64,
        );
    }
}

#[test]
fn stress_with_waiters_resets_and_events() {
    for (n, bs, shards) in [(12usize, 1usize, 2usize), (30, 2, 4), (48, 4, 1)] {
        stress(
            Config {
                n,
                bs,
                shards,
                events: true,
                waiters: 1,
                resets: true,
                rounds: rounds(40),
                max_r: n / 5 + 1,
                max_tokens: n / 2 * bs,
                ..BASE
            },
            7 + n as u64,
        );
    }
}

/// One matcher and appenders that never match: no other thread can take
/// a block the match lets go of, so every group keeps every block it
/// reserved beyond the hit, also with waiters and resets.
#[test]
fn stress_one_matcher_keeps_every_reserved_block() {
    for (n, bs, shards) in [(10usize, 1usize, 1usize), (24, 2, 4), (36, 4, 2)] {
        stress(
            Config {
                n,
                bs,
                shards,
                events: shards > 1,
                matchers: 1,
                appenders: 2,
                waiters: 1,
                resets: true,
                strict: true,
                rounds: rounds(40),
                max_r: n / 4 + 1,
                max_tokens: n / 2 * bs,
                ..BASE
            },
            99 + n as u64,
        );
    }
}

#[test]
fn stress_close_concurrently() {
    for (n, bs) in [(16usize, 2usize), (24, 1)] {
        stress(
            Config {
                n,
                bs,
                matchers: 3,
                appenders: 1,
                waiters: 1,
                resets: true,
                close_at: Some(15),
                rounds: rounds(18),
                ops: 30,
                max_r: n / 6 + 1,
                max_tokens: n / 2 * bs,
                ..BASE
            },
            555 + n as u64,
        );
    }
}

// ---------------------------------------------------------------------
// Lockstep races
// ---------------------------------------------------------------------

/// Two threads that start each iteration together (spinning, no sleeps);
/// `between` runs alone after both finished. A panic on either side
/// stops both and comes out of the scope.
fn lockstep(
    iters: usize,
    a: impl Fn(usize) + Sync,
    b: impl Fn(usize) + Sync,
    mut between: impl FnMut(usize),
) {
    let go = AtomicUsize::new(0);
    let ready = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let poisoned = AtomicBool::new(false);
    /// Marks the run poisoned if dropped while panicking.
    struct Poison<'a>(&'a AtomicBool);
    impl Drop for Poison<'_> {
        fn drop(&mut self) {
            if thread::panicking() {
                self.0.store(true, SeqCst);
            }
        }
    }
    thread::scope(|sc| {
        let side = |f: &(dyn Fn(usize) + Sync)| {
            let _poison = Poison(&poisoned);
            for i in 0..iters {
                common::wait_until(|| go.load(SeqCst) == i + 1 || poisoned.load(SeqCst));
                ready.fetch_add(1, SeqCst);
                common::wait_until(|| ready.load(SeqCst) >= 2 * (i + 1) || poisoned.load(SeqCst));
                if poisoned.load(SeqCst) {
                    return;
                }
                f(i);
                finished.fetch_add(1, SeqCst);
            }
        };
        let (a, b) = (&a, &b);
        sc.spawn(move || side(a));
        sc.spawn(move || side(b));
        // A panic of `between` stops the sides too.
        let _poison = Poison(&poisoned);
        for i in 0..iters {
            go.store(i + 1, SeqCst);
            common::wait_until(|| finished.load(SeqCst) >= 2 * (i + 1) || poisoned.load(SeqCst));
            if poisoned.load(SeqCst) {
                break;
            }
            between(i);
        }
    });
}

/// A match of a cached prompt into a reservation (the full group's
/// revivals paid by lent reserved blocks, the sliding group's by an
/// admission) against an allocation that takes every other block and so
/// must evict the cached ones: every outcome keeps the layout and the
/// capacity (no other thread matches), and the books balance after each.
#[test]
fn race_a_match_into_a_reservation_against_an_evicting_allocation() {
    for (n, shards, events) in [
        (6usize, 1usize, false),
        (6, 1, true),
        (8, 4, true),
        (7, 2, false),
    ] {
        let pool = build(n, 1, shards, events);
        // Position 2 reads 1..=2: the sliding group needs block 1.
        let g = groups(&[KvGroup::Full, sliding(2)]);
        let tokens = [7u32, 8];
        let keys = group_keys(&g, &tokens, 1);
        let w = World {
            pool: Arc::clone(&pool),
            g: g.clone(),
            shadow: Shadow::new(n),
            strict: true,
            matches: AtomicUsize::new(0),
            matched_blocks: AtomicUsize::new(0),
            short: AtomicUsize::new(0),
            entries: AtomicUsize::new(0),
        };
        let outcomes: [AtomicUsize; 3] = Default::default();
        let mut view = HashMap::new();
        // The reservation is made before each race (1 block a group, the
        // stamp written), so that the race is the match's.
        let slot: std::sync::Mutex<Option<(HybridSequence, u64)>> = std::sync::Mutex::new(None);
        let setup = |w: &World| {
            if brute_hit(&pool, &g, &keys) != 2 {
                pool.reset_prefix_cache();
                let s = publisher(&pool, &g, &tokens);
                for gi in 0..2 {
                    let t = s.blocks(gi).unwrap();
                    w.write_tags(t, &tags(keys.group(gi).unwrap()));
                }
            }
            let mut s = HybridSequence::new(Arc::clone(&pool), g.clone());
            s.try_reserve(1, 0).unwrap();
            let stamp = w.take_fresh(&held(&s), "race: reserved");
            *slot.lock().unwrap() = Some((s, stamp));
        };
        setup(&w);
        lockstep(
            rounds(3000),
            |_| {
                let (mut s, stamp) = slot.lock().unwrap().take().unwrap();
                let reserved = held(&s);
                w.check_stamp(&reserved, stamp, "race: reserved");
                w.give(&reserved);
                let k = s.try_match_prefix(&keys).unwrap();
                check_layout(&pool, &s, &keys, 1, k, true, "race");
                take_matched(&w, &s, &keys, k, "race");
                let tails: Vec<BlockId> = (0..2)
                    .flat_map(|gi| s.blocks(gi).unwrap()[k..].to_vec())
                    .collect();
                let stamp = w.take_fresh(&tails, "race: kept");
                let before = tables(&s);
                s.try_append(s.capacity() - s.len()).unwrap();
                assert_eq!(tables(&s), before);
                w.check_stamp(&tails, stamp, "race: kept");
                outcomes[k].fetch_add(1, SeqCst);
                w.give(&held(&s));
                drop(s);
            },
            |_| {
                // Every block but the reservation's.
                let mut s = kvslots::Sequence::new(Arc::clone(&pool));
                if s.try_append(n - 2).is_ok() {
                    let ids = s.blocks().to_vec();
                    let stamp = w.take_fresh(&ids, "evictor");
                    w.check_stamp(&ids, stamp, "evictor");
                    w.give(&ids);
                }
                drop(s);
            },
            |_| {
                assert_eq!(pool.used_blocks(), 0);
                assert_eq!(pool.free_blocks(), n);
                assert_eq!(pool.evictable_blocks(), pool.cached_blocks());
                if events {
                    check_events(&pool, &mut view);
                }
                setup(&w);
            },
        );
        let (s, _) = slot.lock().unwrap().take().unwrap();
        w.give(&held(&s));
        drop(s);
        assert_whole(&pool);
        let o: Vec<usize> = outcomes.iter().map(|a| a.load(SeqCst)).collect();
        eprintln!("n {n} shards {shards} events {events}: hits of 0, 1, 2 blocks: {o:?}");
    }
}

/// Two matchers of one prompt into reservations, whose sliding group's
/// window is cached only early: each full group matches the whole prompt
/// and lets the end go again, which the other may hold meanwhile (the
/// documented race that can leave a group short when the pool has no
/// room). The layout, the shadow and the books hold whatever happens.
#[test]
fn race_two_matchers_cut_by_a_sliding_group() {
    for (n, shards, r) in [
        (18usize, 1usize, 3usize),
        (20, 2, 3),
        (14, 1, 2),
        (22, 4, 4),
    ] {
        let pool = build(n, 1, shards, true);
        // Position k reads k - 1..=k: the sliding group needs block k - 1.
        let g = groups(&[KvGroup::Full, sliding(2)]);
        let only_full = groups(&[KvGroup::Full]);
        let tokens = [3u32, 1, 4, 1];
        let keys = group_keys(&g, &tokens, 1);
        let w = World {
            pool: Arc::clone(&pool),
            g: g.clone(),
            shadow: Shadow::new(n),
            strict: false,
            matches: AtomicUsize::new(0),
            matched_blocks: AtomicUsize::new(0),
            short: AtomicUsize::new(0),
            entries: AtomicUsize::new(0),
        };
        let mut view = HashMap::new();
        // The full group's 4 blocks (published by a sequence of that group
        // alone: the same keys) and the sliding group's first 2.
        let setup = |w: &World| {
            if brute_hit(&pool, &g, &keys) == 2 && pool.peek_prefix(keys.group(0).unwrap()) == 4 {
                return;
            }
            pool.reset_prefix_cache();
            let full = publisher(&pool, &only_full, &tokens);
            let t = full.blocks(0).unwrap();
            w.write_tags(t, &tags(keys.group(0).unwrap()));
            drop(full);
            let s = publisher(&pool, &g, &tokens[..2]);
            let t = s.blocks(1).unwrap();
            w.write_tags(t, &tags(&keys.group(1).unwrap()[..2]));
            drop(s);
        };
        setup(&w);
        let side = |_| {
            let mut s = HybridSequence::new(Arc::clone(&pool), g.clone());
            if s.try_reserve(r, 0).is_err() {
                return;
            }
            let k = s.try_match_prefix(&keys).unwrap();
            assert!(k <= 2, "the sliding group serves 2 at most");
            if !check_layout(&pool, &s, &keys, r, k, false, "two matchers") {
                w.short.fetch_add(1, SeqCst);
            }
            take_matched(&w, &s, &keys, k, "two matchers");
            let tails: Vec<BlockId> = (0..2)
                .flat_map(|gi| s.blocks(gi).unwrap()[k..].to_vec())
                .collect();
            let stamp = w.take_fresh(&tails, "two matchers: kept");
            let before = tables(&s);
            s.try_append(s.capacity() - s.len()).unwrap();
            assert_eq!(tables(&s), before);
            w.check_stamp(&tails, stamp, "two matchers: kept");
            w.matched_blocks.fetch_add(k, SeqCst);
            w.give(&held(&s));
            drop(s);
        };
        lockstep(rounds(3000), side, side, |_| {
            assert_eq!(pool.used_blocks(), 0);
            assert_eq!(pool.free_blocks(), n);
            check_events(&pool, &mut view);
            setup(&w);
        });
        assert_whole(&pool);
        eprintln!(
            "n {n} shards {shards} r {r}: {} blocks hit, {} matches short of the reservation",
            w.matched_blocks.load(SeqCst),
            w.short.load(SeqCst)
        );
    }
}

// ---------------------------------------------------------------------
// The reservation shared between the groups
// ---------------------------------------------------------------------

/// Behind a waiter, the reservation pays for every group's share of the
/// hit. Two groups, 8 blocks cached a group (no holder), a reservation of
/// 4 blocks a group, and the rest of the pool owed to a queued waiter:
/// only the 8 reserved blocks can pay for revivals. A full group lends
/// what the revivals planned in the later groups leave, so the first
/// group cannot spend what the second needs: `[Full, Full]` hits 4
/// (4 revivals a group), `[Full, SlidingWindow]` with a window of 2 blocks
/// 6 (6 and 2). (Found by this attack: the first full group lent all 8,
/// the second could revive none, and the hit was 0.)
#[test]
fn behind_a_waiter_the_reservation_pays_for_every_groups_share_of_the_hit() {
    let bs = 4;
    for kinds in [
        &[KvGroup::Full, KvGroup::Full][..],
        &[KvGroup::Full, sliding(6)][..],
    ] {
        let pool = Arc::new(BlockPool::new(32, bs));
        let g = groups(kinds);
        let tokens: Vec<u32> = (0..32).collect(); // 8 blocks a group
        let keys = group_keys(&g, &tokens, bs);
        drop(publisher(&pool, &g, &tokens));
        let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
        seq.try_reserve(4 * bs, 0).unwrap(); // 8 blocks
        let mut hog = Vec::new();
        pool.try_alloc(pool.free_blocks() - pool.evictable_blocks(), &mut hog)
            .unwrap();
        // The 16 evictable blocks are owed to a waiter for 17.
        let mut ids = Vec::new();
        let mut fut = Box::pin(pool.alloc(pool.free_blocks() + 1, &mut ids));
        assert!(poll(fut.as_mut(), Waker::from(flag())).is_pending());
        let k = seq.try_match_prefix(&keys).unwrap();
        // [Full, Full]: 4 + 4 revivals; [Full, window of 2 blocks]: 6 + 2.
        let want = if kinds[1] == KvGroup::Full { 4 } else { 6 };
        assert_eq!(k, want, "{kinds:?}: what the 8 reserved blocks pay for");
        assert!(seq.capacity() >= 16);
        drop(fut);
        drop(seq);
        pool.free(&hog).unwrap();
        assert_whole(&pool);
    }
}

/// A plan whose full group's revivals alone cost more than can be paid
/// comes down to the longest match they can pay, no shorter: one group of
/// full attention, 6 cached blocks, 2 reserved, and a waiter queued for
/// more than the pool's other places, so that the pool's room is none.
/// The match pays 2 revivals with the reserved blocks it lends: it
/// matches 2 blocks (revivals exactly the payable).
#[test]
fn a_plan_comes_down_to_the_revivals_it_can_pay_exactly() {
    let pool = Arc::new(
        BlockPool::builder(16, 4)
            .shards(1)
            .prefix_cache(true)
            .build()
            .unwrap(),
    );
    let groups = KvGroups::new([KvGroup::Full]).unwrap();
    let tokens: Vec<u32> = (0..24).collect();
    let mut base = Vec::new();
    kvslots::hash_blocks(b"", &tokens, 4, &mut base);
    let keys = groups.keys(&base);
    let mut owner = HybridSequence::new(Arc::clone(&pool), groups.clone());
    owner.try_append(24).unwrap();
    assert_eq!(owner.publish(&keys).unwrap(), 6);
    drop(owner);
    let mut filler = Vec::new();
    pool.try_alloc(8, &mut filler).unwrap();
    let mut s = HybridSequence::new(Arc::clone(&pool), groups);
    s.try_reserve(8, 0).unwrap();
    // The 6 evictable blocks are the pool's places left; the waiter asks
    // for 7.
    let mut ids = Vec::new();
    let mut fut = Box::pin(pool.alloc(7, &mut ids));
    assert!(poll(fut.as_mut(), Waker::from(flag())).is_pending());
    assert_eq!(s.try_match_prefix(&keys).unwrap(), 2);
    assert_eq!(s.len(), 8);
    drop(s);
    drop(fut);
    pool.free(&filler).unwrap();
    assert_eq!(pool.used_blocks(), 0);
}

/// A plan counts a sliding group's revivals in its window at `k`, from
/// the first block that the next token reads, with blocks of one token
/// too: one group of full attention and a 3-token window, every block of
/// a 6-token prompt cached in both (prompts of 6, 5, 4, 3 and 2 tokens,
/// the longest released first), 3 tokens reserved (6 blocks, 3 a group)
/// and the pool's room none. A match of 6 would revive 8 blocks (6 and
/// 2 for the window), of 5 7: the plan comes down to 4 (4 and 2), whose
/// revivals the reservation pays exactly, and the match revives nothing
/// it then lets go of: the longest prompt's blocks beyond the match stay
/// the least recently used of the cache, the full group's first.
#[test]
fn a_plan_counts_a_windows_revivals_with_one_token_blocks() {
    let bs = 1;
    let pool = Arc::new(
        BlockPool::builder(32, bs)
            .shards(1)
            .prefix_cache(true)
            .build()
            .unwrap(),
    );
    let g = groups(&[KvGroup::Full, sliding(3)]);
    let tokens: Vec<u32> = (0..6).collect();
    let keys = group_keys(&g, &tokens, bs);
    for len in (2..=6).rev() {
        drop(publisher(&pool, &g, &tokens[..len]));
    }
    let (full, window) = (keys.group(0).unwrap(), keys.group(1).unwrap());
    let cached = |keys: &[BlockHash]| -> Vec<bool> {
        keys.iter()
            .map(|k| pool.peek_prefix(std::slice::from_ref(k)) == 1)
            .collect()
    };
    assert_eq!(cached(full), [true; 6]);
    assert_eq!(cached(window), [true; 6]);
    let mut s = HybridSequence::new(Arc::clone(&pool), g.clone());
    s.try_reserve(3, 0).unwrap();
    let mut hog = Vec::new();
    pool.try_alloc(pool.free_blocks() - pool.evictable_blocks(), &mut hog)
        .unwrap();
    // The 12 evictable blocks are owed to a waiter for 13.
    let mut ids = Vec::new();
    let mut fut = Box::pin(pool.alloc(pool.free_blocks() + 1, &mut ids));
    assert!(poll(fut.as_mut(), Waker::from(flag())).is_pending());
    assert_eq!(s.try_match_prefix(&keys).unwrap(), 4);
    let t = tables(&s);
    assert_eq!(t[0].len(), 4);
    assert_eq!(t[1][2..].len(), 2, "the window's 2 blocks at 4 tokens");
    assert!(s.capacity() >= 4);
    drop(fut);
    // The lent blocks went back to the pool: take them, then evict the 4
    // least recently used blocks.
    pool.try_alloc(pool.free_blocks() - pool.evictable_blocks(), &mut hog)
        .unwrap();
    pool.try_alloc(2, &mut hog).unwrap();
    assert_eq!(cached(full), [true, true, true, true, false, false]);
    assert_eq!(cached(window), [true; 6]);
    pool.try_alloc(2, &mut hog).unwrap();
    assert_eq!(cached(window), [true, true, true, true, false, false]);
    drop(s);
    pool.free(&hog).unwrap();
    assert_whole(&pool);
}
