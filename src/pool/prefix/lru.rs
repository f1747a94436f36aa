//! The prefix cache's eviction order: least recently released first.
//!
//! Each block has a release stamp, taken from a pool-wide clock when its
//! last reference goes while it holds a key (a sequence takes one range of
//! stamps per give-back, and stamps its blocks in release order). Stamps
//! are 32 bits and compared by age (`clock - stamp`, wrapping), so a block
//! released more than 2^32 stamps ago looks young again.
//!
//! Evictors take blocks from a ring of candidates, oldest first, as
//! `(stamp << 32) | id` words. A block that becomes evictable is appended
//! (it is the youngest; a give-back appends the blocks it made evictable
//! in batches, oldest first, with one CAS on the ring's length a batch),
//! unless the ring is full or *overflowed*: some evictable block older
//! than the new one is missing from it. When the
//! ring runs dry, one evictor refills it with a scan of every block (a
//! bounded heap keeps the `capacity` oldest, sorted); the ring is marked
//! overflowed if the scan found more evictable blocks than fit. The
//! refill is claimed with a flag that nobody waits for: an evictor that
//! finds the ring empty while another refills it sweeps the pool from a
//! rotating hand instead, taking the evictable blocks it meets, and moves
//! the hand past what it looked at.
//!
//! So with one thread the order is exactly least recently released first:
//! the ring holds the oldest evictable blocks in order, and a block is
//! appended only while every older evictable block is in the ring. While
//! few blocks are evictable, releases keep the ring filled and evictions
//! need no scan. Under concurrency the order is approximate (a stamp taken
//! late, an append lost to a racing one or to a refill, a candidate read
//! during a refill, the sweep's picks); every candidate is re-checked against
//! the block's stamp and state before it is evicted, and a block missing
//! from the ring is found by the next scan.

use std::collections::TryReserveError;
use std::ops::Range;

use crate::array::{bytes_of, Room};

use crate::id::BlockId;
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, CachePadded, Ordering};

use crate::pool::refs::Refs;

/// The fewest candidates a buffer holds.
const MIN_CANDIDATES: usize = 64;
/// Blocks per candidate slot (the buffer holds `num_blocks / 4`: a
/// refill serves that many evictions, and the ring's 8-byte words cost 2
/// bytes a block).
const BLOCKS_PER_CANDIDATE: usize = 4;

/// Stamps, the candidate buffer and the fallback hand.
pub(super) struct Lru {
    /// Per block: the clock's value when it last became evictable.
    stamps: Box<[AtomicU32]>,
    /// The release clock.
    clock: CachePadded<AtomicU32>,
    /// The ring: `(stamp << 32) | id` at position `p % capacity`, oldest
    /// first.
    candidates: Box<[AtomicU64]>,
    /// The position after the youngest candidate.
    len: AtomicUsize,
    /// The position of the next candidate to try (`next <= len`, and
    /// `len - next <= capacity`).
    next: CachePadded<AtomicUsize>,
    /// Set while one evictor refills the ring.
    refilling: AtomicBool,
    /// Set when an evictable block is missing from the ring that is older
    /// than blocks released since: appends stop until the next refill.
    overflowed: AtomicBool,
    /// Where the fallback scan starts.
    hand: AtomicUsize,
}

/// The room of an [`Lru`]'s arrays, reserved by [`Lru::room`].
pub(super) struct LruRoom {
    stamps: Room<AtomicU32>,
    candidates: Room<AtomicU64>,
}

/// A candidate word's block.
fn id_of(word: u64) -> BlockId {
    BlockId::new(word as u32)
}

/// A candidate word's stamp.
fn stamp_of(word: u64) -> u32 {
    (word >> 32) as u32
}

impl Lru {
    /// The eviction order of `num_blocks` blocks, none evictable.
    pub(super) fn new(room: LruRoom) -> Lru {
        Lru {
            stamps: room.stamps.fill(|_| AtomicU32::new(0)),
            clock: CachePadded::new(AtomicU32::new(0)),
            candidates: room.candidates.fill(|_| AtomicU64::new(0)),
            len: AtomicUsize::new(0),
            next: CachePadded::new(AtomicUsize::new(0)),
            refilling: AtomicBool::new(false),
            overflowed: AtomicBool::new(false),
            hand: AtomicUsize::new(0),
        }
    }

    /// Reserves the room of [`new`](Self::new)'s arrays for `num_blocks`
    /// blocks.
    pub(super) fn room(num_blocks: usize) -> Result<LruRoom, TryReserveError> {
        Ok(LruRoom {
            stamps: Room::reserve(num_blocks)?,
            candidates: Room::reserve(Lru::capacity(num_blocks))?,
        })
    }

