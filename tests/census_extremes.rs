//! The census at the extremes: the public API with the largest and most
//! degenerate inputs that still make sense (a sliding window of
//! `usize::MAX` tokens, a window of one token over a long decode, blocks of
//! `usize::MAX / 2` tokens so that a sequence's length reaches
//! `usize::MAX - 1`, event rings of `usize::MAX` records, every shard a
//! pool may have, a block listed a million times, keys repeated a million
//! times). Each test checks the documented outcome: the result, or a typed
//! error with everything observable unchanged.
//!
//! A long or repetitive input must cost time linear in its length. The
//! tests marked `#[ignore = "reproduces: ..."]` reproduce inputs that do
//! not (a blowup that runs for minutes), kept here so that the fix has its
//! test; each names what goes wrong.

mod common;

use std::sync::Arc;

use common::{assert_pool_whole, pool_snap, seq_snap};
use kvslots::{
    hash_blocks, hash_blocks_with, BlockHash, BlockId, BlockPool, ConfigError, ExtraKey,
    ExtraKeyError, FreeError, HybridError, HybridSequence, KvEvent, KvGroup, KvGroups,
    ReserveError, Sequence, SlotCounter,
};

/// Everything observable about a hybrid sequence: its length and every
/// group's table and given-back count.
fn hybrid_snap(h: &HybridSequence) -> (usize, usize, Vec<Vec<BlockId>>, Vec<usize>) {
    let groups = h.groups().len();
    (
        h.len(),
        h.capacity(),
        (0..groups).map(|g| h.blocks(g).unwrap().to_vec()).collect(),
        (0..groups).map(|g| h.null_blocks(g).unwrap()).collect(),
    )
}

fn keys(tokens: std::ops::Range<u32>, block_size: usize) -> Vec<BlockHash> {
    let tokens: Vec<u32> = tokens.collect();
    let mut out = Vec::new();
    hash_blocks(b"", &tokens, block_size, &mut out);
    out
}

// ---------------------------------------------------------------------------
// Sliding windows at their extremes
// ---------------------------------------------------------------------------

#[test]
fn a_window_of_usize_max_tokens_never_gives_a_block_back() {
    let window = KvGroup::SlidingWindow {
        window_tokens: usize::MAX,
    };
    // Every position a sequence can append at (`len < usize::MAX`) reads
    // from position 0; only position `usize::MAX`, which no sequence
    // reaches (its length would pass `usize::MAX`), reads from 1.
    assert_eq!(window.first_needed_block(usize::MAX - 1, 1), 0);
    assert_eq!(window.first_needed_block(usize::MAX, 1), 1);
    let pool = Arc::new(BlockPool::new(64, 4));
    let groups = KvGroups::new([KvGroup::Full, window]).unwrap();
    let mut h = HybridSequence::new(Arc::clone(&pool), groups);
    assert_eq!(h.try_append(20), Ok(0..20));
    assert_eq!(h.try_append(21), Ok(20..41));
    assert_eq!(h.null_blocks(1), Some(0));
    assert_eq!(h.held_blocks(), 22);
    assert_eq!(pool.used_blocks(), 22);
    // Every position of the window group has a slot, the first included.
    assert_eq!(
        h.slot(1, 0).map(|s| s / 4),
        h.blocks(1).map(|b| b[0].index())
    );
    // A truncate to any length is accepted: nothing was given back.
    assert_eq!(h.truncate(1), Ok(20));
    assert_eq!(h.held_blocks(), 2);
    let mut copies = Vec::new();
    let child = h.try_fork(&mut copies).unwrap();
    assert_eq!(copies.len(), 2);
    assert_eq!(child.len(), 1);
    drop((h, child));
    assert_pool_whole(&pool);
}

