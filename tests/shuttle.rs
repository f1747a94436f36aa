//! shuttle: randomised (`check_random`) and PCT (`check_pct`, depth 3)
//! schedules of 8 threads. loom cannot reach this many threads.
//!
//! ```text
//! RUSTFLAGS="--cfg kvslots_shuttle" CARGO_TARGET_DIR=target/shuttle \
//!     cargo test -p kvslots --test shuttle --release
//! ```
//!
//! Under `--cfg kvslots_shuttle` the crate's private atomics facade is
//! shuttle's, so every atomic access of the real [`SlotCounter`],
//! [`BlockPool`] and [`Sequence`] is a scheduling point.
//! The models below mix, on 8 threads and small capacities:
//!
//! * admits and releases, and reservations that are split, merged, shrunk,
//!   grown, forgotten and dropped (borrowed and owned guards);
//! * raw pool allocations and frees, including refused frees (over-free,
//!   out of range) of blocks the thread holds;
//! * sequence appends (with copy-on-write), truncates, forks and drops,
//!   with parent and child owned by different threads, over a one-shard
//!   pool and over a pool whose free list is 3 shards (threads starting
//!   their pops at different shards, stealing, freeing to several);
//! * closing while all of that runs.
//!
//! They check the invariants of the loom models:
//!
//! * no partial admission: a guard, an admission, an allocation or an
//!   append is whole or has taken nothing;
//! * `used <= capacity` at every step, through a [`Shadow`] count. Each
//!   thread adds its slots after the admission returns and subtracts them
//!   before it gives them back, so the shadow never counts more than is
//!   really held;
//! * no block held by two owners, through an ownership array ([`Owners`]).
//!   It counts, per block, the holders the threads account for. A block
//!   handed out fresh must have none. A block written into (the tail of a
//!   sequence) must have exactly one;
//! * refusals report a state the allocator could have been in: `Full {
//!   available }` is below what was needed and leaves room for what the
//!   refused thread itself holds;
//! * conservation: once every thread has joined, `used() == 0`, every
//!   reference count is 0, and the free list gives back every block exactly
//!   once.
//!
//! Shuttle's atomics are sequentially consistent, so these models do not
//! check memory orderings (loom does). They check the logic of the CAS
//! loops, the free list and the reference counts under many more threads
//! and much longer schedules than loom can explore.
//!
//! Negative controls: a check-then-add counter and a check-then-set block
//! allocator, both written here against shuttle's atomics (the ones the facade
//! gives the crate under this cfg), run the same model shapes. shuttle must
//! catch both (`#[should_panic]`).
//!
//! Schedules: the defaults below, about 110,000 in all, which take well under
//! a minute in release. Set `KVSLOTS_SHUTTLE_ITERATIONS` to run that many of
//! each kind per test instead (the negative controls keep their own bound).
//! A failure prints the schedule to give to `shuttle::replay`.
#![cfg(kvslots_shuttle)]

use std::collections::HashSet;
use std::ops::Range;

use kvslots::{BlockId, BlockPool, FreeError, ReserveError, Sequence, SlotCounter};
use shuttle::rand::{thread_rng, Rng};
use shuttle::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use shuttle::sync::Arc;
use shuttle::thread;

mod shuttle_runner;
use shuttle_runner::{check_pct, check_random, iterations};

/// The fixed assertion messages, so that the negative controls can pin them.
mod msg {
    pub const PARTIAL: &str = "partial admission";
    pub const OVERCOMMIT: &str = "overcommit";
    pub const LEAK: &str = "leaked";
    pub const DOUBLE_OWNER: &str = "block handed to a second owner";
    pub const SHARED_WRITE: &str = "write into a shared block";
    pub const LOST_UPDATE: &str = "lost update";
    pub const IMPOSSIBLE: &str = "impossible refusal";
    pub const AFTER_CLOSE: &str = "admission after close";
}

/// The most schedules a negative control may take to fail (it stops at the
/// first failure; not changed by `KVSLOTS_SHUTTLE_ITERATIONS`).
const CONTROL_SCHEDULES: usize = 1000;

/// A random index below `n` (shuttle's generator, so schedules replay).
fn below(n: usize) -> usize {
    thread_rng().gen_range(0..n)
}

// ---------------------------------------------------------------------------
// Shadow count and ownership array
// ---------------------------------------------------------------------------

/// What the threads hold at once, as they account for it themselves.
struct Shadow {
    held: AtomicUsize,
    capacity: usize,
}

impl Shadow {
    fn new(capacity: usize) -> Self {
        Shadow {
            held: AtomicUsize::new(0),
            capacity,
        }
    }

    /// Accounts for `n` slots just admitted, and checks the sum.
    fn enter(&self, n: usize) {
        // SeqCst: one total order of the shadow's updates.
        let now = self.held.fetch_add(n, Ordering::SeqCst) + n;
        assert!(
            now <= self.capacity,
            "{}: {now} held at once, capacity {}",
            msg::OVERCOMMIT,
            self.capacity
        );
    }

