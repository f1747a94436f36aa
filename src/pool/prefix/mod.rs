//! The prefix cache of a [`BlockPool`], a layer a pool is built with or
//! without ([`BlockPoolBuilder::prefix_cache`](crate::BlockPoolBuilder::prefix_cache)):
//! its storage ([`PrefixCache`]: the blocks' keys and their index, the
//! eviction order, the hit statistics), matching keys to cached blocks,
//! evicting, dropping every key, and the statistics here; publishing in
//! `publish.rs`; the keys and the index in `keys.rs`; the eviction order
//! in `lru.rs`; the cache's transitions of the per-block state word in
//! `state.rs`.
//!
//! The core pool calls into this layer at two places only: a drop of a
//! cached block's last reference (the block becomes evictable and is
//! stamped, [`Evictions`]) and an allocation that finds the free list
//! short (it evicts, [`BlockPool::evict_into`]). In a pool without the
//! layer no block is ever cached, so neither happens.
//!
//! The design and the orderings are described in
//! [`crate::implementation`] ("Prefix cache").

use std::collections::TryReserveError;

use crate::hash::BlockHash;
use crate::id::BlockId;
use crate::sync::{self, AtomicU64, Backoff, CachePadded, Faults, Ordering};

use super::refs::{count_of, Holder, CACHED};
use super::BlockPool;

mod events;
mod keys;
mod lru;
mod publish;
mod state;

pub(crate) use events::GroupTag;
pub use events::KvEvent;
use events::{Events, EventsRoom, Ticket};
use keys::{Keys, KeysRoom};
use lru::{Lru, LruRoom};
pub(crate) use publish::Published;
use state::{is_evictable, kept_key};

/// The prefix cache's storage: per block, its key (4 words) and a share of
/// the index (2.5 slots), a release stamp, half a candidate slot of the
/// eviction ring and a bit of its refill's map; per pool, the statistics'
/// cells; and the KV event rings, if chosen.
pub(super) struct PrefixCache {
    /// The blocks' keys and the index over them.
    keys: Keys,
    /// The eviction order.
    lru: Lru,
    /// The hit statistics.
    stats: Stats,
    /// The KV event rings, if the pool records events.
    events: Option<Events>,
}

/// The room of a [`PrefixCache`]'s per-block arrays, reserved by
/// [`PrefixCache::room`] and not yet written.
pub(super) struct PrefixCacheRoom {
    keys: KeysRoom,
    lru: LruRoom,
    events: Option<EventsRoom>,
}

/// The KV event rings a prefix cache is built with: records in all, and
/// rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct EventsShape {
    pub(super) capacity: usize,
    pub(super) rings: usize,
}

impl PrefixCache {
    /// Reserves the room of the per-block arrays for `num_blocks` blocks,
    /// largest first, and of the KV event rings if `events` says so, or
    /// returns the allocator's refusal (nothing is left allocated then).
    pub(super) fn room(
        num_blocks: usize,
        events: Option<EventsShape>,
    ) -> Result<PrefixCacheRoom, TryReserveError> {
        Ok(PrefixCacheRoom {
            keys: Keys::room(num_blocks)?,
            lru: Lru::room(num_blocks)?,
            events: events
                .map(|shape| Events::room(shape.capacity, shape.rings, num_blocks))
                .transpose()?,
        })
    }

    /// The cache, in the room reserved for it, whose statistics have
    /// `cells` cells, carrying `faults`.
    pub(super) fn new(room: PrefixCacheRoom, cells: usize, faults: Faults) -> PrefixCache {
        PrefixCache {
            keys: Keys::new(room.keys, faults),
            lru: Lru::new(room.lru, faults),
            stats: Stats::new(cells),
            events: room.events.map(|room| Events::new(room, faults)),
        }
    }

    /// The heap bytes [`room`](Self::room) and [`new`](Self::new) ask for
    /// with `num_blocks` blocks, `cells` cells and `events`' rings, and
    /// the pool's box of the cache itself.
    pub(super) fn heap_bytes(
        num_blocks: usize,
        cells: usize,
        events: Option<EventsShape>,
    ) -> usize {
        std::mem::size_of::<PrefixCache>()
            .saturating_add(Keys::heap_bytes(num_blocks))
            .saturating_add(Lru::heap_bytes(num_blocks))
            .saturating_add(Stats::heap_bytes(cells))
            .saturating_add(events.map_or(0, |shape| {
                Events::heap_bytes(shape.capacity, shape.rings, num_blocks)
            }))
    }

    /// The eviction ring's capacity, candidates and overflowed state (see
    /// `Lru::ring`), for the loom models.
    #[cfg(all(test, kvslots_loom))]
    pub(super) fn eviction_ring(&self) -> (usize, usize, bool) {
        self.lru.ring()
    }

    /// Moves the eviction ring's head past every candidate (see
    /// `BlockPool::pass_eviction_candidates`).
    #[cfg(all(test, kvslots_loom))]
    pub(super) fn pass_eviction_candidates(&self) {
        self.lru.pass_candidates();
    }

    /// Takes `n` stamps of the release clock (see
    /// `BlockPool::skip_release_stamps`).
    #[cfg(all(test, kvslots_loom))]
    pub(super) fn skip_release_stamps(&self, n: u32) {
        self.lru.stamps(n as usize);
    }

