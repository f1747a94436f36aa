//! The prefix cache's eviction order: least recently released first.
//!
//! Each block has a release stamp, taken from a pool-wide clock when its
//! last reference goes while it holds a key (a sequence takes one range of
//! stamps per give-back, and stamps its blocks in release order). Stamps
//! are 64 bits (the clock does not wrap); a scan ranks them by their
//! signed distance from the clock it read when it began, so that a block
//! stamped while the scan runs ranks youngest.
//!
//! Evictors take blocks from a ring of candidates, oldest first, as
//! `(stamp << id_bits) | id` words, `id_bits` the bits of the pool's
//! largest id (at most 32): a word holds the stamp's low `64 - id_bits`
//! bits (at least 32), and a candidate is current while its block is
//! evictable with a stamp of those bits at positions that only grow (position `p`
//! sits in slot `p % capacity`; the ring holds `num_blocks` and a quarter
//! more, for stale candidates). An
//! evictor copies up to [`POP_BATCH`] candidates and then claims their
//! positions with one CAS, so that it never reads a slot that a refill has
//! begun to rewrite for a later position. A block that becomes evictable
//! is appended (it is the youngest; a give-back appends the blocks it made
//! evictable in batches, oldest first, with one CAS on the ring's length a
//! batch), unless the ring is full or *overflowed*: some evictable block may
//! be missing from it.
//!
//! **Refills.** Once an overflowed ring holds at most an eighth of its
//! capacity (one candidate, in a ring of fewer than 16 slots), one
//! evictor claims the refill flag, scans every block and appends the
//! oldest evictable blocks that have no candidate in the ring yet, oldest first, up to as many as the free slots take (whole
//! buckets of ranks: it stops before the first bucket of its histogram
//! that would overflow them), while the other
//! evictors go on popping the candidates left. The blocks of the
//! candidates left are marked in a map of one bit a block for the scan,
//! which finds every evictable block that has no current candidate (the
//! whole map is cleared after the scan). A refill clears the overflowed
//! state only if its placing pass wrote every such block it saw (a block
//! released between the passes can be ranked by its old stamp and take an
//! older block's place) and no append *missed* since its scan began: an append skipped because the
//! ring was overflowed or full, or one whose CAS on the length found
//! another writer there (it may have overwritten that writer's entries,
//! or they its). A miss bumps a count beside the overflowed bit, and the
//! refill clears the bit with a CAS from the value it read before its
//! scan, so a block that a race left out of the ring keeps the ring
//! overflowed until a refill whose scan began after the miss finds it. A
//! block whose stamp was taken early (in a long give-back) or written
//! after the drop that made it evictable is in the ring, at the place its
//! stamp had when it was appended or scanned. The scan selects without a heap: a pass for
//! the range of ranks, a histogram of [`BUCKETS`] buckets whose oldest
//! buckets that fit together are kept (over a range narrowed to the
//! oldest bucket while even that one does not fit), and a pass that
//! places each kept block in its bucket's range; each bucket is then
//! sorted in place, oldest bucket first, and the sorted entries published,
//! each time with a CAS on the ring's length: the first nonempty bucket at
//! once, then whenever the entries sorted since the last publish at least
//! match those published (a CAS for every doubling), and the rest at the
//! end.
//!
//! Nobody holds the refill flag against anyone: an evictor that finds the
//! ring empty while another refills it gives up its time slice a few
//! times ([`REFILL_YIELDS`], for a refiller that waits for a core), and
//! then sweeps the pool from a rotating hand instead, taking the
//! evictable blocks it meets that are stamped within `num_blocks / 16`
//! stamps after the last candidate taken (the next oldest), then within
//! `num_blocks / 2`, then any, and moves the hand past what it looked at.
//!
//! So with one thread the order is exactly least recently released first:
//! the ring holds the oldest evictable blocks in order, a refill appends
//! the next oldest, and a block is appended on release only while every
//! older evictable block is in the ring. While few blocks are evictable,
//! releases keep the ring filled and evictions need no scan. Under
//! concurrency the order is approximate (the races above, the blocks left
//! out of an overflowed ring until a refill finds them, and the sweeps'
//! picks); every
//! candidate is re-checked against the block's stamp (the low bits its
//! word holds) and state before it is evicted.

use std::collections::TryReserveError;

use crate::array::{bytes_of, Room};

use crate::id::BlockId;
use crate::sync::{self, AtomicBool, AtomicU64, AtomicUsize, CachePadded, Faults, Ordering};

use crate::pool::refs::Refs;

/// The ring holds a slot for every block and one more for every
/// `STALE_ROOM` blocks. Every evictable block fits, and the rest is room
/// for stale candidates: a block revived by a match and released again is
/// appended anew, and its older candidate keeps its slot until the evictors
/// pass it. A ring with no such room overflows as soon as any candidate is
/// stale while every block is evictable, and each overflow costs a refill's
/// scan of every block.
const STALE_ROOM: usize = 4;
/// A refill begins once an overflowed ring holds at most
/// `capacity / LOW_WATER` candidates (or one): the candidates left keep the
/// evictors going while it scans. A refill's scan visits every block
/// whatever it appends, so the later it begins, the more evictions each
/// scan serves (an eighth left: up to seven eighths of the ring appended
/// a scan, where half left appended up to half); an evictor that finds the
/// ring empty during a scan sweeps instead (see the module doc).
const LOW_WATER: usize = 8;
/// The overflowed bit of `Lru::overflow`.
const OVERFLOWED: u64 = 1;
/// One miss in `Lru::overflow`'s count, above the bit.
const MISS: u64 = 2;
/// Candidates an evictor copies and claims with one CAS (256 bytes on its
/// stack).
const POP_BATCH: usize = 32;
/// How many times an evictor that finds the ring empty while another
/// refills it gives up its time slice before it sweeps.
const REFILL_YIELDS: usize = 16;
/// Buckets of a refill's histogram of ranks (two arrays of them on the
/// refiller's stack, 8 KiB).
const BUCKETS: usize = 1 << BUCKET_BITS;
/// `BUCKETS`, as a power of two.
const BUCKET_BITS: u32 = 10;
/// Buckets at most this long are sorted by insertion, longer ones by a
/// heap sort.
const INSERTION_SORT: usize = 16;

/// Stamps, the ring of candidates, the refill's map and the sweeps' hand.
pub(super) struct Lru {
    /// Per block: the clock's value when it last became evictable.
    stamps: Box<[AtomicU64]>,
    /// The release clock.
    clock: CachePadded<AtomicU64>,
    /// The ring: `(stamp << id_bits) | id` words, oldest first; position
    /// `p` in slot `p % capacity`.
    candidates: Box<[AtomicU64]>,
    /// The bits of a candidate word that hold its block's id: those of the
    /// pool's largest id, at least 1. The others hold the low bits of its
    /// stamp.
    id_bits: u32,
    /// The position after the youngest candidate. Positions only grow.
    len: AtomicU64,
    /// The position of the next candidate to try (`next <= len`, and
    /// `len - next <= capacity`), with the stamp of the last candidate
    /// taken.
    next: CachePadded<Head>,
    /// Set while one evictor refills the ring.
    refilling: AtomicBool,
    /// Whether the ring is *overflowed* (bit 0: an evictable block may be
    /// missing from it, and appends stop), and above it a count of misses:
    /// appends that left blocks out of the ring (overflowed or full) or
    /// may have overwritten another writer's entries (their length CAS
    /// failed). A miss sets the bit and bumps the count with
    /// read-modify-writes; only a refill clears the bit, with a CAS from
    /// the value it read before its scan, so it fails if any miss came
    /// after that read (the scan may have passed the block missed). A
    /// block left out of the ring while the bit is clear is found only
    /// when the ring runs dry (see `refill`).
    overflow: AtomicU64,
    /// Where the fallback scan starts.
    hand: AtomicUsize,
    /// One bit a block, set by a refill for the blocks that have a current
    /// candidate in the ring while it scans (see `refill`).
    in_ring: Box<[AtomicU64]>,
    /// The faults of loom's negative controls (none outside them).
    faults: Faults,
}

/// The ring's head: the position of the next candidate to try, and the
/// stamp of the block of the last candidate taken (where a sweep looks
/// first).
struct Head {
    next: AtomicU64,
    stamp: AtomicU64,
}

/// The room of an [`Lru`]'s arrays, reserved by [`Lru::room`].
pub(super) struct LruRoom {
    num_blocks: usize,
    stamps: Room<AtomicU64>,
    candidates: Room<AtomicU64>,
    in_ring: Room<AtomicU64>,
}

impl Lru {
    /// The eviction order of `num_blocks` blocks, none evictable, carrying
    /// `faults`.
    pub(super) fn new(room: LruRoom, faults: Faults) -> Lru {
        Lru {
            stamps: room.stamps.fill(|_| AtomicU64::new(0)),
            clock: CachePadded::new(AtomicU64::new(0)),
            candidates: room.candidates.fill(|_| AtomicU64::new(0)),
            id_bits: (usize::BITS - (room.num_blocks.max(2) - 1).leading_zeros()),
            len: AtomicU64::new(0),
            next: CachePadded::new(Head {
                next: AtomicU64::new(0),
                stamp: AtomicU64::new(0),
            }),
            refilling: AtomicBool::new(false),
            overflow: AtomicU64::new(0),
            hand: AtomicUsize::new(0),
            in_ring: room.in_ring.fill(|_| AtomicU64::new(0)),
            faults,
        }
    }

