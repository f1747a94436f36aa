//! The lock-free free list of block ids behind
//! [`BlockPool`](crate::BlockPool): shards, each a bitmap of the ids it
//! owns (a set bit is a free block) with a summary word of the bitmap's
//! nonempty parts. One compare-and-swap takes up to 64 blocks from a word,
//! one `fetch_or` gives back every listed block of a word. The design and
//! the orderings are described in [`crate::implementation`] ("The free
//! list", "Shards", "Orderings").
//!
//! Callers admit the count through the pool's per-shard admission counts
//! before taking, and give back before giving the count back, so the
//! shards together with the prefix cache's evictable blocks always hold at
//! least as many blocks as have been admitted and not yet taken: the pool
//! takes, evicts for the rest, and looks again (the last time through
//! every word, summaries aside) only when other threads moved blocks
//! meanwhile.

use std::collections::TryReserveError;

use crate::array::{bytes_of, Room};
use crate::id::BlockId;
use crate::sync::{AtomicU64, Backoff, CachePadded, Divisor, Faults, Ordering};

/// Bitmap words per cache line (of [`CachePadded`]'s 128 bytes on x86-64):
/// each shard's words start on a line of their own.
const WORDS_PER_LINE: usize = 16;

/// One line of bitmap words.
type Line = CachePadded<[AtomicU64; WORDS_PER_LINE]>;

/// The room of a [`FreeList`]'s bitmap, reserved by [`FreeList::room`].
pub(crate) struct FreeRoom {
    lines: Room<Line>,
}

pub(crate) struct FreeList {
    /// Per shard, on a line of its own: bit `j` says that the `j`-th group
    /// of the shard's words may hold a free id (see [`summary_bit`]).
    summaries: Box<[CachePadded<AtomicU64>]>,
    /// The bitmap: shard `s`'s words start at line `s * lines_per_shard`;
    /// bit `b` of its word `w` is id `s * span + 64 * w + b`, set while
    /// that block is free.
    lines: Box<[Line]>,
    /// Ids per shard: shard `s` owns ids `s * span .. (s + 1) * span`.
    span: u32,
    /// Bitmap words per shard: `ceil(span / 64)`.
    words: u32,
    /// Lines per shard: `ceil(words / WORDS_PER_LINE)`.
    lines_per_shard: u32,
    /// Words per summary bit: `ceil(words / 64)`.
    group: u32,
    /// Which shard a thread calls home.
    homes: Divisor,
    /// Division by `span`: which shard owns an id.
    by_span: Divisor,
    /// The faults of loom's negative controls (none outside them).
    faults: Faults,
}

/// Where an id lives: its shard, its word in the shard and its bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place {
    shard: u32,
    word: u32,
}

/// A word of the bitmap as a give-back sees it.
#[derive(Debug, Clone, Copy)]
struct Word {
    /// Where it is.
    place: Place,
    /// The id of its bit 0.
    base: u32,
    /// How many ids from `base` on it holds (64, or fewer at the end of a
    /// shard).
    limit: u32,
}

/// The ids that a give-back returns to one word, gathered before the
/// `fetch_or` that returns them all: built with [`Give::add`], given back
/// by [`FreeList::give`] (which needs no allocation).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Give {
    /// The word of the ids gathered so far (meaningless while `mask == 0`).
    word: Word,
    /// Their bits.
    mask: u64,
    /// How many ids were added in all.
    len: usize,
}

impl Give {
    /// Nothing gathered.
    pub(crate) const fn new() -> Give {
        Give {
            word: Word {
                place: Place { shard: 0, word: 0 },
                base: 0,
                limit: 0,
            },
            mask: 0,
            len: 0,
        }
    }

    /// How many ids were added.
    pub(crate) const fn len(&self) -> usize {
        self.len
    }

    /// Adds free block `id` (which the caller held, and whose last
    /// reference it dropped): returned at once with the ids of its word
    /// gathered before it, or later with the next ones.
    /// (By value in and out, so that a loop keeps it in registers.)
    #[inline]
    #[must_use]
    pub(crate) fn add(mut self, list: &FreeList, id: BlockId) -> Give {
        self.len += 1;
        // The word of the ids before it? (The usual case: a sequence's
        // blocks mostly come from one word.)
        let offset = (id.index() as u32).wrapping_sub(self.word.base);
        if offset < self.word.limit {
            self.mask |= 1 << offset;
        } else {
            (self.word, self.mask) = list.switch_word(self.word, self.mask, id);
        }
        self
    }
}

