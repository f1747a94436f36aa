//! Real-thread stress of the prefix cache, misuse included: forks, truncates at any position, copy-on-write appends, publishes by
//! parents and children, matches with two salts, resets, on tiny pools,
//! with the pool checked whole after each round and a watchdog that
//! aborts the process if a round hangs (an eviction that spins forever).
//!
//! Each block has a content stamp (an `AtomicU64`, `Relaxed`, standing
//! for its KV data): a full block's stamp is its key's, a partial block's
//! is 0. Every write happens on a block the writer must hold alone, and
//! every matched block's stamp must be the key asked for. A cached block
//! written while its key can match, a stale hit, or an eviction of a held
//! block shows up as a wrong stamp.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use kvslots::{hash_blocks, BlockHash, BlockId, BlockPool, Sequence};

mod common;
use common::{key_stamp, meet, wait_until, XorShift};

struct World {
    pool: Arc<BlockPool>,
    content: Vec<AtomicU64>,
    bs: usize,
}

/// A sequence with the tokens it holds and its salt.
struct Live {
    seq: Sequence,
    tokens: Vec<u32>,
    salt: &'static [u8],
}

impl World {
    fn keys(&self, salt: &[u8], tokens: &[u32]) -> Vec<BlockHash> {
        let mut keys = Vec::new();
        hash_blocks(salt, tokens, self.bs, &mut keys);
        keys
    }

    /// Every full block of `live` must hold its key's content.
    fn check(&self, live: &Live, what: &str) {
        let keys = self.keys(live.salt, &live.tokens);
        for (i, key) in keys.iter().enumerate() {
            let block = live.seq.blocks()[i];
            // Relaxed: only the pool may order the writer before us.
            let seen = self.content[block.index()].load(Ordering::Relaxed);
            assert_eq!(
                seen,
                key_stamp(key),
                "{what}: {block} (index {i}) holds other content"
            );
        }
    }

    /// Writes blocks `from..` of `live` (full ones with their keys'
    /// stamps, a partial one with 0); each must be held alone.
    fn write(&self, live: &Live, from: usize) {
        let keys = self.keys(live.salt, &live.tokens);
        let used = live.tokens.len().div_ceil(self.bs);
        for i in from..used {
            let block = live.seq.blocks()[i];
            assert_eq!(
                self.pool.ref_count(block),
                Some(1),
                "{block} written while shared"
            );
            let value = keys.get(i).map_or(0, key_stamp);
            // Relaxed: see `check`.
            self.content[block.index()].store(value, Ordering::Relaxed);
        }
    }

    /// Appends `extra` tokens to `live` (copying on write when needed);
    /// false if the pool refused.
    fn append(&self, live: &mut Live, extra: &[u32]) -> bool {
        let old = live.tokens.len();
        match live.seq.try_append_cow(extra.len()) {
            Ok((range, copy)) => {
                assert_eq!(range, old..old + extra.len());
                if let Some(copy) = copy {
                    assert_eq!(copy.tokens, old % self.bs);
                    assert_eq!(live.seq.blocks()[old / self.bs], copy.dst);
                }
                live.tokens.extend_from_slice(extra);
                // The block holding `old` is written, and every later one.
                self.write(live, old / self.bs);
                true
            }
            Err(_) => false,
        }
    }
}