    /// Reserves the room of [`new`](Self::new)'s arrays for `num_blocks`
    /// blocks.
    pub(super) fn room(num_blocks: usize) -> Result<LruRoom, TryReserveError> {
        Ok(LruRoom {
            num_blocks,
            stamps: Room::reserve(num_blocks)?,
            candidates: Room::reserve(Lru::capacity(num_blocks))?,
            in_ring: Room::reserve(num_blocks.div_ceil(64))?,
        })
    }

    /// The ring's capacity for `num_blocks` blocks.
    fn capacity(num_blocks: usize) -> usize {
        num_blocks.saturating_add(num_blocks / STALE_ROOM)
    }

    /// The heap bytes [`room`](Self::room) asks for.
    pub(super) fn heap_bytes(num_blocks: usize) -> usize {
        bytes_of::<AtomicU64>(num_blocks)
            .saturating_add(bytes_of::<AtomicU64>(Lru::capacity(num_blocks)))
            .saturating_add(bytes_of::<AtomicU64>(num_blocks.div_ceil(64)))
    }

    /// The ring's capacity, how many candidates it holds (stale ones
    /// included) and whether it is overflowed, for the loom models' checks
    /// of the states they set up.
    #[cfg(all(test, kvslots_loom))]
    pub(super) fn ring(&self) -> (usize, usize, bool) {
        // Relaxed (all three): read by a model's only running thread.
        let len = self.len.load(Ordering::Relaxed);
        let next = self.next.next.load(Ordering::Relaxed);
        let overflowed = self.overflow.load(Ordering::Relaxed) & OVERFLOWED != 0;
        (self.candidates.len(), (len - next) as usize, overflowed)
    }

    /// Moves the ring's head past every candidate without evicting their
    /// blocks: those stay evictable, outside the ring, with the overflowed
    /// bit as it was. For the loom models that start from a ring run dry
    /// with evictable blocks left out of it (what `evict`'s refill of an
    /// empty ring finds), set up on one thread.
    #[cfg(all(test, kvslots_loom))]
    pub(super) fn pass_candidates(&self) {
        // Relaxed (both): written by a model's only running thread, before
        // it spawns the threads that read them.
        let len = self.len.load(Ordering::Relaxed);
        self.next.next.store(len, Ordering::Relaxed);
    }

    /// Takes `n` consecutive stamps; returns the first.
    pub(super) fn stamps(&self, n: usize) -> u64 {
        // Relaxed: stamps only order evictions, a hint; uniqueness comes
        // from the read-modify-write.
        self.clock.fetch_add(n as u64, Ordering::Relaxed)
    }

    /// The candidate word of block `id` stamped `stamp` (the low bits of
    /// `stamp` that a word holds).
    pub(super) fn word(&self, id: BlockId, stamp: u64) -> u64 {
        (stamp << self.id_bits) | id.index() as u64
    }

    /// A candidate word's block.
    fn id_of(&self, word: u64) -> BlockId {
        BlockId::new((word & !(u64::MAX << self.id_bits)) as u32)
    }

    /// A candidate word's stamp: the low `64 - id_bits` bits of its
    /// block's stamp when it was written.
    fn stamp_of(&self, word: u64) -> u64 {
        word >> self.id_bits
    }

    /// The low bits of `stamp` that a candidate word holds.
    fn low(&self, stamp: u64) -> u64 {
        stamp & (u64::MAX >> self.id_bits)
    }

    /// Records that block `id` became evictable at `stamp`.
    pub(super) fn stamp(&self, id: BlockId, stamp: u64) {
        // Relaxed: a hint, re-checked by the evictor's CAS on the state.
        self.stamps[id.index()].store(stamp, Ordering::Relaxed);
    }

    /// Appends the blocks of `words` (candidate words of blocks stamped
    /// already, oldest first) to the ring as its youngest candidates while
    /// it has room and has not overflowed: one CAS on the ring's length for
    /// all of them. Those that do not fit are a miss (they wait for a
    /// refill), and so are all of them if the ring is overflowed or the
    /// CAS finds another writer there.
    pub(super) fn append_all(&self, words: &[u64]) {
        let cap = self.candidates.len();
        if cap == 0 || words.is_empty() {
            return;
        }
        // Relaxed: whether to append at all. A stale clear bit is safe: a
        // refill that set it moves the length when it publishes, and our
        // CAS then fails (a miss) or succeeds first (its CAS fails, and it
        // scans again).
        if self.overflow.load(Ordering::Relaxed) & OVERFLOWED != 0 {
            self.miss();
            return;
        }
        // Acquire: as in `pop`.
        let len = self.len.load(Ordering::Acquire);
        loop {
            // Acquire: evictors claim positions (Release) after they copied
            // their entries, so the slots of positions below this `next`
            // are ours to rewrite for positions a ring later (see `pop`);
            // it also sizes the room, and the CAS below decides.
            let held = (len - self.next.next.load(Ordering::Acquire).min(len)) as usize;
            let fit = words.len().min(cap.saturating_sub(held));
            if fit < words.len() {
                // Full: these blocks (and every later one) wait for a scan.
                self.miss();
                if fit == 0 {
                    return;
                }
            }
            let mut slot = self.slot(len);
            for &word in &words[..fit] {
                // Relaxed: published by the Release CAS below.
                self.candidates[slot].store(word, Ordering::Relaxed);
                slot = if slot + 1 == cap { 0 } else { slot + 1 };
            }
            // Release on success: the entries written above are visible to
            // an evictor that sees the new length. Relaxed on failure: only
            // whether the length moved (a miss) matters, not what was
            // written before.
            match self.len.compare_exchange_weak(
                len,
                len + fit as u64,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => {
                    if actual != len {
                        // Another writer (an append or a refill) read the
                        // same length: it may publish our words in place
                        // of its own, or we may have overwritten entries
                        // it had published. Their blocks may be missing
                        // from the ring: a miss, and ours wait for a
                        // refill too.
                        self.miss();
                        return;
                    }
                    // A spurious failure: nothing else was written.
                }
            }
        }
    }

    /// Records that an append left blocks out of the ring (or may have
    /// overwritten others' entries): bumps the count of misses and sets
    /// the overflowed bit.
    fn miss(&self) {
        // AcqRel (both): read-modify-writes, so that each is ordered
        // against a refill's clearing CAS in `overflow`'s modification
        // order. Release: the drops and stamps of the blocks left out
        // happen-before a refill's scan that reads this count (or a later
        // one) with Acquire. The bump comes first: a clearing CAS after it
        // fails unless its refill read the count after it (and so saw our
        // blocks); a clearing CAS before it is undone by the `fetch_or`.
        self.overflow.fetch_add(MISS, Ordering::AcqRel);
        self.overflow.fetch_or(OVERFLOWED, Ordering::AcqRel);
    }

