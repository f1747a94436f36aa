//! A hybrid model's cached prefix, peeked at without taking it
//! ([`BlockPool::peek_hybrid_prefix`]).

use super::{GroupKeys, KvGroup};
use crate::hash::BlockHash;
use crate::BlockPool;

impl BlockPool {
    /// How many blocks of tokens of the cached prefix of `keys` a
    /// [`HybridSequence::try_match_prefix`](crate::HybridSequence::try_match_prefix)
    /// would match, found without taking any block: the hybrid model's
    /// [`peek_prefix`](Self::peek_prefix).
    ///
    /// Every [`Full`](KvGroup::Full) group needs the whole prefix cached
    /// under its keys, each [`SlidingWindow`](KvGroup::SlidingWindow) (or
    /// [`ChunkedLocal`](KvGroup::ChunkedLocal)) group only the blocks in
    /// the window (or chunk) of the token after it; the answer is the
    /// largest count that every group can serve, at most `keys.blocks()`.
    /// The search is the match's, with peeks in place of the group
    /// matches, except that a lowered count searches each window afresh
    /// where the match keeps the blocks it has found: for keys that
    /// repeat a key (not chained hashes) the two can differ.
    ///
    /// As [`peek_prefix`](Self::peek_prefix): it takes no reference,
    /// admits nothing, moves no block in the eviction order and counts
    /// nothing in [`prefix_stats`](Self::prefix_stats); each key it relies
    /// on was cached at a moment during the call, and its answer can be
    /// out of date by the time it returns. With nothing running
    /// meanwhile, and keys made by [`GroupKeys`] from chained hashes, it
    /// is exactly what that match would return on an empty sequence of
    /// the same groups, unless the match would stop short for the pool's
    /// capacity. Lock-free, with no heap allocation.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{hash_blocks, BlockPool, HybridSequence, KvGroup, KvGroups};
    ///
    /// let pool = Arc::new(BlockPool::new(32, 4));
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 5 }])?;
    /// let prompt: Vec<u32> = (0..24).collect();
    /// let mut base = Vec::new();
    /// hash_blocks(b"", &prompt, 4, &mut base); // 6 full blocks
    /// let keys = groups.keys(&base);
    ///
    /// let mut first = HybridSequence::new(Arc::clone(&pool), groups.clone());
    /// first.try_append(20)?; // 5 full blocks a group
    /// assert_eq!(first.publish(&keys)?, 5 + 5);
    /// drop(first);
    ///
    /// assert_eq!(pool.peek_hybrid_prefix(&keys), 5);
    /// assert_eq!(pool.evictable_blocks(), 10); // nothing taken
    ///
    /// // A prompt sharing the first 3 blocks: the full group finds 3, and
    /// // position 12 reads 8..=12, block 2 of the sliding group.
    /// let mut other = Vec::new();
    /// hash_blocks(b"", &[&prompt[..12], &[7; 12]].concat(), 4, &mut other);
    /// assert_eq!(other[..3], base[..3]);
    /// assert_eq!(pool.peek_hybrid_prefix(&groups.keys(&other)), 3);
    ///
    /// let mut second = HybridSequence::new(Arc::clone(&pool), groups);
    /// assert_eq!(second.try_match_prefix(&keys)?, 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_hybrid_prefix(&self, keys: &GroupKeys) -> usize {
        let bs = self.block_size();
        let kinds = keys.groups().as_slice();
        // At most the blocks whose tokens a length can count, as the match.
        let mut k = keys.blocks().min(usize::MAX / bs);
        for (g, kind) in kinds.iter().enumerate() {
            if *kind == KvGroup::Full {
                k = self.peek_prefix(&group_keys(keys, g)[..k]);
            }
        }
        agree(kinds, k, |g, kind, k| {
            let keys = group_keys(keys, g);
            window_search(kind, bs, k, |run| run.start + self.peek_prefix(&keys[run]))
        })
    }
}

/// The largest `j <= k` whose window (the blocks that the token at
/// position `j * bs` reads) a sliding (or chunked) group of kind `kind`
/// finds cached, searched as the match's `settle` does: the window's keys
/// from its first block up, a miss at block `i` making `i` the next
/// candidate, the blocks found on the way kept as found. `found_until`
/// looks a run of blocks up and returns where the first miss is (the
/// run's end if none).
fn window_search(
    kind: KvGroup,
    bs: usize,
    k: usize,
    mut found_until: impl FnMut(std::ops::Range<usize>) -> usize,
) -> usize {
    // Blocks `found..end` were found cached.
    let (mut end, mut found) = (k, k);
    loop {
        let need = kind.first_needed_block(end * bs, bs);
        if found <= need {
            return end;
        }
        let miss = found_until(need..found);
        if miss < found {
            end = miss;
        }
        found = need;
    }
}

/// The largest `j <= k` at which every sliding (or chunked) group of
/// `kinds` serves its window, each lowering the candidate in turn
/// (`served(g, kind, k)`: the largest `j <= k` group `g` serves) until
/// none does.
fn agree(
    kinds: &[KvGroup],
    mut k: usize,
    mut served: impl FnMut(usize, KvGroup, usize) -> usize,
) -> usize {
    loop {
        let mut lowered = false;
        for (g, kind) in kinds.iter().enumerate() {
            if *kind == KvGroup::Full {
                continue;
            }
            let j = served(g, *kind, k);
            if j < k {
                k = j;
                lowered = true;
            }
        }
        if !lowered {
            return k;
        }
    }
}

