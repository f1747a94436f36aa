//! The lock-based baseline: a block pool whose free list is a
//! `Mutex<Vec<u32>>`, with per-block reference counts under the same lock,
//! and a sequence type over it.
//!
//! It keeps the same contract as `kvslots::BlockPool` and
//! `kvslots::Sequence` (all-or-nothing allocation, headroom admission,
//! reference-counted sharing for forks, whole-call-or-nothing frees), the way
//! a server that serialises allocation behind one lock would: every call
//! takes the mutex once. `used_blocks` is mirrored in an atomic written under
//! the lock, so that the monitor can read it without taking the lock (as it
//! reads `kvslots`' counter).
//!
//! # Waiting
//!
//! [`MutexPool::alloc_blocking`] and [`MutexSeq::reserve_blocking`] wait
//! on a `Condvar` paired with the pool's mutex: every call that makes
//! blocks available (a free, a sequence's truncate or drop, a fence's
//! complete) notifies every waiter, and each re-checks under the lock. As
//! a server that serialises allocation behind one lock would build it, the
//! waiters are not served in arrival order and do not hold back `try_*`
//! callers (unlike `kvslots`' FIFO queue, whose head is owed its request).
//!
//! # The prefix cache
//!
//! Under the same lock, the pool keeps a prefix cache the way TGI's and
//! mistral.rs's block managers do: a `HashMap` from a full block's key to
//! the block holding it, and an LRU list of the cached blocks no sequence
//! holds (an intrusive doubly linked list over block ids, so that a match
//! takes a block out of it in O(1)). The policy is the reference's:
//!
//! * a new block comes from the uncached free blocks first; only when none
//!   is left is the least recently released cached block evicted (its key
//!   dropped), and an allocation that is refused evicts nothing;
//! * a sequence gives its blocks back last block first, so a prompt's tail
//!   is evicted before its head; a cached block whose last reference goes
//!   becomes the most recently released;
//! * a match takes the longest prefix of cached keys, one reference each
//!   (an unreferenced block leaves the LRU list);
//! * publish gives a key to each full block that has none, unless another
//!   block holds the key already (first wins);
//! * a cached block is never written while its key can match: an append
//!   into a shared partly filled block copies it, and one into a cached
//!   block the sequence holds alone first drops its key.
//!
//! The map is sized for every block at the start, so that no call
//! allocates under the lock.
//!
//! # Fenced release
//!
//! As `kvslots`' `Sequence::retire`, `Sequence::truncate_fenced` and
//! `BlockPool::complete`: a retired sequence's references wait, under the
//! same lock, in a list per fence, and the complete of the fence drops
//! them (a list per fence allocates, as `kvslots`' does).

use std::cell::Cell;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kvslots::{table, BlockHash, ReserveError};

use crate::backend::PrefixCounts;

/// Why [`MutexPool::free`] refused; nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MutexFreeError {
    /// The id is not below `num_blocks`.
    OutOfRange {
        /// The offending id.
        id: u32,
    },
    /// The id is listed more times than it has references (including a
    /// block that is not allocated at all).
    NotAllocated {
        /// The offending id.
        id: u32,
    },
}

impl fmt::Display for MutexFreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MutexFreeError::OutOfRange { id } => write!(f, "block {id} is out of range"),
            MutexFreeError::NotAllocated { id } => {
                write!(f, "block {id} is freed more times than it is referenced")
            }
        }
    }
}

impl std::error::Error for MutexFreeError {}

/// Hashes a [`BlockHash`] for the map by its first 8 bytes: a key is
/// already a uniformly spread hash, so hashing it again (SipHash, the
/// default) would only add time under the lock.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // `[u8; 32]` hashes as its length, then its bytes: keep the first
        // 8 bytes of the key.
        for &b in bytes.iter().take(8) {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
}

/// The map from keys to cached blocks.
type KeyMap = HashMap<BlockHash, u32, BuildHasherDefault<KeyHasher>>;

/// "No block" in the LRU links.
const NIL: u32 = u32::MAX;

struct Inner {
    /// Uncached free block ids, used as a stack.
    free: Vec<u32>,
    /// References per block; 0 = free (uncached, or cached and evictable).
    refs: Vec<u32>,
    /// The key each block holds, if cached.
    key_of: Vec<Option<BlockHash>>,
    /// The cached blocks by key.
    index: KeyMap,
    /// LRU links of the evictable blocks (cached, no reference): `prev`
    /// and `next` per block, `NIL` at the ends.
    prev: Vec<u32>,
    next: Vec<u32>,
    /// The least recently released evictable block, and the most.
    lru_head: u32,
    lru_tail: u32,
    /// Evictable blocks.
    lru_len: usize,
    /// The high-water mark of used blocks.
    peak: usize,
    /// The prefix cache's counts.
    stats: PrefixCounts,
    /// References retired under each fence not completed yet.
    fenced: HashMap<u64, Vec<u32>>,
    /// References retired and not given back, and their high-water mark.
    pending: usize,
    pending_peak: usize,
    /// Threads asleep on the condition variable.
    waiting: usize,
}

impl Inner {
    /// Blocks an allocation may take: uncached free and evictable.
    fn available(&self) -> usize {
        self.free.len() + self.lru_len
    }

    /// Appends `id` to the LRU list (the most recently released).
    fn lru_push(&mut self, id: u32) {
        let i = id as usize;
        self.prev[i] = self.lru_tail;
        self.next[i] = NIL;
        if self.lru_tail == NIL {
            self.lru_head = id;
        } else {
            self.next[self.lru_tail as usize] = id;
        }
        self.lru_tail = id;
        self.lru_len += 1;
    }

    /// Takes `id` out of the LRU list.
    fn lru_remove(&mut self, id: u32) {
        let i = id as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.lru_head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.lru_tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.lru_len -= 1;
    }

    /// Drops the key `id` holds, if any.
    fn uncache(&mut self, id: u32) {
        if let Some(key) = self.key_of[id as usize].take() {
            self.index.remove(&key);
        }
    }

    /// Takes one block with one reference: an uncached free one, else the
    /// least recently released evictable one (its key dropped). The caller
    /// has checked that one is available.
    fn take(&mut self) -> u32 {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let id = self.lru_head;
                debug_assert_ne!(id, NIL, "an allocation checked availability");
                self.lru_remove(id);
                self.uncache(id);
                self.stats.evictions += 1;
                id
            }
        };
        self.refs[id as usize] = 1;
        id
    }

    /// A block whose last reference went: evictable if cached, else free.
    fn released(&mut self, id: u32) {
        if self.key_of[id as usize].is_some() {
            self.lru_push(id);
        } else {
            self.free.push(id);
        }
    }
}

/// A block pool behind one `std::sync::Mutex`.
pub struct MutexPool {
    inner: Mutex<Inner>,
    /// Notified, under the lock, whenever blocks become available.
    freed: Condvar,
    /// `num_blocks - free.len()`, written under the lock, read without it.
    used: AtomicUsize,
    num_blocks: usize,
    block_size: usize,
}

impl fmt::Debug for MutexPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutexPool")
            .field("num_blocks", &self.num_blocks)
            .field("block_size", &self.block_size)
            .field("used", &self.used_blocks())
            .finish()
    }
}