/// The lowest `k` set bits of `word` (all of them if it has no more), and
/// how many that is. (Without a population count: the default x86-64
/// target has no instruction for it.)
#[inline]
fn lowest(word: u64, k: usize) -> (u64, usize) {
    if word == u64::MAX && k >= 64 {
        return (word, 64);
    }
    let (mut rest, mut taken) = (word, 0);
    while rest != 0 && taken < k {
        rest &= rest - 1;
        taken += 1;
    }
    (word & !rest, taken)
}

impl FreeList {
    /// A free list of `shards > 0` shards holding every id `0..len` (ids
    /// `s * span..` in shard `s`, `span = ceil(len / shards)`).
    pub(crate) fn new(room: FreeRoom, len: u32, shards: usize, faults: Faults) -> FreeList {
        debug_assert!(shards > 0);
        let (span, words, lines_per_shard) = Self::shape(len as usize, shards);
        let group = words.div_ceil(64).max(1);
        // The bits of the ids of shard `s` in its word `w`.
        let free = |s: u32, w: u32| -> u64 {
            if w >= words {
                return 0;
            }
            let lo = u64::from(s) * u64::from(span) + 64 * u64::from(w);
            let shard_end = (u64::from(s) + 1) * u64::from(span);
            let end = u64::from(len).min(shard_end).min(lo + 64);
            match end.saturating_sub(lo) {
                0 => 0,
                64 => u64::MAX,
                n => (1u64 << n) - 1,
            }
        };
        let lines = room.lines.fill(|line| {
            let s = (line / lines_per_shard as usize) as u32;
            let first = (line % lines_per_shard as usize * WORDS_PER_LINE) as u32;
            CachePadded::new(std::array::from_fn(|i| {
                AtomicU64::new(free(s, first + i as u32))
            }))
        });
        let summaries = (0..shards as u32)
            .map(|s| {
                let mut summary = 0u64;
                for w in 0..words {
                    if free(s, w) != 0 {
                        summary |= 1 << (w / group);
                    }
                }
                CachePadded::new(AtomicU64::new(summary))
            })
            .collect();
        FreeList {
            summaries,
            lines,
            span,
            words,
            lines_per_shard,
            group,
            homes: Divisor::new(shards),
            by_span: Divisor::new(span as usize),
            faults,
        }
    }

    /// `(span, words, lines_per_shard)` of `len` ids over `shards` shards.
    fn shape(len: usize, shards: usize) -> (u32, u32, u32) {
        // Ceiling division, at least 1 so that `place` never divides by 0;
        // `len <= u32::MAX`, so it fits.
        let span = len.div_ceil(shards).max(1) as u32;
        let words = span.div_ceil(64);
        (span, words, words.div_ceil(WORDS_PER_LINE as u32))
    }

    /// Reserves the room of [`new`](Self::new)'s bitmap for `len` ids over
    /// `shards` shards.
    pub(crate) fn room(len: usize, shards: usize) -> Result<FreeRoom, TryReserveError> {
        let (_, _, lines_per_shard) = Self::shape(len, shards);
        Ok(FreeRoom {
            lines: Room::reserve(shards.saturating_mul(lines_per_shard as usize))?,
        })
    }

    /// The heap bytes [`room`](Self::room) and the shards' summaries take.
    pub(crate) fn heap_bytes(len: usize, shards: usize) -> usize {
        let (_, _, lines_per_shard) = Self::shape(len, shards);
        bytes_of::<Line>(shards.saturating_mul(lines_per_shard as usize))
            .saturating_add(bytes_of::<CachePadded<AtomicU64>>(shards))
    }

    /// The number of shards.
    pub(crate) fn shards(&self) -> usize {
        self.summaries.len()
    }

    /// The calling thread's home shard, where its takes start.
    fn home(&self) -> usize {
        self.homes.home()
    }

    /// The word of `id` and how many ids from its bit 0 on it holds.
    fn word_of(&self, id: BlockId) -> Word {
        let id = id.index() as u32;
        let shard = self.by_span.div(id);
        let word = (id - shard * self.span) / 64;
        let base = shard * self.span + 64 * word;
        // The shard's end, in u64: the last shard's may pass u32::MAX.
        let end = (u64::from(shard) + 1) * u64::from(self.span);
        let limit = (end - u64::from(base)).min(64) as u32;
        Word {
            place: Place { shard, word },
            base,
            limit,
        }
    }

    /// For [`Give::add`]: returns the ids `mask` of `word` (if any) and
    /// starts gathering those of `id`'s word, with `id`.
    #[inline]
    fn switch_word(&self, word: Word, mask: u64, id: BlockId) -> (Word, u64) {
        if mask != 0 {
            self.return_word(word.place, mask);
        }
        let word = self.word_of(id);
        (word, 1 << (id.index() as u32 - word.base))
    }

