//! KV events (`BlockPoolBuilder::kv_events`, `BlockPool::drain_events`):
//! the events of single-threaded scripts, exactly; pools without events;
//! and real threads publishing, matching, evicting, truncating and
//! resetting while a consumer drains, checked against the pool's final
//! state (every stored key followed by its removal in order, nothing
//! reported twice, the replayed view equal to the keys the pool caches),
//! with a ring that never fills and with one that overflows (the losses
//! counted, and the view rebuilt after the last `Dropped` never holding a
//! key the pool has removed).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};

use common::{events_pool, families, StopOnDrop, XorShift};
use kvslots::{
    hash_blocks, BlockHash, BlockId, BlockPool, HybridSequence, KvEvent, KvGroup, KvGroups,
    Sequence,
};

fn keys_of(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    let mut keys = Vec::new();
    hash_blocks(b"", tokens, block_size, &mut keys);
    keys
}

fn drained(pool: &BlockPool) -> Vec<KvEvent> {
    let mut out = Vec::new();
    pool.drain_events(&mut out);
    out
}

fn stored(keys: &[BlockHash], parent: Option<BlockHash>, ids: &[BlockId], bs: usize) -> KvEvent {
    stored_in(None, keys, parent, ids, bs)
}

/// A store of a hybrid sequence's group `group` (`None`: a `Sequence`'s).
fn stored_in(
    group: Option<usize>,
    keys: &[BlockHash],
    parent: Option<BlockHash>,
    ids: &[BlockId],
    bs: usize,
) -> KvEvent {
    KvEvent::BlockStored {
        keys: keys.to_vec(),
        parent,
        block_ids: ids.to_vec(),
        block_size: bs,
        token_count: keys.len() * bs,
        group,
    }
}

#[test]
fn a_script_reports_each_store_and_removal_exactly() {
    // One shard: one ring, so the order across keys is the script's.
    let pool = events_pool(4, 2, 1, 64);
    let keys = keys_of(&[1, 2, 3, 4, 5, 6], 2);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(6).unwrap();
    let blocks = seq.blocks().to_vec();
    // Two blocks first, then the third: its parent is the second's key.
    assert_eq!(seq.publish(&keys[..2]), 2);
    assert_eq!(seq.publish(&keys), 1);
    assert_eq!(
        drained(&pool),
        [
            KvEvent::AllBlocksCleared,
            stored(&keys[..3], None, &blocks[..3], 2),
        ]
    );
    // A repeated publish and a losing one report nothing.
    assert_eq!(seq.publish(&keys), 0);
    let mut rival = Sequence::new(Arc::clone(&pool));
    rival.try_append(2).unwrap();
    assert_eq!(rival.publish(&keys[..1]), 0);
    // A truncate into the third block, which the sequence holds alone,
    // drops its key.
    seq.truncate(5);
    let mut out = Vec::new();
    assert_eq!(pool.drain_events(&mut out), 1);
    assert_eq!(
        out,
        [KvEvent::BlockRemoved {
            keys: vec![keys[2]],
            group: None
        }]
    );
    // Released, the first two stay cached; an allocation of the two left
    // free (the rival's, once dropped, and the fourth) evicts nothing,
    // the third evicts the least recently released: the sequence's last
    // block goes first.
    drop(rival);
    drop(seq);
    let mut ids = Vec::new();
    pool.try_alloc(2, &mut ids).unwrap();
    assert!(drained(&pool).is_empty());
    pool.try_alloc(1, &mut ids).unwrap();
    assert_eq!(
        drained(&pool),
        [KvEvent::BlockRemoved {
            keys: vec![keys[1]],
            group: None
        }]
    );
    // The reset drops the last key; nothing is left to report.
    pool.free(&ids).unwrap();
    assert_eq!(pool.reset_prefix_cache(), 1);
    let mut out = Vec::new();
    assert_eq!(pool.drain_events(&mut out), 3);
    assert_eq!(
        out,
        [KvEvent::BlockRemoved {
            keys: vec![keys[0]],
            group: None
        }]
    );
    assert_eq!(pool.drain_events(&mut out), 4);
    assert_eq!(out.len(), 1);
    assert_eq!(pool.stats().events_dropped, Some(0));
}

