//! The locked prefix cache of `benches/prefix.rs`'s mixed workload and of
//! `benches/cost.rs`: the reference policy (a `HashMap` from key to block,
//! an index-linked LRU list of the evictable blocks, a free stack), kept
//! the simple way, for a caller to take one lock around each call.

use std::collections::HashMap;

use kvslots::{hash_blocks, BlockHash};

/// Tokens per block.
pub const BS: usize = 16;
/// Blocks of a mixed-workload prompt.
pub const PROMPT_BLOCKS: usize = 24;
/// Tokens after the prompt's last full block.
pub const EXTRA: usize = 5;
/// The mixed workload's pool.
pub const MIXED_POOL: usize = 512;

/// The keys of the mixed workload's prompts: 8 families of 16 variants.
pub fn mixed_prompts() -> Vec<Vec<BlockHash>> {
    let mut prompts = Vec::new();
    for family in 0..8u32 {
        for variant in 0..16u32 {
            let tokens: Vec<u32> = (0..(PROMPT_BLOCKS * BS) as u32)
                .map(|t| match t as usize / BS {
                    0..=7 => t,
                    8..=15 => family * 1_000_000 + t,
                    _ => family * 1_000_000 + variant * 10_000 + t,
                })
                .collect();
            let mut keys = Vec::new();
            hash_blocks(b"bench", &tokens, BS, &mut keys);
            prompts.push(keys);
        }
    }
    prompts
}

/// "No block" in the baseline's LRU links.
const NIL: u32 = u32::MAX;

/// The baseline's state.
pub struct Cache {
    refs: Vec<u32>,
    keys: Vec<Option<BlockHash>>,
    index: HashMap<BlockHash, u32>,
    free: Vec<u32>,
    prev: Vec<u32>,
    next: Vec<u32>,
    lru: u32,
    mru: u32,
}

impl Cache {
    /// A cache of `num_blocks` free blocks.
    pub fn new(num_blocks: usize) -> Cache {
        Cache {
            refs: vec![0; num_blocks],
            keys: vec![None; num_blocks],
            index: HashMap::with_capacity(num_blocks),
            free: (0..num_blocks as u32).rev().collect(),
            prev: vec![NIL; num_blocks],
            next: vec![NIL; num_blocks],
            lru: NIL,
            mru: NIL,
        }
    }

    fn unlink(&mut self, b: u32) {
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        match p {
            NIL => self.lru = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NIL => self.mru = p,
            n => self.prev[n as usize] = p,
        }
    }

    fn push_mru(&mut self, b: u32) {
        self.prev[b as usize] = self.mru;
        self.next[b as usize] = NIL;
        match self.mru {
            NIL => self.lru = b,
            m => self.next[m as usize] = b,
        }
        self.mru = b;
    }

    pub fn match_prefix(&mut self, keys: &[BlockHash], table: &mut Vec<u32>) -> usize {
        let mut k = 0;
        for key in keys {
            let Some(&b) = self.index.get(key) else { break };
            if self.refs[b as usize] == 0 {
                self.unlink(b);
            }
            self.refs[b as usize] += 1;
            table.push(b);
            k += 1;
        }
        k
    }

    /// The blocks `match_prefix` would take, counted without taking them.
    pub fn peek_prefix(&self, keys: &[BlockHash]) -> usize {
        keys.iter()
            .take_while(|key| self.index.contains_key(*key))
            .count()
    }

    pub fn allocate(&mut self, n: usize, table: &mut Vec<u32>) -> bool {
        let evictable =
            self.keys.len() - self.free.len() - self.refs.iter().filter(|&&r| r > 0).count();
        if n > self.free.len() + evictable {
            return false;
        }
        for _ in 0..n {
            let b = match self.free.pop() {
                Some(b) => b,
                None => {
                    let b = self.lru;
                    self.unlink(b);
                    let key = self.keys[b as usize]
                        .take()
                        .expect("evictable blocks are cached");
                    self.index.remove(&key);
                    b
                }
            };
            self.refs[b as usize] = 1;
            table.push(b);
        }
        true
    }

    pub fn publish(&mut self, table: &[u32], keys: &[BlockHash]) {
        for (&b, key) in table.iter().zip(keys) {
            if self.keys[b as usize].is_none() && !self.index.contains_key(key) {
                self.keys[b as usize] = Some(*key);
                self.index.insert(*key, b);
            }
        }
    }

    pub fn release(&mut self, table: &[u32]) {
        for &b in table.iter().rev() {
            self.refs[b as usize] -= 1;
            if self.refs[b as usize] == 0 {
                if self.keys[b as usize].is_some() {
                    self.push_mru(b);
                } else {
                    self.free.push(b);
                }
            }
        }
    }
}