    /// Ends a refill's overflow: clears the overflowed bit if every
    /// evictable block its scan saw outside the ring fit (`fit`) and no
    /// miss came after `before`, the value it read before its scan.
    fn end_overflow(&self, fit: bool, before: u64) {
        if !fit || self.faults.unchecked_overflow_clear() {
            if fit {
                // loom's `unchecked_overflow_clear` control: clears the
                // bit whatever missed since the scan began. Relaxed: the
                // fault is the missing check, not an ordering.
                self.overflow.fetch_and(!OVERFLOWED, Ordering::Relaxed);
            }
            return;
        }
        // Relaxed (both): only the modification order matters: the CAS
        // fails if a miss (a read-modify-write) came after `before`. No
        // data is handed over by the clear: an append that reads it reads
        // the length with Acquire, and its CAS decides.
        let _ = self.overflow.compare_exchange(
            before,
            before & !OVERFLOWED,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Copies up to `min(k, POP_BATCH)` of the next candidates into
    /// `batch` and claims their positions with one CAS; returns how many
    /// (0 when the ring has none left).
    ///
    /// The copy comes before the claim: a refill or an append rewrites a
    /// slot only for a position a whole ring later, once `next` has passed
    /// the slot's position, and our claim's `Release` orders the copy
    /// before any such rewrite (the writer reads `next` with `Acquire`).
    /// An evictor that claimed first and copied after could read a slot
    /// that a refill is filling with the blocks of its scan, not yet
    /// sorted.
    fn pop(&self, k: usize, batch: &mut [u64; POP_BATCH]) -> usize {
        // Acquire: synchronises with the claim (Release) that moved `next`
        // here, whose evictor had read a length of at least this `next`:
        // the length loaded below is no older, so a ring with candidates
        // left never looks empty here.
        let mut i = self.next.next.load(Ordering::Acquire);
        loop {
            // Acquire: the entries at positions below `len` were written
            // before the Release (a refill's or an append's CAS) that
            // published this length.
            let len = self.len.load(Ordering::Acquire);
            if i >= len {
                return 0;
            }
            let n = ((len - i) as usize).min(k).min(POP_BATCH);
            let claim_first = self.faults.claim_before_read();
            if !claim_first {
                self.copy(i, &mut batch[..n]);
            }
            // Release on success: orders the copy above before the rewrite
            // of these slots (see above). Acquire on failure: retry at the
            // fresh position, as after the load above.
            match self.next.next.compare_exchange_weak(
                i,
                i + n as u64,
                Ordering::Release,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if claim_first {
                        // loom's `claim_before_read` control.
                        self.copy(i, &mut batch[..n]);
                    }
                    // Relaxed (both): a hint for the sweeps (the last
                    // block's stamp now), on the line the CAS above just
                    // took.
                    let last = self.id_of(batch[n - 1]).index();
                    let stamp = self.stamps[last].load(Ordering::Relaxed);
                    self.next.stamp.store(stamp, Ordering::Relaxed);
                    return n;
                }
                Err(actual) => i = actual,
            }
        }
    }

    /// Copies the candidates at positions `from..` into `out`.
    fn copy(&self, from: u64, out: &mut [u64]) {
        let cap = self.candidates.len();
        let mut slot = self.slot(from);
        for word in out {
            // Relaxed: published by the Release that published `len` (see
            // `pop`).
            *word = self.candidates[slot].load(Ordering::Relaxed);
            slot = if slot + 1 == cap { 0 } else { slot + 1 };
        }
    }

    /// The slot of position `p`.
    fn slot(&self, p: u64) -> usize {
        (p % self.candidates.len() as u64) as usize
    }

    /// Whether `id` was last stamped with a stamp whose low bits (those a
    /// candidate word holds) are `stamp`.
    fn stamped(&self, id: BlockId, stamp: u64) -> bool {
        // Relaxed: a hint.
        self.low(self.stamps[id.index()].load(Ordering::Relaxed)) == stamp
    }

    /// Finds up to `k` blocks to evict, least recently released first,
    /// takes each with `take` (the eviction CAS on the state it read) and
    /// hands it to `got`; returns how many. Fewer than `k` if no more
    /// evictable blocks were found (the caller looks again elsewhere).
    /// Candidates are claimed [`POP_BATCH`] at a time, one CAS a batch.
    pub(super) fn evict(
        &self,
        refs: &Refs,
        k: usize,
        take: impl Fn(BlockId, u64) -> bool,
        mut got: impl FnMut(BlockId),
    ) -> usize {
        let mut taken = 0;
        let mut batch = [0u64; POP_BATCH];
        loop {
            loop {
                self.refill_if_low(refs);
                let n = self.pop(k - taken, &mut batch);
                if n == 0 {
                    break;
                }
                for &word in &batch[..n] {
                    let (id, stamp) = (self.id_of(word), self.stamp_of(word));
                    // Acquire: the state's last writer (the last drop) is
                    // synchronised with by the eviction CAS itself; this
                    // load only chooses.
                    let state = refs.state(id.index(), Ordering::Acquire);
                    if refs.may_evict(state) && self.stamped(id, stamp) && take(id, state) {
                        got(id);
                        taken += 1;
                    }
                }
                if taken == k {
                    return taken;
                }
            }
            // The ring is empty: refill, unless someone else is at it.
            if self.claim_refill() {
                let found = self.refill(refs);
                self.end_refill();
                if found == 0 {
                    return taken;
                }
            } else if !self.await_refill() {
                return taken + self.sweep(refs, k - taken, &take, &mut got);
            }
        }
    }

    /// Gives up this thread's time slice while another evictor refills the
    /// ring and the ring is empty, at most [`REFILL_YIELDS`] times: `true`
    /// once the ring has candidates again (a refill publishes its oldest
    /// entries as soon as they are sorted) or nobody refills it, `false`
    /// if the refill is still under way with nothing published. With more
    /// threads than cores the refiller may be the one waiting for a core;
    /// with a core of its own it is seldom waited for. A bounded wait: the
    /// caller sweeps after it, so a refiller that stalls stops no one.
    fn await_refill(&self) -> bool {
        for _ in 0..REFILL_YIELDS {
            // Relaxed (all three): only whether to look again; `pop`
            // re-reads them with the orderings that matter.
            if !self.refilling.load(Ordering::Relaxed)
                || self.len.load(Ordering::Relaxed) > self.next.next.load(Ordering::Relaxed)
            {
                return true;
            }
            sync::yield_now();
        }
        false
    }

    /// Claims the refill flag; `false` if someone else holds it (we do not
    /// wait).
    fn claim_refill(&self) -> bool {
        // Acquire on success: the previous refiller's writes are ours to
        // overwrite. Relaxed on failure: we do not wait.
        self.refilling
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Lets go of the refill flag.
    fn end_refill(&self) {
        // Release: the next refiller sees our entries as written.
        self.refilling.store(false, Ordering::Release);
    }

    /// Refills the ring before it runs dry: when it is overflowed (so an
    /// evictable block is missing from it) and holds at most
    /// `capacity / LOW_WATER` candidates (at least one, for the rings of
    /// pools under 16 blocks), and nobody refills it already.
    fn refill_if_low(&self, refs: &Refs) {
        // Relaxed (all three): only whether to begin; the refill reads
        // them again.
        if self.overflow.load(Ordering::Relaxed) & OVERFLOWED == 0 {
            return;
        }
        let len = self.len.load(Ordering::Relaxed);
        let held = (len - self.next.next.load(Ordering::Relaxed).min(len)) as usize;
        if held > (self.candidates.len() / LOW_WATER).max(1) || !self.claim_refill() {
            return;
        }
        self.refill(refs);
        self.end_refill();
    }

    /// Takes up to `k` evictable blocks from the hand on, and moves the
    /// hand past the blocks it looked at, so that the next sweep starts
    /// where this one stopped instead of rescanning the held blocks before
    /// it. The ring ran dry: the oldest evictable blocks are those stamped
    /// just after the last candidate taken from it. A first pass takes only
    /// blocks stamped up to `num_blocks / 16` stamps after that one, a
    /// second up to `num_blocks / 2` after it, and a third any evictable
    /// block. Returns how many it took.
    fn sweep(
        &self,
        refs: &Refs,
        k: usize,
        take: &impl Fn(BlockId, u64) -> bool,
        got: &mut impl FnMut(BlockId),
    ) -> usize {
        let n = refs.len();
        if n == 0 || k == 0 {
            return 0;
        }
        // Relaxed (both): hints; the hand only spreads the sweeps.
        let start = self.hand.load(Ordering::Relaxed) % n;
        let head = self.next.stamp.load(Ordering::Relaxed);
        let (mut taken, mut looked) = (0, 0);
        let reaches = [Some(n / 16), Some(n / 2), None];
        for reach in reaches.map(|reach| reach.map(|r| i64::try_from(r).unwrap_or(i64::MAX))) {
            for index in (start..n).chain(0..start) {
                looked += 1;
                // Acquire: as in `evict`.
                let state = refs.state(index, Ordering::Acquire);
                if !refs.may_evict(state) {
                    continue;
                }
                if let Some(reach) = reach {
                    // Relaxed: a hint.
                    let stamp = self.stamps[index].load(Ordering::Relaxed);
                    if stamp.wrapping_sub(head) as i64 > reach {
                        continue;
                    }
                }
                let id = BlockId::new(index as u32);
                if take(id, state) {
                    got(id);
                    taken += 1;
                    if taken == k {
                        // Relaxed: as above.
                        self.hand.fetch_add(looked, Ordering::Relaxed);
                        return taken;
                    }
                }
            }
        }
        // Relaxed: as above.
        self.hand.fetch_add(looked, Ordering::Relaxed);
        taken
    }

    /// Appends the oldest evictable blocks that have no candidate in the
    /// ring after the candidates left, oldest first, up to as many as the
    /// free slots take (whole buckets of `fill`'s histogram: it stops
    /// before the first bucket that would overflow them, so a refill can
    /// write fewer); returns how many. The caller holds the `refilling`
    /// flag.
    ///
    /// The blocks of the candidates left are marked in the membership map
    /// for the scan (and the map cleared after it), so that the scan passes them
    /// over: a block missing from the ring that is evictable when the scan
    /// reaches it is found here. One that a miss left out after the scan
    /// began may be passed; the miss then keeps the ring overflowed (see
    /// `end_overflow`), for the next refill. The entries are published as
    /// they are sorted, the first nonempty bucket at once and then each time
    /// their count doubles, so that evictors that ran the ring dry get the
    /// oldest ones early, with a CAS on the length for every doubling (about
    /// the base-2 logarithm of the entries written, and one at the end).
    fn refill(&self, refs: &Refs) -> usize {
        let cap = self.candidates.len();
        // Stop appends: a release during the scan may or may not be seen
        // by it. Relaxed: a hint that stops appends; the clearing CAS in
        // `end_overflow` decides.
        self.overflow.fetch_or(OVERFLOWED, Ordering::Relaxed);
        let mut added = 0;
        loop {
            // Acquire: synchronises with every miss up to the value read
            // (read-modify-writes, Release): the blocks they left out are
            // evictable and stamped for the scan below. A later miss fails
            // `end_overflow`'s CAS.
            let before = self.overflow.load(Ordering::Acquire);
            // Acquire: evictors claim positions with a Release CAS after
            // they copied their entries, so the slots of positions below
            // this `next` are read already and ours to rewrite (for
            // positions a ring later).
            let next = self.next.next.load(Ordering::Acquire);
            // Acquire: as in `pop`. Loaded after `next`, so `next <= len`.
            let len = self.len.load(Ordering::Acquire);
            // An append that read the overflowed bit clear before it was
            // set may have filled the ring between the two loads (from a
            // `next` past ours): then there is no room.
            let room = cap.saturating_sub((len - next) as usize);
            self.mark(next, len);
            let mut published = len;
            let (written, missed) = self.fill(refs, len, room, |written| {
                // Release on success: an evictor that sees the new length
                // sees the entries written before. Relaxed on failure: an
                // append that read the overflowed bit clear before we set it
                // moved the length (and may have overwritten some of our
                // entries: we scan again, and the blocks of entries
                // overwritten are then missing from the ring).
                let ok = self
                    .len
                    .compare_exchange(
                        published,
                        len + written as u64,
                        Ordering::Release,
                        Ordering::Relaxed,
                    )
                    .is_ok();
                if ok {
                    published = len + written as u64;
                }
                ok
            });
            self.unmark_all();
            added += (published - len) as usize;
            if published == len + written as u64 {
                // Appends resume if the scan wrote every evictable block it
                // saw outside the ring and no miss came since `before`
                // (an append that overwrote our entries after we published
                // them is one).
                self.end_overflow(missed == 0, before);
                return added;
            }
            if self.faults.no_rescan_after_raced_publish() {
                // loom's `no_rescan_after_raced_publish` control: what was
                // published stands for the whole refill, and the overflow
                // ends as if every block seen had been written.
                self.end_overflow(true, before);
                return added;
            }
            // An append raced: scan again.
        }
    }

    /// Sets the membership bits of the blocks whose candidates sit at
    /// positions `from..to` and are current (their block's stamp is the
    /// candidate's): those the refill's scan passes over.
    fn mark(&self, from: u64, to: u64) {
        let cap = self.candidates.len();
        let mut slot = self.slot(from);
        for _ in from..to {
            // Relaxed: written before the Release that published `len`,
            // which the refill acquired.
            let word = self.candidates[slot].load(Ordering::Relaxed);
            slot = if slot + 1 == cap { 0 } else { slot + 1 };
            let id = self.id_of(word);
            let (word_index, bit) = (id.index() / 64, 1u64 << (id.index() % 64));
            // Relaxed (all): the map is the refiller's alone (under the
            // refill flag, whose Acquire and Release order it between
            // refillers).
            let cell = &self.in_ring[word_index];
            if self.stamped(id, self.stamp_of(word)) {
                cell.store(cell.load(Ordering::Relaxed) | bit, Ordering::Relaxed);
            }
        }
    }

    /// Clears every membership bit: the whole map, not the bits of the
    /// candidates that [`mark`](Self::mark) read, because an append that
    /// read an old length may have rewritten those slots since (its CAS
    /// then fails), and a bit left set would hide its block from every
    /// later scan. A store a word: a sixty-fourth of a scan's loads.
    fn unmark_all(&self) {
        for cell in self.in_ring.iter() {
            // Relaxed: see `mark`.
            cell.store(0, Ordering::Relaxed);
        }
    }

    /// Whether block `index` is marked as having a current candidate.
    fn marked(&self, index: usize) -> bool {
        // Relaxed: see `mark`.
        self.in_ring[index / 64].load(Ordering::Relaxed) & (1 << (index % 64)) != 0
    }

    /// Writes the oldest evictable unmarked blocks, up to `room` of them,
    /// oldest first, into the slots of positions `base..`, calling
    /// `publish(written)` after the first nonempty bucket, after each
    /// bucket that brings `written` to at least twice its last publish, and
    /// at the end (it stops early when that returns `false`); returns how
    /// many it wrote and how many it *missed*: evictable unmarked blocks
    /// that its placing pass saw and did not write (they did not fit, or a
    /// block that became evictable since the histogram took their place).
    /// No evictor reads those slots before they are published (see
    /// `refill`).
    ///
    /// Blocks are ranked by their stamps' signed distance from the clock
    /// read at the start, so that a block stamped while the scan runs ranks
    /// youngest. Passes over the blocks: one for the range of ranks; then a
    /// histogram of [`BUCKETS`] buckets over the range, whose oldest
    /// buckets that fit the room together are kept (if even the oldest
    /// bucket alone does not fit, the range narrows to it and the
    /// histogram is taken again); and one that places the kept blocks,
    /// each bucket in a range of its own. Each bucket is then closed up (a
    /// block that stopped being evictable between the passes leaves a gap),
    /// sorted in place, and published as above. A block that became
    /// evictable between the passes may be ranked by its old stamp (its new
    /// one is written after its drop) and fill a place in a bucket that the
    /// histogram counted for another block: that block is missed, and so is
    /// every block outside the kept buckets.
    fn fill(
        &self,
        refs: &Refs,
        base: u64,
        room: usize,
        mut publish: impl FnMut(usize) -> bool,
    ) -> (usize, usize) {
        let cap = self.candidates.len();
        let room = room.min(cap);
        // Relaxed: a snapshot; ranks are measured from it.
        let now = self.clock.load(Ordering::Relaxed);
        // The stamp and rank of block `index`, if it is evictable and has
        // no current candidate; older blocks rank lower.
        let ranked = |index: usize| {
            // Relaxed (both): a scan for hints; the eviction CAS and the
            // stamp check re-check.
            if !refs.may_evict(refs.state(index, Ordering::Relaxed)) || self.marked(index) {
                return None;
            }
            let stamp = self.stamps[index].load(Ordering::Relaxed);
            Some((stamp, stamp.wrapping_sub(now) as i64))
        };
        let (mut seen, mut lo, mut hi) = (0usize, i64::MAX, i64::MIN);
        for index in 0..refs.len() {
            if let Some((_, rank)) = ranked(index) {
                seen += 1;
                lo = lo.min(rank);
                hi = hi.max(rank);
            }
        }
        if seen == 0 || room == 0 {
            return (0, seen);
        }
        // loom's `fill_counts_first_pass` control: the first pass's count
        // against the room, whatever the placing pass finds.
        let first_missed = seen.saturating_sub(room);
        // Bucket `b` holds the ranks `r` in `lo..=hi` with
        // `(r - lo) * BUCKETS / width == b`, `width` the power of two at or
        // above the range's (shifts, where any width would divide). Ranks
        // span less than 2^63: stamps count releases from 0.
        let mut counts = [0u32; BUCKETS];
        let mut width;
        // The buckets that hold kept blocks: `counts[..used]`.
        let mut used = BUCKETS;
        loop {
            width = ((hi - lo + 1) as u64).next_power_of_two();
            let shift = width.trailing_zeros();
            let bucket = |rank: i64| bucket_of((rank - lo) as u64, shift);
            counts.fill(0);
            for index in 0..refs.len() {
                if let Some((_, rank)) = ranked(index) {
                    if (lo..=hi).contains(&rank) {
                        counts[bucket(rank)] += 1;
                    }
                }
            }
            let (mut total, mut fit) = (0usize, 0);
            while fit < BUCKETS && total + counts[fit] as usize <= room {
                total += counts[fit] as usize;
                fit += 1;
            }
            if fit == BUCKETS {
                break;
            }
            // The top rank of bucket `b`: the largest `r` with
            // `(r - lo) * BUCKETS < (b + 1) * width`.
            let top = |b: usize| {
                lo + (((b + 1) as u128 * u128::from(width) - 1) / BUCKETS as u128) as i64
            };
            if fit > 0 {
                // The oldest `fit` buckets fit the room together: they are
                // placed on this pass's grid (ranks up to the top of the
                // last one), with no pass to refine it.
                hi = top(fit - 1);
                counts[fit..].fill(0);
                used = fit;
                break;
            } else if width > 1 {
                // Even the oldest bucket alone overfills the room.
                hi = top(0);
            } else {
                // One rank with more blocks than room (stamps repeat only
                // in races): take what fits.
                counts[0] = room as u32;
                used = 1;
                break;
            }
        }
        let shift = width.trailing_zeros();
        let bucket = |rank: i64| bucket_of((rank - lo) as u64, shift);
        // Each kept bucket's range: `ends[b]` is its end; `counts[b]`
        // becomes its cursor, from its start.
        let mut ends = [0u32; BUCKETS];
        let mut end = 0u32;
        for (count, bucket_end) in counts[..used].iter_mut().zip(ends.iter_mut()) {
            let start = end;
            end += *count;
            *bucket_end = end;
            *count = start;
        }
        // The slot of the `i`-th position from `base` (`i < cap`), without
        // a division.
        let first = self.slot(base);
        let at = |i: usize| {
            let slot = first + i;
            if slot >= cap {
                slot - cap
            } else {
                slot
            }
        };
        // Relaxed (both): the entries are hints, published by `publish`'s
        // Release.
        let get = |i: usize| self.candidates[at(i)].load(Ordering::Relaxed);
        let set = |i: usize, word: u64| self.candidates[at(i)].store(word, Ordering::Relaxed);
        // What the placing pass sees: each block it writes is one of them.
        let mut placing_seen = 0usize;
        for index in 0..refs.len() {
            let Some((stamp, rank)) = ranked(index) else {
                continue;
            };
            placing_seen += 1;
            if !(lo..=hi).contains(&rank) {
                continue;
            }
            let b = bucket(rank);
            if counts[b] < ends[b] {
                set(
                    counts[b] as usize,
                    self.word(BlockId::new(index as u32), stamp),
                );
                counts[b] += 1;
            }
        }
        // The lowest rank of bucket `b`: the smallest `r` with
        // `(r - lo) * BUCKETS >= b * width`.
        let bottom =
            |b: usize| lo + ((b as u128 * u128::from(width)).div_ceil(BUCKETS as u128)) as i64;
        // A bucket's ranks span at most `width / BUCKETS` (rounded up). Its
        // words' stamps (their low `64 - id_bits` bits, at least 32),
        // measured from the stamp of its lowest rank, rank them exactly
        // when that span is at most 2^(64 - id_bits); a wider bucket
        // (evictable blocks released over 2^42 stamps apart, in the largest
        // pools) ranks them by their blocks' whole stamps, read again (a
        // block restamped since the placing pass has a stale word, whatever
        // its place).
        let narrow = width.div_ceil(BUCKETS as u64) <= (u64::MAX >> self.id_bits) + 1;
        let missed = |written: usize| {
            if self.faults.fill_counts_first_pass() {
                first_missed
            } else {
                placing_seen - written
            }
        };
        let (mut written, mut published) = (0usize, 0usize);
        for b in 0..used {
            let start = if b == 0 { 0 } else { ends[b - 1] as usize };
            let filled = counts[b] as usize - start;
            if filled == 0 {
                continue;
            }
            if start != written {
                for i in 0..filled {
                    set(written + i, get(start + i));
                }
            }
            let from = self.low(now.wrapping_add(bottom(b) as u64));
            let rank_of = |word: u64| {
                if narrow {
                    self.low(self.stamp_of(word).wrapping_sub(from)) as i64
                } else {
                    // Relaxed: as in `ranked`.
                    let stamp = self.stamps[self.id_of(word).index()].load(Ordering::Relaxed);
                    stamp.wrapping_sub(now) as i64
                }
            };
            sort(written, filled, &get, &set, &rank_of);
            written += filled;
            // The first nonempty bucket at once, then whenever the entries
            // sorted since the last publish at least match those published:
            // a publish for every doubling.
            if written >= 2 * published {
                if !publish(written) {
                    return (written, missed(written));
                }
                published = written;
            }
        }
        if written > published && !publish(written) {
            return (written, missed(written));
        }
        (written, missed(written))
    }
}

/// The bucket of a rank `d` above the lowest, in a range of ranks `2^shift`
/// wide (`d < 2^shift`): `d * BUCKETS / 2^shift`.
fn bucket_of(d: u64, shift: u32) -> usize {
    if shift >= BUCKET_BITS {
        (d >> (shift - BUCKET_BITS)) as usize
    } else {
        (d << (BUCKET_BITS - shift)) as usize
    }
}

/// Sorts the `n` words at positions `from..from + n` (read with `get`,
/// written with `set`) by `rank`, lowest first: by insertion if they are
/// few, else by a heap sort. In place: no allocation.
fn sort(
    from: usize,
    n: usize,
    get: &impl Fn(usize) -> u64,
    set: &impl Fn(usize, u64),
    rank: &impl Fn(u64) -> i64,
) {
    if n <= INSERTION_SORT {
        for i in 1..n {
            let word = get(from + i);
            let r = rank(word);
            let mut j = i;
            while j > 0 {
                let before = get(from + j - 1);
                if rank(before) <= r {
                    break;
                }
                set(from + j, before);
                j -= 1;
            }
            set(from + j, word);
        }
        return;
    }
    // A max-heap by rank over `from..from + len`; each sift moves a hole
    // rather than swapping.
    let sift_down = |mut i: usize, word: u64, len: usize| {
        let r = rank(word);
        loop {
            let l = 2 * i + 1;
            if l >= len {
                break;
            }
            let (mut c, mut child) = (l, get(from + l));
            if l + 1 < len {
                let right = get(from + l + 1);
                if rank(right) > rank(child) {
                    (c, child) = (l + 1, right);
                }
            }
            if rank(child) <= r {
                break;
            }
            set(from + i, child);
            i = c;
        }
        set(from + i, word);
    };
    for i in (0..n / 2).rev() {
        sift_down(i, get(from + i), n);
    }
    // The highest rank goes to the back, so the lowest ends first.
    for end in (1..n).rev() {
        let (root, last) = (get(from), get(from + end));
        set(from + end, root);
        sift_down(0, last, end);
    }
}

#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::hash::BlockHash;
    use crate::pool::BlockPool;
    use crate::sequence::Sequence;

    /// Key `i`: the one block `i` holds in [`evictable_pool`].
    fn key(i: usize) -> BlockHash {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&(i as u64).to_le_bytes());
        key[8] = 1;
        BlockHash(key)
    }

