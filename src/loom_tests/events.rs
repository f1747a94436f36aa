//! Loom models of the KV events (`BlockPoolBuilder::kv_events`,
//! `BlockPool::drain_events`): the rings' records against the prefix
//! cache's transitions they report, each model with a negative control
//! that loom must catch.
//!
//! Run with `scripts/loom events`.
//!
//! # What every model checks
//!
//! Once the model's threads are joined and a last drain has emptied the
//! rings, the log of every drain (in order) must be:
//!
//! * **In order per key** ([`OUT_OF_ORDER`]): after the opening
//!   `AllBlocksCleared`, each key's events alternate, a store first: a
//!   key's store comes before its removal, and its removal from one block
//!   before its store on another.
//! * **Whole, nothing twice** ([`MISCOUNTED`]): as many stores as publishes
//!   that cached a key and as many removals as keys dropped (evictions,
//!   truncates), less what a `Dropped` event counts.
//! * **The pool's state** ([`DISAGREES`]): a key whose last event is a store
//!   is cached now, on the block that event names; any other is not.
//! * **One group per key** ([`OTHER_GROUP`]): a key's removal names the
//!   group of layers its store named.
//!
//! # Models and negative controls
//!
//! | model | threads, blocks | control (caught by) |
//! |---|---|---|
//! | [`republish_after_eviction`] | 2, 2 | `late_removal_record`, `early_stored_record` (order) |
//! | [`republish_after_truncate`] | 2, 2 | `late_removal_record` (order) |
//! | [`drain_while_publishing`] | 2, 1 | `relaxed_record` ([`NOT_WRITTEN`]: the consumer reads a record's position without its words) |
//! | [`full_ring_counts_its_losses`] | 2, 3 | `uncounted_loss` (miscounted) |
//! | [`group_of_a_shared_block`] | 2, 1 | `early_group_tag` (other group) |
//!
//! Blocks hold one token each (two in the truncate model, whose truncate
//! cuts into a published block); every pool has one shard, so one ring.

use std::collections::HashMap;
use std::sync::Arc;

use crate::loom_tests::pool_world::{
    check, EARLY_GROUP_TAG, EARLY_STORED_RECORD, LATE_REMOVAL_RECORD, RELAXED_RECORD, SOUND,
    UNCOUNTED_LOSS,
};
use crate::sync::Faults;
use crate::{BlockHash, BlockId, BlockPool, KvEvent, Sequence};
use loom::thread;

/// A key's events do not alternate store, removal, store, ...
const OUT_OF_ORDER: &str = "events out of order";
/// The log holds more or fewer events than the transitions it reports.
const MISCOUNTED: &str = "events miscounted";
/// The log's last word on a key is not the pool's state.
const DISAGREES: &str = "events disagree with the pool";
/// The log is not the one record written.
const NOT_WRITTEN: &str = "a record read as it was not written";
/// A key's removal names another group than its store.
const OTHER_GROUP: &str = "a removal names another group";

/// Key number `n`.
fn key(n: u8) -> BlockHash {
    BlockHash([n; 32])
}

/// A pool of `num_blocks` blocks of `block_size` tokens, one shard, with
/// KV event rings of `capacity` records.
fn pool(num_blocks: usize, block_size: usize, capacity: usize, faults: Faults) -> Arc<BlockPool> {
    Arc::new(
        BlockPool::builder(num_blocks, block_size)
            .shards(1)
            .prefix_cache(true)
            .kv_events(capacity)
            .faults(faults)
            .build()
            .unwrap_or_else(|e| panic!("{e}")),
    )
}

/// Drains `pool` into `log`.
fn drain(pool: &BlockPool, log: &mut Vec<KvEvent>) {
    pool.drain_events(log);
}

/// The transitions a model made, as it counts them.
struct Made {
    /// Publishes that cached their key.
    stored: usize,
    /// Keys dropped (evictions, truncates).
    removed: usize,
    /// The keys the model used.
    keys: Vec<BlockHash>,
}

