//! Zero heap allocation on the hot paths, proven with a counting global
//! allocator.
//!
//! Every allocation, reallocation and deallocation in this test binary goes
//! through the counting allocator of `tests/counting`, which counts them
//! per thread (the test harness runs tests on parallel threads). Each test
//! sets its allocator-owning objects up first (counter, pool, buffers,
//! sequences with a reserved table), warms up once, and then runs thousands
//! of steady-state iterations, refused requests included, inside
//! `heap_ops`: the count of heap operations there must be zero.
//!
//! The control test shows the count is real: a one-element `Vec` made in
//! the measured region is counted.

use std::cell::Cell;
use std::sync::{Arc, Barrier};

mod common;
mod counting;

use common::Forward;
use counting::{heap_ops, HeapOps, NONE};
use kvslots::{
    hash_blocks, BlockHash, BlockId, BlockPool, FreeError, HybridSequence, KvGroup, KvGroups,
    PositionError, ReleaseError, ReserveError, Sequence, SlotCounter,
};

/// Iterations of each measured loop.
const ITERS: usize = 10_000;

// ---------------------------------------------------------------------------
// Control: the count is real
// ---------------------------------------------------------------------------

#[test]
fn the_counter_counts() {
    // One allocation and its deallocation.
    let ops = heap_ops(|| drop(std::hint::black_box(Vec::<u64>::with_capacity(1))));
    assert_eq!(
        ops,
        HeapOps {
            allocs: 1,
            frees: 1
        }
    );
    // Growing counts too.
    let mut v: Vec<u64> = Vec::with_capacity(1);
    let ops = heap_ops(|| v.extend([1, 2, 3]));
    assert!(ops.allocs >= 1, "{ops:?}");
    // One allocation in a long loop is found.
    let ops = heap_ops(|| {
        for i in 0..ITERS {
            if i == ITERS / 2 {
                std::hint::black_box(Box::new(i));
            }
        }
    });
    assert_eq!(
        ops,
        HeapOps {
            allocs: 1,
            frees: 1
        }
    );
    // An empty Vec allocates nothing.
    assert_eq!(
        heap_ops(|| drop(std::hint::black_box(Vec::<u64>::new()))),
        NONE
    );
    // Another thread's allocations, made while we measure, are not ours (so
    // tests running on parallel threads do not disturb each other).
    let (allocated, measured) = (Barrier::new(2), Barrier::new(2));
    std::thread::scope(|s| {
        s.spawn(|| {
            allocated.wait();
            let ops = heap_ops(|| drop(std::hint::black_box(vec![1u8; 64])));
            assert_eq!(ops.allocs, 1);
            measured.wait();
        });
        let ops = heap_ops(|| {
            allocated.wait();
            measured.wait();
        });
        assert_eq!(ops, NONE);
    });
}

// ---------------------------------------------------------------------------
// SlotCounter
// ---------------------------------------------------------------------------

#[test]
fn admit_and_release_allocate_nothing() {
    let counter = SlotCounter::new(8);
    let closed = SlotCounter::new(8);
    closed.close();
    let ops = heap_ops(|| {
        for _ in 0..ITERS {
            assert_eq!(counter.admit(3), 3);
            assert_eq!(counter.admit(5), 5);
            // Refused: full, oversized, empty, negative, extreme.
            assert_eq!(counter.admit(1), 0);
            assert_eq!(counter.admit(9), 0);
            assert_eq!(counter.admit(0), 0);
            assert_eq!(counter.admit(-1), 0);
            assert_eq!(counter.admit(isize::MIN), 0);
            assert_eq!(counter.admit(isize::MAX), 0);
            assert_eq!(closed.admit(1), 0);
            assert_eq!(counter.release(5), Ok(()));
            // Refused: over-release.
            assert_eq!(
                counter.release(4),
                Err(ReleaseError::ExceedsUsed {
                    released: 4,
                    used: 3
                })
            );
            assert!(counter.release(usize::MAX).is_err());
            assert_eq!(counter.release(0), Ok(()));
            assert_eq!(counter.release(3), Ok(()));
            assert_eq!(
                (counter.used(), counter.available(), counter.peak_used()),
                (0, 8, 8)
            );
            assert!(!counter.is_closed() && closed.is_closed());
        }
    });
    assert_eq!(ops, NONE);
}

