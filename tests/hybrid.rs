//! `KvGroups`, `GroupKeys` and `HybridSequence`, one rule at a time: one
//! admission across groups, sliding windows giving blocks back (and their
//! reuse), truncate, fork, fences and waiting, prefix matching across
//! groups, and every bad input's typed error with the state unchanged.
//! `tests/hybrid_model.rs` runs random scripts against a reference model.

use std::sync::Arc;
use std::time::Duration;

use kvslots::{
    hash_blocks, BlockAllocator, BlockCopy, BlockHash, BlockId, BlockPool, FreeError, GroupKeys,
    HybridError, HybridSequence, KvGroup, KvGroups, KvGroupsError, PositionError, ReserveError,
};

/// Tokens per block in these tests.
const BS: usize = 4;

fn pool(n: usize) -> Arc<BlockPool> {
    Arc::new(BlockPool::new(n, BS))
}

fn sliding(window_tokens: usize) -> KvGroup {
    KvGroup::SlidingWindow { window_tokens }
}

fn groups(kinds: &[KvGroup]) -> KvGroups {
    KvGroups::new(kinds.iter().copied()).unwrap()
}

/// The content keys of the full blocks of `tokens`.
fn base_keys(tokens: &[u32]) -> Vec<BlockHash> {
    let mut out = Vec::new();
    hash_blocks(b"", tokens, BS, &mut out);
    out
}

/// Every table, for comparing a sequence before and after a refused call.
fn tables(seq: &HybridSequence) -> Vec<Vec<BlockId>> {
    (0..seq.groups().len())
        .map(|g| seq.blocks(g).unwrap().to_vec())
        .collect()
}

// ---------------------------------------------------------------------------
// KvGroups and GroupKeys
// ---------------------------------------------------------------------------

#[test]
fn bad_group_lists_are_refused() {
    assert_eq!(KvGroups::new([]), Err(KvGroupsError::Empty));
    assert_eq!(
        KvGroups::new([KvGroup::Full, sliding(8), sliding(0)]),
        Err(KvGroupsError::ZeroWindow { group: 2 })
    );
    assert_eq!(
        KvGroups::new([chunked(8), KvGroup::Full, chunked(0)]),
        Err(KvGroupsError::ZeroChunk { group: 2 })
    );
    assert_eq!(
        KvGroups::new(std::iter::repeat(KvGroup::Full).take(KvGroups::MAX_GROUPS + 1)),
        Err(KvGroupsError::TooManyGroups {
            max: KvGroups::MAX_GROUPS
        })
    );
    assert_eq!(
        KvGroups::new(std::iter::repeat(KvGroup::Full).take(KvGroups::MAX_GROUPS))
            .unwrap()
            .len(),
        KvGroups::MAX_GROUPS
    );
    // Each error says what is wrong.
    assert!(KvGroupsError::ZeroWindow { group: 2 }
        .to_string()
        .contains("group 2"));
    assert!(KvGroupsError::ZeroChunk { group: 3 }
        .to_string()
        .contains("group 3: chunked local attention in chunks of 0 tokens"));
}

#[test]
fn first_needed_block_follows_the_chunk() {
    let c = chunked(10);
    // Position `len` reads `len / 10 * 10..=len`, its chunk's positions.
    for len in 0..60usize {
        let first_read = len / 10 * 10;
        assert_eq!(c.first_needed_block(len, BS), first_read / BS, "len {len}");
    }
    // A chunk of one token reads the token itself, as a window of one.
    for len in [0, 7, 8, 9, usize::MAX - 1, usize::MAX] {
        assert_eq!(
            chunked(1).first_needed_block(len, BS),
            sliding(1).first_needed_block(len, BS)
        );
    }
    // The last position reads the last chunk, with no overflow.
    assert_eq!(
        chunked(usize::MAX).first_needed_block(usize::MAX, 1),
        usize::MAX
    );
    assert_eq!(chunked(usize::MAX).first_needed_block(usize::MAX - 1, 1), 0);
    assert_eq!(chunked(4).first_needed_block(usize::MAX, 1), usize::MAX - 3);
    // A chunk of no token (which `KvGroups` refuses) counts as one.
    assert_eq!(
        chunked(0).first_needed_block(9, BS),
        chunked(1).first_needed_block(9, BS)
    );
}

#[test]
fn a_chunked_group_keeps_its_chunk_and_truncates_within_it() {
    // Chunks of 8 tokens over blocks of 4: the table keeps the blocks of
    // the next token's chunk.
    let pool = Arc::new(BlockPool::new(32, BS));
    let groups = KvGroups::new([chunked(8), KvGroup::Full]).unwrap();
    let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    seq.try_append(11).unwrap(); // tokens 0..11: blocks 0, 1 and 2 of chunk 0 and 1
                                 // The next append's first token (11) is in chunk 1 (8..16): blocks
                                 // 0 and 1 go back.
    seq.try_append(6).unwrap(); // 17 tokens
    assert_eq!(seq.null_blocks(0), Some(2));
    assert_eq!(seq.held_blocks(), 3 + 5);
    // Position 16 is in chunk 2 (16..24), and truncating to 15 or less
    // needs chunk 1 (blocks 2 and 3), which it holds; to 7 or less, chunk
    // 0, which it gave back: refused, down to the chunk's start.
    assert_eq!(
        seq.truncate(7),
        Err(HybridError::TruncateOutsideWindow { len: 7, min_len: 8 })
    );
    assert_eq!(seq.len(), 17);
    seq.truncate(8).unwrap();
    assert_eq!(seq.len(), 8);
    seq.truncate(0).unwrap();
    drop(seq);
    assert_eq!(pool.used_blocks(), 0);
}

#[test]
fn chunked_and_sliding_groups_of_one_size_have_their_own_keys() {
    let groups = KvGroups::new([chunked(16), sliding(16)]).unwrap();
    let base = BlockHash([5; 32]);
    assert_ne!(groups.key(0, &base), groups.key(1, &base));
}

#[test]
fn a_match_in_a_chunked_group_needs_the_hits_chunk_alone() {
    // Llama 4's layout in small: chunked local attention in chunks of 8
    // tokens beside full attention, blocks of 4.
    let pool = Arc::new(BlockPool::new(64, BS));
    let groups = KvGroups::new([chunked(8), KvGroup::Full]).unwrap();
    let prompt: Vec<u32> = (0..24).collect();
    let mut base = Vec::new();
    hash_blocks(b"", &prompt, BS, &mut base); // 6 blocks
    let keys = groups.keys(&base);
    let mut first = HybridSequence::new(Arc::clone(&pool), groups.clone());
    first.try_append(24).unwrap();
    assert_eq!(first.publish(&keys), Ok(6 + 6));
    drop(first);
    let mut second = HybridSequence::new(Arc::clone(&pool), groups.clone());
    assert_eq!(pool.peek_hybrid_prefix(&keys), 6);
    assert_eq!(second.try_match_prefix(&keys), Ok(6));
    // Position 24 starts chunk 3: the chunked group holds nothing.
    assert_eq!(second.blocks(0).unwrap(), [BlockId::NULL; 6]);
    assert_eq!(second.held_blocks(), 6);
    drop(second);
    // A prompt sharing 20 tokens: the full group has 5 blocks, and
    // position 20 (chunk 2, 16..24) reads block 4 of the chunked group.
    let mut other = Vec::new();
    hash_blocks(b"", &[&prompt[..20], &[99; 4]].concat(), BS, &mut other);
    let other = groups.keys(&other);
    assert_eq!(pool.peek_hybrid_prefix(&other), 5);
    let mut third = HybridSequence::new(Arc::clone(&pool), groups);
    assert_eq!(third.try_match_prefix(&other), Ok(5));
    assert_eq!(third.null_blocks(0), Some(4));
    assert_eq!(third.held_blocks(), 1 + 5);
}

fn chunked(chunk_tokens: usize) -> KvGroup {
    KvGroup::ChunkedLocal { chunk_tokens }
}

#[test]
fn first_needed_block_follows_the_window() {
    let w = sliding(10);
    // Position `len` reads `len - 9..=len`.
    for len in 0..60usize {
        let first_read = (len + 1).saturating_sub(10);
        assert_eq!(w.first_needed_block(len, BS), first_read / BS, "len {len}");
        assert_eq!(KvGroup::Full.first_needed_block(len, BS), 0);
    }
    // A window of 1 reads only the token itself.
    assert_eq!(sliding(1).first_needed_block(8, BS), 2);
    // Position `usize::MAX` with a window of `usize::MAX` tokens reads
    // `1..=usize::MAX`.
    assert_eq!(sliding(usize::MAX).first_needed_block(usize::MAX, 1), 1);
    assert_eq!(sliding(usize::MAX).first_needed_block(usize::MAX - 1, 1), 0);
    // At the last position, where `len + 1` does not fit: exact.
    assert_eq!(sliding(1).first_needed_block(usize::MAX, 1), usize::MAX);
    assert_eq!(sliding(2).first_needed_block(usize::MAX, 1), usize::MAX - 1);
    assert_eq!(sliding(1).first_needed_block(usize::MAX, 2), usize::MAX / 2);
    assert_eq!(
        sliding(3).first_needed_block(usize::MAX, 2),
        usize::MAX / 2 - 1
    );
    assert_eq!(
        sliding(1).first_needed_block(usize::MAX - 1, 1),
        usize::MAX - 1
    );
    // A window of no token (which `KvGroups` refuses) reads nothing.
    assert_eq!(sliding(0).first_needed_block(usize::MAX, 1), usize::MAX);
    assert_eq!(
        sliding(0).first_needed_block(usize::MAX, 2),
        1 << (usize::BITS - 1)
    );
    assert_eq!(sliding(0).first_needed_block(usize::MAX, 3), usize::MAX / 3);
    assert_eq!(sliding(0).first_needed_block(7, 4), 2);
}