#[test]
fn a_window_of_one_token_over_a_long_decode_holds_one_block() {
    let pool = Arc::new(BlockPool::new(8, 1));
    let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 1 }]).unwrap();
    let mut h = HybridSequence::new(Arc::clone(&pool), groups);
    const STEPS: usize = 200_000;
    for step in 0..STEPS {
        assert_eq!(h.try_append(1), Ok(step..step + 1));
    }
    assert_eq!(h.held_blocks(), 1);
    assert_eq!(pool.used_blocks(), 1);
    assert_eq!(h.null_blocks(0), Some(STEPS - 1));
    assert_eq!(h.slot(0, STEPS - 2), None);
    assert!(h.slot(0, STEPS - 1).is_some());
    // Back into a given-back block: refused, nothing changed.
    let before = (hybrid_snap(&h), pool_snap(&pool));
    assert_eq!(
        h.truncate(1),
        Err(HybridError::TruncateOutsideWindow {
            len: 1,
            min_len: STEPS - 1
        })
    );
    assert_eq!((hybrid_snap(&h), pool_snap(&pool)), before);
    // To 0: the one block still held leaves the table.
    assert_eq!(h.truncate(0), Ok(1));
    drop(h);
    assert_pool_whole(&pool);
}

// ---------------------------------------------------------------------------
// Lengths near usize::MAX (blocks of usize::MAX / 2 tokens)
// ---------------------------------------------------------------------------

#[test]
fn a_sequence_reaches_usize_max_minus_one_tokens_and_refuses_past_it() {
    let bs = usize::MAX / 2;
    let pool = Arc::new(BlockPool::new(2, bs));
    let mut seq = Sequence::new(Arc::clone(&pool));
    assert_eq!(seq.try_append(bs), Ok(0..bs));
    // `len + n` past usize::MAX: a typed refusal, nothing changed.
    let before = (seq_snap(&seq), pool_snap(&pool));
    assert!(matches!(
        seq.try_append(usize::MAX),
        Err(ReserveError::NeverFits { .. })
    ));
    assert!(matches!(
        seq.try_append_cow(usize::MAX),
        Err(ReserveError::NeverFits { .. })
    ));
    assert!(matches!(
        seq.try_reserve(usize::MAX, usize::MAX),
        Err(ReserveError::NeverFits { .. })
    ));
    assert_eq!((seq_snap(&seq), pool_snap(&pool)), before);

    assert_eq!(seq.try_append(bs), Ok(bs..2 * bs));
    assert_eq!(seq.len(), usize::MAX - 1);
    assert_eq!(seq.capacity(), usize::MAX - 1);
    // The last position's slot is the pool's last slot.
    let last = seq.blocks()[1].index() * bs + (bs - 1);
    assert_eq!(seq.slot(usize::MAX - 2), Some(last));
    assert_eq!(seq.slot(usize::MAX - 1), None);
    assert_eq!(seq.slot(usize::MAX), None);
    let mut slots = Vec::new();
    seq.extend_slots(usize::MAX - 3..usize::MAX - 1, &mut slots)
        .unwrap();
    assert_eq!(slots, [last - 1, last]);
    let before = (seq_snap(&seq), pool_snap(&pool));
    for n in [1, 2, usize::MAX / 2, usize::MAX] {
        assert!(matches!(
            seq.try_append(n),
            Err(ReserveError::NeverFits { .. })
        ));
        assert!(matches!(
            seq.try_reserve(n, 0),
            Err(ReserveError::NeverFits { .. })
        ));
    }
    assert!(seq
        .extend_slots(usize::MAX - 2..usize::MAX, &mut slots)
        .is_err());
    assert_eq!(slots, [last - 1, last]);
    assert_eq!((seq_snap(&seq), pool_snap(&pool)), before);
    assert_eq!(seq.truncate(usize::MAX), 0);
    assert_eq!(seq.truncate(bs + 1), 0);
    assert_eq!(seq.truncate(bs), 1);
    drop(seq);
    assert_pool_whole(&pool);
}