fn task(world: &World, seed: u64, ops: usize) -> u64 {
    let mut rng = XorShift::new(seed);
    let mut live: Vec<Live> = Vec::new();
    let bs = world.bs;
    let mut hits = 0;
    for _ in 0..ops {
        match rng.below(10) {
            // A new prompt: a family head of tiny alphabet, matched first.
            0..=3 => {
                let salt: &'static [u8] = if rng.below(2) == 0 { b"a" } else { b"b" };
                let family = rng.below(2) as u32;
                let n = 1 + rng.below(3 * bs);
                let tokens: Vec<u32> = (0..n)
                    .map(|t| if t < bs { family } else { rng.below(2) as u32 })
                    .collect();
                let keys = world.keys(salt, &tokens);
                let mut seq = Sequence::new(Arc::clone(&world.pool));
                let k = seq.try_match_prefix(&keys);
                assert!(k <= keys.len());
                assert_eq!(seq.len(), k * bs);
                hits += k as u64;
                let mut l = Live {
                    seq,
                    tokens: tokens[..k * bs].to_vec(),
                    salt,
                };
                world.check(&l, "match");
                if world.append(&mut l, &tokens[k * bs..]) {
                    world.check(&l, "after prefill");
                    let keys = world.keys(l.salt, &l.tokens);
                    l.seq.publish(&keys);
                    live.push(l);
                }
            }
            // Fork one.
            4 if !live.is_empty() => {
                let i = rng.below(live.len());
                if let Ok((child, copy)) = live[i].seq.try_fork() {
                    let mut c = Live {
                        seq: child,
                        tokens: live[i].tokens.clone(),
                        salt: live[i].salt,
                    };
                    if let Some(copy) = copy {
                        assert_eq!(copy.tokens, c.tokens.len() % bs);
                        // The private tail is the child's alone.
                        let full = c.tokens.len() / bs;
                        world.write(&c, full);
                    }
                    world.check(&c, "fork");
                    let keys = world.keys(c.salt, &c.tokens);
                    c.seq.publish(&keys);
                    live.push(c);
                }
            }
            // Truncate anywhere, then append other tokens, then publish.
            5..=7 if !live.is_empty() => {
                let i = rng.below(live.len());
                let l = &mut live[i];
                let to = rng.below(l.tokens.len().max(1));
                l.seq.truncate(to);
                l.tokens.truncate(to);
                world.check(l, "truncate");
                let n = 1 + rng.below(2 * bs);
                let extra: Vec<u32> = (0..n).map(|_| 2 + rng.below(2) as u32).collect();
                if world.append(l, &extra) {
                    world.check(l, "append after truncate");
                    let keys = world.keys(l.salt, &l.tokens);
                    l.seq.publish(&keys);
                    world.check(l, "publish after truncate");
                }
            }
            8 => {
                world.pool.reset_prefix_cache();
            }
            _ => {
                if !live.is_empty() {
                    let i = rng.below(live.len());
                    let l = live.swap_remove(i);
                    world.check(&l, "drop");
                    drop(l);
                }
            }
        }
        while live.len() > 3 {
            let l = live.remove(0);
            world.check(&l, "drop");
        }
        for l in &live {
            world.check(l, "live");
        }
    }
    hits
}

/// One round on a fresh pool; the pool checked whole afterwards.
fn round(num_blocks: usize, bs: usize, threads: usize, seed: u64, ops: usize) -> u64 {
    let world = World {
        pool: Arc::new(BlockPool::with_shards(num_blocks, bs, 2)),
        content: (0..num_blocks).map(|_| AtomicU64::new(0)).collect(),
        bs,
    };
    let hits: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let world = &world;
                s.spawn(move || task(world, seed * 1000 + t as u64, ops))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let pool = &world.pool;
    assert_eq!(pool.used_blocks(), 0);
    assert_eq!(pool.free_blocks(), num_blocks);
    assert_eq!(pool.evictable_blocks(), pool.cached_blocks());
    assert_eq!(pool.prefix_stats().hit_blocks, hits);
    assert!(pool.prefix_stats().hit_blocks <= pool.prefix_stats().queried_blocks);
    let mut ids: Vec<BlockId> = Vec::new();
    pool.try_alloc(num_blocks, &mut ids).unwrap();
    assert_eq!(pool.cached_blocks(), 0, "a fresh allocation holds a key");
    assert!(pool.try_alloc(1, &mut Vec::new()).is_err());
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), num_blocks, "handed out twice");
    pool.free(&ids).unwrap();
    assert_eq!(pool.reset_prefix_cache(), 0);
    // No index entry leaked: with every key dropped, one sequence over
    // every block publishes a fresh key on each (a leaked entry would
    // crowd the index; a refusal is rare otherwise).
    let mut all = Sequence::new(Arc::clone(pool));
    all.try_append(num_blocks * bs).unwrap();
    let tokens: Vec<u32> = (0..(num_blocks * bs) as u32).map(|t| 1_000 + t).collect();
    let mut keys = Vec::new();
    hash_blocks(&seed.to_le_bytes(), &tokens, bs, &mut keys);
    let published = all.publish(&keys);
    assert!(
        published + 1 >= num_blocks,
        "only {published} of {num_blocks} fresh keys found room in the index"
    );
    drop(all);
    assert_eq!(pool.reset_prefix_cache(), published);
    if seed == 1 {
        eprintln!("{:?}", pool.prefix_stats());
    }
    hits
}

