//! Attacks on the KV events' groups of layers (`KvEvent`'s `group`): real
//! threads mixing hybrid sequences (several layouts, sliding windows),
//! plain sequences, forks moved to other threads, rival publishes of one
//! key, matches of keys other threads published, truncates into
//! sole-held cached blocks, resets and allocations that evict, over 1 to
//! 3 shards, with a consumer draining meanwhile, with rings that never
//! fill and with rings that overflow.
//!
//! Each log is checked key by key: a store names its publisher's group
//! (the group keys of group `g` are only published by group `g`'s table,
//! or, under misuse, by a plain sequence, which names none), and a
//! removal names the group of the last store of its key (in a log that
//! lost nothing, or after the last `Dropped` where both are seen).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};

use common::{events_pool, families, Forward, StopOnDrop, XorShift};

use kvslots::{
    hash_blocks, BlockHash, BlockPool, GroupKeys, HybridSequence, KvEvent, KvGroup, KvGroups,
    Sequence,
};

/// The layouts the workers use: two hybrid models whose group keys differ
/// (the group's index and kind are hashed in).
fn layouts() -> [KvGroups; 2] {
    [
        KvGroups::new([
            KvGroup::Full,
            KvGroup::SlidingWindow { window_tokens: 2 },
            KvGroup::Full,
        ])
        .unwrap(),
        KvGroups::new([KvGroup::SlidingWindow { window_tokens: 4 }, KvGroup::Full]).unwrap(),
    ]
}

/// Each key's group when published as intended: a content key none, a
/// group key its group's index.
fn intended_groups(prompts: &[Vec<BlockHash>]) -> HashMap<BlockHash, Option<usize>> {
    let mut group_of = HashMap::new();
    for content in prompts {
        group_of.extend(content.iter().map(|k| (*k, None)));
        for groups in layouts() {
            let keys = groups.keys(content);
            for g in 0..groups.len() {
                for k in keys.group(g).unwrap() {
                    let before = group_of.insert(*k, Some(g));
                    assert!(before.is_none() || before == Some(Some(g)));
                }
            }
        }
    }
    group_of
}

/// Checks `log`, the whole log of a pool since it was built: every store
/// names a group that `allowed` allows for each of its keys; per key,
/// stores and removals alternate; every removal seen after the last
/// `Dropped`, of a key whose store is also after it (all of them when
/// nothing was dropped), names that store's group. Returns the keys
/// stored and removed by group (`[none, 0, 1, 2]`).
fn check_log(
    log: &[KvEvent],
    allowed: impl Fn(&BlockHash, Option<usize>) -> bool,
) -> ([usize; 4], [usize; 4]) {
    assert_eq!(log.first(), Some(&KvEvent::AllBlocksCleared), "{log:?}");
    let last_drop = log
        .iter()
        .rposition(|e| matches!(e, KvEvent::Dropped { .. }))
        .unwrap_or(0);
    // Per key: the group of its last store, while stored (after the last
    // drop only; before it, whether stored at all).
    let mut stored_as: HashMap<BlockHash, Option<usize>> = HashMap::new();
    let mut is_stored: HashMap<BlockHash, bool> = HashMap::new();
    let (mut stores, mut removals) = ([0usize; 4], [0usize; 4]);
    let slot = |g: Option<usize>| g.map_or(0, |g| g + 1);
    for (i, event) in log.iter().enumerate() {
        match event {
            KvEvent::BlockStored {
                keys,
                block_ids,
                group,
                ..
            } => {
                assert_eq!(keys.len(), block_ids.len());
                for k in keys {
                    assert!(allowed(k, *group), "{k:?} stored for {group:?}: {event:?}");
                    let before = is_stored.insert(*k, true);
                    if i > last_drop {
                        assert_ne!(before, Some(true), "{k:?} stored twice");
                        stored_as.insert(*k, *group);
                    }
                    stores[slot(*group)] += 1;
                }
            }
            KvEvent::BlockRemoved { keys, group } => {
                for k in keys {
                    assert!(allowed(k, *group), "{k:?} removed for {group:?}: {event:?}");
                    let before = is_stored.insert(*k, false);
                    if i > last_drop {
                        if let Some(stored) = stored_as.remove(k) {
                            assert_eq!(
                                stored, *group,
                                "{k:?} stored for {stored:?}, removed for {group:?}"
                            );
                        } else if last_drop == 0 {
                            panic!("{k:?} removed unstored ({before:?})");
                        }
                    }
                    removals[slot(*group)] += 1;
                }
            }
            KvEvent::Dropped { .. } => {
                // What was stored before a loss is not known any more.
                stored_as.clear();
            }
            _ => {}
        }
    }
    (stores, removals)
}

