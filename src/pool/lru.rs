//! The prefix cache's eviction order: least recently released first.
//!
//! Each block has a release stamp, taken from a pool-wide clock when its
//! last reference goes while it holds a key (a sequence takes one range of
//! stamps per give-back, and stamps its blocks in release order). Stamps
//! are 32 bits and compared by age (`clock - stamp`, wrapping), so a block
//! released more than 2^32 stamps ago looks young again.
//!
//! Evictors take blocks from a buffer of candidates: the oldest evictable
//! blocks of the pool, oldest first, as `(stamp << 32) | id` words. When it
//! runs dry, one evictor refills it with a scan of every block (a bounded
//! heap keeps the `capacity` oldest), claimed with a flag that nobody waits
//! for: an evictor that finds the buffer empty while another refills it
//! takes the first evictable block from a rotating hand instead. Blocks
//! released after a refill are younger than every candidate, so with one
//! thread the order is exactly least recently released first; under
//! concurrency it is approximate (a stamp taken late, a candidate read
//! during a refill, the hand's pick), and every candidate is re-checked
//! against the block's stamp and state before it is evicted.

use std::ops::Range;

use crate::id::BlockId;
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, CachePadded, Ordering};

use super::refs::Refs;

/// The fewest candidates a buffer holds.
const MIN_CANDIDATES: usize = 64;
/// Blocks per candidate slot (the buffer holds `num_blocks / 8`).
const BLOCKS_PER_CANDIDATE: usize = 8;

/// Stamps, the candidate buffer and the fallback hand.
pub(super) struct Lru {
    /// Per block: the clock's value when it last became evictable.
    stamps: Box<[AtomicU32]>,
    /// The release clock.
    clock: CachePadded<AtomicU32>,
    /// `(stamp << 32) | id`, oldest first, `len` of them valid.
    candidates: Box<[AtomicU64]>,
    /// How many candidates the last refill found.
    len: AtomicUsize,
    /// The next candidate to try.
    next: CachePadded<AtomicUsize>,
    /// Set while one evictor refills the buffer.
    refilling: AtomicBool,
    /// Where the fallback scan starts.
    hand: AtomicUsize,
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
    pub(super) fn new(num_blocks: usize) -> Lru {
        let capacity = (num_blocks / BLOCKS_PER_CANDIDATE).max(MIN_CANDIDATES.min(num_blocks));
        Lru {
            stamps: (0..num_blocks).map(|_| AtomicU32::new(0)).collect(),
            clock: CachePadded::new(AtomicU32::new(0)),
            candidates: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
            len: AtomicUsize::new(0),
            next: CachePadded::new(AtomicUsize::new(0)),
            refilling: AtomicBool::new(false),
            hand: AtomicUsize::new(0),
        }
    }

    /// Takes `n` consecutive stamps; returns the first.
    pub(super) fn stamps(&self, n: usize) -> u32 {
        // Relaxed: stamps only order evictions, a hint; uniqueness comes
        // from the read-modify-write.
        self.clock.fetch_add(n as u32, Ordering::Relaxed)
    }

    /// Records that `id` became evictable at `stamp`.
    pub(super) fn stamp(&self, id: BlockId, stamp: u32) {
        // Relaxed: a hint, re-checked by the evictor's CAS on the state.
        self.stamps[id.index()].store(stamp, Ordering::Relaxed);
    }

    /// Takes up to `k > 0` of the next candidates with one CAS; returns
    /// their positions in the buffer (empty when it has none left).
    fn pop(&self, k: usize) -> Range<usize> {
        // Acquire (both): the refill's entries are visible once its
        // Release stores of `len` and `next` are seen.
        let mut i = self.next.load(Ordering::Acquire);
        loop {
            let len = self.len.load(Ordering::Acquire).min(self.candidates.len());
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
                for i in range {
                    // Relaxed: a hint (see `refill`).
                    let word = self.candidates[i].load(Ordering::Relaxed);
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
                while taken < k {
                    match self.any(refs, &take) {
                        Some(id) => {
                            got(id);
                            taken += 1;
                        }
                        None => break,
                    }
                }
                return taken;
            }
            let found = self.refill(refs);
            // Release: the next refiller sees our entries as written.
            self.refilling.store(false, Ordering::Release);
            if found == 0 {
                return taken;
            }
        }
    }

    /// The first evictable block from the hand on that `take` takes.
    fn any(&self, refs: &Refs, take: &impl Fn(BlockId, u64) -> bool) -> Option<BlockId> {
        let n = refs.len();
        // Relaxed: the hand only spreads the scans.
        let start = self.hand.fetch_add(1, Ordering::Relaxed) % n.max(1);
        (0..n).map(|i| (start + i) % n).find_map(|index| {
            let id = BlockId::new(index as u32);
            // Acquire: as in `evict`.
            let state = refs.state(index, Ordering::Acquire);
            (refs.may_evict(state) && take(id, state)).then_some(id)
        })
    }

    /// Refills the buffer with the oldest evictable blocks, oldest first;
    /// returns how many. The caller holds the `refilling` flag.
    fn refill(&self, refs: &Refs) -> usize {
        let cap = self.candidates.len();
        // Empty the buffer first, so that evictors stop popping from it.
        // Relaxed: the entries are hints; `len` is published below.
        self.len.store(0, Ordering::Relaxed);
        // Relaxed: a snapshot; ages are measured from it.
        let now = self.clock.load(Ordering::Relaxed);
        let age = |word: u64| now.wrapping_sub(stamp_of(word));
        let get = |i: usize| self.candidates[i].load(Ordering::Relaxed);
        let set = |i: usize, word: u64| self.candidates[i].store(word, Ordering::Relaxed);
        // A min-heap by age of the oldest blocks seen: its root is the
        // youngest of them, the first to be replaced.
        let sift_down = |mut i: usize, len: usize| loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut min = i;
            if l < len && age(get(l)) < age(get(min)) {
                min = l;
            }
            if r < len && age(get(r)) < age(get(min)) {
                min = r;
            }
            if min == i {
                return;
            }
            let (a, b) = (get(i), get(min));
            set(i, b);
            set(min, a);
            i = min;
        };
        let mut len = 0;
        for index in 0..refs.len() {
            // Relaxed: a scan for hints; the eviction CAS re-checks.
            if !refs.may_evict(refs.state(index, Ordering::Relaxed)) {
                continue;
            }
            let id = BlockId::new(index as u32);
            // Relaxed: a hint.
            let stamp = self.stamps[index].load(Ordering::Relaxed);
            let word = (u64::from(stamp) << 32) | id.index() as u64;
            if len < cap {
                // Sift up.
                let mut i = len;
                set(i, word);
                len += 1;
                while i > 0 && age(get((i - 1) / 2)) > age(get(i)) {
                    let (a, b) = (get(i), get((i - 1) / 2));
                    set(i, b);
                    set((i - 1) / 2, a);
                    i = (i - 1) / 2;
                }
            } else if age(word) > age(get(0)) {
                set(0, word);
                sift_down(0, len);
            }
        }
        // Heap sort: the youngest goes to the back, so the oldest ends first.
        for end in (1..len).rev() {
            let (a, b) = (get(0), get(end));
            set(0, b);
            set(end, a);
            sift_down(0, end);
        }
        // Release (both): an evictor that sees these values sees the
        // entries written above.
        self.next.store(0, Ordering::Release);
        self.len.store(len, Ordering::Release);
        len
    }
}
