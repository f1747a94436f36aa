//! A waker that panics loses no block (the crate docs' guarantee table):
//! the panic comes out of whichever give-back granted its waiter, and the
//! call it comes out of leaves everything whole. A sequence lists exactly
//! what it holds, none of what it gave back (so its drop gives back
//! neither twice nor too little), a hybrid sequence's groups agree on its
//! length, and a pool's `complete_all` gives back every fence's
//! references. Each test parks an async waiter whose waker panics,
//! makes the call whose give-back grants it, catches the panic, and checks
//! the books once everything is dropped.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use kvslots::{BlockId, BlockPool, HybridSequence, KvGroup, KvGroups, ReserveError, Sequence};

/// What the waker panics with.
const WAKER_PANIC: &str = "a waker that panics (tests/waker_panic.rs)";

/// A waker that panics when woken.
struct Panics;

impl Wake for Panics {
    fn wake(self: Arc<Self>) {
        panic!("{WAKER_PANIC}");
    }
}

/// A waker that does nothing.
struct Noop;

impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// Keeps the default hook from printing the waker's panic.
fn quiet() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info.payload().downcast_ref::<String>();
            if message.map(String::as_str) != Some(WAKER_PANIC) {
                previous(info);
            }
        }));
    });
}

/// Runs `f` and checks that it unwinds with the waker's panic.
fn unwinds_with_the_waker(f: impl FnOnce()) {
    let payload = catch_unwind(AssertUnwindSafe(f)).expect_err("the waker's panic comes out");
    assert_eq!(
        payload.downcast_ref::<String>().map(String::as_str),
        Some(WAKER_PANIC)
    );
}

/// Polls `fut` once with `waker`.
fn poll<F: Future + ?Sized>(fut: Pin<&mut F>, waker: Waker) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(&waker))
}

/// An async waiter for `n` blocks of `pool`, queued with a waker that
/// panics; `finish` collects its grant (with a quiet waker) and returns
/// the ids.
struct Waiter<'a> {
    fut: Pin<Box<dyn Future<Output = Result<(), ReserveError>> + 'a>>,
}

impl<'a> Waiter<'a> {
    fn queue(pool: &'a BlockPool, n: usize, ids: &'a mut Vec<BlockId>) -> Waiter<'a> {
        let mut fut: Pin<Box<dyn Future<Output = _> + 'a>> = Box::pin(pool.alloc(n, ids));
        assert!(poll(fut.as_mut(), Waker::from(Arc::new(Panics))).is_pending());
        Waiter { fut }
    }

    fn finish(mut self) {
        let granted = poll(self.fut.as_mut(), Waker::from(Arc::new(Noop)));
        assert!(matches!(granted, Poll::Ready(Ok(()))), "{granted:?}");
    }
}

#[test]
fn a_truncate_unwound_by_a_waker_keeps_no_block_it_gave_back() {
    quiet();
    let pool = Arc::new(BlockPool::new(2, 16));
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(32).unwrap();
    let mut ids = Vec::new();
    let waiter = Waiter::queue(&pool, 2, &mut ids);
    unwinds_with_the_waker(|| {
        seq.truncate(0);
    });
    waiter.finish();
    // The truncate is whole: nothing listed, nothing counted.
    assert_eq!((seq.len(), seq.blocks().len(), seq.capacity()), (0, 0, 0));
    assert_eq!(ids.len(), 2);
    // Its drop gives back nothing the waiter holds.
    drop(seq);
    assert_eq!(pool.used_blocks(), 2);
    assert_eq!(
        pool.try_alloc(1, &mut Vec::new()),
        Err(ReserveError::Full {
            requested: 1,
            available: 0
        })
    );
    pool.free(&ids).unwrap();
    assert_eq!(pool.free_blocks(), 2);
}

/// A sequence that keeps a copy-on-write source, held by it alone (a pool
/// of 3 blocks of 4 tokens, 2 of them used).
fn holding_a_copy_source(pool: &Arc<BlockPool>) -> Sequence {
    let mut seq = Sequence::new(Arc::clone(pool));
    seq.try_append(4).unwrap();
    let (child, _) = seq.try_fork().unwrap();
    seq.truncate(2);
    let (_, copy) = seq.try_append_cow(1).unwrap();
    assert!(copy.is_some());
    drop(child);
    assert_eq!(pool.used_blocks(), 2);
    seq
}