    /// A pool of `n` blocks of one token, every block cached (key `i` on
    /// block `i`) and evictable.
    fn evictable_pool(n: usize) -> Arc<BlockPool> {
        let pool = Arc::new(BlockPool::new(n, 1));
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(n).unwrap();
        let keys: Vec<BlockHash> = seq.blocks().iter().map(|id| key(id.index())).collect();
        assert_eq!(seq.publish(&keys), n);
        drop(seq);
        assert_eq!(pool.evictable_blocks(), n);
        pool
    }

    fn lru(pool: &BlockPool) -> &Lru {
        &pool.prefix.as_deref().unwrap().lru
    }

    /// Gives the pool's blocks `stamps` and sets the clock to `now`. (The
    /// tests run on one thread: every `Relaxed` access here is ordered by
    /// the program's order alone.)
    fn restamp(pool: &BlockPool, stamps: &[u64], now: u64) {
        let lru = lru(pool);
        for (i, &s) in stamps.iter().enumerate() {
            lru.stamps[i].store(s, Ordering::Relaxed);
        }
        lru.clock.store(now, Ordering::Relaxed);
    }

    /// Runs a fill of `room` at position `base`; returns the words written
    /// (in ring order), how many it missed, and the counts it published.
    fn fill(pool: &BlockPool, base: u64, room: usize) -> (Vec<u64>, usize, Vec<usize>) {
        let lru = lru(pool);
        let mut published = Vec::new();
        let (written, missed) = lru.fill(&pool.refs, base, room, |w| {
            published.push(w);
            true
        });
        let words = (0..written as u64)
            .map(|i| lru.candidates[lru.slot(base + i)].load(Ordering::Relaxed))
            .collect();
        (words, missed, published)
    }