#[test]
fn a_hybrid_length_past_usize_max_never_fits_and_changes_nothing() {
    // A window gives its blocks back, so one block of 2^63 tokens holds a
    // sliding group's every window: only the length bounds it.
    let half = 1usize << (usize::BITS - 1);
    let pool = Arc::new(BlockPool::new(1, half));
    let mut seq = HybridSequence::new(Arc::clone(&pool), groups(&[sliding(1)]));
    assert_eq!(seq.try_append(half).unwrap(), 0..half);
    let before = (
        seq.len(),
        tables(&seq),
        seq.held_blocks(),
        pool.used_blocks(),
    );
    // The capacity: the pool's one block, which the window would give back.
    let never: Result<std::ops::Range<usize>, _> = Err(ReserveError::NeverFits {
        requested: usize::MAX,
        capacity: 1,
    });
    for n in [half, usize::MAX] {
        assert_eq!(seq.try_append(n), never);
        assert_eq!(seq.try_append_cow(n, &mut Vec::new()), never);
        // Fenced, the window's block is not reused: `usize::MAX` more
        // tokens ask for 2 new blocks, which never fit first.
        let fenced = if n == half {
            never.clone()
        } else {
            Err(ReserveError::NeverFits {
                requested: 2,
                capacity: 1,
            })
        };
        assert_eq!(seq.try_append_fenced(n, 1, &mut Vec::new()), fenced);
        assert_eq!(
            (
                seq.len(),
                tables(&seq),
                seq.held_blocks(),
                pool.used_blocks()
            ),
            before
        );
    }
    // Up to the last position it still appends, moving its one block on.
    assert_eq!(seq.try_append(half - 1).unwrap(), half..usize::MAX);
    assert_eq!(
        (seq.len(), seq.held_blocks(), pool.used_blocks()),
        (usize::MAX, 1, 1)
    );
    // Two entries of 2^63 tokens, the first null: more than usize holds.
    assert_eq!(seq.capacity(), usize::MAX);
    assert_eq!(seq.null_blocks(0), Some(1));
    assert_eq!(
        seq.try_append(1),
        Err(ReserveError::NeverFits {
            requested: usize::MAX,
            capacity: 0
        })
    );
    pool.close();
    assert_eq!(seq.try_append(1), Err(ReserveError::Closed));
    drop(seq);
    assert_eq!(pool.free_blocks(), 1);
}

#[test]
fn group_keys_differ_by_group_and_kind_and_extend_as_one() {
    let g = groups(&[KvGroup::Full, sliding(8), KvGroup::Full]);
    let tokens: Vec<u32> = (0..20).collect();
    let base = base_keys(&tokens);
    let keys = g.keys(&base);
    assert_eq!(keys.blocks(), 5);
    let mut all: Vec<BlockHash> = Vec::new();
    for group in 0..3 {
        let k = keys.group(group).unwrap();
        assert_eq!(k.len(), 5);
        for (i, key) in k.iter().enumerate() {
            assert_eq!(Some(*key), g.key(group, &base[i]));
            assert!(!base.contains(key));
        }
        all.extend_from_slice(k);
    }
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 15, "a key is in one group only");
    assert_eq!(keys.group(3), None);
    assert_eq!(g.key(3, &base[0]), None);
    // Block by block, as decode fills them, gives the same keys.
    let mut step = GroupKeys::new(&g);
    for b in &base {
        step.push(b);
    }
    assert_eq!(step, keys);
    step.truncate(2);
    assert_eq!(step.blocks(), 2);
    assert_eq!(step.group(1).unwrap(), &keys.group(1).unwrap()[..2]);
    step.clear();
    assert_eq!(step.blocks(), 0);
    // Another window, or the same kinds in another order, gives other keys.
    let other = groups(&[KvGroup::Full, sliding(16), KvGroup::Full]);
    assert_ne!(other.keys(&base).group(1), keys.group(1));
    assert_eq!(other.keys(&base).group(0), keys.group(0));
}

// ---------------------------------------------------------------------------
// One admission across groups
// ---------------------------------------------------------------------------

#[test]
fn an_append_takes_every_groups_blocks_or_none() {
    let pool = pool(9);
    let g = groups(&[KvGroup::Full, sliding(64), KvGroup::Full]);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g);
    assert_eq!(seq.try_append(6).unwrap(), 0..6); // 2 blocks a group
    let mut hog = Vec::new();
    pool.try_alloc(2, &mut hog).unwrap(); // another holder's 2: 1 free
    let before = tables(&seq);
    // 3 more tokens: one block a group, 3 of which 1 is free.
    assert_eq!(
        seq.try_append(3),
        Err(ReserveError::Full {
            requested: 3,
            available: 1
        })
    );
    assert_eq!((seq.len(), tables(&seq)), (6, before.clone()));
    assert_eq!(pool.used_blocks(), 8);
    // More than the pool has beside the sequence's own 6 blocks, across
    // groups: never fits.
    assert_eq!(
        seq.try_append(20),
        Err(ReserveError::NeverFits {
            requested: 15,
            capacity: 3
        })
    );
    assert_eq!(tables(&seq), before);
    // Tokens that fit in the blocks held take nothing.
    assert_eq!(seq.try_append(2).unwrap(), 6..8);
    assert_eq!(pool.used_blocks(), 8);
    pool.free(&hog).unwrap();
    // A closed pool refuses, and the sequence still drains.
    pool.close();
    assert_eq!(seq.try_append(1), Err(ReserveError::Closed));
    assert_eq!(seq.truncate(0), Ok(6));
    assert_eq!(pool.used_blocks(), 0);
}

/// A thread waiting in `pool`'s queue for `n` blocks, queued when this
/// returns; joined, it gives the blocks it was granted.
fn queued_waiter(
    pool: &Arc<BlockPool>,
    n: usize,
) -> std::thread::JoinHandle<Result<Vec<BlockId>, ReserveError>> {
    let waiter = std::thread::spawn({
        let pool = Arc::clone(pool);
        move || {
            let mut ids = Vec::new();
            pool.alloc_blocking(n, &mut ids, None).map(|()| ids)
        }
    });
    while pool.waiters() == 0 {
        std::thread::yield_now();
    }
    waiter
}

#[test]
fn the_first_append_is_a_new_admission_and_later_ones_are_growth() {
    // A queued waiter holds back the head's request from new admissions,
    // not from growth.
    let pool = pool(6);
    let g = groups(&[KvGroup::Full, KvGroup::Full]);
    let mut running = HybridSequence::new(Arc::clone(&pool), g.clone());
    running.try_append(4).unwrap(); // 2 blocks
    let mut held = Vec::new();
    pool.try_alloc(2, &mut held).unwrap(); // 2 free
    let waiter = queued_waiter(&pool, 3);
    let mut fresh = HybridSequence::new(Arc::clone(&pool), g);
    assert!(
        fresh.try_append(1).is_err(),
        "a new admission waits its turn"
    );
    assert_eq!(running.try_append(4).unwrap(), 4..8, "growth does not");
    pool.free(&held).unwrap();
    drop(running);
    let granted = waiter.join().unwrap().unwrap();
    pool.free(&granted).unwrap();
    assert_eq!(pool.used_blocks(), 0);
}

/// A request whose prompt hit the cache is new work until it holds a
/// block beyond its match, as for a `Sequence`: its first append is a new
/// admission, refused with `BehindWaiters` (and nothing changed) while
/// the free blocks are owed to a queued waiter.
#[test]
fn a_prefix_hit_appends_as_a_new_admission() {
    let pool = pool(12);
    let g = groups(&[KvGroup::Full, sliding(4)]);
    // A running request holds a published 1-block system prompt (a block
    // a group).
    let keys = g.keys(&base_keys(&[0, 1, 2, 3]));
    let mut running = HybridSequence::new(Arc::clone(&pool), g.clone());
    running.try_append(4).unwrap();
    assert_eq!(running.publish(&keys), Ok(2));
    let mut hog = Vec::new();
    pool.try_alloc(5, &mut hog).unwrap(); // 5 free
    let waiter = queued_waiter(&pool, 6);
    let mut newcomer = HybridSequence::new(Arc::clone(&pool), g);
    assert_eq!(newcomer.try_match_prefix(&keys), Ok(1));
    let before = tables(&newcomer);
    assert!(matches!(
        newcomer.try_append(4),
        Err(ReserveError::BehindWaiters { .. })
    ));
    assert_eq!((newcomer.len(), tables(&newcomer)), (4, before));
    drop((newcomer, running));
    pool.free(&hog).unwrap();
    let granted = waiter.join().unwrap().unwrap();
    pool.free(&granted).unwrap();
    assert_eq!(pool.used_blocks(), 0);
}