#[test]
fn reservations_allocate_nothing() {
    let counter = SlotCounter::new(8);
    let closed = SlotCounter::new(8);
    closed.close();
    let ops = heap_ops(|| {
        for _ in 0..ITERS {
            let mut r = counter.try_reserve(5).unwrap();
            // Refused: full, never fits, usize::MAX, closed.
            assert_eq!(
                counter.try_reserve(4).unwrap_err(),
                ReserveError::Full {
                    requested: 4,
                    available: 3
                }
            );
            assert_eq!(
                counter.try_reserve(9).unwrap_err(),
                ReserveError::NeverFits {
                    requested: 9,
                    capacity: 8
                }
            );
            assert!(counter.try_reserve(usize::MAX).is_err());
            assert_eq!(closed.try_reserve(1).unwrap_err(), ReserveError::Closed);
            let empty = counter.try_reserve(0).unwrap();
            assert!(empty.is_empty());
            // Headroom: admitted, refused as full, refused as never fitting.
            let h = counter.try_reserve_with_headroom(1, 2).unwrap();
            assert_eq!(
                counter.try_reserve_with_headroom(1, 2).unwrap_err(),
                ReserveError::Full {
                    requested: 1,
                    available: 2
                }
            );
            assert!(counter.try_reserve_with_headroom(1, usize::MAX).is_err());
            drop(h);
            // Split, merge, shrink (speculative rollback), grow.
            let part = r.split(2).unwrap();
            assert!(r.split(9).is_none());
            r.merge(part);
            r.shrink_to(2);
            r.shrink_to(7); // no-op
            r.try_grow(4).unwrap();
            assert_eq!(
                r.try_grow(3).unwrap_err(),
                ReserveError::Full {
                    requested: 3,
                    available: 2
                }
            );
            assert!(r.try_grow(usize::MAX).is_err());
            assert_eq!(r.len(), 6);
            // Forget, then release the count by hand.
            let n = r.forget();
            counter.release(n).unwrap();
            drop(empty);
            assert_eq!(counter.used(), 0);
        }
    });
    assert_eq!(ops, NONE);
}

#[test]
fn owned_reservations_allocate_nothing() {
    let counter = Arc::new(SlotCounter::new(8));
    let ops = heap_ops(|| {
        for _ in 0..ITERS {
            // The guard holds a clone of the Arc: a count, not an allocation.
            let mut r = counter.try_reserve_owned(6).unwrap();
            assert!(counter.try_reserve_owned(3).is_err());
            let part = r.split(1).unwrap();
            r.merge(part);
            r.shrink_to(4);
            r.try_grow(4).unwrap();
            assert!(r.try_grow(1).is_err());
            drop(r);
            assert_eq!(counter.used(), 0);
        }
    });
    assert_eq!(ops, NONE);
}

// ---------------------------------------------------------------------------
// BlockPool
// ---------------------------------------------------------------------------