impl MutexPool {
    /// A pool of `num_blocks` blocks of `block_size` tokens.
    ///
    /// # Panics
    ///
    /// Panics if `block_size == 0` or `num_blocks` does not fit a `u32` id.
    pub fn new(num_blocks: usize, block_size: usize) -> MutexPool {
        MutexPool::try_new(num_blocks, block_size).expect("memory for the mutex pool")
    }

    /// [`new`](Self::new), with the allocator's refusal of its arrays as an
    /// error instead of an abort (nothing is left allocated then).
    ///
    /// # Panics
    ///
    /// As [`new`](Self::new), for `block_size` and `num_blocks`.
    pub fn try_new(
        num_blocks: usize,
        block_size: usize,
    ) -> Result<MutexPool, std::collections::TryReserveError> {
        assert!(block_size > 0, "block_size must be at least 1");
        assert!(
            num_blocks <= u32::MAX as usize,
            "num_blocks {num_blocks} does not fit a u32 block id"
        );
        fn filled<T: Clone>(
            n: usize,
            value: T,
        ) -> Result<Vec<T>, std::collections::TryReserveError> {
            let mut v = Vec::new();
            v.try_reserve_exact(n)?;
            v.resize(n, value);
            Ok(v)
        }
        let mut index = KeyMap::default();
        index.try_reserve(num_blocks)?;
        // Lowest ids on top of the stack, as kvslots hands them out first.
        let mut free = Vec::new();
        free.try_reserve_exact(num_blocks)?;
        free.extend((0..num_blocks as u32).rev());
        Ok(MutexPool {
            inner: Mutex::new(Inner {
                free,
                refs: filled(num_blocks, 0)?,
                key_of: filled(num_blocks, None)?,
                index,
                prev: filled(num_blocks, NIL)?,
                next: filled(num_blocks, NIL)?,
                lru_head: NIL,
                lru_tail: NIL,
                lru_len: 0,
                peak: 0,
                stats: PrefixCounts::default(),
                fenced: HashMap::new(),
                pending: 0,
                pending_peak: 0,
                waiting: 0,
            }),
            freed: Condvar::new(),
            used: AtomicUsize::new(0),
            num_blocks,
            block_size,
        })
    }