/// A request admitted by a reservation (a grant after a wait, a check-only
/// admission's first block) whose match takes the place of every reserved
/// block was admitted all the same: its appends are growth, not refused
/// behind the waiters queued after its admission. The same match with no
/// reservation is new work.
#[test]
fn a_match_into_a_reservation_appends_as_growth() {
    let pool = pool(12);
    let g = groups(&[KvGroup::Full, sliding(4)]);
    let keys = g.keys(&base_keys(&[0, 1, 2, 3]));
    let mut running = HybridSequence::new(Arc::clone(&pool), g.clone());
    running.try_append(4).unwrap();
    assert_eq!(running.publish(&keys), Ok(2));
    // Admitted first: a block a group.
    let mut admitted = HybridSequence::new(Arc::clone(&pool), g.clone());
    admitted.try_reserve(4, 0).unwrap();
    let mut hog = Vec::new();
    pool.try_alloc(5, &mut hog).unwrap(); // 3 free
    let waiter = queued_waiter(&pool, 6);
    // The cached blocks take the reserved ones' places (5 free: the
    // waiter still waits).
    assert_eq!(admitted.try_match_prefix(&keys), Ok(1));
    assert_eq!((admitted.len(), admitted.capacity()), (4, 4));
    assert_eq!(pool.free_blocks(), 5);
    assert_eq!(
        admitted.try_append(4),
        Ok(4..8),
        "growth, not a new admission"
    );
    assert_eq!(pool.free_blocks(), 3);
    let mut newcomer = HybridSequence::new(Arc::clone(&pool), g);
    assert_eq!(newcomer.try_match_prefix(&keys), Ok(1));
    let before = tables(&newcomer);
    assert!(matches!(
        newcomer.try_append(4),
        Err(ReserveError::BehindWaiters { .. })
    ));
    assert_eq!((newcomer.len(), tables(&newcomer)), (4, before));
    drop((newcomer, admitted, running));
    pool.free(&hog).unwrap();
    let granted = waiter.join().unwrap().unwrap();
    pool.free(&granted).unwrap();
    assert_eq!(pool.used_blocks(), 0);
}

/// `NeverFits` counts the blocks in the tables, not the copy-on-write
/// sources kept for the caller's copies: they go back once the copies are
/// made, and the append refused meanwhile is `Full`, then fits.
#[test]
fn kept_copy_sources_make_an_append_full_not_never_fits() {
    let pool = pool(6);
    let g = groups(&[KvGroup::Full, KvGroup::Full]);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g);
    seq.try_append(8).unwrap(); // 2 blocks a group
    let child = seq.try_fork(&mut Vec::new()).unwrap();
    seq.truncate(6).unwrap(); // into the shared second blocks
    let mut copies = Vec::new();
    seq.try_append_cow(1, &mut copies).unwrap(); // a copy a group
    drop(child);
    assert_eq!(pool.used_blocks(), 6); // 4 in the tables, 2 sources kept
    let before = tables(&seq);
    assert!(matches!(seq.try_append(2), Err(ReserveError::Full { .. })));
    assert_eq!((seq.len(), tables(&seq)), (7, before));
    assert_eq!(seq.retire_copy_source(1), 2);
    assert_eq!(pool.complete(1), 2);
    assert_eq!(seq.try_append(2).unwrap(), 7..9);
}

// ---------------------------------------------------------------------------
// Sliding windows
// ---------------------------------------------------------------------------

#[test]
fn a_window_gives_back_the_blocks_wholly_before_it() {
    let pool = pool(64);
    let g = groups(&[sliding(10), KvGroup::Full]);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g);
    seq.try_append(9).unwrap();
    assert_eq!(seq.null_blocks(0), Some(0));
    // Decode one token at a time: after each append at `old_len`, the
    // sliding group holds the blocks from `(old_len - 9) / 4` on.
    for old_len in 9..60 {
        seq.try_append(1).unwrap();
        let first = (old_len + 1 - 10) / BS;
        assert_eq!(seq.null_blocks(0), Some(first), "after position {old_len}");
        let table = seq.blocks(0).unwrap();
        assert!(table[..first].iter().all(|id| id.is_null()));
        assert!(table[first..].iter().all(|id| !id.is_null()));
        assert_eq!(seq.blocks(1).unwrap().len(), (old_len + 1).div_ceil(BS));
        // At most 4 blocks of 4 hold a 10-token window and the new token.
        assert!(table.len() - first <= 4);
        assert_eq!(
            pool.used_blocks(),
            seq.held_blocks(),
            "every held block is in use"
        );
    }
    drop(seq);
    assert_eq!(pool.free_blocks(), 64);
}

#[test]
fn window_blocks_held_alone_are_reused_and_the_pool_is_not_asked() {
    // A pool with exactly the blocks a decode needs: the sliding group
    // never asks for one, the full group takes the last free ones.
    let pool = pool(6);
    let g = groups(&[sliding(4), KvGroup::Full]);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g);
    seq.try_append(8).unwrap(); // 2 + 2
    let mut hog = Vec::new();
    pool.try_alloc(1, &mut hog).unwrap(); // 1 free
    let first = seq.blocks(0).unwrap()[0];
    // Position 8 reads 5..=8: block 0 of the sliding group holds one of
    // the two new blocks, the pool gives the other.
    seq.try_append(4).unwrap();
    assert_eq!(seq.blocks(0).unwrap()[0], BlockId::NULL);
    let new = [seq.blocks(0).unwrap()[2], seq.blocks(1).unwrap()[2]];
    assert!(new.contains(&first));
    assert_eq!(pool.free_blocks(), 0);
    assert_eq!(pool.ref_count(first), Some(1));
    // Without a free block for the full group, the whole append is
    // refused, and the window keeps the block it would have reused.
    let before = tables(&seq);
    assert_eq!(
        seq.try_append(1),
        Err(ReserveError::Full {
            requested: 1,
            available: 0
        })
    );
    assert_eq!(tables(&seq), before);
    // A sequence of sliding groups only decodes forever in a full pool.
    pool.free(&hog).unwrap();
    drop(seq);
    let g = groups(&[sliding(4), sliding(2)]);
    let mut local = HybridSequence::new(Arc::clone(&pool), g);
    local.try_append(8).unwrap();
    let mut rest = Vec::new();
    pool.try_alloc(pool.free_blocks(), &mut rest).unwrap();
    for _ in 0..100 {
        local.try_append(1).unwrap();
        assert!(local.held_blocks() <= 4);
    }
    pool.free(&rest).unwrap();
}

#[test]
fn shared_or_cached_window_blocks_go_back_instead_of_being_reused() {
    let pool = pool(32);
    let g = groups(&[sliding(4)]);
    let mut parent = HybridSequence::new(Arc::clone(&pool), g.clone());
    parent.try_append(8).unwrap();
    let shared = parent.blocks(0).unwrap()[0];
    let child = parent.try_fork(&mut Vec::new()).unwrap();
    assert_eq!(pool.ref_count(shared), Some(2));
    // Block 0 leaves the parent's window but the child holds it: it is
    // given back (one reference), not reused.
    parent.try_append(1).unwrap();
    assert_eq!(pool.ref_count(shared), Some(1));
    assert!(!parent.blocks(0).unwrap().contains(&shared));
    assert_eq!(child.blocks(0).unwrap()[0], shared);
    drop((parent, child));

    // A published block leaves the window: it stays cached (evictable),
    // never written.
    let tokens: Vec<u32> = (0..8).collect();
    let keys = g.keys(&base_keys(&tokens));
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    seq.try_append(8).unwrap();
    assert_eq!(seq.publish(&keys), Ok(2));
    let cached = seq.blocks(0).unwrap()[0];
    seq.try_append(1).unwrap();
    assert_eq!(pool.ref_count(cached), Some(0));
    assert_eq!(pool.evictable_blocks(), 1);
    assert!(!seq.blocks(0).unwrap().contains(&cached));
}

#[test]
fn a_fenced_append_retires_the_window_until_the_step_completes() {
    let pool = pool(4);
    let g = groups(&[sliding(4)]);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g);
    seq.try_append(8).unwrap();
    let old = seq.blocks(0).unwrap()[0];
    let mut copies = Vec::new();
    assert_eq!(seq.try_append_fenced(4, 9, &mut copies).unwrap(), 8..12);
    assert!(copies.is_empty());
    // Not reused: a new block, and block 0 waits for step 9.
    assert!(!seq.blocks(0).unwrap().contains(&old));
    assert_eq!(pool.ref_count(old), Some(1));
    assert_eq!(pool.pending_release_blocks(), 1);
    assert_eq!(pool.used_blocks(), 3);
    assert_eq!(pool.complete(9), 1);
    assert_eq!(pool.ref_count(old), Some(0));
    // Refused, it retires nothing.
    let mut hog = Vec::new();
    pool.try_alloc(2, &mut hog).unwrap();
    assert!(seq.try_append_fenced(4, 10, &mut copies).is_err());
    assert_eq!(pool.pending_release_blocks(), 0);
    assert_eq!(seq.null_blocks(0), Some(1));
}

/// A raw `BlockPool::free` of each of `ids` is refused with
/// `HeldBySequence`, naming it, and changes nothing.
fn assert_raw_free_refused(pool: &BlockPool, ids: &[BlockId]) {
    for &id in ids.iter().filter(|id| !id.is_null()) {
        let (used, refs) = (pool.used_blocks(), pool.ref_count(id));
        assert_eq!(
            pool.free(&[id]),
            Err(FreeError::HeldBySequence { id }),
            "a raw free of a hybrid sequence's {id}"
        );
        assert_eq!((pool.used_blocks(), pool.ref_count(id)), (used, refs));
    }
}

/// Every block in `seq`'s tables, null entries left out.
fn held(seq: &HybridSequence) -> Vec<BlockId> {
    tables(seq)
        .into_iter()
        .flatten()
        .filter(|id| !id.is_null())
        .collect()
}