    /// The KV events lost to full rings so far, if the cache records
    /// events.
    pub(super) fn events_lost(&self) -> Option<u64> {
        self.events.as_ref().map(Events::lost)
    }

    /// A reservation in the KV event ring of the key whose index probe is
    /// `probe`, if the cache records events.
    fn ticket(&self, probe: keys::Probe) -> Option<Ticket<'_>> {
        Some(self.events.as_ref()?.reserve(probe))
    }

    /// Removes the index entry of block `id`, whose key the caller just
    /// dropped and which it holds alone.
    fn forget_key(&self, id: BlockId) {
        let key = self.keys.read(id);
        let removed = self.keys.remove(self.keys.probe(&key), id, None);
        debug_assert!(removed, "{id} was cached without an index entry");
    }
}

/// Blocks that a give-back stamps with one read-modify-write of the
/// release clock and appends to the eviction ring with one CAS (a batch of
/// candidate words on the stack, 256 bytes).
const STAMP_BATCH: usize = 32;

/// The cached blocks that one give-back made evictable (the core's drop of
/// their last reference): they stay cached, as the most recently released,
/// with stamps in the order of the drops, and join the eviction ring in
/// batches (one CAS on its length a batch), oldest first. Each batch takes
/// its range of stamps from the clock when its first block is dropped,
/// and each block's stamp is written as soon as its drop returns, so that
/// a refill's scan that sees a block evictable nearly always sees its new
/// stamp, and a give-back that is descheduled midway gives early stamps
/// to one batch at most.
pub(super) struct Evictions {
    /// The give-back's drops.
    total: usize,
    /// The first stamp of the batch, and the batch, once a block is
    /// evictable (a give-back of uncached blocks clears no 256 bytes).
    stamped: Option<(u64, [u64; STAMP_BATCH])>,
    batched: usize,
    /// Blocks made evictable so far.
    count: usize,
}

impl Evictions {
    /// None yet, of a give-back of `total` drops.
    pub(super) fn new(total: usize) -> Evictions {
        Evictions {
            total,
            stamped: None,
            batched: 0,
            count: 0,
        }
    }

    /// How many blocks were made evictable.
    pub(super) fn count(&self) -> usize {
        self.count
    }

    /// Block `id`, whose last reference went at drop number `i` of the
    /// give-back, is evictable.
    pub(super) fn push(&mut self, cache: &PrefixCache, id: BlockId, i: usize) {
        let lru = &cache.lru;
        // A closure, so that the 256 bytes are zeroed once, not on every
        // call.
        #[allow(clippy::unnecessary_lazy_evaluations)]
        let (base, batch) = self.stamped.get_or_insert_with(|| (0, [0; STAMP_BATCH]));
        if self.batched == 0 {
            // At most the drops left, this one included: a batch never
            // outgrows its range.
            *base = lru.stamps(STAMP_BATCH.min(self.total - i));
        }
        let stamp = *base + self.batched as u64;
        lru.stamp(id, stamp);
        batch[self.batched] = lru.word(id, stamp);
        self.batched += 1;
        if self.batched == STAMP_BATCH {
            lru.append_all(batch);
            self.batched = 0;
        }
        self.count += 1;
    }

    /// Appends the last batch to the ring.
    pub(super) fn finish(&mut self, cache: &PrefixCache) {
        if let Some((_, batch)) = &self.stamped {
            cache.lru.append_all(&batch[..self.batched]);
        }
        self.batched = 0;
    }
}

/// The prefix cache's hit statistics, as [`BlockPool::prefix_stats`]
/// returns them.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use kvslots::{hash_blocks, BlockPool, PrefixStats, Sequence};
///
/// let pool = Arc::new(BlockPool::new(8, 4));
/// let mut keys = Vec::new();
/// hash_blocks(b"", &[1, 2, 3, 4, 5, 6, 7, 8], 4, &mut keys);
/// let mut seq = Sequence::new(Arc::clone(&pool));
/// assert_eq!(seq.try_match_prefix(&keys), 0);
/// seq.try_append(8).unwrap();
/// seq.publish(&keys);
/// drop(seq);
/// let mut again = Sequence::new(Arc::clone(&pool));
/// assert_eq!(again.try_match_prefix(&keys), 2);
/// assert_eq!(
///     pool.prefix_stats(),
///     PrefixStats { queried_blocks: 4, hit_blocks: 2, evictions: 0 }
/// );
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Keys passed to [`Sequence::try_match_prefix`](crate::Sequence::try_match_prefix)
    /// on empty sequences (and those a
    /// [`HybridSequence::try_match_prefix`](crate::HybridSequence::try_match_prefix)
    /// looks up, group by group).
    pub queried_blocks: u64,
    /// Blocks those calls matched (a hybrid match's blocks of every group
    /// it took, also those it gave back because another group served a
    /// shorter prefix).
    pub hit_blocks: u64,
    /// Cached blocks whose key an allocation dropped to reuse the block.
    pub evictions: u64,
}

/// One thread's share of the statistics, on a cache line of its own.
#[derive(Default)]
pub(super) struct StatCell {
    queried: AtomicU64,
    hit: AtomicU64,
    evictions: AtomicU64,
}