/// Aborts the process if `f` does not return within `limit`.
fn with_watchdog<T>(limit: Duration, f: impl FnOnce() -> T) -> T {
    let (done, wait) = mpsc::channel::<()>();
    let dog = std::thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(limit) {
            eprintln!("watchdog: a round hung for {limit:?}");
            std::process::abort();
        }
    });
    let out = f();
    done.send(()).unwrap();
    dog.join().unwrap();
    out
}

fn rounds(num_blocks: usize, bs: usize, threads: usize, n: u64, ops: usize) {
    let mut hits = 0;
    for r in 0..n {
        hits += with_watchdog(Duration::from_secs(60), || {
            round(num_blocks, bs, threads, r + 1, ops)
        });
    }
    assert!(hits > 0, "the rounds never hit the cache");
    eprintln!("{num_blocks} blocks of {bs}: {n} rounds, {hits} hits");
}

#[test]
fn forks_truncates_and_cow_against_matches_on_a_tiny_pool() {
    rounds(6, 2, 8, 20, 2_000);
}

#[test]
fn forks_truncates_and_cow_block_size_one() {
    rounds(4, 1, 8, 20, 2_000);
}

#[test]
fn forks_truncates_and_cow_larger_pool() {
    rounds(32, 4, 8, 10, 3_000);
}

/// Misuse, real threads: a raw `BlockPool::free` (a double free) racing
/// the holder's `publish` of the block. The publisher's claim holds a
/// reference of its own, so the free cannot take the block's last
/// reference while it is claimed: whichever of the free and the commit
/// drops last gives the block back (evictable, with its key, if the
/// publish committed). Once everything is dropped, a fresh `try_alloc` of
/// the whole pool must hand out no block that holds a key, and a matcher
/// must share none of them. The real-thread twin of the loom model
/// `raw_free_racing_publish_leaves_no_key_on_a_fresh_block`
/// (src/loom_tests/prefix_misuse.rs).
#[test]
fn raw_free_racing_publish_never_hands_out_a_cached_block() {
    with_watchdog(Duration::from_secs(120), || {
        let key = BlockHash([5; 32]);
        // One freeing thread for every round: it gets each round's pool
        // and block through `rounds`, meets the publisher at `arrived`
        // (two arrivals a round), frees, and says so in `freed`.
        let (rounds, next) = mpsc::channel::<(Arc<BlockPool>, BlockId)>();
        let arrived = AtomicUsize::new(0);
        let freed = AtomicUsize::new(0);
        let (arrived, freed) = (&arrived, &freed);
        std::thread::scope(|s| {
            s.spawn(move || {
                for (round, (pool, id)) in next.iter().enumerate() {
                    meet(arrived, 2 * (round + 1));
                    let _ = pool.free(&[id]); // misuse: the sequence holds it
                    drop(pool);
                    // SeqCst: the test's own hand-off, not the code under test.
                    freed.store(round + 1, Ordering::SeqCst);
                }
            });
            // Dropped when this closure ends (or unwinds), which ends the
            // freeing thread's loop before the scope joins it.
            let rounds = rounds;
            for iter in 0..200_000usize {
                let pool = Arc::new(BlockPool::new(2, 1));
                let mut seq = Sequence::new(Arc::clone(&pool));
                seq.try_append(1).unwrap();
                let id = seq.blocks()[0];
                rounds.send((Arc::clone(&pool), id)).unwrap();
                meet(arrived, 2 * (iter + 1));
                seq.publish(&[key]);
                // SeqCst: as the store's.
                wait_until(|| freed.load(Ordering::SeqCst) == iter + 1);
                drop(seq);
                assert_eq!(pool.used_blocks(), 0);
                let mut fresh = Vec::new();
                pool.try_alloc(2, &mut fresh).unwrap();
                let mut m = Sequence::new(Arc::clone(&pool));
                let k = m.try_match_prefix(&[key]);
                assert_eq!(
                    (pool.cached_blocks(), k),
                    (0, 0),
                    "iteration {iter}: fresh blocks {fresh:?}, one holds a key; \
                     a matcher took {:?} from its new owner",
                    m.blocks()
                );
            }
        });
    });
}