#[test]
fn a_raw_free_of_a_hybrid_sequences_block_is_refused_on_every_path() {
    let pool = pool(32);
    let g = groups(&[KvGroup::Full, sliding(4)]);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    // Taken by one admission for both groups.
    seq.try_append(8).unwrap();
    assert_raw_free_refused(&pool, &held(&seq));
    // Position 8 reads 5..=8: the sliding group's block 0, held alone,
    // moves to a new entry (its reference, and the sequence flag, with
    // it).
    let reused = seq.blocks(1).unwrap()[0];
    seq.try_append(4).unwrap();
    assert!(held(&seq).contains(&reused));
    assert_raw_free_refused(&pool, &held(&seq));
    // Reserved, not yet written: at once, blocking, and waiting.
    seq.try_reserve(4, 0).unwrap();
    assert_raw_free_refused(&pool, &held(&seq));
    seq.reserve_blocking(8, 0, None).unwrap();
    // 20 tokens' blocks: 5 in the full group, 4 in the sliding one (its
    // block 0 given back).
    assert_eq!(seq.held_blocks(), 5 + 4);
    assert_raw_free_refused(&pool, &held(&seq));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(seq.reserve(12, 0)).unwrap();
    assert_eq!(seq.held_blocks(), 6 + 5);
    assert_raw_free_refused(&pool, &held(&seq));
    seq.shrink_to_fit();
    // Shared with a fork, and the fork's private tail.
    let mut copies = Vec::new();
    seq.try_append(1).unwrap(); // 13 tokens: partly filled tails
    let child = seq.try_fork(&mut copies).unwrap();
    assert_eq!(copies.len(), 2);
    assert_raw_free_refused(&pool, &held(&seq));
    assert_raw_free_refused(&pool, &held(&child));
    drop(child);
    // A window's block retired under a fence: still the sequence's until
    // the step completes, then back in the pool.
    seq.try_append(4).unwrap(); // 17 tokens
    let leaving = seq.blocks(1).unwrap()[2];
    // Position 17 reads 14..=17: block 2 leaves the window.
    seq.try_append_fenced(1, 7, &mut copies).unwrap();
    assert_eq!(seq.blocks(1).unwrap()[2], BlockId::NULL);
    assert_eq!(pool.pending_release_blocks(), 1);
    assert_raw_free_refused(&pool, &[leaving]);
    assert_eq!(pool.complete(7), 1);
    assert_eq!(
        pool.free(&[leaving]),
        Err(FreeError::NotAllocated { id: leaving })
    );
    // Published, dropped, matched by another sequence: revived blocks.
    let tokens: Vec<u32> = (0..18).collect();
    let keys = g.keys(&base_keys(&tokens));
    assert_eq!(seq.publish(&keys), Ok(4 + 1));
    drop(seq);
    let mut matched = HybridSequence::new(Arc::clone(&pool), g);
    assert_eq!(matched.try_match_prefix(&keys), Ok(4));
    assert_raw_free_refused(&pool, &held(&matched));
    drop(matched);
    assert_eq!(pool.used_blocks(), 0);
}

// ---------------------------------------------------------------------------
// Truncate, fork, copy-on-write
// ---------------------------------------------------------------------------

#[test]
fn a_truncate_into_given_back_blocks_is_refused_and_changes_nothing() {
    let pool = pool(32);
    let g = groups(&[KvGroup::Full, sliding(6), sliding(3)]);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g);
    seq.try_append(20).unwrap();
    seq.try_append(5).unwrap(); // at 20: group 1 keeps (21-6)/4 = 3.., group 2 (21-3)/4 = 4..
    assert_eq!(seq.null_blocks(1), Some(3));
    assert_eq!(seq.null_blocks(2), Some(4));
    // Group 1 needs len >= 3*4 + 6 - 1 = 17, group 2 len >= 16 + 2 = 18.
    let before = (tables(&seq), seq.len(), pool.used_blocks());
    for len in [1, 5, 16, 17] {
        assert_eq!(
            seq.truncate(len),
            Err(HybridError::TruncateOutsideWindow { len, min_len: 18 })
        );
        assert_eq!(
            seq.truncate_fenced(len, 1),
            Err(HybridError::TruncateOutsideWindow { len, min_len: 18 })
        );
        assert_eq!((tables(&seq), seq.len(), pool.used_blocks()), before);
    }
    assert_eq!(pool.pending_release_blocks(), 0);
    // The last append's drafts roll back fine; so does everything.
    assert_eq!(seq.truncate(18), Ok(3 * 2));
    assert_eq!(seq.truncate(18), Ok(0));
    assert_eq!(seq.len(), 18);
    assert_eq!(seq.truncate(0), Ok(5 + 2 + 1));
    assert_eq!(pool.used_blocks(), 0);
    assert_eq!(seq.null_blocks(1), Some(0));
}

#[test]
fn a_fork_shares_the_window_and_keeps_the_null_entries() {
    let pool = pool(64);
    let g = groups(&[sliding(5), KvGroup::Full]);
    let mut parent = HybridSequence::new(Arc::clone(&pool), g);
    parent.try_append(16).unwrap();
    parent.try_append(6).unwrap(); // at 16: (17-5)/4 = 3 null
    let mut copies = Vec::new();
    let child = parent.try_fork(&mut copies).unwrap();
    assert_eq!(child.len(), 22);
    assert_eq!(child.null_blocks(0), Some(3));
    let (p, c) = (parent.blocks(0).unwrap(), child.blocks(0).unwrap());
    assert_eq!(&c[..5], &p[..5]);
    assert_eq!(
        copies,
        vec![
            BlockCopy {
                src: p[5],
                dst: c[5],
                tokens: 2
            },
            BlockCopy {
                src: parent.blocks(1).unwrap()[5],
                dst: child.blocks(1).unwrap()[5],
                tokens: 2
            },
        ]
    );
    for &id in &p[3..5] {
        assert_eq!(pool.ref_count(id), Some(2));
    }
    // The private tails fit whole or not at all.
    let mut hog = Vec::new();
    pool.try_alloc(pool.free_blocks() - 1, &mut hog).unwrap();
    let before = pool.used_blocks();
    assert!(parent.try_fork(&mut copies).is_err());
    assert_eq!((pool.used_blocks(), copies.len()), (before, 2));
    pool.free(&hog).unwrap();
    drop((parent, child));
    assert_eq!(pool.used_blocks(), 0);
}

#[test]
fn a_truncate_into_a_shared_tail_copies_it_in_every_group() {
    let pool = pool(32);
    let g = groups(&[KvGroup::Full, sliding(8)]);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g);
    seq.try_append(8).unwrap();
    let child = seq.try_fork(&mut Vec::new()).unwrap();
    seq.truncate(6).unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = seq.try_append(1);
    }));
    assert!(result.is_err(), "try_append panics where a copy is needed");
    assert_eq!(seq.len(), 6, "and changes nothing first");
    let mut copies = Vec::new();
    assert_eq!(seq.try_append_cow(1, &mut copies).unwrap(), 6..7);
    assert_eq!(copies.len(), 2);
    for (g, c) in copies.iter().enumerate() {
        assert_eq!(c.src, child.blocks(g).unwrap()[1]);
        assert_eq!(c.dst, seq.blocks(g).unwrap()[1]);
        assert_eq!(c.tokens, 2);
    }
    // The sources are kept for the copies until the next append.
    assert_eq!(pool.ref_count(copies[0].src), Some(2));
    drop(child);
    assert_eq!(pool.ref_count(copies[0].src), Some(1));
    seq.try_append(1).unwrap();
    assert_eq!(pool.ref_count(copies[0].src), Some(0));
    // Or handed to a fence.
    let mut seq2 = HybridSequence::new(Arc::clone(&pool), seq.groups().clone());
    seq2.try_append(4).unwrap();
    let child2 = seq2.try_fork(&mut Vec::new()).unwrap();
    seq2.truncate(2).unwrap();
    copies.clear();
    seq2.try_append_cow(1, &mut copies).unwrap();
    assert_eq!(seq2.retire_copy_source(3), 2);
    assert_eq!(seq2.retire_copy_source(3), 0);
    drop(child2);
    assert_eq!(pool.complete(3), 2);
}

#[test]
fn retire_gives_every_group_back_when_the_fence_completes() {
    let pool = pool(16);
    let g = groups(&[sliding(4), KvGroup::Full]);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g);
    seq.try_append(12).unwrap();
    seq.try_append(1).unwrap();
    let held = seq.held_blocks();
    assert_eq!(seq.retire(5), held);
    assert_eq!(pool.used_blocks(), held);
    assert_eq!(pool.complete(5), held);
    assert_eq!(pool.used_blocks(), 0);
}

#[test]
fn reservations_are_one_admission_and_shrink_gives_back() {
    let pool = pool(10);
    let g = groups(&[KvGroup::Full, sliding(4)]);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g);
    assert_eq!(seq.try_reserve(0, 100), Ok(()));
    // 16 tokens: 4 blocks a group, 8 of 10, with 2 left: fits exactly.
    assert_eq!(
        seq.try_reserve(16, 3),
        Err(ReserveError::NeverFits {
            requested: 8,
            capacity: 10
        })
    );
    let mut hog = Vec::new();
    pool.try_alloc(1, &mut hog).unwrap();
    assert_eq!(
        seq.try_reserve(16, 2),
        Err(ReserveError::Full {
            requested: 8,
            available: 9
        })
    );
    pool.free(&hog).unwrap();
    assert_eq!(pool.used_blocks(), 0);
    seq.try_reserve(16, 2).unwrap();
    assert_eq!((seq.len(), seq.capacity(), pool.used_blocks()), (0, 16, 8));
    seq.try_append(9).unwrap();
    assert_eq!(pool.used_blocks(), 8, "the appends take nothing");
    assert_eq!(seq.shrink_to_fit(), 2);
    assert_eq!(seq.shrink_to_fit(), 0);
    assert_eq!(pool.used_blocks(), 6);
    assert!(matches!(
        seq.try_reserve(usize::MAX, 0),
        Err(ReserveError::NeverFits { .. })
    ));
}