#[test]
fn pool_alloc_and_free_into_a_reused_buffer_allocate_nothing() {
    const BLOCKS: usize = 16;
    let pool = BlockPool::new(BLOCKS, 16);
    let closed = BlockPool::new(BLOCKS, 16);
    closed.close();
    // Room for what is held plus any request that can fit: `try_alloc`
    // makes room for a request before admitting it.
    let mut held: Vec<BlockId> = Vec::with_capacity(2 * BLOCKS);
    let mut more: Vec<BlockId> = Vec::with_capacity(2 * BLOCKS);
    let ops = heap_ops(|| {
        for _ in 0..ITERS {
            pool.try_alloc(5, &mut held).unwrap();
            pool.try_alloc(0, &mut held).unwrap();
            pool.try_alloc_with_headroom(3, 2, &mut held).unwrap();
            assert_eq!(held.len(), 8);
            // Refused: full, with headroom, never fits, usize::MAX, closed.
            assert_eq!(
                pool.try_alloc(9, &mut more),
                Err(ReserveError::Full {
                    requested: 9,
                    available: 8
                })
            );
            assert!(pool.try_alloc_with_headroom(7, 2, &mut more).is_err());
            assert!(pool.try_alloc(BLOCKS + 1, &mut more).is_err());
            assert!(pool.try_alloc(usize::MAX, &mut more).is_err());
            assert_eq!(closed.try_alloc(1, &mut more), Err(ReserveError::Closed));
            assert!(more.is_empty());
            // Refused frees: out of range, duplicate, double free.
            let (a, b) = (held[0], held[1]);
            assert_eq!(
                pool.free(&[a, BlockId::new(BLOCKS as u32)]),
                Err(FreeError::OutOfRange {
                    id: BlockId::new(BLOCKS as u32),
                    num_blocks: BLOCKS
                })
            );
            assert_eq!(pool.free(&[a, a]), Err(FreeError::OverFreed { id: a }));
            assert_eq!(pool.ref_count(a), Some(1));
            pool.free(&held[..1]).unwrap();
            assert_eq!(pool.free(&[b, a]), Err(FreeError::NotAllocated { id: a }));
            pool.free(&held[1..]).unwrap();
            pool.free(&[]).unwrap();
            held.clear();
            assert_eq!((pool.used_blocks(), pool.free_blocks()), (0, BLOCKS));
        }
    });
    assert_eq!(ops, NONE);
}

/// The same over a free list of 4 shards: requests larger than the home
/// shard take from the others, and frees whose blocks belong to several
/// shards push one run per shard.
#[test]
fn sharded_pool_steals_and_split_frees_allocate_nothing() {
    const BLOCKS: usize = 64;
    let pool = BlockPool::with_shards(BLOCKS, 16, 4);
    let mut held: Vec<BlockId> = Vec::with_capacity(2 * BLOCKS);
    // The first call gives this thread its home shard (a thread-local).
    pool.try_alloc(1, &mut held).unwrap();
    pool.free(&held).unwrap();
    held.clear();
    let ops = heap_ops(|| {
        for _ in 0..ITERS {
            pool.try_alloc(20, &mut held).unwrap();
            pool.try_alloc(40, &mut held).unwrap();
            assert!(pool.try_alloc(5, &mut held).is_err());
            // Every other block: runs from every shard in one call.
            let odd: [BlockId; 30] = std::array::from_fn(|i| held[2 * i + 1]);
            pool.free(&odd).unwrap();
            pool.try_alloc(30, &mut held).unwrap();
            let (kept, _) = held.split_at(60);
            let evens: [BlockId; 30] = std::array::from_fn(|i| kept[2 * i]);
            pool.free(&evens).unwrap();
            pool.free(&held[60..]).unwrap();
            held.clear();
            assert_eq!(pool.free_blocks(), BLOCKS);
        }
    });
    assert_eq!(ops, NONE);
}

// ---------------------------------------------------------------------------
// Sequence
// ---------------------------------------------------------------------------