#[test]
fn a_hybrid_sequence_with_huge_blocks_refuses_past_usize_max() {
    let bs = usize::MAX / 4;
    let pool = Arc::new(BlockPool::new(4, bs));
    let groups = KvGroups::new([
        KvGroup::SlidingWindow { window_tokens: 3 },
        KvGroup::SlidingWindow {
            window_tokens: usize::MAX,
        },
    ])
    .unwrap();
    let mut h = HybridSequence::new(Arc::clone(&pool), groups);
    assert_eq!(h.try_append(bs + 1), Ok(0..bs + 1));
    let before = (hybrid_snap(&h), pool_snap(&pool));
    for n in [usize::MAX, usize::MAX - bs, 2 * bs] {
        assert!(matches!(
            h.try_append(n),
            Err(ReserveError::NeverFits { .. })
        ));
        assert!(matches!(
            h.try_reserve(n, usize::MAX),
            Err(ReserveError::NeverFits { .. })
        ));
    }
    assert_eq!((hybrid_snap(&h), pool_snap(&pool)), before);
    assert_eq!(h.slot(0, bs), Some(h.blocks(0).unwrap()[1].index() * bs));
    assert_eq!(h.truncate(usize::MAX), Ok(0));
    drop(h);
    assert_pool_whole(&pool);
}

// ---------------------------------------------------------------------------
// Builder sizes at their maxima
// ---------------------------------------------------------------------------

#[test]
fn event_rings_of_usize_max_records_are_a_typed_error() {
    for shards in [1, BlockPool::MAX_SHARDS] {
        for capacity in [usize::MAX, usize::MAX / 2] {
            let builder = BlockPool::builder(8, 4)
                .shards(shards)
                .prefix_cache(true)
                .kv_events(capacity);
            assert_eq!(builder.memory_bytes(), usize::MAX);
            assert_eq!(
                builder.build().map(|p| p.num_blocks()),
                Err(ConfigError::OutOfMemory { bytes: usize::MAX })
            );
        }
    }
}

#[test]
fn one_event_record_drops_the_rest_and_says_so() {
    let pool = Arc::new(
        BlockPool::builder(64, 1)
            .prefix_cache(true)
            .kv_events(1)
            .build()
            .unwrap(),
    );
    let k = keys(0..64, 1);
    let mut seq = Sequence::new(Arc::clone(&pool));
    for i in 0..64 {
        seq.try_append(1).unwrap();
        assert_eq!(seq.publish(&k[..=i]), 1);
    }
    let mut events = Vec::new();
    assert_eq!(pool.drain_events(&mut events), 0);
    let stored: usize = events
        .iter()
        .map(|e| match e {
            KvEvent::BlockStored { keys, .. } => keys.len(),
            _ => 0,
        })
        .sum();
    let dropped: u64 = events
        .iter()
        .map(|e| match e {
            KvEvent::Dropped { count } => *count,
            _ => 0,
        })
        .sum();
    // Every store is either reported or counted as dropped.
    assert_eq!(stored as u64 + dropped, 64);
    assert_eq!(pool.stats().events_dropped, Some(dropped));
}

#[test]
fn every_shard_a_pool_may_have_over_fewer_blocks() {
    for blocks in [0, 1, 3] {
        let pool = BlockPool::builder(blocks, 4)
            .shards(BlockPool::MAX_SHARDS)
            .prefix_cache(true)
            .kv_events(1)
            .build()
            .unwrap();
        assert_eq!(pool.shards(), BlockPool::MAX_SHARDS);
        let mut out = Vec::new();
        pool.try_alloc(blocks, &mut out).unwrap();
        assert_eq!(out.len(), blocks);
        assert_eq!(
            pool.try_alloc(1, &mut out),
            Err(if blocks == 0 {
                ReserveError::NeverFits {
                    requested: 1,
                    capacity: 0,
                }
            } else {
                ReserveError::Full {
                    requested: 1,
                    available: 0,
                }
            })
        );
        pool.free(&out).unwrap();
        assert_eq!(pool.free_blocks(), blocks);
        if blocks > 0 {
            assert_pool_whole(&pool);
        }
    }
}

