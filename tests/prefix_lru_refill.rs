//! Single-thread eviction order against an exact-LRU reference over long
//! runs on pools of many sizes, so that the eviction ring (a slot a block
//! and a quarter more) overflows and is refilled many times: each refill must append
//! the next least recently released blocks, oldest first, whatever the
//! spread of their release stamps (releases of one block, of long
//! sequences, revivals that leave stale candidates, raw allocations that
//! evict in bulk).

mod common;

use std::sync::Arc;

use common::lru_model::Model;
use kvslots::{BlockHash, BlockPool, Sequence};

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A distinct key for each `c`.
fn key(c: u64) -> BlockHash {
    let mut b = [0u8; 32];
    let mut z = c.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x1234_5678;
    for w in b.chunks_mut(8) {
        z ^= z >> 29;
        z = z.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        w.copy_from_slice(&z.to_le_bytes());
    }
    b[0] = c as u8;
    b[1] = (c >> 8) as u8;
    b[2] = (c >> 16) as u8;
    BlockHash(b)
}

/// `steps` random operations on a pool of `num_blocks` blocks, checked
/// against the model after each; returns how many blocks were evicted.
fn run(num_blocks: usize, steps: usize, seed: u64) -> usize {
    let pool = Arc::new(BlockPool::new(num_blocks, 1));
    let mut m = Model::new(num_blocks);
    let mut seqs: Vec<Sequence> = Vec::new();
    let mut chains: Vec<Vec<BlockHash>> = Vec::new();
    let mut counter = 0u64;
    let mut state = seed;
    let most = (num_blocks / 6).max(2);
    for step in 0..steps {
        let what = format!("{num_blocks} blocks, seed {seed}, step {step}");
        let roll = splitmix(&mut state) % 100;
        let x = splitmix(&mut state) as usize;
        let held = m.refs.iter().filter(|&&r| r > 0).count();
        let avail = num_blocks - held;
        if roll < 35 || seqs.is_empty() {
            // A new sequence of fresh blocks, published.
            let n = (1 + x % most).min(avail);
            if n == 0 {
                continue;
            }
            let mut s = Sequence::new(Arc::clone(&pool));
            s.try_append(n).unwrap();
            m.fresh(s.blocks(), &what);
            let keys: Vec<BlockHash> = (0..n)
                .map(|_| {
                    counter += 1;
                    key(counter)
                })
                .collect();
            assert_eq!(s.publish(&keys), n, "{what}: publish");
            m.published(&keys, s.blocks());
            chains.push(keys);
            if chains.len() > 400 {
                chains.remove(0);
            }
            seqs.push(s);
        } else if roll < 55 && !chains.is_empty() {
            // A revival: some earlier chain matched (its hits leave the
            // eviction order; their candidates in the ring go stale).
            let keys = &chains[x % chains.len()];
            let len = 1 + (x >> 20) % keys.len();
            let keys = &keys[..len];
            let mut s = Sequence::new(Arc::clone(&pool));
            m.matched(&mut s, keys, &what);
            seqs.push(s);
        } else if roll < 70 && !chains.is_empty() {
            // Revivals of the latest chains, each released at once: their
            // blocks are appended to the ring again, and their older
            // candidates go stale; enough of these overflow the ring,
            // which has room for every block and a quarter more.
            for keys in chains.iter().rev().take(1 + x % 16) {
                let mut s = Sequence::new(Arc::clone(&pool));
                m.matched(&mut s, keys, &what);
                m.dropped(s);
            }
        } else if roll < 90 {
            m.dropped(seqs.remove(x % seqs.len()));
        } else if roll < 95 {
            let i = x % seqs.len();
            let before = seqs[i].blocks().to_vec();
            let len = (x >> 20) % (before.len() + 1);
            seqs[i].truncate(len);
            for &b in before[len..].iter().rev() {
                m.drop_ref(b);
            }
        } else {
            // Raw blocks taken and given back: evicts in bulk.
            let n = (1 + x % (num_blocks / 2).max(1)).min(avail);
            let mut out = Vec::new();
            pool.try_alloc(n, &mut out).unwrap();
            m.fresh(&out, &what);
            pool.free(&out).unwrap();
            m.freed(&out);
        }
        // Keep the held blocks few, so that most are evictable.
        while m.refs.iter().filter(|&&r| r > 0).count() > num_blocks / 3 {
            m.dropped(seqs.remove(0));
        }
        assert_eq!(pool.evictable_blocks(), m.lru.len(), "{what}: evictable");
    }
    drop(seqs);
    assert_eq!(pool.used_blocks(), 0);
    m.evictions
}

/// Every size: small pools, odd sizes, sizes about powers of two, and
/// large pools where one refill scans thousands of blocks.
#[test]
fn long_runs_evict_in_exact_lru_order_on_pools_of_every_size() {
    for (num_blocks, steps) in [
        // A refill begins with one candidate left in a ring under 16
        // slots (under 13 blocks), with an eighth of them above.
        (8, 2000),
        (15, 2000),
        (16, 2000),
        (17, 2000),
        (40, 2000),
        (64, 3000),
        (65, 3000),
        (100, 3000),
        (127, 3000),
        (129, 3000),
        (512, 3000),
        (1000, 2500),
        (1023, 2500),
        (1025, 2500),
        (4096, 1500),
    ] {
        for seed in [1, 2] {
            let evicted = run(num_blocks, steps, seed * 0x1000 + num_blocks as u64);
            // Enough evictions that the ring was refilled many times.
            assert!(
                evicted > 10 * num_blocks,
                "{num_blocks} blocks: only {evicted} evictions"
            );
        }
    }
}