    /// What a fill must write: the unmarked evictable blocks ranked by
    /// their stamps' signed distance from `now`, oldest first, as many as
    /// fit in `room`. Ties (equal stamps) may come in any order, so each
    /// is compared as a stamp.
    fn expected(stamps: &[u64], now: u64, room: usize, skip: &[usize]) -> Vec<u64> {
        let mut ranked: Vec<(i64, u64)> = stamps
            .iter()
            .enumerate()
            .filter(|(i, _)| !skip.contains(i))
            .map(|(_, &s)| (s.wrapping_sub(now) as i64, s))
            .collect();
        ranked.sort();
        ranked.into_iter().take(room).map(|(_, s)| s).collect()
    }

    fn splitmix(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Checks a fill against [`expected`]: blocks of the same stamps in
    /// the same order, each word naming its block's stamp, published in
    /// growing counts up to all of them.
    fn check_fill(pool: &BlockPool, stamps: &[u64], now: u64, room: usize, what: &str) {
        restamp(pool, stamps, now);
        let base = 5 * stamps.len() as u64 + 3;
        let (words, missed, published) = fill(pool, base, room);
        assert_eq!(missed, stamps.len() - words.len(), "{what}");
        let got: Vec<u64> = words
            .iter()
            .map(|&w| stamps[lru(pool).id_of(w).index()])
            .collect();
        let want = expected(stamps, now, room, &[]);
        if got.len() < want.len() {
            // Whole buckets only: what was written is the oldest of them.
            assert!(!got.is_empty() || room == 0, "{what}: nothing written");
            assert_eq!(got, want[..got.len()], "{what}");
        } else {
            assert_eq!(got, want, "{what}");
        }
        check_words(pool, stamps, &words, &published, what);
    }

    /// Checks what a fill wrote: each word names a block with that stamp
    /// (the low bits a word holds), no block twice, published in growing
    /// counts up to all of them.
    fn check_words(
        pool: &BlockPool,
        stamps: &[u64],
        words: &[u64],
        published: &[usize],
        what: &str,
    ) {
        let lru = lru(pool);
        for &w in words {
            assert_eq!(
                lru.low(stamps[lru.id_of(w).index()]),
                lru.stamp_of(w),
                "{what}: word of another block"
            );
        }
        let mut ids: Vec<usize> = words.iter().map(|&w| lru.id_of(w).index()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), words.len(), "{what}: a block written twice");
        assert!(
            published.windows(2).all(|w| w[0] < w[1]),
            "{what}: {published:?}"
        );
        assert_eq!(
            published.last().copied().unwrap_or(0),
            words.len(),
            "{what}"
        );
    }

