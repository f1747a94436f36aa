//! The prefix cache's API, one method and one bad input at a time:
//! `Sequence::try_match_prefix`, `Sequence::publish`, the pool's counts
//! (`cached_blocks`, `evictable_blocks`, `free_blocks`, `used_blocks`),
//! `reset_prefix_cache`, `prefix_stats`, eviction order on small cases,
//! what truncating into a cached block does to the next append, a match
//! into a reservation, and `BlockPool::peek_prefix`.

use std::sync::Arc;

use kvslots::{hash_blocks, BlockHash, BlockPool, PrefixStats, ReserveError, Sequence};

/// Tokens per block in these tests.
const BS: usize = 4;

/// The keys of `tokens`' full blocks under `salt`.
fn keys(salt: &[u8], tokens: &[u32]) -> Vec<BlockHash> {
    let mut out = Vec::new();
    hash_blocks(salt, tokens, BS, &mut out);
    out
}

/// A prompt of `blocks` full blocks, different for each `seed`.
fn prompt(seed: u32, blocks: usize) -> Vec<u32> {
    (0..(blocks * BS) as u32).map(|t| seed * 1000 + t).collect()
}

/// A pool of `n` blocks of `BS` tokens.
fn pool(n: usize) -> Arc<BlockPool> {
    Arc::new(BlockPool::new(n, BS))
}

/// A sequence holding `tokens` and publishing their full blocks' keys;
/// returns it and how many blocks it published.
fn published(pool: &Arc<BlockPool>, salt: &[u8], tokens: &[u32]) -> (Sequence, usize) {
    let mut seq = Sequence::new(Arc::clone(pool));
    seq.try_append(tokens.len()).unwrap();
    let n = seq.publish(&keys(salt, tokens));
    (seq, n)
}

/// The pool's counts: (free, used, cached, evictable).
fn counts(pool: &BlockPool) -> (usize, usize, usize, usize) {
    (
        pool.free_blocks(),
        pool.used_blocks(),
        pool.cached_blocks(),
        pool.evictable_blocks(),
    )
}

#[test]
fn a_published_prefix_is_matched_by_the_next_sequence() {
    let pool = pool(8);
    let tokens = prompt(1, 3);
    let (first, n) = published(&pool, b"", &tokens);
    assert_eq!(n, 3);
    let mut second = Sequence::new(Arc::clone(&pool));
    assert_eq!(second.try_match_prefix(&keys(b"", &tokens)), 3);
    assert_eq!(second.len(), 3 * BS);
    assert_eq!(second.blocks(), first.blocks());
    for &id in first.blocks() {
        assert_eq!(pool.ref_count(id), Some(2));
    }
    // Shared, referenced: no new capacity taken.
    assert_eq!(counts(&pool), (5, 3, 3, 0));
}

#[test]
fn a_released_prefix_stays_cached_and_counts_as_free() {
    let pool = pool(8);
    let tokens = prompt(1, 2);
    let (seq, _) = published(&pool, b"", &tokens);
    let blocks = seq.blocks().to_vec();
    drop(seq);
    assert_eq!(counts(&pool), (8, 0, 2, 2));
    let mut again = Sequence::new(Arc::clone(&pool));
    assert_eq!(again.try_match_prefix(&keys(b"", &tokens)), 2);
    assert_eq!(again.blocks(), blocks);
    // Revived: no longer evictable, and counted as used.
    assert_eq!(counts(&pool), (6, 2, 2, 0));
    drop(again);
    assert_eq!(counts(&pool), (8, 0, 2, 2));
}

#[test]
fn the_match_stops_at_the_first_miss() {
    let pool = pool(8);
    let tokens = prompt(1, 3);
    let (_seq, _) = published(&pool, b"", &tokens[..2 * BS]);
    let mut all = keys(b"", &tokens);
    let mut m = Sequence::new(Arc::clone(&pool));
    assert_eq!(m.try_match_prefix(&all), 2);
    // A miss in the middle: nothing after it is taken.
    all.swap(0, 2);
    let mut n = Sequence::new(Arc::clone(&pool));
    assert_eq!(n.try_match_prefix(&all), 0);
    assert!(n.is_empty() && n.blocks().is_empty());
}

#[test]
fn an_empty_hash_list_matches_and_publishes_nothing() {
    let pool = pool(4);
    let (mut seq, _) = published(&pool, b"", &prompt(1, 2));
    let before = (counts(&pool), pool.prefix_stats());
    assert_eq!(seq.publish(&[]), 0);
    let mut empty = Sequence::new(Arc::clone(&pool));
    assert_eq!(empty.try_match_prefix(&[]), 0);
    assert!(empty.is_empty() && empty.blocks().is_empty());
    assert_eq!((counts(&pool), pool.prefix_stats()), before);
}