    /// Accounts for `n` slots about to be given back.
    fn exit(&self, n: usize) {
        // SeqCst: as in `enter`.
        let before = self.held.fetch_sub(n, Ordering::SeqCst);
        assert!(before >= n, "shadow count went negative (test bug)");
    }

    fn held(&self) -> usize {
        // SeqCst: read after every thread joined.
        self.held.load(Ordering::SeqCst)
    }
}

/// Per block, the holders the threads account for, and a tag written by
/// whoever writes into the block.
struct Owners {
    holders: Vec<AtomicUsize>,
    data: Vec<AtomicUsize>,
}

impl Owners {
    fn new(num_blocks: usize) -> Self {
        Owners {
            holders: (0..num_blocks).map(|_| AtomicUsize::new(0)).collect(),
            data: (0..num_blocks).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    /// A block just handed out fresh: nobody may hold it.
    fn fresh(&self, id: BlockId, tag: usize) {
        // SeqCst (all accesses here): one total order of the accounting.
        let before = self.holders[id.index()].fetch_add(1, Ordering::SeqCst);
        assert!(
            before == 0,
            "{}: {id} handed out while {before} holder(s) hold it",
            msg::DOUBLE_OWNER
        );
        self.data[id.index()].store(tag, Ordering::SeqCst);
    }

    /// One more holder of a block the caller already holds (a fork).
    fn share(&self, id: BlockId) {
        let before = self.holders[id.index()].fetch_add(1, Ordering::SeqCst);
        assert!(before >= 1, "{id} shared by a thread that did not hold it");
    }

    /// Takes back a reference given up for a call that then failed.
    fn retake(&self, id: BlockId) {
        self.holders[id.index()].fetch_add(1, Ordering::SeqCst);
    }

    /// One holder about to let go.
    fn put(&self, id: BlockId) {
        let before = self.holders[id.index()].fetch_sub(1, Ordering::SeqCst);
        assert!(before >= 1, "{id} let go more often than held (test bug)");
    }

    /// Writes into a block: only its one holder may.
    fn write(&self, id: BlockId, tag: usize) {
        let holders = self.holders[id.index()].load(Ordering::SeqCst);
        assert!(
            holders == 1,
            "{}: {id} has {holders} holders",
            msg::SHARED_WRITE
        );
        self.data[id.index()].store(tag, Ordering::SeqCst);
    }

    /// Reads back what the caller wrote into its own block.
    fn check(&self, id: BlockId, tag: usize) {
        let seen = self.data[id.index()].load(Ordering::SeqCst);
        assert!(
            seen == tag,
            "{}: {id} holds {seen}, its owner wrote {tag}",
            msg::LOST_UPDATE
        );
    }

    fn assert_none_held(&self) {
        for (b, h) in self.holders.iter().enumerate() {
            let h = h.load(Ordering::SeqCst);
            assert_eq!(h, 0, "block {b} still has {h} holders (test bug)");
        }
    }
}

/// Checks a refusal against what the refused thread itself holds: it must
/// report fewer free than were needed, and at most what the others leave.
fn assert_refusal(err: ReserveError, needed: usize, capacity: usize, mine: usize) {
    match err {
        ReserveError::Full { available, .. } => assert!(
            available < needed && available <= capacity - mine,
            "{}: Full {{ available: {available} }} for {needed}, capacity {capacity}, \
             {mine} held by the refused thread",
            msg::IMPOSSIBLE
        ),
        // The capacity a `NeverFits` reports is the pool less the blocks
        // the asking sequence holds (held by the refused thread).
        ReserveError::NeverFits { capacity: c, .. } => assert!(
            needed > c && c <= capacity && capacity - c <= mine,
            "{}: {err:?} for {needed}, capacity {capacity}, {mine} held by the refused thread",
            msg::IMPOSSIBLE
        ),
        ReserveError::BehindWaiters { .. } => {
            panic!("{}: {err:?}, but nobody waits", msg::IMPOSSIBLE)
        }
        ReserveError::Closed => panic!("{}: Closed, but nobody closed", msg::IMPOSSIBLE),
        other => panic!("{}: unexpected {other:?}", msg::IMPOSSIBLE),
    }
}

// ---------------------------------------------------------------------------
// SlotCounter, and a check-then-add counter for the negative control
// ---------------------------------------------------------------------------

/// What the admit/release shape needs from a counter.
trait Admit: Send + Sync + 'static {
    fn capacity(&self) -> usize;
    fn admit(&self, requested: isize) -> usize;
    fn release(&self, n: usize);
    fn used(&self) -> usize;
}

impl Admit for SlotCounter {
    fn capacity(&self) -> usize {
        SlotCounter::capacity(self)
    }
    fn admit(&self, requested: isize) -> usize {
        SlotCounter::admit(self, requested)
    }
    fn release(&self, n: usize) {
        SlotCounter::release(self, n).expect("releasing slots the thread holds");
    }
    fn used(&self) -> usize {
        SlotCounter::used(self)
    }
}

/// The third wrong way of the admission contract (`CONTRACT.md`): check `capacity - used`, then
/// add in a separate atomic step.
struct CheckThenAdd {
    used: AtomicUsize,
    capacity: usize,
}

impl Admit for CheckThenAdd {
    fn capacity(&self) -> usize {
        self.capacity
    }
    fn admit(&self, requested: isize) -> usize {
        // SeqCst (all accesses): the bug is the gap between the two steps,
        // not an ordering.
        let used = self.used.load(Ordering::SeqCst);
        if requested > 0 && requested as usize <= self.capacity - used.min(self.capacity) {
            self.used.fetch_add(requested as usize, Ordering::SeqCst);
            requested as usize
        } else {
            0
        }
    }
    fn release(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::SeqCst);
    }
    fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }
}

