//! `Sequence` over an allocator of the test's own: a `BlockAllocator`
//! with only the required methods (no prefix cache: the trait's defaults),
//! its state under one mutex. The sequence's rules (all or nothing,
//! copy-on-write, forks, rollback, fenced release) must hold over it as
//! over a `BlockPool`, and the default prefix calls must cache nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;

use common::Forward;
use kvslots::{
    hash_blocks, BlockAllocator, BlockId, BlockPool, HybridSequence, KvEvent, KvGroup, KvGroups,
    ReserveError, Sequence, SequenceCall,
};

/// Free ids, a count per block and the fences' lists, under one lock.
struct Plain {
    state: Mutex<State>,
    num_blocks: usize,
    block_size: usize,
}

#[derive(Default)]
struct State {
    free: Vec<u32>,
    refs: Vec<u32>,
    fenced: HashMap<u64, Vec<BlockId>>,
}

impl Plain {
    fn new(num_blocks: usize, block_size: usize) -> Arc<Plain> {
        let state = State {
            free: (0..num_blocks as u32).rev().collect(),
            refs: vec![0; num_blocks],
            fenced: HashMap::new(),
        };
        Arc::new(Plain {
            state: Mutex::new(state),
            num_blocks,
            block_size,
        })
    }

    fn used(&self) -> usize {
        self.num_blocks - self.state.lock().unwrap().free.len()
    }

    fn refs(&self, id: BlockId) -> u32 {
        self.state.lock().unwrap().refs[id.index()]
    }

    fn complete(&self, fence: u64) -> usize {
        let list = self.state.lock().unwrap().fenced.remove(&fence);
        list.map_or(0, |ids| {
            self.give_back(&ids);
            ids.len()
        })
    }

    /// Drops one reference to each of `ids`, the last listed first.
    fn give_back(&self, ids: &[BlockId]) {
        let mut s = self.state.lock().unwrap();
        for id in ids.iter().rev() {
            let refs = &mut s.refs[id.index()];
            *refs -= 1;
            if *refs == 0 {
                s.free.push(id.index() as u32);
            }
        }
    }
}

impl BlockAllocator for Plain {
    fn num_blocks(&self) -> usize {
        self.num_blocks
    }
    fn block_size(&self) -> usize {
        self.block_size
    }
    fn try_alloc_with_headroom(
        &self,
        _: &SequenceCall<'_>,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        if n.saturating_add(headroom) > self.num_blocks {
            return Err(ReserveError::NeverFits {
                requested: n,
                capacity: self.num_blocks,
            });
        }
        let mut s = self.state.lock().unwrap();
        let available = s.free.len();
        if n + headroom > available {
            return Err(ReserveError::Full {
                requested: n,
                available,
            });
        }
        for _ in 0..n {
            let id = s.free.pop().unwrap();
            s.refs[id as usize] = 1;
            out.push(BlockId::new(id));
        }
        Ok(())
    }
    fn alloc_with_headroom_blocking(
        &self,
        by: &SequenceCall<'_>,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
        _timeout: Option<Duration>,
    ) -> Result<(), ReserveError> {
        // The tests below never wait.
        self.try_alloc_with_headroom(by, n, headroom, out)
    }
    fn add_refs(&self, _: &SequenceCall<'_>, ids: &[BlockId]) -> usize {
        let mut s = self.state.lock().unwrap();
        for (added, id) in ids.iter().enumerate() {
            if s.refs[id.index()] == 0 {
                return added;
            }
            s.refs[id.index()] += 1;
        }
        ids.len()
    }
    fn release(&self, _: &SequenceCall<'_>, ids: &[BlockId]) {
        self.give_back(ids);
    }
    fn needs_copy(&self, id: BlockId) -> bool {
        self.refs(id) > 1
    }
    fn retire(&self, _: &SequenceCall<'_>, fence: u64, ids: &[BlockId]) -> usize {
        let mut s = self.state.lock().unwrap();
        s.fenced.entry(fence).or_default().extend_from_slice(ids);
        ids.len()
    }
}

