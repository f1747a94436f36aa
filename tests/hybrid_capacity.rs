//! `HybridSequence::with_capacity(pool, groups, tokens)` keeps its promise:
//! appends, reservations and matches up to `tokens` allocate no heap
//! memory, also where a sliding window's table, which keeps a null entry
//! for each block the window has passed, outgrows the pool.
//!
//! Every allocation, reallocation and deallocation in this test binary goes
//! through the counting allocator of `tests/counting`, which counts them
//! per thread, as `tests/zero_alloc.rs` does. Each test
//! makes its keys and the sequence first, then counts the heap operations
//! of the calls the promise covers, from the first one on (no warm-up).

use std::sync::Arc;

mod counting;

use counting::heap_bytes;
use kvslots::{hash_blocks, BlockId, BlockPool, HybridSequence, KvGroup, KvGroups};

/// The heap operations (allocations and reallocations, deallocations) this
/// thread makes while running `f`.
fn heap_ops(f: impl FnOnce()) -> (u64, u64) {
    let ops = counting::heap_ops(f);
    (ops.allocs, ops.frees)
}

/// The count is real: a one-element `Vec` made in the measured region is
/// counted.
#[test]
fn the_counter_counts() {
    let ops = heap_ops(|| drop(std::hint::black_box(Vec::<u64>::with_capacity(1))));
    assert_eq!(ops, (1, 1));
}

/// One-token appends, with a reservation of 8 more tokens every 64, up
/// to `tokens`
/// in a sequence made `with_capacity(.., tokens)`: no heap operation.
fn appends_allocate_nothing(pool: &Arc<BlockPool>, groups: &KvGroups, tokens: usize) {
    let mut seq = HybridSequence::with_capacity(Arc::clone(pool), groups.clone(), tokens);
    let ops = heap_ops(|| {
        for len in 0..tokens {
            if len % 64 == 0 {
                seq.try_reserve(8.min(tokens - len), 0).unwrap();
            }
            seq.try_append(1).unwrap();
        }
    });
    assert_eq!(ops, (0, 0), "{groups:?}, {tokens} tokens");
    assert_eq!(seq.len(), tokens);
}

/// A sliding window's table, 100,000 entries long, in a pool of 64
/// blocks.
#[test]
fn a_sliding_table_longer_than_the_pool_grows_without_allocating() {
    let pool = Arc::new(BlockPool::new(64, 1));
    let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 32 }]).unwrap();
    appends_allocate_nothing(&pool, &groups, 100_000);
}

/// Two windows, of different lengths, with blocks of 2 tokens.
#[test]
fn two_sliding_tables_grow_without_allocating() {
    let pool = Arc::new(BlockPool::new(64, 2));
    let groups = KvGroups::new([
        KvGroup::SlidingWindow { window_tokens: 8 },
        KvGroup::SlidingWindow { window_tokens: 40 },
    ])
    .unwrap();
    appends_allocate_nothing(&pool, &groups, 20_000);
}

/// A full group beside a window: the full table holds distinct blocks, at
/// most the pool's, and the length stays within what the pool holds.
#[test]
fn a_full_group_beside_a_window_grows_without_allocating() {
    let pool = Arc::new(BlockPool::new(128, 4));
    let groups =
        KvGroups::new([KvGroup::SlidingWindow { window_tokens: 16 }, KvGroup::Full]).unwrap();
    appends_allocate_nothing(&pool, &groups, 400);
}