#[test]
fn reserve_blocking_waits_for_every_group_at_once() {
    let pool = pool(4);
    let g = groups(&[KvGroup::Full, KvGroup::Full]);
    let mut first = HybridSequence::new(Arc::clone(&pool), g.clone());
    first.try_append(8).unwrap(); // all 4 blocks
    let waiter = std::thread::spawn({
        let pool = Arc::clone(&pool);
        let g = g.clone();
        move || {
            let mut seq = HybridSequence::new(pool, g);
            seq.reserve_blocking(8, 0, None).map(|()| seq.held_blocks())
        }
    });
    while pool.waiters() == 0 {
        std::thread::yield_now();
    }
    drop(first);
    assert_eq!(waiter.join().unwrap(), Ok(4));
    let mut timed = HybridSequence::new(Arc::clone(&pool), g);
    let mut hog = Vec::new();
    pool.try_alloc(3, &mut hog).unwrap();
    assert_eq!(
        timed.reserve_blocking(4, 0, Some(Duration::from_millis(1))),
        Err(ReserveError::Full {
            requested: 2,
            available: 1
        })
    );
    assert_eq!(timed.held_blocks(), 0);
}

#[test]
fn async_reserve_resolves_once_every_group_fits_and_cancels_cleanly() {
    let pool = pool(4);
    let g = groups(&[KvGroup::Full, sliding(4)]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut hog = Vec::new();
    pool.try_alloc(3, &mut hog).unwrap();
    let mut seq = HybridSequence::new(Arc::clone(&pool), g);
    // Cancelled while waiting: nothing taken, nothing changed.
    let timed_out = runtime.block_on(async {
        tokio::time::timeout(Duration::from_millis(5), seq.reserve(4, 0)).await
    });
    assert!(timed_out.is_err());
    assert_eq!(
        (seq.held_blocks(), pool.used_blocks(), pool.waiters()),
        (0, 3, 0)
    );
    pool.free(&hog).unwrap();
    runtime.block_on(seq.reserve(4, 0)).unwrap();
    assert_eq!(seq.held_blocks(), 2);
}

// ---------------------------------------------------------------------------
// Slot mapping
// ---------------------------------------------------------------------------

#[test]
fn slot_mapping_refuses_bad_groups_positions_and_given_back_blocks() {
    let pool = pool(16);
    let g = groups(&[sliding(3), KvGroup::Full]);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g);
    seq.try_append(10).unwrap();
    seq.try_append(2).unwrap(); // at 10: (11-3)/4 = 2 null
    let mut out = vec![7];
    assert_eq!(
        seq.extend_slots(2, 0..1, &mut out),
        Err(HybridError::NoSuchGroup {
            group: 2,
            groups: 2
        })
    );
    assert_eq!(
        seq.extend_slots(1, 10..13, &mut out),
        Err(HybridError::Position(PositionError {
            position: 12,
            len: 12
        }))
    );
    assert_eq!(
        seq.extend_slots(0, 7..12, &mut out),
        Err(HybridError::OutsideWindow {
            group: 0,
            position: 7,
            first_held: 8
        })
    );
    assert_eq!(out, vec![7], "a refused mapping writes nothing");
    assert_eq!(seq.extend_slots(0, 3..3, &mut out), Ok(()));
    seq.extend_slots(0, 8..12, &mut out).unwrap();
    seq.extend_slots(1, 0..12, &mut out).unwrap();
    assert_eq!(out.len(), 1 + 4 + 12);
    assert_eq!(seq.slot(0, 7), None);
    assert_eq!(seq.slot(0, 12), None);
    assert_eq!(seq.slot(5, 0), None);
    assert_eq!(seq.blocks(2), None);
    assert_eq!(seq.null_blocks(2), None);
    for e in [
        HybridError::NoSuchGroup {
            group: 2,
            groups: 2,
        },
        HybridError::OutsideWindow {
            group: 0,
            position: 7,
            first_held: 8,
        },
        HybridError::TruncateOutsideWindow { len: 1, min_len: 9 },
        HybridError::OtherGroups,
    ] {
        assert!(!e.to_string().is_empty());
    }
}

// ---------------------------------------------------------------------------
// Prefix caching across groups
// ---------------------------------------------------------------------------

/// A request of `tokens` prefilled and published, then dropped: its blocks
/// stay cached.
fn cache(pool: &Arc<BlockPool>, g: &KvGroups, tokens: &[u32]) -> Vec<Vec<BlockId>> {
    let mut seq = HybridSequence::new(Arc::clone(pool), g.clone());
    seq.try_append(tokens.len()).unwrap();
    seq.publish(&g.keys(&base_keys(tokens))).unwrap();
    tables(&seq)
}

#[test]
fn a_full_group_needs_every_block_and_a_sliding_group_only_its_window() {
    let pool = pool(64);
    let g = groups(&[sliding(6), KvGroup::Full]);
    let tokens: Vec<u32> = (0..33).collect(); // 8 full blocks
    let published = cache(&pool, &g, &tokens);
    let keys = g.keys(&base_keys(&tokens));
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    assert_eq!(seq.try_match_prefix(&keys), Ok(8));
    assert_eq!(seq.len(), 32);
    // Position 32 reads 27..=32: the sliding group holds blocks 6 and 7.
    let t0 = seq.blocks(0).unwrap();
    assert_eq!(&t0[..6], &[BlockId::NULL; 6]);
    assert_eq!(&t0[6..], &published[0][6..8]);
    assert_eq!(seq.blocks(1).unwrap(), &published[1][..8]);
    assert_eq!(seq.held_blocks(), 2 + 8);
    // The blocks outside the window were not taken: still evictable.
    assert_eq!(pool.ref_count(published[0][0]), Some(0));
    // The rest of the prompt appends from there.
    assert_eq!(seq.try_append(1).unwrap(), 32..33);
    // A match on a sequence that holds anything does nothing.
    assert_eq!(seq.try_match_prefix(&keys), Ok(0));
    assert_eq!(seq.len(), 33);
}

/// Drops the key of block `block` of group `group` under `keys` (cached,
/// no holder): a plain sequence matches it alone and truncates into it.
fn uncache(pool: &Arc<BlockPool>, keys: &GroupKeys, group: usize, block: usize) {
    let key = keys.group(group).unwrap()[block];
    let mut s = kvslots::Sequence::new(Arc::clone(pool));
    assert_eq!(s.try_match_prefix(&[key]), 1);
    s.truncate(1);
}

/// Whether block `block` of group `group` is cached under `keys`.
fn is_cached(pool: &Arc<BlockPool>, keys: &GroupKeys, group: usize, block: usize) -> bool {
    let key = keys.group(group).unwrap()[block];
    kvslots::Sequence::new(Arc::clone(pool)).try_match_prefix(&[key]) == 1
}

#[test]
fn a_missing_window_block_moves_the_hit_back_to_a_window_that_is_cached() {
    // Window 8, blocks of 4: a hit at k blocks needs the sliding group's
    // blocks (4k - 7) / 4..k, the last two.
    let pool = pool(64);
    let g = groups(&[sliding(8), KvGroup::Full]);
    let tokens: Vec<u32> = (0..36).collect(); // 9 blocks
    let keys = g.keys(&base_keys(&tokens));
    let published = cache(&pool, &g, &tokens);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    assert_eq!(seq.try_match_prefix(&keys), Ok(9));
    drop(seq);
    // Without block 7, no window ending at 8 or 9 is whole: the hit is 7,
    // whose window (blocks 5 and 6) is.
    uncache(&pool, &keys, 0, 7);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    assert_eq!(seq.try_match_prefix(&keys), Ok(7));
    assert_eq!(&seq.blocks(0).unwrap()[..5], &[BlockId::NULL; 5]);
    assert_eq!(&seq.blocks(0).unwrap()[5..], &published[0][5..7]);
    assert_eq!(seq.blocks(1).unwrap(), &published[1][..7]);
    assert_eq!(
        pool.used_blocks(),
        2 + 7,
        "what the hit does not need went back"
    );
    drop(seq);
    // Without block 5 too: back to 5 (window: blocks 3 and 4).
    uncache(&pool, &keys, 0, 5);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    assert_eq!(seq.try_match_prefix(&keys), Ok(5));
    assert_eq!(&seq.blocks(0).unwrap()[3..], &published[0][3..5]);
    drop(seq);
    // The full group decides when it is shorter.
    uncache(&pool, &keys, 1, 2);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    assert_eq!(seq.try_match_prefix(&keys), Ok(2));
    assert_eq!(seq.blocks(0).unwrap(), &published[0][..2]);
    assert_eq!(seq.held_blocks(), 4);
    drop(seq);
    assert_eq!(pool.used_blocks(), 0);
    // Every block the matches gave back is still cached.
    assert_eq!(pool.cached_blocks(), 18 - 3);
}

#[test]
fn a_sequence_dropped_right_after_a_match_gives_back_exactly_what_it_took() {
    // A match of a whole prompt with a window to look for, then a drop
    // with no other call: every reference goes back once.
    let pool = pool(64);
    let g = groups(&[KvGroup::Full, sliding(6), sliding(10)]);
    let tokens: Vec<u32> = (0..40).collect();
    let keys = g.keys(&base_keys(&tokens));
    let published = cache(&pool, &g, &tokens);
    // A later reader of the prompt holds it too.
    let mut reader = HybridSequence::new(Arc::clone(&pool), g.clone());
    assert_eq!(reader.try_match_prefix(&keys), Ok(10));
    for _ in 0..3 {
        let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
        assert_eq!(seq.try_match_prefix(&keys), Ok(10));
        drop(seq);
        for (group, blocks) in published.iter().enumerate() {
            for (i, &id) in blocks[..10].iter().enumerate() {
                let held = !reader.blocks(group).unwrap()[i].is_null();
                assert_eq!(pool.ref_count(id), Some(usize::from(held)), "{id}");
            }
        }
    }
    drop(reader);
    assert_eq!(pool.used_blocks(), 0);
}

