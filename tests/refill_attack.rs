//! An attack on the eviction ring's refill threshold (a refill begins once
//! an overflowed ring holds at most `capacity / 8` candidates, or one):
//!
//! - one thread, pools about the threshold (8 to 20 blocks, 63 to 65, 127
//!   to 130): eviction follows exact LRU against a reference, with held
//!   blocks kept few or many so that the ring overflows and refills at
//!   every fill level;
//! - real threads on small pools where nearly every admission evicts:
//!   matches, appends, publishes, forks, truncates, drops, raw
//!   allocations and `reset_prefix_cache` side by side, each thread within
//!   a budget of blocks so that every admission must succeed (an
//!   eviction must find the evictable blocks even while a refill runs and
//!   the ring is empty), every matched block must hold what its key's
//!   publisher wrote (never a block evicted and reused), and the pool must
//!   be whole at the end.

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use common::chains;
use common::lru_model::Model;
use common::{assert_pool_whole, XorShift};
use kvslots::{BlockHash, BlockId, BlockPool, Sequence};

/// Key `n` of chain `chain`.
fn key(chain: u64, n: u64) -> BlockHash {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&chain.to_le_bytes());
    b[8..16].copy_from_slice(&n.to_le_bytes());
    b[16..24].copy_from_slice(&0x5EED_0FA7_7AC4_u64.to_le_bytes());
    BlockHash(b)
}

// ---------------------------------------------------------------------------
// One thread: exact LRU
// ---------------------------------------------------------------------------

/// `steps` operations on a pool of `n` blocks, at most `max_held` of them
/// held, sequences of at most `most` blocks; returns the evictions.
fn lru_run(n: usize, max_held: usize, most: usize, steps: usize, seed: u64) -> usize {
    let pool = Arc::new(BlockPool::new(n, 1));
    let mut m = Model::new(n);
    let mut seqs: Vec<Sequence> = Vec::new();
    let mut chains: Vec<Vec<BlockHash>> = Vec::new();
    let mut counter = 0u64;
    let mut rng = XorShift::new(seed);
    for step in 0..steps {
        let what = format!("{n} blocks, held {max_held}, seed {seed}, step {step}");
        let roll = rng.below(100);
        let avail = n - m.held();
        if roll < 40 || seqs.is_empty() {
            let want = 1 + rng.below(most);
            let len = want.min(avail);
            if len == 0 {
                continue;
            }
            let mut s = Sequence::new(Arc::clone(&pool));
            s.try_append(len).unwrap();
            m.fresh(s.blocks(), &what);
            let keys: Vec<BlockHash> = (0..len)
                .map(|_| {
                    counter += 1;
                    key(u64::MAX, counter)
                })
                .collect();
            assert_eq!(s.publish(&keys), len, "{what}: publish");
            m.published(&keys, s.blocks());
            chains.push(keys);
            if chains.len() > 64 {
                chains.remove(0);
            }
            seqs.push(s);
        } else if roll < 55 && !chains.is_empty() {
            let keys = &chains[rng.below(chains.len())];
            let len = 1 + rng.below(keys.len());
            let keys = &keys[..len];
            let mut s = Sequence::new(Arc::clone(&pool));
            m.matched(&mut s, keys, &what);
            seqs.push(s);
        } else if roll < 85 {
            m.dropped(seqs.remove(rng.below(seqs.len())));
        } else if roll < 92 {
            let i = rng.below(seqs.len());
            let before = seqs[i].blocks().to_vec();
            let len = rng.below(before.len() + 1);
            seqs[i].truncate(len);
            for &b in before[len..].iter().rev() {
                m.drop_ref(b);
            }
        } else {
            // Raw blocks taken and given back: evicts in bulk, down to an
            // empty ring.
            let k = (1 + rng.below(n)).min(avail);
            if k == 0 {
                continue;
            }
            let mut out = Vec::new();
            pool.try_alloc(k, &mut out).unwrap();
            m.fresh(&out, &what);
            pool.free(&out).unwrap();
            m.freed(&out);
        }
        while m.held() > max_held {
            m.dropped(seqs.remove(0));
        }
        assert_eq!(pool.evictable_blocks(), m.lru.len(), "{what}: evictable");
    }
    drop(seqs);
    assert_pool_whole(&pool);
    m.evictions
}