/// The three checks of the module doc on a finished model's `log`.
fn check_log(pool: &Arc<BlockPool>, log: &[KvEvent], made: &Made) {
    assert_eq!(
        log.first(),
        Some(&KvEvent::AllBlocksCleared),
        "{OUT_OF_ORDER}: {log:?}"
    );
    // Per key: the block of its last store, while it is stored, and that
    // store's group (forgotten at a `Dropped`: the store may be lost).
    let mut holder: HashMap<BlockHash, Option<BlockId>> = HashMap::new();
    let mut group_of: HashMap<BlockHash, Option<usize>> = HashMap::new();
    let (mut stored, mut removed, mut dropped) = (0, 0, 0);
    for event in &log[1..] {
        match event {
            KvEvent::BlockStored {
                keys,
                block_ids,
                group,
                ..
            } => {
                for (k, id) in keys.iter().zip(block_ids) {
                    let before = holder.insert(*k, Some(*id)).flatten();
                    assert!(
                        before.is_none(),
                        "{OUT_OF_ORDER}: {k:?} stored twice: {log:?}"
                    );
                    group_of.insert(*k, *group);
                    stored += 1;
                }
            }
            KvEvent::BlockRemoved { keys, group } => {
                for k in keys {
                    let before = holder.insert(*k, None).flatten();
                    assert!(
                        before.is_some(),
                        "{OUT_OF_ORDER}: {k:?} removed unstored: {log:?}"
                    );
                    if let Some(stored) = group_of.get(k) {
                        assert_eq!(stored, group, "{OTHER_GROUP}: {log:?}");
                    }
                    removed += 1;
                }
            }
            KvEvent::Dropped { count } => {
                dropped += count;
                group_of.clear();
            }
            other => panic!("{OUT_OF_ORDER}: {other:?} after the first event"),
        }
    }
    assert_eq!(
        (stored + removed) as u64 + dropped,
        (made.stored + made.removed) as u64,
        "{MISCOUNTED}: {log:?}"
    );
    if dropped == 0 {
        assert_eq!(
            (stored, removed),
            (made.stored, made.removed),
            "{MISCOUNTED}: {log:?}"
        );
        for k in &made.keys {
            let mut probe = Sequence::new(Arc::clone(pool));
            probe.try_match_prefix(&[*k]);
            let now = probe.blocks().first().copied();
            let logged = holder.get(k).copied().flatten();
            assert_eq!(now, logged, "{DISAGREES}: {k:?}: {log:?}");
        }
    }
    if dropped > 0 {
        // The resync of `KvEvent::Dropped`: the view rebuilt from the last
        // `Dropped` on holds no key that the pool does not cache.
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
        for (k, logged) in view {
            let mut probe = Sequence::new(Arc::clone(pool));
            probe.try_match_prefix(&[k]);
            if logged.is_some() {
                assert_eq!(
                    probe.blocks().first().copied(),
                    logged,
                    "{DISAGREES}: {k:?}: {log:?}"
                );
            }
        }
    }
    assert_eq!(
        pool.stats().events_dropped,
        Some(dropped),
        "{MISCOUNTED}: {log:?}"
    );
}

/// A sequence of one full block of `block_size` tokens.
fn one_block(pool: &Arc<BlockPool>, block_size: usize) -> Sequence {
    let mut seq = Sequence::new(Arc::clone(pool));
    seq.try_append(block_size).expect("a free block");
    seq
}

/// The shape of the two republish models: key 1 is cached on block `a`
/// of a sequence `a` (blocks of `block_size` tokens), and a sequence `b`
/// holds the other block; a spawned thread publishes key 1 on `b` while
/// the main thread has `a`'s key removed by `remove`. The publish caches
/// the key only if it sees the removal: then the log must hold `a`'s
/// removal before `b`'s store. (The publish runs on the spawned thread:
/// loom explores the schedules in which a thread's loads run before
/// another's writes by backtracking from those loads.)
fn republish_while(faults: Faults, block_size: usize, remove: fn(&Arc<BlockPool>, Sequence)) {
    check(move || {
        let pool = pool(2, block_size, 8, faults);
        let mut log = Vec::new();
        let mut a = one_block(&pool, block_size);
        assert_eq!(a.publish(&[key(1)]), 1);
        let mut b = one_block(&pool, block_size);
        let publisher = thread::spawn(move || {
            let republished = b.publish(&[key(1)]);
            (b, republished)
        });
        remove(&pool, a);
        let (b, republished) = publisher.join().unwrap();
        drop(b);
        drain(&pool, &mut log);
        let made = Made {
            stored: 1 + republished,
            removed: 1,
            keys: vec![key(1)],
        };
        check_log(&pool, &log, &made);
    });
}

/// `a` is dropped (its block stays cached, evictable) and an allocation of
/// the one block left to take evicts it. Under `late_removal_record` the
/// evictor takes its place after its CAS, so the publish, which saw the
/// key gone, can take an earlier one; under `early_stored_record` the
/// publish takes its place first. Either way the store on `b` is logged
/// before the removal from `a`.
fn republish_after_eviction(faults: Faults) {
    republish_while(faults, 1, |pool, a| {
        drop(a);
        let mut ids = Vec::new();
        pool.try_alloc(1, &mut ids).expect("the evictable block");
        pool.free(&ids).unwrap();
    });
}

#[test]
fn republish_after_eviction_sound() {
    republish_after_eviction(SOUND);
}

#[test]
#[should_panic(expected = "events out of order")]
fn republish_after_eviction_late_removal_record_is_caught() {
    republish_after_eviction(LATE_REMOVAL_RECORD);
}

#[test]
#[should_panic(expected = "events out of order")]
fn republish_after_eviction_early_stored_record_is_caught() {
    republish_after_eviction(EARLY_STORED_RECORD);
}

/// `a`, which holds its block alone, is truncated into it (which drops
/// the key, the block being about to be written). Under
/// `late_removal_record` the truncate takes its place after its CAS, and
/// the store on `b` is logged before the removal from `a`.
fn republish_after_truncate(faults: Faults) {
    republish_while(faults, 2, |_, mut a| {
        a.truncate(1);
        drop(a);
    });
}