#[test]
fn a_slot_counter_at_max_capacity() {
    let c = SlotCounter::new(SlotCounter::MAX_CAPACITY);
    let r = c.try_reserve(SlotCounter::MAX_CAPACITY).unwrap();
    assert_eq!(r.len(), SlotCounter::MAX_CAPACITY);
    assert_eq!(c.admit(1), 0);
    assert_eq!(c.admit(isize::MAX), 0);
    drop(r);
    assert_eq!(c.admit(isize::MAX), SlotCounter::MAX_CAPACITY);
    assert_eq!(c.release(SlotCounter::MAX_CAPACITY), Ok(()));
    assert_eq!(c.used(), 0);
}

#[test]
fn keys_of_blocks_of_usize_max_tokens() {
    let mut out = Vec::new();
    hash_blocks(b"", &[1, 2, 3], usize::MAX, &mut out);
    assert!(out.is_empty());
}

#[test]
fn extra_keys_at_the_ends_of_the_positions() {
    let tokens: Vec<u32> = (0..64).collect();
    let image = [7u8; 32];
    let plain = keys(0..64, 16);
    // Wholly past the tokens, at usize::MAX: no block has it.
    let mut out = Vec::new();
    let past = ExtraKey::Multimodal {
        hash: &image,
        positions: usize::MAX - 1..usize::MAX,
    };
    hash_blocks_with(b"", &tokens, 16, &[past], &mut out).unwrap();
    assert_eq!(out, plain);
    // Over every position: every block has it, so no key is plain.
    out.clear();
    let all = ExtraKey::Multimodal {
        hash: &image,
        positions: 0..usize::MAX,
    };
    hash_blocks_with(b"", &tokens, 16, std::slice::from_ref(&all), &mut out).unwrap();
    assert_eq!(out.len(), 4);
    assert!(out.iter().zip(&plain).all(|(a, b)| a != b));
    // Blocks of usize::MAX tokens: none full, no key.
    out.clear();
    hash_blocks_with(
        b"",
        &tokens,
        usize::MAX,
        std::slice::from_ref(&all),
        &mut out,
    )
    .unwrap();
    assert!(out.is_empty());
    // An empty range at usize::MAX: refused, `out` as it was.
    let mut out = plain.clone();
    let empty = ExtraKey::Multimodal {
        hash: &image,
        positions: usize::MAX..usize::MAX,
    };
    assert_eq!(
        hash_blocks_with(b"", &tokens, 16, &[all.clone(), empty], &mut out),
        Err(ExtraKeyError::EmptyPositions {
            index: 1,
            positions: usize::MAX..usize::MAX
        })
    );
    assert_eq!(out, plain);
}

/// A 1M-token prompt with an image in every 16-token block (64k extras in
/// position order): each block looks only at the extras near it (it took
/// minutes when every block scanned every extra).
#[test]
fn hash_blocks_with_many_extras_is_linear() {
    let blocks = 1 << 16;
    let tokens: Vec<u32> = (0..(blocks * 16) as u32).collect();
    let image = [7u8; 32];
    let extras: Vec<ExtraKey> = (0..blocks)
        .map(|i| ExtraKey::Multimodal {
            hash: &image,
            positions: i * 16..i * 16 + 1,
        })
        .collect();
    let mut out = Vec::new();
    hash_blocks_with(b"", &tokens, 16, &extras, &mut out).unwrap();
    assert_eq!(out.len(), blocks);
}

// ---------------------------------------------------------------------------
// Repetitive lists
// ---------------------------------------------------------------------------

#[test]
fn a_block_listed_a_million_times_is_added_and_freed() {
    let pool = BlockPool::new(4, 4);
    let mut out = Vec::new();
    pool.try_alloc(1, &mut out).unwrap();
    let many = vec![out[0]; 1 << 20];
    pool.add_refs(&many).unwrap();
    assert_eq!(pool.ref_count(out[0]), Some((1 << 20) + 1));
    // One listing too many: refused, nothing changed.
    let mut over = many.clone();
    over.extend([out[0], out[0]]);
    let before = pool_snap(&pool);
    assert_eq!(pool.free(&over), Err(FreeError::OverFreed { id: out[0] }));
    assert_eq!(pool_snap(&pool), before);
    pool.free(&many).unwrap();
    pool.free(&out).unwrap();
    assert_pool_whole(&pool);
}

