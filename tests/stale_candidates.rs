//! The eviction ring (`num_blocks + num_blocks / 4` slots) under stale
//! candidates: revival storms (stale candidates far beyond the extra
//! quarter, so that the ring overflows and is refilled), tiny
//! pools and the sizes where the capacity rounding changes, forks,
//! truncates, raw bulk evictions and resets; one thread against the
//! exact-LRU model, and real threads (revivers against bulk evictors)
//! checking admissions, content and wholeness. `tests/refill_attack.rs`
//! has the mixed workload on real threads.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use common::chains::{self, tag};
use common::lru_model::Model;
use common::{assert_pool_whole, XorShift};
use kvslots::{BlockHash, BlockId, BlockPool, Sequence};

fn key(chain: u64, n: u64) -> BlockHash {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&chain.to_le_bytes());
    b[8..16].copy_from_slice(&n.to_le_bytes());
    b[16..24].copy_from_slice(&0xC0FF_EE00_0A11_u64.to_le_bytes());
    BlockHash(b)
}

fn sizes() -> Vec<usize> {
    (1..=20)
        .chain([31, 32, 33, 63, 64, 65, 127, 128, 129, 130, 200, 257])
        .collect()
}

fn reset(pool: &BlockPool, m: &mut Model, what: &str) {
    let got = pool.reset_prefix_cache();
    let gone = std::mem::take(&mut m.lru);
    for &b in gone.values() {
        m.released_at[b.index()] = None;
        if let Some(k) = m.keys[b.index()].take() {
            m.index.remove(&k);
        }
    }
    assert_eq!(got, gone.len(), "{what}: reset");
}

/// One thread, a revival storm: a working set of chains is matched and
/// released again and again (each time leaving stale candidates), while
/// fresh chains, forks, truncates, raw bulk allocations and rare resets
/// evict. Checked against exact LRU at every step.
fn storm(n: usize, steps: usize, seed: u64, max_held: usize, revive_pct: u64) -> usize {
    let pool = Arc::new(BlockPool::new(n, 1));
    let mut m = Model::new(n);
    let mut seqs: Vec<Sequence> = Vec::new();
    let mut chains: Vec<Vec<BlockHash>> = Vec::new();
    let mut counter = 0u64;
    let mut rng = XorShift::new(seed);
    let most = (n / 3).max(1);
    for step in 0..steps {
        let what = format!("{n} blocks, seed {seed}, held {max_held}, step {step}");
        let roll = rng.below(1000) as u64;
        let avail = n - m.held();
        if roll < revive_pct * 10 && !chains.is_empty() {
            // Revive: match a chain (or a prefix of it) and release it at
            // once, or keep it a while.
            let c = rng.below(chains.len());
            let len = 1 + rng.below(chains[c].len());
            let keys = chains[c][..len].to_vec();
            let mut s = Sequence::new(Arc::clone(&pool));
            m.matched(&mut s, &keys, &what);
            if rng.below(4) == 0 {
                seqs.push(s);
            } else {
                m.dropped(s);
            }
        } else if roll < 850 || seqs.is_empty() {
            // A request: match some chain's prefix, append the rest,
            // publish the whole (new keys after the match).
            let want = (1 + rng.below(most)).min(avail);
            if want == 0 {
                // Nothing free: drop something.
                if !seqs.is_empty() {
                    m.dropped(seqs.remove(0));
                }
                continue;
            }
            counter += 1;
            let chain = counter;
            let keys: Vec<BlockHash> = (0..want as u64).map(|i| key(chain, i)).collect();
            let mut s = Sequence::new(Arc::clone(&pool));
            s.try_append(want)
                .unwrap_or_else(|e| panic!("{what}: append {want}: {e:?}"));
            m.fresh(s.blocks(), &what);
            assert_eq!(s.publish(&keys), want, "{what}: publish");
            m.published(&keys, s.blocks());
            chains.push(keys);
            if chains.len() > 2 * n + 8 {
                chains.remove(rng.below(chains.len()));
            }
            if rng.below(3) == 0 {
                m.dropped(s);
            } else {
                seqs.push(s);
            }
        } else if roll < 890 && !seqs.is_empty() {
            let i = rng.below(seqs.len());
            let (child, copy) = seqs[i].try_fork().unwrap();
            assert!(copy.is_none());
            for &b in child.blocks() {
                m.hold(b);
            }
            seqs.push(child);
        } else if roll < 930 && !seqs.is_empty() {
            let i = rng.below(seqs.len());
            let before = seqs[i].blocks().to_vec();
            let len = rng.below(before.len() + 1);
            seqs[i].truncate(len);
            for &b in before[len..].iter().rev() {
                m.drop_ref(b);
            }
        } else if roll < 995 {
            // Raw bulk: evicts many at once, often down to an empty ring.
            let k = (1 + rng.below(n)).min(avail);
            if k == 0 {
                continue;
            }
            let mut out = Vec::new();
            pool.try_alloc(k, &mut out)
                .unwrap_or_else(|e| panic!("{what}: raw {k}: {e:?}"));
            m.fresh(&out, &what);
            if rng.below(2) == 0 {
                pool.free(&out).unwrap();
                m.freed(&out);
            } else {
                // Keep them raw for a moment: give them back one by one
                // through a publish so they become the youngest.
                for &b in &out {
                    counter += 1;
                    let k = key(u64::MAX - 1, counter);
                    pool.free(&[b]).unwrap();
                    m.freed(&[b]);
                    let mut s = Sequence::new(Arc::clone(&pool));
                    s.try_append(1).unwrap();
                    m.fresh(s.blocks(), &what);
                    assert_eq!(s.publish(&[k]), 1);
                    m.published(&[k], s.blocks());
                    chains.push(vec![k]);
                    m.dropped(s);
                }
            }
        } else {
            reset(&pool, &mut m, &what);
        }
        while m.held() > max_held {
            m.dropped(seqs.remove(0));
        }
        assert_eq!(pool.evictable_blocks(), m.lru.len(), "{what}: evictable");
        let cached = m.keys.iter().filter(|k| k.is_some()).count();
        assert_eq!(pool.cached_blocks(), cached, "{what}: cached");
    }
    drop(seqs);
    assert_pool_whole(&pool);
    m.evictions
}