/// An attack on the claim's reference, real threads: two sequences
/// publish one key on their blocks (rivals) while raw frees take both
/// blocks (double frees), a matcher matches the key, and a fourth thread
/// resets the prefix cache and allocates half the pool (evicting if it
/// must). Through the double frees a sequence may name, publish and drop a
/// block that the allocator now holds (the misuse's own consequence), so
/// only the pool's promises are checked: each allocation's blocks are
/// distinct, and once everything is back the books are exact, every
/// cached block is evictable, and allocating the whole pool hands out
/// distinct blocks none of which holds a key.
#[test]
fn raw_frees_racing_rival_publishes_matches_and_resets_keep_the_books() {
    with_watchdog(Duration::from_secs(300), || {
        let n = 4;
        let key = BlockHash([8; 32]);
        for round in 0..10_000u32 {
            let pool = Arc::new(BlockPool::new(n, 1));
            let mut a = Sequence::new(Arc::clone(&pool));
            a.try_append(1).unwrap();
            let mut b = Sequence::new(Arc::clone(&pool));
            b.try_append(1).unwrap();
            let (ida, idb) = (a.blocks()[0], b.blocks()[0]);
            let barrier = std::sync::Barrier::new(4);
            std::thread::scope(|s| {
                for mut seq in [a, b] {
                    let barrier = &barrier;
                    s.spawn(move || {
                        barrier.wait();
                        seq.publish(&[key]);
                    });
                }
                s.spawn(|| {
                    barrier.wait();
                    let _ = pool.free(&[ida]); // misuse: `a` holds it
                    let mut m = Sequence::new(Arc::clone(&pool));
                    m.try_match_prefix(&[key]);
                });
                barrier.wait();
                let _ = pool.free(&[idb]); // misuse: `b` holds it
                pool.reset_prefix_cache();
                let mut out = Vec::new();
                if pool.try_alloc(n / 2, &mut out).is_ok() {
                    assert_ne!(out[0], out[1], "round {round}: one block handed out twice");
                    // One at a time: a sequence that lost its reference
                    // may have dropped ours of either block (and a free
                    // that finds a block unallocated refuses the call).
                    for id in out {
                        let _ = pool.free(&[id]);
                    }
                }
            });
            assert_eq!(pool.used_blocks(), 0, "round {round}: used blocks");
            assert_eq!(pool.free_blocks(), n, "round {round}: free blocks");
            assert_eq!(pool.cached_blocks(), pool.evictable_blocks());
            let mut all = Vec::new();
            pool.try_alloc(n, &mut all).unwrap();
            let mut sorted = all.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), n, "round {round}: {all:?}");
            assert_eq!(
                pool.cached_blocks(),
                0,
                "round {round}: a fresh block holds a key"
            );
            assert!(pool.try_alloc(1, &mut Vec::new()).is_err());
            pool.free(&all).unwrap();
            assert_eq!(pool.free_blocks(), n);
        }
    });
}

