//! `BlockPool::with_shards` and the sharded free list: the constructor's
//! checks, the default shard count, and that cutting the free list into
//! stacks changes nothing a caller can observe (all or nothing across
//! stacks, exact `Full`, every block back where a later allocation finds
//! it, from any thread).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::thread;

use kvslots::{BlockId, BlockPool, ReserveError, Sequence};

/// Free, used and every reference count: what a refusal must leave alone.
fn state(pool: &BlockPool) -> (usize, usize, Vec<Option<usize>>) {
    let refs = (0..pool.num_blocks())
        .map(|i| pool.ref_count(BlockId::new(i as u32)))
        .collect();
    (pool.free_blocks(), pool.used_blocks(), refs)
}

/// Asserts that `ids` are `n` distinct in-range ids.
fn assert_distinct(ids: &[BlockId], n: usize, num_blocks: usize) {
    let set: BTreeSet<_> = ids.iter().copied().collect();
    assert_eq!(set.len(), n, "duplicates in {ids:?}");
    assert_eq!(ids.len(), n);
    assert!(ids.iter().all(|id| id.index() < num_blocks), "{ids:?}");
}

#[test]
#[should_panic(expected = "shards must be in 1..=1024, got 0")]
fn zero_shards_panics() {
    let _ = BlockPool::with_shards(4, 16, 0);
}

#[test]
#[should_panic(expected = "shards must be in 1..=1024, got 1025")]
fn more_than_max_shards_panics() {
    let _ = BlockPool::with_shards(4, 16, BlockPool::MAX_SHARDS + 1);
}

#[test]
#[should_panic(expected = "shards must be in 1..=1024")]
fn usize_max_shards_panics() {
    let _ = BlockPool::with_shards(4, 16, usize::MAX);
}

#[test]
#[should_panic(expected = "block_size must be non-zero")]
fn with_shards_checks_the_block_size_too() {
    let _ = BlockPool::with_shards(4, 0, 2);
}

#[test]
fn max_shards_is_accepted() {
    let pool = BlockPool::with_shards(3, 1, BlockPool::MAX_SHARDS);
    assert_eq!(pool.shards(), BlockPool::MAX_SHARDS);
    let mut ids = Vec::new();
    pool.try_alloc(3, &mut ids).unwrap();
    assert_distinct(&ids, 3, 3);
    pool.free(&ids).unwrap();
    assert_eq!(pool.free_blocks(), 3);
}

#[test]
fn new_picks_one_shard_per_64_blocks_up_to_16() {
    for (num_blocks, shards) in [
        (0, 1),
        (1, 1),
        (63, 1),
        (64, 1),
        (127, 1),
        (128, 2),
        (640, 10),
        (1024, 16),
        (1025, 16),
        (1_000_000, 16),
    ] {
        assert_eq!(
            BlockPool::new(num_blocks, 16).shards(),
            shards,
            "{num_blocks}"
        );
    }
    assert_eq!(BlockPool::DEFAULT_SHARDS, 16);
    assert_eq!(BlockPool::BLOCKS_PER_SHARD, 64);
}

#[test]
fn debug_shows_the_shard_count() {
    let text = format!("{:?}", BlockPool::with_shards(8, 4, 3));
    assert!(text.contains("shards: 3"), "{text}");
}

/// Every pool size up to 10 under every shard count up to 12 (so more
/// stacks than blocks too): one at a time and all at once, every block
/// comes out exactly once, one more is refused with the exact count and
/// nothing changes, and freeing restores the fresh pool.
#[test]
fn every_block_comes_out_once_whatever_the_shard_count() {
    for num_blocks in 0..=10 {
        for shards in 1..=12 {
            let pool = BlockPool::with_shards(num_blocks, 2, shards);
            let fresh = state(&pool);
            let mut ids = Vec::new();
            for _ in 0..num_blocks {
                pool.try_alloc(1, &mut ids).unwrap();
            }
            assert_distinct(&ids, num_blocks, num_blocks);
            let before = state(&pool);
            let mut out = vec![BlockId::new(7)];
            let expected = if num_blocks == 0 {
                ReserveError::NeverFits {
                    requested: 1,
                    capacity: 0,
                }
            } else {
                ReserveError::Full {
                    requested: 1,
                    available: 0,
                }
            };
            assert_eq!(pool.try_alloc(1, &mut out), Err(expected));
            assert_eq!(out, [BlockId::new(7)], "a refusal touched out");
            assert_eq!(state(&pool), before, "a refusal changed the pool");
            pool.free(&ids).unwrap();
            assert_eq!(state(&pool), fresh);

            let mut all = Vec::new();
            pool.try_alloc(num_blocks, &mut all).unwrap();
            assert_distinct(&all, num_blocks, num_blocks);
            pool.free(&all).unwrap();
            assert_eq!(state(&pool), fresh, "{num_blocks} blocks, {shards} shards");
        }
    }
}