/// What a worker may do wrong on purpose: publish (and match) the group
/// keys of a hybrid model through a plain sequence.
#[derive(Clone, Copy, PartialEq)]
enum Use {
    Intended,
    GroupKeysThroughPlain,
}

/// A sequence a worker keeps alive for a while (its blocks held), of
/// either kind.
type Held = Box<dyn std::any::Any>;

/// One worker's rounds on `pool`: hybrid sequences of both layouts, plain
/// ones, forks published at once from another thread, truncates into
/// what was matched or published, resets; up to three sequences kept
/// alive. Drains into `log` now and then when `drains` (under the log's
/// lock, so the log is in the pool's order).
fn work(
    pool: &Arc<BlockPool>,
    prompts: &[Vec<BlockHash>],
    seed: u64,
    rounds: usize,
    misuse: Use,
    log: Option<&Mutex<Vec<KvEvent>>>,
) {
    let mut rng = XorShift::new(seed);
    let layouts = layouts();
    let mut held: Vec<Held> = Vec::new();
    for round in 0..rounds {
        let content = &prompts[rng.below(prompts.len())];
        let kind = rng.below(6);
        let seq: Held = if kind < 2 {
            // A plain sequence: of content keys, or of group keys (misuse).
            let groups = &layouts[rng.below(2)];
            let keys: Vec<BlockHash> = if misuse == Use::GroupKeysThroughPlain && kind == 1 {
                let all = groups.keys(content);
                all.group(rng.below(groups.len())).unwrap().to_vec()
            } else {
                content.clone()
            };
            let mut seq = Sequence::new(Arc::clone(pool));
            seq.try_match_prefix(&keys);
            if seq.try_append(8 - seq.len()).is_err() {
                held.clear();
                continue;
            }
            if rng.below(3) == 0 {
                // A fork on another thread publishes with its parent.
                let Ok((mut fork, _)) = seq.try_fork() else {
                    continue;
                };
                std::thread::scope(|s| {
                    let keys = &keys;
                    let other = s.spawn(move || {
                        fork.publish(keys);
                        fork
                    });
                    seq.publish(keys);
                    let fork = other.join().unwrap();
                    held.push(Box::new(fork));
                });
            } else {
                seq.publish(&keys);
            }
            match rng.below(4) {
                // Into the last block, or into the first (both possibly
                // cached and held alone).
                0 => {
                    seq.truncate(7);
                }
                1 => {
                    seq.truncate(1 + rng.below(6));
                }
                _ => {}
            }
            Box::new(seq)
        } else {
            let groups = layouts[rng.below(2)].clone();
            let keys: GroupKeys = groups.keys(content);
            let mut seq = HybridSequence::new(Arc::clone(pool), groups);
            seq.try_match_prefix(&keys).unwrap();
            if seq.try_append(8 - seq.len()).is_err() {
                held.clear();
                continue;
            }
            if rng.below(3) == 0 {
                let mut copies = Vec::new();
                let Ok(mut fork) = seq.try_fork(&mut copies) else {
                    continue;
                };
                std::thread::scope(|s| {
                    let keys = &keys;
                    let other = s.spawn(move || {
                        fork.publish(keys).unwrap();
                        fork
                    });
                    seq.publish(keys).unwrap();
                    let fork = other.join().unwrap();
                    held.push(Box::new(fork));
                });
            } else if rng.below(2) == 0 {
                // Publish half, append a block (the window gives blocks
                // back), publish the rest: a cycle split by the window.
                let mut half = GroupKeys::new(seq.groups());
                half.extend(&content[..2]);
                seq.publish(&half).unwrap();
                if seq.try_append(2).is_ok() {
                    seq.publish(&keys).unwrap();
                    let _ = seq.truncate(8);
                }
            } else {
                seq.publish(&keys).unwrap();
            }
            if rng.below(4) == 0 {
                // Into the last block of each group; a truncate outside a
                // window is refused, and changes nothing.
                let _ = seq.truncate(seq.len() - 1 - rng.below(2));
            }
            Box::new(seq)
        };
        held.push(seq);
        while held.len() > 3 {
            held.remove(rng.below(held.len()));
        }
        if rng.below(24) == 0 {
            pool.reset_prefix_cache();
        }
        if let Some(log) = log.filter(|_| round % 16 == 0) {
            let mut log = log.lock().unwrap();
            pool.drain_events(&mut log);
        }
    }
}