#[test]
fn a_sequence_that_is_not_empty_matches_nothing_and_changes_nothing() {
    let pool = pool(8);
    let tokens = prompt(1, 2);
    let (_owner, _) = published(&pool, b"", &tokens);
    let keys = keys(b"", &tokens);
    // Holding tokens.
    let mut busy = Sequence::new(Arc::clone(&pool));
    busy.try_append(1).unwrap();
    let table = busy.blocks().to_vec();
    let before = (counts(&pool), pool.prefix_stats());
    assert_eq!(busy.try_match_prefix(&keys), 0);
    assert_eq!((busy.len(), busy.blocks()), (1, &table[..]));
    assert_eq!((counts(&pool), pool.prefix_stats()), before);
    // A sequence that matched once is not empty either.
    let mut matched = Sequence::new(Arc::clone(&pool));
    assert_eq!(matched.try_match_prefix(&keys[..1]), 1);
    assert_eq!(matched.try_match_prefix(&keys), 0);
    assert_eq!(matched.blocks().len(), 1);
}

#[test]
fn publish_covers_only_full_blocks() {
    let pool = pool(8);
    let tokens = prompt(1, 4);
    let keys = keys(b"", &tokens);
    let mut seq = Sequence::new(Arc::clone(&pool));
    // 2 full blocks and 1 token.
    seq.try_append(2 * BS + 1).unwrap();
    // More hashes than full blocks: the extra ones are ignored.
    assert_eq!(seq.publish(&keys), 2);
    assert_eq!(pool.cached_blocks(), 2);
    // Fewer hashes than full blocks: only those.
    seq.try_append(2 * BS - 1).unwrap(); // now 4 full blocks
    assert_eq!(seq.publish(&keys[..3]), 1);
    assert_eq!(seq.publish(&keys), 1);
    assert_eq!(pool.cached_blocks(), 4);
}

#[test]
fn a_duplicate_publish_changes_nothing_and_the_first_wins() {
    let pool = pool(8);
    let tokens = prompt(1, 2);
    let keys = keys(b"", &tokens);
    let (mut first, n) = published(&pool, b"", &tokens);
    assert_eq!(n, 2);
    // The same sequence again: already cached.
    assert_eq!(first.publish(&keys), 0);
    // Another sequence with the same tokens in its own blocks: the keys
    // stay with the first one's blocks, and its blocks stay uncached.
    let (second, n) = published(&pool, b"", &tokens);
    assert_eq!(n, 0);
    assert_eq!(pool.cached_blocks(), 2);
    let second_blocks = second.blocks().to_vec();
    drop(second);
    // Its blocks went back to the free list, not to the cache.
    assert_eq!(counts(&pool), (6, 2, 2, 0));
    let mut m = Sequence::new(Arc::clone(&pool));
    assert_eq!(m.try_match_prefix(&keys), 2);
    assert_eq!(m.blocks(), first.blocks());
    assert!(m.blocks().iter().all(|b| !second_blocks.contains(b)));
    // The same key twice in one list: the second block stays uncached.
    let twice = [keys[0], keys[0]];
    let mut third = Sequence::new(Arc::clone(&pool));
    third.try_append(2 * BS).unwrap();
    assert_eq!(third.publish(&twice), 0);
    let other = self::keys(b"x", &tokens);
    assert_eq!(third.publish(&[other[0], other[0]]), 1);
}

#[test]
fn salts_never_share_a_key() {
    let pool = pool(8);
    let tokens = prompt(1, 2);
    let (_a, n) = published(&pool, b"tenant-a", &tokens);
    assert_eq!(n, 2);
    let mut b = Sequence::new(Arc::clone(&pool));
    assert_eq!(b.try_match_prefix(&keys(b"tenant-b", &tokens)), 0);
    assert_eq!(b.try_match_prefix(&keys(b"tenant-a", &tokens)), 2);
    // The other tenant can publish the same tokens under its own keys.
    let (_c, n) = published(&pool, b"tenant-b", &tokens);
    assert_eq!(n, 2);
    assert_eq!(pool.cached_blocks(), 4);
}

