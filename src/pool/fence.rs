//! Fenced release: references that a sequence gave back while a device
//! step that reads its blocks may still be in flight
//! ([`Sequence::retire`](crate::Sequence::retire),
//! [`Sequence::truncate_fenced`](crate::Sequence::truncate_fenced)), kept
//! under the step's fence until [`BlockPool::complete`] says the step is
//! done, and then given back through the pool's ordinary drop path.
//!
//! The retirements wait in buckets, one list of block ids per fence, in a
//! few mutex-guarded maps (a fence goes to map `fence % FENCE_SHARDS`).
//! Both a retire and a complete take one map's lock, and hold it only to
//! move a list in or out (or to append the ids of a truncate to one): the
//! references themselves are dropped after the lock is released, on the
//! lock-free path. The allocation and free paths never take these locks,
//! and neither does anything else: a retire and a complete happen once per
//! sequence (or truncate) and once per step, not once per block or token.

use std::collections::HashMap;
use std::sync::PoisonError;

use super::BlockPool;
use crate::id::BlockId;
use crate::sync::{AtomicUsize, CachePadded, Faults, Mutex, Ordering};
use crate::wait::Unwound;

/// How many maps the retirements are spread over: fences that complete
/// on different worker threads at once rarely meet on one lock.
const FENCE_SHARDS: usize = 8;

/// Per fence, the ids whose references wait for it (an id listed as often
/// as references to it were retired under the fence).
type Lists = HashMap<u64, Vec<BlockId>>;

/// The retirements waiting for their fences, and the gauge of them.
pub(super) struct Fences {
    /// The fences' lists, in `FENCE_SHARDS` maps.
    maps: Box<[CachePadded<Mutex<Lists>>]>,
    /// References retired and not yet given back.
    pending: AtomicUsize,
    /// The high-water mark of `pending`.
    peak: AtomicUsize,
    faults: Faults,
}

impl Fences {
    pub(super) fn new(faults: Faults) -> Fences {
        Fences {
            maps: (0..FENCE_SHARDS)
                .map(|_| CachePadded::new(Mutex::new(HashMap::new())))
                .collect(),
            pending: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            faults,
        }
    }

    /// The heap bytes [`new`](Self::new) asks for (the maps' lists grow
    /// with use).
    pub(super) fn heap_bytes() -> usize {
        FENCE_SHARDS * std::mem::size_of::<CachePadded<Mutex<Lists>>>()
    }

    /// Runs `f` on the map of `fence`, under its lock. Nothing in `f`
    /// panics (short of an allocation failure, which aborts), so a
    /// poisoned lock holds a consistent map and is used as it is.
    fn with_map<R>(&self, fence: u64, f: impl FnOnce(&mut Lists) -> R) -> R {
        let map = &self.maps[(fence % FENCE_SHARDS as u64) as usize];
        let mut guard = map.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard)
    }

    /// Counts `n` more pending references. Called before they are listed,
    /// so that a complete racing the retire never takes the gauge below 0.
    fn add(&self, n: usize) {
        // Relaxed (both): a gauge and its high-water mark; the references
        // themselves are ordered by the map's lock and the drop path.
        let now = self.pending.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    /// Counts `n` pending references given back.
    fn sub(&self, n: usize) {
        // Relaxed: a gauge, as in `add`.
        self.pending.fetch_sub(n, Ordering::Relaxed);
    }
}

impl BlockPool {
    /// Keeps a sequence's references to `ids` (its own table, moved in)
    /// until `fence` completes; returns how many references that is. The
    /// first retirement under a fence moves the table in as the fence's
    /// list; later ones append.
    pub(crate) fn retire_owned(&self, fence: u64, ids: Vec<BlockId>) -> usize {
        let n = ids.len();
        if n == 0 {
            return 0;
        }
        if self.fences.faults.early_release() {
            self.release_now(&ids);
            return n;
        }
        self.fences.add(n);
        // The table moved into the map, or left empty (and freed after
        // the lock is released) when it was appended to an existing list.
        let _spent = self.fences.with_map(fence, |map| {
            let list = map.entry(fence).or_default();
            if list.is_empty() {
                std::mem::replace(list, ids)
            } else {
                list.extend_from_slice(&ids);
                ids
            }
        });
        n
    }

    /// Keeps a truncate's references to `ids` until `fence` completes, as
    /// [`retire_owned`](Self::retire_owned) does, copying the ids;
    /// returns how many references that is.
    pub(crate) fn retire_slice(&self, fence: u64, ids: &[BlockId]) -> usize {
        let n = ids.len();
        if n == 0 {
            return 0;
        }
        if self.fences.faults.early_release() {
            self.release_now(ids);
            return n;
        }
        self.fences.add(n);
        self.fences.with_map(fence, |map| {
            map.entry(fence).or_default().extend_from_slice(ids);
        });
        n
    }

    /// Gives back the references retired under a completed fence, as a
    /// sequence's release gives back its own: a run of consecutive fresh
    /// ids (a prompt's blocks, as its take left them) a word of the
    /// bitmaps at a time, any other list by runs and block by block.
    fn give_back_retired(&self, ids: &[BlockId]) {
        if self.free.give_fresh_run(ids) {
            // Released after the give-back, as in `drop_each`.
            self.counter.release_held(ids.len());
            return;
        }
        // As in `Sequence::give_back`: `Err` only after a racing double
        // free of one of these blocks, and the others go all the same.
        let _ = self.drop_held_refs(ids);
    }

    /// Loom's `early_release` control: the references go at once.
    fn release_now(&self, ids: &[BlockId]) {
        // As in `Sequence::give_back`: `Err` only after a racing double
        // free, and the other references are dropped all the same.
        let _ = self.drop_held_refs(ids);
    }