    /// Word `w` of shard `s`.
    fn word(&self, s: usize, w: u32) -> &AtomicU64 {
        let w = w as usize;
        &self.lines[s * self.lines_per_shard as usize + w / WORDS_PER_LINE][w % WORDS_PER_LINE]
    }

    /// The summary bit of word `w` (of any shard).
    fn summary_bit(&self, w: u32) -> u64 {
        1 << (w / self.group)
    }

    /// Takes up to `k > 0` free ids and appends them to `out`; returns how
    /// many: from the home shard if it holds them, else what it has and
    /// the rest from the other shards in turn, one pass over them, each
    /// through its summary.
    ///
    /// The caller has admitted `k` through the pool's counter, which
    /// guarantees that the shards and the prefix cache's evictable blocks
    /// together hold them, and reserved room for `k` more ids in `out`
    /// (nothing here allocates). When this returns fewer, the caller
    /// evicts or looks again.
    #[inline]
    pub(crate) fn pop(&self, k: usize, out: &mut Vec<BlockId>) -> usize {
        debug_assert!(k > 0);
        let home = self.home();
        // The usual case: the first word the home shard's summary marks
        // holds all `k` (one load of the summary, one of the word, one
        // CAS).
        // Relaxed: a hint, as in `take_from_shard`.
        let groups = self.summaries[home].load(Ordering::Relaxed);
        if groups != 0 && k < 64 {
            let w = groups.trailing_zeros() * self.group;
            let word = self.word(home, w);
            // Relaxed: only a guess; the CAS validates it (and acquires).
            let cur = word.load(Ordering::Relaxed);
            let (take, n) = lowest(cur, k);
            if n == k
                && !self.faults.plain_bitmap_take()
                // Acquire on success, Relaxed on failure: as in
                // `take_from_word`.
                && word
                    .compare_exchange(cur, cur & !take, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                self.emit(home, w, take, out);
                return k;
            }
        }
        self.pop_from(home, k, out)
    }

    /// [`pop`](Self::pop) past its usual case: from the home shard, then
    /// the others in turn.
    #[inline(never)]
    fn pop_from(&self, home: usize, k: usize, out: &mut Vec<BlockId>) -> usize {
        let shards = self.summaries.len();
        let mut shard = home;
        let mut taken = 0;
        for _ in 0..shards {
            taken += self.take_from_shard(shard, k - taken, out);
            // Got them all?
            if taken == k {
                break;
            }
            shard += 1;
            if shard == shards {
                shard = 0;
            }
        }
        taken
    }

    /// [`pop`](Self::pop) through every word of every shard, whatever the
    /// summaries say (setting the summary bits of the words it finds
    /// holding ids): the last look of a caller that found too few through
    /// the summaries and the prefix cache.
    pub(crate) fn pop_everywhere(&self, k: usize, out: &mut Vec<BlockId>) -> usize {
        debug_assert!(k > 0);
        let mut taken = 0;
        for s in 0..self.summaries.len() {
            for w in 0..self.words {
                let (got, held) = self.take_from_word(s, w, k - taken, out);
                taken += got;
                if held {
                    let bit = self.summary_bit(w);
                    // Relaxed (both): a hint for later takes; the words
                    // themselves are what hand blocks over.
                    if self.summaries[s].load(Ordering::Relaxed) & bit == 0 {
                        self.summaries[s].fetch_or(bit, Ordering::Relaxed);
                    }
                }
                if taken == k {
                    return taken;
                }
            }
        }
        taken
    }

    /// Takes up to `k > 0` ids from shard `s`, word after word of the
    /// groups its summary marks, lowest first; appends them to `out` and
    /// returns how many. Clears the summary bit of a group it finds empty.
    fn take_from_shard(&self, s: usize, k: usize, out: &mut Vec<BlockId>) -> usize {
        // Relaxed: which words to look at, a hint; a stale bit costs a
        // look, a stale 0 a later look (`pop_everywhere`).
        let mut groups = self.summaries[s].load(Ordering::Relaxed);
        let mut taken = 0;
        while groups != 0 {
            let j = groups.trailing_zeros();
            groups &= groups - 1;
            let first = j * self.group;
            let end = (first + self.group).min(self.words);
            let mut held = false;
            for w in first..end {
                let (got, had) = self.take_from_word(s, w, k - taken, out);
                taken += got;
                held |= had;
                if taken == k {
                    return taken;
                }
            }
            if !held {
                self.clear_summary(s, j, first, end);
            }
        }
        taken
    }