    #[test]
    fn a_fill_writes_the_oldest_blocks_in_order() {
        let n = 3000;
        let pool = evictable_pool(n);
        let mut state = 7;
        // Distinct stamps in random order, all before `now`.
        let mut stamps: Vec<u64> = (0..n as u64).map(|s| s * 3 + 11).collect();
        for i in (1..n).rev() {
            let j = (splitmix(&mut state) % (i as u64 + 1)) as usize;
            stamps.swap(i, j);
        }
        let now = 3 * n as u64 + 20;
        for room in [1, 2, 17, 64, 1000, 1499, 1500, 2999, 3000] {
            check_fill(
                &pool,
                &stamps,
                now,
                room.min(lru(&pool).candidates.len()),
                "shuffled",
            );
        }
        // Stamps far apart: over 2^31 (32-bit distances would wrap),
        // buckets over 2^32 wide (the words' 32-bit stamps cannot rank
        // them), and clocks past 2^32.
        for (shift, offset) in [(20, 0), (21, 1 << 40), (33, 0), (40, 5)] {
            let far: Vec<u64> = stamps.iter().map(|s| (s << shift) + offset).collect();
            for room in [700, 3000] {
                check_fill(&pool, &far, (now << shift) + offset, room, "far apart");
            }
        }
        // Stamps taken while the scan runs (ahead of its clock) rank
        // youngest, not oldest.
        let mut ahead = stamps.clone();
        for s in ahead.iter_mut().take(100) {
            *s = now + 1 + *s % 50;
        }
        restamp(&pool, &ahead, now);
        let (words, _, _) = fill(&pool, 0, 1400);
        assert!(
            words.iter().all(|&w| lru(&pool).id_of(w).index() >= 100),
            "a block stamped after the scan's clock read ranks youngest"
        );
        check_fill(&pool, &ahead, now, 1500, "stamps ahead of the clock");
    }

    /// A block released 2^31 stamps before the others is still the
    /// oldest: after a churn that emptied and overflowed the ring, the
    /// next eviction's refill ranks it first. (With 32-bit stamps it
    /// ranked youngest.)
    #[test]
    fn a_block_released_over_2_pow_31_stamps_ago_is_evicted_first() {
        let n = 64;
        let pool = evictable_pool(n);
        let lru = lru(&pool);
        let young = (1u64 << 31) + 10;
        // One thread: `Relaxed` ordered by the program, as in `restamp`.
        for i in 0..n {
            let stamp = if i == 0 { 3 } else { young + i as u64 };
            lru.stamps[i].store(stamp as _, Ordering::Relaxed);
        }
        lru.clock.store((young + n as u64) as _, Ordering::Relaxed);
        // The ring run dry and overflowed: every evictable block is
        // ranked by the refill of the next eviction.
        let len = lru.len.load(Ordering::Relaxed);
        lru.next.next.store(len, Ordering::Relaxed);
        lru.overflow.fetch_or(OVERFLOWED, Ordering::Relaxed);
        let mut ids = Vec::new();
        pool.try_alloc(1, &mut ids).unwrap();
        let mut seq = Sequence::new(Arc::clone(&pool));
        assert_eq!(seq.try_match_prefix(&[key(0)]), 0, "block 0 evicted");
        assert_eq!(seq.try_match_prefix(&[key(1)]), 1, "block 1 kept");
        drop(seq);
        pool.free(&ids).unwrap();
    }

    #[test]
    fn a_fill_copes_with_skewed_and_repeated_stamps() {
        let n = 2000;
        let pool = evictable_pool(n);
        let cap = lru(&pool).candidates.len();
        let now = 2_000_000_000u64;
        // One block far older than the rest, which sit in a narrow range:
        // nearly all in one bucket of the first histogram.
        let mut skewed: Vec<u64> = (0..n as u64).map(|i| now - 10_000 + i * 3).collect();
        skewed[1234] = 5;
        for room in [1, 2, 300, cap] {
            check_fill(&pool, &skewed, now, room, "one outlier");
        }
        // The old half in one narrow range, the young half spread: the
        // oldest bucket alone overfills a small room (narrowed).
        let clustered: Vec<u64> = (0..n as u64)
            .map(|i| {
                if i % 2 == 0 {
                    1000 + i / 2
                } else {
                    1_000_000 + i * 997
                }
            })
            .collect();
        for room in [10, 999, 1000, 1001] {
            check_fill(&pool, &clustered, now, room, "clustered");
        }
        // Every stamp equal (only races repeat stamps): a room's worth.
        let same = vec![now - 1; n];
        restamp(&pool, &same, now);
        let (words, missed, _) = fill(&pool, 0, 300);
        assert_eq!((words.len(), missed), (300, n - 300));
        // Few blocks, wide range.
        let mut sparse = vec![0u64; n];
        for (i, s) in sparse.iter_mut().enumerate() {
            *s = (i as u32).wrapping_mul(2_654_435_761) as u64 % 1_000_000_000;
        }
        check_fill(&pool, &sparse, now, cap, "wide range");
    }

    #[test]
    fn a_fill_passes_over_marked_and_unevictable_blocks() {
        let n = 500;
        let pool = evictable_pool(n);
        let stamps: Vec<u64> = (0..n as u64).rev().collect();
        restamp(&pool, &stamps, n as u64);
        let lru = lru(&pool);
        // Candidates for blocks 400..500 (the oldest), current, at
        // positions 0..100; and one for block 399 with a stale stamp.
        for (p, i) in (400..500).enumerate() {
            let word = lru.word(BlockId::new(i as u32), stamps[i]);
            lru.candidates[p].store(word, Ordering::Relaxed);
        }
        let stale = lru.word(BlockId::new(399), stamps[399] + 7);
        lru.candidates[100].store(stale, Ordering::Relaxed);
        lru.mark(0, 101);
        assert!((400..500).all(|i| lru.marked(i)) && !lru.marked(399));
        // Block 398 is held: not evictable.
        let mut held = Sequence::new(Arc::clone(&pool));
        assert_eq!(held.try_match_prefix(&[key(398)]), 1);
        let (words, missed, _) = fill(&pool, 101, 50);
        let ids: Vec<usize> = words.iter().map(|&w| lru.id_of(w).index()).collect();
        // Block 399 (its candidate is stale), then the oldest unmarked.
        let want: Vec<usize> = std::iter::once(399).chain((349..398).rev()).collect();
        assert_eq!(ids, want);
        assert_eq!(missed, n - 100 - 1 - 50);
        // An append that read an old length rewrote a marked candidate's
        // slot during the scan (its CAS then failed): the bit of the block
        // it displaced is cleared all the same. (Relaxed: one thread, as in
        // `restamp`.)
        lru.candidates[7].store(lru.word(BlockId::new(3), 9), Ordering::Relaxed);
        lru.unmark_all();
        assert!((0..n).all(|i| !lru.marked(i)));
        drop(held);
    }

    #[test]
    fn a_fill_stops_when_publishing_fails() {
        let n = 4000;
        let pool = evictable_pool(n);
        let stamps: Vec<u64> = (0..n as u64).collect();
        restamp(&pool, &stamps, n as u64);
        let mut calls = 0;
        let (written, missed) = lru(&pool).fill(&pool.refs, 0, 1000, |_| {
            calls += 1;
            calls < 3
        });
        assert_eq!((calls, missed), (3, n - written));
        assert!(written < 1000, "{written}");
    }

    #[test]
    fn a_pop_copies_before_it_claims_and_counts_positions() {
        let pool = evictable_pool(8);
        let stamps: Vec<u64> = (100..108).collect();
        restamp(&pool, &stamps, 108);
        let lru = lru(&pool);
        // Ring positions 76..84 (slots wrap at 10): blocks 0..8.
        let cap = lru.candidates.len() as u64;
        assert_eq!(cap, 10);
        for i in 0..8u64 {
            let word = lru.word(BlockId::new(i as u32), 100 + i);
            lru.candidates[lru.slot(76 + i)].store(word, Ordering::Relaxed);
        }
        lru.next.next.store(76, Ordering::Relaxed);
        lru.len.store(84, Ordering::Relaxed);
        let mut batch = [0u64; POP_BATCH];
        assert_eq!(lru.pop(3, &mut batch), 3);
        assert_eq!(
            batch[..3]
                .iter()
                .map(|&w| lru.id_of(w).index())
                .collect::<Vec<_>>(),
            [0, 1, 2]
        );
        // The head's stamp: the last block's (2's) whole stamp.
        assert_eq!(lru.next.stamp.load(Ordering::Relaxed), 102);
        assert_eq!(lru.pop(100, &mut batch), 5);
        assert_eq!(lru.id_of(batch[4]).index(), 7);
        assert_eq!(lru.pop(1, &mut batch), 0);
        assert_eq!(lru.next.next.load(Ordering::Relaxed), 84);
    }

