//! Attacks on the one shortfall that `HybridSequence::try_match_prefix`
//! documents for a match into a reservation over a `BlockPool` (it comes
//! up short only in a race: a block it revived and then let go of, shared
//! meanwhile by another match, with the pool full), and on the plan that
//! makes the match revive only what it keeps (the longest prefix every
//! group serves whose revivals the reservation and the pool's room pay
//! for).
//!
//! * One thread cannot produce the shortfall. The only caller code that
//!   can run inside a match over a `BlockPool` is a waker, and a waker
//!   runs only when a give-back grants a waiter. Before the tables are
//!   whole nothing in the match gives back: a lent reserved block and a
//!   matched block let go of keep their admission, and the only other
//!   give-back, of revivals admitted ahead and not used, needs an
//!   admission ahead, which a pending waiter always refuses. The first
//!   waker runs in the give-back of what is left over, once every table
//!   holds its `k` entries and the blocks beyond them
//!   (`a_waker_granted_by_the_match_runs_only_once_the_tables_are_whole`,
//!   a waker that matches the same prompt into another sequence and
//!   evicts all it can). Over another allocator the caller's code does run
//!   inside the match (its hooks), but nothing is lent there
//!   (`over_another_allocator_reentrant_calls_inside_the_match_never_shorten_it`).
//! * Behind a waiter, a reservation that cannot pay for the whole cached
//!   prefix plans the hit it pays for, and revives nothing it lets go of
//!   (`behind_a_waiter_the_plan_revives_only_what_the_reservation_pays_for`);
//!   the sliding groups' windows are set aside for the revivals they
//!   need, not their size, so they do not starve the full group
//!   (`behind_a_waiter_the_window_set_aside_does_not_starve_the_full_group`).
//!   Where the reservation pays for the whole prefix, the match takes
//!   exactly the blocks it keeps
//!   (`the_plan_revives_only_what_the_match_keeps`).
//! * Two matchers of one prompt, in lockstep: a matcher is short only when
//!   the two overlapped and the pool had no room, by no more than the
//!   blocks it let go of that the other holds, and the books are whole
//!   in every round (`race_two_matchers_of_one_prompt`).
//! * Real threads: matchers of overlapping prompts into reservations
//!   against evicting appenders, publishers and resets, in roomy pools
//!   (never short) and small ones (short only beside another match), the
//!   pool whole after every round.
//! * Misuse: other groups' keys, an empty prompt, a second match, a miss
//!   then a hit, a match after a truncate, a match while the prompt's
//!   blocks wait for a fence.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;

mod common;

use common::hybrid::{assert_whole, flag, group_keys, groups, held, publisher, sliding, tables};
use common::XorShift;
use kvslots::{
    BlockAllocator, BlockHash, BlockId, BlockPool, GroupKeys, HybridError, HybridSequence, KvGroup,
    KvGroups, ReserveError, Sequence, SequenceCall,
};

// ---------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------

fn build(n: usize, bs: usize, shards: usize) -> Arc<BlockPool> {
    Arc::new(
        BlockPool::builder(n, bs)
            .prefix_cache(true)
            .shards(shards)
            .build()
            .unwrap(),
    )
}

fn distinct<'a>(lists: impl IntoIterator<Item = &'a [BlockId]>) -> usize {
    lists
        .into_iter()
        .flatten()
        .filter(|id| !id.is_null())
        .collect::<HashSet<_>>()
        .len()
}

/// Checks the layout promised after a match of `k` into a reservation of
/// `r` blocks a group: each group's `k` entries (null before the window
/// of position `k * bs`, cached blocks of its keys after), then at most
/// `max(r, k) - k` blocks, each held alone and distinct. Returns how many
/// blocks beyond the match the groups miss in all (0: whole).
fn check_layout(
    pool: &BlockPool,
    seq: &HybridSequence,
    keys: &GroupKeys,
    r: usize,
    k: usize,
    what: &str,
) -> usize {
    let bs = pool.block_size();
    assert_eq!(seq.len(), k * bs, "{what}: len");
    let mut all = HashSet::new();
    let mut missing = 0;
    for (gi, kind) in seq.groups().as_slice().iter().enumerate() {
        let t = seq.blocks(gi).unwrap();
        let null = seq.null_blocks(gi).unwrap();
        let need = kind.first_needed_block(k * bs, bs).min(k);
        assert_eq!(null, need, "{what}: group {gi} null entries");
        assert!(t.len() >= k, "{what}: group {gi} has fewer than k entries");
        let beyond = t.len() - k;
        assert!(
            beyond <= r.saturating_sub(k),
            "{what}: group {gi} holds {beyond} blocks beyond k {k}, reserved {r}"
        );
        missing += r.saturating_sub(k) - beyond;
        assert!(t[..null].iter().all(|id| id.is_null()), "{what}: {gi}");
        let gk = keys.group(gi).unwrap();
        for (i, id) in t.iter().enumerate().take(k).skip(null) {
            assert!(!id.is_null(), "{what}: group {gi} entry {i} null");
            assert!(pool.ref_count(*id).unwrap() >= 1, "{what}: {id} not held");
            assert_eq!(
                pool.peek_prefix(std::slice::from_ref(&gk[i])),
                1,
                "{what}: group {gi} entry {i} not cached"
            );
        }
        for id in &t[k..] {
            assert!(!id.is_null(), "{what}: group {gi}: a null block beyond k");
        }
        for id in &t[null..] {
            assert!(all.insert(*id), "{what}: {id} twice in the tables");
        }
    }
    assert_eq!(all.len(), seq.held_blocks(), "{what}: held_blocks");
    assert!(seq.capacity() >= k * bs, "{what}: capacity below the hit");
    if missing == 0 {
        assert!(seq.capacity() >= r * bs, "{what}: capacity below r");
    }
    missing
}

/// Blocks beyond the match, held alone by the sequence (checked when no
/// other thread can touch them).
fn check_beyond_alone(pool: &BlockPool, seq: &HybridSequence, k: usize, what: &str) {
    for gi in 0..seq.groups().len() {
        for id in &seq.blocks(gi).unwrap()[k..] {
            assert_eq!(pool.ref_count(*id), Some(1), "{what}: {id} not held alone");
        }
    }
}

fn poll<F: Future + ?Sized>(fut: Pin<&mut F>, waker: Waker) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(&waker))
}

// ---------------------------------------------------------------------
// The scene: a prompt whose sliding window is cached only early and at
// the end
// ---------------------------------------------------------------------

/// `[Full, SlidingWindow of 2 tokens]`, block size 1: position `k` reads
/// `k - 1..=k`, so a window of `k` blocks needs block `k - 1` alone.
fn scene_tokens(len: usize) -> Vec<u32> {
    (11..11 + len as u32).collect()
}

struct Scene {
    pool: Arc<BlockPool>,
    g: KvGroups,
    keys: GroupKeys,
    /// The full group's cached blocks, in order.
    full: Vec<BlockId>,
}

