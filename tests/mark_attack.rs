//! Attacks on `Sequence::publish`'s mark (`published`): a publish starts
//! past the blocks the sequence knows hold their keys. Scripts (random,
//! seeded, and threaded) mix appends, copy-on-write appends, truncates
//! (plain and fenced) into shared and sole-held cached blocks, forks moved
//! to other threads, matches, `reset_prefix_cache`, evicting allocations,
//! `shrink_to_fit`, `retire_copy_source` and hybrid sequences, and check
//! every publish against an independent expectation:
//!
//! * before the publish, a one-key probe per full block says whether some
//!   block holds that key; the publish must return exactly how many full
//!   blocks had no holder (the blocks it should cache), and the pool's
//!   cached count must grow by that much;
//! * after it, every full block's key must be held by some block whose
//!   device content (a shadow of the slots, written as the scripts append
//!   and copy) is the sequence's tokens for that block.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use kvslots::{
    hash_blocks, BlockCopy, BlockHash, BlockId, BlockPool, HybridSequence, KvGroup, KvGroups,
    Sequence,
};

const SALT: &[u8] = b"mark";

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The device memory: one word per slot, `token + 1` (0: never written).
struct Mem {
    slots: Vec<AtomicU32>,
    bs: usize,
}

impl Mem {
    fn new(pool: &BlockPool) -> Mem {
        let n = pool.num_blocks() * pool.block_size();
        Mem {
            slots: (0..n).map(|_| AtomicU32::new(0)).collect(),
            bs: pool.block_size(),
        }
    }

    fn copy(&self, copy: &BlockCopy) {
        for j in 0..copy.tokens {
            // Relaxed: the slots are written by the thread holding the
            // destination alone; the pool's publish (Release) and match
            // (Acquire) order them for readers on other threads.
            let v = self.slots[copy.src.index() * self.bs + j].load(Ordering::Relaxed);
            // Relaxed: as above.
            self.slots[copy.dst.index() * self.bs + j].store(v, Ordering::Relaxed);
        }
    }

    fn write(&self, slot: usize, token: u32) {
        // Relaxed: as in `copy`.
        self.slots[slot].store(token + 1, Ordering::Relaxed);
    }

    fn block(&self, id: BlockId) -> Vec<u32> {
        (0..self.bs)
            // Relaxed: as in `copy` (a cached block is never written).
            .map(|j| self.slots[id.index() * self.bs + j].load(Ordering::Relaxed))
            .collect()
    }
}

/// A sequence with its tokens.
struct Tracked {
    seq: Sequence,
    tokens: Vec<u32>,
}

impl Tracked {
    fn new(pool: &Arc<BlockPool>) -> Tracked {
        Tracked {
            seq: Sequence::new(Arc::clone(pool)),
            tokens: Vec::new(),
        }
    }

    fn keys(&self) -> Vec<BlockHash> {
        let mut keys = Vec::new();
        hash_blocks(SALT, &self.tokens, self.seq.pool().block_size(), &mut keys);
        keys
    }

    /// Appends `new`, making the copy-on-write and writing the slots.
    fn append(&mut self, new: &[u32], mem: &Mem) -> bool {
        let Ok((range, copy)) = self.seq.try_append_cow(new.len()) else {
            return false;
        };
        if let Some(copy) = copy {
            mem.copy(&copy);
        }
        for (pos, &t) in range.zip(new) {
            mem.write(self.seq.slot(pos).unwrap(), t);
        }
        self.tokens.extend_from_slice(new);
        true
    }

    fn truncate(&mut self, len: usize, fence: Option<u64>) {
        match fence {
            None => self.seq.truncate(len),
            Some(f) => self.seq.truncate_fenced(len, f),
        };
        self.tokens.truncate(len.min(self.tokens.len()));
    }

    fn fork(&self, mem: &Mem) -> Option<Tracked> {
        let (seq, copy) = self.seq.try_fork().ok()?;
        if let Some(copy) = copy {
            mem.copy(&copy);
        }
        Some(Tracked {
            seq,
            tokens: self.tokens.clone(),
        })
    }
}