    /// Marks exactly the blocks of `skip` in the membership map (as a
    /// refill marks the blocks of the candidates left), clearing the rest.
    fn mark_only(pool: &BlockPool, skip: &[usize]) {
        let lru = lru(pool);
        // Relaxed (all, test code): the map is the refiller's alone, and
        // no refill runs here.
        for cell in lru.in_ring.iter() {
            cell.store(0, Ordering::Relaxed);
        }
        for &i in skip {
            let cell = &lru.in_ring[i / 64];
            cell.store(
                cell.load(Ordering::Relaxed) | 1 << (i % 64),
                Ordering::Relaxed,
            );
        }
    }

    /// A fill of `room` against the naive selection (every unmarked block
    /// ranked, sorted, the first `room` taken): what it writes is a
    /// nonempty prefix of it when anything is eligible and there is room,
    /// all of it when it all fits, and never splits a rank between the
    /// written and the left out except for a single rank that overfills
    /// the room; each block once, with its own stamp; published in growing
    /// counts up to everything written; the eligible blocks not written
    /// are missed.
    fn check_against_naive(
        pool: &BlockPool,
        stamps: &[u64],
        now: u64,
        room: usize,
        skip: &[usize],
        what: &str,
    ) {
        restamp(pool, stamps, now);
        mark_only(pool, skip);
        let base = 7 * stamps.len() as u64 + 5;
        let (words, missed, published) = fill(pool, base, room);
        let eligible = stamps.len() - skip.len();
        assert_eq!(missed, eligible - words.len(), "{what}: missed");
        let mut marked = vec![false; stamps.len()];
        for &i in skip {
            marked[i] = true;
        }
        let mut want: Vec<(i64, u64)> = (0..stamps.len())
            .filter(|&i| !marked[i])
            .map(|i| (stamps[i].wrapping_sub(now) as i64, stamps[i]))
            .collect();
        want.sort_unstable();
        let want: Vec<u64> = want.into_iter().map(|(_, s)| s).collect();
        let got: Vec<u64> = words
            .iter()
            .map(|&w| stamps[lru(pool).id_of(w).index()])
            .collect();
        let room = room.min(lru(pool).candidates.len());
        assert!(
            got.len() <= room,
            "{what}: {} written, room {room}",
            got.len()
        );
        assert_eq!(got, want[..got.len()], "{what}: not the oldest, in order");
        if eligible <= room {
            assert_eq!(got.len(), eligible, "{what}: everything fit");
        } else if room > 0 {
            assert!(!got.is_empty(), "{what}: nothing written");
            // Whole ranks only, unless one rank alone overfills the room.
            let last = got.len() - 1;
            let rank = |s: u64| s.wrapping_sub(now) as i64;
            if got.len() < want.len() && rank(want[last + 1]) == rank(want[last]) {
                let tied = want
                    .iter()
                    .filter(|&&s| rank(s) == rank(want[last]))
                    .count();
                assert!(
                    tied > room && got.iter().all(|&s| rank(s) == rank(want[last])),
                    "{what}: a rank split at the room's edge"
                );
            }
        } else {
            assert!(got.is_empty(), "{what}: room 0");
        }
        for &w in &words {
            assert!(
                !marked[lru(pool).id_of(w).index()],
                "{what}: a marked block written"
            );
        }
        check_words(pool, stamps, &words, &published, what);
        mark_only(pool, &[]);
    }