/// A match of a window at the end of a prompt longer than the pool, then
/// appends up to the capacity: the window's table takes its null entries
/// and the match its blocks without allocating.
#[test]
fn a_sliding_match_longer_than_the_pool_allocates_nothing() {
    const PROMPT: usize = 1_000;
    const CAPACITY: usize = 2_000;
    let pool = Arc::new(BlockPool::new(64, 1));
    let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 32 }]).unwrap();
    let mut base = Vec::new();
    hash_blocks(b"", &(0..PROMPT as u32).collect::<Vec<u32>>(), 1, &mut base);
    let keys = groups.keys(&base);
    // A first request publishes each block as it fills; its window's last
    // blocks stay cached once it is dropped.
    let mut first = HybridSequence::new(Arc::clone(&pool), groups.clone());
    for _ in 0..PROMPT {
        first.try_append(1).unwrap();
        first.publish(&keys).unwrap();
    }
    let window = first.blocks(0).unwrap()[first.null_blocks(0).unwrap()..].to_vec();
    drop(first);

    let mut seq = HybridSequence::with_capacity(Arc::clone(&pool), groups.clone(), CAPACITY);
    let mut k = 0;
    let ops = heap_ops(|| {
        k = seq.try_match_prefix(&keys).unwrap();
        for _ in PROMPT..CAPACITY {
            seq.try_append(1).unwrap();
        }
    });
    assert_eq!(ops, (0, 0));
    assert_eq!(k, PROMPT);
    assert_eq!(seq.len(), CAPACITY);
    drop(seq);
    // The match took the window the first request left.
    let mut again = HybridSequence::new(Arc::clone(&pool), groups);
    assert_eq!(again.try_match_prefix(&keys), Ok(PROMPT));
    let table = again.blocks(0).unwrap();
    assert!(table[..again.null_blocks(0).unwrap()]
        .iter()
        .all(|&id| id == BlockId::NULL));
    assert!(window.ends_with(&table[again.null_blocks(0).unwrap()..]));
}

/// A match in a window of more blocks than the pool has: each window the
/// match tries asks for more blocks than the pool can hold, and the list
/// the matched blocks pass through is sized by the pool, not the window.
#[test]
fn a_match_in_a_window_wider_than_the_pool_allocates_nothing() {
    const PROMPT: usize = 5_000;
    let pool = Arc::new(BlockPool::new(64, 1));
    let groups = KvGroups::new([KvGroup::SlidingWindow {
        window_tokens: 1_000,
    }])
    .unwrap();
    let mut base = Vec::new();
    hash_blocks(b"", &(0..PROMPT as u32).collect::<Vec<u32>>(), 1, &mut base);
    let keys = groups.keys(&base);
    // The prompt's first 64 blocks are cached.
    let mut first = HybridSequence::new(Arc::clone(&pool), groups.clone());
    first.try_append(64).unwrap();
    assert_eq!(first.publish(&keys), Ok(64));
    drop(first);

    let mut seq = HybridSequence::with_capacity(Arc::clone(&pool), groups.clone(), PROMPT);
    let mut k = 0;
    let ops = heap_ops(|| k = seq.try_match_prefix(&keys).unwrap());
    assert_eq!(ops, (0, 0));
    // The window ending at block 64 reaches back to block 0: all cached.
    assert_eq!(k, 64);
    drop(seq);
    // The same match as a sequence without the room finds.
    let mut again = HybridSequence::new(Arc::clone(&pool), groups);
    assert_eq!(again.try_match_prefix(&keys), Ok(k));
}

/// A model with a full group never holds more tokens than the pool's
/// blocks do, so `with_capacity` sizes its sliding tables by the pool too,
/// however many tokens it is given; a model whose groups all slide sets
/// aside room for the tokens' blocks.
#[test]
fn a_full_group_caps_every_tables_room_at_the_pool() {
    let pool = Arc::new(BlockPool::new(64, 1));
    let tokens = 1 << 20;
    let mixed =
        KvGroups::new([KvGroup::SlidingWindow { window_tokens: 16 }, KvGroup::Full]).unwrap();
    let (seq, mixed_bytes) =
        heap_bytes(|| HybridSequence::with_capacity(Arc::clone(&pool), mixed, tokens));
    // Two tables of 65 entries, the scratch list and the plans: a few KiB.
    assert!(
        mixed_bytes < 4096,
        "{mixed_bytes} bytes for a model capped at 64 blocks"
    );
    drop(seq);
    let sliding = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 16 }]).unwrap();
    let (seq, sliding_bytes) =
        heap_bytes(|| HybridSequence::with_capacity(Arc::clone(&pool), sliding, tokens));
    // A null entry a block passed: 4 bytes a token at one token a block.
    assert!(sliding_bytes >= 4 * tokens as u64, "{sliding_bytes} bytes");
    drop(seq);
}

/// The same promise for chunked local attention groups: all-chunked
/// models whose tables outgrow the pool, multi-token steps, chunked
/// groups beside sliding and full ones, and matches longer than the pool.
mod chunked_local {
    use std::sync::Arc;

    use super::{heap_bytes, heap_ops};
    use kvslots::{hash_blocks, BlockPool, HybridSequence, KvGroup, KvGroups};

    fn c(chunk_tokens: usize) -> KvGroup {
        KvGroup::ChunkedLocal { chunk_tokens }
    }

