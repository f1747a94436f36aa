//! The prefix cache of a [`BlockPool`]: matching keys to cached blocks,
//! publishing keys, evicting, dropping every key, and the hit statistics.
//! The design and the orderings are described in
//! [`crate::implementation`] ("Prefix cache").

use crate::free_list::Give;
use crate::hash::BlockHash;
use crate::id::BlockId;
use crate::sync::{self, AtomicU64, Backoff, CachePadded, Ordering};

use super::keys::Probe;
use super::refs::{count_of, is_evictable, Defer, Dropped, Holder, Kill, BUSY, CACHED, KILLED};
use super::BlockPool;

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
    /// on empty sequences.
    pub queried_blocks: u64,
    /// Blocks those calls matched.
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
    pub(super) fn heap_bytes(cells: usize) -> usize {
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

/// Blocks a match compares each new hit against directly, before it
/// builds its filter.
const DIRECT: usize = 32;
/// Words of the filter of block ids that one match has taken (32,768 bits,
/// 4 KiB on the stack, zeroed only by matches longer than [`DIRECT`]).
const TAKEN_WORDS: usize = 512;

/// The filter's word and bit for block `id`.
fn filter_bit(id: BlockId) -> (usize, u64) {
    let bit = id.index() % (TAKEN_WORDS * 64);
    (bit / 64, 1u64 << (bit % 64))
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
    /// table cannot outgrow the pool. The first [`DIRECT`] hits are
    /// compared with the blocks taken so far; a longer match builds a
    /// filter of 32,768 bits over block ids (exact for pools of up to
    /// 32,768 blocks), and only a hit in it scans the blocks taken.
    pub(crate) fn match_prefix(&self, hashes: &[BlockHash], out: &mut Vec<BlockId>) -> usize {
        let base = out.len();
        let mut filter: Option<[u64; TAKEN_WORDS]> = None;
        let mut hits = 0;
        // Blocks admitted ahead for the evictable blocks this match revives
        // (see `match_one`); what goes unused is given back at the end.
        let (mut credits, mut admitted_ahead) = (0, false);
        for (i, key) in hashes.iter().enumerate() {
            let ahead = hashes.len() - i;
            let Some(id) = self.match_one(key, &mut credits, &mut admitted_ahead, ahead) else {
                break;
            };
            let taken = &out[base..];
            let repeated = if taken.len() < DIRECT {
                taken.contains(&id)
            } else {
                let filter = filter.get_or_insert_with(|| {
                    let mut filter = [0u64; TAKEN_WORDS];
                    for &t in taken {
                        let (word, mask) = filter_bit(t);
                        filter[word] |= mask;
                    }
                    filter
                });
                let (word, mask) = filter_bit(id);
                let maybe = filter[word] & mask != 0;
                filter[word] |= mask;
                maybe && taken.contains(&id)
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
        if credits > 0 {
            self.counter.give_back_ahead(credits);
        }
        if admitted_ahead {
            self.counter.note_peak();
        }
        let cell = self.stats.mine();
        add(&cell.queried, hashes.len() as u64);
        if hits != 0 {
            // Release: a snapshot that sees these hits sees the queries
            // added above (see `Stats::sum`).
            cell.hit.fetch_add(hits as u64, Ordering::Release);
        }
        hits
    }

    /// One reference on the block holding `key`, if one does now. An
    /// evictable block takes one of `credits`, blocks of the pool's
    /// capacity admitted ahead: when none is left, this admits `ahead`
    /// (the keys left in the match, this one included) with one
    /// read-modify-write (and sets `admitted_ahead`: the peak is raised
    /// once the match is done), or else just one, as allocating a free
    /// block does; the caller gives back what goes unused.
    fn match_one(
        &self,
        key: &BlockHash,
        credits: &mut usize,
        admitted_ahead: &mut bool,
        ahead: usize,
    ) -> Option<BlockId> {
        let probe = self.keys.probe(key);
        for id in self.keys.candidates(probe) {
            let backoff = Backoff::new();
            loop {
                // Acquire: synchronises with the publisher's commit
                // (Release), so the key words read next, and the block's
                // contents, are the publisher's.
                let seen = self.refs.state(id.index(), Ordering::Acquire);
                if seen & CACHED == 0 || !self.keys.holds(id, key) {
                    break;
                }
                if count_of(seen) == 0 {
                    // An evictable block: reviving it takes a block of the
                    // pool's capacity, exactly as allocating a free one.
                    if *credits == 0 {
                        if ahead > 1 && self.counter.try_reserve_ahead(ahead).is_ok() {
                            *credits = ahead;
                            *admitted_ahead = true;
                        } else if self.counter.try_reserve_raw(1, 0).is_ok() {
                            *credits = 1;
                        } else {
                            return None;
                        }
                    }
                    if self.refs.revive(id, seen) {
                        *credits -= 1;
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

    /// Makes `key` the key of block `id`, which the caller holds, unless
    /// the block is cached already, or another block holds `key` (first
    /// wins), or the index has no room. Returns whether it did.
    ///
    /// A key that a committed block holds when the publish begins loses at
    /// once: nothing is claimed and no index entry is made (the lookup of
    /// a match, without its reference). Otherwise, two publishers of one
    /// key on two blocks race like this: each claims its block (`BUSY`),
    /// writes its key, inserts an index entry, makes a read-modify-write on
    /// one word that every publisher of the key touches, and then rescans
    /// the key's buckets, so the later of the two sees the earlier. One
    /// that sees a committed rival loses; one that sees a claimed rival on
    /// a lower id defers to it (marks it `DEFERRED`) and loses; one that
    /// sees a claimed rival on a higher id kills it (its commit then
    /// fails), or loses if the rival committed first. Whoever sees whom, at
    /// most one of them commits.
    ///
    /// Nobody gives up on trust alone: a claim that was deferred to, or
    /// killed, looks again before it gives up (a killed one may then
    /// commit, if its killer is gone). So a publish that returns `false`
    /// either saw a block holding the key, during the publish or during a
    /// look that began after it gave up, or was refused: the block cached
    /// already, or the key's two index buckets full, when it inserted its
    /// entry or when a claim it deferred to put its own back to look again
    /// (that claim then gives up: a miss until the key is published again,
    /// never a wrong hit). Each new look is caused by a rival's mark or
    /// kill, that is by another publish's progress: the loop is lock-free.
    pub(crate) fn publish_block(&self, id: BlockId, key: &BlockHash) -> bool {
        // Already cached (this key or another), or the key held by another
        // block? (A key that another block commits after this lookup is
        // found by the rescan below.)
        if self.refs.is_cached(id) {
            return false;
        }
        let probe = self.keys.probe(key);
        let Some(order) = self.keys.look_before_insert(probe, |rival| {
            !self.keys.skip_held_key_check() && self.is_holder(rival, key)
        }) else {
            return false;
        };
        if !self.refs.claim(id) {
            return false;
        }
        self.keys.write(id, key);
        self.refs.arm(id);
        let Some(mut slot) = self.keys.insert_into(probe, order, id) else {
            self.give_back_claim(id, self.refs.unclaim(id));
            return false;
        };
        loop {
            if !self.loses_to_a_rival(id, key, probe, slot) {
                match self.refs.commit(id) {
                    Ok(dropped) => {
                        self.give_back_claim(id, dropped);
                        return true;
                    }
                    // Killed by a rival on a lower id since the rescan. If
                    // that rival is still there, the next rescan defers to
                    // it; if it lost meanwhile, nobody else may be left to
                    // cache the key, so look again rather than give up.
                    Err(()) if self.refs.revoke_kill(id) => continue,
                    Err(()) => {}
                }
            }
            self.keys.remove(probe, id, Some(slot));
            if let Ok(dropped) = self.refs.unclaim_unless_deferred(id) {
                self.give_back_claim(id, dropped);
                return false;
            }
            // A rival deferred to this claim, perhaps after the holder we
            // lost to went: look again, with the entry back in the index.
            // (If the index has no room now, the publish is refused.)
            match self.keys.insert(probe, id) {
                Some(again) => slot = again,
                None => {
                    self.give_back_claim(id, self.refs.unclaim(id));
                    return false;
                }
            }
        }
    }

    /// A publisher's rescan for rivals of its claim on block `id` (index
    /// entry in `slot`): whether it loses to one (a committed block, or a
    /// claim on a lower id, which it marks `DEFERRED`). Kills the claims on
    /// higher ids that it meets.
    fn loses_to_a_rival(&self, id: BlockId, key: &BlockHash, probe: Probe, slot: usize) -> bool {
        for rival in self.keys.rivals(probe, slot) {
            if rival == id {
                continue;
            }
            // Acquire: the rival's claim or commit, with its key.
            let seen = self.refs.state(rival.index(), Ordering::Acquire);
            if seen & (CACHED | BUSY) == 0
                || seen & (CACHED | KILLED) == KILLED
                || !self.keys.holds(rival, key)
            {
                // A stale entry (being removed), a killed claim (it cannot
                // commit without looking again; a claim is also killed
                // until its key words are written, so an entry that an
                // earlier claim of the block left is not taken for this
                // one) or another key.
                continue;
            }
            let lost = if seen & CACHED != 0 {
                // A committed rival holds the key.
                true
            } else if rival < id {
                // Of two claims the lower id wins.
                self.refs.defer(rival, seen) != Defer::Gone
            } else {
                // A higher rival's claim is killed, unless it committed
                // first.
                self.refs.kill(rival, seen) == Kill::Committed
            };
            if lost {
                return true;
            }
        }
        false
    }

    /// Whether block `id` holds `key`, committed, now: a publish of the
    /// key loses to it without claiming anything (first wins).
    fn is_holder(&self, id: BlockId, key: &BlockHash) -> bool {
        // Acquire: as in `match_one`, the key words read next are the
        // publisher's.
        self.refs.state(id.index(), Ordering::Acquire) & CACHED != 0 && self.keys.holds(id, key)
    }

    /// Gives block `id` back to the pool if the drop of a claim's own
    /// reference (by the commit or the unclaim) was its last: its holders
    /// all let go while it was claimed, which only a double free through
    /// [`BlockPool::free`] of the publishing holder's reference makes
    /// possible. Through the same path as any last drop: to the free list,
    /// or evictable (stamped as the most recently released) if the commit
    /// cached it, with its capacity released.
    fn give_back_claim(&self, id: BlockId, dropped: Dropped) {
        if dropped != Dropped::Kept {
            let _ = self.drop_each(Give::new(), std::iter::once(id), &[id], |_| Ok(dropped));
        }
    }

    /// Takes up to `k` evictable blocks for an allocation that admitted
    /// them: drops their keys and index entries and appends them to `out`
    /// with one reference of `holder`'s each; returns how many. Fewer if no
    /// more were found (the caller looks again).
    pub(super) fn evict_into(&self, k: usize, out: &mut Vec<BlockId>, holder: Holder) -> usize {
        let evicted = self.lru.evict(
            &self.refs,
            k,
            |id, seen| self.refs.evict(id, seen, holder),
            |id| {
                self.forget_key(id);
                out.push(id);
            },
        );
        add(&self.stats.mine().evictions, evicted as u64);
        evicted
    }

    /// Removes the index entry of block `id`, whose key the caller just
    /// dropped and which it holds alone.
    fn forget_key(&self, id: BlockId) {
        let key = self.keys.read(id);
        let removed = self.keys.remove(self.keys.probe(&key), id, None);
        debug_assert!(removed, "{id} was cached without an index entry");
    }

    /// Drops the key of block `id` if the caller is its only holder; see
    /// [`Sequence::truncate`](crate::Sequence::truncate).
    pub(crate) fn uncache_sole(&self, id: BlockId) -> bool {
        if !self.refs.uncache_sole(id) {
            return false;
        }
        self.forget_key(id);
        true
    }

    /// Whether block `id` holds a key now.
    pub(crate) fn is_cached(&self, id: BlockId) -> bool {
        self.refs.is_cached(id)
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
            if !self.refs.evict(id, seen, Holder::Sequence) {
                self.counter.release_held(1);
                continue;
            }
            self.forget_key(id);
            // Our one reference goes, and with no key the block goes back
            // to the free list with its capacity.
            let _ = self.drop_held_refs(&[id]);
            dropped += 1;
        }
        dropped
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
        (0..self.refs.len())
            // Relaxed: a snapshot.
            .filter(|&i| is_evictable(self.refs.state(i, Ordering::Relaxed)))
            .count()
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
    /// call running meanwhile may or may not be counted yet.
    pub fn prefix_stats(&self) -> PrefixStats {
        self.stats.sum()
    }
}