#[test]
fn eviction_takes_uncached_blocks_first_then_the_least_recently_released() {
    // The reference's own small case (tests/prefix_replay.rs), on the pool.
    let pool = pool(5);
    let tokens = prompt(1, 3);
    let keys = keys(b"", &tokens);
    let (a, _) = published(&pool, b"", &tokens);
    let a_blocks = a.blocks().to_vec();
    drop(a); // last block first: a[2] is the least recently released
    assert_eq!(counts(&pool), (5, 0, 3, 3));

    let mut b = Sequence::new(Arc::clone(&pool));
    b.try_append(3 * BS).unwrap(); // 2 uncached, then a[2] evicted
    assert_eq!(pool.prefix_stats().evictions, 1);
    assert!(!b.blocks().contains(&a_blocks[0]) && !b.blocks().contains(&a_blocks[1]));
    assert!(b.blocks().contains(&a_blocks[2]));
    assert_eq!(counts(&pool), (2, 3, 2, 2));
    drop(b);

    let mut c = Sequence::new(Arc::clone(&pool));
    assert_eq!(c.try_match_prefix(&keys), 2);
    assert_eq!(c.blocks(), &a_blocks[..2]);
    assert_eq!(pool.evictable_blocks(), 0);
    drop(c); // a[1] then a[0]: a[1] is evicted first
    let mut d = Sequence::new(Arc::clone(&pool));
    d.try_append(4 * BS).unwrap(); // the 3 uncached blocks, then a[1]
    assert!(d.blocks().contains(&a_blocks[1]) && !d.blocks().contains(&a_blocks[0]));
    assert_eq!(pool.prefix_stats().evictions, 2);
    d.try_append(BS).unwrap(); // and a[0]
    assert!(d.blocks().contains(&a_blocks[0]));
    assert_eq!(counts(&pool), (0, 5, 0, 0));
}

#[test]
fn a_matched_block_is_not_evicted() {
    let pool = pool(2);
    let tokens = prompt(1, 2);
    let keys = keys(b"", &tokens);
    let (a, _) = published(&pool, b"", &tokens);
    let a_blocks = a.blocks().to_vec();
    drop(a);
    let mut b = Sequence::new(Arc::clone(&pool));
    assert_eq!(b.try_match_prefix(&keys[..1]), 1);
    // Block 1's key goes; block 0 is held and stays.
    b.try_append(BS).unwrap();
    assert_eq!(b.blocks(), a_blocks);
    assert_eq!(pool.cached_blocks(), 1);
    // The pool is all `b`'s own: a third block can never come.
    assert_eq!(
        b.try_append(BS),
        Err(ReserveError::NeverFits {
            requested: 1,
            capacity: 0
        })
    );
    assert_eq!(b.blocks(), a_blocks);
}

#[test]
fn refused_allocations_evict_nothing_and_change_nothing() {
    let pool = pool(3);
    let tokens = prompt(1, 2);
    let keys = keys(b"", &tokens);
    let (a, _) = published(&pool, b"", &tokens);
    drop(a);
    let mut held = Sequence::new(Arc::clone(&pool));
    held.try_append(1).unwrap(); // the one uncached block
    let before = (counts(&pool), pool.prefix_stats());
    assert_eq!(before.0, (2, 1, 2, 2));
    let mut ids = Vec::new();
    // Full: 3 wanted, 2 free (both evictable).
    assert!(matches!(
        pool.try_alloc(3, &mut ids),
        Err(ReserveError::Full {
            requested: 3,
            available: 2
        })
    ));
    // Full through the headroom.
    assert!(matches!(
        pool.try_alloc_with_headroom(1, 2, &mut ids),
        Err(ReserveError::Full { .. })
    ));
    // NeverFits.
    assert!(matches!(
        pool.try_alloc(4, &mut ids),
        Err(ReserveError::NeverFits { .. })
    ));
    // A sequence's append that does not fit.
    let mut seq = Sequence::new(Arc::clone(&pool));
    assert!(seq.try_append(3 * BS).is_err());
    assert!(seq.is_empty() && ids.is_empty());
    assert_eq!((counts(&pool), pool.prefix_stats()), before);
    // Closed.
    pool.close();
    assert_eq!(pool.try_alloc(1, &mut ids), Err(ReserveError::Closed));
    assert_eq!((counts(&pool), pool.prefix_stats()), before);
    // Everything is still cached: a referenced block would still match,
    // but reviving an evictable one needs capacity, which a closed pool
    // refuses.
    let mut m = Sequence::new(Arc::clone(&pool));
    assert_eq!(m.try_match_prefix(&keys), 0);
    assert_eq!(pool.cached_blocks(), 2);
}

#[test]
fn reviving_counts_against_capacity() {
    let pool = pool(2);
    let tokens = prompt(1, 1);
    let keys = keys(b"", &tokens);
    let (a, _) = published(&pool, b"", &tokens);
    drop(a);
    let mut other = Sequence::new(Arc::clone(&pool));
    other.try_append(1).unwrap(); // the uncached block
    assert_eq!(counts(&pool), (1, 1, 1, 1));
    let mut m = Sequence::new(Arc::clone(&pool));
    assert_eq!(m.try_match_prefix(&keys), 1);
    assert_eq!(counts(&pool), (0, 2, 1, 0));
    let mut ids = Vec::new();
    assert!(matches!(
        pool.try_alloc(1, &mut ids),
        Err(ReserveError::Full { available: 0, .. })
    ));
    // A full pool refuses a revival too, and the match stops there.
    drop(m);
    let mut filler = Vec::new();
    pool.try_alloc(1, &mut filler).unwrap(); // evicts the cached block
    assert_eq!(counts(&pool), (0, 2, 0, 0));
    assert_eq!(pool.prefix_stats().evictions, 1);
    let mut n = Sequence::new(Arc::clone(&pool));
    assert_eq!(n.try_match_prefix(&keys), 0);
    pool.free(&filler).unwrap();
}