/// A drain appends its batch to what `out` holds: a store that continues
/// the chain of `out`'s last event, stored since the drain that reported
/// it, is a new event of its own, and the events already there are left
/// as they were.
#[test]
fn a_drain_appends_its_batch_and_joins_nothing_already_in_out() {
    let pool = events_pool(4, 2, 1, 64);
    let keys = keys_of(&[1, 2, 3, 4], 2);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(4).unwrap();
    let blocks = seq.blocks().to_vec();
    assert_eq!(seq.publish(&keys[..1]), 1);
    let mut out = Vec::new();
    assert_eq!(pool.drain_events(&mut out), 0);
    let first = [
        KvEvent::AllBlocksCleared,
        stored(&keys[..1], None, &blocks[..1], 2),
    ];
    assert_eq!(out, first);
    // The second block's key, its parent the first's.
    assert_eq!(seq.publish(&keys), 1);
    assert_eq!(pool.drain_events(&mut out), 1);
    assert_eq!(out[..2], first);
    assert_eq!(
        out[2..],
        [stored(&keys[1..], Some(keys[0]), &blocks[1..], 2)]
    );
}

/// A hybrid sequence's publish reports the keys the index stores, each
/// group's own (`GroupKeys`), never the content keys: a chain per group,
/// a sliding group's starting after the blocks its window gave back with
/// the group's key of the block before as its parent. Its eviction
/// removes the same group keys.
#[test]
fn a_hybrid_publish_reports_a_chain_per_group_under_the_group_keys() {
    let pool = events_pool(16, 4, 1, 64);
    let groups =
        KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 4 }]).unwrap();
    let content = keys_of(&(0..20).collect::<Vec<u32>>(), 4);
    let keys = groups.keys(&content);
    let (full, sliding) = (keys.group(0).unwrap(), keys.group(1).unwrap());
    let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    // Three blocks a group, unpublished; then token 12's window (9..=12)
    // leaves the sliding group's blocks 0 and 1 behind.
    seq.try_append(12).unwrap();
    seq.try_append(4).unwrap();
    assert_eq!(seq.null_blocks(1), Some(2));
    assert_eq!(seq.publish(&keys), Ok(4 + 2));
    let (ids0, ids1) = (seq.blocks(0).unwrap(), seq.blocks(1).unwrap());
    assert_eq!(
        drained(&pool),
        [
            KvEvent::AllBlocksCleared,
            stored_in(Some(0), &full[..4], None, ids0, 4),
            // The parent is the group's key of block 1, given back.
            stored_in(Some(1), &sliding[2..4], Some(sliding[1]), &ids1[2..4], 4),
        ]
    );
    // A match reports nothing; an eviction removes the group keys.
    let mut again = HybridSequence::new(Arc::clone(&pool), seq.groups().clone());
    assert_eq!(again.try_match_prefix(&keys), Ok(4));
    drop((seq, again));
    assert_eq!(drained(&pool), []);
    let mut all = Vec::new();
    pool.try_alloc(16, &mut all).unwrap();
    // Each removal names the group of the keys it removes.
    let mut removed: Vec<(Option<usize>, BlockHash)> = drained(&pool)
        .into_iter()
        .flat_map(|e| match e {
            KvEvent::BlockRemoved { keys, group } => keys.into_iter().map(move |k| (group, k)),
            other => panic!("{other:?}"),
        })
        .collect();
    let mut cached: Vec<(Option<usize>, BlockHash)> = full[..4]
        .iter()
        .map(|k| (Some(0), *k))
        .chain(sliding[2..4].iter().map(|k| (Some(1), *k)))
        .collect();
    removed.sort_unstable();
    cached.sort_unstable();
    assert_eq!(removed, cached);
    assert!(removed.iter().all(|(_, k)| !content.contains(k)));
    pool.free(&all).unwrap();
}