#[test]
fn a_sequence_keeps_its_rules_over_another_allocator() {
    let pool = Plain::new(4, 4);
    let mut seq = Sequence::new(Arc::clone(&pool));
    // 2 blocks.
    assert_eq!(seq.try_append(6).unwrap(), 0..6);
    // Never beside its own 2 blocks: the rest of the pool is the capacity.
    assert_eq!(
        seq.try_append(100),
        Err(ReserveError::NeverFits {
            requested: 25,
            capacity: 2
        })
    );
    assert_eq!((seq.len(), pool.used()), (6, 2));
    // A fork shares the full block and copies the partial one.
    let (mut child, copy) = seq.try_fork().unwrap();
    let copy = copy.unwrap();
    assert_eq!((copy.src, copy.tokens), (seq.blocks()[1], 2));
    assert_eq!(pool.refs(seq.blocks()[0]), 2);
    // Back into the shared block: the append copies it on write.
    child.truncate(2);
    let (range, cow) = child.try_append_cow(1).unwrap();
    assert_eq!((range, cow.map(|c| c.tokens)), (2..3, Some(2)));
    assert_eq!(
        pool.refs(seq.blocks()[0]),
        2,
        "the source is kept for the copy"
    );
    child.try_append(1).unwrap();
    assert_eq!(pool.refs(seq.blocks()[0]), 1);
    // Fenced release: the blocks stay used until the fence completes.
    assert_eq!(child.retire(9), 1);
    assert_eq!(pool.used(), 3);
    assert_eq!(pool.complete(9), 1);
    assert_eq!(seq.truncate_fenced(1, 4), 1);
    assert_eq!(pool.used(), 2);
    drop(seq);
    assert_eq!((pool.used(), pool.complete(4)), (1, 1));
    assert_eq!(pool.used(), 0);
}

/// The trait's default prefix calls cache nothing: a publish caches no
/// block and a match misses, changing nothing.
#[test]
fn the_default_prefix_calls_cache_nothing() {
    let pool = Plain::new(4, 4);
    let mut keys = Vec::new();
    hash_blocks(b"", &[1, 2, 3, 4, 5, 6, 7, 8], 4, &mut keys);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(8).unwrap();
    assert_eq!(seq.publish(&keys), 0);
    seq.truncate(6); // into a block that would hold a key: none does
    assert_eq!(seq.try_append_cow(1).unwrap().1, None);
    let mut other = Sequence::new(Arc::clone(&pool));
    assert_eq!(other.try_match_prefix(&keys), 0);
    assert_eq!((other.len(), pool.used()), (0, 2));
}

/// A sequence over a trait object: the allocator chosen at run time.
#[test]
fn a_sequence_over_a_trait_object() {
    let pools: [Arc<dyn BlockAllocator + Send + Sync>; 2] =
        [Plain::new(4, 4), Arc::new(BlockPool::new(4, 4))];
    for pool in pools {
        let mut seq = Sequence::new(pool);
        assert_eq!(seq.try_append(9).unwrap(), 0..9);
        assert_eq!(seq.blocks().len(), 3);
        assert!(seq.try_append(8).is_err());
    }
}

/// Sequences over a forwarding allocator: appends, a fork, a publish and
/// a match, copy-on-write and fenced release reach the inner pool, whose
/// raw calls still refuse the sequences' blocks.
#[test]
fn a_forwarding_allocator_passes_the_token_through() {
    let pool = Forward::new(BlockPool::builder(8, 4).prefix_cache(true).build().unwrap());
    let tokens: Vec<u32> = (0..10).collect();
    let mut keys = Vec::new();
    hash_blocks(b"", &tokens, 4, &mut keys);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(10).unwrap(); // 3 blocks, the last partly filled
    assert_eq!(seq.publish(&keys), 2);
    let (mut child, copy) = seq.try_fork().unwrap();
    assert!(copy.is_some(), "the partly filled tail is copied");
    assert_eq!(pool.inner.used_blocks(), 4);
    let id = seq.blocks()[0];
    assert_eq!(pool.inner.ref_count(id), Some(2));
    // Raw calls on the inner pool refuse a sequence's block.
    assert_eq!(
        pool.inner.free(&[id]),
        Err(kvslots::FreeError::HeldBySequence { id })
    );
    assert_eq!(
        pool.inner.add_refs(&[id]),
        Err(kvslots::FreeError::HeldBySequence { id })
    );
    assert_eq!(pool.inner.ref_count(id), Some(2));
    // A match of the published prefix shares the cached blocks.
    let mut other = Sequence::new(Arc::clone(&pool));
    assert_eq!(other.try_match_prefix(&keys), 2);
    assert_eq!(pool.inner.ref_count(id), Some(3));
    child.try_append(1).unwrap();
    drop(child);
    assert_eq!(seq.retire(5), 3);
    assert_eq!(pool.inner.complete(5), 3);
    drop(other);
    assert_eq!(pool.inner.used_blocks(), 0);
    assert_eq!(pool.inner.evictable_blocks(), 2);
}