/// Runs `threads` workers on `pool` with a consumer draining meanwhile
/// (`drain_meanwhile`) or the workers draining now and then; returns the
/// whole log.
fn run(
    pool: &Arc<BlockPool>,
    prompts: &[Vec<BlockHash>],
    threads: usize,
    rounds: usize,
    misuse: Use,
    drain_meanwhile: bool,
) -> Vec<KvEvent> {
    let log = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        if drain_meanwhile {
            let (log, stop) = (&log, &stop);
            s.spawn(move || {
                // Acquire: pairs with `StopOnDrop`'s Release; orders
                // nothing, it only ends the loop (the last drain is after
                // the scope).
                while !stop.load(Ordering::Acquire) {
                    let mut log = log.lock().unwrap();
                    pool.drain_events(&mut log);
                    drop(log);
                    std::thread::yield_now();
                }
            });
        }
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let log = (!drain_meanwhile).then_some(&log);
                s.spawn(move || work(pool, prompts, 100 + t as u64, rounds, misuse, log))
            })
            .collect();
        let _stop = StopOnDrop(&stop);
        for w in workers {
            w.join().unwrap();
        }
    });
    let mut log = log.into_inner().unwrap();
    pool.drain_events(&mut log);
    log
}

#[test]
fn intended_use_names_each_keys_group_in_every_store_and_removal() {
    let prompts = families(8);
    let intended = intended_groups(&prompts);
    for shards in 1..=3 {
        // 24 blocks of 2 tokens: a hybrid prompt takes up to 12, so
        // blocks pass between groups, layouts and plain sequences.
        let pool = events_pool(24, 2, shards, 1 << 16);
        let log = run(&pool, &prompts, 3, 1500, Use::Intended, true);
        assert!(!log.iter().any(|e| matches!(e, KvEvent::Dropped { .. })));
        let (stores, removals) = check_log(&log, |k, g| intended[k] == g);
        assert!(
            stores.iter().chain(&removals).all(|&n| n > 0),
            "{shards} shards: stores {stores:?}, removals {removals:?}"
        );
    }
}

#[test]
fn group_keys_misused_by_plain_sequences_are_removed_under_the_group_that_stored_them() {
    let prompts = families(8);
    let intended = intended_groups(&prompts);
    // A content key is a plain sequence's; a group key is stored by its
    // group or, misused, by a plain sequence.
    let allowed = |k: &BlockHash, g: Option<usize>| g.is_none() || intended[k] == g;
    for shards in 1..=3 {
        let pool = events_pool(24, 2, shards, 1 << 16);
        let log = run(&pool, &prompts, 3, 1500, Use::GroupKeysThroughPlain, true);
        assert!(!log.iter().any(|e| matches!(e, KvEvent::Dropped { .. })));
        let (stores, removals) = check_log(&log, allowed);
        assert!(stores.iter().chain(&removals).all(|&n| n > 0));
        // Some group keys were stored by both kinds of publisher.
        let mut kinds: HashMap<BlockHash, [bool; 2]> = HashMap::new();
        for event in &log {
            if let KvEvent::BlockStored { keys, group, .. } = event {
                for k in keys.iter().filter(|k| intended[k].is_some()) {
                    kinds.entry(*k).or_default()[usize::from(group.is_some())] = true;
                }
            }
        }
        assert!(
            kinds.values().any(|&[plain, hybrid]| plain && hybrid),
            "no group key was stored by both kinds"
        );
    }
}