/// 33 blocks, each listed `times` times in turn (`0, 1, ..., 32, 0, 1,
/// ...`) after as many `add_refs`: every one of them passes 254 listings
/// in one pass of the over-free check.
fn thirty_three_heavy_ids(times: usize) -> (BlockPool, Vec<BlockId>, Vec<BlockId>) {
    let pool = BlockPool::new(64, 4);
    let mut ids = Vec::new();
    pool.try_alloc(33, &mut ids).unwrap();
    let list: Vec<BlockId> = (0..times).flat_map(|_| ids.iter().copied()).collect();
    pool.add_refs(&list).unwrap();
    (pool, ids, list)
}

#[test]
fn thirty_three_ids_each_listed_past_254_times_are_checked_exactly() {
    let (pool, ids, list) = thirty_three_heavy_ids(300);
    // The 33rd id listed once more than its references: refused.
    let mut over = list.clone();
    over.extend([ids[32], ids[32]]);
    let before = pool_snap(&pool);
    assert_eq!(pool.free(&over), Err(FreeError::OverFreed { id: ids[32] }));
    assert_eq!(pool_snap(&pool), before);
    pool.free(&list).unwrap();
    pool.free(&ids).unwrap();
    assert_pool_whole(&pool);
}

/// 33 ids of one window, each listed 100,000 times: the 33rd goes to a
/// deferred pass (counted over the list so far, it took many minutes).
#[test]
fn free_of_thirty_three_ids_listed_many_times_is_linear() {
    let (pool, ids, list) = thirty_three_heavy_ids(100_000);
    pool.free(&list).unwrap();
    pool.free(&ids).unwrap();
    assert_pool_whole(&pool);
}

#[test]
#[ignore = "bound: BlockPool::free of n distinct ids costs n x (spans of 65,536 \
            indices they cover): one free of all 2^24 blocks of a pool takes 1.8 s in \
            release (was minutes), far longer in debug; linear would need memory in \
            proportion to the pool, which free does not allocate"]
fn free_of_every_block_of_a_large_pool_is_linear() {
    let n = 1 << 24;
    let pool = BlockPool::builder(n, 1)
        .prefix_cache(false)
        .build()
        .unwrap();
    let mut ids = Vec::new();
    pool.try_alloc(n, &mut ids).unwrap();
    pool.free(&ids).unwrap();
    assert_eq!(pool.free_blocks(), n);
}

#[test]
fn a_key_repeated_a_million_times_matches_one_block() {
    let pool = Arc::new(BlockPool::builder(8, 4).prefix_cache(true).build().unwrap());
    let k = keys(1..5, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(4).unwrap();
    assert_eq!(seq.publish(&k), 1);
    drop(seq);
    // Key 1 of the list would be the key of a block whose parent is key 0:
    // the same key again is another chain, and misses.
    let many = vec![k[0]; 1 << 20];
    let mut m = Sequence::new(Arc::clone(&pool));
    assert_eq!(m.try_match_prefix(&many), 1);
    assert_eq!(m.len(), 4);
    assert_eq!(m.blocks().len(), 1);
    assert_eq!(pool.ref_count(m.blocks()[0]), Some(1));
    drop(m);
    assert_eq!(pool.used_blocks(), 0);
}

#[test]
fn one_key_published_for_every_block_caches_one() {
    let n = 1 << 16;
    let pool = Arc::new(BlockPool::builder(n, 1).prefix_cache(true).build().unwrap());
    let k = keys(1..2, 1);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(n).unwrap();
    // First wins: the key stays with block 0, every other block uncached.
    assert_eq!(seq.publish(&vec![k[0]; n]), 1);
    assert_eq!(pool.cached_blocks(), 1);
    drop(seq);
    assert_eq!(pool.used_blocks(), 0);
}

#[test]
fn a_hybrid_match_over_a_long_prompt() {
    let n = 20_000;
    let pool = Arc::new(
        BlockPool::builder(2 * n + 8, 1)
            .prefix_cache(true)
            .build()
            .unwrap(),
    );
    let groups =
        KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 64 }]).unwrap();
    let base = keys(0..n as u32, 1);
    let gk = groups.keys(&base);
    let mut h = HybridSequence::new(Arc::clone(&pool), groups.clone());
    h.try_append(n).unwrap();
    assert_eq!(h.publish(&gk), Ok(2 * n));
    drop(h);
    let mut m = HybridSequence::new(Arc::clone(&pool), groups.clone());
    assert_eq!(m.try_match_prefix(&gk), Ok(n));
    // The sliding group holds the window of the next token: 63 blocks.
    assert_eq!(m.held_blocks(), n + 63);
    drop(m);
    assert_eq!(pool.used_blocks(), 0);
}