/// A request larger than any one stack takes from several, all or nothing:
/// the refused request leaves `out` and the pool as they were.
#[test]
fn a_request_spanning_stacks_is_all_or_nothing() {
    let pool = BlockPool::with_shards(8, 16, 4);
    let mut held = Vec::new();
    pool.try_alloc(3, &mut held).unwrap();
    let before = state(&pool);
    let mut out = vec![BlockId::new(99)];
    assert_eq!(
        pool.try_alloc(6, &mut out),
        Err(ReserveError::Full {
            requested: 6,
            available: 5
        })
    );
    assert_eq!(out, [BlockId::new(99)]);
    assert_eq!(state(&pool), before);
    pool.try_alloc(5, &mut held).unwrap();
    assert_distinct(&held, 8, 8);
    pool.free(&held).unwrap();
    assert_eq!(pool.free_blocks(), 8);
}

/// Blocks taken by one thread and freed by another go back to the stacks
/// that own them, where a third thread (another home stack) finds them.
#[test]
fn blocks_freed_on_another_thread_are_found_from_any_thread() {
    const N: usize = 1024;
    let pool = Arc::new(BlockPool::with_shards(N, 16, 16));
    for _round in 0..3 {
        let taken = thread::scope(|s| {
            s.spawn(|| {
                let mut ids = Vec::new();
                pool.try_alloc(N, &mut ids).unwrap();
                ids
            })
            .join()
            .unwrap()
        });
        assert_distinct(&taken, N, N);
        assert_eq!(pool.free_blocks(), 0);
        thread::scope(|s| {
            s.spawn(|| pool.free(&taken).unwrap()).join().unwrap();
        });
        assert_eq!(pool.free_blocks(), N);
    }
    // And in small pieces from several threads at once.
    let pieces: Vec<Vec<BlockId>> = thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut ids = Vec::new();
                    for _ in 0..N / 4 / 8 {
                        pool.try_alloc(8, &mut ids).unwrap();
                    }
                    ids
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let all: Vec<BlockId> = pieces.concat();
    assert_distinct(&all, N, N);
    pool.free(&all).unwrap();
    assert_eq!(pool.free_blocks(), N);
}

/// Sequences over a sharded pool: appends spanning stacks, a fork sharing
/// blocks, truncation, and the pool full again once they are dropped.
#[test]
fn sequences_over_a_sharded_pool() {
    let pool = Arc::new(BlockPool::with_shards(12, 4, 5));
    let mut parent = Sequence::new(Arc::clone(&pool));
    assert_eq!(parent.try_append(30).unwrap(), 0..30); // 8 blocks
    let (mut child, copy) = parent.try_fork().unwrap();
    let copy = copy.expect("30 tokens end inside a block");
    assert_eq!(copy.tokens, 2);
    assert_eq!(pool.used_blocks(), 9);
    assert_eq!(child.try_append(10).unwrap(), 30..40);
    assert_eq!(pool.used_blocks(), 11);
    assert!(parent.try_append(16).is_err(), "needs 4 blocks, 1 free");
    assert_eq!(parent.len(), 30);
    // The parent keeps its first block; of the 7 it lets go, the 6 full
    // ones stay with the child and its private tail block is freed.
    parent.truncate(4);
    assert_eq!(pool.used_blocks(), 10);
    drop(parent);
    assert_eq!(pool.used_blocks(), 10, "the child still holds block 0");
    drop(child);
    assert_eq!(pool.free_blocks(), 12);
    let mut all = Vec::new();
    pool.try_alloc(12, &mut all).unwrap();
    assert_distinct(&all, 12, 12);
}

/// The stack a fresh pool of one block per stack serves the calling thread
/// from: the id `try_alloc(1)` returns.
fn home_stack() -> usize {
    let pool = BlockPool::with_shards(1024, 1, 1024);
    let mut ids = Vec::new();
    pool.try_alloc(1, &mut ids).unwrap();
    ids[0].index()
}