#[test]
fn a_block_reused_by_another_group_or_a_plain_sequence_reports_its_new_group() {
    // One block of 4 tokens: each publish below reuses it. First group 0
    // of a one-group model, then a plain sequence, which a truncate into
    // the block makes drop its key: each removal names the group of the
    // publish that stored its key, never an earlier one's.
    let pool = events_pool(1, 4, 1, 64);
    let content = keys_of(&[1, 2, 3, 4], 4);
    let one = KvGroups::new([KvGroup::Full]).unwrap();
    let one_keys = one.keys(&content);
    let key0 = one_keys.group(0).unwrap()[0];
    drained(&pool);
    let mut hybrid = HybridSequence::new(Arc::clone(&pool), one);
    hybrid.try_append(4).unwrap();
    assert_eq!(hybrid.publish(&one_keys), Ok(1));
    let id = hybrid.blocks(0).unwrap()[0];
    drop(hybrid);
    let mut plain = Sequence::new(Arc::clone(&pool));
    plain.try_append(4).unwrap(); // evicts key0
    assert_eq!(plain.blocks(), [id]);
    assert_eq!(plain.publish(&content), 1);
    plain.truncate(3);
    assert_eq!(
        drained(&pool),
        [
            stored_in(Some(0), &[key0], None, &[id], 4),
            KvEvent::BlockRemoved {
                keys: vec![key0],
                group: Some(0)
            },
            stored(&content, None, &[id], 4),
            KvEvent::BlockRemoved {
                keys: content.clone(),
                group: None
            },
        ]
    );
    drop(plain);

    // Two blocks: a two-group model caches one a group; a plain sequence
    // then takes both (evicting both keys) and publishes on one, which a
    // reset removes. Every key's events name its own group.
    let pool = events_pool(2, 4, 1, 64);
    let two = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    let keys = two.keys(&content);
    drained(&pool);
    let mut hybrid = HybridSequence::new(Arc::clone(&pool), two);
    hybrid.try_append(4).unwrap();
    assert_eq!(hybrid.publish(&keys), Ok(2));
    drop(hybrid);
    let mut plain = Sequence::new(Arc::clone(&pool));
    plain.try_append(8).unwrap();
    assert_eq!(plain.publish(&content), 1);
    drop(plain);
    assert_eq!(pool.reset_prefix_cache(), 1);
    let log = drained(&pool);
    let groups_of = |wanted: &BlockHash| -> Vec<Option<usize>> {
        log.iter()
            .filter_map(|e| match e {
                KvEvent::BlockStored { keys, group, .. }
                | KvEvent::BlockRemoved { keys, group } => keys.contains(wanted).then_some(*group),
                _ => None,
            })
            .collect()
    };
    let (k0, k1) = (keys.group(0).unwrap()[0], keys.group(1).unwrap()[0]);
    assert_eq!(groups_of(&k0), [Some(0), Some(0)], "{log:?}");
    assert_eq!(groups_of(&k1), [Some(1), Some(1)], "{log:?}");
    assert_eq!(groups_of(&content[0]), [None, None], "{log:?}");
}

#[test]
fn a_pool_without_events_reports_nothing() {
    let keys = keys_of(&[1, 2, 3, 4], 2);
    for pool in [
        Arc::new(BlockPool::new(4, 2)),
        Arc::new(BlockPool::builder(4, 2).build().unwrap()),
    ] {
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(4).unwrap();
        seq.publish(&keys);
        drop(seq);
        let mut out = vec![KvEvent::AllBlocksCleared];
        assert_eq!(pool.drain_events(&mut out), 0);
        assert_eq!(out, [KvEvent::AllBlocksCleared], "appended to");
        assert!(!pool.has_kv_events());
        assert_eq!(pool.stats().events_dropped, None);
    }
}