/// A prompt of `len` tokens (8 unless said otherwise): the full group's
/// `len` blocks cached (published by a sequence of that group alone: the
/// same keys), the sliding group's blocks 0, 1 (a request of 2 tokens)
/// and `len - 2`, `len - 1` (one of all `len`, its window moved on before
/// the publish): the plan is `len`, and a full group that stops at 3 to
/// `len - 2` leaves a window only at 2. Nothing held.
fn scene(n: usize, shards: usize) -> Scene {
    scene_of(n, shards, 8)
}

fn scene_of(n: usize, shards: usize, len: usize) -> Scene {
    let pool = build(n, 1, shards);
    let g = groups(&[KvGroup::Full, sliding(2)]);
    let tokens = scene_tokens(len);
    let keys = group_keys(&g, &tokens, 1);
    let only_full = publisher(&pool, &groups(&[KvGroup::Full]), &tokens);
    let full = only_full.blocks(0).unwrap().to_vec();
    drop(only_full);
    drop(publisher(&pool, &g, &tokens[..2]));
    // Appended a token at a time at the end, so that the window gives
    // blocks 0..len - 2 back before the publish.
    let mut late = HybridSequence::new(Arc::clone(&pool), g.clone());
    late.try_append(len - 2).unwrap();
    late.try_append(1).unwrap();
    late.try_append(1).unwrap();
    assert_eq!(late.null_blocks(1), Some(len - 2));
    late.publish(&keys).unwrap();
    drop(late);
    assert_eq!(pool.cached_blocks(), len + 4);
    assert_eq!(pool.peek_hybrid_prefix(&keys), len);
    Scene {
        pool,
        g,
        keys,
        full,
    }
}

// ---------------------------------------------------------------------
// One thread
// ---------------------------------------------------------------------

/// The cached prefix (8) is more than the reservation pays for while the
/// rest of the pool is owed to a waiter: 6 reserved blocks pay for 6
/// revivals, so the plan comes down to 6, where the sliding group finds
/// no window (its blocks 2..6 are not cached), then to 2 (full blocks 0
/// and 1, the window at 2: sliding block 1). The match takes exactly
/// those 3 blocks, none of which it lets go of, and nothing is evicted.
/// The capacity is whole, and the place left over (6 reserved, 5 held)
/// grants the waiter, on this thread, inside the match.
#[test]
fn behind_a_waiter_the_plan_revives_only_what_the_reservation_pays_for() {
    for shards in [1, 2, 4] {
        let Scene {
            pool,
            g,
            keys,
            full,
            ..
        } = scene(40, shards);
        let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
        seq.try_reserve(3, 0).unwrap(); // 3 blocks a group
        let mut hog = Vec::new();
        pool.try_alloc(pool.free_blocks() - pool.evictable_blocks(), &mut hog)
            .unwrap();
        // The 12 evictable blocks are owed to a waiter for 13.
        let owed = pool.free_blocks() + 1;
        let mut ids = Vec::new();
        let woken = flag();
        let mut fut = Box::pin(pool.alloc(owed, &mut ids));
        assert!(poll(fut.as_mut(), Waker::from(Arc::clone(&woken))).is_pending());
        let before = pool.prefix_stats();
        let cached = pool.cached_blocks();
        let k = seq.try_match_prefix(&keys).unwrap();
        let after = pool.prefix_stats();
        assert_eq!(k, 2, "shards {shards}");
        assert_eq!(after.evictions, before.evictions, "nothing evicted");
        assert_eq!(pool.cached_blocks(), cached, "no key dropped");
        // Blocks 0 and 1 of the full group, block 1 of the sliding group:
        // 3 taken, 3 kept.
        assert_eq!(after.hit_blocks - before.hit_blocks, 2 + 1);
        assert_eq!(seq.blocks(0).unwrap()[..2], full[..2]);
        for id in &full[2..] {
            assert_eq!(pool.ref_count(*id), Some(0), "{id} not taken");
        }
        // Whole all the same: 1 block a group beyond the match.
        assert_eq!(check_layout(&pool, &seq, &keys, 3, k, "scene"), 0);
        check_beyond_alone(&pool, &seq, k, "scene");
        assert_eq!(seq.capacity(), 3);
        // One place left over (6 reserved, 5 held): the waiter is granted
        // by the match's give-back.
        assert!(woken.0.load(SeqCst), "the waiter was not granted");
        assert_eq!(pool.used_blocks(), hog.len() + seq.held_blocks() + owed);
        assert!(matches!(
            poll(fut.as_mut(), Waker::from(flag())),
            Poll::Ready(Ok(()))
        ));
        drop(fut);
        pool.free(&ids).unwrap();
        pool.free(&hog).unwrap();
        drop(seq);
        assert_whole(&pool);
    }
}

/// Where the reservation pays for the whole plan and nothing evicts, the
/// match takes exactly the blocks it keeps: the full group stops at the
/// plan, 2, instead of reviving 4 blocks and letting 2 go.
#[test]
fn the_plan_revives_only_what_the_match_keeps() {
    for (r, shards) in [(3usize, 1usize), (6, 2), (1, 4), (0, 1)] {
        let pool = build(40, 1, shards);
        let g = groups(&[KvGroup::Full, sliding(2)]);
        let tokens = [3u32, 1, 4, 1];
        let keys = group_keys(&g, &tokens, 1);
        drop(publisher(&pool, &groups(&[KvGroup::Full]), &tokens));
        drop(publisher(&pool, &g, &tokens[..2]));
        assert_eq!(pool.peek_hybrid_prefix(&keys), 2);
        let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
        if r > 0 {
            seq.try_reserve(r, 0).unwrap();
        }
        let before = pool.prefix_stats();
        let k = seq.try_match_prefix(&keys).unwrap();
        let hits = pool.prefix_stats().hit_blocks - before.hit_blocks;
        assert_eq!(k, 2, "r {r}");
        let kept = distinct(tables(&seq).iter().map(|t| &t[..k]));
        if r > 0 {
            assert_eq!(hits, kept as u64, "r {r}: took {hits}, kept {kept}");
        }
        assert_eq!(check_layout(&pool, &seq, &keys, r, k, "plan"), 0);
        check_beyond_alone(&pool, &seq, k, "plan");
        assert_eq!(pool.used_blocks(), seq.held_blocks());
        drop(seq);
        assert_whole(&pool);
    }
}

/// What a waker granted by the match does to the pool.
struct Attack {
    pool: Arc<BlockPool>,
    g: KvGroups,
    keys: GroupKeys,
    /// The full group's blocks the match lets go of (2, 3, 4).
    let_go: Vec<BlockId>,
    /// Their reference counts when the waker ran.
    seen: Mutex<Vec<Option<usize>>>,
    /// The sequence the waker matched the prompt into, and its hit.
    other: Mutex<Option<(HybridSequence, usize)>>,
    /// Blocks it took from the pool (evicting what it could).
    taken: Mutex<Vec<BlockId>>,
    runs: AtomicUsize,
}

impl Wake for Attack {
    fn wake(self: Arc<Self>) {
        self.runs.fetch_add(1, SeqCst);
        *self.seen.lock().unwrap() = self
            .let_go
            .iter()
            .map(|id| self.pool.ref_count(*id))
            .collect();
        let mut other = HybridSequence::new(Arc::clone(&self.pool), self.g.clone());
        let k = other.try_match_prefix(&self.keys).unwrap();
        *self.other.lock().unwrap() = Some((other, k));
        // Everything free, evicting every cached block no one holds.
        let mut taken = self.taken.lock().unwrap();
        while self.pool.try_alloc(1, &mut taken).is_ok() {}
    }
}