/// The statistics: one cell per free-list shard (at least
/// [`BlockPool::DEFAULT_SHARDS`] cells, also for pools with fewer shards),
/// written by the threads whose number picks it, as a thread's number
/// picks its home shard.
pub(super) struct Stats {
    cells: Box<[CachePadded<StatCell>]>,
}

impl Stats {
    /// `cells` cells of zeros.
    pub(super) fn new(cells: usize) -> Stats {
        Stats {
            cells: (0..cells.max(1))
                .map(|_| CachePadded::new(StatCell::default()))
                .collect(),
        }
    }

    /// The heap bytes [`new`](Self::new) asks for with `cells` cells.
    fn heap_bytes(cells: usize) -> usize {
        cells
            .max(1)
            .saturating_mul(std::mem::size_of::<CachePadded<StatCell>>())
    }

    /// The calling thread's cell.
    fn mine(&self) -> &StatCell {
        &self.cells[sync::thread_index() % self.cells.len()]
    }

    /// The sums over every cell.
    fn sum(&self) -> PrefixStats {
        let mut out = PrefixStats::default();
        for cell in self.cells.iter() {
            // Acquire: pairs with the Release add of `hit` in
            // `match_prefix`, which comes after its add of `queried`; so the
            // `queried` load below sees every query whose hits this load
            // saw, and no snapshot shows more hits than queries.
            let hit = cell.hit.load(Ordering::Acquire);
            // Relaxed (both): statistics; they order nothing else.
            out.queried_blocks += cell.queried.load(Ordering::Relaxed);
            out.hit_blocks += hit;
            out.evictions += cell.evictions.load(Ordering::Relaxed);
        }
        out
    }
}