#[test]
fn sequence_appends_and_truncates_allocate_nothing() {
    const BLOCKS: usize = 64;
    const BS: usize = 4;
    let pool = Arc::new(BlockPool::new(BLOCKS, BS));
    // A table with room for the whole pool.
    let mut seq = Sequence::with_capacity(Arc::clone(&pool), BLOCKS * BS);
    let mut slots: Vec<usize> = Vec::with_capacity(BLOCKS * BS);
    // Blocks held by others, to make appends refused as full.
    let mut hog: Vec<BlockId> = Vec::with_capacity(2 * BLOCKS);
    let ops = heap_ops(|| {
        for _ in 0..ITERS / 10 {
            // A prefill chunk, decode steps, speculative drafts.
            assert_eq!(seq.try_append(13).unwrap(), 0..13);
            for i in 0..5 {
                assert_eq!(seq.try_append(1).unwrap(), 13 + i..14 + i);
            }
            assert_eq!(seq.try_append(4).unwrap(), 18..22);
            // Two drafts rejected: roll back (one block left the table).
            assert_eq!(seq.truncate(20), 1);
            assert_eq!(seq.truncate(20), 0); // no-op
            assert_eq!(seq.try_append_cow(0).unwrap(), (20..20, None));
            // Slot lookups.
            for p in 0..seq.len() {
                let slot = seq.slot(p).unwrap();
                assert_eq!(slot % BS, p % BS);
            }
            assert_eq!(seq.slot(seq.len()), None);
            seq.extend_slots(3..17, &mut slots).unwrap();
            assert_eq!(slots.len(), 14);
            assert_eq!(
                seq.extend_slots(19..21, &mut slots),
                Err(PositionError {
                    position: 20,
                    len: 20
                })
            );
            slots.clear();
            // Refused appends: never fits, and full while others hold the
            // rest of the pool.
            assert!(seq.try_append(usize::MAX).is_err());
            let rest = pool.free_blocks();
            pool.try_alloc(rest, &mut hog).unwrap();
            assert_eq!(
                seq.try_append(BS + 1).unwrap_err(),
                ReserveError::Full {
                    requested: 2,
                    available: 0
                }
            );
            // An append into the last block, which it holds, needs no block.
            assert_eq!(seq.truncate(19), 0);
            assert_eq!(seq.try_append(1).unwrap(), 19..20);
            pool.free(&hog).unwrap();
            hog.clear();
            // Grow to the whole reserved length, then back to nothing.
            seq.try_append(BLOCKS * BS - seq.len()).unwrap();
            assert_eq!(seq.blocks().len(), BLOCKS);
            assert_eq!(seq.truncate(0), BLOCKS);
            assert!(seq.is_empty());
            // Reserve, fill part, give the rest back.
            seq.try_reserve(3 * BS, 0).unwrap();
            seq.try_append(1).unwrap();
            assert_eq!(seq.shrink_to_fit(), 2);
            assert_eq!(seq.shrink_to_fit(), 0);
            assert_eq!(seq.truncate(0), 1);
        }
    });
    assert_eq!(ops, NONE);
    assert_eq!(pool.used_blocks(), 0);
}

#[test]
fn copy_on_write_append_within_capacity_allocates_nothing() {
    // A sequence reserved for 8 tokens (2 blocks of 4) holds 6 and forks:
    // the child shares the first block. Truncating into it and appending
    // again copies that block on write. The table never holds more than 2
    // entries, so the append stays within the reserved capacity.
    const BS: usize = 4;
    let pool = Arc::new(BlockPool::new(8, BS));
    let mut seq = Sequence::with_capacity(Arc::clone(&pool), 2 * BS);
    seq.try_append(6).unwrap();
    let (child, _copy) = seq.try_fork().unwrap();
    assert_eq!(seq.truncate(2), 1);
    let ops = heap_ops(|| {
        let (range, copy) = seq.try_append_cow(6).unwrap();
        assert_eq!(range, 2..8);
        assert_eq!(
            copy.map(|c| (c.src, c.tokens)),
            Some((child.blocks()[0], 2))
        );
    });
    assert_eq!(seq.blocks().len(), 2);
    assert_eq!(
        ops, NONE,
        "a copy-on-write append that ends within the table's reserved capacity \
         (2 entries) allocated"
    );
}

#[test]
fn prefix_match_publish_and_eviction_allocate_nothing() {
    prefix_rounds_allocate_nothing(Arc::new(BlockPool::new(16, 4)));
}