/// The block holding `key` now, if any (a one-key probe, given back at
/// once).
fn holder(pool: &Arc<BlockPool>, key: &BlockHash) -> Option<BlockId> {
    let mut probe = Sequence::new(Arc::clone(pool));
    (probe.try_match_prefix(std::slice::from_ref(key)) == 1).then(|| probe.blocks()[0])
}

/// Publishes `t`'s full blocks and checks the result (sequential: nothing
/// else runs on the pool meanwhile). Returns what the publish returned.
fn publish_checked(pool: &Arc<BlockPool>, t: &mut Tracked, mem: &Mem, what: &str) -> usize {
    let bs = pool.block_size();
    let keys = t.keys();
    let full = t.tokens.len() / bs;
    assert_eq!(full, keys.len());
    let unheld: Vec<usize> = (0..full)
        .filter(|&i| holder(pool, &keys[i]).is_none())
        .collect();
    let before = pool.cached_blocks();
    let got = t.seq.publish(&keys);
    assert_eq!(
        got,
        unheld.len(),
        "{what}: publish returned {got}, but the keys of blocks {unheld:?} had no holder \
         (table {:?}, len {})",
        t.seq.blocks(),
        t.seq.len()
    );
    assert_eq!(pool.cached_blocks() - before, got, "{what}: cached count");
    for (i, key) in keys.iter().enumerate() {
        let Some(b) = holder(pool, key) else {
            panic!(
                "{what}: block {i} ({}) of {full} full blocks is not cached and no block holds \
                 its key (table {:?}, len {})",
                t.seq.blocks()[i],
                t.seq.blocks(),
                t.seq.len()
            );
        };
        if unheld.contains(&i) {
            assert_eq!(b, t.seq.blocks()[i], "{what}: block {i} cached elsewhere");
        }
        let want: Vec<u32> = t.tokens[i * bs..(i + 1) * bs]
            .iter()
            .map(|&x| x + 1)
            .collect();
        assert_eq!(
            mem.block(b),
            want,
            "{what}: block {i}'s holder {b} has other content"
        );
    }
    got
}

/// The deterministic scenarios the mark rests on, each checked.
#[test]
fn truncates_into_cached_blocks_then_republish() {
    let pool = Arc::new(BlockPool::new(32, 4));
    let mem = Mem::new(&pool);
    let mut a = Tracked::new(&pool);
    assert!(a.append(&[1; 13], &mem));
    assert_eq!(publish_checked(&pool, &mut a, &mem, "first"), 3);
    assert_eq!(publish_checked(&pool, &mut a, &mem, "again"), 0);
    // Into a sole-held cached block, other content, publish.
    a.truncate(6, None);
    assert!(a.append(&[2, 2, 2, 2, 2, 2, 2], &mem));
    assert_eq!(
        publish_checked(&pool, &mut a, &mem, "sole, other content"),
        2
    );
    // Into a block shared with a fork, same content again (copy-on-write:
    // the copy's key is held by the shared block).
    let mut child = a.fork(&mem).unwrap();
    a.truncate(6, None);
    assert!(a.append(&[2, 2], &mem));
    assert_eq!(
        publish_checked(&pool, &mut a, &mem, "shared, same content"),
        0
    );
    // The child drops; the key goes with a reset; the next publish
    // offers the copy again.
    child.truncate(0, None);
    drop(child);
    assert_eq!(a.seq.retire_copy_source(1), 1);
    pool.complete(1);
    pool.reset_prefix_cache();
    assert_eq!(publish_checked(&pool, &mut a, &mem, "rival gone"), 1);
    // A matcher of `a`'s keys truncates into them (not the sole holder:
    // `a` keeps its keys).
    let mut m = Tracked::new(&pool);
    let keys = a.keys();
    assert_eq!(m.seq.try_match_prefix(&keys), keys.len());
    m.tokens = a.tokens[..keys.len() * 4].to_vec();
    m.truncate(3, None);
    assert!(m.append(&[7; 9], &mem));
    publish_checked(&pool, &mut m, &mem, "matcher");
    publish_checked(&pool, &mut a, &mem, "after the matcher");
    // Fenced truncate into a cached sole-held block, copy source retired.
    let mut f = m.fork(&mem).unwrap();
    drop(m);
    f.truncate(2, Some(9));
    assert!(f.append(&[5; 6], &mem));
    f.seq.retire_copy_source(9);
    pool.complete(9);
    publish_checked(&pool, &mut f, &mem, "fenced");
    f.seq.try_reserve(16, 0).unwrap();
    f.seq.shrink_to_fit();
    publish_checked(&pool, &mut f, &mem, "shrink");
}