#[test]
fn the_hit_agrees_with_brute_force_after_evictions() {
    let pool = pool(40);
    let g = groups(&[KvGroup::Full, sliding(5), sliding(9)]);
    let tokens: Vec<u32> = (0..40).collect(); // 10 blocks
    let keys = g.keys(&base_keys(&tokens));
    cache(&pool, &g, &tokens); // 30 cached, 10 free
                               // Take the 10 uncached blocks and 9 more: 9 cached blocks evicted.
    let mut hog = Vec::new();
    pool.try_alloc(19, &mut hog).unwrap();
    assert_eq!(pool.prefix_stats().evictions, 9);
    pool.free(&hog).unwrap();
    let status: Vec<Vec<bool>> = (0..3)
        .map(|group| (0..10).map(|b| is_cached(&pool, &keys, group, b)).collect())
        .collect();
    assert_eq!(status.iter().flatten().filter(|&&c| !c).count(), 9);
    let kinds = g.as_slice();
    let want = (0..=10)
        .rev()
        .find(|&k| {
            (0..3).all(|group| {
                (kinds[group].first_needed_block(k * BS, BS)..k).all(|b| status[group][b])
            })
        })
        .unwrap();
    let mut seq = HybridSequence::new(Arc::clone(&pool), g);
    assert_eq!(seq.try_match_prefix(&keys), Ok(want));
    assert_eq!(seq.len(), want * BS);
}

#[test]
fn a_sliding_group_without_its_window_cuts_the_hit_and_gives_back_the_rest() {
    // The full group is cached for 8 blocks, the sliding group (window 6:
    // a hit at k needs blocks k - 2 and k - 1) for blocks 0..4 only: the
    // hit is 4, and the full group's blocks 4..8 go back, still cached.
    let pool = pool(64);
    let g = groups(&[KvGroup::Full, sliding(6)]);
    let tokens: Vec<u32> = (0..32).collect();
    let keys = g.keys(&base_keys(&tokens));
    let published = cache(&pool, &g, &tokens);
    for b in 4..8 {
        uncache(&pool, &keys, 1, b);
    }
    assert_eq!(pool.cached_blocks(), 8 + 4);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    assert_eq!(seq.try_match_prefix(&keys), Ok(4));
    assert_eq!(seq.blocks(0).unwrap(), &published[0][..4]);
    // Position 16 reads 11..=16: blocks 2 and 3.
    assert_eq!(
        seq.blocks(1).unwrap(),
        &[
            BlockId::NULL,
            BlockId::NULL,
            published[1][2],
            published[1][3]
        ]
    );
    assert_eq!(pool.used_blocks(), 6, "the blocks not kept went back");
    assert_eq!(pool.cached_blocks(), 8 + 4);
}

// ---------------------------------------------------------------------------
// Matching into a reservation
// ---------------------------------------------------------------------------

#[test]
fn a_match_into_a_reservation_replaces_reserved_blocks_and_keeps_the_capacity() {
    let pool = pool(64);
    let g = groups(&[sliding(6), KvGroup::Full]);
    let tokens: Vec<u32> = (0..33).collect(); // 8 full blocks
    let published = cache(&pool, &g, &tokens);
    let keys = g.keys(&base_keys(&tokens));
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    seq.try_reserve(40, 0).unwrap(); // 10 blocks a group
    assert_eq!((seq.len(), seq.capacity(), pool.used_blocks()), (0, 40, 20));
    assert_eq!(seq.try_match_prefix(&keys), Ok(8));
    assert_eq!((seq.len(), seq.capacity()), (32, 40));
    // Position 32 reads 27..=32: the sliding group holds blocks 6 and 7,
    // then 2 reserved blocks, as the full group after its 8.
    let (t0, t1) = (seq.blocks(0).unwrap(), seq.blocks(1).unwrap());
    assert_eq!((t0.len(), t1.len()), (10, 10));
    assert_eq!(&t0[..6], &[BlockId::NULL; 6]);
    assert_eq!(&t0[6..8], &published[0][6..8]);
    assert_eq!(&t1[..8], &published[1][..8]);
    for &id in t0[8..].iter().chain(&t1[8..]) {
        assert_eq!(pool.ref_count(id), Some(1), "a reserved block, held alone");
        assert!(!published.iter().any(|t| t[..8].contains(&id)));
    }
    assert_eq!(seq.held_blocks(), 2 + 8 + 4);
    assert_eq!(
        pool.used_blocks(),
        14,
        "the reserved blocks replaced went back"
    );
    // The rest of the prompt fits in what was reserved: no pool call.
    let mut hog = Vec::new();
    pool.try_alloc(pool.free_blocks(), &mut hog).unwrap();
    assert_eq!(seq.try_append(8).unwrap(), 32..40);
    pool.free(&hog).unwrap();
    drop(seq);
    assert_eq!(pool.used_blocks(), 0);
}

#[test]
fn a_match_into_a_reservation_revives_with_the_reserved_blocks_when_the_rest_is_owed() {
    // 16 blocks cached (8 a group, no holder), 20 free: the reservation
    // takes the 20 free ones, and a waiter queued for 17 is owed the 16
    // evictable ones, so no revival can be admitted: each is paid by a
    // reserved block instead.
    let pool = pool(36);
    let g = groups(&[sliding(6), KvGroup::Full]);
    let tokens: Vec<u32> = (0..33).collect();
    let published = cache(&pool, &g, &tokens);
    let keys = g.keys(&base_keys(&tokens));
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    seq.try_reserve(40, 0).unwrap();
    assert_eq!(pool.cached_blocks(), 16, "the reservation evicted nothing");
    let waiter = queued_waiter(&pool, 17);
    // Into an empty sequence, nothing can be revived.
    let mut other = HybridSequence::new(Arc::clone(&pool), g.clone());
    assert_eq!(other.try_match_prefix(&keys), Ok(0));
    assert_eq!(seq.try_match_prefix(&keys), Ok(8));
    assert_eq!((seq.len(), seq.capacity()), (32, 40));
    assert_eq!(&seq.blocks(0).unwrap()[6..8], &published[0][6..8]);
    assert_eq!(&seq.blocks(1).unwrap()[..8], &published[1][..8]);
    assert_eq!(seq.held_blocks(), 2 + 8 + 4);
    // The 6 reserved blocks the match replaced went back: the waiter got
    // its 17 (the 6, and 11 of the 6 cached blocks the match left).
    let granted = waiter.join().unwrap().unwrap();
    assert_eq!(granted.len(), 17);
    assert_eq!(pool.used_blocks(), 14 + 17);
    pool.free(&granted).unwrap();
    drop(seq);
    assert_eq!(pool.used_blocks(), 0);
}

#[test]
fn a_match_into_a_reservation_keeps_the_places_of_the_blocks_a_shorter_group_lets_go() {
    // The full group is cached for 8 blocks, the sliding group (window 6)
    // for blocks 0..4 only; the reservation takes the 20 free blocks and a
    // waiter queued for 15 is owed the 12 cached ones. The full group
    // revives 8 blocks paid by reserved ones, the sliding group 2 (blocks
    // 2 and 3), and the hit is 4: the full group's 4 blocks past the hit
    // go back with their places in the capacity kept, so the reservation
    // stays whole (12 blocks beyond the hit) and what is left over (2)
    // does not let the waiter in.
    let pool = pool(32);
    let g = groups(&[KvGroup::Full, sliding(6)]);
    let tokens: Vec<u32> = (0..32).collect();
    let keys = g.keys(&base_keys(&tokens));
    let published = cache(&pool, &g, &tokens);
    for b in 4..8 {
        uncache(&pool, &keys, 1, b);
    }
    assert_eq!((pool.cached_blocks(), pool.free_blocks()), (12, 32));
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    seq.try_reserve(40, 0).unwrap();
    let waiter = queued_waiter(&pool, 15);
    assert_eq!(seq.try_match_prefix(&keys), Ok(4));
    assert_eq!((seq.len(), seq.capacity()), (16, 40));
    assert_eq!(&seq.blocks(0).unwrap()[..4], &published[0][..4]);
    assert_eq!(&seq.blocks(1).unwrap()[2..4], &published[1][2..4]);
    assert_eq!(seq.held_blocks(), 4 + 2 + 2 * 6);
    assert_eq!((pool.used_blocks(), pool.waiters()), (18, 1));
    assert_eq!(pool.cached_blocks(), 12, "the blocks let go of stay cached");
    // The 24 tokens left of the reservation need no pool call.
    assert_eq!(seq.try_append(24).unwrap(), 16..40);
    drop(seq);
    let granted = waiter.join().unwrap().unwrap();
    assert_eq!(granted.len(), 15);
    pool.free(&granted).unwrap();
    assert_eq!(pool.used_blocks(), 0);
}

#[test]
fn a_reservation_smaller_than_the_hit_gives_all_its_blocks_back() {
    let pool = pool(64);
    let g = groups(&[sliding(6), KvGroup::Full]);
    let tokens: Vec<u32> = (0..33).collect();
    cache(&pool, &g, &tokens);
    let keys = g.keys(&base_keys(&tokens));
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    seq.try_reserve(8, 0).unwrap(); // 2 blocks a group
    assert_eq!(seq.try_match_prefix(&keys), Ok(8));
    assert_eq!((seq.len(), seq.capacity()), (32, 32));
    assert_eq!(seq.held_blocks(), 2 + 8);
    assert_eq!(pool.used_blocks(), 10);
}