/// Group `g`'s keys (every group of `keys`' groups has a list).
fn group_keys(keys: &GroupKeys, g: usize) -> &[BlockHash] {
    keys.group(g).unwrap_or(&[])
}

/// A position not looked up yet, in [`BlockPool::plan_hybrid_match`]'s
/// states.
const UNKNOWN: u8 = 0;
/// A position whose key no block holds.
const MISS: u8 = 1;
/// A position whose block someone holds (a match shares it).
const HELD: u8 = 2;
/// A position whose block no one holds (a match revives it).
const EVICTABLE: u8 = 3;

/// What [`BlockPool::plan_hybrid_match`] planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MatchPlan {
    /// The blocks of tokens to match.
    pub(crate) k: usize,
    /// The revivals the sliding groups' windows at `k` need.
    pub(crate) window_revivals: usize,
    /// The revivals the full groups' first `k` blocks need.
    pub(crate) full_revivals: usize,
    /// The positions of each group in the plan's states.
    span: usize,
}

impl MatchPlan {
    /// The revivals that full group `group`'s first `k` blocks need, read
    /// from the plan's `states`.
    pub(crate) fn group_revivals(&self, states: &[u8], group: usize) -> usize {
        let row = &states[group * self.span..(group + 1) * self.span];
        row[..self.k].iter().filter(|s| **s == EVICTABLE).count()
    }
}

impl BlockPool {
    /// Plans a hybrid match into a reservation, taking nothing: the
    /// largest `k`, at most `k`, that every group serves (as
    /// [`peek_hybrid_prefix`](Self::peek_hybrid_prefix) searches it) and
    /// whose revivals (the evictable blocks among the full groups' first
    /// `k` and the sliding groups' windows at `k`) number at most
    /// `payable(k)`, which must not grow as `k` comes down. `states` is
    /// the caller's buffer (each position of each group looked up at most
    /// once). Its answer is as out of date as a peek's by the time it
    /// returns.
    pub(crate) fn plan_hybrid_match(
        &self,
        keys: &GroupKeys,
        k: usize,
        payable: impl Fn(usize) -> usize,
        states: &mut Vec<u8>,
    ) -> MatchPlan {
        let bs = self.block_size();
        let kinds = keys.groups().as_slice();
        let span = k;
        states.clear();
        states.resize(kinds.len().saturating_mul(span), UNKNOWN);
        let mut k = k;
        // The full groups' prefix: up to the first miss in any of them.
        for (g, kind) in kinds.iter().enumerate() {
            if *kind != KvGroup::Full {
                continue;
            }
            let st = &mut states[g * span..(g + 1) * span];
            for (i, key) in group_keys(keys, g)[..k].iter().enumerate() {
                st[i] = self.state_of(key);
                if st[i] == MISS {
                    k = i;
                    break;
                }
            }
        }
        // The full groups' revivals in their first `k` blocks, kept as `k`
        // comes down.
        let full_at = |states: &[u8], i: usize| -> usize {
            kinds
                .iter()
                .enumerate()
                .filter(|(g, kind)| **kind == KvGroup::Full && states[g * span + i] == EVICTABLE)
                .count()
        };
        let mut full: usize = (0..k).map(|i| full_at(states, i)).sum();
        loop {
            // The sliding groups, until every group agrees on `k`.
            let agreed = agree(kinds, k, |g, kind, k| {
                let keys = group_keys(keys, g);
                let st = &mut states[g * span..(g + 1) * span];
                window_search(kind, bs, k, |run| {
                    let end = run.end;
                    run.into_iter()
                        .find(|&i| {
                            if st[i] == UNKNOWN {
                                st[i] = self.state_of(&keys[i]);
                            }
                            st[i] == MISS
                        })
                        .unwrap_or(end)
                })
            });
            full -= (agreed..k).map(|i| full_at(states, i)).sum::<usize>();
            k = agreed;
            let windows: usize = kinds
                .iter()
                .enumerate()
                .filter(|(_, kind)| **kind != KvGroup::Full)
                .map(|(g, kind)| {
                    let from = kind.first_needed_block(k * bs, bs).min(k);
                    states[g * span + from..g * span + k]
                        .iter()
                        .filter(|s| **s == EVICTABLE)
                        .count()
                })
                .sum();
            if k == 0 || full.saturating_add(windows) <= payable(k) {
                return MatchPlan {
                    k,
                    window_revivals: windows,
                    full_revivals: full,
                    span,
                };
            }
            // One block fewer, and fewer still while the full groups alone
            // cost more than can be paid.
            k -= 1;
            full -= full_at(states, k);
            while k > 0 && full > payable(k) {
                k -= 1;
                full -= full_at(states, k);
            }
        }
    }

    /// `key`'s state now, for a plan.
    fn state_of(&self, key: &BlockHash) -> u8 {
        match self.peek_evictable(key) {
            None => MISS,
            Some(false) => HELD,
            Some(true) => EVICTABLE,
        }
    }
}
