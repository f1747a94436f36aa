//! A forwarding allocator that counts the shares of a block itself: a
//! fork's `add_refs` is counted in the forwarder, not in the pool, and the
//! pool's reference goes with the forwarder's last one; every other call
//! is forwarded as it is. Such a forwarder keeps the contract (each inner
//! call lists only the ids it was given, with the same effect on each),
//! and the pool's count of a shared block is then 1. A parent and its
//! fork publish their shared block at once: exactly one publish may cache
//! it, and the block must stay held (not evictable) while both hold it.
//! The pool takes a sole holder's store claim only for a sequence whose
//! allocator is the pool itself, so both publishes here take the CAS
//! claim.
//!
//! Three forwarders: one that holds the pool in an `Arc`; one that holds
//! it by value as its first field (`repr(C)`), at the forwarder's own
//! address; and one that is the pool's bytes exactly (`repr(transparent)`,
//! the same address and size), with its counts in a static. The pool
//! tells each from itself by its type.

mod common;

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use kvslots::{
    BlockAllocator, BlockHash, BlockId, BlockPool, ReserveError, Sequence, SequenceCall,
};

/// The forwarder's own count of the extra shares of each block.
#[derive(Default)]
struct Shares(Mutex<HashMap<BlockId, usize>>);

impl Shares {
    fn add(&self, ids: &[BlockId]) {
        let mut extra = self.0.lock().unwrap();
        for &id in ids {
            *extra.entry(id).or_insert(0) += 1;
        }
    }

    /// Drops one share of each of `ids`; returns those whose last share
    /// went (the pool's reference goes with it).
    fn drop_last(&self, ids: &[BlockId]) -> Vec<BlockId> {
        let mut extra = self.0.lock().unwrap();
        ids.iter()
            .copied()
            .filter(|id| match extra.get_mut(id) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    false
                }
                _ => true,
            })
            .collect()
    }

    fn is_shared(&self, id: BlockId) -> bool {
        self.0.lock().unwrap().get(&id).is_some_and(|&n| n > 0)
    }
}

/// The pool behind a forwarder.
trait Inner {
    fn pool(&self) -> &BlockPool;
    fn shares(&self) -> &Shares;
}

/// The pool in an `Arc`.
struct Beside {
    inner: Arc<BlockPool>,
    shares: Shares,
}

impl Inner for Beside {
    fn pool(&self) -> &BlockPool {
        &self.inner
    }
    fn shares(&self) -> &Shares {
        &self.shares
    }
}

/// The pool by value, at the forwarder's own address.
#[repr(C)]
struct Inside {
    inner: BlockPool,
    shares: Shares,
}

impl Inner for Inside {
    fn pool(&self) -> &BlockPool {
        &self.inner
    }
    fn shares(&self) -> &Shares {
        &self.shares
    }
}

/// The shares of the field-less forwarder, outside it.
static STATIC_SHARES: OnceLock<Shares> = OnceLock::new();

/// The pool by value and nothing else: the forwarder is the pool's bytes
/// exactly, yet counts shares (in a static).
#[repr(transparent)]
struct Bare {
    inner: BlockPool,
}

impl Inner for Bare {
    fn pool(&self) -> &BlockPool {
        &self.inner
    }
    fn shares(&self) -> &Shares {
        STATIC_SHARES.get_or_init(Shares::default)
    }
}

/// Forwards every call to the pool but the shares, which it counts.
struct Sharing<I>(I);