/// A hybrid sequence lends its reservation only to the pool itself: over
/// a forwarder, a match into a reservation lends nothing (its revivals are
/// admitted as into an empty sequence) and each group keeps as many
/// blocks as it reserved beyond the hit.
#[test]
fn a_hybrid_match_into_a_reservation_through_a_forwarder_lends_nothing() {
    let pool = Forward::new(
        BlockPool::builder(16, 4)
            .prefix_cache(true)
            .build()
            .unwrap(),
    );
    let groups =
        KvGroups::new([KvGroup::SlidingWindow { window_tokens: 4 }, KvGroup::Full]).unwrap();
    let mut base = Vec::new();
    hash_blocks(b"", &(0..12).collect::<Vec<u32>>(), 4, &mut base);
    let keys = groups.keys(&base);
    let mut first = HybridSequence::new(Arc::clone(&pool), groups.clone());
    first.try_append(12).unwrap();
    assert_eq!(first.publish(&keys), Ok(6));
    let published: Vec<Vec<BlockId>> = (0..2).map(|g| first.blocks(g).unwrap().to_vec()).collect();
    drop(first);
    let mut seq = HybridSequence::new(Arc::clone(&pool), groups.clone());
    seq.try_reserve(16, 0).unwrap(); // 4 blocks a group
    let reserved: Vec<Vec<BlockId>> = (0..2).map(|g| seq.blocks(g).unwrap().to_vec()).collect();
    assert_eq!(seq.try_match_prefix(&keys), Ok(3));
    assert_eq!((seq.len(), seq.capacity()), (12, 16));
    assert_eq!(pool.lent.load(std::sync::atomic::Ordering::Relaxed), 0);
    // The sliding group holds block 2 (position 12 reads 9..=12), the
    // full group all 3; then each keeps one of the reserved blocks.
    let (s0, f) = (seq.blocks(0).unwrap(), seq.blocks(1).unwrap());
    assert_eq!(
        (&s0[..2], s0[2]),
        (&[BlockId::NULL; 2][..], published[0][2])
    );
    assert_eq!(&f[..3], &published[1][..3]);
    assert!(
        s0[3] != f[3]
            && [s0[3], f[3]]
                .iter()
                .all(|id| reserved.concat().contains(id))
    );
    assert_eq!(pool.inner.used_blocks(), 1 + 3 + 2);
    drop(seq);
    assert_eq!(pool.inner.used_blocks(), 0);
}

/// The token names the group of a hybrid sequence's publish, and nothing
/// for a plain sequence's: a wrapper sees it, and the pool behind the
/// wrapper names it in its KV events.
#[test]
fn a_forwarding_allocator_sees_and_passes_on_each_publishs_group() {
    let pool = Forward::new(
        BlockPool::builder(8, 4)
            .prefix_cache(true)
            .kv_events(64)
            .build()
            .unwrap(),
    );
    let groups =
        KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 4 }]).unwrap();
    let mut base = Vec::new();
    hash_blocks(b"", &[1, 2, 3, 4, 5, 6, 7, 8], 4, &mut base);
    let keys = groups.keys(&base);
    let mut hybrid = HybridSequence::new(Arc::clone(&pool), groups);
    hybrid.try_append(4).unwrap();
    assert_eq!(hybrid.publish(&keys), Ok(2));
    let mut plain = Sequence::new(Arc::clone(&pool));
    plain.try_append(8).unwrap();
    assert_eq!(plain.publish(&base), 2);
    assert_eq!(*pool.groups.lock().unwrap(), [Some(0), Some(1), None]);
    let mut events = Vec::new();
    pool.inner.drain_events(&mut events);
    let stored: Vec<Option<usize>> = events
        .iter()
        .filter_map(|e| match e {
            KvEvent::BlockStored { group, .. } => Some(*group),
            _ => None,
        })
        .collect();
    assert_eq!(stored, [Some(0), Some(1), None]);
}