    /// About the heap memory, in bytes, [`new`](Self::new) takes for
    /// `num_blocks` blocks (its arrays and its key map's table), saturating.
    pub fn memory_bytes(num_blocks: usize) -> usize {
        use std::mem::size_of;
        // A hash table keeps at most 7/8 of its buckets full, each a key, a
        // value and a control byte.
        let index = (size_of::<(BlockHash, u32)>() + 1).saturating_mul(num_blocks / 7 * 8 + 8);
        (4 * size_of::<u32>() + size_of::<Option<BlockHash>>())
            .saturating_mul(num_blocks)
            .saturating_add(index)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A worker that panicked while holding the lock left the counts
        // consistent (every mutation below is panic-free once started), so
        // a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Total blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// A snapshot of the blocks in use.
    pub fn used_blocks(&self) -> usize {
        // Relaxed: a snapshot for reporting; the lock orders the real state.
        self.used.load(Ordering::Relaxed)
    }

    /// A snapshot of the free blocks (evictable cached ones included).
    pub fn free_blocks(&self) -> usize {
        self.num_blocks - self.used_blocks()
    }

    /// The high-water mark of used blocks.
    pub fn peak_used_blocks(&self) -> usize {
        self.lock().peak
    }

    /// Blocks holding a key, referenced or not.
    pub fn cached_blocks(&self) -> usize {
        self.lock().index.len()
    }

    /// Cached blocks no sequence holds.
    pub fn evictable_blocks(&self) -> usize {
        self.lock().lru_len
    }

    /// The prefix cache's counts.
    pub fn prefix_stats(&self) -> PrefixCounts {
        self.lock().stats
    }

    /// Drops every key of a block no sequence holds (those blocks become
    /// uncached free blocks); returns how many.
    pub fn reset_prefix_cache(&self) -> usize {
        let mut inner = self.lock();
        let mut dropped = 0;
        while inner.lru_head != NIL {
            let id = inner.lru_head;
            inner.lru_remove(id);
            inner.uncache(id);
            inner.free.push(id);
            dropped += 1;
        }
        dropped
    }

    /// Mirrors `used` after a change under the lock, and wakes the waiters
    /// if blocks became available.
    fn mirror(&self, inner: &mut Inner) {
        let used = self.num_blocks - inner.available();
        inner.peak = inner.peak.max(used);
        // Relaxed (both): a mirror for snapshots, written only under the
        // lock, so this load reads the last store.
        let before = self.used.load(Ordering::Relaxed);
        self.used.store(used, Ordering::Relaxed);
        if used < before {
            self.freed.notify_all();
        }
    }

    /// Takes `n` blocks, all or nothing, and appends their ids to `out`.
    pub fn try_alloc(&self, n: usize, out: &mut Vec<u32>) -> Result<(), ReserveError> {
        self.try_alloc_with_headroom(n, 0, out)
    }

    /// Takes `n` blocks only if `headroom` more stay free afterwards.
    pub fn try_alloc_with_headroom(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), ReserveError> {
        if n.saturating_add(headroom) > self.num_blocks {
            return Err(ReserveError::NeverFits {
                requested: n,
                capacity: self.num_blocks,
            });
        }
        // Reserve outside the lock, so that the critical section does not
        // allocate (the kvslots pool does not allocate either).
        out.reserve(n);
        let mut inner = self.lock();
        let available = inner.available();
        if n + headroom > available {
            return Err(ReserveError::Full {
                requested: n,
                available,
            });
        }
        // Nothing to take (a pure headroom check)?
        if n == 0 {
            return Ok(());
        }
        Self::take_n(&mut inner, n, out);
        self.mirror(&mut inner);
        Ok(())
    }

    /// [`try_alloc_with_headroom`](Self::try_alloc_with_headroom), waiting
    /// on the pool's condition variable until `n` blocks can be taken with
    /// `headroom` more free, for at most `timeout` (`None`: no limit).
    ///
    /// # Errors
    ///
    /// `NeverFits` at once, or `Full` (with the blocks available then)
    /// when `timeout` runs out; on error nothing changes.
    pub fn alloc_with_headroom_blocking(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<u32>,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError> {
        if n.saturating_add(headroom) > self.num_blocks {
            return Err(ReserveError::NeverFits {
                requested: n,
                capacity: self.num_blocks,
            });
        }
        out.reserve(n);
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut inner = self.lock();
        loop {
            let available = inner.available();
            if n + headroom <= available {
                break;
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(ReserveError::Full {
                    requested: n,
                    available,
                });
            }
            inner.waiting += 1;
            inner = match left {
                None => self.freed.wait(inner).unwrap_or_else(|e| e.into_inner()),
                Some(left) => {
                    self.freed
                        .wait_timeout(inner, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
            inner.waiting -= 1;
        }
        if n > 0 {
            Self::take_n(&mut inner, n, out);
            self.mirror(&mut inner);
        }
        Ok(())
    }

    /// [`alloc_with_headroom_blocking`](Self::alloc_with_headroom_blocking)
    /// without headroom, as `kvslots::BlockPool::alloc_blocking`.
    ///
    /// # Errors
    ///
    /// As [`alloc_with_headroom_blocking`](Self::alloc_with_headroom_blocking).
    pub fn alloc_blocking(
        &self,
        n: usize,
        out: &mut Vec<u32>,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError> {
        self.alloc_with_headroom_blocking(n, 0, out, timeout)
    }

    /// How many threads wait in
    /// [`alloc_with_headroom_blocking`](Self::alloc_with_headroom_blocking)
    /// (or [`MutexSeq::reserve_blocking`]) now, as
    /// `kvslots::BlockPool::waiters`. A snapshot.
    pub fn waiters(&self) -> usize {
        self.lock().waiting
    }

    /// Drops one reference per listed id, the last listed first (a
    /// sequence gives its table back last block first); a block whose last
    /// reference goes becomes evictable if it holds a key (the most
    /// recently released), else free. All or nothing: on error nothing
    /// changes.
    pub fn free(&self, ids: &[u32]) -> Result<(), MutexFreeError> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut inner = self.lock();
        // One pass, last id first: drop each reference, listing a block
        // whose last reference went; on a bad id, undo what was done in
        // reverse order (so the listings come off the ends they went on)
        // and refuse.
        for (done, &id) in ids.iter().rev().enumerate() {
            let error = if id as usize >= self.num_blocks {
                Some(MutexFreeError::OutOfRange { id })
            } else if inner.refs[id as usize] == 0 {
                Some(MutexFreeError::NotAllocated { id })
            } else {
                None
            };
            if let Some(error) = error {
                for &undo in &ids[ids.len() - done..] {
                    if inner.refs[undo as usize] == 0 {
                        if inner.key_of[undo as usize].is_some() {
                            debug_assert_eq!(inner.lru_tail, undo);
                            inner.lru_remove(undo);
                        } else {
                            let popped = inner.free.pop();
                            debug_assert_eq!(popped, Some(undo));
                        }
                    }
                    inner.refs[undo as usize] += 1;
                }
                return Err(error);
            }
            inner.refs[id as usize] -= 1;
            if inner.refs[id as usize] == 0 {
                inner.released(id);
            }
        }
        self.mirror(&mut inner);
        Ok(())
    }

    /// Keeps the references to `ids` and `extra` (a sequence's own) until
    /// `fence` completes; returns how many.
    fn retire(&self, fence: u64, ids: &[u32], extra: Option<u32>) -> usize {
        let n = ids.len() + usize::from(extra.is_some());
        if n == 0 {
            return 0;
        }
        let mut inner = self.lock();
        let list = inner.fenced.entry(fence).or_default();
        list.extend_from_slice(ids);
        list.extend(extra);
        inner.pending += n;
        inner.pending_peak = inner.pending_peak.max(inner.pending);
        n
    }

    /// Gives back every reference retired under `fence` so far (last
    /// retired first, as a sequence gives its table back) and returns how
    /// many, as `kvslots::BlockPool::complete`.
    pub fn complete(&self, fence: u64) -> usize {
        let mut inner = self.lock();
        let Some(list) = inner.fenced.remove(&fence) else {
            return 0;
        };
        for &id in list.iter().rev() {
            let refs = &mut inner.refs[id as usize];
            // A retired reference is the sequence's own: it is there.
            *refs = refs.saturating_sub(1);
            if *refs == 0 {
                inner.released(id);
            }
        }
        inner.pending -= list.len();
        self.mirror(&mut inner);
        list.len()
    }

    /// References retired and not given back yet.
    pub fn pending_release_blocks(&self) -> usize {
        self.lock().pending
    }

    /// The high-water mark of
    /// [`pending_release_blocks`](Self::pending_release_blocks).
    pub fn peak_pending_release_blocks(&self) -> usize {
        self.lock().pending_peak
    }

    /// On behalf of an empty sequence: appends to `out` the blocks of the
    /// longest prefix of `hashes` that is cached, one reference each (an
    /// evictable block stops being evictable), and returns how many.
    fn match_prefix(&self, hashes: &[BlockHash], out: &mut Vec<u32>) -> usize {
        out.reserve(hashes.len().min(self.num_blocks));
        let mut inner = self.lock();
        let mut k = 0;
        for key in hashes {
            let Some(&id) = inner.index.get(key) else {
                break;
            };
            if inner.refs[id as usize] == 0 {
                inner.lru_remove(id);
            }
            inner.refs[id as usize] += 1;
            out.push(id);
            k += 1;
        }
        inner.stats.queried_blocks += hashes.len() as u64;
        inner.stats.hit_blocks += k as u64;
        if k > 0 {
            self.mirror(&mut inner);
        }
        k
    }

    /// Makes `hashes[i]` the key of `blocks[i]` for each pair whose block
    /// holds no key and whose key no block holds (first wins); returns how
    /// many became cached. The blocks are the caller's full blocks.
    fn publish_blocks(&self, blocks: &[u32], hashes: &[BlockHash]) -> usize {
        let mut inner = self.lock();
        let mut published = 0;
        for (&id, key) in blocks.iter().zip(hashes) {
            if inner.key_of[id as usize].is_some() || inner.index.contains_key(key) {
                continue;
            }
            inner.key_of[id as usize] = Some(*key);
            inner.index.insert(*key, id);
            published += 1;
        }
        published
    }

    /// Takes `n` blocks (the caller has checked they are available) into
    /// `out`: the uncached free ones first, in stack order, then evictable
    /// ones, least recently released first.
    fn take_n(inner: &mut Inner, n: usize, out: &mut Vec<u32>) {
        let from_free = n.min(inner.free.len());
        let start = inner.free.len() - from_free;
        for i in start..inner.free.len() {
            let id = inner.free[i];
            inner.refs[id as usize] = 1;
            out.push(id);
        }
        inner.free.truncate(start);
        for _ in from_free..n {
            let id = inner.take();
            out.push(id);
        }
    }

    /// A sequence's growth under one lock: takes `new_blocks` blocks, plus
    /// one for a copy-on-write if `cow_of` (the sequence's partly filled
    /// last block) is shared; returns whether the copy-on-write is needed.
    /// All or nothing, like `kvslots::Sequence::try_append`.
    ///
    /// `held`: the blocks the sequence holds, which it cannot be given: new
    /// blocks past the rest of the pool are `NeverFits`.
    fn try_grow(
        &self,
        new_blocks: usize,
        cow_of: Option<u32>,
        spare: bool,
        held: usize,
        out: &mut Vec<u32>,
    ) -> Result<bool, ReserveError> {
        // Room for the ids outside the lock (bounded: a request larger than
        // the pool is refused below).
        out.reserve(new_blocks.min(self.num_blocks) + 1);
        let mut inner = self.lock();
        let cow = cow_of.is_some_and(|id| inner.refs[id as usize] > 1);
        // A partly filled block ours alone is about to be written: if it
        // holds a key, the key must not match any more (dropped once the
        // growth is sure to succeed).
        let written = cow_of.filter(|_| !cow);
        // A copy goes into a spare reserved block if the caller has one.
        let total = new_blocks.saturating_add(usize::from(cow && !spare));
        if total == 0 {
            if let Some(id) = written {
                inner.uncache(id);
            }
            return Ok(cow);
        }
        // Only the new blocks can never come (a shared tail's copy is not
        // needed once its other holders let go), as in kvslots.
        let room = self.num_blocks.saturating_sub(held);
        if new_blocks > room {
            return Err(ReserveError::NeverFits {
                requested: total,
                capacity: room,
            });
        }
        let available = inner.available();
        if total > available {
            return Err(ReserveError::Full {
                requested: total,
                available,
            });
        }
        if let Some(id) = written {
            inner.uncache(id);
        }
        Self::take_n(&mut inner, total, out);
        self.mirror(&mut inner);
        Ok(cow)
    }

    /// Adds one reference to each listed (allocated) block and, if `tail`,
    /// takes one more block, all under one lock: the fork's allocation.
    /// `held`: the blocks the parent holds (no room beside them for the
    /// tail is `NeverFits`).
    fn share_and_alloc(
        &self,
        shared: &[u32],
        tail: bool,
        held: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), ReserveError> {
        out.reserve(shared.len() + usize::from(tail));
        let mut inner = self.lock();
        if tail {
            let available = inner.available();
            let room = self.num_blocks.saturating_sub(held);
            if available == 0 || room == 0 {
                return Err(if room == 0 {
                    ReserveError::NeverFits {
                        requested: 1,
                        capacity: 0,
                    }
                } else {
                    ReserveError::Full {
                        requested: 1,
                        available,
                    }
                });
            }
        }
        for &id in shared {
            inner.refs[id as usize] += 1;
            out.push(id);
        }
        if tail {
            // Checked above: a block is available.
            Self::take_n(&mut inner, 1, out);
            self.mirror(&mut inner);
        }
        Ok(())
    }

    /// A reference count, for tests.
    pub fn refs(&self, id: u32) -> Option<u32> {
        self.lock().refs.get(id as usize).copied()
    }
}

/// The device copy a fork asks for: `tokens` slots of block `src` into
/// block `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MutexBlockCopy {
    /// The parent's partly filled last block.
    pub src: u32,
    /// The child's private block.
    pub dst: u32,
    /// Tokens to copy.
    pub tokens: usize,
}

/// A sequence's block table over a [`MutexPool`], with the semantics of
/// `kvslots::Sequence`: all-or-nothing appends, truncation, forks that
/// share full blocks and copy a partly filled tail, and copy-on-write when
/// appending into a shared partly filled block (after truncating into a
/// prefix shared with a fork).
pub struct MutexSeq {
    pool: Arc<MutexPool>,
    blocks: Vec<u32>,
    len: usize,
    /// A block replaced by a copy-on-write, still referenced until the
    /// caller's copy is done (the next append, truncate or drop).
    retired: Option<u32>,
    /// Blocks below this index may be shared with a fork; the others are
    /// ours alone, so a decode append into them needs no lock. (A `Cell`
    /// because forking, through `&self`, marks the parent's blocks.)
    shared_upto: Cell<usize>,
}

impl fmt::Debug for MutexSeq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutexSeq")
            .field("len", &self.len)
            .field("blocks", &self.blocks)
            .finish()
    }
}

impl MutexSeq {
    /// An empty sequence.
    pub fn new(pool: Arc<MutexPool>) -> MutexSeq {
        MutexSeq::with_capacity(pool, 0)
    }

    /// An empty sequence whose table has room for `tokens` tokens.
    pub fn with_capacity(pool: Arc<MutexPool>, tokens: usize) -> MutexSeq {
        // As kvslots sizes its table: one spare entry lets a copy-on-write
        // append pass its new block through the table without reallocating.
        let blocks = Vec::with_capacity(table::entries(tokens, pool.block_size, pool.num_blocks));
        MutexSeq {
            pool,
            blocks,
            len: 0,
            retired: None,
            shared_upto: Cell::new(0),
        }
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The block table: the blocks holding positions `0..len()`, in order,
    /// followed by any blocks reserved with [`try_reserve`](Self::try_reserve).
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// How many tokens the blocks in the table can hold:
    /// `blocks().len() * block_size`, at least [`len`](Self::len).
    pub fn capacity(&self) -> usize {
        self.blocks.len() * self.pool.block_size
    }

    /// Makes sure the table holds blocks for `tokens` more tokens, taking the
    /// missing ones all or none under one lock acquisition, only if
    /// `headroom` blocks stay free afterwards, without changing
    /// [`len`](Self::len) (as `kvslots::Sequence::try_reserve`): the later
    /// appends of those tokens take no lock. Reserved blocks follow the
    /// filled ones in [`blocks`](Self::blocks), are never shared by a fork
    /// (it shares only the full blocks below `len`), and are given back by
    /// [`truncate`](Self::truncate) and drop. `tokens == 0`, or tokens that
    /// already fit, take nothing.
    ///
    /// # Errors
    ///
    /// As [`MutexPool::try_alloc_with_headroom`], counted in blocks; on
    /// error nothing changes.
    pub fn try_reserve(&mut self, tokens: usize, headroom: usize) -> Result<(), ReserveError> {
        let missing = self.missing_for(tokens);
        if missing == 0 {
            return Ok(());
        }
        self.fits_beside_own(missing, headroom)?;
        self.pool
            .try_alloc_with_headroom(missing, headroom, &mut self.blocks)
    }

    /// [`try_reserve`](Self::try_reserve), waiting on the pool's condition
    /// variable for at most `timeout` (`None`: no limit), as
    /// `kvslots::Sequence::reserve_blocking`.
    ///
    /// # Errors
    ///
    /// As [`MutexPool::alloc_with_headroom_blocking`], counted in blocks;
    /// on error nothing changes.
    pub fn reserve_blocking(
        &mut self,
        tokens: usize,
        headroom: usize,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError> {
        let missing = self.missing_for(tokens);
        if missing == 0 {
            return Ok(());
        }
        self.fits_beside_own(missing, headroom)?;
        self.pool
            .alloc_with_headroom_blocking(missing, headroom, &mut self.blocks, timeout)
    }

    /// The blocks this sequence holds: its table and a copy-on-write
    /// source it keeps.
    fn held(&self) -> usize {
        self.blocks.len() + usize::from(self.retired.is_some())
    }

    /// `NeverFits` if `missing` blocks with `headroom` free besides can
    /// never be taken beside the blocks this sequence holds, as
    /// `kvslots::Sequence` refuses them.
    fn fits_beside_own(&self, missing: usize, headroom: usize) -> Result<(), ReserveError> {
        let room = self.pool.num_blocks.saturating_sub(self.held());
        if missing.saturating_add(headroom) > room {
            return Err(ReserveError::NeverFits {
                requested: missing,
                capacity: room,
            });
        }
        Ok(())
    }

    /// How many blocks a reservation of `tokens` more tokens must add.
    fn missing_for(&self, tokens: usize) -> usize {
        if tokens == 0 {
            return 0;
        }
        let (new_blocks, spare) = self.blocks_for(tokens);
        // A shared tail will need a private copy at the first append: keep a
        // block for it too (as kvslots does).
        let copy = usize::from(spare == 0 && self.tail_needs_copy());
        new_blocks.saturating_add(copy)
    }

    /// For `n` more tokens: how many blocks must be added to the table, and
    /// how many of the blocks it holds they would leave wholly unused.
    fn blocks_for(&self, n: usize) -> (usize, usize) {
        table::growth(self.len, self.blocks.len(), n, self.pool.block_size)
    }

    /// Whether the partly filled block the next append writes into is
    /// shared with a fork (one lock acquisition to read its count).
    fn tail_needs_copy(&self) -> bool {
        let (tail_index, tail) = table::tail(self.len, self.pool.block_size);
        tail != 0
            && tail_index < self.shared_upto.get()
            && self.pool.refs(self.blocks[tail_index]).unwrap_or(0) > 1
    }

    /// Appends `n` tokens, taking the blocks they need (plus a private copy
    /// of a shared, partly filled last block) all or nothing; returns the
    /// copy to make, if any.
    pub fn try_append_cow(
        &mut self,
        n: usize,
    ) -> Result<(Range<usize>, Option<MutexBlockCopy>), ReserveError> {
        let old = self.len;
        if n == 0 {
            return Ok((old..old, None));
        }
        let (new_blocks, spare) = self.blocks_for(n);
        // The partly filled block the append writes into first is the one
        // at index `old / bs`, which is not the last one when blocks are
        // reserved after it.
        let (tail_index, tail) = table::tail(old, self.pool.block_size);
        let maybe_shared = tail != 0 && tail_index < self.shared_upto.get();
        let cow = if new_blocks > 0 || maybe_shared {
            let cow_of = maybe_shared.then(|| self.blocks[tail_index]);
            let held = self.held();
            self.pool
                .try_grow(new_blocks, cow_of, spare > 0, held, &mut self.blocks)?
        } else {
            false
        };
        self.release_retired();
        // The blocks fitted in the pool, so the length fits its slots.
        self.len = old + n;
        if !cow {
            return Ok((old..self.len, None));
        }
        // The last block (taken now, or reserved and left unused by these
        // tokens) replaces the shared tail, by index.
        let dst = self.blocks.pop().expect("a new or spare block");
        let src = std::mem::replace(&mut self.blocks[tail_index], dst);
        self.retired = Some(src);
        self.shared_upto.set(self.shared_upto.get().min(tail_index));
        Ok((
            old..self.len,
            Some(MutexBlockCopy {
                src,
                dst,
                tokens: tail,
            }),
        ))
    }

    /// Appends `n` tokens; see [`try_append_cow`](Self::try_append_cow).
    pub fn try_append(&mut self, n: usize) -> Result<Range<usize>, ReserveError> {
        self.try_append_cow(n).map(|(range, _)| range)
    }

    /// Rolls back to `len` tokens; returns how many block references went
    /// back. A no-op at or above the current length.
    pub fn truncate(&mut self, len: usize) -> usize {
        if len >= self.len {
            return 0;
        }
        self.release_retired();
        let keep = table::blocks_for(len, self.pool.block_size);
        let gone = self.blocks.len() - keep;
        if gone > 0 {
            // Our own references: freeing them cannot fail.
            self.pool
                .free(&self.blocks[keep..])
                .expect("a sequence frees only its own references");
            self.blocks.truncate(keep);
        }
        self.shared_upto.set(self.shared_upto.get().min(keep));
        self.len = len;
        gone
    }

    /// [`truncate`](Self::truncate), with the references that go back
    /// (and a copy-on-write's source still kept) kept until `fence`
    /// completes, as `kvslots::Sequence::truncate_fenced`.
    pub fn truncate_fenced(&mut self, len: usize, fence: u64) -> usize {
        if len >= self.len {
            return 0;
        }
        let keep = table::blocks_for(len, self.pool.block_size);
        let gone = self.blocks.len() - keep;
        let cow = self.retired.take();
        self.pool.retire(fence, &self.blocks[keep..], cow);
        self.blocks.truncate(keep);
        self.shared_upto.set(self.shared_upto.get().min(keep));
        self.len = len;
        gone
    }

    /// Gives the sequence up with its references kept until `fence`
    /// completes, as `kvslots::Sequence::retire`; returns how many.
    pub fn retire(mut self, fence: u64) -> usize {
        let cow = self.retired.take();
        let n = self.pool.retire(fence, &self.blocks, cow);
        self.blocks.clear();
        n
    }

    /// Hands a copy-on-write's source, still kept, to `fence`, as
    /// `kvslots::Sequence::retire_copy_source`; returns 1 if there was one.
    pub fn retire_copy_source(&mut self, fence: u64) -> usize {
        let cow = self.retired.take();
        self.pool.retire(fence, &[], cow)
    }

    /// A child sharing every full block and holding a private copy of a
    /// partly filled last block; returns the copy to make, if any.
    pub fn try_fork(&self) -> Result<(MutexSeq, Option<MutexBlockCopy>), ReserveError> {
        let (full, partial) = table::tail(self.len, self.pool.block_size);
        let mut blocks = Vec::with_capacity(self.blocks.len());
        self.pool
            .share_and_alloc(&self.blocks[..full], partial != 0, self.held(), &mut blocks)?;
        let copy = (partial != 0).then(|| MutexBlockCopy {
            src: self.blocks[full],
            dst: blocks[full],
            tokens: partial,
        });
        self.shared_upto.set(self.shared_upto.get().max(full));
        Ok((
            MutexSeq {
                pool: Arc::clone(&self.pool),
                blocks,
                len: self.len,
                retired: None,
                shared_upto: Cell::new(full),
            },
            copy,
        ))
    }

    /// Appends the flat slot index of each position in `positions` to
    /// `out`; a range past `len()` is refused and `out` is unchanged.
    pub fn extend_slots(
        &self,
        positions: Range<usize>,
        out: &mut Vec<usize>,
    ) -> Result<(), String> {
        if positions.is_empty() {
            return Ok(());
        }
        if positions.end > self.len {
            return Err(format!(
                "position {} is past the sequence's length {}",
                positions.end - 1,
                self.len
            ));
        }
        // Block by block, as kvslots does, so that both allocators pay the
        // same for the mapping (it is not an allocator call).
        let bs = self.pool.block_size;
        out.reserve(positions.len());
        let mut pos = positions.start;
        while pos < positions.end {
            let base = self.blocks[pos / bs] as usize * bs;
            let end = ((pos / bs + 1) * bs).min(positions.end);
            out.extend((pos % bs..pos % bs + (end - pos)).map(|off| base + off));
            pos = end;
        }
        Ok(())
    }

    /// On an empty sequence (no token, no reserved block): takes the
    /// longest prefix of `hashes` whose blocks are cached, one reference
    /// each, sets the length to `k * block_size` and returns `k`, under one
    /// lock. On any other sequence: 0, nothing changes.
    pub fn try_match_prefix(&mut self, hashes: &[BlockHash]) -> usize {
        if self.len != 0 || !self.blocks.is_empty() || hashes.is_empty() {
            return 0;
        }
        let k = self.pool.match_prefix(hashes, &mut self.blocks);
        self.len = k * self.pool.block_size;
        // Cached blocks may be shared with other sequences.
        self.shared_upto.set(self.shared_upto.get().max(k));
        k
    }

    /// Makes `hashes[i]` the key of full block `i` (`i < len() /
    /// block_size`) for every such block not cached yet, unless another
    /// block holds the key (first wins); returns how many became cached.
    pub fn publish(&mut self, hashes: &[BlockHash]) -> usize {
        let full = (self.len / self.pool.block_size)
            .min(hashes.len())
            .min(self.blocks.len());
        if full == 0 {
            return 0;
        }
        let published = self
            .pool
            .publish_blocks(&self.blocks[..full], &hashes[..full]);
        // A cached block may be matched by other sequences from now on.
        self.shared_upto.set(self.shared_upto.get().max(full));
        published
    }

    fn release_retired(&mut self) {
        if let Some(id) = self.retired.take() {
            // Our own reference: freeing it cannot fail.
            let _ = self.pool.free(&[id]);
        }
    }
}

impl Drop for MutexSeq {
    fn drop(&mut self) {
        self.release_retired();
        if !self.blocks.is_empty() {
            // Our own references: freeing them cannot fail.
            let _ = self.pool.free(&self.blocks);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize, bs: usize) -> Arc<MutexPool> {
        Arc::new(MutexPool::new(n, bs))
    }

    #[test]
    fn alloc_is_all_or_nothing_and_free_restores() {
        let p = pool(4, 16);
        let mut a = Vec::new();
        p.try_alloc(3, &mut a).unwrap();
        assert_eq!(a.len(), 3);
        let mut b = vec![99];
        assert_eq!(
            p.try_alloc(2, &mut b),
            Err(ReserveError::Full {
                requested: 2,
                available: 1
            })
        );
        assert_eq!(b, vec![99]);
        assert_eq!(p.used_blocks(), 3);
        assert_eq!(
            p.try_alloc(usize::MAX, &mut b),
            Err(ReserveError::NeverFits {
                requested: usize::MAX,
                capacity: 4
            })
        );
        p.free(&a).unwrap();
        assert_eq!(p.used_blocks(), 0);
        assert_eq!(p.peak_used_blocks(), 3);
    }

    #[test]
    fn headroom_is_kept_free() {
        let p = pool(10, 1);
        let mut a = Vec::new();
        p.try_alloc_with_headroom(6, 2, &mut a).unwrap();
        assert!(matches!(
            p.try_alloc_with_headroom(3, 2, &mut a),
            Err(ReserveError::Full {
                requested: 3,
                available: 4
            })
        ));
        assert!(matches!(
            p.try_alloc_with_headroom(9, 2, &mut a),
            Err(ReserveError::NeverFits { .. })
        ));
        // A zero-block request is a pure headroom check.
        assert!(matches!(
            p.try_alloc_with_headroom(0, 5, &mut a),
            Err(ReserveError::Full {
                requested: 0,
                available: 4
            })
        ));
        p.try_alloc_with_headroom(0, 4, &mut a).unwrap();
        assert_eq!(a.len(), 6);
        assert_eq!(p.used_blocks(), 6);
        p.try_alloc(3, &mut a).unwrap();
        assert_eq!(p.used_blocks(), 9);
    }

    #[test]
    fn blocking_alloc_refuses_what_never_fits_or_times_out_and_changes_nothing() {
        let p = pool(4, 16);
        let mut held = Vec::new();
        p.try_alloc(3, &mut held).unwrap();
        let mut out = vec![7];
        assert_eq!(
            p.alloc_with_headroom_blocking(4, 1, &mut out, None),
            Err(ReserveError::NeverFits {
                requested: 4,
                capacity: 4
            })
        );
        assert_eq!(
            p.alloc_blocking(2, &mut out, Some(Duration::from_millis(1))),
            Err(ReserveError::Full {
                requested: 2,
                available: 1
            })
        );
        assert_eq!((out, p.used_blocks(), p.waiters()), (vec![7], 3, 0));
        let mut seq = MutexSeq::new(Arc::clone(&p));
        assert_eq!(
            seq.reserve_blocking(32, 0, Some(Duration::from_millis(1))),
            Err(ReserveError::Full {
                requested: 2,
                available: 1
            })
        );
        assert_eq!((seq.capacity(), p.used_blocks()), (0, 3));
    }

    #[test]
    fn a_free_wakes_a_blocking_waiter_with_its_blocks() {
        let p = pool(4, 16);
        let mut held = Vec::new();
        p.try_alloc(4, &mut held).unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let mut seq = MutexSeq::new(Arc::clone(&p));
                seq.reserve_blocking(32, 1, None).map(|()| seq.capacity())
            });
            // The waiter is asleep on the condition variable: free.
            while p.waiters() == 0 {
                std::thread::yield_now();
            }
            p.free(&held).unwrap();
            assert_eq!(waiter.join().unwrap(), Ok(32));
        });
        assert_eq!((p.used_blocks(), p.waiters()), (0, 0));
    }

    #[test]
    fn bad_frees_are_refused_and_change_nothing() {
        let p = pool(4, 16);
        let mut a = Vec::new();
        p.try_alloc(2, &mut a).unwrap();
        let free = p.free_blocks();
        assert_eq!(
            p.free(&[a[0], 4]),
            Err(MutexFreeError::OutOfRange { id: 4 })
        );
        assert_eq!(
            p.free(&[a[0], a[0]]),
            Err(MutexFreeError::NotAllocated { id: a[0] })
        );
        let not_allocated = (0..4).find(|i| !a.contains(i)).unwrap();
        assert_eq!(
            p.free(&[not_allocated]),
            Err(MutexFreeError::NotAllocated { id: not_allocated })
        );
        assert_eq!(p.free_blocks(), free);
        assert_eq!(p.refs(a[0]), Some(1));
        p.free(&a).unwrap();
        // The last listed id goes first, so it is the one named.
        assert_eq!(p.free(&a), Err(MutexFreeError::NotAllocated { id: a[1] }));
        assert_eq!(p.free_blocks(), 4);
    }

    #[test]
    fn fenced_give_backs_wait_for_their_fence_in_any_order() {
        let p = pool(4, 4);
        let mut a = MutexSeq::new(Arc::clone(&p));
        a.try_append(12).unwrap(); // 3 blocks
        assert_eq!(a.truncate_fenced(4, 2), 2);
        assert_eq!(a.truncate_fenced(4, 2), 0, "a no-op at the length");
        assert_eq!((p.used_blocks(), p.pending_release_blocks()), (3, 2));
        assert!(a.try_append(8).is_err(), "the fenced blocks are in use");
        assert_eq!(a.retire(1), 1);
        assert_eq!(p.complete(3), 0);
        // Out of order: fence 1 first.
        assert_eq!(p.complete(1), 1);
        assert_eq!((p.used_blocks(), p.pending_release_blocks()), (2, 2));
        assert_eq!(p.complete(2), 2);
        assert_eq!(p.complete(2), 0);
        assert_eq!(p.used_blocks(), 0);
        assert_eq!(p.peak_pending_release_blocks(), 3);
    }

    #[test]
    fn sequence_appends_truncates_forks_and_drops() {
        let p = pool(4, 4);
        let mut s = MutexSeq::new(Arc::clone(&p));
        assert_eq!(s.try_append(6).unwrap(), 0..6);
        assert_eq!(s.blocks().len(), 2);
        assert!(s.try_append(11).is_err());
        assert_eq!((s.len(), p.used_blocks()), (6, 2));
        let (child, copy) = s.try_fork().unwrap();
        let MutexBlockCopy { src, dst, tokens } = copy.unwrap();
        assert_eq!((src, tokens), (s.blocks()[1], 2));
        assert_eq!(child.blocks()[0], s.blocks()[0]);
        assert_eq!(child.blocks()[1], dst);
        assert_eq!(p.refs(s.blocks()[0]), Some(2));
        assert_eq!(p.used_blocks(), 3);
        let mut slots = Vec::new();
        child.extend_slots(4..6, &mut slots).unwrap();
        assert_eq!(slots, vec![dst as usize * 4, dst as usize * 4 + 1]);
        assert_eq!(s.truncate(3), 1);
        assert_eq!(s.truncate(10), 0);
        assert_eq!(p.used_blocks(), 2);
        drop(child);
        assert_eq!(p.used_blocks(), 1);
        // A fork on a block boundary allocates nothing.
        let (c2, copy) = s.try_fork().unwrap();
        assert!(copy.is_some()); // len 3 is mid-block
        drop(c2);
        s.try_append(1).unwrap();
        let (c3, copy) = s.try_fork().unwrap();
        assert!(copy.is_none());
        assert_eq!(p.used_blocks(), 1);
        drop((s, c3));
        assert_eq!(p.used_blocks(), 0);
    }

    #[test]
    fn appending_into_a_shared_partial_block_copies_it_first() {
        let p = pool(8, 4);
        let mut s = MutexSeq::new(Arc::clone(&p));
        s.try_append(8).unwrap();
        let (child, copy) = s.try_fork().unwrap();
        assert_eq!(copy, None);
        assert_eq!(s.truncate(6), 0); // back into the shared second block
        let (range, copy) = s.try_append_cow(1).unwrap();
        assert_eq!(range, 6..7);
        let copy = copy.unwrap();
        assert_eq!((copy.src, copy.tokens), (child.blocks()[1], 2));
        assert_ne!(s.blocks()[1], child.blocks()[1]);
        assert_eq!(p.refs(child.blocks()[1]), Some(2)); // retired, still held
        s.try_append(1).unwrap(); // the copy is done: the reference goes
        assert_eq!(p.refs(child.blocks()[1]), Some(1));
        // Its own block now: no more copies.
        assert_eq!(s.try_append_cow(1).unwrap().1, None);
        drop((s, child));
        assert_eq!(p.used_blocks(), 0);
    }

    /// Everything observable about a sequence and its pool.
    fn snap(s: &MutexSeq) -> (usize, usize, Vec<u32>, usize) {
        (
            s.len(),
            s.capacity(),
            s.blocks().to_vec(),
            s.pool.used_blocks(),
        )
    }

    #[test]
    fn reserve_takes_exactly_the_missing_blocks_and_appends_then_take_none() {
        let p = pool(8, 4);
        let mut s = MutexSeq::new(Arc::clone(&p));
        s.try_append(3).unwrap(); // 1 block, room for 1 more token
        s.try_reserve(10, 0).unwrap(); // 1 fits, 9 more need 3 blocks
        assert_eq!((s.len(), s.blocks().len(), s.capacity()), (3, 4, 16));
        assert_eq!(p.used_blocks(), 4);
        let table = s.blocks().to_vec();
        assert_eq!(s.try_append(4).unwrap(), 3..7);
        assert_eq!(s.try_append(6).unwrap(), 7..13);
        assert_eq!(p.used_blocks(), 4);
        assert_eq!(s.blocks(), &table[..]);
        // Slots of reserved-then-filled positions follow the table.
        let mut slots = Vec::new();
        s.extend_slots(0..13, &mut slots).unwrap();
        let want: Vec<usize> = (0..13).map(|q| table[q / 4] as usize * 4 + q % 4).collect();
        assert_eq!(slots, want);
        // Nothing, or what already fits, takes nothing.
        let before = snap(&s);
        s.try_reserve(0, 0).unwrap();
        s.try_reserve(3, 0).unwrap();
        assert_eq!(snap(&s), before);
    }

    #[test]
    fn refused_reserve_changes_nothing() {
        let p = pool(4, 4);
        let mut s = MutexSeq::new(Arc::clone(&p));
        s.try_append(5).unwrap(); // 2 blocks
        let before = snap(&s);
        // 2 more blocks fit beside its own 2, but never with 1 of headroom.
        assert_eq!(
            s.try_reserve(11, 1),
            Err(ReserveError::NeverFits {
                requested: 2,
                capacity: 2
            })
        );
        assert_eq!(snap(&s), before);
        // With another holder's block: 1 more fits, not now with 1 free.
        let mut other = MutexSeq::new(Arc::clone(&p));
        other.try_append(1).unwrap();
        let before = snap(&s);
        assert_eq!(
            s.try_reserve(7, 1),
            Err(ReserveError::Full {
                requested: 1,
                available: 1
            })
        );
        assert_eq!(snap(&s), before);
        drop(other);
        let before = snap(&s);
        assert!(matches!(
            s.try_reserve(usize::MAX, 0),
            Err(ReserveError::NeverFits { .. })
        ));
        assert!(matches!(
            s.try_reserve(4, usize::MAX),
            Err(ReserveError::NeverFits { .. })
        ));
        assert_eq!(snap(&s), before);
        s.try_reserve(11, 0).unwrap();
        assert_eq!((s.capacity(), p.used_blocks()), (16, 4));
    }

    #[test]
    fn fork_never_shares_reserved_blocks() {
        let p = pool(8, 4);
        let mut parent = MutexSeq::new(Arc::clone(&p));
        parent.try_append(6).unwrap(); // 1 full block, 1 with 2 tokens
        parent.try_reserve(10, 0).unwrap(); // + 2 reserved blocks
        assert_eq!(parent.blocks().len(), 4);
        let (child, copy) = parent.try_fork().unwrap();
        let copy = copy.unwrap();
        assert_eq!((copy.src, copy.tokens), (parent.blocks()[1], 2));
        assert_eq!(child.blocks().len(), 2);
        assert_eq!(child.blocks()[0], parent.blocks()[0]);
        for reserved in &parent.blocks()[2..] {
            assert!(!child.blocks().contains(reserved));
            assert_eq!(p.refs(*reserved), Some(1));
        }
        assert_eq!(p.refs(parent.blocks()[0]), Some(2));
    }

    #[test]
    fn copy_on_write_replaces_the_tail_not_a_reserved_block() {
        let p = pool(8, 4);
        let mut s = MutexSeq::new(Arc::clone(&p));
        s.try_append(8).unwrap();
        let (child, _) = s.try_fork().unwrap(); // both blocks shared
        s.truncate(6); // back into the shared second block
        s.try_reserve(6, 0).unwrap(); // 2 free in the tail + 1 reserved block
        let (shared_tail, reserved) = (s.blocks()[1], s.blocks()[2]);
        let (range, copy) = s.try_append_cow(1).unwrap();
        assert_eq!(range, 6..7);
        let copy = copy.expect("the tail is shared and partly filled");
        assert_eq!((copy.src, copy.tokens), (shared_tail, 2));
        assert_eq!(s.blocks(), &[child.blocks()[0], copy.dst, reserved]);
        assert_eq!(child.blocks()[1], shared_tail);
        // The new token lands in the private copy, never in the child's.
        let mut slots = Vec::new();
        s.extend_slots(6..7, &mut slots).unwrap();
        assert_eq!(slots, vec![copy.dst as usize * 4 + 2]);
        // The reserved block is then filled without another copy.
        assert_eq!(s.try_append_cow(5).unwrap(), (7..12, None));
        assert_eq!(s.blocks()[2], reserved);
    }

    #[test]
    fn truncate_and_drop_give_reserved_blocks_back() {
        let p = pool(8, 4);
        let mut s = MutexSeq::new(Arc::clone(&p));
        s.try_append(2).unwrap();
        s.try_reserve(20, 0).unwrap();
        assert_eq!(p.used_blocks(), 6);
        // At or past the length: a no-op, reservation kept.
        assert_eq!(s.truncate(2), 0);
        assert_eq!(p.used_blocks(), 6);
        assert_eq!(s.truncate(1), 5);
        assert_eq!((s.len(), s.capacity(), p.used_blocks()), (1, 4, 1));
        s.try_reserve(20, 0).unwrap();
        drop(s);
        assert_eq!(p.free_blocks(), 8);
    }

    #[test]
    fn fork_without_a_free_block_fails_and_changes_nothing() {
        let p = pool(3, 4);
        let mut s = MutexSeq::new(Arc::clone(&p));
        s.try_append(6).unwrap();
        let mut other = MutexSeq::new(Arc::clone(&p));
        other.try_append(1).unwrap();
        assert!(matches!(s.try_fork(), Err(ReserveError::Full { .. })));
        assert_eq!(p.refs(s.blocks()[0]), Some(1));
        assert_eq!(p.used_blocks(), 3);
        // With the whole pool its own, the tail's block can never come.
        drop(other);
        s.try_append(4).unwrap();
        assert_eq!(
            s.try_fork().unwrap_err(),
            ReserveError::NeverFits {
                requested: 1,
                capacity: 0
            }
        );
        assert_eq!(p.used_blocks(), 3);
    }

    fn key(n: u8) -> BlockHash {
        BlockHash([n; 32])
    }

    /// A sequence of `blocks` full blocks of 4 tokens, published as `keys`.
    fn published(p: &Arc<MutexPool>, keys: &[BlockHash]) -> MutexSeq {
        let mut s = MutexSeq::new(Arc::clone(p));
        s.try_append(keys.len() * 4).unwrap();
        assert_eq!(s.publish(keys), keys.len());
        s
    }

    #[test]
    fn match_takes_the_longest_cached_prefix_and_revives_evictable_blocks() {
        let p = pool(6, 4);
        let a = published(&p, &[key(1), key(2), key(3)]);
        let table = a.blocks().to_vec();
        drop(a);
        assert_eq!((p.cached_blocks(), p.evictable_blocks()), (3, 3));
        assert_eq!((p.used_blocks(), p.free_blocks()), (0, 6));
        let mut b = MutexSeq::new(Arc::clone(&p));
        assert_eq!(b.try_match_prefix(&[key(1), key(2), key(9), key(3)]), 2);
        assert_eq!((b.len(), b.blocks()), (8, &table[..2]));
        assert_eq!((p.evictable_blocks(), p.used_blocks()), (1, 2));
        assert_eq!(p.refs(table[0]), Some(1));
        // A non-empty sequence matches nothing and changes nothing.
        assert_eq!(b.try_match_prefix(&[key(3)]), 0);
        assert_eq!(b.len(), 8);
        // A second matcher shares the blocks.
        let mut c = MutexSeq::new(Arc::clone(&p));
        assert_eq!(c.try_match_prefix(&[key(1)]), 1);
        assert_eq!(p.refs(table[0]), Some(2));
        assert_eq!(c.try_match_prefix(&[]), 0);
        let stats = p.prefix_stats();
        assert_eq!((stats.queried_blocks, stats.hit_blocks), (5, 3));
        drop((b, c));
        assert_eq!(p.evictable_blocks(), 3);
    }

    #[test]
    fn publish_is_first_wins_and_covers_only_full_blocks() {
        let p = pool(8, 4);
        let a = published(&p, &[key(1), key(2)]);
        let mut b = MutexSeq::new(Arc::clone(&p));
        b.try_append(11).unwrap(); // 2 full blocks and a partial one
                                   // Key 1 stays with a's block; key 7 is new; the partial block and
                                   // the surplus key are left out.
        assert_eq!(b.publish(&[key(1), key(7), key(8), key(9)]), 1);
        assert_eq!(p.cached_blocks(), 3);
        // Publishing again changes nothing.
        assert_eq!(b.publish(&[key(1), key(7)]), 0);
        let mut c = MutexSeq::new(Arc::clone(&p));
        assert_eq!(c.try_match_prefix(&[key(1), key(2)]), 2);
        assert_eq!(c.blocks(), a.blocks());
        // An empty sequence has no full block to publish.
        assert_eq!(MutexSeq::new(Arc::clone(&p)).publish(&[key(5)]), 0);
        assert_eq!(p.cached_blocks(), 3);
    }

    /// The reference's order: uncached free blocks first, then the least
    /// recently released cached block; a sequence releases its last block
    /// first; a refused allocation evicts nothing.
    #[test]
    fn eviction_takes_free_blocks_first_then_the_least_recently_released() {
        let p = pool(5, 4);
        let a = published(&p, &[key(1), key(2)]);
        let b = published(&p, &[key(3), key(4)]);
        let (ta, tb) = (a.blocks().to_vec(), b.blocks().to_vec());
        drop(a); // releases key 2's block, then key 1's
        drop(b); // then key 4's, then key 3's
        let mut got = Vec::new();
        p.try_alloc(1, &mut got).unwrap();
        assert_eq!(p.cached_blocks(), 4, "the uncached free block goes first");
        assert_eq!(p.prefix_stats().evictions, 0);
        // Refused: more than is available; nothing is evicted.
        let mut none = Vec::new();
        assert!(matches!(
            p.try_alloc(5, &mut none),
            Err(ReserveError::Full { .. })
        ));
        assert!(matches!(
            p.try_alloc_with_headroom(1, 4, &mut none),
            Err(ReserveError::Full { .. })
        ));
        assert!(none.is_empty());
        assert_eq!((p.cached_blocks(), p.prefix_stats().evictions), (4, 0));
        p.try_alloc(3, &mut got).unwrap();
        assert_eq!(&got[1..], &[ta[1], ta[0], tb[1]]);
        assert_eq!(p.prefix_stats().evictions, 3);
        let mut left = MutexSeq::new(Arc::clone(&p));
        assert_eq!(left.try_match_prefix(&[key(3), key(4)]), 1);
        assert_eq!(left.blocks(), &tb[..1]);
        p.free(&got).unwrap();
        drop(left);
        assert_eq!(p.reset_prefix_cache(), 1);
        assert_eq!((p.cached_blocks(), p.free_blocks()), (0, 5));
    }

    #[test]
    fn appending_into_a_cached_block_held_alone_drops_its_key_first() {
        let p = pool(4, 4);
        let mut a = published(&p, &[key(1), key(2)]);
        let tail = a.blocks()[1];
        a.truncate(6); // back into the cached second block, held alone
        assert_eq!(p.cached_blocks(), 2);
        let (_, copy) = a.try_append_cow(1).unwrap();
        assert_eq!(copy, None);
        assert_eq!(a.blocks()[1], tail);
        assert_eq!(p.cached_blocks(), 1);
        let mut b = MutexSeq::new(Arc::clone(&p));
        assert_eq!(b.try_match_prefix(&[key(1), key(2)]), 1);
        // Shared with a matcher: the append copies instead.
        drop(b);
        let mut c = MutexSeq::new(Arc::clone(&p));
        assert_eq!(c.try_match_prefix(&[key(1)]), 1);
        a.truncate(2);
        let (_, copy) = a.try_append_cow(1).unwrap();
        assert!(copy.is_some());
        assert_eq!(p.cached_blocks(), 1);
        assert_ne!(a.blocks()[0], c.blocks()[0]);
        let mut d = MutexSeq::new(Arc::clone(&p));
        assert_eq!(d.try_match_prefix(&[key(1)]), 1);
        assert_eq!(d.blocks(), c.blocks());
    }
}