#[test]
fn overflowing_rings_name_each_keys_group_and_the_tail_after_the_last_drop_is_right() {
    let prompts = families(8);
    let intended = intended_groups(&prompts);
    for shards in 1..=3 {
        // Rings of 2 to 8 records, drained every 16 rounds by the
        // workers: they overflow.
        let pool = events_pool(24, 2, shards, 8);
        let log = run(&pool, &prompts, 3, 1000, Use::Intended, false);
        let drops = log
            .iter()
            .filter(|e| matches!(e, KvEvent::Dropped { .. }))
            .count();
        assert!(drops > 0, "{shards} shards: nothing dropped");
        check_log(&log, |k, g| intended[k] == g);
        // Misused too: every removal after the last drop whose store is
        // also after it names that store's group.
        let pool = events_pool(24, 2, shards, 8);
        let log = run(&pool, &prompts, 3, 1000, Use::GroupKeysThroughPlain, false);
        check_log(&log, |k, g| g.is_none() || intended[k] == g);
    }
}

#[test]
fn forks_and_rivals_on_threads_cache_each_key_once_under_its_group() {
    const FORKS: usize = 3;
    let groups =
        KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 4 }]).unwrap();
    for round in 0..150u32 {
        let shards = 1 + round as usize % 3;
        let pool = events_pool(64, 4, shards, 1 << 10);
        let mut content = Vec::new();
        hash_blocks(
            b"",
            &(0..16).map(|t| t + round).collect::<Vec<_>>(),
            4,
            &mut content,
        );
        let keys = groups.keys(&content);
        // A sequence and its forks share their blocks; a rival holds
        // others under the same keys; a plain sequence publishes the
        // content keys on its own blocks.
        let mut seq = HybridSequence::new(Arc::clone(&pool), groups.clone());
        seq.try_append(16).unwrap();
        let mut copies = Vec::new();
        let mut holders: Vec<HybridSequence> = (0..FORKS)
            .map(|_| seq.try_fork(&mut copies).unwrap())
            .collect();
        assert!(copies.is_empty());
        let mut rival = HybridSequence::new(Arc::clone(&pool), groups.clone());
        rival.try_append(16).unwrap();
        holders.push(rival);
        holders.push(seq);
        let mut plain = Sequence::new(Arc::clone(&pool));
        plain.try_append(16).unwrap();
        let barrier = Barrier::new(holders.len() + 1);
        let cached: usize = std::thread::scope(|s| {
            let (barrier, keys, content) = (&barrier, &keys, &content);
            let hybrids: Vec<_> = holders
                .drain(..)
                .map(|mut h| {
                    s.spawn(move || {
                        barrier.wait();
                        let n = h.publish(keys).unwrap();
                        // Truncate into the last block of each group: a
                        // cached one held by several, or the rival's
                        // alone (its key dropped, if it won).
                        h.truncate(15).unwrap();
                        (h, n)
                    })
                })
                .collect();
            let plain = s.spawn(move || {
                barrier.wait();
                plain.publish(content)
            });
            let mut cached = plain.join().unwrap();
            for h in hybrids {
                let (h, n) = h.join().unwrap();
                cached += n;
                drop(h);
            }
            cached
        });
        // At least 4 plain keys, 4 full-attention keys and the windowed
        // group's last key (its first 3 blocks left the window with the
        // append, so they are never published); more if a key a truncate
        // dropped was cached again by a later publish.
        assert!(cached >= 9, "{cached} cached");
        pool.reset_prefix_cache();
        let mut log = Vec::new();
        pool.drain_events(&mut log);
        let mut want: HashMap<BlockHash, Option<usize>> =
            content.iter().map(|k| (*k, None)).collect();
        for g in 0..groups.len() {
            want.extend(keys.group(g).unwrap().iter().map(|k| (*k, Some(g))));
        }
        check_log(&log, |k, g| want[k] == g);
        // Everything was dropped and reset: each store has its removal.
        let (mut stored, mut removed) = (0, 0);
        for e in &log {
            match e {
                KvEvent::BlockStored { keys, .. } => stored += keys.len(),
                KvEvent::BlockRemoved { keys, .. } => removed += keys.len(),
                _ => {}
            }
        }
        assert_eq!(stored, removed, "{log:?}");
        assert_eq!(pool.cached_blocks(), 0);
    }
}

