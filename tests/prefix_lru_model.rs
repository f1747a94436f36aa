//! Single-thread eviction order against an exact-LRU reference on
//! pools small and large (revivals leave stale candidates in the eviction
//! ring, so refills, overflow and stale candidates all run), with revivals,
//! truncates of cached blocks, resets and crafted keys.

use std::collections::HashMap;
use std::sync::Arc;

use kvslots::{BlockHash, BlockId, BlockPool, Sequence};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// A new sequence of `n` blocks (evicting as needed), published under
    /// fresh keys of key style `style`.
    Publish {
        n: usize,
        style: u8,
    },
    /// A new sequence matches chain `chain` (some earlier publish) up to `len`.
    Match {
        chain: usize,
        len: usize,
    },
    /// Drops held sequence `i`.
    Drop(usize),
    /// Truncates held sequence `i` to `len` blocks.
    Truncate {
        i: usize,
        len: usize,
    },
    /// Allocates `n` raw blocks and frees them at once.
    Raw(usize),
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1usize..=80, 0u8..4).prop_map(|(n, style)| Op::Publish { n, style }),
        6 => (any::<usize>(), 1usize..=80).prop_map(|(chain, len)| Op::Match { chain, len }),
        8 => any::<usize>().prop_map(Op::Drop),
        2 => (any::<usize>(), 0usize..=40).prop_map(|(i, len)| Op::Truncate { i, len }),
        3 => (1usize..=100).prop_map(Op::Raw),
        1 => Just(Op::Reset),
    ]
}

/// Key `c` of a chain: styles give equal first words, keys differing only
/// in the last byte, nearly-all-zero keys, and spread keys.
fn key(style: u8, c: u64) -> BlockHash {
    let mut b = [0u8; 32];
    match style {
        0 => b[24..].copy_from_slice(&c.to_le_bytes()),
        1 => {
            b[..8].copy_from_slice(&0xdead_beefu64.to_le_bytes());
            b[31] = c as u8;
            b[30] = (c >> 8) as u8;
            b[29] = (c >> 16) as u8;
        }
        2 => {
            // Zero except the count in the middle (c == 0 is all-zero).
            b[12..20].copy_from_slice(&c.to_be_bytes());
        }
        _ => {
            let mut z = c.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            for w in b.chunks_mut(8) {
                z ^= z >> 29;
                z = z.wrapping_mul(0xBF58_476D_1CE4_E5B9);
                w.copy_from_slice(&z.to_le_bytes());
            }
        }
    }
    BlockHash(b)
}

struct Model {
    refs: Vec<u32>,
    keys: Vec<Option<BlockHash>>,
    index: HashMap<BlockHash, BlockId>,
    lru: Vec<BlockId>,
}

impl Model {
    fn drop_ref(&mut self, id: BlockId) {
        self.refs[id.index()] -= 1;
        if self.refs[id.index()] == 0 && self.keys[id.index()].is_some() {
            self.lru.push(id);
        }
    }
    fn take(&mut self, id: BlockId) {
        if let Some(k) = self.keys[id.index()].take() {
            self.index.remove(&k);
        }
        self.lru.retain(|&b| b != id);
        self.refs[id.index()] += 1;
    }
    fn uncached_free(&self) -> usize {
        (0..self.refs.len())
            .filter(|&b| self.refs[b] == 0 && self.keys[b].is_none())
            .count()
    }
    /// Checks fresh blocks: the cached ones among them are exactly the
    /// least recently released evictable blocks.
    fn fresh(&mut self, ids: &[BlockId], step: usize) -> Result<(), TestCaseError> {
        let evicted = ids.len().saturating_sub(self.uncached_free());
        let mut want: Vec<BlockId> = self.lru[..evicted].to_vec();
        let mut got: Vec<BlockId> = ids
            .iter()
            .copied()
            .filter(|id| self.keys[id.index()].is_some())
            .collect();
        want.sort();
        got.sort();
        prop_assert_eq!(got, want, "step {}: evicted not the LRU blocks", step);
        for &id in ids {
            self.take(id);
        }
        Ok(())
    }
}