#[test]
fn a_drop_unwound_by_a_waker_still_gives_back_its_table() {
    quiet();
    let pool = Arc::new(BlockPool::new(3, 4));
    let seq = holding_a_copy_source(&pool);
    let mut other = Vec::new();
    pool.try_alloc(1, &mut other).unwrap();
    let mut ids = Vec::new();
    let waiter = Waiter::queue(&pool, 1, &mut ids);
    // The copy source goes first and grants the waiter.
    unwinds_with_the_waker(|| drop(seq));
    waiter.finish();
    pool.free(&ids).unwrap();
    pool.free(&other).unwrap();
    assert_eq!((pool.used_blocks(), pool.free_blocks()), (0, 3));
}

#[test]
fn a_truncate_unwound_by_a_waker_keeps_its_copy_source_until_its_drop() {
    quiet();
    let pool = Arc::new(BlockPool::new(3, 4));
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(8).unwrap();
    let (child, _) = seq.try_fork().unwrap();
    seq.truncate(6);
    // The shared second block is copied; the sequence keeps it as the
    // source, then holds it alone.
    let (_, copy) = seq.try_append_cow(1).unwrap();
    let src = copy.unwrap().src;
    drop(child);
    assert_eq!(pool.used_blocks(), 3);
    let mut ids = Vec::new();
    let waiter = Waiter::queue(&pool, 1, &mut ids);
    // The truncate gives back the copy's block (granting the waiter),
    // then would give back the source.
    unwinds_with_the_waker(|| {
        seq.truncate(4);
    });
    waiter.finish();
    assert_eq!((seq.len(), seq.blocks().len()), (4, 1));
    assert_eq!(pool.ref_count(src), Some(1), "the source is still kept");
    drop(seq);
    pool.free(&ids).unwrap();
    assert_eq!((pool.used_blocks(), pool.free_blocks()), (0, 3));
}

#[test]
fn complete_all_unwound_by_a_waker_gives_back_every_fence() {
    quiet();
    let pool = Arc::new(BlockPool::new(4, 16));
    // Fences 0, 8, 16 and 24 share one of the pool's maps of fences.
    for fence in [0u64, 8, 16, 24] {
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(16).unwrap();
        seq.retire(fence);
    }
    let mut ids = Vec::new();
    let waiter = Waiter::queue(&pool, 1, &mut ids);
    unwinds_with_the_waker(|| {
        pool.complete_all();
    });
    waiter.finish();
    assert_eq!(pool.pending_release_blocks(), 0);
    assert_eq!(pool.used_blocks(), 1, "only the waiter's block");
    pool.free(&ids).unwrap();
    assert_eq!(pool.complete_all(), 0);
    assert_eq!(pool.free_blocks(), 4);
}

#[test]
fn complete_unwound_by_a_waker_counts_its_references_out() {
    quiet();
    let pool = Arc::new(BlockPool::new(2, 16));
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(32).unwrap();
    seq.retire(5);
    let mut ids = Vec::new();
    let waiter = Waiter::queue(&pool, 2, &mut ids);
    unwinds_with_the_waker(|| {
        pool.complete(5);
    });
    waiter.finish();
    assert_eq!(pool.pending_release_blocks(), 0);
    pool.free(&ids).unwrap();
    assert_eq!(pool.free_blocks(), 2);
}

#[test]
fn a_hybrid_truncate_unwound_by_a_waker_cuts_every_group() {
    quiet();
    let pool = Arc::new(BlockPool::new(4, 16));
    let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    seq.try_append(32).unwrap(); // 2 blocks a group: the whole pool
    let mut ids = Vec::new();
    // The first group's give-back grants the waiter.
    let waiter = Waiter::queue(&pool, 2, &mut ids);
    unwinds_with_the_waker(|| {
        seq.truncate(0).unwrap();
    });
    waiter.finish();
    assert_eq!(seq.len(), 0);
    assert_eq!(seq.held_blocks(), 0, "a group was left uncut");
    assert_eq!(pool.used_blocks(), 2);
    drop(seq);
    assert_eq!(pool.used_blocks(), 2);
    pool.free(&ids).unwrap();
    assert_eq!(pool.free_blocks(), 4);
}