/// A match reviving more evictable blocks than one admission ahead takes
/// (several runs), on one shard and on many, with the pool nearly full
/// besides: every block is revived, the counts and the peak are exact
/// after the match, the counts after its drop, and what went unused is
/// back (the free blocks are whole again).
#[test]
fn a_long_revival_admits_in_runs_and_gives_back_what_it_did_not_use() {
    for shards in [1, 4, 16] {
        let pool = Arc::new(BlockPool::with_shards(256, BS, shards));
        let tokens = prompt(7, 200);
        let keys = keys(b"", &tokens);
        let (a, n) = published(&pool, b"", &tokens);
        assert_eq!(n, 200);
        drop(a);
        let mut held = Vec::new();
        pool.try_alloc(40, &mut held).unwrap();
        assert_eq!(counts(&pool), (216, 40, 200, 200), "{shards} shards");
        let mut m = Sequence::new(Arc::clone(&pool));
        // One key more than cached: the match ends at a miss, with credits
        // admitted ahead for it that it does not use.
        let mut longer = keys.clone();
        longer.extend(self::keys(b"other", &prompt(8, 1)));
        assert_eq!(m.try_match_prefix(&longer), 200, "{shards} shards");
        assert_eq!(counts(&pool), (16, 240, 200, 0), "{shards} shards");
        // The revivals raise the high-water mark as allocations would.
        assert_eq!(pool.peak_used_blocks(), 240, "{shards} shards");
        let mut rest = Vec::new();
        pool.try_alloc(16, &mut rest).unwrap();
        assert!(pool.try_alloc(1, &mut Vec::new()).is_err());
        pool.free(&rest).unwrap();
        drop(m);
        pool.free(&held).unwrap();
        assert_eq!(counts(&pool), (256, 0, 200, 200), "{shards} shards");
    }
}

#[test]
fn a_referenced_block_matches_on_a_closed_pool() {
    let pool = pool(4);
    let tokens = prompt(1, 2);
    let (owner, _) = published(&pool, b"", &tokens);
    pool.close();
    let mut m = Sequence::new(Arc::clone(&pool));
    assert_eq!(m.try_match_prefix(&keys(b"", &tokens)), 2);
    assert_eq!(m.blocks(), owner.blocks());
}

#[test]
fn reset_drops_every_unreferenced_key() {
    let pool = pool(8);
    let (a, _) = published(&pool, b"", &prompt(1, 2));
    let (b, _) = published(&pool, b"", &prompt(2, 3));
    drop(a);
    assert_eq!(counts(&pool), (5, 3, 5, 2));
    // b's blocks are held: they keep their keys.
    assert_eq!(pool.reset_prefix_cache(), 2);
    assert_eq!(counts(&pool), (5, 3, 3, 0));
    assert_eq!(pool.reset_prefix_cache(), 0);
    let mut m = Sequence::new(Arc::clone(&pool));
    assert_eq!(m.try_match_prefix(&keys(b"", &prompt(1, 2))), 0);
    assert_eq!(m.try_match_prefix(&keys(b"", &prompt(2, 3))), 3);
    drop(m);
    drop(b);
    // Also on a closed pool, so that a draining server can drop them.
    pool.close();
    assert_eq!(pool.reset_prefix_cache(), 3);
    assert_eq!(counts(&pool), (8, 0, 0, 0));
    // Resetting is not an eviction.
    assert_eq!(pool.prefix_stats().evictions, 0);
}

#[test]
fn stats_count_queries_hits_and_evictions() {
    let pool = pool(3);
    assert_eq!(pool.prefix_stats(), PrefixStats::default());
    let tokens = prompt(1, 2);
    let keys = keys(b"", &tokens);
    let mut s = Sequence::new(Arc::clone(&pool));
    assert_eq!(s.try_match_prefix(&keys), 0);
    s.try_append(2 * BS).unwrap();
    s.publish(&keys);
    drop(s);
    let mut t = Sequence::new(Arc::clone(&pool));
    assert_eq!(t.try_match_prefix(&keys[..1]), 1);
    t.try_append(2 * BS).unwrap(); // 1 uncached + 1 evicted
    assert_eq!(
        pool.prefix_stats(),
        PrefixStats {
            queried_blocks: 3,
            hit_blocks: 1,
            evictions: 1
        }
    );
}