/// Pools about the threshold: rings under 16 slots (13 blocks: refill
/// with one candidate left) and above (with an eighth left), and larger
/// pools.
#[test]
fn exact_lru_on_pools_about_the_threshold() {
    let sizes = (8..=20).chain([31, 32, 33, 63, 64, 65, 127, 128, 129, 130]);
    for n in sizes {
        // Few held (most blocks evictable, the ring overflows on bulk
        // releases), half held, and nearly all held.
        for (max_held, most) in [(n / 4, 3), (n / 2, n / 4), (n - 2, n / 3)] {
            let (max_held, most) = (max_held.max(1), most.max(1));
            let evicted = lru_run(n, max_held, most, 1500, n as u64 * 31 + max_held as u64);
            assert!(evicted > 3 * n, "{n} blocks: only {evicted} evictions");
        }
    }
}

/// Overflows the ring: `n` one-block sequences released, matched again
/// and released again leave `n` stale candidates; then evicts one block at a time,
/// re-checking against the release order, so that a refill begins at
/// every fill level, exactly at the threshold included; with releases
/// interleaved so that the ring is topped up between refills.
#[test]
fn one_at_a_time_evictions_cross_the_threshold_in_order() {
    for n in (8..=20).chain([63, 64, 65, 127, 128, 129, 130, 200]) {
        let pool = Arc::new(BlockPool::new(n, 1));
        let mut m = Model::new(n);
        let mut counter = 0u64;
        let mut rng = XorShift::new(n as u64);
        let mut held: Vec<Sequence> = Vec::new();
        let mut keys: Vec<BlockHash> = Vec::new();
        for round in 0..6 {
            // Fill every free block with a cached one-block sequence.
            while m.held() < n {
                let mut s = Sequence::new(Arc::clone(&pool));
                s.try_append(1).unwrap();
                let what = format!("{n} blocks, round {round}, fill");
                m.fresh(s.blocks(), &what);
                counter += 1;
                let k = key(7, counter);
                assert_eq!(s.publish(&[k]), 1);
                let b = s.blocks()[0];
                m.published(&[k], &[b]);
                keys.push(k);
                held.push(s);
            }
            // Release them all in a shuffled order, then match each again
            // and release them again in another: their first candidates
            // are then stale, and the ring (a slot a block and a quarter
            // more) overflows once a quarter are released again.
            for pass in 0..2 {
                while !held.is_empty() {
                    let s = held.swap_remove(rng.below(held.len()));
                    let b = s.blocks()[0];
                    drop(s);
                    m.drop_ref(b);
                }
                if pass == 0 {
                    for &k in &keys {
                        let what = format!("{n} blocks, round {round}, match {k:?}");
                        let mut s = Sequence::new(Arc::clone(&pool));
                        m.matched(&mut s, &[k], &what);
                        held.push(s);
                    }
                }
            }
            keys.clear();
            // Evict one at a time; every few evictions release one block
            // taken earlier, so that appends and refills interleave.
            let mut raw: Vec<BlockId> = Vec::new();
            for step in 0..n + n / 2 {
                let what = format!("{n} blocks, round {round}, step {step}");
                if m.held() == n {
                    break;
                }
                let mut out = Vec::new();
                pool.try_alloc(1, &mut out).unwrap();
                m.fresh(&out, &what);
                if step % 3 == 2 {
                    // Give it a key and release it: the youngest.
                    counter += 1;
                    let k = key(8, counter);
                    let mut s = Sequence::new(Arc::clone(&pool));
                    assert_eq!(s.try_match_prefix(&[k]), 0);
                    pool.free(&out).unwrap();
                    m.refs[out[0].index()] -= 1;
                    s.try_append(1).unwrap();
                    m.fresh(s.blocks(), &what);
                    assert_eq!(s.publish(&[k]), 1);
                    let b = s.blocks()[0];
                    m.published(&[k], &[b]);
                    drop(s);
                    m.drop_ref(b);
                } else {
                    raw.extend(out);
                }
                assert_eq!(pool.evictable_blocks(), m.lru.len(), "{what}: evictable");
            }
            pool.free(&raw).unwrap();
            m.freed(&raw);
        }
        assert!(m.evictions > 3 * n, "{n}: {} evictions", m.evictions);
        assert_pool_whole(&pool);
    }
}

// ---------------------------------------------------------------------------
// Real threads
// ---------------------------------------------------------------------------

/// Chains the threads share (match and publish).
const CHAINS: u64 = 24;