    fn appends_allocate_nothing(
        pool: &Arc<BlockPool>,
        groups: &KvGroups,
        tokens: usize,
        step: usize,
    ) {
        let mut seq = HybridSequence::with_capacity(Arc::clone(pool), groups.clone(), tokens);
        let ops = heap_ops(|| {
            let mut len = 0;
            while len < tokens {
                if len % 64 == 0 {
                    seq.try_reserve(8.min(tokens - len), 0).unwrap();
                }
                let n = step.min(tokens - len);
                seq.try_append(n).unwrap();
                len += n;
            }
        });
        assert_eq!(ops, (0, 0), "{groups:?}, {tokens} tokens, step {step}");
        assert_eq!(seq.len(), tokens);
    }

    #[test]
    fn all_chunked_tables_longer_than_the_pool_grow_without_allocating() {
        let pool = Arc::new(BlockPool::new(64, 1));
        appends_allocate_nothing(&pool, &KvGroups::new([c(32)]).unwrap(), 100_000, 1);
        let pool = Arc::new(BlockPool::new(64, 2));
        appends_allocate_nothing(&pool, &KvGroups::new([c(7), c(20)]).unwrap(), 20_000, 1);
        appends_allocate_nothing(&pool, &KvGroups::new([c(7), c(20)]).unwrap(), 20_000, 5);
        let pool = Arc::new(BlockPool::new(64, 3));
        let mixed = KvGroups::new([c(10), KvGroup::SlidingWindow { window_tokens: 9 }]).unwrap();
        appends_allocate_nothing(&pool, &mixed, 30_000, 3);
    }

    #[test]
    fn chunked_beside_full_grows_without_allocating() {
        let pool = Arc::new(BlockPool::new(128, 4));
        appends_allocate_nothing(
            &pool,
            &KvGroups::new([c(16), KvGroup::Full]).unwrap(),
            400,
            1,
        );
    }

    /// A match at the end of a prompt longer than the pool, in an
    /// all-chunked model: the table takes its null entries and the chunk's
    /// blocks without allocating, then appends to the capacity.
    #[test]
    fn a_chunked_match_longer_than_the_pool_allocates_nothing() {
        const PROMPT: usize = 1_000;
        const CAPACITY: usize = 2_000;
        for chunk in [32usize, 30, 1000, 999, 1] {
            let pool = Arc::new(BlockPool::new(64, 1));
            let groups = KvGroups::new([c(chunk)]).unwrap();
            let mut base = Vec::new();
            hash_blocks(b"", &(0..PROMPT as u32).collect::<Vec<u32>>(), 1, &mut base);
            let keys = groups.keys(&base);
            let mut first = HybridSequence::new(Arc::clone(&pool), groups.clone());
            for _ in 0..PROMPT {
                if first.try_append(1).is_err() {
                    break;
                }
                first.publish(&keys).unwrap();
            }
            drop(first);
            let want = pool.peek_hybrid_prefix(&keys);
            let mut seq =
                HybridSequence::with_capacity(Arc::clone(&pool), groups.clone(), CAPACITY);
            let mut k = 0;
            let ops = heap_ops(|| {
                k = seq.try_match_prefix(&keys).unwrap();
            });
            assert_eq!(ops, (0, 0), "chunk {chunk}");
            assert_eq!(k, want, "chunk {chunk}");
            let ops = heap_ops(|| {
                for _ in k..CAPACITY {
                    if seq.try_append(1).is_err() {
                        break;
                    }
                }
            });
            assert_eq!(ops, (0, 0), "chunk {chunk}");
        }
    }

    /// with_capacity sets aside a null entry per block for all-chunked models
    /// (room for the tokens), and caps at the pool with a full group.
    #[test]
    fn room_for_all_chunked_models() {
        let pool = Arc::new(BlockPool::new(64, 1));
        let tokens = 1 << 20;
        let (seq, bytes) = heap_bytes(|| {
            HybridSequence::with_capacity(
                Arc::clone(&pool),
                KvGroups::new([c(16)]).unwrap(),
                tokens,
            )
        });
        assert!(bytes >= 4 * tokens as u64, "{bytes}");
        drop(seq);
        let (seq, bytes) = heap_bytes(|| {
            HybridSequence::with_capacity(
                Arc::clone(&pool),
                KvGroups::new([c(16), KvGroup::Full]).unwrap(),
                tokens,
            )
        });
        assert!(bytes < 4096, "{bytes}");
        drop(seq);
    }
}