/// Random sequential scripts over a small token alphabet (rivals: equal
/// content on other blocks; matches; forks), every publish checked.
#[test]
fn random_scripts_publish_exactly_the_uncached() {
    for seed in 1..=60u64 {
        let bs = 1 + (seed as usize % 4);
        let pool = Arc::new(BlockPool::new(48, bs));
        let mem = Mem::new(&pool);
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut live: Vec<Tracked> = Vec::new();
        let mut fence = 0u64;
        for step in 0..400 {
            let what = format!("seed {seed} step {step}");
            let op = rng.below(14);
            if live.is_empty() || op == 0 {
                // A new sequence: maybe from another's prefix, matched.
                let mut t = Tracked::new(&pool);
                let mut want: Vec<u32> = match live.len() {
                    0 => Vec::new(),
                    n => {
                        let o = &live[rng.below(n)];
                        o.tokens[..rng.below(o.tokens.len() + 1)].to_vec()
                    }
                };
                let extra = rng.below(3 * bs + 1);
                want.extend((0..extra).map(|_| rng.below(2) as u32));
                let mut keys = Vec::new();
                hash_blocks(SALT, &want, bs, &mut keys);
                let k = t.seq.try_match_prefix(&keys);
                t.tokens = want[..k * bs].to_vec();
                if t.append(&want[k * bs..], &mem) || want.len() == k * bs {
                    if live.len() < 8 {
                        live.push(t);
                    }
                }
                continue;
            }
            let i = rng.below(live.len());
            match op {
                1..=3 => {
                    let n = 1 + rng.below(2 * bs);
                    let new: Vec<u32> = (0..n).map(|_| rng.below(2) as u32).collect();
                    live[i].append(&new, &mem);
                }
                4 | 5 => {
                    let len = live[i].tokens.len();
                    let to = rng.below(len + 1);
                    let f = (rng.below(3) == 0).then(|| {
                        fence += 1;
                        fence
                    });
                    live[i].truncate(to, f);
                }
                6 => {
                    if live.len() < 8 {
                        if let Some(c) = live[i].fork(&mem) {
                            live.push(c);
                        }
                    }
                }
                7..=9 => {
                    publish_checked(&pool, &mut live[i], &mem, &what);
                }
                10 => {
                    if rng.below(2) == 0 {
                        drop(live.swap_remove(i));
                    } else {
                        fence += 1;
                        live.swap_remove(i).seq.retire(fence);
                    }
                }
                11 => {
                    pool.reset_prefix_cache();
                }
                12 => {
                    // An evicting allocation, given back at once.
                    let mut v = Vec::new();
                    let n = 1 + rng.below(pool.num_blocks());
                    if pool.try_alloc(n.min(pool.free_blocks()), &mut v).is_ok() {
                        pool.free(&v).unwrap();
                    }
                }
                _ => {
                    match rng.below(3) {
                        0 => {
                            let _ = live[i].seq.try_reserve(rng.below(3 * bs), 0);
                        }
                        1 => {
                            live[i].seq.shrink_to_fit();
                        }
                        _ => {
                            fence += 1;
                            live[i].seq.retire_copy_source(fence);
                        }
                    }
                    if rng.below(2) == 0 {
                        pool.complete_all();
                    }
                }
            }
        }
        for t in live.iter_mut() {
            publish_checked(&pool, t, &mem, &format!("seed {seed} end"));
        }
    }
}