/// The deterministic attempt at the documented shortfall. The waiter is
/// a `Sequence` reserving 1 block with 12 free besides, so that once it
/// is granted there is room for the attack: its waker (run on this
/// thread, by the give-back that grants it) matches the same prompt into
/// another sequence (sharing or reviving the blocks the match let go of)
/// and then takes every block it can, evicting. It runs inside
/// `try_match_prefix`, but only after the match's tables are whole: the
/// blocks let go of have no holder when it runs, and the match keeps its
/// whole capacity. (No give-back with a grant runs earlier: see the
/// module's doc.)
#[test]
fn a_waker_granted_by_the_match_runs_only_once_the_tables_are_whole() {
    for shards in [1, 2, 4] {
        let Scene {
            pool,
            g,
            keys,
            full,
            ..
        } = scene(40, shards);
        let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
        seq.try_reserve(3, 0).unwrap();
        let mut hog = Vec::new();
        pool.try_alloc(pool.free_blocks() - pool.evictable_blocks(), &mut hog)
            .unwrap();
        let headroom = pool.free_blocks(); // 12: pending until 13 are free
        let attack = Arc::new(Attack {
            pool: Arc::clone(&pool),
            g: g.clone(),
            keys: keys.clone(),
            let_go: full[2..5].to_vec(),
            seen: Mutex::new(Vec::new()),
            other: Mutex::new(None),
            taken: Mutex::new(Vec::new()),
            runs: AtomicUsize::new(0),
        });
        let mut waiter = Sequence::new(Arc::clone(&pool));
        {
            let mut fut = Box::pin(waiter.reserve(1, headroom));
            assert!(poll(fut.as_mut(), Waker::from(Arc::clone(&attack))).is_pending());
            let k = seq.try_match_prefix(&keys).unwrap();
            assert_eq!(
                attack.runs.load(SeqCst),
                1,
                "shards {shards}: the waker ran"
            );
            assert_eq!(k, 2);
            // The waker found the blocks let go of already let go of.
            assert_eq!(*attack.seen.lock().unwrap(), vec![Some(0); 3]);
            let what = format!("shards {shards}");
            assert_eq!(check_layout(&pool, &seq, &keys, 3, k, &what), 0);
            check_beyond_alone(&pool, &seq, k, &what);
            assert!(matches!(
                poll(fut.as_mut(), Waker::from(flag())),
                Poll::Ready(Ok(()))
            ));
        }
        let (other, ok) = attack.other.lock().unwrap().take().unwrap();
        let taken = std::mem::take(&mut *attack.taken.lock().unwrap());
        // The waker's match shared the 2 matched blocks of each group and
        // revived the rest of the full group's 8 and the window at 8.
        assert_eq!(ok, 8, "shards {shards}");
        // The books: every holder counted once.
        let lists = [
            hog.as_slice(),
            &held(&seq),
            &held(&other),
            &taken,
            waiter.blocks(),
        ];
        assert_eq!(pool.used_blocks(), distinct(lists), "shards {shards}");
        assert_eq!(pool.used_blocks(), pool.num_blocks(), "the attack took all");
        // The match's blocks beyond the hit are its own still.
        check_beyond_alone(&pool, &seq, 2, "after the attack");
        let room = seq.capacity() - seq.len();
        let before = tables(&seq);
        seq.try_append(room).expect("appends up to the capacity");
        assert_eq!(tables(&seq), before);
        drop((seq, other, waiter));
        pool.free(&taken).unwrap();
        pool.free(&hog).unwrap();
        assert_whole(&pool);
    }
}

// ---------------------------------------------------------------------
// Another allocator: the caller's code runs inside the match
// ---------------------------------------------------------------------

/// Forwards to a shared `BlockPool`; its first hook call inside a match
/// (`match_prefix` or `release`) attacks: matches the prompt into a
/// sequence over the pool itself (sharing what the outer match took) and
/// takes every block it can.
struct Hooked {
    inner: Arc<BlockPool>,
    armed: AtomicBool,
    g: KvGroups,
    keys: GroupKeys,
    other: Mutex<Vec<HybridSequence>>,
    taken: Mutex<Vec<BlockId>>,
    attacks: AtomicUsize,
}

impl Hooked {
    fn attack(&self) {
        if !self.armed.load(SeqCst) {
            return;
        }
        self.attacks.fetch_add(1, SeqCst);
        let mut other = HybridSequence::new(Arc::clone(&self.inner), self.g.clone());
        other.try_match_prefix(&self.keys).unwrap();
        self.other.lock().unwrap().push(other);
        let mut taken = self.taken.lock().unwrap();
        while self.inner.try_alloc(1, &mut taken).is_ok() {}
    }
}

impl BlockAllocator for Hooked {
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
    fn try_alloc_growth(
        &self,
        by: &SequenceCall<'_>,
        n: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        BlockAllocator::try_alloc_growth(&*self.inner, by, n, out)
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
        self.attack();
    }
    fn needs_copy(&self, id: BlockId) -> bool {
        BlockAllocator::needs_copy(&*self.inner, id)
    }
    fn match_prefix(
        &self,
        by: &SequenceCall<'_>,
        keys: &[BlockHash],
        out: &mut Vec<BlockId>,
    ) -> usize {
        let k = BlockAllocator::match_prefix(&*self.inner, by, keys, out);
        self.attack();
        k
    }
    fn publish(&self, by: &SequenceCall<'_>, blocks: &[BlockId], keys: &[BlockHash]) -> usize {
        BlockAllocator::publish(&*self.inner, by, blocks, keys)
    }
    fn publish_after(
        &self,
        by: &SequenceCall<'_>,
        parent: Option<&BlockHash>,
        blocks: &[BlockId],
        keys: &[BlockHash],
    ) -> usize {
        BlockAllocator::publish_after(&*self.inner, by, parent, blocks, keys)
    }
    fn uncache_if_sole(&self, by: &SequenceCall<'_>, id: BlockId) {
        BlockAllocator::uncache_if_sole(&*self.inner, by, id);
    }
    fn retire(&self, by: &SequenceCall<'_>, fence: u64, ids: &[BlockId]) -> usize {
        BlockAllocator::retire(&*self.inner, by, fence, ids)
    }
    fn retire_owned(&self, by: &SequenceCall<'_>, fence: u64, ids: Vec<BlockId>) -> usize {
        BlockAllocator::retire_owned(&*self.inner, by, fence, ids)
    }
}

