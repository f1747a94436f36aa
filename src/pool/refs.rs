//! Per-block reference counts: 0 while a block is free, the number of its
//! holders while it is allocated.
//!
//! Every drop is a read-modify-write (a CAS), also a drop of a reference
//! that its holder is sure of: a racing double free through the public
//! `BlockPool::free` can change the same count, and exactly one of the two
//! drops must see it reach 0 and push the block.

use crate::id::BlockId;
use crate::sync::{AtomicU32, Faults, Ordering};

/// A reference count above this panics instead of wrapping.
const MAX_REFS: u32 = u32::MAX / 2;

/// One count per block of a pool.
pub(super) struct Refs {
    counts: Box<[AtomicU32]>,
    /// The faults of loom's negative controls (none outside them).
    faults: Faults,
}

impl Refs {
    /// `num_blocks` counts of 0 (every block free).
    pub(super) fn new(num_blocks: usize, faults: Faults) -> Refs {
        Refs {
            counts: (0..num_blocks).map(|_| AtomicU32::new(0)).collect(),
            faults,
        }
    }

    /// Block `index`'s count now, or `None` if out of range. A snapshot.
    pub(super) fn get(&self, index: usize) -> Option<u32> {
        // Relaxed: a snapshot for reporting.
        self.counts.get(index).map(|r| r.load(Ordering::Relaxed))
    }

    /// A block's count now, for the checks of a free.
    pub(super) fn count(&self, id: BlockId) -> u32 {
        // Relaxed: a validation read; the drops that follow are what order.
        self.counts[id.index()].load(Ordering::Relaxed)
    }

    /// Gives a block just popped from the free list its first reference.
    pub(super) fn set_first(&self, id: BlockId) {
        let count = &self.counts[id.index()];
        // Relaxed (both): the block is exclusively ours after the Acquire
        // pop; a plain store is cheaper than a read-modify-write.
        debug_assert_eq!(count.load(Ordering::Relaxed), 0, "{id} handed out twice");
        count.store(1, Ordering::Relaxed);
    }

    /// Adds a reference to a block the caller holds a reference to.
    ///
    /// A CAS that never raises a count from 0, not a `fetch_add`: the
    /// caller's reference can be gone after all, taken by a raw
    /// `BlockPool::free` of the same block (a double free), and then the
    /// block may sit in the free list, where a reference would let it be
    /// handed out and pushed a second time. `Err` then, and nothing changed.
    ///
    /// # Panics
    ///
    /// Panics if the count would exceed `u32::MAX / 2` (as `Arc` aborts).
    pub(super) fn add(&self, id: BlockId) -> Result<(), ()> {
        let count = &self.counts[id.index()];
        // Relaxed: only a guess; the CAS validates it.
        let mut cur = count.load(Ordering::Relaxed);
        loop {
            // Any reference left to add to?
            if cur == 0 && !self.faults.blind_add_ref() {
                return Err(());
            }
            if cur >= MAX_REFS {
                panic!("reference count overflow on {id}");
            }
            // Relaxed (both): the caller holds a reference, so the block is
            // not freed under us; the new reference is handed over by
            // whatever hands over its holder (as with `Arc::clone`).
            match count.compare_exchange_weak(cur, cur + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Whether more than one reference to `id` exists now.
    pub(super) fn is_shared(&self, id: BlockId) -> bool {
        // Acquire: if another holder dropped its reference, its reads of the
        // block happen-before we decide to write into it.
        self.counts[id.index()].load(Ordering::Acquire) > 1
    }

    /// Drops one reference; `Ok(true)` if it was the last. `Err` if the
    /// block has none (not allocated, or already dropped in this call).
    pub(super) fn drop(&self, id: BlockId) -> Result<bool, ()> {
        // Relaxed: only a guess; the CAS validates it.
        let guess = self.counts[id.index()].load(Ordering::Relaxed);
        self.drop_from(id, guess)
    }

    /// Drops a reference the caller holds; `Ok(true)` if it was the last.
    ///
    /// Never a load followed by a plain store of 0, even when the count
    /// reads 1: a racing `BlockPool::free` of the same block (a double
    /// free) can take that count from 1 to 0 in between, and both sides
    /// would then push the block. The CAS decides which of the two drops
    /// the last reference.
    pub(super) fn drop_held(&self, id: BlockId) -> Result<bool, ()> {
        // First guess 1, without a load: a sequence usually holds its blocks
        // alone, and then the first CAS succeeds.
        self.faults
            .held_drop(&self.counts[id.index()], || self.drop_from(id, 1))
    }

    /// [`drop`](Self::drop) with a first guess of the count.
    fn drop_from(&self, id: BlockId, guess: u32) -> Result<bool, ()> {
        let count = &self.counts[id.index()];
        let mut cur = guess;
        loop {
            // Any reference left to drop?
            if cur == 0 {
                return Err(());
            }
            // AcqRel on success: Release orders this holder's accesses to
            // the block before the last drop; Acquire lets the last dropper
            // (who pushes the block) see every other holder's accesses.
            // Relaxed on failure: we only retry with the fresh value.
            match count.compare_exchange_weak(
                cur,
                cur - 1,
                self.faults.free_ordering(Ordering::AcqRel),
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(cur == 1),
                Err(actual) => cur = actual,
            }
        }
    }

    /// The hook of loom's `blind_undo` control, after a drop of a free
    /// found no reference left: `false` (nothing done) outside that
    /// control; see `Faults::blind_undo`.
    pub(super) fn blind_undo(&self, dropped: &[BlockId]) -> bool {
        self.faults
            .blind_undo(&self.counts, dropped.iter().map(|d| d.index()))
    }
}