/// With KV events, the producers (publish, eviction, reset, truncate into
/// a cached block) allocate nothing, whether their ring has room or is
/// full (a ring of 32 records in all, not drained during the loop).
#[test]
fn kv_event_producers_allocate_nothing() {
    let pool = Arc::new(
        BlockPool::builder(16, 4)
            .prefix_cache(true)
            .kv_events(32)
            .build()
            .unwrap(),
    );
    prefix_rounds_allocate_nothing(Arc::clone(&pool));
    let dropped = pool.stats().events_dropped.unwrap();
    assert!(dropped > 0, "the ring never filled");
    let mut events = Vec::new();
    pool.drain_events(&mut events);
    let stored = events
        .iter()
        .filter(|e| matches!(e, kvslots::KvEvent::BlockStored { .. }))
        .count();
    assert!(stored > 0, "{events:?}");
    let reported: u64 = events
        .iter()
        .map(|e| match e {
            kvslots::KvEvent::Dropped { count } => *count,
            _ => 0,
        })
        .sum();
    assert_eq!(reported, dropped);
}

thread_local! {
    /// The heap operations of this thread's last match into a reservation
    /// made inside the pool (see `inside_the_pool`).
    static INSIDE: Cell<HeapOps> = const { Cell::new(NONE) };
}

/// Runs a forwarded match into a reservation, counting its heap
/// operations into `INSIDE` (`Forward::around_lending`).
fn inside_the_pool(call: &mut dyn FnMut()) {
    let ops = heap_ops(call);
    INSIDE.with(|inside| inside.set(ops));
}

/// A match into a reservation makes room in the table first, for every
/// block it can take and one more (a lent block's credit that a race left
/// unused takes a block back through the end of the table): inside the
/// pool, where it holds blocks revived and admissions made ahead, nothing
/// allocates. Reservations of 1 to 9 blocks in tables sized by them, each
/// matching 16 cached blocks, revivals paid by the blocks lent and by
/// admissions ahead.
#[test]
fn a_match_into_a_reservation_allocates_nothing_inside_the_pool() {
    let fwd = Forward::new(BlockPool::new(64, 4));
    assert!(fwd.around_lending.set(inside_the_pool).is_ok());
    let tokens: Vec<u32> = (0..64).collect();
    let mut keys = Vec::new();
    hash_blocks(b"", &tokens, 4, &mut keys);
    let mut owner = Sequence::new(Arc::clone(&fwd));
    owner.try_append(64).unwrap();
    assert_eq!(owner.publish(&keys), 16);
    drop(owner);
    // Warm up once (a thread's first match may set up its own state).
    let mut s = Sequence::new(Arc::clone(&fwd));
    s.try_reserve(4, 0).unwrap();
    assert_eq!(s.try_match_prefix(&keys), 16);
    drop(s);
    for reserved in 1..=9 {
        let mut s = Sequence::new(Arc::clone(&fwd));
        s.try_reserve(reserved * 4, 0).unwrap();
        // A mark that the measure replaces: a match that never reached the
        // pool's lending call leaves it, and fails.
        INSIDE.with(|inside| {
            inside.set(HeapOps {
                allocs: 1,
                frees: 1,
            })
        });
        assert_eq!(s.try_match_prefix(&keys), 16, "reserved {reserved}");
        assert_eq!(INSIDE.with(Cell::get), NONE, "reserved {reserved}");
        assert_eq!(s.blocks().len(), 16);
        drop(s);
        assert_eq!(fwd.inner.used_blocks(), 0);
    }
}