/// Over another allocator the reserved blocks are not lent, so code that
/// runs inside the match (the allocator's own hooks, between the groups'
/// lookups and at every give-back) and shares or evicts the blocks the
/// match takes and lets go of cannot shorten it: every group keeps the
/// blocks it reserved beyond the hit.
#[test]
fn over_another_allocator_reentrant_calls_inside_the_match_never_shorten_it() {
    for (r, extra) in [(3usize, 0usize), (5, 4), (1, 2)] {
        let Scene { pool, g, keys, .. } = scene(40, 1);
        let hooked = Arc::new(Hooked {
            inner: Arc::clone(&pool),
            armed: AtomicBool::new(false),
            g: g.clone(),
            keys: keys.clone(),
            other: Mutex::new(Vec::new()),
            taken: Mutex::new(Vec::new()),
            attacks: AtomicUsize::new(0),
        });
        let mut seq = HybridSequence::new(Arc::clone(&hooked), g.clone());
        seq.try_reserve(r, 0).unwrap();
        let mut hog = Vec::new();
        let uncached = pool.free_blocks() - pool.evictable_blocks();
        pool.try_alloc(uncached - extra, &mut hog).unwrap();
        let reserved: HashSet<BlockId> = held(&seq).into_iter().collect();
        hooked.armed.store(true, SeqCst);
        let k = seq.try_match_prefix(&keys).unwrap();
        hooked.armed.store(false, SeqCst);
        assert!(hooked.attacks.load(SeqCst) >= 1, "r {r}: no hook ran");
        assert_eq!(seq.len(), k);
        for (gi, t) in tables(&seq).iter().enumerate() {
            assert_eq!(t.len(), k.max(r), "r {r} k {k}: group {gi}");
            // The blocks beyond the hit are reserved ones, never lent.
            for id in &t[k..] {
                assert!(
                    reserved.contains(id),
                    "r {r}: group {gi}: {id} not reserved"
                );
                assert_eq!(pool.ref_count(*id), Some(1));
            }
        }
        assert!(seq.capacity() >= r);
        let taken = std::mem::take(&mut *hooked.taken.lock().unwrap());
        let others = std::mem::take(&mut *hooked.other.lock().unwrap());
        let mut lists: Vec<Vec<BlockId>> = vec![hog.clone(), held(&seq), taken.clone()];
        lists.extend(others.iter().map(held));
        assert_eq!(
            pool.used_blocks(),
            distinct(lists.iter().map(Vec::as_slice)),
            "r {r}"
        );
        drop(others);
        drop(seq);
        pool.free(&taken).unwrap();
        pool.free(&hog).unwrap();
        assert_whole(&pool);
    }
}

// ---------------------------------------------------------------------
// Real threads: the documented race
// ---------------------------------------------------------------------

/// Marks the run poisoned if dropped while panicking, so that the other
/// threads stop waiting.
struct Poison<'a>(&'a AtomicBool);
impl Drop for Poison<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.store(true, SeqCst);
        }
    }
}

/// Runs `iters` rounds of `body(i, race)` on this thread, where `race()`
/// runs `side(0, i)` and `side(1, i)` together on two threads (they start
/// within a few spin hints of each other) and returns once both are
/// done. No sleeps.
fn two_sided(
    iters: usize,
    side: impl Fn(usize, usize) + Sync,
    mut body: impl FnMut(usize, &mut dyn FnMut()),
) {
    let go = AtomicUsize::new(0);
    let ready = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let poisoned = AtomicBool::new(false);
    thread::scope(|sc| {
        for who in 0..2 {
            let (go, ready, finished, poisoned, side) = (&go, &ready, &finished, &poisoned, &side);
            sc.spawn(move || {
                let _poison = Poison(poisoned);
                for i in 0..iters {
                    common::wait_until(|| go.load(SeqCst) > i || poisoned.load(SeqCst));
                    ready.fetch_add(1, SeqCst);
                    common::wait_until(|| {
                        ready.load(SeqCst) >= 2 * (i + 1) || poisoned.load(SeqCst)
                    });
                    if poisoned.load(SeqCst) {
                        return;
                    }
                    side(who, i);
                    finished.fetch_add(1, SeqCst);
                }
            });
        }
        let _poison = Poison(&poisoned);
        for i in 0..iters {
            let mut race = || {
                go.store(i + 1, SeqCst);
                common::wait_until(|| {
                    finished.load(SeqCst) >= 2 * (i + 1) || poisoned.load(SeqCst)
                });
                assert!(!poisoned.load(SeqCst), "a side panicked");
            };
            body(i, &mut race);
        }
    });
}

/// A matcher's sequence, and its hit once it matched.
type Slot = Mutex<Option<(HybridSequence, Option<usize>)>>;