    /// Ranks for `n` blocks: `lo` and `lo + width - 1` present, the rest
    /// drawn by `shape` (0 spread, 1 a cluster at the bottom, 2 nested
    /// clusters that take several narrowing rounds, 3 few distinct ranks,
    /// 4 a cluster at the top).
    fn ranks(n: usize, lo: i64, width: u64, shape: u64, state: &mut u64) -> Vec<i64> {
        let top = lo + width as i64 - 1;
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let r = match i {
                0 => lo,
                1 => top,
                _ => {
                    let x = splitmix(state);
                    let off = match shape {
                        0 => x % width,
                        1 => {
                            if x % 3 == 0 {
                                x % width
                            } else {
                                (x >> 8) % (width / 4096).max(1)
                            }
                        }
                        2 => {
                            // Half within width/1024, a quarter within
                            // width/2^20, an eighth within width/2^30...
                            let level = (x % 4) as u32;
                            let span = (width >> (10 * level)).max(1);
                            (x >> 8) % span
                        }
                        3 => ((x >> 8) % 5) * (width / 5),
                        _ => width - 1 - (x >> 8) % (width / 4096).max(1),
                    };
                    lo + off.min(width - 1) as i64
                }
            };
            out.push(r);
        }
        out
    }

    #[test]
    fn a_fill_agrees_with_the_naive_selection_on_every_range() {
        let n = 600;
        let pool = evictable_pool(n);
        let cap = lru(&pool).candidates.len();
        let mut state = 0x5eed;
        // Ranks from 2^50 stamps before the clock to 2^20 after it.
        let min = -(1i64 << 50);
        let max = 1i64 << 20;
        let mut widths: Vec<u64> = vec![1, 2, 3, 4, 5, 7, 8, 9, 1000];
        for k in [10u32, 11, 12, 16, 20, 21, 30, 31, 32, 33, 42, 43, 50] {
            let p = 1u64 << k;
            widths.extend([p - 1, p, p + 1]);
        }
        widths.retain(|w| (1..=1 << 50).contains(w));
        let mut cases = 0;
        for &width in &widths {
            // Where the range sits: oldest possible, before the clock,
            // around it (some blocks stamped after it), after it, youngest
            // possible.
            let span = width as i64;
            let los = [
                min,
                -span,
                -span / 2,
                0,
                1,
                max - span + 1,
                // Anywhere the range fits.
                min + (splitmix(&mut state) % (max - span + 2 - min) as u64) as i64,
            ];
            for lo in los {
                if lo < min || lo + span - 1 > max {
                    continue;
                }
                for shape in 0..5 {
                    // A clock past 2^51, so that every stamp is positive.
                    let now = (1u64 << 51) + splitmix(&mut state) % (1 << 60);
                    let mut r = ranks(n, lo, width, shape, &mut state);
                    // Shuffle which block gets which rank.
                    for i in (1..n).rev() {
                        let j = (splitmix(&mut state) % (i as u64 + 1)) as usize;
                        r.swap(i, j);
                    }
                    let stamps: Vec<u64> = r.iter().map(|&x| now.wrapping_add(x as u64)).collect();
                    // Some blocks marked (their candidates in the ring), so
                    // that the eligible count varies around the room.
                    let marked = (splitmix(&mut state) % (n as u64 / 2 + 40)) as usize;
                    let mut skip: Vec<usize> = (0..n).collect();
                    for i in (1..n).rev() {
                        let j = (splitmix(&mut state) % (i as u64 + 1)) as usize;
                        skip.swap(i, j);
                    }
                    skip.truncate(marked);
                    let eligible = n - marked;
                    let x = splitmix(&mut state) as usize;
                    for room in [
                        0,
                        1,
                        2,
                        eligible.saturating_sub(1),
                        eligible,
                        eligible + 1,
                        cap - 1,
                        cap,
                        1 + x % cap,
                    ] {
                        let room = room.min(cap);
                        let what = format!(
                            "width {width} lo {lo} shape {shape} now {now} room {room} eligible {eligible}"
                        );
                        check_against_naive(&pool, &stamps, now, room, &skip, &what);
                        cases += 1;
                    }
                }
            }
        }
        assert!(cases > 1000, "{cases}");
    }

    /// Stamps for the blocks of a pool of 300, on a clock of 2^62: around a
    /// few centres up to 2^56 stamps before it or after it, each spread
    /// over its own width (one rank to 2^52), so that ranks repeat, sit
    /// after the clock, lie over 2^32 apart and cluster in the oldest
    /// bucket.
    fn clustered_stamps() -> impl proptest::strategy::Strategy<Value = Vec<u64>> {
        use proptest::prelude::*;
        let centres =
            (0u64..1 << 57, 0u32..=52).prop_map(|(c, log)| ((1 << 62) - (1 << 56) + c, log));
        prop::collection::vec(centres, 1..=4).prop_flat_map(|centres| {
            let centres = std::sync::Arc::new(centres);
            prop::collection::vec((any::<prop::sample::Index>(), any::<u64>()), 300).prop_map(
                move |picks| {
                    picks
                        .into_iter()
                        .map(|(i, x)| {
                            let (centre, log) = *i.get(&centres);
                            centre + x % (1u64 << log)
                        })
                        .collect()
                },
            )
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(400))]

        /// Any stamps, clock, room and marked blocks: the fill agrees with
        /// the naive selection (see [`check_against_naive`]).
        #[test]
        fn a_fill_agrees_with_the_naive_selection_on_any_stamps(
            stamps in clustered_stamps(),
            now in (1u64 << 62) - 1000..(1 << 62) + 1000,
            room in 0usize..=150,
            marked in proptest::collection::btree_set(0usize..300, 0..=200),
        ) {
            thread_local! {
                static POOL: Arc<BlockPool> = evictable_pool(300);
            }
            let skip: Vec<usize> = marked.into_iter().collect();
            POOL.with(|pool| {
                check_against_naive(pool, &stamps, now, room, &skip, &format!("now {now} room {room}"));
            });
        }
    }

    /// Eviction in exact least-recently-released order on one thread, with
    /// stamps far apart (over 2^31, 2^32 and 2^42), taken by the sweeps and
    /// through candidates whose stamps' low 32 bits recur.
    mod far_stamps {
        use super::*;

        /// Empties the ring and marks it overflowed, as after a churn: the
        /// next eviction's refill ranks every evictable block. (One thread:
        /// `Relaxed` ordered by the program.)
        fn empty_and_overflow(pool: &BlockPool) {
            let lru = lru(pool);
            let len = lru.len.load(Ordering::Relaxed);
            lru.next.next.store(len, Ordering::Relaxed);
            lru.overflow.fetch_or(OVERFLOWED, Ordering::Relaxed);
        }

        /// Evicts every block, one allocation at a time; returns the ids in
        /// eviction order.
        fn evict_all(pool: &BlockPool, n: usize) -> Vec<usize> {
            let mut order = Vec::new();
            let mut held = Vec::new();
            for _ in 0..n {
                let mut ids = Vec::new();
                pool.try_alloc(1, &mut ids).unwrap();
                assert_eq!(ids.len(), 1);
                order.push(ids[0].index());
                held.extend(ids);
            }
            pool.free(&held).unwrap();
            order
        }

        fn check_exact_order(stamps: &[u64], now: u64, what: &str) {
            let n = stamps.len();
            let pool = evictable_pool(n);
            restamp(&pool, stamps, now);
            empty_and_overflow(&pool);
            let order = evict_all(&pool, n);
            let got: Vec<u64> = order.iter().map(|&i| stamps[i]).collect();
            let mut want = stamps.to_vec();
            want.sort_unstable();
            assert_eq!(got, want, "{what}: eviction order");
        }

        /// One thread: exact LRU order with stamps spanning over 2^32 and
        /// over 2^42 (buckets wider than 2^32), distinct stamps, some
        /// sharing their low 32 bits.
        #[test]
        fn pool_evicts_in_exact_lru_order_far_stamps() {
            let n = 512;
            let mut state = 5;
            let mut perm: Vec<u64> = (0..n as u64).collect();
            for i in (1..n).rev() {
                let j = (splitmix(&mut state) % (i as u64 + 1)) as usize;
                perm.swap(i, j);
            }
            for (gap, what) in [
                ((1u64 << 32) + 1, "span > 2^32"),
                (1u64 << 32, "gaps of exactly 2^32 (same low bits)"),
                ((1u64 << 33) + 3, "span > 2^41"),
                ((1u64 << 40) + 17, "span > 2^48, buckets > 2^32"),
                ((1u64 << 45) + 1, "span > 2^53"),
            ] {
                let base = 1u64 << 20;
                let stamps: Vec<u64> = perm.iter().map(|&p| base + p * gap).collect();
                let now = base + n as u64 * gap;
                check_exact_order(&stamps, now, what);
            }
            // Clusters: dense runs far apart (2^43), and within each run
            // stamps spread over 2^33 (one wide bucket holds many).
            let stamps: Vec<u64> = (0..n as u64)
                .map(|i| {
                    let p = perm[i as usize];
                    (1 << 30) + (p % 4) * (1 << 43) + (p / 4) * ((1 << 33) / 128 + 1)
                })
                .collect();
            let now = *stamps.iter().max().unwrap() + 1;
            check_exact_order(&stamps, now, "clusters");
            // One outlier 2^60 before the rest.
            let mut stamps: Vec<u64> = (0..n as u64)
                .map(|i| (1 << 61) + perm[i as usize])
                .collect();
            stamps[100] = (1 << 61) - (1 << 60);
            check_exact_order(&stamps, (1 << 61) + n as u64, "outlier 2^60");
        }

        /// Stamps taken by real releases, the clock jumped by a far
        /// distance between them (as other releases would), and a ring
        /// overflowed by revivals: eviction in release order.
        #[test]
        fn pool_evicts_in_release_order_after_far_clock_jumps() {
            for jump in [
                (1u64 << 31) + 1,
                (1u64 << 32) + 1000,
                (1u64 << 33) + 1,
                (1 << 42) + 7,
                1 << 43,
            ] {
                let n = 64;
                let pool = evictable_pool(n);
                let lru = lru(&pool);
                let mut state = jump;
                let mut order: Vec<usize> = (0..n).collect();
                for i in (1..n).rev() {
                    let j = (splitmix(&mut state) % (i as u64 + 1)) as usize;
                    order.swap(i, j);
                }
                // Revive and release each block in `order`, jumping the
                // clock before each: the ring (cap 80) overflows.
                for &b in &order {
                    lru.clock.fetch_add(jump, Ordering::Relaxed);
                    let mut seq = Sequence::new(Arc::clone(&pool));
                    assert_eq!(seq.try_match_prefix(&[key(b)]), 1);
                    drop(seq);
                }
                let got = evict_all(&pool, n);
                assert_eq!(got, order, "jump {jump}");
            }
        }

        /// The sweep (an evictor's fallback while another refills) ranks
        /// blocks by their whole stamps: a block released over 2^31 stamps
        /// before the head is the oldest, and the first pass takes it.
        #[test]
        fn a_sweep_takes_a_block_over_2_pow_31_older_than_the_head_first() {
            for (age, what) in [
                (1u64 << 20, "2^20 older"),
                ((1u64 << 31) + 5, "2^31 + 5 older"),
            ] {
                let n = 64;
                let pool = evictable_pool(n);
                let lru = lru(&pool);
                let head = 1u64 << 40;
                let mut stamps: Vec<u64> = (0..n as u64).map(|i| head + 1000 + i).collect();
                stamps[10] = head - age;
                restamp(&pool, &stamps, head + 5000);
                lru.next.stamp.store(head, Ordering::Relaxed);
                lru.hand.store(0, Ordering::Relaxed);
                let mut got = Vec::new();
                let taken = lru.sweep(&pool.refs, 1, &|_, _| true, &mut |id| got.push(id.index()));
                assert_eq!(taken, 1);
                assert_eq!(
                    got,
                    vec![10],
                    "{what}: the sweep took block {got:?}, not the oldest (10)"
                );
            }
        }

        /// Release-driven stamps: 64 blocks revived and released once each,
        /// in a shuffled order, 2^32 - 1 other stamps taken before each
        /// release (so every new stamp shares its low 32 bits with the first
        /// release's); the ring overflows with stale candidates of the first
        /// releases. Eviction follows release order.
        #[test]
        fn a_stale_candidate_whose_low_32_bits_recur_is_passed_over() {
            let n = 64;
            let pool = evictable_pool(n);
            let lru = lru(&pool);
            let mut state = 1;
            let mut order: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                let j = (splitmix(&mut state) % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
            for &b in &order {
                lru.clock.fetch_add((1 << 32) - 1, Ordering::Relaxed);
                let mut seq = Sequence::new(Arc::clone(&pool));
                assert_eq!(seq.try_match_prefix(&[key(b)]), 1);
                drop(seq);
            }
            let got = evict_all(&pool, n);
            assert_eq!(got, order, "eviction order against release order");
        }

        /// A block whose candidate is in the ring, released again exactly
        /// 2^32 stamps later (its stamp's low 32 bits the same): it is the
        /// youngest, evicted last.
        #[test]
        fn a_block_released_again_2_pow_32_stamps_later_goes_last() {
            let n = 8;
            let pool = evictable_pool(n);
            let lru = lru(&pool);
            // The ring holds blocks 0..8 by their first release; `old` is
            // the oldest. Revive it and release it again exactly 2^32
            // stamps after its first stamp.
            let old = (0..n)
                .min_by_key(|&i| lru.stamps[i].load(Ordering::Relaxed))
                .unwrap();
            let s0 = lru.stamps[old].load(Ordering::Relaxed);
            lru.clock.store(s0 + (1 << 32), Ordering::Relaxed);
            let mut seq = Sequence::new(Arc::clone(&pool));
            assert_eq!(seq.try_match_prefix(&[key(old)]), 1);
            drop(seq);
            assert_eq!(lru.stamps[old].load(Ordering::Relaxed), s0 + (1 << 32));
            // `old` is now the youngest: it must go last.
            let got = evict_all(&pool, n);
            assert_eq!(
                *got.last().unwrap(),
                old,
                "eviction order {got:?} (block {old} released last)"
            );
        }
    }
}