/// Requests drawn to hit the edges around a capacity of `cap`.
fn request(cap: usize) -> isize {
    let c = cap as isize;
    [1, 1, 2, 2, 3, c, c + 1, 0, -1, isize::MIN, isize::MAX][below(11)]
}

/// Admits and releases, checking whole-or-nothing and the shadow.
fn admit_rounds<C: Admit>(counter: &C, shadow: &Shadow, rounds: usize) {
    let cap = counter.capacity();
    for _ in 0..rounds {
        let req = request(cap);
        let got = counter.admit(req);
        let whole = got == 0 || (req > 0 && got == req as usize);
        assert!(whole, "{}: requested {req}, admitted {got}", msg::PARTIAL);
        if got > 0 {
            shadow.enter(got);
            assert!(
                counter.used() <= cap,
                "{}: used() above capacity",
                msg::OVERCOMMIT
            );
            shadow.exit(got);
            counter.release(got);
        }
    }
}

/// Reservations: split, grow, shrink, merge, forget, drop, on borrowed and
/// owned guards, accounting every slot in the shadow. An owned guard or a
/// watermarked one may be held across the life cycle of a borrowed one.
fn guard_rounds(counter: &Arc<SlotCounter>, shadow: &Shadow, rounds: usize) {
    let cap = counter.capacity();
    for _ in 0..rounds {
        let n = [0, 1, 2, 3, cap, cap + 1][below(6)];
        let (mut owned, mut watermarked) = (None, None);
        match below(3) {
            0 => match counter.try_reserve_owned(n) {
                Ok(r) => {
                    assert_eq!(r.len(), n, "{}", msg::PARTIAL);
                    shadow.enter(n);
                    owned = Some(r);
                }
                Err(e) => assert_refusal(e, n, cap, 0),
            },
            // The watermark for new sequences.
            1 => {
                let headroom = below(3);
                match counter.try_reserve_with_headroom(n, headroom) {
                    Ok(r) => {
                        assert_eq!(r.len(), n, "{}", msg::PARTIAL);
                        shadow.enter(n);
                        watermarked = Some(r);
                    }
                    Err(e) => assert_refusal(e, n + headroom, cap, 0),
                }
            }
            _ => {}
        }
        let held =
            owned.as_ref().map_or(0, |r| r.len()) + watermarked.as_ref().map_or(0, |r| r.len());
        // The whole life cycle of one borrowed guard.
        let k = below(3);
        match counter.try_reserve(k) {
            Err(e) => assert_refusal(e, k, cap, held),
            Ok(mut r) => {
                assert_eq!(r.len(), k, "{}", msg::PARTIAL);
                shadow.enter(k);
                let mut part = r.split(below(k + 1)).expect("split within the guard");
                assert_eq!(r.len() + part.len(), k, "{}", msg::PARTIAL);
                let g = below(3);
                match part.try_grow(g) {
                    Ok(()) => shadow.enter(g),
                    Err(e) => assert_refusal(e, g, cap, held + k),
                }
                let keep = below(part.len() + 1);
                shadow.exit(part.len() - keep);
                part.shrink_to(keep);
                assert_eq!(part.len(), keep);
                r.merge(part);
                assert!(
                    counter.used() <= cap,
                    "{}: used() above capacity",
                    msg::OVERCOMMIT
                );
                shadow.exit(r.len());
                drop(r);
            }
        }
        // The owned guard is forgotten and released by count.
        if let Some(r) = owned {
            let k = r.forget();
            shadow.exit(k);
            counter.release(k).expect("releasing forgotten slots");
        }
        if let Some(r) = watermarked {
            shadow.exit(r.len());
            drop(r);
        }
    }
}