#[test]
fn truncating_into_a_cached_block_held_alone_drops_its_key() {
    let pool = pool(4);
    let tokens = prompt(1, 2);
    let keys = keys(b"", &tokens);
    let (mut seq, _) = published(&pool, b"", &tokens);
    let blocks = seq.blocks().to_vec();
    seq.truncate(2 * BS - 1); // into the second, cached block
    assert_eq!(pool.cached_blocks(), 1);
    // No copy needed: the block is ours alone and no key can match it.
    assert_eq!(seq.try_append(1).unwrap(), 2 * BS - 1..2 * BS);
    assert_eq!(seq.blocks(), blocks);
    let mut m = Sequence::new(Arc::clone(&pool));
    assert_eq!(m.try_match_prefix(&keys), 1);
}

#[test]
fn truncating_into_a_shared_cached_block_copies_on_write() {
    let pool = pool(4);
    let tokens = prompt(1, 2);
    let keys = keys(b"", &tokens);
    let (mut seq, _) = published(&pool, b"", &tokens);
    let mut reader = Sequence::new(Arc::clone(&pool));
    assert_eq!(reader.try_match_prefix(&keys), 2);
    seq.truncate(2 * BS - 1);
    // Shared: it keeps its key, and the append copies it.
    assert_eq!(pool.cached_blocks(), 2);
    let (range, copy) = seq.try_append_cow(1).unwrap();
    assert_eq!(range, 2 * BS - 1..2 * BS);
    let copy = copy.expect("a shared cached tail is copied");
    assert_eq!((copy.src, copy.tokens), (reader.blocks()[1], BS - 1));
    assert_ne!(seq.blocks()[1], reader.blocks()[1]);
    // The matcher's block still holds the key.
    drop(reader);
    let mut again = Sequence::new(Arc::clone(&pool));
    assert_eq!(again.try_match_prefix(&keys), 2);
}

#[test]
fn a_cached_tail_still_needs_a_copy_after_the_other_holder_left() {
    let pool = pool(4);
    let tokens = prompt(1, 1);
    let keys = keys(b"", &tokens);
    let (mut seq, _) = published(&pool, b"", &tokens);
    let reader = {
        let mut r = Sequence::new(Arc::clone(&pool));
        assert_eq!(r.try_match_prefix(&keys), 1);
        r
    };
    seq.truncate(BS - 1);
    drop(reader);
    // Still cached (so a matcher could take it any moment): copy.
    let (_, copy) = seq.try_append_cow(1).unwrap();
    assert!(copy.is_some());
}

#[test]
#[should_panic(expected = "try_append_cow")]
fn a_plain_append_into_a_shared_cached_tail_panics() {
    let pool = pool(4);
    let tokens = prompt(1, 1);
    let keys = keys(b"", &tokens);
    let (mut seq, _) = published(&pool, b"", &tokens);
    let mut reader = Sequence::new(Arc::clone(&pool));
    assert_eq!(reader.try_match_prefix(&keys), 1);
    seq.truncate(BS - 1);
    let _ = seq.try_append(1);
}

#[test]
fn a_fork_shares_cached_blocks_and_either_side_can_publish() {
    let pool = pool(8);
    let tokens = prompt(1, 2);
    let keys = keys(b"", &tokens);
    let mut parent = Sequence::new(Arc::clone(&pool));
    parent.try_append(2 * BS).unwrap();
    let (mut child, copy) = parent.try_fork().unwrap();
    assert!(copy.is_none());
    assert_eq!(child.publish(&keys), 2);
    // The parent's blocks are the same blocks: already cached.
    assert_eq!(parent.publish(&keys), 0);
    drop(parent);
    drop(child);
    assert_eq!(counts(&pool), (8, 0, 2, 2));
}

#[test]
fn the_pool_is_whole_after_mixed_use() {
    let pool = pool(6);
    let mut live = Vec::new();
    for round in 0..50u32 {
        let tokens = prompt(round % 4, 1 + (round % 3) as usize);
        let keys = keys(b"", &tokens);
        let mut s = Sequence::new(Arc::clone(&pool));
        let k = s.try_match_prefix(&keys);
        if s.try_append(tokens.len() - k * BS).is_ok() {
            s.publish(&keys);
            live.push(s);
        }
        if live.len() > 2 || round % 5 == 0 {
            live.remove(0);
        }
        let (free, used, cached, evictable) = counts(&pool);
        assert_eq!(free + used, 6);
        assert!(evictable <= cached && evictable <= free);
    }
    live.clear();
    let (free, used, cached, evictable) = counts(&pool);
    assert_eq!((free, used, cached), (6, 0, evictable));
    pool.reset_prefix_cache();
    let mut ids = Vec::new();
    pool.try_alloc(6, &mut ids).unwrap();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 6);
}