/// Rounds of peeks, matches, appends, publishes, truncates and resets on
/// `pool` (16 blocks of 4 tokens) allocate nothing once warmed up.
fn prefix_rounds_allocate_nothing(pool: Arc<BlockPool>) {
    // A pool of 16 blocks of 4 tokens and 6 prompt families of 6 blocks
    // each, sharing their first 2: the cache holds at most 2 families, so
    // matches revive and share blocks, appends evict, publishes race the
    // first-wins rule, and truncates (also into a cached block) release.
    const BLOCKS: usize = 16;
    const BS: usize = 4;
    assert_eq!((pool.num_blocks(), pool.block_size()), (BLOCKS, BS));
    let families: Vec<Vec<BlockHash>> = (0..6u32)
        .map(|f| {
            let tokens: Vec<u32> = (0..6 * BS as u32)
                .map(|t| if t < 2 * BS as u32 { t } else { f * 1000 + t })
                .collect();
            let mut keys = Vec::new();
            hash_blocks(b"", &tokens, BS, &mut keys);
            keys
        })
        .collect();
    let mut a = Sequence::with_capacity(Arc::clone(&pool), BLOCKS * BS);
    let mut b = Sequence::with_capacity(Arc::clone(&pool), BLOCKS * BS);
    let round = |i: usize, a: &mut Sequence, b: &mut Sequence| {
        let keys = &families[i % families.len()];
        // A peek first: what the match then takes (nothing runs between).
        let peeked = pool.peek_prefix(keys);
        let k = a.try_match_prefix(keys);
        assert_eq!(peeked, k);
        a.try_append(6 * BS - k * BS).unwrap();
        a.publish(keys);
        // A second sequence of the same prompt shares what is cached.
        let other = &families[(i + 1) % families.len()];
        let j = b.try_match_prefix(other);
        if b.try_append(6 * BS - j * BS).is_ok() {
            b.publish(other);
        }
        // Roll back into a cached block, append again, then release.
        a.truncate(5 * BS + 1);
        let _ = a.try_append_cow(2).unwrap();
        assert_eq!(a.truncate(0), 6);
        b.truncate(0);
        if i % 7 == 0 {
            pool.reset_prefix_cache();
        }
    };
    // Warm up once.
    round(0, &mut a, &mut b);
    let before = pool.prefix_stats();
    let ops = heap_ops(|| {
        for i in 1..ITERS / 10 {
            round(i, &mut a, &mut b);
        }
    });
    assert_eq!(ops, NONE);
    let after = pool.prefix_stats();
    // The measured loop matched and evicted.
    assert!(after.hit_blocks > before.hit_blocks);
    assert!(after.evictions > before.evictions);
    assert_eq!(pool.used_blocks(), 0);
}

#[test]
fn hybrid_appends_windows_matches_and_publishes_allocate_nothing() {
    // gpt-oss's layout in small: a sliding window of 8 tokens and full
    // attention, blocks of 4. Each round matches a cached prompt, decodes
    // past the window (blocks given back and reused), speculates and rolls
    // back, publishes, and drops the tables' contents.
    const BS: usize = 4;
    const TOKENS: usize = 96;
    let pool = Arc::new(BlockPool::new(256, BS));
    let groups =
        KvGroups::new([KvGroup::SlidingWindow { window_tokens: 8 }, KvGroup::Full]).unwrap();
    let prompt: Vec<u32> = (0..40).collect();
    let mut base = Vec::new();
    hash_blocks(b"", &prompt, BS, &mut base);
    let keys = groups.keys(&base);
    let mut seq = HybridSequence::with_capacity(Arc::clone(&pool), groups.clone(), TOKENS);
    let mut copies = Vec::with_capacity(4);
    let mut slots: Vec<usize> = Vec::with_capacity(TOKENS);
    let round = |seq: &mut HybridSequence, copies: &mut Vec<_>, slots: &mut Vec<usize>| {
        let peeked = pool.peek_hybrid_prefix(&keys);
        let k = seq.try_match_prefix(&keys).unwrap();
        assert_eq!(peeked, k);
        seq.try_append(prompt.len() - k * BS).unwrap();
        seq.publish(&keys).unwrap();
        for _ in 0..30 {
            let new = seq.try_append(1).unwrap();
            for g in 0..2 {
                slots.clear();
                seq.extend_slots(g, new.clone(), slots).unwrap();
            }
        }
        let drafts = seq.try_append_cow(5, copies).unwrap();
        seq.truncate(drafts.start + 2).unwrap();
        copies.clear();
        assert!(seq.try_append(usize::MAX).is_err());
        seq.truncate(0).unwrap();
    };
    // Warm up once: the tables and lists reach their size.
    round(&mut seq, &mut copies, &mut slots);
    let ops = heap_ops(|| {
        for _ in 0..ITERS / 100 {
            round(&mut seq, &mut copies, &mut slots);
        }
    });
    assert_eq!(ops, NONE);
    assert!(pool.prefix_stats().hit_blocks > 0);
    drop(seq);
    assert_eq!(pool.used_blocks(), 0);
}