/// Two matchers of the scene's prompt of `len` tokens into reservations
/// of `r` blocks a group, racing. Every uncached free block but `room`
/// is taken, and a raw waiter is owed `owed_extra` more than what is
/// free: each matcher can revive only what its reservation pays for
/// (`reach = 2 * r - 1` full blocks, one being set aside for the window),
/// so a matcher alone revives blocks `0..reach` of the full group and
/// lets go of `2..reach` (see
/// `without_any_eviction_the_match_revives_blocks_it_lets_go_of`), which
/// the other may share meanwhile. No block is evicted while they race.
///
/// Checked after every round: a matcher short of its reservation ran
/// while the other did (one clock orders their begins and ends); each
/// layout (`k` entries, then at most
/// `r - k` blocks a group beyond them; the blocks beyond held alone);
/// the books (`used_blocks` is the blocks the two matchers and the hog
/// hold, each once, plus the waiter's grant); a matcher short of its
/// reservation is short by no more than the blocks it revived and let go
/// of (the full group's `k..reach`) that the other still holds; with `room`
/// (uncached free blocks that nothing but the matchers' growth can take,
/// at least all they can need, the waiter being owed every block the hog
/// does not hold) no matcher is ever
/// short; and everything goes back. Returns the rounds with a matcher
/// short, and those in which the matches overlapped.
fn race_two_matchers(
    len: usize,
    r: usize,
    room: usize,
    owed_extra: usize,
    shards: usize,
    iters: usize,
) -> (usize, usize) {
    let reach = 2 * r - 1;
    assert!(2 < reach && reach < len - 2);
    let slots: [Slot; 2] = Default::default();
    let jitter: [AtomicUsize; 2] = Default::default();
    // When each match began and ended, on one clock.
    let clock = AtomicUsize::new(0);
    let spans: [Mutex<(usize, usize)>; 2] = Default::default();
    let g = groups(&[KvGroup::Full, sliding(2)]);
    let keys = group_keys(&g, &scene_tokens(len), 1);
    let mut rng = XorShift::new((room * 131 + owed_extra * 7 + shards) as u64);
    let (mut short_rounds, mut granted_rounds, mut overlapped_rounds) = (0, 0, 0);
    let mut outcomes = std::collections::BTreeMap::new();
    two_sided(
        iters,
        |who, _| {
            let mut slot = slots[who].lock().unwrap();
            let (s, k) = slot.as_mut().unwrap();
            for _ in 0..jitter[who].load(SeqCst) {
                std::hint::spin_loop();
            }
            let begun = clock.fetch_add(1, SeqCst);
            *k = Some(s.try_match_prefix(&keys).unwrap());
            let ended = clock.fetch_add(1, SeqCst);
            spans[who].lock().unwrap().clone_from(&(begun, ended));
        },
        |i, race| {
            let sc = scene_of(len + 8 * r + 32, shards, len);
            let pool = &sc.pool;
            for slot in &slots {
                let mut s = HybridSequence::new(Arc::clone(pool), g.clone());
                s.try_reserve(r, 0).unwrap();
                *slot.lock().unwrap() = Some((s, None));
            }
            for j in &jitter {
                j.store(rng.below(32), SeqCst);
            }
            let mut hog = Vec::new();
            let uncached = pool.free_blocks() - pool.evictable_blocks();
            pool.try_alloc(uncached - room, &mut hog).unwrap();
            // With room, every block the hog does not hold: more than can
            // ever be free while the matchers hold their hits.
            let owed = if room > 0 {
                pool.num_blocks() - hog.len()
            } else {
                pool.free_blocks() + owed_extra
            };
            let mut ids = Vec::new();
            let woken = flag();
            let mut fut = Box::pin(pool.alloc(owed, &mut ids));
            assert!(poll(fut.as_mut(), Waker::from(Arc::clone(&woken))).is_pending());

            race();

            let what =
                format!("len {len} r {r} room {room} owed +{owed_extra} shards {shards} round {i}");
            let (a, ka) = slots[0].lock().unwrap().take().unwrap();
            let (b, kb) = slots[1].lock().unwrap().take().unwrap();
            let (ka, kb) = (ka.unwrap(), kb.unwrap());
            let granted = woken.0.load(SeqCst);
            granted_rounds += usize::from(granted);
            let ma = check_layout(pool, &a, &keys, r, ka, &what);
            let mb = check_layout(pool, &b, &keys, r, kb, &what);
            check_beyond_alone(pool, &a, ka, &what);
            check_beyond_alone(pool, &b, kb, &what);
            *outcomes.entry((ka, kb, ma, mb)).or_insert(0usize) += 1;
            let mine = distinct([hog.as_slice(), &held(&a), &held(&b)]);
            assert_eq!(
                pool.used_blocks(),
                mine + if granted { owed } else { 0 },
                "{what}: used"
            );
            let (sa, sb) = (*spans[0].lock().unwrap(), *spans[1].lock().unwrap());
            let overlapped = sa.0 < sb.1 && sb.0 < sa.1;
            overlapped_rounds += usize::from(overlapped);
            for (m, k, other, ko, name) in [(ma, ka, &b, kb, "a"), (mb, kb, &a, ka, "b")] {
                if m == 0 {
                    continue;
                }
                // Only another match can take a block this one let go of
                // while it runs.
                assert!(
                    overlapped,
                    "{what}: {name} short by {m}, the matches ran apart"
                );
                assert!(
                    room == 0,
                    "{what}: {name} short by {m} with {room} free blocks to grow into"
                );
                assert!(k < reach, "{what}: {name} short by {m} at k {k}");
                // An other that serves past 2 never cut (its windows are
                // at 2 and past `len - 2` only), so it still holds every
                // block it shared.
                if ko > k {
                    let t = other.blocks(0).unwrap();
                    let shared = sc.full[k..reach].iter().filter(|id| t.contains(id)).count();
                    assert!(
                        m <= shared,
                        "{what}: {name} short by {m}, the other holds {shared}"
                    );
                }
            }
            short_rounds += usize::from(ma + mb > 0);
            // Appends up to the capacity take nothing.
            for mut s in [a, b] {
                let before = tables(&s);
                let room = s.capacity() - s.len();
                s.try_append(room).unwrap();
                assert_eq!(tables(&s), before, "{what}");
            }
            if granted {
                let got = poll(fut.as_mut(), Waker::from(flag()));
                assert!(matches!(got, Poll::Ready(Ok(()))), "{what}");
            }
            drop(fut);
            pool.free(&ids).unwrap();
            pool.free(&hog).unwrap();
            assert_whole(pool);
        },
    );
    if short_rounds > 0 {
        eprintln!(
            "len {len} r {r} room {room} owed +{owed_extra} shards {shards}: {short_rounds} of \
             {iters} rounds short, {granted_rounds} granted, {overlapped_rounds} overlapped; \
             (ka, kb, short a, short b): {outcomes:?}"
        );
    }
    (short_rounds, overlapped_rounds)
}

/// The threaded tests of this file run one at a time, so that their
/// threads race each other rather than the other tests' for the cores.
static THREADED: Mutex<()> = Mutex::new(());

fn threaded() -> std::sync::MutexGuard<'static, ()> {
    THREADED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Two matchers of one prompt into reservations, in lockstep: with no
/// room in the pool (the waiter's grant takes the last free blocks) a
/// matcher may end short only when the two overlapped, by no more than
/// the blocks it let go of that the other holds, and the books stay
/// whole; with room for growth (`4 * r` uncached free blocks, enough for
/// both matchers to grow every block they reserved; the waiter owed more
/// than can ever be free, so it never takes them) no matcher is ever
/// short. Each configuration runs rounds of 200 until 60 of them
/// overlapped, or 1200 rounds; how many overlapped and how many came up
/// short is only reported (the plan leaves the race rare).
#[test]
fn race_two_matchers_of_one_prompt() {
    let _one = threaded();
    let (mut short, mut rounds, mut overlapped) = (0, 0, 0);
    for (len, r, room, extra, shards) in [
        (8usize, 3usize, 12usize, 0usize, 1usize),
        (8, 3, 0, 1, 1),
        (24, 8, 32, 0, 2),
        (24, 8, 0, 2, 1),
        (16, 5, 20, 0, 4),
        (16, 5, 0, 1, 2),
        (16, 5, 20, 0, 1),
        (24, 8, 0, 3, 4),
    ] {
        let mut seen = 0;
        for _ in 0..6 {
            let (s, o) = race_two_matchers(len, r, room, extra, shards, 200);
            if room > 0 {
                assert_eq!(s, 0, "short with room");
            }
            short += s;
            seen += o;
            rounds += 200;
            if seen >= 60 {
                break;
            }
        }
        overlapped += seen;
    }
    eprintln!("{short} rounds short, {overlapped} overlapped, of {rounds}");
}

// ---------------------------------------------------------------------
// Real threads: matchers of overlapping prompts against evicting
// appenders, publishers and resets
// ---------------------------------------------------------------------

/// The tag a block holding `key` contains once written for publishing.
fn tag_of(key: &BlockHash) -> u64 {
    u64::from_le_bytes(key.0[..8].try_into().unwrap())
}

/// Prompt `p` of `len` tokens: prompts of one family (`p % 3`) share
/// their first `(p % 3 + 1) * 2 * bs` tokens, the rest is `p`'s own.
fn prompt(p: usize, len: usize, bs: usize) -> Vec<u32> {
    let shared = (p % 3 + 1) * 2 * bs;
    (0..len)
        .map(|i| {
            if i < shared {
                i as u32 + 1_000 * (p % 3) as u32
            } else {
                1_000_000 * (p as u32 + 1) + i as u32
            }
        })
        .collect()
}

struct Stress {
    pool: Arc<BlockPool>,
    g: KvGroups,
    /// What each block contains: a key's tag once written for publishing.
    content: Vec<AtomicUsize>,
    /// Matches begun and ended (every thread's that matches), to tell
    /// whether a short match ran beside another.
    started: AtomicUsize,
    ended: AtomicUsize,
    /// Whether the pool can never be full (see `stress`).
    roomy: bool,
    matches: AtomicUsize,
    short: AtomicUsize,
    hit: AtomicUsize,
}