    /// Takes the lowest `min(k, free)` ids of word `w` of shard `s` with
    /// one CAS and appends them to `out`; returns how many, and whether
    /// the word held any when first read.
    fn take_from_word(&self, s: usize, w: u32, k: usize, out: &mut Vec<BlockId>) -> (usize, bool) {
        let word = self.word(s, w);
        let backoff = Backoff::new();
        // Relaxed: only a guess; the CAS validates it (and acquires).
        let mut cur = word.load(Ordering::Relaxed);
        let held = cur != 0;
        while cur != 0 {
            let (take, n) = lowest(cur, k);
            if self.faults.plain_bitmap_take() {
                // loom's control: a load and a plain store, no RMW.
                // Acquire: the orderings of a correct take; the bug under
                // test is the lost update.
                cur = word.load(Ordering::Acquire);
                let (take, n) = lowest(cur, k);
                word.store(cur & !take, Ordering::Relaxed);
                self.emit(s, w, take, out);
                return (n, held);
            }
            // Acquire on success: we now own these blocks, and whatever
            // their previous owners did happens-before our use (the
            // give-back's `fetch_or` is Release, and every change of the
            // word is a read-modify-write that continues its release
            // sequence). Relaxed on failure: we retry with the fresh value.
            match word.compare_exchange_weak(cur, cur & !take, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.emit(s, w, take, out);
                    return (n, held);
                }
                Err(actual) => {
                    cur = actual;
                    backoff.spin();
                }
            }
        }
        (0, held)
    }

    /// Appends the ids of the bits `taken` of word `w` of shard `s`.
    fn emit(&self, s: usize, w: u32, taken: u64, out: &mut Vec<BlockId>) {
        let base = s as u32 * self.span + 64 * w;
        if taken == u64::MAX {
            out.extend((base..base + 64).map(BlockId::new));
            return;
        }
        let mut rest = taken;
        while rest != 0 {
            out.push(BlockId::new(base + rest.trailing_zeros()));
            rest &= rest - 1;
        }
    }

    /// Clears summary bit `j` of shard `s` (words `first..end`), which a
    /// take found empty, and sets it again if one of those words holds an
    /// id now (one that a give-back returned since the take looked).
    ///
    /// A give-back that fills an empty word does the mirror image: its
    /// `fetch_or` on the word, then a load of the summary. All four are
    /// `SeqCst`, so in their single total order either the give-back's
    /// load comes after this clear (and it sets the bit) or this
    /// re-check comes after the give-back's `fetch_or` (and sees its ids).
    fn clear_summary(&self, s: usize, j: u32, first: u32, end: u32) {
        let summary = &self.summaries[s];
        let bit = 1u64 << j;
        // SeqCst: see above.
        summary.fetch_and(!bit, Ordering::SeqCst);
        for w in first..end {
            // SeqCst: see above.
            if self.word(s, w).load(Ordering::SeqCst) != 0 {
                // SeqCst: as the give-back's.
                summary.fetch_or(bit, Ordering::SeqCst);
                return;
            }
        }
    }

    /// Drops the references of `ids`, last listed first, with `drop`, as
    /// long as it says that the block is free now (a sole holder's last
    /// reference), and gathers those blocks for [`give`](Self::give);
    /// stops before the first id for which it says `false`. Returns what
    /// it gathered and how many ids (the first ones) it did not reach.
    #[inline]
    pub(crate) fn gather_while(
        &self,
        ids: &[BlockId],
        mut drop: impl FnMut(BlockId) -> bool,
    ) -> (Give, usize) {
        // The state of a `Give`, in locals that stay in registers.
        let mut word = Give::new().word;
        let mut mask = 0u64;
        let mut rest = ids.len();
        while let Some(&id) = rest.checked_sub(1).and_then(|i| ids.get(i)) {
            if !drop(id) {
                break;
            }
            let offset = (id.index() as u32).wrapping_sub(word.base);
            if offset < word.limit {
                mask |= 1 << offset;
            } else {
                (word, mask) = self.switch_word(word, mask, id);
            }
            rest -= 1;
        }
        let give = Give {
            word,
            mask,
            len: ids.len() - rest,
        };
        (give, rest)
    }

    /// Returns the blocks of `give` that it has not returned yet. The ids
    /// were added by [`Give::add`]; each goes back to the shard that owns
    /// it, one `fetch_or` per word.
    pub(crate) fn give(&self, give: Give) {
        if give.mask != 0 {
            self.return_word(give.word.place, give.mask);
        }
    }

    /// Sets the bits `mask` (of blocks the caller held) in the word at
    /// `place`, and its summary bit if the word was empty.
    fn return_word(&self, place: Place, mask: u64) {
        let s = place.shard as usize;
        // Release (in SeqCst): the holders' accesses to these blocks
        // happen-before the take that acquires them; SeqCst for the summary
        // (see `clear_summary`). (Relaxed under loom's `relaxed_free`.)
        let prev = self
            .word(s, place.word)
            .fetch_or(mask, self.faults.free_ordering(Ordering::SeqCst));
        debug_assert_eq!(prev & mask, 0, "a free block returned twice");
        if prev == 0 {
            let bit = self.summary_bit(place.word);
            let summary = &self.summaries[s];
            // SeqCst (both): see `clear_summary`.
            if summary.load(Ordering::SeqCst) & bit == 0 {
                summary.fetch_or(bit, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
mod tests {
    use super::*;

    fn list(len: u32, shards: usize) -> FreeList {
        let room = FreeList::room(len as usize, shards).unwrap();
        FreeList::new(room, len, shards, Faults::default())
    }

    #[test]
    fn lowest_takes_the_lowest_bits() {
        assert_eq!(lowest(0b1011_0110, 0), (0, 0));
        assert_eq!(lowest(0b1011_0110, 1), (0b10, 1));
        assert_eq!(lowest(0b1011_0110, 3), (0b1_0110, 3));
        assert_eq!(lowest(0b1011_0110, 4), (0b11_0110, 4));
        assert_eq!(lowest(0b1011_0110, 5), (0b1011_0110, 5));
        assert_eq!(lowest(0b1011_0110, 9), (0b1011_0110, 5));
        assert_eq!(lowest(u64::MAX, 63), (u64::MAX >> 1, 63));
        assert_eq!(lowest(u64::MAX, 64), (u64::MAX, 64));
        assert_eq!(lowest(u64::MAX, 1000), (u64::MAX, 64));
        for word in [
            0u64,
            1,
            0x8000_0000_0000_0001,
            0xF0F0_F0F0_F0F0_F0F0,
            u64::MAX,
        ] {
            for k in 0..=65 {
                let (got, n) = lowest(word, k);
                assert_eq!(got & !word, 0);
                assert_eq!(n, k.min(word.count_ones() as usize));
                assert_eq!(got.count_ones() as usize, n);
                // No bit left out below the highest taken.
                if got != 0 {
                    let below = u64::MAX >> got.leading_zeros();
                    assert_eq!(word & below, got, "word {word:#x} k {k}");
                }
            }
        }
    }

    /// Every id comes out once, whatever the shape, and comes back.
    #[test]
    fn every_id_once_in_every_shape() {
        for &(len, shards) in &[
            (1u32, 1usize),
            (63, 1),
            (64, 1),
            (65, 1),
            (200, 3),
            (1000, 16),
            (5000, 7),
            (70_000, 1),
            (70_000, 2),
        ] {
            let free = list(len, shards);
            let mut out = Vec::with_capacity(len as usize);
            assert_eq!(free.pop(len as usize, &mut out), len as usize);
            let mut seen = vec![false; len as usize];
            for id in &out {
                assert!(!std::mem::replace(&mut seen[id.index()], true));
            }
            let mut more = Vec::with_capacity(1);
            assert_eq!(free.pop(1, &mut more), 0);
            assert_eq!(free.pop_everywhere(1, &mut more), 0);
            let mut give = Give::new();
            for &id in out.iter().rev() {
                give = give.add(&free, id);
            }
            free.give(give);
            assert_eq!(give.len(), len as usize);
            out.clear();
            assert_eq!(
                free.pop(len as usize, &mut out),
                len as usize,
                "{len} {shards}"
            );
        }
    }

    /// A summary bit cleared while its word was empty is set again by the
    /// give-back that fills the word.
    #[test]
    fn a_refilled_word_is_found_through_its_summary() {
        let free = list(256, 1);
        let mut out = Vec::with_capacity(256);
        assert_eq!(free.pop(256, &mut out), 256);
        // Every group looks empty: the next pop clears every summary bit.
        let mut none = Vec::with_capacity(1);
        assert_eq!(free.pop(1, &mut none), 0);
        assert_eq!(free.summaries[0].load(Ordering::Relaxed), 0);
        free.give(Give::new().add(&free, out[200]));
        assert_eq!(free.pop(1, &mut none), 1);
        assert_eq!(none, [out[200]]);
    }
}