/// Misuse, real threads: a raw free racing the drop of a sequence that
/// holds a cached block. Exactly one of the two gives it back; the books
/// stay exact and the block stays cached and evictable.
#[test]
fn raw_free_racing_release_of_a_cached_block_keeps_the_books() {
    with_watchdog(Duration::from_secs(120), || {
        let key = BlockHash([6; 32]);
        for _ in 0..20_000u32 {
            let pool = Arc::new(BlockPool::new(2, 1));
            let mut seq = Sequence::new(Arc::clone(&pool));
            seq.try_append(1).unwrap();
            assert_eq!(seq.publish(&[key]), 1);
            let id = seq.blocks()[0];
            let barrier = std::sync::Barrier::new(2);
            let r = std::thread::scope(|s| {
                let h = s.spawn(|| {
                    barrier.wait();
                    pool.free(&[id])
                });
                barrier.wait();
                drop(seq);
                h.join().unwrap()
            });
            let _ = r;
            assert_eq!(pool.used_blocks(), 0);
            assert_eq!(pool.free_blocks(), 2);
            assert_eq!((pool.cached_blocks(), pool.evictable_blocks()), (1, 1));
            let mut m = Sequence::new(Arc::clone(&pool));
            assert_eq!(m.try_match_prefix(&[key]), 1);
            assert_eq!(m.blocks(), [id]);
            assert_eq!(pool.used_blocks(), 1);
            drop(m);
            let mut all = Vec::new();
            pool.try_alloc(2, &mut all).unwrap();
            assert_eq!(pool.cached_blocks(), 0);
            assert!(pool.try_alloc(1, &mut Vec::new()).is_err());
            pool.free(&all).unwrap();
        }
    });
}

/// Everything cached and referenced in a tiny pool, many threads
/// allocating: each allocation must come back `Full` (no spin, nothing
/// evicted), and a holder's block keeps its content.
#[test]
fn everything_cached_and_held_gives_full_not_a_spin() {
    with_watchdog(Duration::from_secs(60), || {
        let pool = Arc::new(BlockPool::new(3, 2));
        let mut holders = Vec::new();
        let mut keys = Vec::new();
        for f in 0..3u32 {
            let mut k = Vec::new();
            hash_blocks(b"", &[f, f], 2, &mut k);
            let mut s = Sequence::new(Arc::clone(&pool));
            s.try_append(2).unwrap();
            assert_eq!(s.publish(&k), 1);
            keys.push(k);
            holders.push(s);
        }
        // A matcher shares each: referenced twice.
        let sharers: Vec<Sequence> = keys
            .iter()
            .map(|k| {
                let mut s = Sequence::new(Arc::clone(&pool));
                assert_eq!(s.try_match_prefix(k), 1);
                s
            })
            .collect();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        let mut out = Vec::new();
                        assert!(pool.try_alloc(1, &mut out).is_err());
                        assert!(out.is_empty());
                        let mut seq = Sequence::new(Arc::clone(&pool));
                        assert!(seq.try_append(1).is_err());
                        // Matches still share (no capacity needed).
                        let mut m = Sequence::new(Arc::clone(&pool));
                        assert_eq!(m.try_match_prefix(&keys[0]), 1);
                    }
                });
            }
            // Meanwhile one holder of each lets go and comes back: the
            // blocks stay referenced by the sharers throughout.
            for _ in 0..2_000 {
                for k in &keys {
                    let mut s = Sequence::new(Arc::clone(&pool));
                    assert_eq!(s.try_match_prefix(k), 1);
                }
            }
        });
        assert_eq!(pool.prefix_stats().evictions, 0);
        assert_eq!(pool.cached_blocks(), 3);
        drop(sharers);
        drop(holders);
        assert_eq!((pool.evictable_blocks(), pool.free_blocks()), (3, 3));
    });
}

/// Misuse: a repeated key in the list (not a hash chain). The match stops
/// at the first key equal to an earlier one: it takes the block once, and
/// the table cannot outgrow the pool.
#[test]
fn a_repeated_key_matches_up_to_its_first_repetition() {
    let pool = Arc::new(BlockPool::new(2, 4));
    let mut keys = Vec::new();
    hash_blocks(b"", &[1, 2, 3, 4, 5, 6, 7, 8], 4, &mut keys);
    let mut a = Sequence::new(Arc::clone(&pool));
    a.try_append(8).unwrap();
    assert_eq!(a.publish(&keys), 2);
    let (first, second) = (a.blocks()[0], a.blocks()[1]);
    let mut b = Sequence::new(Arc::clone(&pool));
    assert_eq!(b.try_match_prefix(&[keys[0]; 5]), 1);
    assert_eq!((b.len(), b.blocks()), (4, &[first][..]));
    assert_eq!(pool.ref_count(first), Some(2), "one reference per match");
    // A repetition later in the list: the blocks before it match.
    let mut c = Sequence::new(Arc::clone(&pool));
    assert_eq!(c.try_match_prefix(&[keys[0], keys[1], keys[0], keys[1]]), 2);
    assert_eq!(c.blocks(), &[first, second][..]);
    assert_eq!(pool.ref_count(first), Some(3));
    assert_eq!(pool.ref_count(second), Some(2));
    assert_eq!(pool.used_blocks(), 2);
    drop((a, b, c));
    assert_eq!((pool.used_blocks(), pool.evictable_blocks()), (0, 2));
    // Statistics count every key queried and each block taken.
    assert_eq!(pool.prefix_stats().queried_blocks, 9);
    assert_eq!(pool.prefix_stats().hit_blocks, 3);
}