impl Stress {
    /// Writes the tags of every group's full blocks `from..` before a
    /// publish (blocks this sequence holds alone).
    fn write_full(&self, s: &HybridSequence, keys: &GroupKeys, from: usize) {
        let bs = self.pool.block_size();
        let full = (s.len() / bs).min(keys.blocks());
        for gi in 0..s.groups().len() {
            let t = s.blocks(gi).unwrap();
            let gk = keys.group(gi).unwrap();
            for i in s.null_blocks(gi).unwrap().max(from)..full {
                self.content[t[i].index()].store(tag_of(&gk[i]) as usize, SeqCst);
            }
        }
    }

    /// Checks that the matched entries hold their keys' tags.
    fn check_matched(&self, s: &HybridSequence, keys: &GroupKeys, k: usize, what: &str) {
        for gi in 0..s.groups().len() {
            let t = s.blocks(gi).unwrap();
            let gk = keys.group(gi).unwrap();
            for i in s.null_blocks(gi).unwrap()..k {
                let c = self.content[t[i].index()].load(SeqCst);
                assert_eq!(c, tag_of(&gk[i]) as usize, "{what}: group {gi} entry {i}");
            }
        }
    }

    /// A match, counted in `started` / `ended`; returns the hit and
    /// whether another match may have run beside it.
    fn tracked_match(&self, s: &mut HybridSequence, keys: &GroupKeys) -> (usize, bool) {
        let e0 = self.ended.load(SeqCst);
        let s0 = self.started.fetch_add(1, SeqCst);
        let k = s.try_match_prefix(keys).unwrap();
        let s1 = self.started.load(SeqCst);
        self.ended.fetch_add(1, SeqCst);
        // Another match began before this one and had not ended when
        // this one began (`s0 > e0`), or began while it ran.
        (k, s0 > e0 || s1 > s0 + 1)
    }
}

#[derive(Clone, Copy, Debug)]
struct Cfg {
    n: usize,
    bs: usize,
    shards: usize,
    kinds: &'static [KvGroup],
    matchers: usize,
    resets: bool,
    ops: usize,
    max_r: usize,
    max_blocks: usize,
}

/// A matcher: reserves `r` blocks a group, matches a prompt of a family,
/// checks every promise, appends up to the capacity, maybe publishes.
fn stress_matcher(w: &Stress, rng: &mut XorShift, cfg: &Cfg) {
    let bs = cfg.bs;
    let r = 1 + rng.below(cfg.max_r);
    let mut s = HybridSequence::new(Arc::clone(&w.pool), w.g.clone());
    if s.try_reserve(r * bs, 0).is_err() {
        assert_eq!(s.held_blocks(), 0);
        return;
    }
    let tokens = prompt(rng.below(6), 1 + rng.below(cfg.max_blocks * bs), bs);
    let keys = group_keys(&w.g, &tokens, bs);
    let what = format!("{cfg:?} r {r} tokens {}", tokens.len());
    let (k, overlapped) = w.tracked_match(&mut s, &keys);
    assert!(k <= keys.blocks(), "{what}");
    let missing = check_layout(&w.pool, &s, &keys, r, k, &what);
    check_beyond_alone(&w.pool, &s, k, &what);
    w.check_matched(&s, &keys, k, &what);
    w.matches.fetch_add(1, SeqCst);
    w.hit.fetch_add(k, SeqCst);
    if missing > 0 {
        w.short.fetch_add(1, SeqCst);
        assert!(
            !w.roomy,
            "{what}: short by {missing} in a pool that cannot fill"
        );
        assert!(overlapped, "{what}: short by {missing} with no other match");
    }
    // A second match changes nothing.
    if k > 0 {
        let before = tables(&s);
        assert_eq!(s.try_match_prefix(&keys), Ok(0));
        assert_eq!(tables(&s), before, "{what}: a second match");
    }
    // Appends up to the capacity take no block.
    let before = tables(&s);
    s.try_append(s.capacity() - s.len()).unwrap();
    assert_eq!(tables(&s), before, "{what}: the append changed the tables");
    if rng.chance(60) {
        w.write_full(&s, &keys, k);
        s.publish(&keys).unwrap();
    }
    drop(s);
}

/// An evicting appender and publisher: prefills a prompt (matching it
/// first, as an empty sequence, half the time), writes and publishes it,
/// and keeps up to two such requests.
fn stress_appender(w: &Stress, rng: &mut XorShift, cfg: &Cfg, kept: &mut Vec<HybridSequence>) {
    let bs = cfg.bs;
    let tokens = prompt(rng.below(6), 1 + rng.below(cfg.max_blocks * bs), bs);
    let keys = group_keys(&w.g, &tokens, bs);
    let mut s = HybridSequence::new(Arc::clone(&w.pool), w.g.clone());
    let k = if rng.chance(50) {
        w.tracked_match(&mut s, &keys).0
    } else {
        0
    };
    w.check_matched(&s, &keys, k, "appender's match");
    if s.try_append(tokens.len() - k * bs).is_ok() {
        w.write_full(&s, &keys, k);
        s.publish(&keys).unwrap();
        kept.push(s);
    }
    if kept.len() > 2 || (!kept.is_empty() && rng.chance(30)) {
        kept.remove(0);
    }
}

/// `cfg.matchers` matchers, an appender and maybe a thread that drops
/// the cache's keys, over rounds of one pool each; the pool is whole
/// after every round. A roomy pool (`n` past what every thread can hold
/// at once, admissions ahead included) can never be full, so no match
/// may come up short there; in a small one a match may come up short
/// only beside another match.
fn stress(cfg: Cfg, rounds: usize, seed: u64) -> (usize, usize) {
    let groups_n = cfg.kinds.len();
    let most = cfg.matchers * (groups_n * (cfg.max_blocks + cfg.max_r) + cfg.max_blocks)
        + 3 * groups_n * cfg.max_blocks
        + cfg.max_blocks;
    let roomy = cfg.n > most;
    let (mut matches, mut short) = (0, 0);
    for round in 0..rounds {
        let pool = build(cfg.n, cfg.bs, cfg.shards);
        let w = Stress {
            pool: Arc::clone(&pool),
            g: groups(cfg.kinds),
            content: (0..cfg.n).map(|_| AtomicUsize::new(0)).collect(),
            started: AtomicUsize::new(0),
            ended: AtomicUsize::new(0),
            roomy,
            matches: AtomicUsize::new(0),
            short: AtomicUsize::new(0),
            hit: AtomicUsize::new(0),
        };
        let threads = cfg.matchers + 1 + usize::from(cfg.resets);
        let barrier = Barrier::new(threads);
        let done = AtomicUsize::new(0);
        let stats0 = pool.prefix_stats();
        thread::scope(|sc| {
            for t in 0..threads {
                let (w, barrier, done, cfg) = (&w, &barrier, &done, &cfg);
                sc.spawn(move || {
                    let mut rng = XorShift::new(seed ^ ((round as u64) << 16) ^ t as u64);
                    barrier.wait();
                    if t < cfg.matchers + 1 {
                        let _done = common::shadow::Done(done);
                        let mut kept = Vec::new();
                        for _ in 0..cfg.ops {
                            if t < cfg.matchers {
                                stress_matcher(w, &mut rng, cfg);
                            } else {
                                stress_appender(w, &mut rng, cfg, &mut kept);
                            }
                        }
                    } else {
                        while done.load(SeqCst) < cfg.matchers + 1 {
                            w.pool.reset_prefix_cache();
                            thread::yield_now();
                        }
                    }
                });
            }
        });
        let stats = pool.prefix_stats();
        assert!(
            stats.queried_blocks - stats0.queried_blocks >= stats.hit_blocks - stats0.hit_blocks
        );
        assert_whole(&pool);
        matches += w.matches.load(SeqCst);
        short += w.short.load(SeqCst);
    }
    eprintln!("{cfg:?} roomy {roomy}: {matches} matches into reservations, {short} short");
    (matches, short)
}

