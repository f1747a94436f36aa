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

/// The room of a [`FreeList`]'s bitmaps, reserved by [`FreeList::room`].
pub(crate) struct FreeRoom {
    lines: Room<Line>,
    fresh: Room<Line>,
}

pub(crate) struct FreeList {
    /// Per shard, on a line of its own: bit `j` says that the `j`-th group
    /// of the shard's words may hold a free id (see [`FreeList::summary_bit`]).
    summaries: Box<[CachePadded<AtomicU64>]>,
    /// The bitmap: shard `s`'s words start at line `s * lines_per_shard`;
    /// bit `b` of its word `w` is id `s * span + 64 * w + b`, set while
    /// that block is free.
    lines: Box<[Line]>,
    /// The fresh bitmap, in the layout of `lines`: a bit is set while its
    /// block is a sequence's fresh block, held through its uncounted
    /// reference (see `refs.rs`, "Fresh blocks"). Only that block's holder
    /// sets or clears it: the take that marks it, then the give-back or
    /// the count that clears it.
    fresh: Box<[Line]>,
    /// Ids in all: `0..len`.
    len: u32,
    /// Ids per shard: shard `s` owns ids `s * span .. (s + 1) * span`.
    span: u32,
    /// Bitmap words per shard: `ceil(span / 64)`.
    words: u32,
    /// Lines per shard: `ceil(words / WORDS_PER_LINE)`.
    lines_per_shard: u32,
    /// Words per summary bit, `1 << group_shift`: the least power of two
    /// at least `ceil(words / 64)` (a shift, not a division, finds a
    /// word's bit).
    group_shift: u32,
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
            list.give(self);
            self.word = list.word_of(id);
            self.mask = 1 << (id.index() as u32 - self.word.base);
        }
        self
    }
}

/// The fewest blocks that a take for a sequence must get from one word of
/// the bitmap to leave them fresh (see [`Taker`]).
pub(crate) const FRESH_MIN: usize = 8;