/// A repeated key in a pool larger than the filters of taken ids (a match
/// screens its first 32 hits through a filter of 256 bits, then through
/// one of 131,072 bits in a pool of more than 32,768 blocks, and compares
/// a hit with the blocks taken only when its bit is set): two blocks whose
/// ids share a bit of both filters are both matched, and a real repetition
/// is still caught, among the first 32 hits and past them.
#[test]
fn a_repeated_key_is_caught_past_the_filter_of_taken_ids() {
    const BITS: u32 = 131_072;
    let pool = Arc::new(BlockPool::new(BITS as usize + 64, 1));
    let mut all = Vec::new();
    pool.try_alloc(pool.num_blocks(), &mut all).unwrap();
    let mut keys = Vec::new();
    hash_blocks(b"", &(0..34).collect::<Vec<u32>>(), 1, &mut keys);
    // Blocks 0..32 hold the first 32 keys; blocks 40 and 40 + BITS (one
    // filter bit) hold the last two.
    let ids: Vec<BlockId> = (0..32).chain([40, 40 + BITS]).map(BlockId::new).collect();
    let mut seqs = Vec::new();
    for (key, &id) in keys.iter().zip(&ids) {
        let mut s = Sequence::new(Arc::clone(&pool));
        // Free the block and have the sequence allocate it again.
        pool.free(&[id]).unwrap();
        s.try_append(1).unwrap();
        assert_eq!(s.blocks(), &[id][..]);
        assert_eq!(s.publish(std::slice::from_ref(key)), 1);
        seqs.push(s);
    }
    // Past the filter: the colliding pair both match, the repeat stops.
    let mut query = keys.clone();
    query.push(keys[32]);
    query.push(keys[0]);
    let mut m = Sequence::new(Arc::clone(&pool));
    assert_eq!(m.try_match_prefix(&query), 34);
    assert_eq!(m.blocks(), &ids[..]);
    let (low, high) = (ids[32], ids[33]);
    assert_eq!(pool.ref_count(high), Some(2));
    assert_eq!(
        pool.ref_count(low),
        Some(2),
        "the repeat's reference went back"
    );
    // Before the filter: a repeat among the first hits stops the match too.
    let mut n = Sequence::new(Arc::clone(&pool));
    assert_eq!(n.try_match_prefix(&[keys[32], keys[33], keys[33]]), 2);
    assert_eq!(n.blocks(), &[low, high][..]);
    assert_eq!(pool.ref_count(high), Some(3));
}

#[test]
#[ignore = "long: run with --ignored"]
fn forks_truncates_and_cow_heavy() {
    rounds(3, 1, 8, 200, 3_000);
    rounds(5, 3, 12, 200, 3_000);
    rounds(8, 2, 16, 100, 5_000);
}

/// The index does not leak entries: a long single-threaded churn of
/// unique keys through a small pool (every publish evicts) keeps every
/// fresh key publishable, late as early.
#[test]
fn index_entries_do_not_leak_under_churn() {
    let pool = Arc::new(BlockPool::new(16, 1));
    let mut refused = [0u32; 4];
    let quarter = 50_000u32;
    for i in 0..4 * quarter {
        let mut keys = Vec::new();
        hash_blocks(&i.to_le_bytes(), &[i, i + 1], 1, &mut keys);
        let mut s = Sequence::new(Arc::clone(&pool));
        assert_eq!(s.try_match_prefix(&keys), 0);
        s.try_append(2).unwrap();
        let n = s.publish(&keys);
        refused[(i / quarter) as usize] += 2 - n as u32;
        if i % 3 == 0 {
            // A truncate into the last block drops its key (sole holder).
            s.truncate(1);
            s.try_append(1).unwrap();
        }
    }
    eprintln!("refused publishes per quarter: {refused:?}");
    assert!(refused[3] <= refused[0] + 100, "refusals grow: {refused:?}");
    assert_eq!(pool.cached_blocks(), pool.evictable_blocks());
    let cached = pool.cached_blocks();
    assert_eq!(pool.reset_prefix_cache(), cached);
}