const ONE_SLIDING: &[KvGroup] = &[KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 3 }];
const TWO_SLIDING: &[KvGroup] = &[
    KvGroup::SlidingWindow { window_tokens: 2 },
    KvGroup::Full,
    KvGroup::SlidingWindow { window_tokens: 5 },
];

/// Small pools: every promise but the whole capacity holds after every
/// match, and a match short of its reservation ran beside another.
#[test]
fn stress_small_pools_short_only_beside_another_match() {
    let _one = threaded();
    for (i, (n, bs, shards, kinds, matchers, resets)) in [
        (16usize, 1usize, 1usize, ONE_SLIDING, 2usize, false),
        (24, 2, 2, TWO_SLIDING, 2, true),
        (32, 4, 1, ONE_SLIDING, 3, true),
        (48, 1, 4, TWO_SLIDING, 3, false),
        (64, 2, 1, TWO_SLIDING, 2, true),
    ]
    .into_iter()
    .enumerate()
    {
        let cfg = Cfg {
            n,
            bs,
            shards,
            kinds,
            matchers,
            resets,
            ops: 60,
            max_r: n / 8 + 1,
            max_blocks: n / 4,
        };
        stress(cfg, 12, 0xABC0 + i as u64);
    }
}

/// Roomy pools (growth can always replace a block let go of) with the
/// cache's keys dropped under the matches (so that planned blocks go
/// missing and matches cut what they revived): no match is ever short.
/// (A share between a revival and its cut is rare here: the lockstep
/// race above is what catches a match that does not grow.)
#[test]
fn stress_roomy_pools_never_short() {
    let _one = threaded();
    for (i, (bs, shards, kinds, matchers)) in [
        (1usize, 1usize, ONE_SLIDING, 3usize),
        (2, 2, TWO_SLIDING, 3),
        (4, 1, TWO_SLIDING, 2),
    ]
    .into_iter()
    .enumerate()
    {
        let max_blocks = 10;
        let max_r = 6;
        let g = kinds.len();
        let n = matchers * (g * (max_blocks + max_r) + max_blocks)
            + 3 * g * max_blocks
            + max_blocks
            + 1;
        let cfg = Cfg {
            n,
            bs,
            shards,
            kinds,
            matchers,
            resets: true,
            ops: 80,
            max_r,
            max_blocks,
        };
        let (_, short) = stress(cfg, 10, 0xF00 + i as u64);
        assert_eq!(short, 0);
    }
}

// ---------------------------------------------------------------------
// Misuse
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
}

fn books(pool: &BlockPool, seq: &HybridSequence) -> Books {
    Books {
        tables: tables(seq),
        len: seq.len(),
        capacity: seq.capacity(),
        used: pool.used_blocks(),
        free: pool.free_blocks(),
        cached: pool.cached_blocks(),
        evictable: pool.evictable_blocks(),
        hits: pool.prefix_stats().hit_blocks,
    }
}

/// Keys made for other groups (the same kinds in another order, another
/// window, one group fewer) are refused and change nothing, also behind
/// a waiter; an empty prompt matches nothing and keeps the reservation;
/// a second match after a hit changes nothing; a miss keeps the
/// reservation as it was, and a match after the prompt is published hits
/// it with the capacity whole.
#[test]
fn misuse_other_groups_empty_prompt_and_matching_twice() {
    let Scene { pool, g, keys, .. } = scene(40, 1);
    let tokens = scene_tokens(8);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    seq.try_reserve(10, 0).unwrap();
    let mut ids = Vec::new();
    let woken = flag();
    let mut fut = Box::pin(pool.alloc(pool.free_blocks() + 1, &mut ids));
    assert!(poll(fut.as_mut(), Waker::from(Arc::clone(&woken))).is_pending());
    let before = books(&pool, &seq);
    for other in [
        groups(&[sliding(2), KvGroup::Full]),
        groups(&[KvGroup::Full, sliding(3)]),
        groups(&[KvGroup::Full]),
        groups(&[KvGroup::Full, sliding(2), sliding(2)]),
    ] {
        let wrong = group_keys(&other, &tokens, 1);
        assert_eq!(seq.try_match_prefix(&wrong), Err(HybridError::OtherGroups));
        assert_eq!(books(&pool, &seq), before, "{other:?}");
    }
    assert_eq!(seq.try_match_prefix(&group_keys(&g, &[], 1)), Ok(0));
    assert_eq!(
        seq.try_match_prefix(&group_keys(&g, &tokens[..0], 1)),
        Ok(0)
    );
    assert_eq!(books(&pool, &seq), before, "an empty prompt");
    assert!(!woken.0.load(SeqCst));
    // The hit, then a second match: nothing changes.
    let k = seq.try_match_prefix(&keys).unwrap();
    assert_eq!(k, 8);
    assert_eq!(check_layout(&pool, &seq, &keys, 10, k, "first"), 0);
    let after = books(&pool, &seq);
    assert_eq!(seq.try_match_prefix(&keys), Ok(0));
    assert_eq!(books(&pool, &seq), after, "a second match");
    drop(fut);
    drop(seq);
    // A miss keeps the reservation block for block; the prompt published
    // by another request, the same sequence then hits it.
    let fresh = scene_tokens(30)[20..].to_vec();
    let fresh_keys = group_keys(&g, &fresh, 1);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    seq.try_reserve(6, 0).unwrap();
    let before = books(&pool, &seq);
    assert_eq!(seq.try_match_prefix(&fresh_keys), Ok(0));
    assert_eq!(books(&pool, &seq), before, "a miss");
    drop(publisher(&pool, &g, &fresh));
    let k = seq.try_match_prefix(&fresh_keys).unwrap();
    assert_eq!(k, 10);
    assert_eq!(
        check_layout(&pool, &seq, &fresh_keys, 6, k, "after the miss"),
        0
    );
    assert_eq!(pool.used_blocks(), seq.held_blocks());
    drop(seq);
    assert_whole(&pool);
}