#[test]
fn a_match_into_a_reservation_with_no_hit_keeps_the_reservation() {
    let pool = pool(16);
    let g = groups(&[sliding(4), KvGroup::Full]);
    let keys = g.keys(&base_keys(&(0..16).collect::<Vec<u32>>()));
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    seq.try_reserve(12, 0).unwrap();
    let before = (tables(&seq), pool.used_blocks());
    assert_eq!(seq.try_match_prefix(&keys), Ok(0));
    assert_eq!((tables(&seq), pool.used_blocks()), before);
    assert_eq!((seq.len(), seq.capacity()), (0, 12));
}

#[test]
fn a_closed_pool_revives_nothing_into_a_reservation() {
    let pool = pool(36);
    let g = groups(&[sliding(6), KvGroup::Full]);
    let tokens: Vec<u32> = (0..33).collect();
    cache(&pool, &g, &tokens);
    let keys = g.keys(&base_keys(&tokens));
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    seq.try_reserve(40, 0).unwrap();
    pool.close();
    let before = (tables(&seq), pool.used_blocks(), pool.cached_blocks());
    assert_eq!(seq.try_match_prefix(&keys), Ok(0));
    assert_eq!(
        (tables(&seq), pool.used_blocks(), pool.cached_blocks()),
        before
    );
    drop(seq);
    assert_eq!(pool.used_blocks(), 0);
}

#[test]
fn keys_of_other_groups_are_refused_and_no_block_matches_in_another_group() {
    let pool = pool(32);
    let g = groups(&[KvGroup::Full, KvGroup::Full]);
    let swapped = groups(&[sliding(8), KvGroup::Full]);
    let tokens: Vec<u32> = (0..16).collect();
    cache(&pool, &g, &tokens);
    let mut seq = HybridSequence::new(Arc::clone(&pool), swapped.clone());
    assert_eq!(
        seq.try_match_prefix(&g.keys(&base_keys(&tokens))),
        Err(HybridError::OtherGroups)
    );
    assert_eq!(
        seq.publish(&g.keys(&base_keys(&tokens))),
        Err(HybridError::OtherGroups)
    );
    assert_eq!((seq.len(), seq.held_blocks()), (0, 0));
    // Group 1 is full in both layouts, but a key names its group's number
    // and kind: group 1 of `swapped` matches group 1 of `g`'s keys, group 0
    // (another kind) none, so the hit is 0.
    assert_eq!(
        seq.try_match_prefix(&swapped.keys(&base_keys(&tokens))),
        Ok(0)
    );
    assert_eq!(pool.used_blocks(), 0);
    // A plain sequence's keys (no group) match nothing either.
    let mut plain = kvslots::Sequence::new(Arc::clone(&pool));
    assert_eq!(plain.try_match_prefix(&base_keys(&tokens)), 0);
}

#[test]
fn a_match_stops_where_the_pool_is_full() {
    let pool = pool(12);
    let g = groups(&[KvGroup::Full, sliding(4)]);
    let tokens: Vec<u32> = (0..16).collect(); // 4 blocks
    cache(&pool, &g, &tokens); // 8 cached, evictable
    let keys = g.keys(&base_keys(&tokens));
    let mut hog = Vec::new();
    pool.try_alloc(4, &mut hog).unwrap(); // 4 uncached free blocks taken
    let mut more = Vec::new();
    pool.try_alloc(5, &mut more).unwrap(); // 5 cached ones evicted
    pool.free(&more).unwrap();
    // Revived blocks count against the capacity; with 3 evictable left and
    // free blocks available the match still stops no later than the pool
    // allows, and holds exactly what it reports.
    let mut seq = HybridSequence::new(Arc::clone(&pool), g);
    let k = seq.try_match_prefix(&keys).unwrap();
    assert_eq!(seq.len(), k * BS);
    let held: usize = (0..2)
        .map(|group| {
            seq.blocks(group)
                .unwrap()
                .iter()
                .filter(|id| !id.is_null())
                .count()
        })
        .sum();
    assert_eq!(held, seq.held_blocks());
    drop(seq);
    pool.free(&hog).unwrap();
    assert_eq!(pool.used_blocks(), 0);
}

/// The pool's statistics count a hybrid match's lookups group by group:
/// a full group's hit given back because the sliding group lost its window
/// is still a hit block there, while the match returns 0 and holds nothing.
#[test]
fn the_statistics_count_each_groups_lookups() {
    let pool = pool(8);
    let g = groups(&[KvGroup::Full, sliding(8)]);
    let tokens: Vec<u32> = (0..8).collect(); // 2 blocks
    let keys = g.keys(&base_keys(&tokens));
    let mut owner = HybridSequence::new(Arc::clone(&pool), g.clone());
    owner.try_append(8).unwrap();
    assert_eq!(owner.publish(&keys), Ok(2 + 2));
    owner.try_append(4).unwrap();
    owner.try_append(1).unwrap(); // position 12 reads 5..=12: block 0 goes back
    assert_eq!(owner.null_blocks(1), Some(1));
    let mut taken = Vec::new();
    pool.try_alloc(pool.free_blocks(), &mut taken).unwrap(); // evicts it
    let before = pool.prefix_stats();
    let mut seq = HybridSequence::new(Arc::clone(&pool), g);
    // The full group takes its 2 held blocks; the sliding group's window
    // ending at block 2 (position 8 reads 1..=8) needs block 0, whose key
    // is gone, and no window ends at block 0: all goes back.
    assert_eq!(seq.try_match_prefix(&keys), Ok(0));
    assert_eq!((seq.len(), seq.held_blocks()), (0, 0));
    let after = pool.prefix_stats();
    assert!(after.hit_blocks > before.hit_blocks);
    assert!(after.hit_blocks - before.hit_blocks <= after.queried_blocks - before.queried_blocks);
    assert_eq!(pool.used_blocks(), 8);
    pool.free(&taken).unwrap();
}

// ---------------------------------------------------------------------------
// Over another allocator
// ---------------------------------------------------------------------------

#[test]
fn a_hybrid_sequence_runs_over_a_trait_object() {
    let pool: Arc<dyn BlockAllocator + Send + Sync> = Arc::new(BlockPool::new(16, BS));
    let g = groups(&[sliding(4), KvGroup::Full]);
    let mut seq = HybridSequence::new(Arc::clone(&pool), g.clone());
    seq.try_append(12).unwrap();
    seq.try_append(1).unwrap();
    assert_eq!(seq.null_blocks(0), Some(2));
    let child = seq.try_fork(&mut Vec::new()).unwrap();
    assert_eq!(child.len(), 13);
    let tokens: Vec<u32> = (0..12).collect();
    assert_eq!(seq.publish(&g.keys(&base_keys(&tokens))), Ok(1 + 3));
    assert_eq!(seq.truncate(12), Ok(2));
    let _ = seq.reserve_blocking(4, 0, None);
}

#[test]
fn capacity_is_what_every_group_can_hold_with_a_copys_block_reserved_in_one() {
    // A reservation after a truncate into a block the full group shares
    // (with a matcher) but the sliding group holds alone keeps a block for
    // the full group's copy only: the tables differ in length, and the
    // capacity is what both can hold.
    let pool = pool(16);
    let gs = groups(&[KvGroup::Full, sliding(4)]);
    let keys = gs.keys(&base_keys(&[1; 8]));
    let mut a = HybridSequence::new(Arc::clone(&pool), gs.clone());
    a.try_append(8).unwrap();
    assert_eq!(a.publish(&keys), Ok(4));
    let mut b = HybridSequence::new(Arc::clone(&pool), gs);
    assert_eq!(b.try_match_prefix(&keys), Ok(2));
    assert_eq!(a.truncate(2), Ok(2));
    a.try_reserve(1, 0).unwrap();
    let lens: Vec<usize> = (0..2).map(|g| a.blocks(g).unwrap().len()).collect();
    assert_eq!(lens, [2, 1], "the full group keeps the copy's block");
    assert_eq!(a.capacity(), BS);
    // An append up to the capacity takes no block; the copy is the reserved one.
    let used = pool.used_blocks();
    let mut copies = Vec::new();
    assert_eq!(a.try_append_cow(BS - 2, &mut copies), Ok(2..BS));
    assert_eq!(copies.len(), 1);
    assert_eq!(pool.used_blocks(), used);
    assert_eq!(a.capacity(), BS);
}

/// Chunked local attention groups in a `HybridSequence`, checked against
/// references built from the attention pattern: truncate's `min_len`
/// against brute force, refused appends, a hit on a chunk boundary, the
/// kind's own keys.
mod chunked_local {
    use std::sync::Arc;

    use kvslots::{
        hash_blocks, BlockId, BlockPool, HybridError, HybridSequence, KvGroup, KvGroups,
        ReserveError,
    };

    fn c(chunk_tokens: usize) -> KvGroup {
        KvGroup::ChunkedLocal { chunk_tokens }
    }
    fn w(window_tokens: usize) -> KvGroup {
        KvGroup::SlidingWindow { window_tokens }
    }

    /// Reference from the attention pattern: the block of the first position
    /// the token at `len` reads.
    fn need_ref(kind: KvGroup, len: usize, bs: usize) -> usize {
        let first = match kind {
            KvGroup::Full => 0,
            KvGroup::SlidingWindow { window_tokens } => (len + 1).saturating_sub(window_tokens),
            KvGroup::ChunkedLocal { chunk_tokens } => (0..=len)
                .find(|&q| q / chunk_tokens == len / chunk_tokens)
                .unwrap(),
            _ => unreachable!(),
        };
        first / bs
    }

    type State = (usize, Vec<Vec<BlockId>>, usize, usize, Vec<Option<usize>>);