/// One thread's work on a shared pool of `n` blocks; it holds at most
/// `budget` blocks (counting every sequence's length, forks included),
/// so every admission must succeed.
#[allow(clippy::too_many_arguments)]
fn worker(
    pool: &Arc<BlockPool>,
    content: &[AtomicU64],
    t: usize,
    budget: usize,
    rounds: usize,
    resets: bool,
    chain_len: usize,
    hits: &AtomicUsize,
) {
    let mut rng = XorShift::new(0x00A7_7AC4 + t as u64);
    let mut seqs: Vec<Sequence> = Vec::new();
    let mut own = 0u64;
    let held = |seqs: &Vec<Sequence>| seqs.iter().map(Sequence::len).sum::<usize>();
    for round in 0..rounds {
        let what = format!("thread {t}, round {round}");
        let roll = rng.below(100);
        let room = budget - held(&seqs);
        if roll < 45 && room > 0 {
            // A request: a shared chain (warm) or one of its own (cold),
            // matched, the rest appended, written and published.
            let chain = if rng.below(3) == 0 {
                rng.below(CHAINS as usize) as u64
            } else {
                own += 1;
                1_000_000 * (t as u64 + 1) + own
            };
            let len = (1 + rng.below(chain_len)).min(room);
            let keys: Vec<BlockHash> = (0..len as u64).map(|i| key(chain, i)).collect();
            let (s, matched, _) = chains::request(pool, content, chain, &keys, &what);
            hits.fetch_add(matched, Ordering::Relaxed);
            seqs.push(s);
        } else if roll < 55 && !seqs.is_empty() && room > 0 {
            let i = rng.below(seqs.len());
            if seqs[i].len() <= room {
                let (child, copy) = seqs[i]
                    .try_fork()
                    .unwrap_or_else(|e| panic!("{what}: fork: {e:?}"));
                assert!(copy.is_none(), "{what}: one token a block");
                seqs.push(child);
            }
        } else if roll < 65 && !seqs.is_empty() {
            let i = rng.below(seqs.len());
            let len = rng.below(seqs[i].len() + 1);
            seqs[i].truncate(len);
        } else if roll < 90 && !seqs.is_empty() {
            let i = rng.below(seqs.len());
            drop(seqs.swap_remove(i));
        } else if roll < 97 && room > 0 {
            let k = 1 + rng.below(room);
            let mut out = Vec::new();
            if let Err(e) = pool.try_alloc(k, &mut out) {
                panic!(
                    "{what}: raw alloc of {k} failed ({e:?}) within budget: free {} used {} evictable {}",
                    pool.free_blocks(),
                    pool.used_blocks(),
                    pool.evictable_blocks()
                );
            }
            for &b in &out {
                content[b.index()].store(0, Ordering::Release);
            }
            pool.free(&out).unwrap();
        } else if resets {
            pool.reset_prefix_cache();
        }
    }
}

/// `threads` threads on a pool of `n` blocks; each holds at most
/// `(n - 1) / threads` blocks (one left for a reset's block), so that no
/// admission may fail.
fn churn(n: usize, threads: usize, rounds: usize, chain_len: usize) {
    let pool = Arc::new(BlockPool::new(n, 1));
    let content: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let budget = (n - 1) / threads;
    assert!(budget > 0);
    let hits = AtomicUsize::new(0);
    thread::scope(|s| {
        for t in 0..threads {
            let (pool, content, hits) = (&pool, &content, &hits);
            s.spawn(move || worker(pool, content, t, budget, rounds, t == 0, chain_len, hits));
        }
    });
    assert_eq!(pool.used_blocks(), 0, "{n} blocks, {threads} threads");
    assert_eq!(pool.cached_blocks(), pool.evictable_blocks());
    let evictions = pool.prefix_stats().evictions;
    assert!(
        evictions as usize > 2 * n,
        "{n} blocks, {threads} threads: only {evictions} evictions"
    );
    assert!(hits.into_inner() > 0, "{n} blocks: no hits");
    assert_pool_whole(&pool);
}

#[test]
fn threads_on_small_pools_never_fail_an_admission_within_budget() {
    for &(n, threads) in &[
        (9, 2),
        (9, 4),
        (9, 8),
        (16, 2),
        (17, 4),
        (17, 8),
        (33, 4),
        (64, 4),
        (65, 8),
        (129, 2),
        (129, 8),
        (200, 4),
    ] {
        churn(n, threads, 3000, 6);
    }
}

/// Every block in long chains: nearly every admission evicts most of the
/// pool, so rings run dry in the middle of requests.
#[test]
fn threads_evicting_in_bulk_never_fail_an_admission() {
    for &(n, threads) in &[(16, 2), (64, 2), (65, 4), (130, 3), (200, 8)] {
        churn(n, threads, 2000, n);
    }
}