#[test]
fn republish_after_truncate_sound() {
    republish_after_truncate(SOUND);
}

#[test]
#[should_panic(expected = "events out of order")]
fn republish_after_truncate_late_removal_record_is_caught() {
    republish_after_truncate(LATE_REMOVAL_RECORD);
}

/// A consumer drains while the main thread publishes key 1 on its block:
/// whatever the consumer saw and the last drain found must together be
/// the one store. Under `relaxed_record` the consumer can read the
/// record's position without its words (a void, or another key).
fn drain_while_publishing(faults: Faults) {
    check(move || {
        let pool = pool(1, 1, 4, faults);
        let mut a = one_block(&pool, 1);
        let block = a.blocks()[0];
        let consumer = thread::spawn({
            let pool = Arc::clone(&pool);
            move || {
                let mut log = Vec::new();
                drain(&pool, &mut log);
                log
            }
        });
        assert_eq!(a.publish(&[key(1)]), 1);
        let mut log = consumer.join().unwrap();
        drain(&pool, &mut log);
        let expected = [
            KvEvent::AllBlocksCleared,
            KvEvent::BlockStored {
                keys: vec![key(1)],
                parent: None,
                block_ids: vec![block],
                block_size: 1,
                token_count: 1,
                group: None,
            },
        ];
        assert_eq!(log, expected, "{NOT_WRITTEN}");
        drop(a);
    });
}

#[test]
fn drain_while_publishing_sound() {
    drain_while_publishing(SOUND);
}

#[test]
#[should_panic(expected = "a record read as it was not written")]
fn drain_while_publishing_relaxed_record_is_caught() {
    drain_while_publishing(RELAXED_RECORD);
}

/// A ring of 2 records and three stores without a drain between them (a
/// thread publishes keys 1 and 2, the main thread key 3, after a drain
/// that races the thread's): one store is lost, and the log must count
/// it. Under `uncounted_loss` it does not.
fn full_ring_counts_its_losses(faults: Faults) {
    check(move || {
        let pool = pool(3, 1, 2, faults);
        let mut log = Vec::new();
        drain(&pool, &mut log);
        let mut ab = Sequence::new(Arc::clone(&pool));
        ab.try_append(2).expect("two free blocks");
        let mut c = one_block(&pool, 1);
        let publisher = thread::spawn(move || {
            assert_eq!(ab.publish(&[key(1), key(2)]), 2);
            ab
        });
        drain(&pool, &mut log);
        assert_eq!(c.publish(&[key(3)]), 1);
        let ab = publisher.join().unwrap();
        drain(&pool, &mut log);
        let made = Made {
            stored: 3,
            removed: 0,
            keys: vec![key(1), key(2), key(3)],
        };
        check_log(&pool, &log, &made);
        drop((ab, c));
    });
}

#[test]
fn full_ring_counts_its_losses_sound() {
    full_ring_counts_its_losses(SOUND);
}

#[test]
#[should_panic(expected = "events miscounted")]
fn full_ring_counts_its_losses_uncounted_loss_is_caught() {
    full_ring_counts_its_losses(UNCOUNTED_LOSS);
}

/// Two holders of one block (a sequence and its fork) publish it at once,
/// as the tables of two groups of layers (keys 1 and 2, groups 0 and 1),
/// and the block is then dropped and its key removed by a reset: exactly
/// one publish caches its key, and the removal must name that publish's
/// group. Under `early_group_tag` the loser writes its group before its
/// claim fails, over the winner's. (No public call makes two groups
/// publish one uncached block: a block is shared across tables only once
/// it is cached. The model drives the crate's `Sequence::publish_in`, as
/// two tables would, to check that a claim that fails writes no tag.)
fn group_of_a_shared_block(faults: Faults) {
    check(move || {
        let pool = pool(1, 1, 8, faults);
        let mut a = one_block(&pool, 1);
        let (mut b, copy) = a.try_fork().expect("a full block is shared");
        assert_eq!(copy, None);
        let publisher = thread::spawn(move || {
            let cached = b.publish_in(Some(1), &[key(2)]);
            (b, cached)
        });
        let cached_a = a.publish_in(Some(0), &[key(1)]);
        let (b, cached_b) = publisher.join().unwrap();
        assert_eq!(cached_a + cached_b, 1, "one publish caches the block");
        drop((a, b));
        assert_eq!(pool.reset_prefix_cache(), 1);
        let mut log = Vec::new();
        drain(&pool, &mut log);
        let made = Made {
            stored: 1,
            removed: 1,
            keys: vec![key(1), key(2)],
        };
        check_log(&pool, &log, &made);
    });
}

#[test]
fn group_of_a_shared_block_sound() {
    group_of_a_shared_block(SOUND);
}

#[test]
#[should_panic(expected = "a removal names another group")]
fn group_of_a_shared_block_early_group_tag_is_caught() {
    group_of_a_shared_block(EARLY_GROUP_TAG);
}