// ---------------------------------------------------------------------------
// Waiting: the queue's buffer is reused
// ---------------------------------------------------------------------------

/// A waker that does nothing; it is an `Arc`, so cloning it allocates
/// nothing.
struct NoopWake;

impl std::task::Wake for NoopWake {
    fn wake(self: Arc<Self>) {}
}

#[test]
fn a_wait_cycle_allocates_nothing_once_the_queue_has_grown() {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    let counter = SlotCounter::new(4);
    let pool = BlockPool::new(4, 16);
    let waker = Waker::from(Arc::new(NoopWake));
    let mut ids = Vec::with_capacity(8);
    let mut held_ids = Vec::with_capacity(8);
    // One cycle: queue behind a full allocator, be granted by the
    // release, collect; and a cancelled wait.
    let mut cycle = || {
        let mut cx = Context::from_waker(&waker);
        let held = counter.try_reserve(4).unwrap();
        {
            let mut fut = pin!(counter.reserve(3));
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            drop(held);
            assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Ready(Ok(r)) if r.len() == 3));
        }
        {
            let held = counter.try_reserve(4).unwrap();
            let mut fut = pin!(counter.reserve(1));
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            drop(held);
        } // granted, never collected: given back
        pool.try_alloc(4, &mut held_ids).unwrap();
        {
            let mut fut = pin!(pool.alloc(2, &mut ids));
            assert!(fut.as_mut().poll(&mut cx).is_pending());
            pool.free(&held_ids).unwrap();
            assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Ready(Ok(()))));
        }
        pool.free(&ids).unwrap();
        ids.clear();
        held_ids.clear();
        assert_eq!((counter.used(), pool.used_blocks()), (0, 0));
    };
    cycle(); // warm-up: the queues' buffers grow here
    assert_eq!(
        heap_ops(|| {
            for _ in 0..ITERS {
                cycle();
            }
        }),
        NONE
    );
}

// ---------------------------------------------------------------------------
// Fenced release
// ---------------------------------------------------------------------------

/// A retire moves the sequence's own table in as its fence's list and a
/// complete only frees that list: nothing is allocated per block. A fenced
/// truncate allocates its fence's list once, whatever the number of blocks
/// it drops.
#[test]
fn retire_and_complete_allocate_nothing_per_block() {
    let pool = Arc::new(BlockPool::new(512, 4));
    // Warm up the map of fences 0, 8, 16, ... (the same one of 8 maps).
    let mut warm = Sequence::new(Arc::clone(&pool));
    warm.try_append(4).unwrap();
    warm.retire(0);
    pool.complete(0);
    for _ in 0..ITERS / 1000 {
        let mut seq = Sequence::with_capacity(Arc::clone(&pool), 400);
        seq.try_append(400).unwrap(); // 100 blocks
        let ops = heap_ops(|| assert_eq!(seq.retire(8), 100));
        assert_eq!(ops, NONE, "retire");
        let ops = heap_ops(|| assert_eq!(pool.complete(8), 100));
        assert_eq!(
            ops,
            HeapOps {
                allocs: 0,
                frees: 1
            },
            "complete frees the moved table"
        );
        let mut seq = Sequence::with_capacity(Arc::clone(&pool), 400);
        seq.try_append(400).unwrap();
        let ops = heap_ops(|| assert_eq!(seq.truncate_fenced(4, 16), 99));
        assert_eq!(ops.allocs, 1, "one list for the fence: {ops:?}");
        assert_eq!(ops.frees, 0);
        pool.complete(16);
        drop(seq);
    }
    assert_eq!(pool.free_blocks(), 512);
}