/// Blocks of `usize::MAX / 2` tokens, and keys that chain past the pool:
/// a sequence publishes `k0, k1`, they are evicted from the pool's front,
/// and another sequence takes `k1` as its first block and publishes
/// `k1, k2` (keys are any 32 bytes). A drain that merges the two shards'
/// records into one run of stores cuts it where its token count would pass
/// `usize::MAX`: every event's `token_count` is its keys times the block
/// size, and every key stored is in the events once.
#[test]
fn a_run_of_stored_keys_past_usize_max_tokens_is_cut() {
    let bs = usize::MAX / 2;
    let mut cut = 0;
    for salt in 0u8..40 {
        let pool = Arc::new(
            BlockPool::builder(2, bs)
                .shards(2)
                .prefix_cache(true)
                .kv_events(64)
                .build()
                .unwrap(),
        );
        let k = |i: u8| BlockHash([salt.wrapping_mul(7).wrapping_add(i.wrapping_mul(31)); 32]);
        let mut a = Sequence::new(Arc::clone(&pool));
        a.try_append(2 * bs).unwrap();
        assert_eq!(a.publish(&[k(0), k(1)]), 2);
        drop(a);
        let mut c = Sequence::new(Arc::clone(&pool));
        assert_eq!(c.try_match_prefix(&[k(1)]), 1);
        c.try_append(bs).unwrap();
        assert_eq!(c.publish(&[k(1), k(2)]), 1);
        let mut events = Vec::new();
        pool.drain_events(&mut events);
        let mut stored = Vec::new();
        // The last stored event's last key, and whether one more block
        // would have passed `usize::MAX` tokens in it.
        let mut last: Option<(BlockHash, bool)> = None;
        for event in &events {
            if let KvEvent::BlockStored {
                keys,
                parent,
                token_count,
                block_size,
                ..
            } = event
            {
                assert_eq!(
                    Some(*token_count),
                    keys.len().checked_mul(*block_size),
                    "{events:?}"
                );
                if let (Some(p), Some((key, full))) = (parent, last) {
                    if *p == key && full {
                        cut += 1;
                    }
                }
                last = keys
                    .last()
                    .map(|k| (*k, token_count.checked_add(*block_size).is_none()));
                stored.extend_from_slice(keys);
            }
        }
        stored.sort();
        let mut want = vec![k(0), k(1), k(2)];
        want.sort();
        assert_eq!(stored, want, "salt {salt}: {events:?}");
    }
    assert!(cut > 0, "no salt merged a run past usize::MAX tokens");
}