/// A decode that publishes after every token caches each block once, as
/// it fills; a truncate into a published block (held alone) drops its
/// key, and the next publish caches the new content there.
#[test]
fn a_decode_publishing_every_step_caches_each_block_as_it_fills() {
    let pool = pool(64);
    let tokens = prompt(3, 20);
    let keys = keys(b"", &tokens);
    let mut seq = Sequence::with_capacity(Arc::clone(&pool), tokens.len());
    for t in 1..=tokens.len() {
        seq.try_append(1).unwrap();
        let want = usize::from(t % BS == 0);
        assert_eq!(seq.publish(&keys), want, "step {t}");
        assert_eq!(pool.cached_blocks(), t / BS, "step {t}");
    }
    // Back into block 12 (sole holder: its key goes; blocks 13.. go back
    // to the pool, cached), then other tokens.
    seq.truncate(12 * BS + 1);
    assert_eq!((pool.cached_blocks(), pool.evictable_blocks()), (19, 7));
    let mut other = tokens[..12 * BS + 1].to_vec();
    other.extend((0..(BS - 1) as u32).map(|t| 777_000 + t));
    let other_keys = self::keys(b"", &other);
    seq.try_append(BS - 1).unwrap();
    assert_eq!(seq.publish(&other_keys), 1);
    let mut m = Sequence::new(Arc::clone(&pool));
    assert_eq!(m.try_match_prefix(&other_keys), 13);
    assert_eq!(m.blocks(), &seq.blocks()[..13]);
}

/// A block whose key another block held when it was offered is offered
/// again by the next publish: once the other block is evicted, it caches.
#[test]
fn a_block_that_lost_its_key_to_another_is_offered_again() {
    let pool = pool(4);
    let tokens = prompt(4, 2);
    let keys = keys(b"", &tokens);
    let (first, n) = published(&pool, b"", &tokens);
    assert_eq!(n, 2);
    let (mut second, n) = published(&pool, b"", &tokens);
    assert_eq!(n, 0);
    // The first's blocks are evicted by an allocation that needs them.
    drop(first);
    let mut ids = Vec::new();
    pool.try_alloc(2, &mut ids).unwrap();
    assert_eq!(pool.cached_blocks(), 0);
    assert_eq!(second.publish(&keys), 2);
    let mut m = Sequence::new(Arc::clone(&pool));
    assert_eq!(m.try_match_prefix(&keys), 2);
    assert_eq!(m.blocks(), second.blocks());
    drop(m);
    pool.free(&ids).unwrap();
}

/// A match longer than the filter of taken blocks a small pool uses
/// (32,768 bits), in a pool of 65,536 blocks whose ids that filter would
/// fold onto each other: a chain of 40,000 distinct keys matches whole,
/// and a key repeated at its end, equal to one taken before the filter was
/// built or after, ends the match there, its second reference given back.
#[test]
fn a_long_match_in_a_large_pool_takes_every_block_and_stops_at_a_repeat() {
    const N: usize = 40_000;
    let pool = Arc::new(BlockPool::new(65_536, 1));
    let mut keys = Vec::new();
    hash_blocks(b"", &(0..N as u32).collect::<Vec<u32>>(), 1, &mut keys);
    let mut first = Sequence::new(Arc::clone(&pool));
    first.try_append(N).unwrap();
    assert_eq!(first.publish(&keys), N);
    let blocks = first.blocks().to_vec();

    let mut whole = Sequence::new(Arc::clone(&pool));
    assert_eq!(whole.try_match_prefix(&keys), N);
    assert_eq!(whole.blocks(), &blocks[..]);
    drop(whole);

    // Repeats of a key matched directly (7) and of one matched past the
    // filter's start (35,000), at position N - 1.
    for j in [7, 35_000] {
        let mut query = keys[..N - 1].to_vec();
        query.push(keys[j]);
        let mut m = Sequence::new(Arc::clone(&pool));
        assert_eq!(m.try_match_prefix(&query), N - 1, "repeat of {j}");
        assert_eq!(m.blocks(), &blocks[..N - 1]);
        assert_eq!(pool.ref_count(blocks[j]), Some(2), "repeat of {j}");
        assert_eq!(pool.ref_count(blocks[N - 1]), Some(1));
        drop(m);
        assert_eq!(pool.ref_count(blocks[j]), Some(1));
    }
    assert_eq!(pool.used_blocks(), N);
    drop(first);
    assert_eq!((pool.used_blocks(), pool.evictable_blocks()), (0, N));
}

#[test]
fn a_peek_counts_the_cached_prefix_and_takes_nothing() {
    let pool = pool(8);
    let tokens = prompt(1, 3);
    let (first, _) = published(&pool, b"", &tokens[..2 * BS]);
    drop(first);
    let all = keys(b"", &tokens);
    let before = (counts(&pool), pool.prefix_stats());
    assert_eq!(pool.peek_prefix(&all), 2);
    assert_eq!(pool.peek_prefix(&all[..1]), 1);
    assert_eq!(pool.peek_prefix(&all[2..]), 0);
    assert_eq!(pool.peek_prefix(&[]), 0);
    assert_eq!(pool.peek_prefix(&keys(b"other", &tokens)), 0);
    assert_eq!((counts(&pool), pool.prefix_stats()), before);
    let mut second = Sequence::new(Arc::clone(&pool));
    assert_eq!(second.try_match_prefix(&all), 2);
    // Held blocks peek as evictable ones do.
    assert_eq!(pool.peek_prefix(&all), 2);
}