    /// The ring's capacity for `num_blocks` blocks.
    fn capacity(num_blocks: usize) -> usize {
        (num_blocks / BLOCKS_PER_CANDIDATE).max(MIN_CANDIDATES.min(num_blocks))
    }

    /// The heap bytes [`room`](Self::room) asks for.
    pub(super) fn heap_bytes(num_blocks: usize) -> usize {
        bytes_of::<AtomicU32>(num_blocks)
            .saturating_add(bytes_of::<AtomicU64>(Lru::capacity(num_blocks)))
    }

    /// Takes `n` consecutive stamps; returns the first.
    pub(super) fn stamps(&self, n: usize) -> u32 {
        // Relaxed: stamps only order evictions, a hint; uniqueness comes
        // from the read-modify-write.
        self.clock.fetch_add(n as u32, Ordering::Relaxed)
    }

    /// The candidate word of block `id` stamped `stamp`.
    pub(super) fn word(id: BlockId, stamp: u32) -> u64 {
        (u64::from(stamp) << 32) | id.index() as u64
    }

    /// Records that the blocks of `words` (candidate words, oldest first)
    /// became evictable at their stamps, and appends them to the ring as
    /// its youngest candidates while it has room and has not overflowed:
    /// one CAS on the ring's length for all of them. Those that do not fit
    /// mark it overflowed (they wait for a scan).
    pub(super) fn stamp_all(&self, words: &[u64]) {
        for &word in words {
            // Relaxed: a hint, re-checked by the evictor's CAS on the state.
            self.stamps[id_of(word).index()].store(stamp_of(word), Ordering::Relaxed);
        }
        let cap = self.candidates.len();
        // Relaxed: a hint; an append lost to a race leaves the blocks for
        // the next scan.
        if cap == 0 || words.is_empty() || self.overflowed.load(Ordering::Relaxed) {
            return;
        }
        // Acquire: as in `pop`.
        let mut len = self.len.load(Ordering::Acquire);
        loop {
            // Acquire: as in `pop` (a refill's `next` comes with its
            // entries); only sizes the room, the CAS below decides.
            let held = len - self.next.load(Ordering::Acquire).min(len);
            let fit = words.len().min(cap.saturating_sub(held));
            if fit < words.len() {
                // Full: these blocks (and every later one) wait for a scan.
                // Relaxed: a hint.
                self.overflowed.store(true, Ordering::Relaxed);
                if fit == 0 {
                    return;
                }
            }
            let mut slot = len % cap;
            for &word in &words[..fit] {
                // Relaxed: published by the Release CAS below.
                self.candidates[slot].store(word, Ordering::Relaxed);
                slot = if slot + 1 == cap { 0 } else { slot + 1 };
            }
            // Release on success: the entries written above are visible to
            // an evictor that sees the new length. Acquire on failure: retry
            // at the fresh length.
            match self.len.compare_exchange_weak(
                len,
                len + fit,
                Ordering::Release,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) => len = actual,
            }
        }
    }

    /// Takes up to `k > 0` of the next candidates with one CAS; returns
    /// their positions in the buffer (empty when it has none left).
    fn pop(&self, k: usize) -> Range<usize> {
        // Acquire (both): the refill's entries are visible once its
        // Release stores of `len` and `next` are seen.
        let mut i = self.next.load(Ordering::Acquire);
        loop {
            let len = self.len.load(Ordering::Acquire);
            if i >= len {
                return 0..0;
            }
            let end = len.min(i + k);
            // Relaxed (both): taking the positions is all; the entries are
            // hints.
            match self
                .next
                .compare_exchange_weak(i, end, Ordering::Relaxed, Ordering::Acquire)
            {
                Ok(_) => return i..end,
                Err(actual) => i = actual,
            }
        }
    }

    /// Whether `id` was last stamped `stamp`.
    fn stamped(&self, id: BlockId, stamp: u32) -> bool {
        // Relaxed: a hint.
        self.stamps[id.index()].load(Ordering::Relaxed) == stamp
    }

    /// Finds up to `k` blocks to evict, least recently released first,
    /// takes each with `take` (the eviction CAS on the state it read) and
    /// hands it to `got`; returns how many. Fewer than `k` if no more
    /// evictable blocks were found (the caller looks again elsewhere).
    /// Candidates are claimed `k` at a time, one CAS for all of them.
    pub(super) fn evict(
        &self,
        refs: &Refs,
        k: usize,
        take: impl Fn(BlockId, u64) -> bool,
        mut got: impl FnMut(BlockId),
    ) -> usize {
        let mut taken = 0;
        loop {
            loop {
                let range = self.pop(k - taken);
                if range.is_empty() {
                    break;
                }
                for p in range {
                    // Relaxed: a hint (see `refill`).
                    let word = self.candidates[p % self.candidates.len()].load(Ordering::Relaxed);
                    let (id, stamp) = (id_of(word), stamp_of(word));
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
            // Refill, unless someone else is at it.
            // Acquire on success: the previous refiller's writes are ours
            // to overwrite. Relaxed on failure: we do not wait.
            if self
                .refilling
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                return taken + self.sweep(refs, k - taken, &take, &mut got);
            }
            let found = self.refill(refs);
            // Release: the next refiller sees our entries as written.
            self.refilling.store(false, Ordering::Release);
            if found == 0 {
                return taken;
            }
        }
    }

    /// Takes up to `k` evictable blocks in one pass over the pool from the
    /// hand, and moves the hand past the blocks it looked at, so that the
    /// next sweep starts where this one stopped instead of rescanning the
    /// held blocks before it. Returns how many it took.
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
        // Relaxed (both): the hand only spreads the sweeps.
        let start = self.hand.load(Ordering::Relaxed) % n;
        let (mut taken, mut looked) = (0, 0);
        for index in (start..n).chain(0..start) {
            looked += 1;
            // Acquire: as in `evict`.
            let state = refs.state(index, Ordering::Acquire);
            let id = BlockId::new(index as u32);
            if refs.may_evict(state) && take(id, state) {
                got(id);
                taken += 1;
                if taken == k {
                    break;
                }
            }
        }
        self.hand.fetch_add(looked, Ordering::Relaxed);
        taken
    }

    /// Refills the buffer with the oldest evictable blocks, oldest first;
    /// returns how many. The caller holds the `refilling` flag.
    fn refill(&self, refs: &Refs) -> usize {
        let cap = self.candidates.len();
        // Empty the ring first, so that evictors stop popping from it, and
        // stop appends (a release during the scan may or may not be seen
        // by it). Relaxed: the entries are hints; `len` is published below.
        self.overflowed.store(true, Ordering::Relaxed);
        self.next.store(0, Ordering::Relaxed);
        self.len.store(0, Ordering::Relaxed);
        let mut seen = 0usize;
        // Relaxed: a snapshot; ages are measured from it.
        let now = self.clock.load(Ordering::Relaxed);
        let age = |word: u64| now.wrapping_sub(stamp_of(word));
        let get = |i: usize| self.candidates[i].load(Ordering::Relaxed);
        let set = |i: usize, word: u64| self.candidates[i].store(word, Ordering::Relaxed);
        // A min-heap by age of the oldest blocks seen: its root is the
        // youngest of them, the first to be replaced. Both sifts move a
        // hole rather than swapping, so each level costs one load and one
        // store of the ring and one age.
        let sift_down = |mut i: usize, word: u64, len: usize| {
            let a = age(word);
            loop {
                let l = 2 * i + 1;
                if l >= len {
                    break;
                }
                let (mut c, mut child) = (l, get(l));
                if l + 1 < len {
                    let right = get(l + 1);
                    if age(right) < age(child) {
                        (c, child) = (l + 1, right);
                    }
                }
                if age(child) >= a {
                    break;
                }
                set(i, child);
                i = c;
            }
            set(i, word);
        };
        let mut len = 0;
        for index in 0..refs.len() {
            // Relaxed: a scan for hints; the eviction CAS re-checks.
            if !refs.may_evict(refs.state(index, Ordering::Relaxed)) {
                continue;
            }
            seen += 1;
            let id = BlockId::new(index as u32);
            // Relaxed: a hint.
            let stamp = self.stamps[index].load(Ordering::Relaxed);
            let word = Self::word(id, stamp);
            if len < cap {
                // Sift up from a hole at the end.
                let (mut i, a) = (len, age(word));
                while i > 0 {
                    let parent = get((i - 1) / 2);
                    if age(parent) <= a {
                        break;
                    }
                    set(i, parent);
                    i = (i - 1) / 2;
                }
                set(i, word);
                len += 1;
            } else if age(word) > age(get(0)) {
                sift_down(0, word, len);
            }
        }
        // Heap sort: the youngest goes to the back, so the oldest ends first.
        for end in (1..len).rev() {
            let (root, last) = (get(0), get(end));
            set(end, root);
            sift_down(0, last, end);
        }
        // Release (both): an evictor that sees these values sees the
        // entries written above. Appends resume if every evictable block
        // seen is in the ring.
        self.next.store(0, Ordering::Release);
        self.len.store(len, Ordering::Release);
        // Relaxed: a hint.
        self.overflowed.store(seen > cap, Ordering::Relaxed);
        len
    }
}