/// A window of one token over blocks of `2^63 + 1` tokens: the sequence
/// grows past `num_blocks * block_size` (the window gives its block back
/// and reuses it), and its slots past that, read in a batch or truncated
/// to, are the ones `slot` gives, with no overflow.
#[test]
fn slots_and_truncates_past_the_pool_in_a_window_of_one_token() {
    let bs = (1usize << 63) + 1;
    let pool = Arc::new(BlockPool::new(1, bs));
    let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 1 }]).unwrap();
    let mut h = HybridSequence::new(Arc::clone(&pool), groups);
    h.try_append(bs).unwrap();
    h.try_append(5).unwrap();
    assert_eq!(h.len(), bs + 5);
    let mut slots = Vec::new();
    h.extend_slots(0, bs..bs + 5, &mut slots).unwrap();
    let want: Vec<usize> = (bs..bs + 5).map(|p| h.slot(0, p).unwrap()).collect();
    assert_eq!(slots, want);
    assert_eq!(slots, [0, 1, 2, 3, 4]);
    // To the end of `usize`: the last block ends past it.
    h.try_append(usize::MAX - h.len()).unwrap();
    assert_eq!(h.len(), usize::MAX);
    slots.clear();
    h.extend_slots(0, usize::MAX - 3..usize::MAX, &mut slots)
        .unwrap();
    let want: Vec<usize> = (usize::MAX - 3..usize::MAX)
        .map(|p| h.slot(0, p).unwrap())
        .collect();
    assert_eq!(slots, want);
    // No token more fits a length: a reservation never fits, as an
    // append does, and changes nothing.
    let before = hybrid_snap(&h);
    // Beside the one block it holds, the pool has none.
    let never = ReserveError::NeverFits {
        requested: usize::MAX,
        capacity: 0,
    };
    assert_eq!(h.try_append(1), Err(never));
    assert_eq!(h.try_reserve(1, 0), Err(never));
    assert_eq!(h.reserve_blocking(1, 0, None), Err(never));
    assert_eq!(h.try_reserve(0, 0), Ok(()));
    assert_eq!(hybrid_snap(&h), before);
    h.truncate(bs + 2).unwrap();
    assert_eq!(h.len(), bs + 2);
    h.try_append(1).unwrap();
    assert_eq!(h.slot(0, bs + 2), Some(2));
    drop(h);
    // Tokens past `usize::MAX` whose blocks the pool has: refused all the
    // same (an append of them never fits), taking nothing.
    let bs = (1usize << 62) + 1;
    let pool = Arc::new(BlockPool::new(3, bs));
    let window = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 1 }]).unwrap();
    let mut h = HybridSequence::new(Arc::clone(&pool), window);
    for _ in 0..3 {
        h.try_append(bs).unwrap();
    }
    h.try_append(5).unwrap();
    let before = (hybrid_snap(&h), pool_snap(&pool));
    let never = ReserveError::NeverFits {
        requested: usize::MAX,
        capacity: 2,
    };
    assert!(matches!(
        h.try_append(2 * bs + 5),
        Err(ReserveError::NeverFits {
            requested: usize::MAX,
            ..
        })
    ));
    assert_eq!(h.try_reserve(2 * bs + 5, 0), Err(never));
    assert_eq!(h.reserve_blocking(2 * bs + 5, 0, None), Err(never));
    assert_eq!((hybrid_snap(&h), pool_snap(&pool)), before);
}

/// Sliding groups alone match null entries, not blocks, before their
/// window: with blocks of `2^62` tokens and a window of one token (which
/// at a block boundary reads no block held), 8 keys are more tokens than
/// a length can count. The match takes at most `usize::MAX / block_size`
/// of them (3), with no overflow; a window of two tokens needs the last
/// matched block cached, and with none cached the match takes nothing and
/// changes nothing.
#[test]
fn a_match_of_more_tokens_than_a_length_counts_is_capped() {
    let bs = 1usize << 62;
    let pool = Arc::new(BlockPool::new(2, bs));
    let base: Vec<BlockHash> = (0..8u8).map(|i| BlockHash([i; 32])).collect();
    let one = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 1 }]).unwrap();
    let mut h = HybridSequence::new(Arc::clone(&pool), one.clone());
    assert_eq!(h.try_match_prefix(&one.keys(&base)), Ok(3));
    assert_eq!((h.len(), h.held_blocks()), (3 * bs, 0));
    assert_eq!(h.blocks(0).unwrap(), [BlockId::NULL; 3]);
    let two = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 2 }]).unwrap();
    let mut h = HybridSequence::new(Arc::clone(&pool), two.clone());
    let before = hybrid_snap(&h);
    assert_eq!(h.try_match_prefix(&two.keys(&base)), Ok(0));
    assert_eq!(hybrid_snap(&h), before);
    assert_pool_whole(&pool);
}