/// Threads start their pops at stacks of their own: two threads get
/// different blocks from fresh pools of one block per stack (1,024
/// stacks; two threads could share a home stack only if 1,024 other
/// threads had started in between). A thread keeps its home.
#[test]
fn threads_start_at_different_stacks() {
    let a = thread::spawn(|| (home_stack(), home_stack()))
        .join()
        .unwrap();
    let b = thread::spawn(|| (home_stack(), home_stack()))
        .join()
        .unwrap();
    assert_eq!(a.0, a.1, "a thread's home stack moved");
    assert_eq!(b.0, b.1, "a thread's home stack moved");
    assert_ne!(a.0, b.0, "two threads started at the same stack");
}

/// A freed block goes back to the stack that owns it, not to the freer's:
/// with one block per stack, blocks 5 and 7 freed one at a time sit in
/// stacks 5 and 7, and the next allocation takes whichever comes first
/// when counting on from the thread's home stack.
#[test]
fn freed_blocks_go_back_to_the_stack_that_owns_them() {
    let home = home_stack();
    let pool = BlockPool::with_shards(1024, 1, 1024);
    let mut all = Vec::new();
    pool.try_alloc(1024, &mut all).unwrap();
    let (five, seven) = (BlockId::new(5), BlockId::new(7));
    pool.free(&[five]).unwrap();
    pool.free(&[seven]).unwrap();
    // Stacks are searched from home upwards, wrapping around.
    let distance = |stack: usize| (stack + 1024 - home) % 1024;
    let expected = if distance(5) < distance(7) {
        five
    } else {
        seven
    };
    let mut got = Vec::new();
    pool.try_alloc(1, &mut got).unwrap();
    assert_eq!(got, [expected], "home stack {home}");
}

/// One free of blocks that belong to different stacks splits them: each
/// goes back to its own stack, as if freed one at a time.
#[test]
fn a_free_spanning_stacks_gives_each_block_back_to_its_own() {
    let home = home_stack();
    let pool = BlockPool::with_shards(1024, 1, 1024);
    let mut all = Vec::new();
    pool.try_alloc(1024, &mut all).unwrap();
    let (five, six, nine) = (BlockId::new(5), BlockId::new(6), BlockId::new(9));
    pool.free(&[five, nine, six]).unwrap();
    let distance = |id: BlockId| (id.index() + 1024 - home) % 1024;
    let mut expected = vec![five, six, nine];
    expected.sort_by_key(|&id| distance(id));
    let mut got = Vec::new();
    for _ in 0..3 {
        pool.try_alloc(1, &mut got).unwrap();
    }
    assert_eq!(got, expected, "home stack {home}");
}

/// The stacks as the documentation describes them: stack `s` owns ids
/// `s * span .. (s + 1) * span`, a freed id goes on top of its owner's
/// stack, and an allocation of one block takes the top of the first
/// non-empty stack counting on from the thread's home.
struct Stacks {
    span: usize,
    stacks: Vec<Vec<BlockId>>,
}

impl Stacks {
    fn free(&mut self, ids: &[BlockId]) {
        for &id in ids {
            self.stacks[id.index() / self.span].push(id);
        }
    }

    fn alloc_one(&mut self, home: usize) -> Option<BlockId> {
        let n = self.stacks.len();
        (0..n).find_map(|k| self.stacks[(home + k) % n].pop())
    }
}

/// Frees of chains that lie in one stack, in two, and in three, on a pool
/// of 4 stacks of 4 ids, then single allocations: every block comes back
/// from where the model of the stacks says, on several threads (so that
/// several home stacks are tried).
#[test]
fn stacks_of_four_ids_follow_the_model() {
    let run = || {
        let reveal = BlockPool::with_shards(16, 1, 4);
        let mut first = Vec::new();
        reveal.try_alloc(1, &mut first).unwrap();
        let home = first[0].index() / 4;

        let pool = BlockPool::with_shards(16, 1, 4);
        let mut all = Vec::new();
        pool.try_alloc(16, &mut all).unwrap();
        let mut model = Stacks {
            span: 4,
            stacks: vec![Vec::new(); 4],
        };
        let ids = |list: &[u32]| list.iter().map(|&i| BlockId::new(i)).collect::<Vec<_>>();
        for chain in [&[5, 9][..], &[6, 7], &[3, 4], &[2, 13, 10], &[15, 1, 8]] {
            let chain = ids(chain);
            pool.free(&chain).unwrap();
            model.free(&chain);
        }
        for _ in 0..12 {
            let mut got = Vec::new();
            pool.try_alloc(1, &mut got).unwrap();
            assert_eq!(Some(got[0]), model.alloc_one(home), "home stack {home}");
        }
        assert_eq!(pool.free_blocks(), 0);
    };
    for _ in 0..4 {
        thread::spawn(run).join().unwrap();
    }
}