/// After a truncate: a sequence that still holds tokens matches nothing
/// and changes nothing; one truncated to 0 is new work again (an empty
/// table, or a reservation made after it) and matches with its capacity
/// whole.
#[test]
fn misuse_matching_after_a_truncate() {
    let pool = build(96, 2, 1);
    let g = groups(&[KvGroup::Full, sliding(3), KvGroup::Full]);
    let tokens: Vec<u32> = (100..120).collect(); // 10 blocks
    let keys = group_keys(&g, &tokens, 2);
    drop(publisher(&pool, &g, &tokens));
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    seq.try_reserve(12 * 2, 0).unwrap();
    assert_eq!(pool.peek_hybrid_prefix(&keys), 10, "nothing evicted");
    let k = seq.try_match_prefix(&keys).unwrap();
    assert_eq!(k, 10);
    assert_eq!(check_layout(&pool, &seq, &keys, 12, k, "first"), 0);
    // The window at 19 reaches into a block given back.
    assert!(seq.truncate(19).is_err());
    // Drafts appended and rolled back: still holds tokens.
    seq.try_append(3).unwrap();
    seq.truncate(21).unwrap();
    let before = books(&pool, &seq);
    assert_eq!(seq.try_match_prefix(&keys), Ok(0));
    assert_eq!(books(&pool, &seq), before, "after a truncate to 21");
    // To 0: every block back; a match into the empty sequence.
    seq.truncate(0).unwrap();
    assert_eq!(seq.held_blocks(), 0);
    assert_eq!(seq.try_match_prefix(&keys), Ok(10));
    assert_eq!(check_layout(&pool, &seq, &keys, 0, 10, "empty"), 0);
    // To 0 again, reserved again, matched again.
    seq.truncate(0).unwrap();
    seq.try_reserve(4 * 2, 0).unwrap();
    let k = seq.try_match_prefix(&keys).unwrap();
    assert_eq!(k, 10);
    assert_eq!(check_layout(&pool, &seq, &keys, 4, k, "reserved again"), 0);
    assert_eq!(pool.used_blocks(), seq.held_blocks());
    drop(seq);
    assert_whole(&pool);
}

/// A match into a reservation while the prompt's blocks wait for a fence
/// (retired by a `truncate_fenced(0, ..)` of the request that matched
/// them) shares them: nothing is revived, the fenced blocks are not
/// taken for the reservation, and the capacity is whole; the fence's
/// completion leaves the blocks to the new holder. The retired request,
/// empty again, reserves and matches too.
#[test]
fn misuse_matching_while_the_prompt_waits_for_a_fence() {
    let Scene { pool, g, keys, .. } = scene(48, 2);
    let mut first = HybridSequence::new(Arc::clone(&pool), g.clone());
    first.try_reserve(10, 0).unwrap();
    assert_eq!(first.try_match_prefix(&keys), Ok(8));
    let fenced: HashSet<BlockId> = held(&first).into_iter().collect();
    first.truncate_fenced(0, 7).unwrap();
    assert_eq!(first.held_blocks(), 0);
    assert_eq!(pool.used_blocks(), fenced.len());
    let mut second = HybridSequence::new(Arc::clone(&pool), g.clone());
    second.try_reserve(10, 0).unwrap();
    let hits = pool.prefix_stats().hit_blocks;
    let k = second.try_match_prefix(&keys).unwrap();
    assert_eq!(k, 8);
    assert_eq!(check_layout(&pool, &second, &keys, 10, k, "second"), 0);
    check_beyond_alone(&pool, &second, k, "second");
    assert_eq!(pool.prefix_stats().hit_blocks - hits, 8 + 1);
    for gi in 0..2 {
        for id in &second.blocks(gi).unwrap()[k..] {
            assert!(!fenced.contains(id), "a fenced block reserved");
        }
    }
    // The retired request, empty, reserves and matches too.
    first.try_reserve(9, 0).unwrap();
    assert_eq!(first.try_match_prefix(&keys), Ok(8));
    assert_eq!(check_layout(&pool, &first, &keys, 9, 8, "first again"), 0);
    assert!(pool.complete(7) > 0);
    assert_eq!(
        pool.used_blocks(),
        distinct([held(&first).as_slice(), &held(&second)])
    );
    drop((first, second));
    assert_whole(&pool);
}

/// Behind a waiter, with a reservation (4 blocks) smaller than the
/// sliding window at the whole cached prefix (8), the match still gets
/// the hit the reservation pays for: 2 (full blocks 0 and 1, the window
/// at 2: sliding blocks 0 and 1), the windows' set-aside being the
/// revivals planned at that hit, not a window's size at the whole prefix.
#[test]
fn behind_a_waiter_the_window_set_aside_does_not_starve_the_full_group() {
    let pool = build(64, 1, 1);
    let g = groups(&[KvGroup::Full, sliding(8)]);
    let tokens: Vec<u32> = (500..508).collect();
    let keys = group_keys(&g, &tokens, 1);
    drop(publisher(&pool, &g, &tokens));
    assert_eq!(pool.peek_hybrid_prefix(&keys), 8);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    seq.try_reserve(2, 0).unwrap();
    let mut hog = Vec::new();
    pool.try_alloc(pool.free_blocks() - pool.evictable_blocks(), &mut hog)
        .unwrap();
    let mut ids = Vec::new();
    let mut fut = Box::pin(pool.alloc(pool.free_blocks() + 1, &mut ids));
    assert!(poll(fut.as_mut(), Waker::from(flag())).is_pending());
    let k = seq.try_match_prefix(&keys).unwrap();
    assert_eq!(check_layout(&pool, &seq, &keys, 2, k, "starved"), 0);
    drop(fut);
    drop(seq);
    pool.free(&hog).unwrap();
    assert_whole(&pool);
    assert_eq!(k, 2, "the 4 reserved blocks pay for a hit of 2");
}

/// Behind a waiter, a full group lends what the full groups after it do
/// not need: `[Full, Full]`, the first group's 8 blocks evictable and the
/// second's held by another sequence, 3 blocks reserved a group (6 in
/// all). The 6 reserved blocks pay for 6 revivals, all the first group's,
/// so the plan is 6, and the match gets it (an even share, 3 a group,
/// would stop the first group at 3).
#[test]
fn behind_a_waiter_a_full_group_lends_what_the_later_ones_do_not_need() {
    let pool = build(64, 1, 1);
    let g = groups(&[KvGroup::Full, KvGroup::Full]);
    let tokens: Vec<u32> = (700..708).collect();
    let keys = group_keys(&g, &tokens, 1);
    drop(publisher(&pool, &g, &tokens));
    let mut holder = Sequence::new(Arc::clone(&pool));
    assert_eq!(holder.try_match_prefix(keys.group(1).unwrap()), 8);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    seq.try_reserve(3, 0).unwrap();
    let mut hog = Vec::new();
    pool.try_alloc(pool.free_blocks() - pool.evictable_blocks(), &mut hog)
        .unwrap();
    let mut ids = Vec::new();
    let mut fut = Box::pin(pool.alloc(pool.free_blocks() + 1, &mut ids));
    assert!(poll(fut.as_mut(), Waker::from(flag())).is_pending());
    let before = pool.prefix_stats();
    let k = seq.try_match_prefix(&keys).unwrap();
    assert_eq!(k, 6, "the hit the reservation pays for");
    assert_eq!(pool.prefix_stats().hit_blocks - before.hit_blocks, 6 + 6);
    assert_eq!(check_layout(&pool, &seq, &keys, 3, k, "later"), 0);
    assert_eq!(pool.used_blocks(), hog.len() + 8 + 6);
    drop(fut);
    drop((seq, holder));
    pool.free(&hog).unwrap();
    assert_whole(&pool);
}