#[test]
fn matches_of_keys_another_thread_published_then_truncated_name_the_publishers_group() {
    // One thread publishes a hybrid prompt and lets it go; the others
    // match it (reviving the blocks), truncate into the last block and
    // publish other tokens there, all at once. Each removal names the
    // group of the store of its key.
    let groups =
        KvGroups::new([KvGroup::SlidingWindow { window_tokens: 4 }, KvGroup::Full]).unwrap();
    for round in 0..100u32 {
        let pool = events_pool(48, 4, 1 + round as usize % 3, 1 << 10);
        let mut base = Vec::new();
        hash_blocks(
            b"",
            &(0..16).map(|t| t + round).collect::<Vec<_>>(),
            4,
            &mut base,
        );
        let keys = groups.keys(&base);
        {
            let mut first = HybridSequence::new(Arc::clone(&pool), groups.clone());
            first.try_append(16).unwrap();
            assert!(first.publish(&keys).unwrap() >= 5);
        }
        let barrier = Barrier::new(3);
        std::thread::scope(|s| {
            for t in 0..3u32 {
                let (pool, groups, barrier, base) = (&pool, &groups, &barrier, &base);
                s.spawn(move || {
                    let mut seq = HybridSequence::new(Arc::clone(pool), groups.clone());
                    barrier.wait();
                    let matched = seq.try_match_prefix(&groups.keys(base)).unwrap();
                    if matched < 16 {
                        seq.try_append(16 - matched).unwrap();
                    }
                    seq.truncate(15).unwrap();
                    if seq.append_needs_copy() {
                        // The tail is shared (and keeps its key).
                        return;
                    }
                    seq.try_append(1).unwrap();
                    let mut other = base[..3].to_vec();
                    other.push(BlockHash::first(b"other", &[t, 1, 2, round]));
                    seq.publish(&groups.keys(&other)).unwrap();
                });
            }
        });
        pool.reset_prefix_cache();
        let mut log = Vec::new();
        pool.drain_events(&mut log);
        check_log(&log, |k, g| {
            let intended = (0..groups.len()).find(|&g| {
                // The key's group: look it up among the prompts'.
                let mut all = vec![keys.group(g).unwrap().to_vec()];
                for t in 0..3u32 {
                    let mut other = base[..3].to_vec();
                    other.push(BlockHash::first(b"other", &[t, 1, 2, round]));
                    all.push(groups.keys(&other).group(g).unwrap().to_vec());
                }
                all.iter().flatten().any(|x| x == k)
            });
            intended == g
        });
        let removals: usize = log
            .iter()
            .map(|e| match e {
                KvEvent::BlockRemoved { keys, .. } => keys.len(),
                _ => 0,
            })
            .sum();
        assert!(removals > 0);
        assert_eq!(pool.cached_blocks(), 0);
    }
}

#[test]
fn a_hybrid_sequence_over_a_forwarding_allocator_names_its_groups() {
    let inner = BlockPool::builder(8, 4)
        .prefix_cache(true)
        .kv_events(64)
        .build()
        .unwrap();
    let pool = Forward::new(inner);
    let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    let mut base = Vec::new();
    hash_blocks(b"", &[1, 2, 3, 4], 4, &mut base);
    let keys = groups.keys(&base);
    let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    seq.try_append(4).unwrap();
    assert_eq!(seq.publish(&keys), Ok(2));
    drop(seq);
    assert_eq!(pool.inner.reset_prefix_cache(), 2);
    let mut log = Vec::new();
    pool.inner.drain_events(&mut log);
    let want: HashMap<BlockHash, Option<usize>> = (0..2)
        .map(|g| (keys.group(g).unwrap()[0], Some(g)))
        .collect();
    check_log(&log, |k, g| want[k] == g);
}