/// Adds `n` to a statistic of the calling thread's cell.
fn add(counter: &AtomicU64, n: u64) {
    if n != 0 {
        // Relaxed: a statistic; the cell is (nearly always) written by
        // this thread alone, so the line stays in its core.
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The hits a match screens through a filter of 256 bits (comparing a hit
/// with the blocks taken when its bit is set) before it builds its filter
/// sized to the pool.
const DIRECT: usize = 32;
/// The most blocks a match admits ahead for its revivals in one
/// read-modify-write: with room to spare, a match of `k` evictable blocks
/// makes `k / AHEAD_MAX` admissions or one more (on a nearly full pool, or
/// with a stale view of the other shards, up to one a revival), and other
/// callers miss at most `AHEAD_MAX` blocks admitted and not yet used
/// while it runs.
const AHEAD_MAX: usize = 64;
/// Words of the filter of block ids that one match has taken, in a pool of
/// up to 32,768 blocks: a bit per block (4 KiB on the stack, zeroed only by
/// matches longer than [`DIRECT`]).
const TAKEN_WORDS: usize = 512;
/// Words of the filter in a pool of more than 32,768 blocks (131,072 bits,
/// 16 KiB on the stack, zeroed only by matches longer than [`DIRECT`]): a
/// bit per block in a pool of up to 131,072 blocks. In a larger pool, ids
/// that differ by a multiple of 131,072 share a bit, and a hit on a shared
/// bit scans the blocks taken (see [`BlockPool::match_prefix`]).
const TAKEN_WORDS_LARGE: usize = 2048;

/// What one key's revival in a match may take: the blocks the match
/// admitted ahead and has not used (`credits`), whether it ever admitted
/// ahead, and how many keys are left in it, this one included.
struct Revival<'a> {
    credits: &'a mut usize,
    admitted_ahead: &'a mut bool,
    ahead: usize,
    /// The caller's reserved blocks that a revival may lend (see
    /// [`BlockPool::match_prefix_lending`]), and how many it has lent.
    lendable: &'a [BlockId],
    lent: &'a mut usize,
    /// Whether `credits` is the one credit of the block lent last (a
    /// block is lent only when no credit is left).
    lent_credit: &'a mut bool,
}

/// The blocks one match has taken, as a filter of `W` words on the stack:
/// block `id` sets bit `id % (64 * W)`. Exact for ids below `64 * W` (a set
/// bit is a block taken); ids that differ by a multiple of `64 * W` share a
/// bit, so past that a set bit says only that the block may be taken.
struct Taken<const W: usize> {
    words: [u64; W],
}

impl<const W: usize> Taken<W> {
    /// The filter of the blocks `taken`.
    fn of(taken: &[BlockId]) -> Taken<W> {
        let mut filter = Taken { words: [0; W] };
        for &id in taken {
            filter.insert(id);
        }
        filter
    }

    /// Sets the bit of block `id`; returns whether it was set already.
    fn insert(&mut self, id: BlockId) -> bool {
        let bit = id.index() % (W * 64);
        let (word, mask) = (bit / 64, 1u64 << (bit % 64));
        let set = self.words[word] & mask != 0;
        self.words[word] |= mask;
        set
    }
}

impl BlockPool {
    /// Takes one reference on each block of the longest cached prefix of
    /// `hashes`, appends them to `out` and returns how many. The caller has
    /// reserved room in `out` for `min(hashes.len(), num_blocks)` ids.
    ///
    /// Stops at the first key whose block this call has already taken.
    /// While we hold that block it keeps its key, and a key names one
    /// cached block at a time (first wins), so that is the first key equal
    /// to an earlier one: a list of chained hashes never repeats a key, so
    /// only a list that is not one (misuse) is cut short there. So the
    /// blocks taken are distinct, at most `num_blocks` of them, and the
    /// table cannot outgrow the pool.
    ///
    /// The first [`DIRECT`] hits are looked up in a filter of 256 bits of
    /// the blocks taken so far, and compared with them only when their bit
    /// is set; a longer match builds a filter of the block ids taken on the
    /// stack, sized to the pool: [`TAKEN_WORDS`] words (32,768 bits) in a
    /// pool of up to 32,768 blocks, [`TAKEN_WORDS_LARGE`] (131,072 bits)
    /// in a larger one. Only a hit in the filter scans the blocks taken.
    /// In a pool of up to 131,072 blocks the filter is exact: a hit is a
    /// repeated key, which ends the match, so a match's cost is linear in
    /// its length. In a larger pool, ids that differ by a multiple of
    /// 131,072 share a bit, and each hit on a bit already set scans the
    /// blocks taken: a match whose blocks share bits (every match of more
    /// than 131,072 blocks does) costs up to its length times the blocks
    /// taken.
    pub(crate) fn match_prefix(&self, hashes: &[BlockHash], out: &mut Vec<BlockId>) -> usize {
        self.match_prefix_lending(hashes, out, 0, &mut 0)
    }

    /// [`match_prefix`](Self::match_prefix) for a caller whose `out` ends
    /// with `lendable` blocks of a reservation (held alone, holding no
    /// token): a revival that finds no credit left lends the last of them
    /// not lent yet ([`lend_held`](Self::lend_held)) and spends its credit
    /// before it admits anything. `*lent` counts the entries lent, which
    /// are `out[base - *lent..base]` (`base` the length of `out` on entry)
    /// and no longer the caller's; it is counted as each goes, so that it
    /// is right also when a waker's panic unwinds out of the match.
    pub(crate) fn match_prefix_lending(
        &self,
        hashes: &[BlockHash],
        out: &mut Vec<BlockId>,
        lendable: usize,
        lent: &mut usize,
    ) -> usize {
        if self.refs.len() <= TAKEN_WORDS * 64 {
            self.match_filtered::<TAKEN_WORDS>(hashes, out, lendable, lent)
        } else {
            self.match_filtered::<TAKEN_WORDS_LARGE>(hashes, out, lendable, lent)
        }
    }

    /// [`match_prefix`](Self::match_prefix) with a filter of `W` words.
    /// Never inlined, so that a match in a pool of up to 32,768 blocks
    /// takes the small filter's 4 KiB of stack, not both filters' 20 KiB
    /// (small stacks matter: loom runs each model thread on 32 KiB).
    #[inline(never)]
    fn match_filtered<const W: usize>(
        &self,
        hashes: &[BlockHash],
        out: &mut Vec<BlockId>,
        lendable: usize,
        lent: &mut usize,
    ) -> usize {
        let Some(cache) = self.prefix.as_deref() else {
            return 0;
        };
        let base = out.len();
        let lendable = lendable.min(base);
        let mut filter: Option<Taken<W>> = None;
        // The first `DIRECT` blocks taken, as a filter of 256 bits: a hit
        // scans them only when its bit is set.
        let mut near = Taken::<4> { words: [0; 4] };
        let mut hits = 0;
        // Blocks admitted ahead for the evictable blocks this match revives
        // (see `match_one`); what goes unused is given back at the end.
        let (mut credits, mut admitted_ahead) = (0, false);
        // Whether the credit left is a lent block's (see `match_one`).
        let mut lent_credit = false;
        for (i, key) in hashes.iter().enumerate() {
            let ahead = hashes.len() - i;
            let revival = Revival {
                credits: &mut credits,
                admitted_ahead: &mut admitted_ahead,
                ahead,
                lendable: &out[base - lendable..base],
                lent: &mut *lent,
                lent_credit: &mut lent_credit,
            };
            let Some(id) = self.match_one(&cache.keys, key, revival) else {
                break;
            };
            let taken = &out[base..];
            let repeated = if taken.len() < DIRECT {
                near.insert(id) && taken.contains(&id)
            } else {
                let filter = filter.get_or_insert_with(|| Taken::of(taken));
                filter.insert(id) && taken.contains(&id)
            };
            if repeated {
                // A repeated key: give back the second reference (we hold
                // the first, so the block stays ours and keeps its key).
                let _ = self.drop_held_refs(&[id]);
                break;
            }
            out.push(id);
            hits += 1;
        }
        let cell = cache.stats.mine();
        add(&cell.queried, hashes.len() as u64);
        if hits != 0 {
            // Release: a snapshot that sees these hits sees the queries
            // added above (see `Stats::sum`).
            cell.hit.fetch_add(hits as u64, Ordering::Release);
        }
        // A lent block's credit left unused (its revival lost a race and
        // the match ended) takes a block back for the entry, which the
        // caller then still holds: the reservation loses nothing to a
        // race. Through the end of `out`, which has room for one more id
        // than the match can take.
        if credits > 0 && lent_credit {
            self.take_admitted(1, out, Holder::Sequence);
            if let Some(id) = out.pop() {
                out[base - *lent] = id;
                *lent -= 1;
                credits -= 1;
            }
        }
        // Last, the give-back of what went unused: a waker's panic out of
        // it (see "Wakers run after the lock" in `crate::implementation`)
        // leaves the match counted and its blocks in `out`.
        if credits > 0 {
            self.counter.give_back_ahead(credits);
        }
        if admitted_ahead {
            self.counter.note_peak();
        }
        hits
    }

    /// One reference on the block holding `key`, if one does now. An
    /// evictable block takes one of the revival's credits, blocks of the
    /// pool's capacity admitted ahead: when none is left, this lends one of
    /// the caller's reserved blocks if it has one left to lend (its credit
    /// is the caller's place in the capacity), or else admits the
    /// revival's `ahead` (the keys left in the match, this one included,
    /// at most [`AHEAD_MAX`] and at most what the home shard sees free)
    /// with one read-modify-write (and sets its `admitted_ahead`: the peak
    /// is raised once the match is done), or else just one, as allocating
    /// a free block does; the caller gives back what goes unused.
    #[inline(always)]
    fn match_one(&self, keys: &Keys, key: &BlockHash, revival: Revival<'_>) -> Option<BlockId> {
        let probe = keys.probe(key);
        for id in keys.candidates(probe) {
            let backoff = Backoff::new();
            loop {
                // Acquire: synchronises with the publisher's commit
                // (Release), so the key words read next, and the block's
                // contents, are the publisher's.
                let seen = self.refs.state(id.index(), Ordering::Acquire);
                if seen & CACHED == 0 || !keys.holds(id, key) {
                    break;
                }
                if count_of(seen) == 0 {
                    // An evictable block: reviving it takes a block of the
                    // pool's capacity, exactly as allocating a free one.
                    // A closed pool revives nothing, paid for or not.
                    if *revival.credits == 0
                        && *revival.lent < revival.lendable.len()
                        && !self.counter.is_closed()
                    {
                        // Lent last first: the entries lent stay at the
                        // end of the reservation.
                        let i = revival.lendable.len() - 1 - *revival.lent;
                        *revival.lent += 1;
                        *revival.credits = self.lend_held(&revival.lendable[i..=i]);
                        *revival.lent_credit = *revival.credits > 0;
                    }
                    if *revival.credits == 0 {
                        // The keys left, but no more than `AHEAD_MAX` (what
                        // is admitted ahead is missing to other callers until
                        // the match gives back what it did not use) and no
                        // more than the home shard sees free (a request that
                        // cannot fit is refused only after a scan of every
                        // shard, one per revival on a full pool).
                        let ahead = revival
                            .ahead
                            .min(AHEAD_MAX)
                            .min(self.counter.estimate_free());
                        if ahead > 1 && self.counter.try_reserve_ahead(ahead).is_ok() {
                            *revival.credits = ahead;
                            *revival.admitted_ahead = true;
                        } else if self.counter.try_reserve_raw(1, 0).is_ok() {
                            *revival.credits = 1;
                        } else {
                            return None;
                        }
                        *revival.lent_credit = false;
                    }
                    if self.refs.revive(id, seen) {
                        *revival.credits -= 1;
                        *revival.lent_credit = false;
                        return Some(id);
                    }
                } else if self.refs.revive(id, seen) {
                    return Some(id);
                }
                // The state moved (a reference came or went, or the key
                // went): look again.
                sync::stale_retry(&backoff);
            }
        }
        None
    }

    /// Takes up to `k` evictable blocks for an allocation that admitted
    /// them: drops their keys and index entries and appends them to `out`
    /// with one reference of `holder`'s each; returns how many. Fewer if no
    /// more were found (the caller looks again).
    pub(super) fn evict_into(
        &self,
        cache: &PrefixCache,
        k: usize,
        out: &mut Vec<BlockId>,
        holder: Holder,
    ) -> usize {
        let evicted = cache.lru.evict(
            &self.refs,
            k,
            |id, seen| self.evict_reported(cache, id, seen, holder),
            |id| {
                cache.forget_key(id);
                out.push(id);
            },
        );
        add(&cache.stats.mine().evictions, evicted as u64);
        evicted
    }

    /// Takes the evictable block `id`, whose state read `seen` (an
    /// `Acquire` load), as [`Refs::evict`](super::refs::Refs) does, and
    /// records the removal of its key if the pool records KV events: the
    /// record's place is taken after that load and before the CAS (see
    /// `events.rs` for why), and becomes a void if the CAS fails. The
    /// evicted block comes with one reference of `holder`'s.
    fn evict_reported(&self, cache: &PrefixCache, id: BlockId, seen: u64, holder: Holder) -> bool {
        let Some(events) = cache.events.as_ref() else {
            return self.refs.evict(id, seen, holder);
        };
        if !self.refs.may_evict(seen) {
            return false;
        }
        // The key words as `seen` left them: if the CAS below succeeds, the
        // state is still `seen`, so no claim has rewritten them since (a
        // claim changes the state, and any later state has a new
        // generation).
        let key = cache.keys.read(id);
        let probe = cache.keys.probe(&key);
        if events.late_removal() {
            // loom's control: the place taken after the CAS.
            let evicted = self.refs.evict(id, seen, holder);
            if evicted {
                if let Some(ticket) = cache.ticket(probe) {
                    ticket.removed(&key, id);
                }
            }
            return evicted;
        }
        let ticket = cache.ticket(probe);
        if !self.refs.evict(id, seen, holder) {
            return false;
        }
        if let Some(ticket) = ticket {
            ticket.removed(&key, id);
        }
        true
    }

    /// Drops the key of block `id` if the caller is its only holder; see
    /// [`Sequence::truncate`](crate::Sequence::truncate).
    pub(crate) fn uncache_sole(&self, id: BlockId) -> bool {
        let Some(cache) = self.prefix.as_deref() else {
            return false;
        };
        // With KV events, the removal's place is taken once the state is
        // seen to be ours alone and cached, before the CAS that drops the
        // key (the caller holds the block, so its key words are stable).
        let late = cache.events.as_ref().is_some_and(Events::late_removal);
        let prepare = || {
            let events = cache.events.as_ref()?;
            let key = cache.keys.read(id);
            let ticket = (!late).then(|| events.reserve(cache.keys.probe(&key)));
            Some((ticket, key))
        };
        let Some(reported) = self.refs.uncache_sole(id, prepare) else {
            return false;
        };
        match reported {
            Some((Some(ticket), key)) => ticket.removed(&key, id),
            // loom's `late_removal_record` control: the place taken after
            // the CAS.
            Some((None, key)) => {
                if let Some(ticket) = cache.ticket(cache.keys.probe(&key)) {
                    ticket.removed(&key, id);
                }
            }
            None => {}
        }
        cache.forget_key(id);
        true
    }

    /// Drops the key of every cached block without a holder (vLLM's
    /// `reset_prefix_cache`): they become plain free blocks. Returns how
    /// many keys went. Blocks that sequences hold keep their keys.
    ///
    /// Lock-free, and safe against concurrent matches: each block is taken
    /// as an allocation would evict it (its capacity admitted first, also
    /// on a closed pool), and then freed. A block that a matcher revives
    /// meanwhile keeps its key.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{hash_blocks, BlockPool, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(4, 4));
    /// let mut keys = Vec::new();
    /// hash_blocks(b"", &[1, 2, 3, 4, 5, 6, 7, 8], 4, &mut keys);
    /// let mut seq = Sequence::new(Arc::clone(&pool));
    /// seq.try_append(8).unwrap();
    /// assert_eq!(seq.publish(&keys), 2);
    /// drop(seq);
    /// assert_eq!((pool.cached_blocks(), pool.evictable_blocks()), (2, 2));
    /// assert_eq!(pool.reset_prefix_cache(), 2);
    /// assert_eq!((pool.cached_blocks(), pool.free_blocks()), (0, 4));
    /// ```
    pub fn reset_prefix_cache(&self) -> usize {
        let Some(cache) = self.prefix.as_deref() else {
            return 0;
        };
        let mut dropped = 0;
        for index in 0..self.refs.len() {
            // Acquire: as in `match_one`; the eviction CAS re-checks.
            let seen = self.refs.state(index, Ordering::Acquire);
            if !self.refs.may_evict(seen) || self.counter.try_reserve_ignoring_close(1).is_err() {
                continue;
            }
            let id = BlockId::new(index as u32);
            // A reference of our own, given back below: a sequence's, so
            // that no raw free can take it.
            if !self.evict_reported(cache, id, seen, Holder::Sequence) {
                self.counter.release_held(1);
                continue;
            }
            cache.forget_key(id);
            // Our one reference goes, and with no key the block goes back
            // to the free list with its capacity.
            let _ = self.drop_held_refs(&[id]);
            dropped += 1;
        }
        dropped
    }

    /// How many blocks of the longest cached prefix of `hashes` a match
    /// would find, found without taking them: the number of tokens a
    /// prompt would not have to prefill is this times the block size. For
    /// a scheduler that ranks or budgets waiting requests by their cached
    /// prefix (vLLM's `get_computed_blocks`, SGLang's longest-prefix-match
    /// policy) before it admits any of them.
    ///
    /// It takes no reference, admits nothing, moves no block in the
    /// eviction order and counts nothing in
    /// [`prefix_stats`](Self::prefix_stats): peeking at many requests a
    /// step leaves the cache as it was. Its answer can be out of date by
    /// the time it returns: a block it found may be evicted before a
    /// [`Sequence::try_match_prefix`](crate::Sequence::try_match_prefix)
    /// takes it, which then matches fewer. With nothing running meanwhile
    /// it is exactly what that match would return, its cut at the first
    /// key equal to an earlier one included, unless the match would stop
    /// short for the pool's capacity (reviving an evictable block admits
    /// it, and a full or [closed](Self::close) pool refuses). A pool
    /// without a prefix cache peeks 0.
    ///
    /// Each key it counts was cached at a moment during the call: its
    /// block's state, read before and after its key, showed the same
    /// cached key in between (`crate::implementation`, "Peeking"). The
    /// moments differ from key to key, so with publishes and evictions
    /// running meanwhile the count need not be one a match could return:
    /// a list that repeats a key (misuse) may count the repeat when the
    /// key moved to another block between its two lookups, and so count
    /// more blocks than the pool has. Lock-free, with no heap allocation;
    /// its cost is a match's without the read-modify-writes (see
    /// [`Sequence::try_match_prefix`](crate::Sequence::try_match_prefix),
    /// "Performance"), plus, for a block found a second time under
    /// another key (evicted and republished during the call), a scan of
    /// the keys before it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{hash_blocks, BlockPool, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(8, 4));
    /// let mut keys = Vec::new();
    /// hash_blocks(b"", &(0..12).collect::<Vec<u32>>(), 4, &mut keys); // 3 blocks
    /// let mut first = Sequence::new(Arc::clone(&pool));
    /// first.try_append(8)?;
    /// assert_eq!(first.publish(&keys), 2);
    /// drop(first); // its blocks stay cached, evictable
    ///
    /// assert_eq!(pool.peek_prefix(&keys), 2);
    /// assert_eq!(pool.evictable_blocks(), 2); // nothing taken
    /// let mut second = Sequence::new(Arc::clone(&pool));
    /// assert_eq!(second.try_match_prefix(&keys), 2);
    /// # Ok::<(), kvslots::ReserveError>(())
    /// ```
    pub fn peek_prefix(&self, hashes: &[BlockHash]) -> usize {
        if self.refs.len() <= TAKEN_WORDS * 64 {
            self.peek_filtered::<TAKEN_WORDS>(hashes)
        } else {
            self.peek_filtered::<TAKEN_WORDS_LARGE>(hashes)
        }
    }

    /// [`peek_prefix`](Self::peek_prefix) with filters of 256 bits and of
    /// `W` words, as [`match_filtered`](Self::match_filtered): a key whose
    /// block was found for an earlier key ends the peek if it equals an
    /// earlier key
    /// (a block holds one key at a time, so with nothing running meanwhile
    /// that is the match's cut at a block it has taken already).
    #[inline(never)]
    fn peek_filtered<const W: usize>(&self, hashes: &[BlockHash]) -> usize {
        let Some(cache) = self.prefix.as_deref() else {
            return 0;
        };
        let mut direct = [BlockId::NULL; DIRECT];
        let mut near = Taken::<4> { words: [0; 4] };
        let mut filter: Option<Taken<W>> = None;
        for (i, key) in hashes.iter().enumerate() {
            let Some((id, _)) = self.peek_one(&cache.keys, key) else {
                return i;
            };
            let seen_before = if i < DIRECT {
                let seen = near.insert(id) && direct[..i].contains(&id);
                direct[i] = id;
                seen
            } else {
                filter.get_or_insert_with(|| Taken::of(&direct)).insert(id)
            };
            if seen_before && hashes[..i].contains(key) {
                return i;
            }
        }
        hashes.len()
    }

    /// Whether a block holds `key` now (read as
    /// [`peek_prefix`](Self::peek_prefix) reads it, taking nothing):
    /// `None` if none does, `Some(true)` if no one holds that block (a
    /// match would revive it, taking a place in the capacity),
    /// `Some(false)` if someone does.
    pub(crate) fn peek_evictable(&self, key: &BlockHash) -> Option<bool> {
        let cache = self.prefix.as_deref()?;
        self.peek_one(&cache.keys, key)
            .map(|(_, seen)| count_of(seen) == 0)
    }

    /// The block holding `key` now, if one does, found as
    /// [`match_one`](Self::match_one) finds it, and the cached state that
    /// [`peek_block`](Self::peek_block) read on both sides of its key.
    #[inline(always)]
    fn peek_one(&self, keys: &Keys, key: &BlockHash) -> Option<(BlockId, u64)> {
        keys.candidates(keys.probe(key))
            .find_map(|id| self.peek_block(keys, id, key).map(|seen| (id, seen)))
    }

    /// Whether block `id` holds `key`, read without taking it: `Some` of
    /// the block's state (cached) when it did at a moment of the call.
    ///
    /// The state is read (`Acquire`), then the key words (`Acquire`), then
    /// the state again. The key words of a cached state are written before
    /// it (its commit is `Release`), and rewritten only after the block
    /// has lost that key, which takes a new generation, by a writer that
    /// saw the loss (its claim, or a sole holder's read of the state)
    /// before its `Release` stores of the words. So a word read from a
    /// later key makes the second read see the loss or a later state;
    /// when it still shows the generation of the first (which no state
    /// after the key's loss has), every
    /// word read was the first state's key, which the block held from the
    /// first read to the second. A moved generation is read again.
    fn peek_block(&self, keys: &Keys, id: BlockId, key: &BlockHash) -> Option<u64> {
        let backoff = Backoff::new();
        loop {
            // Acquire: synchronises with the commit (Release) of the key
            // the state holds, so its key words are visible.
            let seen = self.refs.state(id.index(), Ordering::Acquire);
            if seen & CACHED == 0 || !keys.holds_acquired(id, key) {
                return None;
            }
            if self.refs.faults.peek_trusts_first_read() {
                // loom's control: no second read.
                return Some(seen);
            }
            // Relaxed: after the key words' Acquire loads, which order a
            // later key's writer's view of the state before this load
            // (see above).
            let now = self.refs.state(id.index(), Ordering::Relaxed);
            if kept_key(seen, now) {
                return Some(seen);
            }
            sync::stale_retry(&backoff);
        }
    }

    /// [`peek_block`](Self::peek_block) of block `id`, for the loom models
    /// (which reach a block through no index entry of the key).
    #[cfg(all(test, kvslots_loom))]
    pub(crate) fn peek_block_of_model(&self, id: BlockId, key: &BlockHash) -> Option<u64> {
        self.peek_block(&self.prefix.as_deref()?.keys, id, key)
    }

    /// A snapshot of the number of blocks holding a key, referenced or
    /// not. A scan of every block's state word (`O(num_blocks)`), for
    /// metrics and tests rather than a hot path.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(kvslots::BlockPool::new(4, 16).cached_blocks(), 0);
    /// ```
    pub fn cached_blocks(&self) -> usize {
        if self.prefix.is_none() {
            return 0;
        }
        (0..self.refs.len())
            // Relaxed: a snapshot.
            .filter(|&i| self.refs.state(i, Ordering::Relaxed) & CACHED != 0)
            .count()
    }

    /// A snapshot of the number of cached blocks that no one holds: an
    /// allocation may evict them, a match may revive them. They count as
    /// free in [`free_blocks`](Self::free_blocks). A scan of every block's
    /// state word (`O(num_blocks)`), as
    /// [`cached_blocks`](Self::cached_blocks).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(kvslots::BlockPool::new(4, 16).evictable_blocks(), 0);
    /// ```
    pub fn evictable_blocks(&self) -> usize {
        if self.prefix.is_none() {
            return 0;
        }
        (0..self.refs.len())
            // Relaxed: a snapshot.
            .filter(|&i| is_evictable(self.refs.state(i, Ordering::Relaxed)))
            .count()
    }

    /// [`cached_blocks`](Self::cached_blocks) and
    /// [`evictable_blocks`](Self::evictable_blocks) from one scan.
    pub(super) fn cache_counts(&self) -> (usize, usize) {
        if self.prefix.is_none() {
            return (0, 0);
        }
        (0..self.refs.len()).fold((0, 0), |(cached, evictable), i| {
            // Relaxed: a snapshot.
            let state = self.refs.state(i, Ordering::Relaxed);
            (
                cached + usize::from(state & CACHED != 0),
                evictable + usize::from(is_evictable(state)),
            )
        })
    }

    /// The prefix cache's hit statistics so far: keys queried and blocks
    /// hit by [`Sequence::try_match_prefix`](crate::Sequence::try_match_prefix),
    /// and evictions.
    ///
    /// Readable at any time. The counters are kept in cells (one per
    /// free-list shard, at least 16), each on its own cache line and
    /// written (with `Relaxed` adds) by the threads whose number picks it
    /// (thread `i` of a pool with `c` cells writes cell `i % c`, as with
    /// home shards), so with up to `c` threads a match or an eviction
    /// writes no line that another thread writes; this call sums them. A
    /// call running meanwhile may or may not be counted yet. A pool
    /// without a prefix cache counts nothing: all zeros.
    pub fn prefix_stats(&self) -> PrefixStats {
        self.prefix
            .as_deref()
            .map_or_else(PrefixStats::default, |cache| cache.stats.sum())
    }
}

#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
mod tests {
    use super::*;

    /// Inserts ids `0..64 * W` twice: the first time no bit is set yet
    /// (no false hit), the second time every one is; then the next id
    /// shares the bit of id 0.
    fn exact_up_to_its_bits<const W: usize>() {
        let bits = (64 * W) as u32;
        let mut filter = Taken::<W>::of(&[]);
        for i in 0..bits {
            assert!(!filter.insert(BlockId::new(i)), "a false hit on {i}");
        }
        for i in 0..bits {
            assert!(filter.insert(BlockId::new(i)), "{i} lost its bit");
        }
        let mut fresh = Taken::<W>::of(&[BlockId::new(0)]);
        assert!(fresh.insert(BlockId::new(bits)));
    }

    /// A match's filter has a bit of its own for each block of a pool of
    /// up to 131,072 blocks: the small one up to 32,768 blocks, the large
    /// one past that.
    #[test]
    fn the_filter_is_exact_for_pools_of_up_to_131072_blocks() {
        assert_eq!(TAKEN_WORDS * 64, 32_768);
        assert_eq!(TAKEN_WORDS_LARGE * 64, 131_072);
        exact_up_to_its_bits::<TAKEN_WORDS>();
        exact_up_to_its_bits::<TAKEN_WORDS_LARGE>();
    }

    /// A filter built from the blocks taken directly holds each of them.
    #[test]
    fn the_filter_of_the_direct_hits_holds_them() {
        let taken: Vec<BlockId> = (0..DIRECT as u32)
            .map(|i| BlockId::new(i * 4_099))
            .collect();
        let mut filter = Taken::<TAKEN_WORDS_LARGE>::of(&taken);
        for &id in &taken {
            assert!(filter.insert(id));
        }
        assert!(!filter.insert(BlockId::new(1)));
    }
}