fn run(num_blocks: usize, ops: &[Op]) -> Result<(), TestCaseError> {
    let pool = Arc::new(BlockPool::new(num_blocks, 1));
    let mut m = Model {
        refs: vec![0; num_blocks],
        keys: vec![None; num_blocks],
        index: HashMap::new(),
        lru: Vec::new(),
    };
    let mut seqs: Vec<Sequence> = Vec::new();
    let mut chains: Vec<Vec<BlockHash>> = Vec::new();
    let mut counter = 0u64;
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Publish { n, style } => {
                let mut s = Sequence::new(Arc::clone(&pool));
                let avail = num_blocks - m.refs.iter().filter(|&&r| r > 0).count();
                let n = n.min(avail);
                if n == 0 {
                    continue;
                }
                s.try_append(n).unwrap();
                m.fresh(s.blocks(), step)?;
                let keys: Vec<BlockHash> = (0..n)
                    .map(|_| {
                        counter += 1;
                        key(style, counter)
                    })
                    .collect();
                let got = s.publish(&keys);
                prop_assert_eq!(got, n, "step {}: publish refused fresh keys", step);
                for (k, &b) in keys.iter().zip(s.blocks()) {
                    m.keys[b.index()] = Some(*k);
                    m.index.insert(*k, b);
                }
                chains.push(keys);
                seqs.push(s);
            }
            Op::Match { chain, len } => {
                if chains.is_empty() {
                    continue;
                }
                let keys = &chains[chain % chains.len()];
                let keys = &keys[..len.min(keys.len())];
                let mut s = Sequence::new(Arc::clone(&pool));
                let got = s.try_match_prefix(keys);
                let mut want = Vec::new();
                for k in keys {
                    match m.index.get(k) {
                        Some(&b) => want.push(b),
                        None => break,
                    }
                }
                prop_assert_eq!(got, want.len(), "step {}: match", step);
                prop_assert_eq!(s.blocks(), &want[..], "step {}: matched blocks", step);
                for b in want {
                    m.lru.retain(|&x| x != b);
                    m.refs[b.index()] += 1;
                }
                seqs.push(s);
            }
            Op::Drop(i) => {
                if seqs.is_empty() {
                    continue;
                }
                let s = seqs.remove(i % seqs.len());
                let blocks = s.blocks().to_vec();
                drop(s);
                for &b in blocks.iter().rev() {
                    m.drop_ref(b);
                }
            }
            Op::Truncate { i, len } => {
                if seqs.is_empty() {
                    continue;
                }
                let i = i % seqs.len();
                let before = seqs[i].blocks().to_vec();
                seqs[i].truncate(len);
                if len < before.len() {
                    for &b in before[len..].iter().rev() {
                        m.drop_ref(b);
                    }
                }
            }
            Op::Raw(n) => {
                let avail = num_blocks - m.refs.iter().filter(|&&r| r > 0).count();
                let n = n.min(avail);
                let mut out = Vec::new();
                pool.try_alloc(n, &mut out).unwrap();
                m.fresh(&out, step)?;
                pool.free(&out).unwrap();
                for &b in &out {
                    m.refs[b.index()] -= 1;
                }
            }
            Op::Reset => {
                let got = pool.reset_prefix_cache();
                let gone = std::mem::take(&mut m.lru);
                for &b in &gone {
                    if let Some(k) = m.keys[b.index()].take() {
                        m.index.remove(&k);
                    }
                }
                prop_assert_eq!(got, gone.len(), "step {}: reset", step);
            }
        }
        prop_assert_eq!(
            pool.evictable_blocks(),
            m.lru.len(),
            "step {}: evictable",
            step
        );
        let cached = m.keys.iter().filter(|k| k.is_some()).count();
        prop_assert_eq!(pool.cached_blocks(), cached, "step {}: cached", step);
    }
    // Everything dropped: conservation, and the whole pool allocatable once.
    drop(seqs);
    prop_assert_eq!(pool.used_blocks(), 0);
    prop_assert_eq!(pool.free_blocks(), num_blocks);
    let mut out = Vec::new();
    pool.try_alloc(num_blocks, &mut out).unwrap();
    out.sort();
    out.dedup();
    prop_assert_eq!(out.len(), num_blocks);
    prop_assert_eq!(pool.cached_blocks(), 0);
    Ok(())
}

fn cases() -> u32 {
    std::env::var("KVSLOTS_PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// One thread: the blocks evicted are exactly the least recently
    /// released, on pools small and large.
    #[test]
    fn single_thread_eviction_is_exact_lru(
        num_blocks in prop_oneof![1usize..=64, 65usize..=140, 200usize..=400],
        ops in prop::collection::vec(op(), 1..300),
    ) {
        run(num_blocks, &ops)?;
    }
}