impl<I: Inner> BlockAllocator for Sharing<I> {
    fn num_blocks(&self) -> usize {
        self.0.pool().num_blocks()
    }
    fn block_size(&self) -> usize {
        self.0.pool().block_size()
    }
    fn is_closed(&self) -> bool {
        BlockAllocator::is_closed(self.0.pool())
    }
    fn try_alloc_with_headroom(
        &self,
        by: &SequenceCall<'_>,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        BlockAllocator::try_alloc_with_headroom(self.0.pool(), by, n, headroom, out)
    }
    fn try_alloc_growth(
        &self,
        by: &SequenceCall<'_>,
        n: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        BlockAllocator::try_alloc_growth(self.0.pool(), by, n, out)
    }
    fn alloc_with_headroom_blocking(
        &self,
        by: &SequenceCall<'_>,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError> {
        BlockAllocator::alloc_with_headroom_blocking(self.0.pool(), by, n, headroom, out, timeout)
    }
    fn add_refs(&self, _: &SequenceCall<'_>, ids: &[BlockId]) -> usize {
        self.0.shares().add(ids);
        ids.len()
    }
    fn release(&self, by: &SequenceCall<'_>, ids: &[BlockId]) {
        let last = self.0.shares().drop_last(ids);
        if !last.is_empty() {
            BlockAllocator::release(self.0.pool(), by, &last);
        }
    }
    fn needs_copy(&self, id: BlockId) -> bool {
        self.0.shares().is_shared(id) || BlockAllocator::needs_copy(self.0.pool(), id)
    }
    fn match_prefix(
        &self,
        by: &SequenceCall<'_>,
        keys: &[BlockHash],
        out: &mut Vec<BlockId>,
    ) -> usize {
        BlockAllocator::match_prefix(self.0.pool(), by, keys, out)
    }
    fn publish(&self, by: &SequenceCall<'_>, blocks: &[BlockId], keys: &[BlockHash]) -> usize {
        BlockAllocator::publish(self.0.pool(), by, blocks, keys)
    }
    fn publish_after(
        &self,
        by: &SequenceCall<'_>,
        parent: Option<&BlockHash>,
        blocks: &[BlockId],
        keys: &[BlockHash],
    ) -> usize {
        BlockAllocator::publish_after(self.0.pool(), by, parent, blocks, keys)
    }
    fn uncache_if_sole(&self, by: &SequenceCall<'_>, id: BlockId) {
        if !self.0.shares().is_shared(id) {
            BlockAllocator::uncache_if_sole(self.0.pool(), by, id);
        }
    }
    fn retire(&self, by: &SequenceCall<'_>, fence: u64, ids: &[BlockId]) -> usize {
        let last = self.0.shares().drop_last(ids);
        BlockAllocator::retire(self.0.pool(), by, fence, &last);
        ids.len()
    }
}

/// Rounds of the race: `KVSLOTS_STRESS_ROUNDS`, or 2,000.
fn rounds() -> usize {
    std::env::var("KVSLOTS_STRESS_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2_000)
}

/// A parent and its fork over `alloc` publish their shared block at once,
/// `rounds()` times, each on a new forwarder from `make`.
fn parent_and_fork_publish<I: Inner + Send + Sync + 'static>(make: impl Fn() -> Sharing<I>) {
    let key = BlockHash([5; 32]);
    for round in 0..rounds() {
        let alloc = Arc::new(make());
        let mut parent = Sequence::new(Arc::clone(&alloc));
        parent.try_append(1).unwrap();
        let b = parent.blocks()[0];
        let (mut child, copy) = parent.try_fork().unwrap();
        assert_eq!(copy, None, "a full block is shared");
        // Both threads begin their publishes together (a rendezvous on a
        // shared count; no sleep).
        let ready = Arc::new(AtomicUsize::new(0));
        let start = |ready: &AtomicUsize| common::meet(ready, 2);
        let other = {
            let ready = Arc::clone(&ready);
            thread::spawn(move || {
                start(&ready);
                let n = child.publish(&[key]);
                (child, n)
            })
        };
        start(&ready);
        let mine = parent.publish(&[key]);
        let (child, theirs) = other.join().unwrap();
        let pool = alloc.0.pool();
        assert_eq!(
            (mine + theirs, pool.ref_count(b), pool.evictable_blocks()),
            (1, Some(1), 0),
            "round {round}: publishes cached {mine} + {theirs} of a block both hold \
             (the pool counts one reference for the two; evictable blocks, count)"
        );
        drop((parent, child));
        assert_eq!(
            pool.ref_count(b),
            Some(0),
            "round {round}: the block let go"
        );
        assert_eq!(pool.evictable_blocks(), 1, "round {round}: cached once");
    }
}

#[test]
fn a_parent_and_its_fork_through_a_forwarder_cache_their_block_once() {
    parent_and_fork_publish(|| {
        Sharing(Beside {
            inner: Arc::new(BlockPool::new(4, 1)),
            shares: Shares::default(),
        })
    });
}

#[test]
fn a_forwarder_at_the_pools_address_is_not_taken_for_the_pool() {
    parent_and_fork_publish(|| {
        Sharing(Inside {
            inner: BlockPool::new(4, 1),
            shares: Shares::default(),
        })
    });
}

#[test]
fn a_forwarder_that_is_the_pools_bytes_is_not_taken_for_the_pool() {
    let bare = Sharing(Bare {
        inner: BlockPool::new(4, 1),
    });
    assert_eq!(
        (std::mem::size_of_val(&bare), &bare as *const _ as usize),
        (
            std::mem::size_of::<BlockPool>(),
            &bare.0.inner as *const _ as usize
        ),
        "the forwarder's address and size are its pool's"
    );
    drop(bare);
    parent_and_fork_publish(|| {
        Sharing(Bare {
            inner: BlockPool::new(4, 1),
        })
    });
}