#[test]
fn a_hybrid_shrink_unwound_by_a_waker_shrinks_every_group() {
    quiet();
    let pool = Arc::new(BlockPool::new(4, 16));
    let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    seq.try_reserve(32, 0).unwrap(); // 2 blocks a group, no token
    let mut ids = Vec::new();
    let waiter = Waiter::queue(&pool, 2, &mut ids);
    unwinds_with_the_waker(|| {
        seq.shrink_to_fit();
    });
    waiter.finish();
    assert_eq!(seq.held_blocks(), 0, "a group kept its reservation");
    drop(seq);
    pool.free(&ids).unwrap();
    assert_eq!(pool.free_blocks(), 4);
}

/// A hybrid sequence (a full group and a sliding window of 4 tokens, blocks
/// of 4) of 11 tokens whose groups each keep a copy-on-write source they
/// hold alone, and a waiter (whose waker panics) for one block more than
/// the pool has free. The append of 5 more reuses the window's blocks
/// (no admission) and gives back each group's source: the first grants
/// the waiter. Returns the sequence and the waiter's blocks.
fn hybrid_append_unwound_by_a_waker(pool: &Arc<BlockPool>) -> (HybridSequence, Vec<BlockId>) {
    let groups =
        KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 4 }]).unwrap();
    let mut seq = HybridSequence::new(Arc::clone(pool), groups);
    seq.try_append(8).unwrap();
    let mut copies = Vec::new();
    let child = seq.try_fork(&mut copies).unwrap();
    seq.truncate(6).unwrap();
    seq.try_append_cow(5, &mut copies).unwrap();
    assert_eq!(copies.len(), 2);
    drop(child);
    let mut ids = Vec::new();
    let waiter = Waiter::queue(pool, pool.free_blocks() + 1, &mut ids);
    copies.clear();
    unwinds_with_the_waker(|| {
        seq.try_append_cow(5, &mut copies).unwrap();
    });
    waiter.finish();
    assert_eq!(copies.len(), 0, "no copy in the second append");
    (seq, ids)
}

#[test]
fn a_hybrid_append_unwound_by_a_waker_commits_every_group() {
    quiet();
    let pool = Arc::new(BlockPool::new(16, 4));
    let (mut seq, ids) = hybrid_append_unwound_by_a_waker(&pool);
    assert_eq!(seq.len(), 16);
    assert_eq!(seq.blocks(0).unwrap().len(), seq.blocks(1).unwrap().len());
    assert_eq!(seq.capacity(), 16);
    // No block is both the waiter's and the sequence's.
    let mut held: Vec<BlockId> = [seq.blocks(0).unwrap(), seq.blocks(1).unwrap()]
        .concat()
        .into_iter()
        .filter(|&id| id != BlockId::NULL)
        .chain(ids.iter().copied())
        .collect();
    let listed = held.len();
    held.sort_unstable();
    held.dedup();
    assert_eq!(held.len(), listed, "a block listed twice");
    assert_eq!(pool.used_blocks(), listed);
    seq.try_append_cow(1, &mut Vec::new()).unwrap();
    drop(seq);
    pool.free(&ids).unwrap();
    assert_eq!(pool.used_blocks(), 0, "blocks lost");
}

#[test]
fn an_append_unwound_by_a_waker_is_undone() {
    quiet();
    let pool = Arc::new(BlockPool::new(3, 4));
    let mut seq = holding_a_copy_source(&pool); // 3 tokens, the source kept
    let mut other = Vec::new();
    pool.try_alloc(1, &mut other).unwrap();
    let mut ids = Vec::new();
    let waiter = Waiter::queue(&pool, 1, &mut ids);
    // The append fits in the block held; it gives back the source first,
    // which grants the waiter.
    unwinds_with_the_waker(|| {
        seq.try_append(1).unwrap();
    });
    waiter.finish();
    assert_eq!((seq.len(), seq.blocks().len(), seq.capacity()), (3, 1, 4));
    assert_eq!(seq.try_append(1).unwrap(), 3..4);
    drop(seq);
    pool.free(&ids).unwrap();
    pool.free(&other).unwrap();
    assert_eq!(pool.free_blocks(), 3);
}