/// Who takes blocks from the free list, and how they get their first
/// references: a take for a sequence (`fresh`) marks the blocks it gets
/// from one word fresh if they are at least [`FRESH_MIN`] (one `fetch_or`
/// of the fresh bitmap: uncounted references, no write of their state
/// words); every other word's blocks go to `first`, which counts them.
pub(crate) struct Taker<F: FnMut(&[BlockId])> {
    /// Whether the taker is a sequence, which may hold fresh blocks.
    pub(crate) fresh: bool,
    /// Gives blocks just taken their first counted reference.
    pub(crate) first: F,
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

/// The bits of every id that word `w` of shard `s` holds, in a free list
/// of `len` ids, `span` a shard (all 64 but at the end of a shard or of
/// the ids; none past them).
fn whole_bits(len: u32, span: u32, s: u32, w: u32) -> u64 {
    let lo = u64::from(s) * u64::from(span) + 64 * u64::from(w);
    let shard_end = (u64::from(s) + 1) * u64::from(span);
    let end = u64::from(len).min(shard_end).min(lo + 64);
    match end.saturating_sub(lo) {
        0 => 0,
        64 => u64::MAX,
        n => (1u64 << n) - 1,
    }
}

/// Whether `ids` are `lo`, `lo + 1`, ... in order (the caller checked
/// that `lo + ids.len() - 1` does not overflow). Sixty-four at a time with
/// no branch (the id at position `p` of a chunk, less `p`, is the chunk's
/// first id: a loop the compiler vectorises, over 32-bit lanes), stopping
/// at the first chunk that is not.
#[inline]
fn is_run(ids: &[BlockId], lo: u32) -> bool {
    const POSITION: [u32; 64] = {
        let mut p = [0; 64];
        let mut i = 0;
        while i < 64 {
            p[i] = i as u32;
            i += 1;
        }
        p
    };
    let mut next = lo;
    let mut chunks = ids.chunks_exact(64);
    for chunk in &mut chunks {
        let mut off = 0;
        for (id, p) in chunk.iter().zip(POSITION) {
            off |= (id.index() as u32).wrapping_sub(p) ^ next;
        }
        if off != 0 {
            return false;
        }
        next += 64;
    }
    chunks
        .remainder()
        .iter()
        .zip(next..)
        .all(|(id, want)| id.index() as u32 == want)
}

/// How many of the last ids of `ids` (at most `max`; at least 1 for a
/// nonempty list and `max > 0`) are consecutive, each one more than the
/// one before it.
#[inline]
fn consecutive_before(ids: &[BlockId], max: usize) -> usize {
    let Some(&last) = ids.last() else {
        return 0;
    };
    let max = max.min(ids.len());
    // Position `p` of the last `max` ids holds id `top - (end - p)` where
    // they are consecutive; `top` is at least `max - 1` for the whole run.
    let top = last.index() as u32;
    // (`top + 1` only where it is at most `max`: no overflow on any
    // target.)
    let max = if (top as usize) < max {
        top as usize + 1
    } else {
        max
    };
    let end = ids.len() - 1;
    // Sixteen at a time while they are (the differences folded without a
    // branch, over 32-bit lanes: a loop the compiler vectorises), then one
    // at a time.
    const STEP: [u32; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
    let mut run = 0;
    while run + 16 <= max {
        let chunk: &[BlockId; 16] = ids[end + 1 - run - 16..=end - run]
            .try_into()
            .expect("sixteen ids");
        // The id expected at the chunk's first position (no wrap: `run + 15
        // < max <= top + 1`).
        let start = top - (run as u32 + 15);
        let mut off = 0;
        for (id, step) in chunk.iter().zip(STEP) {
            off |= id.index() as u32 ^ (start + step);
        }
        if off != 0 {
            break;
        }
        run += 16;
    }
    while run < max && ids[end - run].index() as u32 == top - run as u32 {
        run += 1;
    }
    run
}

impl FreeList {
    /// A free list of `shards > 0` shards holding every id `0..len` (ids
    /// `s * span..` in shard `s`, `span = ceil(len / shards)`).
    pub(crate) fn new(room: FreeRoom, len: u32, shards: usize, faults: Faults) -> FreeList {
        debug_assert!(shards > 0);
        let (span, words, lines_per_shard) = Self::shape(len as usize, shards);
        let group_shift = words
            .div_ceil(64)
            .max(1)
            .next_power_of_two()
            .trailing_zeros();
        // The bits of the ids of shard `s` in its word `w`.
        let free = |s: u32, w: u32| -> u64 {
            if w >= words {
                return 0;
            }
            whole_bits(len, span, s, w)
        };
        let fresh = room
            .fresh
            .fill(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))));
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
                        summary |= 1 << (w >> group_shift);
                    }
                }
                CachePadded::new(AtomicU64::new(summary))
            })
            .collect();
        FreeList {
            summaries,
            lines,
            fresh,
            len,
            span,
            words,
            lines_per_shard,
            group_shift,
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
        let lines = shards.saturating_mul(lines_per_shard as usize);
        Ok(FreeRoom {
            lines: Room::reserve(lines)?,
            fresh: Room::reserve(lines)?,
        })
    }

    /// The heap bytes [`room`](Self::room) and the shards' summaries take.
    pub(crate) fn heap_bytes(len: usize, shards: usize) -> usize {
        let (_, _, lines_per_shard) = Self::shape(len, shards);
        bytes_of::<Line>(shards.saturating_mul(lines_per_shard as usize))
            .saturating_mul(2)
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

    /// Clears the fresh bits `fresh` of blocks that the caller gives back
    /// (before the `fetch_or` that returns them).
    #[inline]
    fn clear_given_fresh(&self, place: Place, fresh: u64) {
        if fresh == 0 {
            return;
        }
        let word = self.fresh_word(place.shard as usize, place.word);
        // Relaxed (both): the holder's own bits; the give-back's
        // `fetch_or` that follows (Release) orders this clear before the
        // next holder's take, and so before its own mark.
        if self.is_whole(place, fresh) {
            // Every block of the word is the caller's: no other thread
            // writes the word until the blocks are given back, so a store
            // clears it (no read-modify-write).
            word.store(0, Ordering::Relaxed);
        } else {
            word.fetch_and(!fresh, Ordering::Relaxed);
        }
    }

    /// Whether `bits` are every id of the word at `place` (or, under
    /// loom's `fresh_store_any_word` control, any bits at all): then the
    /// caller, who holds the blocks of `bits`, holds the whole word, and
    /// writes its fresh bits with a store.
    #[inline]
    fn is_whole(&self, place: Place, bits: u64) -> bool {
        bits == u64::MAX
            || bits == whole_bits(self.len, self.span, place.shard, place.word)
            || self.faults.fresh_store_any_word()
    }

    /// Whether `id` is a sequence's fresh block now (its fresh bit is
    /// set). A snapshot, but exact for the block's holder, the only thread
    /// that changes it.
    pub(crate) fn is_fresh(&self, id: BlockId) -> bool {
        let word = self.word_of(id);
        // Acquire: a count's clear of the bit (Release, see `clear_fresh`)
        // happens-before what the caller reads of the block's state word
        // next.
        let bits = self
            .fresh_word(word.place.shard as usize, word.place.word)
            .load(Ordering::Acquire);
        bits & (1 << (id.index() as u32 - word.base)) != 0
    }

    /// Calls `count(id)` for every fresh block of `ids` (which the caller,
    /// a sequence, holds) whose state word `is_bare` says is bare, then
    /// clears their fresh bits, one `fetch_and` a word: `count` writes the
    /// reference into the block's state word, which stops being bare. Only
    /// a bare word's block is looked up here (a counted one cannot be
    /// fresh).
    pub(crate) fn count_fresh(
        &self,
        ids: &[BlockId],
        is_bare: impl Fn(BlockId) -> bool,
        mut count: impl FnMut(BlockId),
    ) {
        let mut word = Give::new().word;
        let (mut bits, mut clear) = (0u64, 0u64);
        for &id in ids {
            if !is_bare(id) {
                continue;
            }
            let mut offset = (id.index() as u32).wrapping_sub(word.base);
            if offset >= word.limit {
                self.clear_fresh(word.place, clear);
                word = self.word_of(id);
                // Relaxed: the caller's own bits, which only it changes.
                bits = self
                    .fresh_word(word.place.shard as usize, word.place.word)
                    .load(Ordering::Relaxed);
                clear = 0;
                offset = id.index() as u32 - word.base;
            }
            if bits & (1 << offset) != 0 {
                count(id);
                clear |= 1 << offset;
            }
        }
        self.clear_fresh(word.place, clear);
    }

    /// Clears the fresh bits `mask` (of blocks the caller holds, whose
    /// references it has counted) in the word at `place`.
    fn clear_fresh(&self, place: Place, mask: u64) {
        if mask != 0 && !self.faults.fresh_kept() {
            let word = self.fresh_word(place.shard as usize, place.word);
            // Release: a raw call's checks that read the bit clear
            // (Acquire, `is_fresh`) read the count written before it in
            // the block's state word.
            // (Relaxed under loom's `relaxed_fresh_clear` control.)
            let order = self.faults.fresh_clear_ordering(Ordering::Release);
            if self.is_whole(place, mask) {
                // The caller's whole word (see `clear_given_fresh`).
                word.store(0, order);
            } else {
                word.fetch_and(!mask, order);
            }
        }
    }

    /// Word `w` of shard `s`.
    fn word(&self, s: usize, w: u32) -> &AtomicU64 {
        let w = w as usize;
        &self.lines[s * self.lines_per_shard as usize + w / WORDS_PER_LINE][w % WORDS_PER_LINE]
    }

    /// Word `w` of shard `s` in the fresh bitmap.
    fn fresh_word(&self, s: usize, w: u32) -> &AtomicU64 {
        let w = w as usize;
        &self.fresh[s * self.lines_per_shard as usize + w / WORDS_PER_LINE][w % WORDS_PER_LINE]
    }

    /// The summary bit of word `w` (of any shard).
    fn summary_bit(&self, w: u32) -> u64 {
        1 << (w >> self.group_shift)
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
    pub(crate) fn pop(
        &self,
        k: usize,
        out: &mut Vec<BlockId>,
        taker: &mut Taker<impl FnMut(&[BlockId])>,
    ) -> usize {
        debug_assert!(k > 0);
        let home = self.home();
        // The usual case: the first word the home shard's summary marks
        // holds all `k` (one load of the summary, one of the word, one
        // CAS).
        // Relaxed: a hint, as in `take_from_shard`.
        let groups = self.summaries[home].load(Ordering::Relaxed);
        if groups != 0 && k < 64 {
            let w = groups.trailing_zeros() << self.group_shift;
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
                self.emit(home, w, take, out, taker);
                return k;
            }
        }
        self.pop_from(home, k, out, taker)
    }

    /// [`pop`](Self::pop) past its usual case: from the home shard, then
    /// the others in turn.
    #[inline(never)]
    fn pop_from(
        &self,
        home: usize,
        k: usize,
        out: &mut Vec<BlockId>,
        taker: &mut Taker<impl FnMut(&[BlockId])>,
    ) -> usize {
        let shards = self.summaries.len();
        let mut shard = home;
        let mut taken = 0;
        for _ in 0..shards {
            taken += self.take_from_shard(shard, k - taken, out, taker);
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
    pub(crate) fn pop_everywhere(
        &self,
        k: usize,
        out: &mut Vec<BlockId>,
        taker: &mut Taker<impl FnMut(&[BlockId])>,
    ) -> usize {
        debug_assert!(k > 0);
        let mut taken = 0;
        for s in 0..self.summaries.len() {
            for w in 0..self.words {
                let (got, held) = self.take_from_word(s, w, k - taken, out, taker);
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
    fn take_from_shard(
        &self,
        s: usize,
        k: usize,
        out: &mut Vec<BlockId>,
        taker: &mut Taker<impl FnMut(&[BlockId])>,
    ) -> usize {
        // Relaxed: which words to look at, a hint; a stale bit costs a
        // look, a stale 0 a later look (`pop_everywhere`).
        let mut groups = self.summaries[s].load(Ordering::Relaxed);
        let mut taken = 0;
        while groups != 0 {
            let j = groups.trailing_zeros();
            groups &= groups - 1;
            let first = j << self.group_shift;
            let end = (first + (1 << self.group_shift)).min(self.words);
            let mut held = false;
            for w in first..end {
                let (got, had) = self.take_from_word(s, w, k - taken, out, taker);
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
    fn take_from_word(
        &self,
        s: usize,
        w: u32,
        k: usize,
        out: &mut Vec<BlockId>,
        taker: &mut Taker<impl FnMut(&[BlockId])>,
    ) -> (usize, bool) {
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
                self.emit(s, w, take, out, taker);
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
                    self.emit(s, w, take, out, taker);
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

    /// Appends the ids of the bits `taken` of word `w` of shard `s`, just
    /// taken, and gives them their first references as `taker` says: marks
    /// them fresh, or has them counted.
    fn emit(
        &self,
        s: usize,
        w: u32,
        taken: u64,
        out: &mut Vec<BlockId>,
        taker: &mut Taker<impl FnMut(&[BlockId])>,
    ) {
        let start = out.len();
        let base = s as u32 * self.span + 64 * w;
        if taken == u64::MAX {
            out.extend((base..base + 64).map(BlockId::new));
        } else {
            let mut rest = taken;
            while rest != 0 {
                out.push(BlockId::new(base + rest.trailing_zeros()));
                rest &= rest - 1;
            }
        }
        if taker.fresh && out.len() - start >= FRESH_MIN {
            let place = Place {
                shard: s as u32,
                word: w,
            };
            self.mark_fresh(place, taken);
        } else {
            (taker.first)(&out[start..]);
        }
    }

    /// Sets the fresh bits `taken` of the word at `place`, whose blocks
    /// the caller has just taken.
    fn mark_fresh(&self, place: Place, taken: u64) {
        let word = self.fresh_word(place.shard as usize, place.word);
        if self.is_whole(place, taken) {
            // The take emptied the word: every block of it is the
            // caller's, and their previous holders' clears happen-before
            // the take (below), so the word is 0 and no other thread
            // writes it until the blocks are given back.
            // Relaxed: as below.
            word.store(taken, Ordering::Relaxed);
            return;
        }
        if self.faults.plain_fresh_mark() {
            // loom's control: a load and a plain store, no RMW.
            // Relaxed (both): as below; the bug is the lost update.
            word.store(word.load(Ordering::Relaxed) | taken, Ordering::Relaxed);
            return;
        }
        // Relaxed: the holder is the only thread that acts on its bits
        // (a raw call's checks only report them); and the previous
        // holder's clear of a bit comes before this set in the word's
        // order without more, since its give-back (a Release `fetch_or`
        // on the free list, after the clear) happens-before our take (an
        // Acquire CAS).
        word.fetch_or(taken, Ordering::Relaxed);
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

    /// Gives back the blocks of `ids` (which a sequence holds, or a fence
    /// on its behalf), last listed first, as long as each is fresh (its
    /// uncounted reference goes with no write of its state word) or
    /// `drop_run` says that it is free now (a sole holder's last counted
    /// reference), and gathers them for [`give`](Self::give); stops before
    /// the first id that is neither. Returns what it gathered and how many
    /// ids (the first ones) it did not reach. `is_bare` says whether a
    /// block's state word is bare (then the block, which the caller holds,
    /// is fresh): the fresh bitmap's word is read only once one is.
    ///
    /// The ids are taken in runs, consecutive in one word of the bitmap
    /// and listed in that order (a sequence's blocks mostly are: a take
    /// hands out a word's ids in order): a run of fresh blocks costs a
    /// comparison of its ids and no access to their state words.
    /// `drop_run(lo, hi)` is called for a run `lo..hi` of blocks that are
    /// not fresh, and returns how many it dropped from `hi - 1` down (all,
    /// or it stopped before the first it left).
    #[inline]
    pub(crate) fn gather_held(
        &self,
        ids: &[BlockId],
        is_bare: impl Fn(BlockId) -> bool,
        mut drop_run: impl FnMut(usize, usize) -> usize,
    ) -> (Give, usize) {
        // The state of a `Give`, in locals that stay in registers, and the
        // fresh bits of its word (read once a bare word is met in it: a
        // give-back of counted blocks never reads the fresh bitmap).
        let mut word = Give::new().word;
        let (mut mask, mut fresh) = (0u64, 0u64);
        let mut fresh_bits: Option<u64> = None;
        // The run found by the last turn, when it stopped at a bare word
        // before the fresh bits were read (its ids are not compared again).
        let mut pending: Option<usize> = None;
        let mut rest = ids.len();
        while let Some(&last) = rest.checked_sub(1).and_then(|i| ids.get(i)) {
            let top = last.index() as u32;
            if top.wrapping_sub(word.base) >= word.limit {
                self.clear_given_fresh(word.place, fresh);
                if mask != 0 {
                    self.return_word(word.place, mask);
                }
                (word, mask, fresh, fresh_bits) = (self.word_of(last), 0, 0, None);
            }
            // Until this word's fresh bits are read, the blocks are taken
            // for counted ones (`drop_run` stops at a bare word).
            let known = fresh_bits;
            let bits = fresh_bits.unwrap_or(0);
            let offset = top - word.base;
            // The run of consecutive ids that ends at `top` in this word,
            // cut where the blocks stop being (or not being) fresh.
            let up = bits << (63 - offset);
            let is_fresh = up >> 63 != 0;
            let same = if is_fresh {
                (!up).leading_zeros()
            } else {
                up.leading_zeros().min(offset + 1)
            };
            let run = match pending.take() {
                Some(run) => run.min(same as usize),
                None => consecutive_before(&ids[..rest], same as usize),
            };
            let done = if is_fresh {
                run
            } else {
                drop_run(top as usize + 1 - run, top as usize + 1)
            };
            // `done <= run <= offset + 1 <= 64` bits, ending at `offset`.
            if done > 0 {
                let bits = (u64::MAX >> (64 - done)) << (offset + 1 - done as u32);
                mask |= bits;
                if is_fresh {
                    fresh |= bits;
                }
            }
            rest -= done;
            // Stopped before a block that is neither fresh nor ours alone?
            // `drop_run` also stops at a bare word (a block the caller holds
            // with a bare word is fresh) before this word's fresh bits are
            // read: they are read then, and the next turn goes on or stops
            // for good.
            if done < run {
                if known.is_some() || !is_bare(ids[rest - 1]) {
                    break;
                }
                // Relaxed: the bits of our own blocks, which only their
                // holder (we) changes.
                fresh_bits = Some(
                    self.fresh_word(word.place.shard as usize, word.place.word)
                        .load(Ordering::Relaxed),
                );
                pending = Some(run - done);
            }
        }
        // The fresh bits go before the free bits, which the caller returns.
        self.clear_given_fresh(word.place, fresh);
        let give = Give {
            word,
            mask,
            len: ids.len() - rest,
        };
        (give, rest)
    }

    /// Gives back `ids`, blocks the caller holds, if they are one run of
    /// consecutive ids (each one more than the one before it, all in
    /// range) that are all fresh: a prompt's blocks as a sequence took
    /// them. One pass over the ids, then for each word of the run a load
    /// of its fresh bits, a clear of them and one `fetch_or`; no state
    /// word is read. Returns whether it did; `false` having changed
    /// nothing (the caller gives them back block by block).
    pub(crate) fn give_fresh_run(&self, ids: &[BlockId]) -> bool {
        let (Some(first), Some(last)) = (ids.first(), ids.last()) else {
            return false;
        };
        let (lo, hi) = (first.index() as u32, last.index() as u32);
        // In range, and as many ids as the run from `lo` to `hi` holds (so
        // `lo + i` below never overflows); the first block fresh (a list
        // of counted blocks stops here, before the pass over its ids).
        if hi >= self.len
            || hi < lo
            || (hi - lo) as usize != ids.len() - 1
            || !self.is_fresh(*first)
            || !is_run(ids, lo)
        {
            return false;
        }
        // Every block of the run fresh? (Before any write: a refusal
        // changes nothing.) Then the same words again, to give them back.
        self.run_words(lo, hi, |place, mask| {
            // Relaxed: the caller's own bits, which only it changes.
            let fresh = self
                .fresh_word(place.shard as usize, place.word)
                .load(Ordering::Relaxed);
            fresh & mask == mask
        }) && self.run_words(lo, hi, |place, mask| {
            // The fresh bits before the free bits, as in `gather_held`.
            self.clear_given_fresh(place, mask);
            self.return_word(place, mask);
            true
        })
    }

    /// Calls `each(place, mask)` for the words of ids `lo..=hi` (in
    /// range), the bits of the run in each, lowest word first, while it
    /// returns `true`; returns whether every call did.
    #[inline]
    fn run_words(&self, lo: u32, hi: u32, mut each: impl FnMut(Place, u64) -> bool) -> bool {
        let mut word = self.word_of(BlockId::new(lo));
        let mut from = lo - word.base;
        loop {
            // The run's last id in this word (`limit >= 1`).
            let end = hi.min(word.base + (word.limit - 1));
            let to = end - word.base;
            let mask = (u64::MAX >> (63 - to)) & (u64::MAX << from);
            if !each(word.place, mask) {
                return false;
            }
            if end == hi {
                return true;
            }
            // The run goes on at the next word's bit 0.
            word = self.word_after(word);
            from = 0;
        }
    }

    /// The word that holds the id after `word`'s last one (which is in
    /// range): [`word_of`](Self::word_of) of that id, without its division.
    #[inline]
    fn word_after(&self, word: Word) -> Word {
        let Place { shard, word: w } = word.place;
        let base = word.base + word.limit;
        // In u64: the last shard's end may pass u32::MAX.
        let shard_end = (u64::from(shard) + 1) * u64::from(self.span);
        let (shard, w, end) = if u64::from(base) == shard_end {
            (shard + 1, 0, shard_end + u64::from(self.span))
        } else {
            (shard, w + 1, shard_end)
        };
        Word {
            place: Place { shard, word: w },
            base,
            limit: (end - u64::from(base)).min(64) as u32,
        }
    }

    /// Returns the blocks of `give` that it has not returned yet. The ids
    /// were added by [`Give::add`] (fresh ones with their fresh bits
    /// cleared already); each goes back to the shard that owns it, one
    /// `fetch_or` per word.
    pub(crate) fn give(&self, give: Give) {
        if give.mask != 0 {
            self.return_word(give.word.place, give.mask);
        }
    }

    /// Clears the fresh bit of block `id`, which the caller holds and is
    /// about to give back (a fresh block given back on its own, among
    /// shared or cached ones).
    pub(crate) fn clear_given_fresh_one(&self, id: BlockId) {
        let word = self.word_of(id);
        self.clear_given_fresh(word.place, 1 << (id.index() as u32 - word.base));
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

    /// A raw taker: every block counted (here: nothing done).
    fn counted() -> Taker<impl FnMut(&[BlockId])> {
        Taker {
            fresh: false,
            first: |_: &[BlockId]| {},
        }
    }

    /// A sequence's taker; the blocks it counts are recorded nowhere.
    fn fresh() -> Taker<impl FnMut(&[BlockId])> {
        Taker {
            fresh: true,
            first: |_: &[BlockId]| {},
        }
    }

    fn list(len: u32, shards: usize) -> FreeList {
        let room = FreeList::room(len as usize, shards).unwrap();
        FreeList::new(room, len, shards, Faults::default())
    }

    #[test]
    fn word_after_steps_as_word_of() {
        // Shards whose last word is whole or short, one shard or several,
        // and shards of more than 64 words (more than one word a summary
        // bit).
        for (len, shards) in [
            (64, 1),
            (200, 1),
            (200, 3),
            (256, 4),
            (1000, 7),
            (9000, 2),
            (20_000, 2),
        ] {
            let free = list(len, shards);
            let mut word = free.word_of(BlockId::new(0));
            let mut id = 0;
            loop {
                assert_eq!(word.base, id, "{len}/{shards}");
                let of = free.word_of(BlockId::new(id));
                assert_eq!(
                    (word.place, word.limit),
                    (of.place, of.limit),
                    "{len}/{shards} at {id}"
                );
                assert!(word.place.word >> free.group_shift < 64, "{len}/{shards}");
                id += word.limit;
                if id >= len {
                    break;
                }
                word = free.word_after(word);
            }
        }
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
            assert_eq!(
                free.pop(len as usize, &mut out, &mut counted()),
                len as usize
            );
            let mut seen = vec![false; len as usize];
            for id in &out {
                assert!(!std::mem::replace(&mut seen[id.index()], true));
            }
            let mut more = Vec::with_capacity(1);
            assert_eq!(free.pop(1, &mut more, &mut counted()), 0);
            assert_eq!(free.pop_everywhere(1, &mut more, &mut counted()), 0);
            let mut give = Give::new();
            for &id in out.iter().rev() {
                give = give.add(&free, id);
            }
            free.give(give);
            assert_eq!(give.len(), len as usize);
            out.clear();
            assert_eq!(
                free.pop(len as usize, &mut out, &mut counted()),
                len as usize,
                "{len} {shards}"
            );
            assert!(out.iter().all(|&id| !free.is_fresh(id)));
        }
    }

    /// A sequence's take marks fresh the ids it gets from a word that gives
    /// it at least `FRESH_MIN`, and no other; it hands the others to be
    /// counted. A held give-back returns the marked ones as fresh (none of
    /// them dropped by `drop_run`) and clears their marks, in any order of
    /// the list.
    #[test]
    fn fresh_ids_are_marked_and_given_back_unmarked() {
        for &(len, shards) in &[(1u32, 1usize), (64, 1), (65, 1), (200, 3), (5000, 7)] {
            for order in 0..3 {
                let free = list(len, shards);
                let mut out = Vec::with_capacity(len as usize);
                let mut firsts = Vec::new();
                let half = (len as usize).div_ceil(2);
                let mut taker = Taker {
                    fresh: true,
                    first: |ids: &[BlockId]| firsts.extend_from_slice(ids),
                };
                assert_eq!(free.pop(half, &mut out, &mut taker), half);
                let mut rest = Vec::with_capacity(len as usize);
                if half < len as usize {
                    let others = len as usize - half;
                    assert_eq!(
                        free.pop_everywhere(others, &mut rest, &mut counted()),
                        others
                    );
                }
                // The ids taken from each word, and which are marked.
                let word_count = |id: BlockId| {
                    let place = free.word_of(id).place;
                    out.iter()
                        .filter(|&&o| free.word_of(o).place == place)
                        .count()
                };
                for id in 0..len {
                    let id = BlockId::new(id);
                    let marked = out.contains(&id) && word_count(id) >= FRESH_MIN;
                    assert_eq!(free.is_fresh(id), marked, "{id}");
                    assert_eq!(firsts.contains(&id), out.contains(&id) && !marked, "{id}");
                }
                let mut marked: Vec<BlockId> = out
                    .iter()
                    .copied()
                    .filter(|&id| free.is_fresh(id))
                    .collect();
                match order {
                    0 => {}
                    1 => marked.reverse(),
                    _ => marked.sort_by_key(|id| (id.index() * 7919) % len as usize),
                }
                let (give, left) = free.gather_held(
                    &marked,
                    |_| true,
                    // A bare word stops a drop at once.
                    |_, _| 0,
                );
                free.give(give);
                assert_eq!((give.len(), left), (marked.len(), 0));
                assert!((0..len).all(|id| !free.is_fresh(BlockId::new(id))));
                let mut give = Give::new();
                for &id in &firsts {
                    give = give.add(&free, id);
                }
                free.give(give);
                let mut again = Vec::with_capacity(half);
                assert_eq!(
                    free.pop_everywhere(len as usize, &mut again, &mut counted()),
                    half
                );
                again.sort();
                out.sort();
                assert_eq!(again, out);
            }
        }
    }

    /// A held give-back asks `drop_run` for the blocks that are not fresh,
    /// in runs of consecutive ids within one word, last first; it stops
    /// before the first block that `drop_run` leaves, and gives back the
    /// fresh blocks after it.
    #[test]
    fn counted_blocks_go_to_drop_run_in_runs() {
        let free = list(128, 1);
        let mut small = Vec::with_capacity(128);
        assert_eq!(free.pop(4, &mut small, &mut fresh()), 4); // 0..4, counted
        assert!(small.iter().all(|&id| !free.is_fresh(id)));
        let mut large = Vec::with_capacity(128);
        assert_eq!(free.pop(100, &mut large, &mut fresh()), 100); // 4..104
        assert!(large.iter().all(|&id| free.is_fresh(id)));
        // Listed: 0..4 counted, then 4..104 fresh.
        let ids: Vec<BlockId> = small.iter().chain(&large).copied().collect();
        let mut runs = Vec::new();
        let (give, left) = free.gather_held(
            &ids,
            |id| large.contains(&id),
            |lo, hi| {
                runs.push((lo, hi));
                // Drops from `hi - 1` down to a bare word (a fresh block,
                // 4 and up) or to block 1, which it leaves.
                (lo..hi).rev().take_while(|&i| (2..4).contains(&i)).count()
            },
        );
        // The fresh runs are tried as counted first (0 dropped: bare).
        assert_eq!(runs, [(64, 104), (0, 64), (0, 4)]);
        assert_eq!((give.len(), left), (102, 2));
        free.give(give);
        assert!(!free.is_fresh(BlockId::new(50)));
        let mut back = Vec::with_capacity(128);
        assert_eq!(
            free.pop_everywhere(128, &mut back, &mut counted()),
            102 + 24
        );
    }

    /// A run of counted blocks listed after fresh ones with consecutive ids
    /// (a prompt's fresh blocks, then a few decoded blocks counted one by
    /// one): `drop_run` stops at the first fresh one, and the fresh run
    /// still goes back as fresh, without `drop_run`.
    #[test]
    fn a_counted_run_after_a_fresh_one_goes_on_into_it() {
        let free = list(128, 1);
        let mut large = Vec::with_capacity(128);
        assert_eq!(free.pop(100, &mut large, &mut fresh()), 100); // 0..100
        let mut small = Vec::with_capacity(128);
        assert_eq!(free.pop(4, &mut small, &mut fresh()), 4); // 100..104
        let ids: Vec<BlockId> = large.iter().chain(&small).copied().collect();
        let mut runs = Vec::new();
        let (give, left) = free.gather_held(
            &ids,
            |id| large.contains(&id),
            |lo, hi| {
                runs.push((lo, hi));
                // Counted blocks (100..) go; a fresh one stops the run.
                (lo..hi).rev().take_while(|&i| i >= 100).count()
            },
        );
        free.give(give);
        assert_eq!((give.len(), left), (104, 0));
        assert_eq!(runs, [(64, 104), (0, 64)]); // words of 64
        assert!((0..128).all(|id| !free.is_fresh(BlockId::new(id))));
        let mut back = Vec::with_capacity(128);
        assert_eq!(free.pop_everywhere(128, &mut back, &mut counted()), 128);
    }

    /// `consecutive_before` counts the consecutive ids at the end of a
    /// list, up to its limit.
    #[test]
    fn consecutive_runs_are_counted_from_the_end() {
        let ids = |v: &[u32]| v.iter().map(|&i| BlockId::new(i)).collect::<Vec<_>>();
        assert_eq!(consecutive_before(&ids(&[]), 64), 0);
        assert_eq!(consecutive_before(&ids(&[7]), 64), 1);
        assert_eq!(consecutive_before(&ids(&[3, 5, 6, 7]), 64), 3);
        assert_eq!(consecutive_before(&ids(&[3, 5, 6, 7]), 2), 2);
        let long: Vec<u32> = (100..140).collect();
        assert_eq!(consecutive_before(&ids(&long), 64), 40);
        assert_eq!(consecutive_before(&ids(&long), 17), 17);
        let mut broken = long.clone();
        broken[29] = 0;
        assert_eq!(consecutive_before(&ids(&broken), 64), 10);
        broken[39] = 0;
        assert_eq!(consecutive_before(&ids(&broken), 64), 1);
        // Runs that reach id 0, and ids at the top of the range.
        let low: Vec<u32> = (0..20).collect();
        assert_eq!(consecutive_before(&ids(&low), 64), 20);
        assert_eq!(consecutive_before(&ids(&low[3..]), 64), 17);
        let high: Vec<u32> = (u32::MAX - 30..=u32::MAX).collect();
        assert_eq!(consecutive_before(&ids(&high), 64), 31);
        // Against one id at a time, for every break and limit.
        let naive = |v: &[BlockId], max: usize| {
            let mut run = usize::from(!v.is_empty());
            while run < max.min(v.len())
                && v[v.len() - 1 - run].index() + run == v[v.len() - 1].index()
            {
                run += 1;
            }
            run
        };
        for len in 0..80 {
            let base: Vec<u32> = (1000..1000 + len).collect();
            for cut in 0..len as usize {
                let mut v = base.clone();
                v[cut] = 5;
                for max in [1, 7, 8, 9, 16, 63, 64, 100] {
                    let v = ids(&v);
                    assert_eq!(
                        consecutive_before(&v, max),
                        naive(&v, max),
                        "len {len} cut {cut} max {max}"
                    );
                }
            }
        }
    }

    /// A summary bit cleared while its word was empty is set again by the
    /// give-back that fills the word.
    #[test]
    fn a_refilled_word_is_found_through_its_summary() {
        let free = list(256, 1);
        let mut out = Vec::with_capacity(256);
        assert_eq!(free.pop(256, &mut out, &mut counted()), 256);
        // Every group looks empty: the next pop clears every summary bit.
        let mut none = Vec::with_capacity(1);
        assert_eq!(free.pop(1, &mut none, &mut counted()), 0);
        // Relaxed: one thread; nothing else to order.
        assert_eq!(free.summaries[0].load(Ordering::Relaxed), 0);
        free.give(Give::new().add(&free, out[200]));
        assert_eq!(free.pop(1, &mut none, &mut counted()), 1);
        assert_eq!(none, [out[200]]);
    }

    /// Every word of both bitmaps: what a refused give-back must leave as
    /// it was.
    fn bitmaps(free: &FreeList) -> Vec<(u64, u64)> {
        (0..free.shards())
            .flat_map(|s| (0..free.words).map(move |w| (s, w)))
            .map(|(s, w)| {
                // Relaxed (both): one thread; nothing else to order.
                (
                    free.word(s, w).load(Ordering::Relaxed),
                    free.fresh_word(s, w).load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// A run of consecutive fresh ids goes back whole, across words and
    /// shards (fresh bits cleared, free bits set); a list that is not one
    /// (a block not fresh, ids out of order, repeated or out of range, no
    /// ids) is refused with both bitmaps unchanged.
    #[test]
    fn a_fresh_run_goes_back_whole_or_not_at_all() {
        for &(len, shards) in &[(64u32, 1usize), (65, 1), (200, 3), (5000, 7)] {
            let free = list(len, shards);
            let mut out = Vec::with_capacity(len as usize);
            assert_eq!(free.pop(len as usize, &mut out, &mut fresh()), len as usize);
            out.sort();
            let fresh_ids: Vec<BlockId> = out
                .iter()
                .copied()
                .filter(|&id| free.is_fresh(id))
                .collect();
            let before = bitmaps(&free);
            let refuse = |ids: &[BlockId], why: &str| {
                assert!(!free.give_fresh_run(ids), "{len}/{shards}: {why}");
                assert_eq!(bitmaps(&free), before, "{len}/{shards}: {why}");
            };
            refuse(&[], "no ids");
            // Every id: a run, but with counted blocks where a word held
            // fewer than `FRESH_MIN` (all but the first shape).
            if fresh_ids.len() < out.len() {
                refuse(&out, "a counted block");
            }
            let mut swapped = fresh_ids.clone();
            swapped.swap(3, 40);
            refuse(&swapped, "out of order");
            let mut repeated = fresh_ids[..20].to_vec();
            repeated[19] = repeated[18];
            refuse(&repeated, "repeated");
            let past: Vec<BlockId> = (len - 2..len + 2).map(BlockId::new).collect();
            refuse(&past, "out of range");
            // A block whose reference was counted (its fresh bit cleared).
            let word = free.word_of(fresh_ids[30]);
            free.clear_fresh(word.place, 1 << (fresh_ids[30].index() as u32 - word.base));
            let before = bitmaps(&free);
            assert!(!free.give_fresh_run(&fresh_ids[..40]));
            assert_eq!(bitmaps(&free), before, "{len}/{shards}: a counted block");
            // The fresh ids in their maximal runs, each given back in
            // pieces of up to 100 (which start and end inside words).
            let mut runs: Vec<Vec<BlockId>> = Vec::new();
            for &id in &fresh_ids {
                match runs.last_mut() {
                    Some(run)
                        if id.index() == run[run.len() - 1].index() + 1 && id != fresh_ids[30] =>
                    {
                        run.push(id)
                    }
                    _ if id == fresh_ids[30] => {}
                    _ => runs.push(vec![id]),
                }
            }
            let mut given = Vec::new();
            for run in &runs {
                for piece in run.chunks(100) {
                    assert!(free.give_fresh_run(piece), "{len}/{shards}: {piece:?}");
                    given.extend_from_slice(piece);
                }
            }
            assert!(given.iter().all(|&id| !free.is_fresh(id)));
            let mut again = Vec::with_capacity(len as usize);
            free.pop_everywhere(len as usize, &mut again, &mut counted());
            again.sort();
            given.sort();
            assert_eq!(again, given, "{len}/{shards}");
        }
    }

    /// `is_run` agrees with the one-by-one definition for every length up
    /// to 200 (full chunks of 64, 128, 192 and every tail), a wrong id at
    /// every position (off by one either way, by 64, by a high bit, or two
    /// neighbours swapped), for starts at 0 and near `u32::MAX`.
    #[test]
    fn is_run_catches_every_wrong_position() {
        let slow = |ids: &[BlockId], lo: u32| {
            ids.iter()
                .enumerate()
                .all(|(i, id)| u64::from(id.index() as u32) == u64::from(lo) + i as u64)
        };
        for n in 0..=200u32 {
            // The last start whose run ends at `u32::MAX - 1` (callers'
            // ids stay below `len <= MAX_BLOCKS`).
            for lo in [0, 63, u32::MAX - 1 - n] {
                let good: Vec<BlockId> = (0..n).map(|i| BlockId::new(lo + i)).collect();
                assert!(is_run(&good, lo), "{n} from {lo}");
                if n > 0 {
                    assert!(!is_run(&good, lo + 1), "{n} from {lo}: lo off");
                    if lo > 0 {
                        assert!(!is_run(&good, lo - 1), "{n} from {lo}: lo off");
                    }
                }
                for pos in 0..n as usize {
                    let id = good[pos].index() as u32;
                    let mut wrongs = vec![
                        id.wrapping_add(1),
                        id.wrapping_sub(1),
                        id.wrapping_add(64),
                        id.wrapping_sub(64),
                        id ^ (1 << 31),
                        id ^ 1,
                        lo,
                    ];
                    wrongs.retain(|&w| w != id && w != BlockId::NULL.index() as u32);
                    for w in wrongs {
                        let mut bad = good.clone();
                        bad[pos] = BlockId::new(w);
                        assert!(!is_run(&bad, lo), "{n} from {lo}: {w} at {pos}");
                        assert_eq!(is_run(&bad, lo), slow(&bad, lo));
                    }
                    if pos + 1 < n as usize {
                        let mut bad = good.clone();
                        bad.swap(pos, pos + 1);
                        assert!(!is_run(&bad, lo), "{n} from {lo}: swap at {pos}");
                    }
                }
            }
        }
    }

    /// `run_words` yields, for any run `lo..=hi`, exactly the words and
    /// masks that grouping its ids by `word_of` gives (runs that start
    /// and end mid-word, cover short last words, cross shards, in pools
    /// whose last shard is shorter and shards of more than 64 words).
    #[test]
    fn run_words_matches_word_of_per_id() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut rand = move |n: u32| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % u64::from(n)) as u32
        };
        for &(len, shards) in &[
            (1u32, 1usize),
            (63, 1),
            (64, 2),
            (65, 1),
            (130, 3),
            (1000, 7),
            (4097, 3),
            (8193, 2),
            (20_000, 2),
            (20_001, 3),
            (300_001, 7),
            (300_000, 2),
        ] {
            let free = list(len, shards);
            let check = |lo: u32, hi: u32| {
                let mut got: Vec<(Place, u64)> = Vec::new();
                assert!(free.run_words(lo, hi, |place, mask| {
                    got.push((place, mask));
                    true
                }));
                let mut want: Vec<(Place, u64)> = Vec::new();
                for id in lo..=hi {
                    let w = free.word_of(BlockId::new(id));
                    let bit = 1u64 << (id - w.base);
                    match want.last_mut() {
                        Some((p, m)) if *p == w.place => *m |= bit,
                        _ => want.push((w.place, bit)),
                    }
                }
                assert_eq!(got, want, "{len}/{shards}: {lo}..={hi}");
            };
            // Runs from and to every shard boundary +- 1 and random runs.
            let span = free.span;
            let mut edges = vec![0, len - 1];
            for s in 1..shards as u32 {
                for d in [0i64, -1, 1, -64, 63, 64] {
                    let e = i64::from(s * span) + d;
                    if (0..i64::from(len)).contains(&e) {
                        edges.push(e as u32);
                    }
                }
            }
            for &a in &edges {
                for &b in &edges {
                    if a <= b && b - a <= 5000 {
                        check(a, b);
                    }
                }
            }
            for _ in 0..300 {
                let lo = rand(len);
                let n = 1 + rand(300.min(len - lo));
                check(lo, lo + n - 1);
            }
        }
    }

    /// Fresh runs given back in random pieces (crossing words, short last
    /// words and shards) come back through the summaries alone: `pop`
    /// (never `pop_everywhere`) finds every id, each once, in shards of
    /// up to 157 words (4 words a summary bit).
    #[test]
    fn fresh_runs_given_back_are_found_through_the_summaries() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut rand = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        for &(len, shards) in &[
            (1000u32, 7usize),
            (4097, 3),
            (8200, 1),
            (20_000, 2),
            (20_001, 3),
            (40_000, 1),
            (65_537, 4),
        ] {
            let free = list(len, shards);
            for round in 0..3 {
                let mut out = Vec::with_capacity(len as usize);
                let mut t = fresh();
                let mut got = 0;
                // Several pops (so through the summaries and the fast path).
                while got < len as usize {
                    let k = (1 + rand(200)).min(len as usize - got);
                    let n = free.pop(k, &mut out, &mut t);
                    assert_eq!(n, k, "{len}/{shards} round {round}: pop after {got}");
                    got += n;
                }
                assert_eq!(free.pop(1, &mut out, &mut counted()), 0);
                out.sort();
                out.dedup();
                assert_eq!(out.len(), len as usize, "{len}/{shards}: an id twice");
                // Give back: fresh runs in random pieces (in a random order
                // of pieces), the counted ones through `Give`.
                let mut pieces: Vec<Vec<BlockId>> = Vec::new();
                let mut counted_ids = Vec::new();
                let mut i = 0;
                while i < out.len() {
                    if !free.is_fresh(out[i]) {
                        counted_ids.push(out[i]);
                        i += 1;
                        continue;
                    }
                    let mut j = i + 1;
                    let cap = i + 1 + rand(300);
                    while j < out.len()
                        && j < cap
                        && free.is_fresh(out[j])
                        && out[j].index() == out[j - 1].index() + 1
                    {
                        j += 1;
                    }
                    pieces.push(out[i..j].to_vec());
                    i = j;
                }
                for k in (1..pieces.len()).rev() {
                    pieces.swap(k, rand(k + 1));
                }
                for piece in &pieces {
                    assert!(free.give_fresh_run(piece), "{len}/{shards}: {piece:?}");
                }
                let mut give = Give::new();
                for &id in &counted_ids {
                    give = give.add(&free, id);
                }
                free.give(give);
            }
            // Everything back, each once: through the summaries alone.
            let mut again = Vec::with_capacity(len as usize);
            assert_eq!(
                free.pop(len as usize, &mut again, &mut counted()),
                len as usize,
                "{len}/{shards}"
            );
            again.sort();
            again.dedup();
            assert_eq!(again.len(), len as usize);
        }
    }

    /// A single word given back to an otherwise empty list whose summary
    /// bits were all cleared is found by `pop` through the summaries
    /// alone, for every word of shards of 65 to 2,344 words (2 to 64 words
    /// a summary bit, a group count that is not a power of two, a short
    /// last group): its summary bit is the one whose group holds it.
    #[test]
    fn each_lone_word_is_found_through_its_summary_bit() {
        for &(len, shards) in &[
            (4097u32, 1usize),
            (9000, 1),
            (20_000, 2),
            (20_801, 1),
            (40_000, 3),
            (300_000, 2),
        ] {
            let free = list(len, shards);
            let mut all = Vec::with_capacity(len as usize);
            assert_eq!(
                free.pop(len as usize, &mut all, &mut counted()),
                len as usize
            );
            // Nothing left: this take finds every group empty and clears
            // every summary bit.
            assert_eq!(free.pop(1, &mut all, &mut counted()), 0);
            // Relaxed: one thread; nothing else to order.
            assert!(free
                .summaries
                .iter()
                .all(|s| s.load(Ordering::Relaxed) == 0));
            all.sort();
            let mut by_word: Vec<Vec<BlockId>> = Vec::new();
            let mut last: Option<Place> = None;
            for &id in &all {
                let place = free.word_of(id).place;
                if last != Some(place) {
                    by_word.push(Vec::new());
                    last = Some(place);
                }
                by_word.last_mut().unwrap().push(id);
            }
            for ids in &by_word {
                let mut give = Give::new();
                for &id in ids {
                    give = give.add(&free, id);
                }
                free.give(give);
                let mut out = Vec::with_capacity(ids.len());
                let n = free.pop(ids.len(), &mut out, &mut counted());
                let at = free.word_of(ids[0]).place;
                assert_eq!(n, ids.len(), "{len}/{shards}: word {at:?} not found");
                out.sort();
                assert_eq!(&out, ids, "{len}/{shards}");
                assert_eq!(free.pop(1, &mut out, &mut counted()), 0);
            }
        }
    }
}
