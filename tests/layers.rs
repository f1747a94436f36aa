//! The pool's layers: what the builder builds, what the prefix cache's
//! calls do on a pool built without one (documented no-ops that change
//! nothing), and that everything else behaves the same on a core pool as
//! on a pool with every layer.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{assert_pool_whole, pool_snap, seq_snap, XorShift};
use kvslots::{hash_blocks, BlockPool, ConfigError, PrefixStats, ReserveError, Sequence};

fn core_pool(num_blocks: usize, block_size: usize) -> Arc<BlockPool> {
    Arc::new(BlockPool::builder(num_blocks, block_size).build().unwrap())
}

#[test]
fn the_builder_starts_from_the_core_pool_and_new_has_every_layer() {
    let core = BlockPool::builder(512, 16).build().unwrap();
    assert!(!core.has_prefix_cache());
    assert_eq!(core.shards(), BlockPool::default_shards(512));
    let cached = BlockPool::builder(512, 16)
        .shards(3)
        .prefix_cache(true)
        .build()
        .unwrap();
    assert!(cached.has_prefix_cache());
    assert_eq!(cached.shards(), 3);
    // The last word wins.
    let off = BlockPool::builder(8, 16)
        .prefix_cache(true)
        .prefix_cache(false);
    assert!(!off.build().unwrap().has_prefix_cache());
    assert!(BlockPool::new(8, 16).has_prefix_cache());
    assert!(BlockPool::with_shards(8, 16, 2).has_prefix_cache());
    assert!(format!("{core:?}").contains("prefix_cache: false"));
}

#[test]
fn a_bad_configuration_is_a_typed_error_in_the_order_of_the_checks() {
    let max = BlockPool::MAX_BLOCKS;
    let cases = [
        (BlockPool::builder(8, 0), ConfigError::ZeroBlockSize),
        // Zero block size is checked first, whatever else is wrong.
        (
            BlockPool::builder(max + 1, 0).shards(0),
            ConfigError::ZeroBlockSize,
        ),
        (
            BlockPool::builder(max + 1, 1).shards(0),
            ConfigError::TooManyBlocks {
                num_blocks: max + 1,
                max,
            },
        ),
        (
            BlockPool::builder(3, usize::MAX / 2).shards(0),
            ConfigError::SlotCountOverflow {
                num_blocks: 3,
                block_size: usize::MAX / 2,
            },
        ),
        (
            BlockPool::builder(8, 16).shards(0),
            ConfigError::BadShardCount {
                shards: 0,
                max: BlockPool::MAX_SHARDS,
            },
        ),
        (
            BlockPool::builder(8, 16)
                .shards(BlockPool::MAX_SHARDS + 1)
                .prefix_cache(true),
            ConfigError::BadShardCount {
                shards: BlockPool::MAX_SHARDS + 1,
                max: BlockPool::MAX_SHARDS,
            },
        ),
        // KV events need the prefix cache, and room for a record.
        (
            BlockPool::builder(8, 16).kv_events(64),
            ConfigError::KvEventsWithoutPrefixCache,
        ),
        (
            BlockPool::builder(8, 16).prefix_cache(true).kv_events(0),
            ConfigError::ZeroEventCapacity,
        ),
        (
            BlockPool::builder(8, 16)
                .shards(0)
                .prefix_cache(true)
                .kv_events(0),
            ConfigError::BadShardCount {
                shards: 0,
                max: BlockPool::MAX_SHARDS,
            },
        ),
    ];
    for (builder, want) in cases {
        assert_eq!(builder.clone().build().unwrap_err(), want, "{builder:?}");
    }
    // `new` and `with_shards` panic with the error's message.
    let panic = std::panic::catch_unwind(|| BlockPool::with_shards(8, 16, 0)).unwrap_err();
    let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert_eq!(
        msg,
        ConfigError::BadShardCount {
            shards: 0,
            max: 1024
        }
        .to_string()
    );
}

/// Without a prefix cache: `publish` caches nothing, a match misses, the
/// counts and statistics are zero and a reset drops nothing; none of them
/// changes the pool or the sequence.
#[test]
fn the_prefix_calls_are_no_ops_on_a_core_pool() {
    let pool = core_pool(8, 4);
    let mut keys = Vec::new();
    hash_blocks(b"", &(0..16).collect::<Vec<u32>>(), 4, &mut keys);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(10).unwrap();
    let (pool_before, seq_before) = (pool_snap(&pool), seq_snap(&seq));
    assert_eq!(seq.publish(&keys), 0);
    assert_eq!(
        (pool_snap(&pool), seq_snap(&seq)),
        (pool_before.clone(), seq_before)
    );
    drop(seq);
    let pool_before = pool_snap(&pool);
    let mut matcher = Sequence::new(Arc::clone(&pool));
    assert_eq!(matcher.try_match_prefix(&keys), 0);
    assert_eq!((matcher.len(), matcher.blocks().len()), (0, 0));
    assert_eq!(pool.cached_blocks(), 0);
    assert_eq!(pool.evictable_blocks(), 0);
    assert_eq!(pool.reset_prefix_cache(), 0);
    assert_eq!(pool.prefix_stats(), PrefixStats::default());
    assert_eq!(pool_snap(&pool), pool_before);
    // The sequence is usable as any empty one.
    assert_eq!(matcher.try_append(5).unwrap(), 0..5);
    drop(matcher);
    assert_pool_whole(&pool);
}