#[test]
fn a_peek_leaves_the_eviction_order_alone() {
    // Two cached blocks, the first released first: an allocation evicts
    // it. A match and a release of it would move it behind the second; a
    // peek does not.
    let pool = pool(2);
    let (a, _) = published(&pool, b"a", &prompt(1, 1));
    let (b, _) = published(&pool, b"b", &prompt(2, 1));
    let (ka, kb) = (keys(b"a", &prompt(1, 1)), keys(b"b", &prompt(2, 1)));
    drop(a);
    drop(b);
    assert_eq!(pool.peek_prefix(&ka), 1);
    let mut s = Sequence::new(Arc::clone(&pool));
    s.try_append(BS).unwrap();
    assert_eq!((pool.peek_prefix(&ka), pool.peek_prefix(&kb)), (0, 1));
}

#[test]
fn a_peek_stops_where_a_match_does_at_a_repeated_key() {
    let pool = pool(8);
    let tokens = prompt(3, 2);
    let (_held, _) = published(&pool, b"", &tokens);
    let k = keys(b"", &tokens);
    let repeated = [k[0], k[1], k[0], k[1]];
    let mut m = Sequence::new(Arc::clone(&pool));
    assert_eq!(pool.peek_prefix(&repeated), 2);
    assert_eq!(m.try_match_prefix(&repeated), 2);
}

#[test]
fn a_peek_ignores_the_capacity_that_stops_a_match() {
    // Every block held but one evictable cached block: a closed pool
    // refuses its revival, a peek still counts it.
    let pool = pool(2);
    let tokens = prompt(4, 1);
    let (a, _) = published(&pool, b"", &tokens);
    drop(a);
    pool.close();
    let k = keys(b"", &tokens);
    assert_eq!(pool.peek_prefix(&k), 1);
    assert_eq!(Sequence::new(Arc::clone(&pool)).try_match_prefix(&k), 0);
}

#[test]
fn a_pool_without_a_prefix_cache_peeks_nothing() {
    let pool = Arc::new(
        BlockPool::builder(4, BS)
            .prefix_cache(false)
            .build()
            .unwrap(),
    );
    let tokens = prompt(5, 2);
    let (_seq, n) = published(&pool, b"", &tokens);
    assert_eq!(n, 0);
    assert_eq!(pool.peek_prefix(&keys(b"", &tokens)), 0);
}

#[test]
fn a_long_peek_in_a_large_pool_counts_every_block() {
    // Past the 32 blocks compared directly, the filter of ids seen: a
    // match of 3,000 blocks, and a list that repeats its first key after
    // them.
    let pool = Arc::new(BlockPool::new(40_000, 1));
    let tokens: Vec<u32> = (0..3_000).collect();
    let mut k = Vec::new();
    hash_blocks(b"", &tokens, 1, &mut k);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(tokens.len()).unwrap();
    assert_eq!(seq.publish(&k), 3_000);
    assert_eq!(pool.peek_prefix(&k), 3_000);
    let mut repeated = k.clone();
    repeated.push(k[0]);
    repeated.push(k[1]);
    assert_eq!(pool.peek_prefix(&repeated), 3_000);
    assert_eq!(
        Sequence::new(Arc::clone(&pool)).try_match_prefix(&repeated),
        3_000
    );
}

mod into_a_reservation {
    //! `try_match_prefix` on a sequence that holds only reserved blocks:
    //! the matched blocks take the place of the first reserved ones, a
    //! reserved block pays for each revival, and the capacity stays.

    use std::sync::atomic::{AtomicBool, Ordering};
    use std::thread;
    use std::time::Duration;

    use super::*;

    #[test]
    fn shared_blocks_replace_reserved_ones_and_the_capacity_stays() {
        let pool = pool(12);
        let tokens = prompt(1, 3);
        let (owner, _) = published(&pool, b"", &tokens);
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_reserve(5 * BS, 0).unwrap();
        let reserved = seq.blocks().to_vec();
        assert_eq!(pool.used_blocks(), 3 + 5);
        assert_eq!(seq.try_match_prefix(&keys(b"", &tokens)), 3);
        // The matched blocks first, then the first 2 reserved blocks.
        assert_eq!(&seq.blocks()[..3], owner.blocks());
        assert_eq!(&seq.blocks()[3..], &reserved[..2]);
        assert_eq!((seq.len(), seq.capacity()), (3 * BS, 5 * BS));
        // The 3 reserved blocks the match replaced went back.
        assert_eq!(pool.used_blocks(), 3 + 2);
        // The prompt's other 2 blocks need no allocation, even with the
        // pool full.
        let mut rest = Vec::new();
        pool.try_alloc(pool.free_blocks(), &mut rest).unwrap();
        seq.try_append(2 * BS).unwrap();
        pool.free(&rest).unwrap();
        drop((seq, owner));
        assert_eq!(pool.used_blocks(), 0);
    }