#[test]
fn a_full_ring_loses_events_and_says_how_many_where() {
    // One ring of 2 records: the third store and everything after it is
    // lost until a drain makes room.
    let pool = events_pool(8, 2, 1, 2);
    assert_eq!(drained(&pool), [KvEvent::AllBlocksCleared]);
    let keys = keys_of(&(1..=10).collect::<Vec<u32>>(), 2);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(10).unwrap();
    assert_eq!(seq.publish(&keys), 5);
    assert_eq!(pool.stats().events_dropped, Some(3));
    let blocks = seq.blocks().to_vec();
    assert_eq!(
        drained(&pool),
        [
            stored(&keys[..2], None, &blocks[..2], 2),
            KvEvent::Dropped { count: 3 },
        ]
    );
    // Room again: the removal of the last key, by a truncate into its
    // block, is reported.
    seq.truncate(9);
    assert_eq!(
        drained(&pool),
        [KvEvent::BlockRemoved {
            keys: vec![keys[4]],
            group: None
        }]
    );
    assert_eq!(pool.stats().events_dropped, Some(3));
}

/// The per-key checks of a history: each key's events alternate, a store
/// first; returns each key's block after the history (`None`: not stored)
/// and the stores and removals counted.
fn replay(log: &[KvEvent]) -> (HashMap<BlockHash, Option<BlockId>>, usize, usize) {
    assert_eq!(log.first(), Some(&KvEvent::AllBlocksCleared));
    let mut view: HashMap<BlockHash, Option<BlockId>> = HashMap::new();
    let (mut stores, mut removals) = (0, 0);
    for event in &log[1..] {
        match event {
            KvEvent::BlockStored {
                keys,
                block_ids,
                block_size,
                token_count,
                ..
            } => {
                assert_eq!(keys.len(), block_ids.len());
                assert_eq!(*token_count, keys.len() * block_size);
                for (k, id) in keys.iter().zip(block_ids) {
                    let before = view.insert(*k, Some(*id)).flatten();
                    assert!(
                        before.is_none(),
                        "{k:?} stored twice (on {before:?} and {id})"
                    );
                    stores += 1;
                }
            }
            KvEvent::BlockRemoved { keys, .. } => {
                for k in keys {
                    let before = view.insert(*k, None).flatten();
                    assert!(before.is_some(), "{k:?} removed while not stored");
                    removals += 1;
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    (view, stores, removals)
}

/// The block holding `key` now, if any (a match, let go at once).
fn holder_now(pool: &Arc<BlockPool>, key: BlockHash) -> Option<BlockId> {
    let mut probe = Sequence::new(Arc::clone(pool));
    probe.try_match_prefix(&[key]);
    probe.blocks().first().copied()
}

/// The prompts' keys, each once (prompts share their first blocks).
fn distinct_keys(prompts: &[Vec<BlockHash>]) -> Vec<BlockHash> {
    let mut keys: Vec<BlockHash> = prompts.iter().flatten().copied().collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// One worker's rounds on `pool`: match a prompt, append the rest, publish,
/// now and then truncate into a cached block or reset the cache, and keep
/// up to two sequences alive so that allocations evict. Returns how many
/// keys its publishes cached.
fn work(pool: &Arc<BlockPool>, prompts: &[Vec<BlockHash>], seed: u64, rounds: usize) -> usize {
    let mut rng = XorShift::new(seed);
    let mut held: Vec<Sequence> = Vec::new();
    let mut cached = 0;
    for _ in 0..rounds {
        let keys = &prompts[rng.below(prompts.len())];
        let mut seq = Sequence::new(Arc::clone(pool));
        let k = seq.try_match_prefix(keys);
        if seq.try_append(8 - 2 * k).is_err() {
            continue;
        }
        cached += seq.publish(keys);
        match rng.below(8) {
            // Into the last block: its key goes if the sequence holds it
            // alone.
            0 | 1 => {
                seq.truncate(7);
            }
            2 => {
                pool.reset_prefix_cache();
            }
            _ => {}
        }
        held.push(seq);
        if held.len() > 2 {
            held.remove(rng.below(held.len()));
        }
    }
    cached
}

#[test]
fn threads_and_a_draining_consumer_agree_with_the_pool() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 3_000;
    // 24 blocks over 4 shards (4 rings): about 3 prompts fit.
    let pool = events_pool(24, 2, 4, 1 << 16);
    let prompts = families(16);
    let stop = AtomicBool::new(false);
    let log = Mutex::new(Vec::new());
    let batches = AtomicUsize::new(0);
    let cached: usize = std::thread::scope(|s| {
        let consumer = s.spawn(|| {
            let mut out = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let before = out.len();
                let batch = pool.drain_events(&mut out);
                // Non-empty batches are numbered 0, 1, 2, ...
                assert_eq!(batch as usize, batches.load(Ordering::Relaxed));
                if out.len() > before {
                    batches.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::yield_now();
            }
            log.lock().unwrap().extend(out);
        });
        let _stop = StopOnDrop(&stop);
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (pool, prompts) = (&pool, &prompts);
                s.spawn(move || work(pool, prompts, t as u64, ROUNDS))
            })
            .collect();
        let cached = workers.into_iter().map(|w| w.join().unwrap()).sum();
        stop.store(true, Ordering::Release);
        consumer.join().unwrap();
        cached
    });
    let mut log = log.into_inner().unwrap();
    let last = pool.drain_events(&mut log);
    assert!(last as usize >= batches.load(Ordering::Relaxed));
    assert!(
        !log.iter().any(|e| matches!(e, KvEvent::Dropped { .. })),
        "a ring of 65,536 records overflowed"
    );
    let (view, stores, removals) = replay(&log);
    // Every key a publish cached was reported stored once, and every key
    // that is not cached now was reported removed once after its store.
    assert_eq!(stores, cached);
    let mut cached_now = 0;
    for key in distinct_keys(&prompts) {
        let now = holder_now(&pool, key);
        assert_eq!(now, view.get(&key).copied().flatten(), "{key:?}");
        cached_now += usize::from(now.is_some());
    }
    assert_eq!(removals, stores - cached_now);
    assert!(
        removals > 0 && stores > removals,
        "{stores} stores, {removals} removals"
    );
    assert_eq!(pool.stats().events_dropped, Some(0));
}

#[test]
fn an_overflowing_ring_counts_its_losses_and_the_view_rebuilt_after_them_is_safe() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 1_000;
    // 16 records over 4 rings: a phase without a drain overflows them.
    let pool = events_pool(24, 2, 4, 16);
    let prompts = families(16);
    let stop = AtomicBool::new(false);
    let start = Barrier::new(THREADS + 1);
    let mut log = Vec::new();
    let cached: usize = std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (pool, prompts, start) = (&pool, &prompts, &start);
                s.spawn(move || {
                    // A first phase with no consumer, then one with.
                    let first = work(pool, prompts, 100 + t as u64, ROUNDS);
                    start.wait();
                    first + work(pool, prompts, 200 + t as u64, ROUNDS)
                })
            })
            .collect();
        start.wait();
        let consumer = s.spawn(|| {
            let mut out = Vec::new();
            while !stop.load(Ordering::Acquire) {
                pool.drain_events(&mut out);
                std::thread::yield_now();
            }
            out
        });
        let cached = workers.into_iter().map(|w| w.join().unwrap()).sum();
        stop.store(true, Ordering::Release);
        log = consumer.join().unwrap();
        cached
    });
    pool.drain_events(&mut log);
    let dropped: u64 = log
        .iter()
        .map(|e| match e {
            KvEvent::Dropped { count } => *count,
            _ => 0,
        })
        .sum();
    assert_eq!(pool.stats().events_dropped, Some(dropped));
    assert!(dropped > 0, "16 records held a phase of 4,000 rounds");
    // Reported and lost events together are every transition: each store,
    // and a removal of each key not cached now.
    let cached_now = distinct_keys(&prompts)
        .into_iter()
        .filter(|k| holder_now(&pool, *k).is_some())
        .count();
    let reported = log
        .iter()
        .map(|e| match e {
            KvEvent::BlockStored { keys, .. } | KvEvent::BlockRemoved { keys, .. } => {
                keys.len() as u64
            }
            _ => 0,
        })
        .sum::<u64>();
    assert_eq!(reported + dropped, (2 * cached - cached_now) as u64);
    // The resync: from the last `Dropped` on, the replayed view holds no
    // key that the pool does not cache (on the block it names).
    let last = log
        .iter()
        .rposition(|e| matches!(e, KvEvent::Dropped { .. }))
        .unwrap();
    let mut view: HashMap<BlockHash, Option<BlockId>> = HashMap::new();
    for event in &log[last + 1..] {
        match event {
            KvEvent::BlockStored {
                keys, block_ids, ..
            } => view.extend(keys.iter().zip(block_ids).map(|(k, id)| (*k, Some(*id)))),
            KvEvent::BlockRemoved { keys, .. } => view.extend(keys.iter().map(|k| (*k, None))),
            _ => {}
        }
    }
    for (key, id) in view {
        if id.is_some() {
            assert_eq!(holder_now(&pool, key), id, "{key:?}");
        }
    }
}