    fn state(seq: &HybridSequence, pool: &BlockPool) -> State {
        let n = seq.groups().len();
        (
            seq.len(),
            (0..n).map(|g| seq.blocks(g).unwrap().to_vec()).collect(),
            pool.free_blocks(),
            pool.used_blocks(),
            (0..n).map(|g| seq.null_blocks(g)).collect(),
        )
    }

    /// For many layouts, block sizes and two-append histories, every truncate
    /// target `x` in `1..len` is accepted exactly when no group's
    /// `first_needed_block(x)` (from the reference) lies before its null
    /// entries, and a refusal names the brute-force shortest accepted length
    /// and changes nothing.
    #[test]
    fn truncate_min_len_is_the_brute_force_shortest() {
        let layouts: Vec<Vec<KvGroup>> = vec![
            vec![c(1)],
            vec![c(2)],
            vec![c(3)],
            vec![c(5), KvGroup::Full],
            vec![c(7), w(3)],
            vec![c(8), c(3)],
            vec![w(5), c(6)],
            vec![c(12), KvGroup::Full, w(1)],
        ];
        let mut checked = 0;
        for layout in &layouts {
            let groups = KvGroups::new(layout.iter().copied()).unwrap();
            for bs in 1..=6 {
                for a in 1..=30 {
                    for b in [1, 2, 5, 9] {
                        let build = || {
                            let pool = Arc::new(BlockPool::new(4096, bs));
                            let mut seq = HybridSequence::new(Arc::clone(&pool), groups.clone());
                            seq.try_append(a).unwrap();
                            seq.try_append(b).unwrap();
                            (pool, seq)
                        };
                        let (_, probe) = build();
                        let len = probe.len();
                        let nulls: Vec<usize> = (0..layout.len())
                            .map(|g| probe.null_blocks(g).unwrap())
                            .collect();
                        // The model: nulls are the first_needed_block of the
                        // second append's old length.
                        for (g, kind) in layout.iter().enumerate() {
                            assert_eq!(
                                nulls[g],
                                need_ref(*kind, a, bs),
                                "{layout:?} bs {bs} a {a}"
                            );
                        }
                        let accepted = |x: usize| {
                            x == 0
                                || layout
                                    .iter()
                                    .enumerate()
                                    .all(|(g, k)| need_ref(*k, x, bs) >= nulls[g])
                        };
                        let min_len = (1..=len).find(|&x| accepted(x)).unwrap();
                        for x in 0..len {
                            let (pool, mut seq) = build();
                            let before = state(&seq, &pool);
                            let r = seq.truncate(x);
                            if accepted(x) {
                                assert!(r.is_ok(), "{layout:?} bs {bs} a {a} b {b} x {x}: {r:?}");
                                assert_eq!(seq.len(), x);
                            } else {
                                assert_eq!(
                                    r,
                                    Err(HybridError::TruncateOutsideWindow { len: x, min_len }),
                                    "{layout:?} bs {bs} a {a} b {b}"
                                );
                                assert_eq!(state(&seq, &pool), before);
                            }
                            // Truncating back into the last append's tokens is
                            // never refused.
                            if x >= a {
                                assert!(r.is_ok());
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 10_000);
    }

    /// A refused append (Full / NeverFits) of a chunked model changes nothing,
    /// also when it would move the chunk.
    #[test]
    fn refused_appends_change_nothing() {
        for bs in [1, 2, 3, 4] {
            let pool = Arc::new(BlockPool::new(6, bs));
            let groups = KvGroups::new([c(4), KvGroup::Full]).unwrap();
            let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
            let mut refused = 0;
            for step in 0..200 {
                let n = 1 + step % 7;
                let before = state(&seq, &pool);
                match seq.try_append(n) {
                    Ok(r) => assert_eq!(r, before.0..before.0 + n),
                    Err(e) => {
                        assert!(
                            matches!(
                                e,
                                ReserveError::Full { .. } | ReserveError::NeverFits { .. }
                            ),
                            "{e:?}"
                        );
                        assert_eq!(state(&seq, &pool), before, "bs {bs} n {n}");
                        refused += 1;
                        if refused % 3 == 0 {
                            seq.truncate(0).unwrap();
                        }
                    }
                }
            }
            assert!(refused > 0);
            drop(seq);
            assert_eq!(pool.used_blocks(), 0);
        }
    }

    /// An all-chunked model whose prompt's hit ends on a chunk boundary: the
    /// match serves the whole prompt holding no block at all (the next token
    /// reads only itself), with nothing cached; peek agrees.
    #[test]
    fn all_chunked_match_on_a_boundary_needs_nothing_cached() {
        let pool = Arc::new(BlockPool::new(16, 4));
        let groups = KvGroups::new([c(8), c(8)]).unwrap();
        let mut base = Vec::new();
        hash_blocks(b"", &(0..16u32).collect::<Vec<_>>(), 4, &mut base);
        let keys = groups.keys(&base);
        assert_eq!(pool.peek_hybrid_prefix(&keys), 4);
        let mut seq = HybridSequence::new(Arc::clone(&pool), groups.clone());
        assert_eq!(seq.try_match_prefix(&keys), Ok(4));
        assert_eq!(seq.len(), 16);
        assert_eq!(seq.held_blocks(), 0);
        assert_eq!(seq.blocks(0).unwrap(), &[BlockId::NULL; 4]);
        // 3 blocks (12 tokens, not on a boundary): the chunk 8..16 needs
        // blocks 2 and 3 ... only 2 (position 12 reads 8..=12): not cached.
        let k3 = groups.keys(&base[..3]);
        assert_eq!(pool.peek_hybrid_prefix(&k3), 2);
        let mut s3 = HybridSequence::new(Arc::clone(&pool), groups.clone());
        assert_eq!(s3.try_match_prefix(&k3), Ok(2));
        assert_eq!(s3.held_blocks(), 0);
        // A truncate into the matched prefix is refused; 0 is fine.
        let before = state(&seq, &pool);
        assert_eq!(
            seq.truncate(15),
            Err(HybridError::TruncateOutsideWindow {
                len: 15,
                min_len: 16
            })
        );
        assert_eq!(state(&seq, &pool), before);
        // It appends as new work.
        seq.try_append(1).unwrap();
        assert_eq!(seq.held_blocks(), 2);
        let child = seq.try_fork(&mut Vec::new()).unwrap();
        assert_eq!(child.blocks(0).unwrap()[..4], [BlockId::NULL; 4]);
        drop((seq, s3, child));
        assert_eq!(pool.used_blocks(), 0);
    }

    /// The HybridSequence docs say of a sliding group "a sequence in steady
    /// decode makes no pool call for its sliding groups", and "What these docs
    /// say of a sliding group holds for [a chunked one]". A chunked group in
    /// steady decode gives its whole previous chunk back to the pool at a
    /// chunk boundary (free blocks go up in a one-token append), and takes a
    /// new block from the pool at each block boundary inside a chunk.
    #[test]
    fn chunked_keys_are_their_own() {
        let mut base = Vec::new();
        hash_blocks(b"", &(0..64u32).collect::<Vec<_>>(), 4, &mut base);
        let kc = KvGroups::new([c(8)]).unwrap();
        let kw = KvGroups::new([w(8)]).unwrap();
        let kc2 = KvGroups::new([c(9)]).unwrap();
        for b in &base {
            let a = kc.key(0, b).unwrap();
            assert_ne!(a, kw.key(0, b).unwrap());
            assert_ne!(a, kc2.key(0, b).unwrap());
            assert_ne!(
                a,
                KvGroups::new([KvGroup::Full]).unwrap().key(0, b).unwrap()
            );
        }
        let pool = Arc::new(BlockPool::new(64, 4));
        let mut s = HybridSequence::new(Arc::clone(&pool), kc.clone());
        s.try_append(62).unwrap();
        assert_eq!(s.publish(&kc.keys(&base)), Ok(15)); // one append: nothing given back yet
        drop(s);
        // 15 blocks (60 tokens): position 60 reads 56..=60, block 14: cached.
        assert_eq!(pool.peek_hybrid_prefix(&kc.keys(&base[..15])), 15);
        // Under sliding keys (window 8: position 60 reads 53..=60, blocks 13..15): nothing.
        let mut other = HybridSequence::new(Arc::clone(&pool), kw.clone());
        assert_eq!(pool.peek_hybrid_prefix(&kw.keys(&base[..15])), 0);
        assert_eq!(other.try_match_prefix(&kw.keys(&base[..15])), Ok(0));
        assert_eq!(other.held_blocks(), 0);
    }
}

#[test]
fn groups_and_their_keys_print_their_kinds_and_blocks() {
    let groups = groups(&[KvGroup::Full, sliding(8)]);
    assert_eq!(
        format!("{groups:?}"),
        "[Full, SlidingWindow { window_tokens: 8 }]"
    );
    let keys = groups.keys(&base_keys(&[1; 3 * BS]));
    assert_eq!(
        format!("{keys:?}"),
        "GroupKeys { groups: [Full, SlidingWindow { window_tokens: 8 }], blocks: 3 }"
    );
}

#[test]
fn group_keys_refuse_a_reservation_past_memory_and_keep_their_keys() {
    let groups = groups(&[KvGroup::Full, sliding(8)]);
    let mut keys = GroupKeys::new(&groups);
    keys.try_reserve(4).unwrap();
    keys.extend(&base_keys(&[2; 2 * BS]));
    let before = format!("{keys:?}");
    assert!(keys.try_reserve(usize::MAX).is_err());
    assert_eq!(keys.blocks(), 2);
    assert_eq!(format!("{keys:?}"), before);
    assert_eq!(keys.group(1).unwrap().len(), 2);
}
