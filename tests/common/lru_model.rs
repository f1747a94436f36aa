//! An exact-LRU reference for one thread's eviction order: references,
//! keys, and the evictable blocks by release time, checked against the
//! blocks a pool hands out.

use std::collections::{BTreeMap, HashMap};

use kvslots::{BlockAllocator, BlockHash, BlockId, Sequence};

/// The reference: references, keys, and the evictable blocks by release.
pub struct Model {
    pub refs: Vec<u32>,
    pub keys: Vec<Option<BlockHash>>,
    pub index: HashMap<BlockHash, BlockId>,
    pub lru: BTreeMap<u64, BlockId>,
    pub released_at: Vec<Option<u64>>,
    pub clock: u64,
    pub evictions: usize,
}

impl Model {
    pub fn new(n: usize) -> Model {
        Model {
            refs: vec![0; n],
            keys: vec![None; n],
            index: HashMap::new(),
            lru: BTreeMap::new(),
            released_at: vec![None; n],
            clock: 0,
            evictions: 0,
        }
    }

    pub fn drop_ref(&mut self, id: BlockId) {
        let i = id.index();
        self.refs[i] -= 1;
        if self.refs[i] == 0 && self.keys[i].is_some() {
            self.clock += 1;
            self.lru.insert(self.clock, id);
            self.released_at[i] = Some(self.clock);
        }
    }

    /// Drops `seq`, whose references go last block first.
    pub fn dropped<A: BlockAllocator>(&mut self, seq: Sequence<A>) {
        let blocks = seq.blocks().to_vec();
        drop(seq);
        for &b in blocks.iter().rev() {
            self.drop_ref(b);
        }
    }

    /// A raw caller freed `ids` (uncached blocks: no release to record).
    pub fn freed(&mut self, ids: &[BlockId]) {
        for &b in ids {
            self.refs[b.index()] -= 1;
        }
    }

    pub fn hold(&mut self, id: BlockId) {
        let i = id.index();
        if let Some(t) = self.released_at[i].take() {
            self.lru.remove(&t);
        }
        self.refs[i] += 1;
    }

    /// Fresh blocks: the cached ones among them must be exactly the least
    /// recently released evictable blocks.
    pub fn fresh(&mut self, ids: &[BlockId], what: &str) {
        let uncached_free = (0..self.refs.len())
            .filter(|&b| self.refs[b] == 0 && self.keys[b].is_none())
            .count();
        let evicted = ids.len().saturating_sub(uncached_free);
        let mut want: Vec<BlockId> = self.lru.values().take(evicted).copied().collect();
        let mut got: Vec<BlockId> = ids
            .iter()
            .copied()
            .filter(|id| self.keys[id.index()].is_some())
            .collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{what}: evicted not the LRU blocks");
        self.evictions += evicted;
        for &id in ids {
            if let Some(k) = self.keys[id.index()].take() {
                self.index.remove(&k);
            }
            self.hold(id);
        }
    }

    /// Blocks the pool holds now (a reference or more).
    pub fn held(&self) -> usize {
        self.refs.iter().filter(|&&r| r > 0).count()
    }

    /// Matches `keys` on `seq` (empty) and checks that it took exactly the
    /// blocks the reference holds for the longest cached prefix, which
    /// the reference then counts as held.
    pub fn matched<A: BlockAllocator>(
        &mut self,
        seq: &mut Sequence<A>,
        keys: &[BlockHash],
        what: &str,
    ) {
        let got = seq.try_match_prefix(keys);
        let want: Vec<BlockId> = keys
            .iter()
            .map_while(|k| self.index.get(k).copied())
            .collect();
        assert_eq!(got, want.len(), "{what}: match");
        assert_eq!(seq.blocks(), &want[..], "{what}: matched blocks");
        for b in want {
            self.hold(b);
        }
    }

    /// Records a publish that cached `keys` on `blocks`, in order.
    pub fn published(&mut self, keys: &[BlockHash], blocks: &[BlockId]) {
        for (&k, &b) in keys.iter().zip(blocks) {
            self.keys[b.index()] = Some(k);
            self.index.insert(k, b);
        }
    }
}
