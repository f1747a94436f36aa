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
        loop {
            let mut lowered = false;
            for (g, kind) in kinds.iter().enumerate() {
                if *kind == KvGroup::Full {
                    continue;
                }
                let served = self.peek_window(*kind, group_keys(keys, g), k);
                if served < k {
                    k = served;
                    lowered = true;
                }
            }
            if !lowered {
                return k;
            }
        }
    }

    /// The largest `j <= k` whose window (the blocks that the token at
    /// position `j * block_size` reads) a sliding group finds cached under
    /// its `keys`, searched as the match's `settle` does: the window's
    /// keys from its first block up, a miss at block `i` making `i` the
    /// next candidate, the blocks found on the way kept as found.
    fn peek_window(&self, kind: KvGroup, keys: &[BlockHash], k: usize) -> usize {
        let bs = self.block_size();
        // Blocks `found..end` were found cached.
        let (mut end, mut found) = (k, k);
        loop {
            let need = kind.first_needed_block(end * bs, bs);
            if found <= need {
                return end;
            }
            let m = self.peek_prefix(&keys[need..found]);
            if m < found - need {
                end = need + m;
            }
            found = need;
        }
    }
}

/// Group `g`'s keys (every group of `keys`' groups has a list).
fn group_keys(keys: &GroupKeys, g: usize) -> &[BlockHash] {
    keys.group(g).unwrap_or(&[])
}