/// 8 threads on a counter of 5: admits, all three kinds of reservation,
/// and the whole guard life cycle.
fn counter_model() {
    const CAP: usize = 5;
    let counter = Arc::new(SlotCounter::new(CAP));
    let shadow = Arc::new(Shadow::new(CAP));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (counter, shadow) = (Arc::clone(&counter), Arc::clone(&shadow));
            thread::spawn(move || {
                if t % 2 == 0 {
                    admit_rounds(&*counter, &shadow, 3);
                    guard_rounds(&counter, &shadow, 1);
                } else {
                    guard_rounds(&counter, &shadow, 2);
                    admit_rounds(&*counter, &shadow, 1);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(shadow.held(), 0);
    assert_eq!(counter.used(), 0, "slots {}", msg::LEAK);
    assert!(
        counter.peak_used() <= CAP,
        "{}: peak above capacity",
        msg::OVERCOMMIT
    );
}

#[test]
fn counter_8_threads_random() {
    check_random(counter_model, iterations(20000));
}

#[test]
fn counter_8_threads_pct() {
    check_pct(counter_model, iterations(20000));
}

/// The admit/release shape alone, on any [`Admit`].
fn admit_model<C: Admit>(make: fn() -> C) -> impl Fn() + Send + Sync + 'static {
    move || {
        let counter = Arc::new(make());
        let shadow = Arc::new(Shadow::new(counter.capacity()));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (counter, shadow) = (Arc::clone(&counter), Arc::clone(&shadow));
                thread::spawn(move || admit_rounds(&*counter, &shadow, 3))
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(counter.used(), 0, "slots {}", msg::LEAK);
    }
}

fn slot_counter() -> SlotCounter {
    SlotCounter::new(3)
}

fn check_then_add() -> CheckThenAdd {
    CheckThenAdd {
        used: AtomicUsize::new(0),
        capacity: 3,
    }
}

#[test]
fn admit_model_passes_on_slot_counter() {
    check_random(admit_model(slot_counter), iterations(500));
    check_pct(admit_model(slot_counter), iterations(500));
}

/// Negative control: the check-then-add counter overcommits, and shuttle's
/// random scheduler finds it in the same model shape.
#[test]
#[should_panic(expected = "overcommit")]
fn check_then_add_is_caught_random() {
    check_random(admit_model(check_then_add), CONTROL_SCHEDULES);
}

/// Negative control, under PCT.
#[test]
#[should_panic(expected = "overcommit")]
fn check_then_add_is_caught_pct() {
    check_pct(admit_model(check_then_add), CONTROL_SCHEDULES);
}

// ---------------------------------------------------------------------------
// BlockPool and Sequence
// ---------------------------------------------------------------------------

/// What the raw allocation shape needs from a block allocator.
trait Blocks: Send + Sync + 'static {
    /// Whether `free` validates its input (the wrong allocator does not).
    const VALIDATES: bool;
    fn num_blocks(&self) -> usize;
    fn try_alloc(&self, n: usize, out: &mut Vec<BlockId>) -> Result<(), ReserveError>;
    fn free(&self, ids: &[BlockId]) -> Result<(), FreeError>;
    fn used_blocks(&self) -> usize;
}

impl Blocks for BlockPool {
    const VALIDATES: bool = true;
    fn num_blocks(&self) -> usize {
        BlockPool::num_blocks(self)
    }
    fn try_alloc(&self, n: usize, out: &mut Vec<BlockId>) -> Result<(), ReserveError> {
        BlockPool::try_alloc(self, n, out)
    }
    fn free(&self, ids: &[BlockId]) -> Result<(), FreeError> {
        BlockPool::free(self, ids)
    }
    fn used_blocks(&self) -> usize {
        BlockPool::used_blocks(self)
    }
}

/// A wrong block allocator: finds free blocks with loads, then marks them
/// taken with stores (check-then-set), so two threads can take one block.
struct CheckThenSet {
    taken: Vec<AtomicBool>,
}

impl Blocks for CheckThenSet {
    const VALIDATES: bool = false;
    fn num_blocks(&self) -> usize {
        self.taken.len()
    }
    fn try_alloc(&self, n: usize, out: &mut Vec<BlockId>) -> Result<(), ReserveError> {
        // SeqCst (all accesses): the bug is the gap between check and set.
        let free: Vec<usize> = (0..self.taken.len())
            .filter(|&b| !self.taken[b].load(Ordering::SeqCst))
            .take(n)
            .collect();
        if free.len() < n {
            return Err(ReserveError::Full {
                requested: n,
                available: free.len(),
            });
        }
        for b in free {
            self.taken[b].store(true, Ordering::SeqCst);
            out.push(BlockId::new(b as u32));
        }
        Ok(())
    }
    fn free(&self, ids: &[BlockId]) -> Result<(), FreeError> {
        for id in ids {
            self.taken[id.index()].store(false, Ordering::SeqCst);
        }
        Ok(())
    }
    fn used_blocks(&self) -> usize {
        self.taken
            .iter()
            .filter(|t| t.load(Ordering::SeqCst))
            .count()
    }
}

/// Raw allocations: take `k` blocks whole, write and read them back,
/// try refused frees on them, free them.
fn raw_rounds<B: Blocks>(pool: &B, owners: &Owners, tag: usize, rounds: usize) {
    let num = pool.num_blocks();
    let mut out = Vec::with_capacity(num + 1);
    for _ in 0..rounds {
        let k = [1, 1, 2, 3, num + 1, usize::MAX][below(6)];
        out.clear();
        match pool.try_alloc(k, &mut out) {
            Ok(()) => {
                assert_eq!(out.len(), k, "{}", msg::PARTIAL);
                for &id in &out {
                    owners.fresh(id, tag);
                }
                assert!(
                    pool.used_blocks() <= num,
                    "{}: used_blocks",
                    msg::OVERCOMMIT
                );
                if B::VALIDATES {
                    // Refused frees of our own blocks change nothing, even
                    // while other threads allocate and free around them.
                    assert_eq!(
                        pool.free(&[out[0], out[0]]),
                        Err(FreeError::OverFreed { id: out[0] })
                    );
                    let bad = BlockId::new(num as u32);
                    assert_eq!(
                        pool.free(&[out[0], bad]),
                        Err(FreeError::OutOfRange {
                            id: bad,
                            num_blocks: num
                        })
                    );
                }
                for &id in &out {
                    owners.check(id, tag);
                    owners.put(id);
                }
                pool.free(&out).expect("freeing blocks the thread holds");
            }
            Err(e) => {
                assert!(
                    out.is_empty(),
                    "{}: refused, but ids appended",
                    msg::PARTIAL
                );
                assert_refusal(e, k, num, 0);
            }
        }
    }
}

/// A sequence and the copy-on-write source it still holds, with the
/// ownership accounting of every block it references.
struct Tracked {
    seq: Sequence,
    retired: Option<BlockId>,
    tag: usize,
}

impl Tracked {
    fn new(pool: &Arc<BlockPool>, tag: usize) -> Self {
        Tracked {
            seq: Sequence::new(Arc::clone(pool)),
            retired: None,
            tag,
        }
    }

    fn bs(&self) -> usize {
        self.seq.pool().block_size()
    }

    /// Every block this sequence references (table and retired).
    fn held(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.seq.blocks().iter().copied().chain(self.retired)
    }

    fn append(&mut self, n: usize, owners: &Owners, mine: usize) {
        let (old_len, old) = (self.seq.len(), self.seq.blocks().to_vec());
        let num = self.seq.pool().num_blocks();
        // A successful append gives the retired block back: let go first.
        let retired = self.retired.take();
        if let Some(id) = retired {
            owners.put(id);
        }
        match self.seq.try_append_cow(n) {
            Ok((range, copy)) => {
                assert_eq!(range, old_len..old_len + n, "{}", msg::PARTIAL);
                assert_eq!(self.seq.len(), old_len + n, "{}", msg::PARTIAL);
                let table = self.seq.blocks().to_vec();
                let keep = if copy.is_some() {
                    old.len() - 1
                } else {
                    old.len()
                };
                assert_eq!(&table[..keep], &old[..keep], "kept blocks changed");
                assert_eq!(
                    table.len(),
                    (old_len + n).div_ceil(self.bs()),
                    "{}",
                    msg::PARTIAL
                );
                for &id in &table[keep..] {
                    owners.fresh(id, self.tag);
                }
                if let Some(c) = copy {
                    assert_eq!((c.src, c.dst), (old[keep], table[keep]));
                    // The replaced block stays referenced (and held) until
                    // the next change.
                    self.retired = Some(c.src);
                }
                // The kernel writes the new tokens (and the copy).
                self.write(range, owners);
            }
            Err(e) => {
                if let Some(id) = retired {
                    owners.retake(id);
                    self.retired = Some(id);
                }
                assert_eq!(self.seq.len(), old_len, "{}", msg::PARTIAL);
                assert_eq!(self.seq.blocks(), &old[..], "{}", msg::PARTIAL);
                // The blocks asked for: the new ones, plus one for a
                // copy-on-write if the last block is partly filled (and was
                // shared at that moment).
                let room = old.len() * self.bs() - old_len;
                let new_blocks = n.saturating_sub(room).div_ceil(self.bs());
                let may_copy = old_len % self.bs() != 0;
                let requested = match e {
                    ReserveError::Full { requested, .. }
                    | ReserveError::BehindWaiters { requested, .. }
                    | ReserveError::NeverFits { requested, .. } => requested,
                    ReserveError::Closed => new_blocks,
                    other => panic!("an error this test does not know: {other:?}"),
                };
                assert!(
                    requested == new_blocks
                        || (may_copy && requested == new_blocks.saturating_add(1)),
                    "{}: an append of {n} asked for {requested} blocks",
                    msg::IMPOSSIBLE
                );
                assert_refusal(e, requested, num, mine);
            }
        }
    }

    /// Writes into the blocks of `positions`: each must have one holder.
    fn write(&self, positions: Range<usize>, owners: &Owners) {
        if positions.is_empty() {
            return;
        }
        let bs = self.bs();
        let blocks = &self.seq.blocks()[positions.start / bs..=(positions.end - 1) / bs];
        for &id in blocks {
            owners.write(id, self.tag);
        }
    }

    fn truncate(&mut self, len: usize, owners: &Owners) {
        let before = self.seq.blocks().len();
        if len < self.seq.len() {
            let keep = len.div_ceil(self.bs());
            for &id in &self.seq.blocks()[keep..] {
                owners.put(id);
            }
            if let Some(id) = self.retired.take() {
                owners.put(id);
            }
        }
        let gone = self.seq.truncate(len);
        assert_eq!(before - self.seq.blocks().len(), gone);
        assert_eq!(self.seq.blocks().len(), self.seq.len().div_ceil(self.bs()));
    }

    fn fork(&self, owners: &Owners, tag: usize, mine: usize) -> Option<Tracked> {
        let (bs, len) = (self.bs(), self.seq.len());
        let (full, tail) = (len / bs, len % bs);
        match self.seq.try_fork() {
            Ok((child, copy)) => {
                assert_eq!(child.len(), len);
                assert_eq!(&child.blocks()[..full], &self.seq.blocks()[..full]);
                for &id in &child.blocks()[..full] {
                    owners.share(id);
                }
                let child = Tracked {
                    seq: child,
                    retired: None,
                    tag,
                };
                if tail != 0 {
                    let dst = child.seq.blocks()[full];
                    owners.fresh(dst, tag);
                    let c = copy.expect("a fork off a block boundary copies its tail");
                    assert_eq!(
                        (c.src, c.dst, c.tokens),
                        (self.seq.blocks()[full], dst, tail)
                    );
                    // The device copy writes the child's private tail.
                    child.write(full * bs..len, owners);
                } else {
                    assert_eq!(copy, None);
                }
                Some(child)
            }
            Err(e) => {
                assert!(tail != 0, "a fork on a block boundary failed: {e:?}");
                assert_refusal(e, 1, self.seq.pool().num_blocks(), mine);
                None
            }
        }
    }

    fn slots_agree(&self) {
        let bs = self.bs();
        let len = self.seq.len();
        let mut slots = Vec::new();
        self.seq.extend_slots(0..len, &mut slots).unwrap();
        for (pos, &slot) in slots.iter().enumerate() {
            assert_eq!(slot, self.seq.blocks()[pos / bs].index() * bs + pos % bs);
            assert_eq!(self.seq.slot(pos), Some(slot));
        }
        assert_eq!(self.seq.slot(len), None);
    }

    fn drop_tracked(self, owners: &Owners) {
        for id in self.held() {
            owners.put(id);
        }
        drop(self.seq);
    }
}

/// Distinct blocks held by a thread's sequences (all counted in `used`).
fn distinct_held(seqs: &[Tracked]) -> usize {
    seqs.iter()
        .flat_map(Tracked::held)
        .collect::<HashSet<_>>()
        .len()
}

/// Random appends, truncates, forks and drops on a thread's own sequences
/// (some of them forks whose siblings live in other threads).
fn seq_rounds(
    pool: &Arc<BlockPool>,
    owners: &Owners,
    mut seqs: Vec<Tracked>,
    tag: usize,
    rounds: usize,
) {
    let mut next_tag = tag * 100;
    for _ in 0..rounds {
        if seqs.is_empty() {
            seqs.push(Tracked::new(pool, tag));
        }
        let i = below(seqs.len());
        let mine = distinct_held(&seqs);
        match below(7) {
            0 | 1 => seqs[i].append(1 + below(4), owners, mine),
            // A rejected draft token and a new one: back into the last
            // block, which may be shared with a fork (copy-on-write).
            6 => {
                let len = seqs[i].seq.len();
                seqs[i].truncate(len.saturating_sub(1), owners);
                let mine = distinct_held(&seqs);
                seqs[i].append(1, owners, mine);
            }
            2 => {
                let len = seqs[i].seq.len();
                seqs[i].truncate(below(len + 1), owners);
            }
            3 => {
                next_tag += 1;
                if let Some(child) = seqs[i].fork(owners, next_tag, mine) {
                    seqs.push(child);
                }
            }
            4 => seqs.swap_remove(i).drop_tracked(owners),
            5 => {
                let big = [usize::MAX, pool.num_blocks() * pool.block_size() + 1][below(2)];
                seqs[i].append(big, owners, mine);
            }
            _ => unreachable!(),
        }
        for s in &seqs {
            s.slots_agree();
        }
        assert!(
            pool.used_blocks() <= pool.num_blocks(),
            "{}: used_blocks",
            msg::OVERCOMMIT
        );
    }
    for s in seqs {
        s.drop_tracked(owners);
    }
}

/// After every thread joined: nothing held, every count 0, and the free
/// list gives back each block exactly once.
fn assert_conserved(pool: &BlockPool, owners: &Owners) {
    owners.assert_none_held();
    let num = pool.num_blocks();
    assert_eq!(pool.used_blocks(), 0, "blocks {}", msg::LEAK);
    assert_eq!(pool.free_blocks(), num);
    for b in 0..num {
        assert_eq!(pool.ref_count(BlockId::new(b as u32)), Some(0));
    }
    assert!(pool.peak_used_blocks() <= num);
    if !pool.is_closed() {
        let mut all = Vec::new();
        pool.try_alloc(num, &mut all).unwrap();
        let distinct: HashSet<_> = all.iter().collect();
        assert_eq!(
            distinct.len(),
            num,
            "the free list lost or duplicated a block"
        );
        assert_eq!(
            pool.try_alloc(1, &mut Vec::new()),
            Err(ReserveError::Full {
                requested: 1,
                available: 0
            })
        );
        pool.free(&all).unwrap();
    }
}

/// Sets up a parent with `tokens` and its fork, both tracked (tags `tag`
/// and `tag + 1`), to hand to two different threads.
fn forked_pair(
    pool: &Arc<BlockPool>,
    owners: &Owners,
    tokens: usize,
    tag: usize,
) -> (Tracked, Tracked) {
    let mut parent = Tracked::new(pool, tag);
    parent.append(tokens, owners, 0);
    let child = parent.fork(owners, tag + 1, 0).expect("room for the fork");
    (parent, child)
}

/// 8 threads on a pool of 10 blocks of 2 slots: two parent/child pairs split
/// across threads, two threads of raw allocations, two threads growing and
/// forking their own sequences.
fn pool_model() {
    pool_model_over(BlockPool::new(10, 2));
}

/// [`pool_model`] over a pool of 10 blocks whose free list is 3 shards
/// (ids 0-3, 4-7 and 8-9): the threads start their pops at different
/// shards, steal when theirs runs short, and free chains that go back to
/// several shards.
fn sharded_pool_model() {
    pool_model_over(BlockPool::with_shards(10, 2, 3));
}

fn pool_model_over(pool: BlockPool) {
    let pool = Arc::new(pool);
    let owners = Arc::new(Owners::new(10));
    // Off a block boundary: the child has a private copy of the tail.
    let (p0, c0) = forked_pair(&pool, &owners, 3, 1);
    // On a boundary: parent and child share both blocks.
    let (p1, c1) = forked_pair(&pool, &owners, 4, 3);
    let mut given = [Some(p0), Some(c0), Some(p1), Some(c1)];
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (pool, owners) = (Arc::clone(&pool), Arc::clone(&owners));
            let mine: Vec<Tracked> = given
                .get_mut(t)
                .and_then(Option::take)
                .into_iter()
                .collect();
            thread::spawn(move || match t {
                0..=3 => seq_rounds(&pool, &owners, mine, 10 + t, 6),
                4 | 5 => raw_rounds(&*pool, &owners, 10 + t, 4),
                _ => seq_rounds(&pool, &owners, Vec::new(), 10 + t, 6),
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_conserved(&pool, &owners);
}

#[test]
fn pool_and_sequences_8_threads_random() {
    check_random(pool_model, iterations(20000));
}

#[test]
fn pool_and_sequences_8_threads_pct() {
    check_pct(pool_model, iterations(20000));
}

#[test]
fn sharded_pool_and_sequences_8_threads_random() {
    check_random(sharded_pool_model, iterations(10000));
}

#[test]
fn sharded_pool_and_sequences_8_threads_pct() {
    check_pct(sharded_pool_model, iterations(10000));
}

/// 4 threads on a pool of 6 blocks over 3 shards (2 counted in each):
/// requests of 3 to 6 blocks, some with headroom, which no home shard can
/// serve alone, so every allocation gathers from the other shards while
/// the other threads' gathers hold blocks in transit. Whole or nothing,
/// every refusal below what was needed, ownership, and conservation; and
/// once every thread has joined, a refusal with nothing running reports
/// exactly the free blocks.
fn gather_model() {
    let pool = Arc::new(BlockPool::with_shards(6, 1, 3));
    let owners = Arc::new(Owners::new(6));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (pool, owners) = (Arc::clone(&pool), Arc::clone(&owners));
            thread::spawn(move || {
                let mut out = Vec::with_capacity(7);
                for _ in 0..3 {
                    let k = 3 + below(4);
                    let headroom = [0, 0, 1, 2][below(4)];
                    out.clear();
                    match pool.try_alloc_with_headroom(k, headroom, &mut out) {
                        Ok(()) => {
                            assert_eq!(out.len(), k, "{}", msg::PARTIAL);
                            for &id in &out {
                                owners.fresh(id, t + 1);
                            }
                            for &id in &out {
                                owners.check(id, t + 1);
                                owners.put(id);
                            }
                            pool.free(&out).expect("freeing blocks the thread holds");
                        }
                        Err(e) => {
                            assert!(
                                out.is_empty(),
                                "{}: refused, but ids appended",
                                msg::PARTIAL
                            );
                            assert_refusal(e, k + headroom, 6, 0);
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut held = Vec::new();
    pool.try_alloc(4, &mut held).unwrap();
    assert_eq!(
        pool.try_alloc(3, &mut Vec::new()),
        Err(ReserveError::Full {
            requested: 3,
            available: 2
        }),
        "a refusal with nothing running"
    );
    pool.free(&held).unwrap();
    assert_conserved(&pool, &owners);
}

#[test]
fn sharded_gathers_random() {
    check_random(gather_model, iterations(10000));
}

#[test]
fn sharded_gathers_pct() {
    check_pct(gather_model, iterations(10000));
}

/// The raw allocation shape alone, on any [`Blocks`].
fn raw_model<B: Blocks>(make: fn() -> B) -> impl Fn() + Send + Sync + 'static {
    move || {
        let pool = Arc::new(make());
        let owners = Arc::new(Owners::new(pool.num_blocks()));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let (pool, owners) = (Arc::clone(&pool), Arc::clone(&owners));
                thread::spawn(move || raw_rounds(&*pool, &owners, t + 1, 3))
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        owners.assert_none_held();
        assert_eq!(pool.used_blocks(), 0, "blocks {}", msg::LEAK);
    }
}

fn block_pool() -> BlockPool {
    BlockPool::new(4, 2)
}

fn check_then_set() -> CheckThenSet {
    CheckThenSet {
        taken: (0..4).map(|_| AtomicBool::new(false)).collect(),
    }
}

#[test]
fn raw_model_passes_on_block_pool() {
    check_random(raw_model(block_pool), iterations(500));
    check_pct(raw_model(block_pool), iterations(500));
}

/// Negative control: the check-then-set allocator hands one block to two
/// owners, and the ownership array catches it.
#[test]
#[should_panic(expected = "block handed to a second owner")]
fn check_then_set_is_caught_random() {
    check_random(raw_model(check_then_set), CONTROL_SCHEDULES);
}

/// Negative control, under PCT.
#[test]
#[should_panic(expected = "block handed to a second owner")]
fn check_then_set_is_caught_pct() {
    check_pct(raw_model(check_then_set), CONTROL_SCHEDULES);
}

// ---------------------------------------------------------------------------
// Closing while busy
// ---------------------------------------------------------------------------

/// 7 threads admit, reserve and allocate while the 8th closes the counter
/// and the pool: nothing is admitted once a thread has seen the close, and
/// everything drains.
fn close_model() {
    const CAP: usize = 4;
    let counter = Arc::new(SlotCounter::new(CAP));
    let pool = Arc::new(BlockPool::new(CAP, 2));
    let shadow = Arc::new(Shadow::new(CAP));
    let owners = Arc::new(Owners::new(CAP));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (counter, pool) = (Arc::clone(&counter), Arc::clone(&pool));
            let (shadow, owners) = (Arc::clone(&shadow), Arc::clone(&owners));
            thread::spawn(move || {
                if t == 0 {
                    // Some work first, so that the close lands mid-way.
                    admit_rounds(&*counter, &shadow, 2);
                    counter.close();
                    pool.close();
                    assert!(counter.is_closed() && pool.is_closed());
                    return;
                }
                let mut held = Vec::new();
                let mut seq = Tracked::new(&pool, t);
                for _ in 0..3 {
                    let n = 1 + below(2);
                    let seen_closed = counter.is_closed();
                    match counter.try_reserve_owned(n) {
                        Ok(r) => {
                            assert!(!seen_closed, "{}", msg::AFTER_CLOSE);
                            shadow.enter(n);
                            held.push(r);
                        }
                        Err(ReserveError::Closed) => {}
                        Err(e) => {
                            let mine = held.iter().map(|r| r.len()).sum();
                            assert!(!seen_closed, "{}: {e:?} after close", msg::AFTER_CLOSE);
                            assert_refusal(e, n, CAP, mine);
                        }
                    }
                    let seen_closed = pool.is_closed();
                    let before = seq.seq.len();
                    let mine = distinct_held(std::slice::from_ref(&seq));
                    let needs_block = seq.seq.blocks().len() * 2 == before;
                    match seq.seq.try_append(1) {
                        Ok(_) => {
                            assert!(!(seen_closed && needs_block), "{}", msg::AFTER_CLOSE);
                            let table = seq.seq.blocks();
                            if needs_block {
                                owners.fresh(table[table.len() - 1], t);
                            }
                            seq.write(before..before + 1, &owners);
                        }
                        Err(ReserveError::Closed) => assert!(needs_block),
                        Err(e) => {
                            assert!(!seen_closed, "{}: {e:?} after close", msg::AFTER_CLOSE);
                            assert_refusal(e, 1, CAP, mine);
                        }
                    }
                    // Drain one guard now and then; releases work when closed.
                    if below(2) == 0 {
                        if let Some(r) = held.pop() {
                            shadow.exit(r.len());
                            drop(r);
                        }
                    }
                }
                for r in held {
                    shadow.exit(r.len());
                    drop(r);
                }
                seq.drop_tracked(&owners);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(counter.is_closed());
    assert_eq!(counter.used(), 0, "slots {}", msg::LEAK);
    assert_eq!(shadow.held(), 0);
    assert_conserved(&pool, &owners);
}

#[test]
fn close_while_busy_random() {
    check_random(close_model, iterations(5000));
}

#[test]
fn close_while_busy_pct() {
    check_pct(close_model, iterations(5000));
}