    /// Declares `fence` complete: gives back every reference retired under
    /// it so far ([`Sequence::retire`](crate::Sequence::retire),
    /// [`Sequence::truncate_fenced`](crate::Sequence::truncate_fenced)),
    /// and returns how many. A block whose last reference goes is free
    /// again (or evictable, if it is cached), exactly as when a sequence
    /// drops it unfenced.
    ///
    /// Exactly the retirements under `fence` are given back, not those
    /// under smaller fences: fences are names, not a clock, and may
    /// complete in any order (overlapped batches, several devices). Each
    /// retirement is given back by the first `complete` of its fence that
    /// follows it: a later retirement under a fence already completed
    /// waits for the next `complete` of that fence (completing a fence
    /// twice is not an error, and completing one with nothing retired
    /// returns 0). So a fence number must not be reused for a later step
    /// while an earlier step under it may still be in flight, and a fence
    /// that is never completed keeps its blocks in use for the pool's
    /// life.
    ///
    /// Completing out of order costs nothing extra: each fence's list is
    /// found by a map lookup, whatever the order. What an out-of-order
    /// completion delays is only the release of the fences still pending.
    ///
    /// This takes one lock (one of a few maps of pending fences, chosen by
    /// the fence), held only to take the fence's list out; the references
    /// are then dropped on the lock-free path. It also works on a
    /// [closed](Self::close) pool, so that workers can drain.
    ///
    /// # Memory ordering
    ///
    /// Whatever the retiring thread did with the blocks before the retire,
    /// and whatever this thread did before this call, happens-before the
    /// allocation that hands one of the blocks to its next owner.
    ///
    /// # Panics
    ///
    /// If the waker of an async waiter that the give-back grants panics
    /// (see [Waiting](crate::implementation#waiting)): the panic comes
    /// once every reference retired under `fence` is given back.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(4, 16));
    /// let mut seq = Sequence::new(Arc::clone(&pool));
    /// seq.try_append(40).unwrap(); // 3 blocks
    /// seq.retire(7); // step 7 may still read them
    /// assert_eq!((pool.used_blocks(), pool.pending_release_blocks()), (3, 3));
    /// assert_eq!(pool.complete(8), 0); // another step: nothing of ours
    /// assert_eq!(pool.complete(7), 3);
    /// assert_eq!((pool.free_blocks(), pool.pending_release_blocks()), (4, 0));
    /// ```
    pub fn complete(&self, fence: u64) -> usize {
        let Some(ids) = self.fences.with_map(fence, |map| map.remove(&fence)) else {
            return 0;
        };
        // Counted out first: a waker's panic out of the give-back comes
        // after every reference went.
        self.fences.sub(ids.len());
        self.give_back_retired(&ids);
        ids.len()
    }

    /// Declares every fence complete (a device reset, or a shutdown once
    /// the device is idle): gives back every reference retired so far and
    /// returns how many. Takes each map's lock in turn, as
    /// [`complete`](Self::complete) takes one.
    ///
    /// # Panics
    ///
    /// If the waker of an async waiter that a give-back grants panics
    /// (see [Waiting](crate::implementation#waiting)): the panic comes
    /// once every reference is given back (the first panic, if several).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(4, 16));
    /// for fence in [1, 2] {
    ///     let mut seq = Sequence::new(Arc::clone(&pool));
    ///     seq.try_append(16).unwrap();
    ///     seq.retire(fence);
    /// }
    /// assert_eq!(pool.complete_all(), 2);
    /// assert_eq!(pool.free_blocks(), 4);
    /// ```
    pub fn complete_all(&self) -> usize {
        // Every list is given back, also when a waker's panic comes out of
        // one give-back: it is resumed once all of them are done.
        let mut unwound = Unwound::new();
        let mut released = 0;
        for shard in 0..FENCE_SHARDS as u64 {
            let lists = self.fences.with_map(shard, std::mem::take);
            for ids in lists.into_values() {
                self.fences.sub(ids.len());
                unwound.catch(|| self.give_back_retired(&ids));
                released += ids.len();
            }
        }
        released
    }

    /// A snapshot of the block references retired under a fence that has
    /// not completed yet: the blocks (counted once per retired reference)
    /// that in-flight steps keep from being handed out. Those blocks still
    /// count as used: [`free_blocks`](Self::free_blocks) never includes
    /// them, and a [`ReserveError::Full`](crate::ReserveError::Full) counts
    /// them as unavailable.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(4, 4));
    /// let mut seq = Sequence::new(Arc::clone(&pool));
    /// seq.try_append(12).unwrap(); // 3 blocks
    /// assert_eq!(seq.truncate_fenced(2, 5), 2);
    /// assert_eq!(pool.pending_release_blocks(), 2);
    /// assert_eq!(pool.free_blocks(), 1);
    /// pool.complete(5);
    /// assert_eq!(pool.free_blocks(), 3);
    /// ```
    pub fn pending_release_blocks(&self) -> usize {
        // Relaxed: a gauge (see `Fences::add`).
        self.fences.pending.load(Ordering::Relaxed)
    }

    /// The high-water mark of
    /// [`pending_release_blocks`](Self::pending_release_blocks).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{BlockPool, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::new(4, 16));
    /// let mut seq = Sequence::new(Arc::clone(&pool));
    /// seq.try_append(32).unwrap();
    /// seq.retire(1);
    /// pool.complete(1);
    /// assert_eq!(pool.peak_pending_release_blocks(), 2);
    /// ```
    pub fn peak_pending_release_blocks(&self) -> usize {
        // Relaxed: a gauge (see `Fences::add`).
        self.fences.peak.load(Ordering::Relaxed)
    }
}