/// First wins, real threads: 8 threads publish one key on their own
/// blocks at once, while (in odd rounds) the key's previous block is
/// evictable and a ninth thread's allocation must evict it. Afterwards
/// exactly one block holds the key (at most one if the old holder was
/// still there and won), the winners' count agrees, and a match returns a
/// winner.
#[test]
fn many_publishers_of_one_key_against_its_eviction() {
    with_watchdog(Duration::from_secs(120), || {
        let key = [BlockHash([7; 32])];
        for round in 0..3_000u32 {
            let pool = Arc::new(BlockPool::new(9, 1));
            let old_holder = round % 2 == 1;
            if old_holder {
                let mut s = Sequence::new(Arc::clone(&pool));
                s.try_append(1).unwrap();
                assert_eq!(s.publish(&key), 1);
            }
            let mut seqs: Vec<Sequence> = (0..8)
                .map(|_| {
                    let mut s = Sequence::new(Arc::clone(&pool));
                    s.try_append(1).unwrap();
                    s
                })
                .collect();
            let barrier = &std::sync::Barrier::new(9);
            let (won, evicted) = std::thread::scope(|sc| {
                let hs: Vec<_> = seqs
                    .iter_mut()
                    .map(|s| {
                        sc.spawn(move || {
                            barrier.wait();
                            s.publish(&key)
                        })
                    })
                    .collect();
                let pool = &pool;
                let ev = sc.spawn(move || {
                    barrier.wait();
                    let mut e = Sequence::new(Arc::clone(pool));
                    // With the old holder, the pool's one spare block is
                    // the evictable one.
                    e.try_append(1).is_ok()
                });
                let won: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
                (won, ev.join().unwrap())
            });
            assert!(evicted || old_holder);
            let cached = pool.cached_blocks();
            assert!(won <= 1, "round {round}: {won} publishers won");
            assert_eq!(cached, won, "round {round}: {cached} cached, {won} won");
            let mut m = Sequence::new(Arc::clone(&pool));
            let k = m.try_match_prefix(&key);
            assert_eq!(k, won, "round {round}");
            if k == 1 {
                assert!(seqs.iter().any(|s| s.blocks() == m.blocks()));
            }
            if won == 0 {
                // Every publisher lost with no holder left: only the
                // eviction racing the old holder may explain it.
                assert!(old_holder, "round {round}: nobody won without a rival");
            }
        }
    });
}

/// Statistics read while matches run: a snapshot never shows more blocks
/// hit than queried (a match adds its queries before its hits, and a
/// snapshot reads the hits first).
#[test]
fn a_stats_snapshot_never_shows_more_hits_than_queries() {
    with_watchdog(Duration::from_secs(120), || {
        let pool = Arc::new(BlockPool::new(8, 1));
        let mut keys = Vec::new();
        hash_blocks(b"", &[1, 2, 3, 4], 1, &mut keys);
        let mut holder = Sequence::new(Arc::clone(&pool));
        holder.try_append(4).unwrap();
        assert_eq!(holder.publish(&keys), 4);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let bad = std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    // Relaxed: a stop flag.
                    while !stop.load(Ordering::Relaxed) {
                        let mut m = Sequence::new(Arc::clone(&pool));
                        assert_eq!(m.try_match_prefix(&keys), 4);
                    }
                });
            }
            let mut bad = None;
            for i in 0..5_000_000u32 {
                let st = pool.prefix_stats();
                if st.hit_blocks > st.queried_blocks {
                    bad = Some((i, st));
                    break;
                }
            }
            stop.store(true, Ordering::Relaxed);
            bad
        });
        assert_eq!(bad, None, "a snapshot with more hits than queries");
    });
}