    #[test]
    fn a_match_longer_than_the_reservation_keeps_no_reserved_block() {
        let pool = pool(12);
        let tokens = prompt(2, 4);
        let (owner, _) = published(&pool, b"", &tokens);
        drop(owner); // 4 evictable blocks
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_reserve(BS, 0).unwrap();
        assert_eq!(counts(&pool), (11, 1, 4, 4));
        // The first revival takes the reserved block's place; the other 3
        // are admitted as for an empty sequence.
        assert_eq!(seq.try_match_prefix(&keys(b"", &tokens)), 4);
        assert_eq!((seq.len(), seq.capacity()), (4 * BS, 4 * BS));
        assert_eq!(counts(&pool), (8, 4, 4, 0));
        assert_eq!(pool.prefix_stats().hit_blocks, 4);
        drop(seq);
        assert_eq!(counts(&pool), (12, 0, 4, 4));
    }

    #[test]
    fn a_miss_changes_only_the_statistics() {
        let pool = pool(8);
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_reserve(3 * BS, 0).unwrap();
        let table = seq.blocks().to_vec();
        let before = counts(&pool);
        assert_eq!(seq.try_match_prefix(&keys(b"", &prompt(3, 2))), 0);
        assert_eq!((seq.len(), seq.blocks()), (0, &table[..]));
        assert_eq!(counts(&pool), before);
        // A pool without a prefix cache matches nothing either.
        let plain = Arc::new(
            BlockPool::builder(8, BS)
                .prefix_cache(false)
                .build()
                .unwrap(),
        );
        let mut seq = Sequence::new(Arc::clone(&plain));
        seq.try_reserve(2 * BS, 0).unwrap();
        let table = seq.blocks().to_vec();
        assert_eq!(seq.try_match_prefix(&keys(b"", &prompt(3, 2))), 0);
        assert_eq!(seq.blocks(), &table[..]);
        assert_eq!(plain.used_blocks(), 2);
    }

    /// Evictable blocks are revived in the reserved blocks' places while
    /// every free block is owed to a queued waiter: an empty sequence's
    /// match stops before them, a reserved one's takes them all.
    #[test]
    fn a_reservation_pays_for_revivals_behind_queued_waiters() {
        let pool = pool(8);
        let tokens = prompt(4, 3);
        let (owner, _) = published(&pool, b"", &tokens);
        drop(owner); // 3 evictable, 5 free
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_reserve(4 * BS, 0).unwrap(); // 4 reserved, 4 free (3 cached)
        let waiting = AtomicBool::new(false);
        thread::scope(|s| {
            let waiter = s.spawn(|| {
                let mut big = Sequence::new(Arc::clone(&pool));
                waiting.store(true, Ordering::SeqCst);
                // A timeout, so that a failed assertion below (which
                // keeps the blocks from it) ends the test.
                big.reserve_blocking(8 * BS, 0, Some(Duration::from_secs(30)))
                    .unwrap();
                big.blocks().len()
            });
            // Until the waiter is queued (it asks for more than is free).
            while pool.waiters() == 0 {
                assert!(!waiter.is_finished(), "the waiter did not queue");
                thread::yield_now();
            }
            let mut empty = Sequence::new(Arc::clone(&pool));
            assert_eq!(empty.try_match_prefix(&keys(b"", &tokens)), 0);
            assert_eq!(seq.try_match_prefix(&keys(b"", &tokens)), 3);
            assert_eq!((seq.len(), seq.capacity()), (3 * BS, 4 * BS));
            assert_eq!(pool.used_blocks(), 4);
            assert_eq!(pool.evictable_blocks(), 0);
            drop(seq);
            assert_eq!(waiter.join().unwrap(), 8);
        });
        assert!(waiting.load(Ordering::SeqCst));
        assert_eq!(pool.used_blocks(), 0);
    }

    #[test]
    fn a_sequence_with_tokens_or_a_copy_source_still_matches_nothing() {
        let pool = pool(12);
        let tokens = prompt(5, 2);
        let (_owner, _) = published(&pool, b"", &tokens);
        let keys = keys(b"", &tokens);
        // Tokens in a reserved block.
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_reserve(2 * BS, 0).unwrap();
        seq.try_append(1).unwrap();
        let before = (counts(&pool), seq.blocks().to_vec());
        assert_eq!(seq.try_match_prefix(&keys), 0);
        assert_eq!((counts(&pool), seq.blocks().to_vec()), before);
        // Truncated to nothing: the table is empty, and matches as new.
        seq.truncate(0);
        assert!(seq.blocks().is_empty());
        assert_eq!(seq.try_match_prefix(&keys), 2);
    }
}