/// One worker's rounds of hybrid sequences (and, one round in four, plain
/// ones) on `pool`: match, append the rest of the 8-token prompt, publish,
/// now and then truncate or reset, keeping up to two alive.
fn hybrid_work(pool: &Arc<BlockPool>, groups: &KvGroups, prompts: &[Vec<BlockHash>], seed: u64) {
    let mut rng = XorShift::new(seed);
    // Sequences of either kind kept alive (their blocks held) for a while.
    let mut held: Vec<Box<dyn std::any::Any>> = Vec::new();
    for _ in 0..2_000 {
        let content = &prompts[rng.below(prompts.len())];
        let seq: Box<dyn std::any::Any> = if rng.below(4) == 0 {
            let mut seq = Sequence::new(Arc::clone(pool));
            seq.try_match_prefix(content);
            if seq.try_append(8 - seq.len()).is_err() {
                continue;
            }
            seq.publish(content);
            if rng.below(4) == 0 {
                seq.truncate(7);
            }
            Box::new(seq)
        } else {
            let keys = groups.keys(content);
            let mut seq = HybridSequence::new(Arc::clone(pool), groups.clone());
            seq.try_match_prefix(&keys).unwrap();
            if seq.try_append(8 - seq.len()).is_err() {
                continue;
            }
            seq.publish(&keys).unwrap();
            if rng.below(4) == 0 {
                seq.truncate(7).unwrap();
            }
            Box::new(seq)
        };
        if rng.below(16) == 0 {
            pool.reset_prefix_cache();
        }
        held.push(seq);
        if held.len() > 2 {
            held.remove(rng.below(held.len()));
        }
    }
}