#[test]
fn revival_storms_evict_in_exact_lru_order_on_every_size() {
    for n in sizes() {
        for (max_held, revive) in [(n / 4, 40), (n / 2, 60), (n.saturating_sub(1), 30), (n, 70)] {
            let max_held = max_held.max(1);
            let mut ev = 0;
            for seed in 0..2u64 {
                ev += storm(
                    n,
                    1200,
                    seed * 7919 + n as u64 * 31 + max_held as u64,
                    max_held,
                    revive,
                );
            }
            assert!(ev >= n, "{n} blocks held {max_held}: only {ev} evictions");
        }
    }
}

/// Every block cached and evictable, then each revived `revivals` times
/// in a shuffled order (stale candidates: up to `revivals * n`, many
/// times the ring's extra quarter), then evicted one at a time, in
/// pairs, and in bulk, checked against exact LRU.
#[test]
fn every_block_revived_many_times_then_evicted() {
    for n in sizes() {
        for revivals in [1usize, 2, 5] {
            for evict_k in [1usize, 2, 3, n] {
                let pool = Arc::new(BlockPool::new(n, 1));
                let mut m = Model::new(n);
                let mut rng = XorShift::new((n * 1000 + revivals * 10 + evict_k) as u64);
                let mut counter = 0u64;
                for round in 0..4 {
                    let what =
                        format!("{n} blocks, revivals {revivals}, k {evict_k}, round {round}");
                    let mut keys = Vec::new();
                    let mut held = Vec::new();
                    while m.held() < n {
                        let mut s = Sequence::new(Arc::clone(&pool));
                        s.try_append(1).unwrap();
                        m.fresh(s.blocks(), &what);
                        counter += 1;
                        let k = key(5, counter);
                        assert_eq!(s.publish(&[k]), 1);
                        m.published(&[k], s.blocks());
                        keys.push(k);
                        held.push(s);
                    }
                    for pass in 0..=revivals {
                        while !held.is_empty() {
                            let s = held.swap_remove(rng.below(held.len()));
                            m.dropped(s);
                        }
                        if pass < revivals {
                            // revive a random subset, each perhaps twice
                            for &k in &keys {
                                if rng.below(5) == 0 {
                                    continue;
                                }
                                let mut s = Sequence::new(Arc::clone(&pool));
                                m.matched(&mut s, &[k], &what);
                                held.push(s);
                            }
                        }
                    }
                    assert_eq!(pool.evictable_blocks(), n, "{what}");
                    // Evict, interleaving fresh releases.
                    let mut raw: Vec<BlockId> = Vec::new();
                    let mut step = 0;
                    while m.held() < n {
                        let k = evict_k.min(n - m.held());
                        let mut out = Vec::new();
                        pool.try_alloc(k, &mut out).unwrap();
                        m.fresh(&out, &format!("{what}, step {step}"));
                        if step % 4 == 3 {
                            pool.free(&out).unwrap();
                            m.freed(&out);
                            // revive one still-cached key, release it
                            if let Some(&k) = keys.iter().find(|k| m.index.contains_key(*k)) {
                                let mut s = Sequence::new(Arc::clone(&pool));
                                m.matched(&mut s, &[k], &what);
                                m.dropped(s);
                            }
                        } else {
                            raw.extend(out);
                        }
                        step += 1;
                        assert_eq!(pool.evictable_blocks(), m.lru.len(), "{what}: evictable");
                        if step > 10 * n + 10 {
                            break;
                        }
                    }
                    pool.free(&raw).unwrap();
                    m.freed(&raw);
                }
                assert_pool_whole(&pool);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Real threads
// ---------------------------------------------------------------------------

/// Revivers match and release shared chains over and over (stale
/// candidates pile up far past the ring's extra quarter) and re-check the
/// content before each release; evictors take raw blocks in bulk (up to
/// their whole budget, so the ring runs dry and refills under them),
/// overwrite them, check that they hold them alone, and free them.
fn revivers_and_evictors(n: usize, shards: usize, revivers: usize, evictors: usize, rounds: usize) {
    let pool = Arc::new(
        BlockPool::builder(n, 1)
            .shards(shards)
            .prefix_cache(true)
            .build()
            .unwrap(),
    );
    let content: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let threads = revivers + evictors;
    let budget = (n - 1) / threads;
    assert!(budget > 0);
    let chain_len = budget.min(8);
    thread::scope(|s| {
        for t in 0..threads {
            let (pool, content) = (&pool, &content);
            s.spawn(move || {
                let mut rng = XorShift::new(0xFACE + t as u64 * 131);
                for round in 0..rounds {
                    let what = format!("{n}/{shards} t{t} round {round}");
                    if t < revivers {
                        let chain = rng.below(3 * n / chain_len + 2) as u64;
                        let len = 1 + rng.below(chain_len);
                        let keys: Vec<BlockHash> = (0..len as u64).map(|i| key(chain, i)).collect();
                        let (s, matched, cached) =
                            chains::request(pool, content, chain, &keys, &what);
                        // Revive the same chain again while held (a second
                        // holder of the same blocks): only if this request's
                        // blocks hold every key, or the match would hold a
                        // rival copy's blocks too, past the thread's budget.
                        if rng.below(2) == 0 && matched + cached == len {
                            let mut s2 = Sequence::new(Arc::clone(pool));
                            let m2 = s2.try_match_prefix(&keys);
                            assert!(m2 <= len);
                            for (i, &b) in s2.blocks().iter().enumerate() {
                                assert_eq!(
                                    content[b.index()].load(Ordering::Acquire),
                                    tag(chain, i as u64),
                                    "{what}: rematch {b}"
                                );
                            }
                        }
                        for (i, &b) in s.blocks().iter().enumerate() {
                            assert_eq!(
                                content[b.index()].load(Ordering::Acquire),
                                tag(chain, i as u64),
                                "{what}: before release {b}"
                            );
                        }
                        drop(s);
                    } else {
                        let k = 1 + rng.below(budget);
                        let mut out = Vec::new();
                        pool.try_alloc(k, &mut out).unwrap_or_else(|e| {
                            panic!(
                                "{what}: raw {k} failed {e:?}: free {} used {} evictable {}",
                                pool.free_blocks(),
                                pool.used_blocks(),
                                pool.evictable_blocks()
                            )
                        });
                        for &b in &out {
                            assert_eq!(pool.ref_count(b), Some(1), "{what}: raw block {b} shared");
                            content[b.index()].store(0, Ordering::Release);
                        }
                        if t == threads - 1 && rng.below(200) == 0 {
                            pool.reset_prefix_cache();
                        }
                        pool.free(&out).unwrap();
                    }
                }
            });
        }
    });
    assert_eq!(pool.used_blocks(), 0);
    assert_eq!(pool.cached_blocks(), pool.evictable_blocks());
    let st = pool.prefix_stats();
    assert!(
        st.evictions as usize > n,
        "{n}: only {} evictions",
        st.evictions
    );
    assert!(st.hit_blocks > 0, "{n}: no hits");
    assert_pool_whole(&pool);
}

#[test]
fn revivers_and_bulk_evictors_on_many_sizes() {
    for &(n, shards) in &[
        (5, 1),
        (8, 1),
        (9, 1),
        (13, 2),
        (17, 1),
        (33, 2),
        (63, 1),
        (64, 4),
        (65, 1),
        (127, 2),
        (129, 1),
        (257, 4),
        (1024, 8),
    ] {
        for (rev, ev) in [(1usize, 1usize), (2, 1), (1, 3), (3, 3)] {
            if (n - 1) / (rev + ev) == 0 {
                continue;
            }
            revivers_and_evictors(n, shards, rev, ev, 4_000);
        }
    }
}

/// Small pools, give-backs of whole batches racing refills that begin
/// with candidates left: a hunt for a refill that reads more candidates
/// than the ring holds.
#[test]
fn batch_give_backs_race_low_water_refills() {
    for n in [4usize, 5, 7, 8, 9, 10, 12, 13, 16, 20, 33, 40] {
        let pool = Arc::new(BlockPool::new(n, 1));
        let threads = 3;
        let budget = (n / threads).max(1);
        if budget * threads > n {
            continue;
        }
        thread::scope(|s| {
            for t in 0..threads {
                let pool = &pool;
                s.spawn(move || {
                    let mut rng = XorShift::new(77 + t as u64 + n as u64 * 1000);
                    for round in 0..10_000u64 {
                        match rng.below(3) {
                            0 => {
                                let k = 1 + rng.below(budget);
                                let chain = rng.below(2 * n) as u64;
                                let keys: Vec<BlockHash> =
                                    (0..k as u64).map(|i| key(chain, i)).collect();
                                let mut s = Sequence::new(Arc::clone(pool));
                                let m = s.try_match_prefix(&keys);
                                s.try_append(k - m)
                                    .unwrap_or_else(|e| panic!("{n} t{t} r{round}: {e:?}"));
                                s.publish(&keys);
                            }
                            _ => {
                                let k = 1 + rng.below(budget.min(2));
                                let mut out = Vec::new();
                                pool.try_alloc(k, &mut out)
                                    .unwrap_or_else(|e| panic!("{n} t{t} r{round}: raw {e:?}"));
                                pool.free(&out).unwrap();
                            }
                        }
                    }
                });
            }
        });
        assert_pool_whole(&pool);
    }
}

#[test]
fn revival_storms_on_large_pools() {
    for n in [511usize, 1025] {
        for (max_held, revive) in [(n / 8, 60), (n / 2, 40)] {
            let ev = storm(n, 800, n as u64 + max_held as u64, max_held, revive);
            assert!(ev >= n, "{n}: only {ev} evictions");
        }
    }
}
