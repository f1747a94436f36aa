//! Helpers of the hybrid attack tests: layouts, keys, a sequence's tables,
//! a publisher, the pool's books, and a waker that records its wake.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::task::Wake;
use std::thread;

use kvslots::{
    hash_blocks, BlockAllocator, BlockId, BlockPool, GroupKeys, HybridSequence, KvGroup, KvGroups,
};

/// A sliding window of `window_tokens` tokens.
pub fn sliding(window_tokens: usize) -> KvGroup {
    KvGroup::SlidingWindow { window_tokens }
}

/// A layout of these kinds.
pub fn groups(kinds: &[KvGroup]) -> KvGroups {
    KvGroups::new(kinds.iter().copied()).unwrap()
}

/// The keys of `tokens` in blocks of `bs`, for the groups `g`.
pub fn group_keys(g: &KvGroups, tokens: &[u32], bs: usize) -> GroupKeys {
    let mut base = Vec::new();
    hash_blocks(b"", tokens, bs, &mut base);
    g.keys(&base)
}

/// Every table, for comparing a sequence before and after a call.
pub fn tables<A: BlockAllocator + ?Sized>(seq: &HybridSequence<A>) -> Vec<Vec<BlockId>> {
    (0..seq.groups().len())
        .map(|g| seq.blocks(g).unwrap().to_vec())
        .collect()
}

/// Every block a sequence's tables hold (null entries aside).
pub fn held<A: BlockAllocator + ?Sized>(seq: &HybridSequence<A>) -> Vec<BlockId> {
    tables(seq)
        .into_iter()
        .flatten()
        .filter(|id| !id.is_null())
        .collect()
}

/// A request of `tokens` prefilled and published, returned still held.
pub fn publisher<A: BlockAllocator + ?Sized>(
    pool: &Arc<A>,
    g: &KvGroups,
    tokens: &[u32],
) -> HybridSequence<A> {
    let bs = pool.block_size();
    let mut seq = HybridSequence::new(Arc::clone(pool), g.clone());
    seq.try_append(tokens.len()).unwrap();
    seq.publish(&group_keys(g, tokens, bs)).unwrap();
    seq
}

/// The books are whole: nothing used, every block free and takeable once.
pub fn assert_whole(pool: &BlockPool) {
    pool.complete_all();
    assert_eq!(pool.used_blocks(), 0, "used after every holder let go");
    assert_eq!(pool.free_blocks(), pool.num_blocks(), "free != num_blocks");
    assert_eq!(pool.evictable_blocks(), pool.cached_blocks());
    for i in 0..pool.num_blocks() as u32 {
        assert_eq!(pool.ref_count(BlockId::new(i)), Some(0), "block {i}");
    }
    if !pool.is_closed() {
        let mut all = Vec::new();
        pool.try_alloc(pool.num_blocks(), &mut all)
            .expect("every block can be taken");
        let set: HashSet<_> = all.iter().collect();
        assert_eq!(set.len(), pool.num_blocks(), "distinct ids");
        assert!(pool.try_alloc(1, &mut Vec::new()).is_err());
        pool.free(&all).unwrap();
        assert_eq!(pool.used_blocks(), 0);
    }
}

/// A waker that records its wake and unparks the thread that made it.
pub struct Flag(pub AtomicBool, thread::Thread);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, SeqCst);
        self.1.unpark();
    }
}

/// A [`Flag`] not woken yet.
pub fn flag() -> Arc<Flag> {
    Arc::new(Flag(AtomicBool::new(false), thread::current()))
}