#[test]
fn hybrid_threads_report_each_key_under_its_group() {
    const THREADS: usize = 3;
    // 40 blocks of 2 tokens over 2 shards: a hybrid prompt takes up to 9
    // (4 + 1 + 4), so blocks pass between groups and plain sequences.
    let pool = events_pool(40, 2, 2, 1 << 16);
    let groups = KvGroups::new([
        KvGroup::Full,
        KvGroup::SlidingWindow { window_tokens: 2 },
        KvGroup::Full,
    ])
    .unwrap();
    let prompts = families(8);
    // Each key's group: the content keys are the plain sequences'.
    let mut group_of: HashMap<BlockHash, Option<usize>> = HashMap::new();
    for content in &prompts {
        let keys = groups.keys(content);
        for g in 0..groups.len() {
            group_of.extend(keys.group(g).unwrap().iter().map(|k| (*k, Some(g))));
        }
        group_of.extend(content.iter().map(|k| (*k, None)));
    }
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (pool, groups, prompts) = (&pool, &groups, &prompts);
            s.spawn(move || hybrid_work(pool, groups, prompts, 7 + t as u64));
        }
    });
    let log = drained(&pool);
    assert!(
        !log.iter().any(|e| matches!(e, KvEvent::Dropped { .. })),
        "a ring of 65,536 records overflowed"
    );
    let mut seen = [0usize; 4];
    for event in &log {
        if let KvEvent::BlockStored { keys, group, .. } | KvEvent::BlockRemoved { keys, group } =
            event
        {
            for k in keys {
                assert_eq!(group_of[k], *group, "{k:?} in {event:?}");
            }
            seen[group.map_or(3, |g| g)] += keys.len();
        }
    }
    assert!(seen.iter().all(|&n| n > 0), "events by group: {seen:?}");
    let (view, stores, removals) = replay(&log);
    assert!(removals > 0 && stores > removals);
    for (key, id) in view {
        assert_eq!(holder_now(&pool, key), id, "{key:?}");
    }
}