/// What one step of the script returned, with the pool's counts after it.
type Outcome = (String, usize, usize);

/// A random script of every sequence operation but the prefix cache's
/// (appends, copy-on-write, reservations, truncates, fenced truncates and
/// retirements, forks, raw allocations and frees, waits) on one pool;
/// returns what each step returned. Block ids are left out: the same
/// operations take the same ids from both pools, but the test only needs
/// the outcomes.
fn script(pool: &Arc<BlockPool>, seed: u64) -> Vec<Outcome> {
    let mut rng = XorShift::new(seed);
    let mut seqs: Vec<Sequence> = Vec::new();
    let mut raw = Vec::new();
    let mut out = Vec::new();
    let mut fence = 0;
    for _ in 0..400 {
        let r = match rng.below(9) {
            0 => {
                seqs.push(Sequence::new(Arc::clone(pool)));
                "new".to_string()
            }
            1 | 2 if !seqs.is_empty() => {
                let i = rng.below(seqs.len());
                let n = rng.below(12);
                format!(
                    "{:?}",
                    seqs[i]
                        .try_append_cow(n)
                        .map(|(r, c)| (r, c.map(|c| c.tokens)))
                )
            }
            3 if !seqs.is_empty() => {
                let i = rng.below(seqs.len());
                let len = rng.below(seqs[i].len() + 1);
                format!("{}", seqs[i].truncate(len))
            }
            4 if !seqs.is_empty() => {
                let i = rng.below(seqs.len());
                let len = rng.below(seqs[i].len() + 1);
                fence += 1;
                format!("{}", seqs[i].truncate_fenced(len, fence % 3))
            }
            5 if !seqs.is_empty() => {
                let i = rng.below(seqs.len());
                match seqs[i].try_fork() {
                    Ok((child, copy)) => {
                        seqs.push(child);
                        format!("fork {:?}", copy.map(|c| c.tokens))
                    }
                    Err(e) => format!("{e:?}"),
                }
            }
            6 if !seqs.is_empty() => {
                let i = rng.below(seqs.len());
                let seq = seqs.swap_remove(i);
                if rng.below(2) == 0 {
                    format!("retire {}", seq.retire(fence % 3))
                } else {
                    drop(seq);
                    "drop".to_string()
                }
            }
            7 => {
                let n = rng.below(4);
                if raw.is_empty() {
                    format!("{:?}", pool.try_alloc(n, &mut raw))
                } else {
                    format!("{:?}", pool.free(&std::mem::take(&mut raw)))
                }
            }
            8 if !seqs.is_empty() => {
                let i = rng.below(seqs.len());
                let (tokens, headroom) = (rng.below(20), rng.below(3));
                let timeout = Some(Duration::ZERO);
                format!("{:?}", seqs[i].reserve_blocking(tokens, headroom, timeout))
            }
            _ => format!("complete {}", pool.complete(rng.below(3) as u64)),
        };
        out.push((r, pool.used_blocks(), pool.pending_release_blocks()));
    }
    drop(seqs);
    pool.free(&raw).unwrap();
    pool.complete_all();
    out
}

#[test]
fn a_core_pool_behaves_as_a_full_one_without_the_prefix_cache() {
    let mut all = Vec::new();
    for seed in 1..=20 {
        let core = core_pool(12, 4);
        let full = Arc::new(BlockPool::new(12, 4));
        let outcomes = script(&core, seed);
        assert_eq!(outcomes, script(&full, seed), "seed {seed}");
        assert_pool_whole(&core);
        assert_pool_whole(&full);
        all.extend(outcomes.into_iter().map(|(r, ..)| r));
    }
    // The scripts reached the cases that matter: refusals, copies on
    // write, forks with a copied tail, fenced give-backs and their
    // completion.
    let seen = |what: &str| all.iter().filter(|r| r.contains(what)).count();
    for what in ["Full", "Some(", "fork Some", "retire ", "complete "] {
        assert!(seen(what) > 5, "only {} outcomes with {what:?}", seen(what));
    }
    assert!(all
        .iter()
        .any(|r| r.starts_with("complete ") && r != "complete 0"));
}

/// An allocation from a core pool never finds an evictable block to take:
/// a short free list is only ever blocks in transit, and a refusal is
/// `Full` with the exact count.
#[test]
fn a_core_pool_refuses_with_its_free_count() {
    let pool = core_pool(4, 16);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(32).unwrap();
    let mut other = Sequence::new(Arc::clone(&pool));
    other.try_append(16).unwrap();
    assert_eq!(
        seq.try_append(32),
        Err(ReserveError::Full {
            requested: 2,
            available: 1
        })
    );
    drop((seq, other));
    assert_pool_whole(&pool);
}