/// Sliding-window requests (a one-token window) that each hold and publish
/// only their last block, run from the end of the prompt backwards: each
/// ring holds its part of the chain child first. The drained batch gives
/// every store after its parent's, one chain, whatever the shards.
#[test]
fn a_chain_published_child_first_drains_parent_first() {
    for shards in [1, 4] {
        let n = 256;
        let pool = Arc::new(
            BlockPool::builder(4 * n, 1)
                .shards(shards)
                .prefix_cache(true)
                .kv_events(2 * n * shards)
                .build()
                .unwrap(),
        );
        let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 1 }]).unwrap();
        let tokens: Vec<u32> = (0..n as u32).collect();
        let keys = groups.keys(&keys_of(&tokens, 1));
        drained(&pool);
        for j in (0..n).rev() {
            let mut seq = HybridSequence::new(Arc::clone(&pool), groups.clone());
            for _ in 0..=j {
                seq.try_append(1).unwrap();
            }
            assert_eq!(seq.publish(&keys).unwrap(), 1);
        }
        let events = drained(&pool);
        let [KvEvent::BlockStored {
            keys: stored,
            parent,
            ..
        }] = &events[..]
        else {
            panic!("shards {shards}: one chain, not {events:?}");
        };
        assert_eq!(*parent, None, "shards {shards}");
        assert_eq!(Some(stored.as_slice()), keys.group(0), "shards {shards}");
    }
}

/// A key whose four words fold to the same 64-bit value as `key`'s (bit 0
/// of word 2 and bit 17 of word 3 flipped): the merge once looked keys up
/// by that fold, and must tell the two apart.
fn same_fold(key: &BlockHash) -> BlockHash {
    let mut other = *key;
    other.0[16] ^= 1;
    let word = u64::from_le_bytes(other.0[24..32].try_into().unwrap()) ^ (1 << 17);
    other.0[24..32].copy_from_slice(&word.to_le_bytes());
    other
}

/// A parent's store recorded after its child's is moved ahead of it, even
/// when an unrelated key that folds to the parent's hash lies between them
/// in the ring.
#[test]
fn a_key_that_folds_as_the_parent_does_not_hide_it() {
    let pool = Arc::new(
        BlockPool::builder(8, 1)
            .shards(1)
            .prefix_cache(true)
            .kv_events(64)
            .build()
            .unwrap(),
    );
    let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 1 }]).unwrap();
    let keys = groups.keys(&keys_of(&[10, 11], 1));
    let (parent, child) = (keys.group(0).unwrap()[0], keys.group(0).unwrap()[1]);
    let other = same_fold(&parent);
    assert_ne!(other, parent);
    assert!(matches!(drained(&pool)[..], [KvEvent::AllBlocksCleared]));
    // The child's store first: a 1-token window holds only block 1.
    let mut first = HybridSequence::new(Arc::clone(&pool), groups.clone());
    first.try_append(1).unwrap();
    first.try_append(1).unwrap();
    assert_eq!(first.publish(&keys).unwrap(), 1);
    // The other key, then the parent's store.
    let mut second = Sequence::new(Arc::clone(&pool));
    second.try_append(1).unwrap();
    assert_eq!(second.publish(&[other]), 1);
    let mut third = HybridSequence::new(Arc::clone(&pool), groups);
    third.try_append(1).unwrap();
    assert_eq!(third.publish(&keys).unwrap(), 1);
    let stores: Vec<BlockHash> = drained(&pool)
        .into_iter()
        .flat_map(|event| match event {
            KvEvent::BlockStored { keys, .. } => keys,
            other => panic!("only stores: {other:?}"),
        })
        .collect();
    assert_eq!(stores, [parent, child, other]);
}
