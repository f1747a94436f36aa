//! The lock-based baseline: a block allocator whose whole state lives
//! under one `std::sync::Mutex`, as a server that serialises its block
//! manager behind one lock keeps it: the free list (a `Vec<u32>`), the
//! per-block reference counts, the prefix cache and the fences' lists.
//!
//! [`MutexPool`] implements [`kvslots::BlockAllocator`], so the engine runs
//! the library's own `kvslots::Sequence` over it: block tables, appends,
//! copy-on-write, forks and rollback are the same code for both
//! allocators, and the comparison measures the allocators alone. Each
//! allocator call takes the mutex once (a sequence's call takes it once
//! per call it makes to its allocator, as with `kvslots`, where each is a
//! lock-free operation instead). `used_blocks` is mirrored in an atomic
//! written under the lock, so that the monitor can read it without taking
//! the lock (as it reads `kvslots`' counts).
//!
//! # Waiting
//!
//! [`alloc_with_headroom_blocking`](kvslots::BlockAllocator::alloc_with_headroom_blocking)
//! waits on a `Condvar` paired with the pool's mutex: every call that
//! makes blocks available (a release, a free, a fence's complete) notifies
//! every waiter, and each re-checks under the lock. As a server that
//! serialises allocation behind one lock would build it, the waiters are
//! not served in arrival order and do not hold back `try_*` callers
//! (unlike `kvslots`' FIFO queue, whose head is owed its request).
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
//! * a cached block is never written while its key can match: a truncate
//!   into a cached block the sequence holds alone drops its key, and an
//!   append into a shared or cached partly filled block copies it.
//!
//! The map is sized for every block at the start, so that no call
//! allocates under the lock.
//!
//! # Fenced release
//!
//! A retired sequence's references wait, under the same lock, in a list
//! per fence, and the complete of the fence drops them (a list per fence
//! allocates, as `kvslots`' does).

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kvslots::{BlockAllocator, BlockHash, BlockId, ReserveError, SequenceCall};

use crate::backend::{Pool, PrefixCounts};

/// Why [`MutexPool::free`] refused; nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MutexFreeError {
    /// The id is not below `num_blocks`.
    OutOfRange {
        /// The offending id.
        id: BlockId,
    },
    /// The id is listed more times than it has references (including a
    /// block that is not allocated at all).
    NotAllocated {
        /// The offending id.
        id: BlockId,
    },
    /// The block is held by sequences (taken through [`BlockAllocator`]),
    /// which give it back themselves, as `kvslots::FreeError::HeldBySequence`.
    HeldBySequence {
        /// The offending id.
        id: BlockId,
    },
}

impl fmt::Display for MutexFreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MutexFreeError::OutOfRange { id } => write!(f, "{id} is out of range"),
            MutexFreeError::NotAllocated { id } => {
                write!(f, "{id} is freed more times than it is referenced")
            }
            MutexFreeError::HeldBySequence { id } => {
                write!(f, "{id} is held by sequences, which give it back")
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

/// The largest reference count (as `kvslots`').
const MAX_REFS: u32 = (1 << 30) - 1;

/// The pool's state, all under its one lock.
struct Inner {
    /// Uncached free block ids, used as a stack.
    free: Vec<u32>,
    /// References per block; 0 = free (uncached, or cached and evictable).
    refs: Vec<u32>,
    /// Per allocated block, whether a raw caller took it (its references
    /// are given back with [`MutexPool::free`]) rather than a sequence.
    raw: Vec<bool>,
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
    /// Per block, the number of the last match that took it, so that a
    /// match stops at a block it took already (a repeated key) in O(1).
    matched_by: Vec<u64>,
    /// Matches so far.
    matches: u64,
    /// The high-water mark of used blocks.
    peak: usize,
    /// The prefix cache's counts.
    stats: PrefixCounts,
    /// References retired under each fence not completed yet.
    fenced: HashMap<u64, Vec<BlockId>>,
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

    /// Takes `n` blocks (the caller has checked they are available) into
    /// `out`, one reference each, for a raw caller or a sequence: the
    /// uncached free ones first, in stack order, then evictable ones, least
    /// recently released first (their keys dropped).
    fn take_n(&mut self, n: usize, out: &mut Vec<BlockId>, raw: bool) {
        let from_free = n.min(self.free.len());
        let start = self.free.len() - from_free;
        for i in start..self.free.len() {
            let id = self.free[i];
            self.refs[id as usize] = 1;
            self.raw[id as usize] = raw;
            out.push(BlockId::new(id));
        }
        self.free.truncate(start);
        for _ in from_free..n {
            let id = self.lru_head;
            debug_assert_ne!(id, NIL, "an allocation checked availability");
            self.lru_remove(id);
            self.uncache(id);
            self.stats.evictions += 1;
            self.refs[id as usize] = 1;
            self.raw[id as usize] = raw;
            out.push(BlockId::new(id));
        }
    }

    /// Drops one reference to `id`; a block whose last reference goes
    /// becomes evictable if it holds a key (the most recently released),
    /// else free.
    fn drop_ref(&mut self, id: BlockId) {
        let i = id.index();
        debug_assert!(self.refs[i] > 0, "{id} dropped without a reference");
        self.refs[i] -= 1;
        if self.refs[i] == 0 {
            if self.key_of[i].is_some() {
                self.lru_push(i as u32);
            } else {
                self.free.push(i as u32);
            }
        }
    }
}

/// A block pool behind one `std::sync::Mutex`.
pub struct MutexPool {
    inner: Mutex<Inner>,
    /// Notified, under the lock, whenever blocks become available.
    freed: Condvar,
    /// `num_blocks - available`, written under the lock, read without it.
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
            num_blocks <= NIL as usize,
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
                raw: filled(num_blocks, false)?,
                key_of: filled(num_blocks, None)?,
                index,
                prev: filled(num_blocks, NIL)?,
                next: filled(num_blocks, NIL)?,
                lru_head: NIL,
                lru_tail: NIL,
                lru_len: 0,
                matched_by: filled(num_blocks, 0)?,
                matches: 0,
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
        (4 * size_of::<u32>()
            + size_of::<u64>()
            + size_of::<bool>()
            + size_of::<Option<BlockHash>>())
        .saturating_mul(num_blocks)
        .saturating_add(index)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A worker that panicked while holding the lock left the counts
        // consistent (every mutation below is panic-free once started), so
        // a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A snapshot of the free blocks (evictable cached ones included).
    pub fn free_blocks(&self) -> usize {
        self.num_blocks - self.used_blocks()
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

    /// Whether `n` blocks with `headroom` more fit the pool at all.
    fn never_fits(&self, n: usize, headroom: usize) -> Result<(), ReserveError> {
        if n.saturating_add(headroom) > self.num_blocks {
            return Err(ReserveError::NeverFits {
                requested: n,
                capacity: self.num_blocks,
            });
        }
        Ok(())
    }

    /// How many threads wait in
    /// [`alloc_with_headroom_blocking`](BlockAllocator::alloc_with_headroom_blocking)
    /// now, as `kvslots::BlockPool::waiters`. A snapshot.
    pub fn waiters(&self) -> usize {
        self.lock().waiting
    }

    /// Drops one reference per listed id, the last listed first (a
    /// sequence gives its table back last block first); a block whose last
    /// reference goes becomes evictable if it holds a key (the most
    /// recently released), else free. All or nothing: on error nothing
    /// changes.
    pub fn free(&self, ids: &[BlockId]) -> Result<(), MutexFreeError> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut inner = self.lock();
        // One pass, last id first: drop each reference, listing a block
        // whose last reference went; on a bad id, undo what was done in
        // reverse order (so the listings come off the ends they went on)
        // and refuse.
        for (done, &id) in ids.iter().rev().enumerate() {
            let error = if id.index() >= self.num_blocks {
                Some(MutexFreeError::OutOfRange { id })
            } else if inner.refs[id.index()] == 0 {
                Some(MutexFreeError::NotAllocated { id })
            } else if !inner.raw[id.index()] {
                Some(MutexFreeError::HeldBySequence { id })
            } else {
                None
            };
            if let Some(error) = error {
                for &undo in &ids[ids.len() - done..] {
                    let i = undo.index();
                    if inner.refs[i] == 0 {
                        if inner.key_of[i].is_some() {
                            debug_assert_eq!(inner.lru_tail as usize, i);
                            inner.lru_remove(i as u32);
                        } else {
                            let popped = inner.free.pop();
                            debug_assert_eq!(popped, Some(i as u32));
                        }
                    }
                    inner.refs[i] += 1;
                }
                return Err(error);
            }
            inner.drop_ref(id);
        }
        self.mirror(&mut inner);
        Ok(())
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
            inner.drop_ref(id);
        }
        inner.pending -= list.len();
        self.mirror(&mut inner);
        list.len()
    }

    /// References retired and not given back yet.
    pub fn pending_release_blocks(&self) -> usize {
        self.lock().pending
    }

    /// A reference count, for tests.
    pub fn refs(&self, id: BlockId) -> Option<u32> {
        self.lock().refs.get(id.index()).copied()
    }
}

/// The calls of a sequence, each taking the lock once; [`BlockAllocator`]
/// forwards to them. (Public, as the mutex baseline's own calls, which
/// its tests call directly; the blocks they take are a sequence's, which
/// [`free`](MutexPool::free) refuses.)
impl MutexPool {
    /// [`BlockAllocator::try_alloc_with_headroom`], under the lock.
    pub fn try_alloc_with_headroom(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        self.try_take(n, headroom, out, false)
    }

    /// [`Pool::try_alloc_raw`], under the lock: blocks that
    /// [`free`](MutexPool::free) gives back.
    pub fn try_alloc_raw(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        self.try_take(n, headroom, out, true)
    }

    /// The body of both: `n` blocks for a raw caller or a sequence.
    fn try_take(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
        raw: bool,
    ) -> Result<(), ReserveError> {
        self.never_fits(n, headroom)?;
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
        if n > 0 {
            inner.take_n(n, out, raw);
            self.mirror(&mut inner);
        }
        Ok(())
    }

    /// [`BlockAllocator::alloc_with_headroom_blocking`], waiting on the lock's condition variable.
    pub fn alloc_with_headroom_blocking(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError> {
        self.never_fits(n, headroom)?;
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
            inner.take_n(n, out, false);
            self.mirror(&mut inner);
        }
        Ok(())
    }

    /// [`BlockAllocator::add_refs`], under the lock.
    pub fn add_refs(&self, ids: &[BlockId]) -> usize {
        let mut inner = self.lock();
        for (added, &id) in ids.iter().enumerate() {
            let refs = &mut inner.refs[id.index()];
            if *refs == 0 || *refs >= MAX_REFS {
                return added;
            }
            *refs += 1;
        }
        ids.len()
    }

    /// [`BlockAllocator::release`], under the lock.
    pub fn release(&self, ids: &[BlockId]) {
        if ids.is_empty() {
            return;
        }
        let mut inner = self.lock();
        for &id in ids.iter().rev() {
            inner.drop_ref(id);
        }
        self.mirror(&mut inner);
    }

    /// [`BlockAllocator::match_prefix`], under the lock.
    pub fn match_prefix(&self, keys: &[BlockHash], out: &mut Vec<BlockId>) -> usize {
        let mut inner = self.lock();
        inner.matches += 1;
        let this = inner.matches;
        let mut k = 0;
        for key in keys {
            let Some(&id) = inner.index.get(key) else {
                break;
            };
            let i = id as usize;
            // A repeated key names a block this match took already.
            if inner.matched_by[i] == this {
                break;
            }
            inner.matched_by[i] = this;
            if inner.refs[i] == 0 {
                inner.lru_remove(id);
            }
            inner.refs[i] += 1;
            out.push(BlockId::new(id));
            k += 1;
        }
        inner.stats.queried_blocks += keys.len() as u64;
        inner.stats.hit_blocks += k as u64;
        if k > 0 {
            self.mirror(&mut inner);
        }
        k
    }

    /// [`BlockAllocator::publish`], under the lock.
    pub fn publish(&self, blocks: &[BlockId], keys: &[BlockHash]) -> usize {
        let mut inner = self.lock();
        let mut published = 0;
        for (&id, key) in blocks.iter().zip(keys) {
            if inner.key_of[id.index()].is_some() || inner.index.contains_key(key) {
                continue;
            }
            inner.key_of[id.index()] = Some(*key);
            inner.index.insert(*key, id.index() as u32);
            published += 1;
        }
        published
    }

    /// [`BlockAllocator::uncache_if_sole`], under the lock.
    pub fn uncache_if_sole(&self, id: BlockId) {
        let mut inner = self.lock();
        if inner.refs[id.index()] == 1 {
            inner.uncache(id.index() as u32);
        }
    }

    /// [`BlockAllocator::retire`], under the lock.
    pub fn retire(&self, fence: u64, ids: &[BlockId]) -> usize {
        if ids.is_empty() {
            return 0;
        }
        let mut inner = self.lock();
        inner
            .fenced
            .entry(fence)
            .or_default()
            .extend_from_slice(ids);
        inner.pending += ids.len();
        inner.pending_peak = inner.pending_peak.max(inner.pending);
        ids.len()
    }
}

/// Every call takes the lock once (the inherent calls above); the token
/// is not needed: the baseline has no call that relies on it.
impl BlockAllocator for MutexPool {
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
        MutexPool::try_alloc_with_headroom(self, n, headroom, out)
    }

    fn alloc_with_headroom_blocking(
        &self,
        _: &SequenceCall<'_>,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError> {
        MutexPool::alloc_with_headroom_blocking(self, n, headroom, out, timeout)
    }

    fn add_refs(&self, _: &SequenceCall<'_>, ids: &[BlockId]) -> usize {
        MutexPool::add_refs(self, ids)
    }

    fn release(&self, _: &SequenceCall<'_>, ids: &[BlockId]) {
        MutexPool::release(self, ids)
    }

    fn needs_copy(&self, id: BlockId) -> bool {
        let inner = self.lock();
        inner.refs[id.index()] > 1 || inner.key_of[id.index()].is_some()
    }

    fn match_prefix(
        &self,
        _: &SequenceCall<'_>,
        keys: &[BlockHash],
        out: &mut Vec<BlockId>,
    ) -> usize {
        MutexPool::match_prefix(self, keys, out)
    }

    fn publish(&self, _: &SequenceCall<'_>, blocks: &[BlockId], keys: &[BlockHash]) -> usize {
        MutexPool::publish(self, blocks, keys)
    }

    fn uncache_if_sole(&self, _: &SequenceCall<'_>, id: BlockId) {
        MutexPool::uncache_if_sole(self, id)
    }

    fn retire(&self, _: &SequenceCall<'_>, fence: u64, ids: &[BlockId]) -> usize {
        MutexPool::retire(self, fence, ids)
    }
}

impl Pool for MutexPool {
    const NAME: &'static str = "mutex";

    fn try_alloc_raw(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        MutexPool::try_alloc_raw(self, n, headroom, out)
    }
    fn used_blocks(&self) -> usize {
        // Relaxed: a snapshot for reporting; the lock orders the real state.
        self.used.load(Ordering::Relaxed)
    }
    fn peak_used_blocks(&self) -> usize {
        self.lock().peak
    }
    fn ref_count(&self, id: BlockId) -> Option<usize> {
        self.refs(id).map(|r| r as usize)
    }
    fn free(&self, ids: &[BlockId]) -> Result<(), String> {
        MutexPool::free(self, ids).map_err(|e| e.to_string())
    }
    fn complete(&self, fence: u64) -> usize {
        MutexPool::complete(self, fence)
    }
    fn peak_pending_release_blocks(&self) -> usize {
        self.lock().pending_peak
    }
    fn cached_blocks(&self) -> usize {
        self.lock().index.len()
    }
    fn evictable_blocks(&self) -> usize {
        self.lock().lru_len
    }
    fn prefix_stats(&self) -> PrefixCounts {
        self.lock().stats
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kvslots::Sequence;

    use super::*;

    fn pool(n: usize, bs: usize) -> Arc<MutexPool> {
        Arc::new(MutexPool::new(n, bs))
    }

    fn alloc(p: &MutexPool, n: usize, out: &mut Vec<BlockId>) -> Result<(), ReserveError> {
        p.try_alloc_raw(n, 0, out)
    }

    #[test]
    fn alloc_is_all_or_nothing_and_free_restores() {
        let p = pool(4, 16);
        let mut a = Vec::new();
        alloc(&p, 3, &mut a).unwrap();
        assert_eq!(a.len(), 3);
        let mut b = vec![BlockId::new(99)];
        assert_eq!(
            alloc(&p, 2, &mut b),
            Err(ReserveError::Full {
                requested: 2,
                available: 1
            })
        );
        assert_eq!(b, vec![BlockId::new(99)]);
        assert_eq!(p.used_blocks(), 3);
        assert_eq!(
            alloc(&p, usize::MAX, &mut b),
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
        alloc(&p, 3, &mut a).unwrap();
        assert_eq!(p.used_blocks(), 9);
    }

    #[test]
    fn blocking_alloc_refuses_what_never_fits_or_times_out_and_changes_nothing() {
        let p = pool(4, 16);
        let mut held = Vec::new();
        alloc(&p, 3, &mut held).unwrap();
        let mut out = vec![BlockId::new(7)];
        assert_eq!(
            p.alloc_with_headroom_blocking(4, 1, &mut out, None),
            Err(ReserveError::NeverFits {
                requested: 4,
                capacity: 4
            })
        );
        assert_eq!(
            p.alloc_with_headroom_blocking(2, 0, &mut out, Some(Duration::from_millis(1))),
            Err(ReserveError::Full {
                requested: 2,
                available: 1
            })
        );
        assert_eq!(
            (out, p.used_blocks(), p.waiters()),
            (vec![BlockId::new(7)], 3, 0)
        );
    }

    #[test]
    fn a_release_wakes_a_blocking_waiter_with_its_blocks() {
        let p = pool(4, 16);
        let mut held = Sequence::new(Arc::clone(&p));
        held.try_append(64).unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let mut seq = Sequence::new(Arc::clone(&p));
                seq.reserve_blocking(32, 1, None).map(|()| seq.capacity())
            });
            // The waiter is asleep on the condition variable: give back.
            while p.waiters() == 0 {
                std::thread::yield_now();
            }
            drop(held);
            assert_eq!(waiter.join().unwrap(), Ok(32));
        });
        assert_eq!((p.used_blocks(), p.waiters()), (0, 0));
    }

    #[test]
    fn bad_frees_are_refused_and_change_nothing() {
        let p = pool(4, 16);
        let mut a = Vec::new();
        alloc(&p, 2, &mut a).unwrap();
        let free = p.free_blocks();
        let out = BlockId::new(4);
        assert_eq!(
            p.free(&[a[0], out]),
            Err(MutexFreeError::OutOfRange { id: out })
        );
        assert_eq!(
            p.free(&[a[0], a[0]]),
            Err(MutexFreeError::NotAllocated { id: a[0] })
        );
        let idle = (0..4).map(BlockId::new).find(|i| !a.contains(i)).unwrap();
        assert_eq!(
            p.free(&[idle]),
            Err(MutexFreeError::NotAllocated { id: idle })
        );
        // A sequence's block is the sequence's to give back.
        let mut seq = Sequence::new(Arc::clone(&p));
        seq.try_append(16).unwrap();
        let held = seq.blocks()[0];
        assert_eq!(
            p.free(&[a[0], held]),
            Err(MutexFreeError::HeldBySequence { id: held })
        );
        assert_eq!(p.refs(held), Some(1));
        drop(seq);
        assert_eq!(p.free_blocks(), free);
        assert_eq!(p.refs(a[0]), Some(1));
        p.free(&a).unwrap();
        // The last listed id goes first, so it is the one named.
        assert_eq!(p.free(&a), Err(MutexFreeError::NotAllocated { id: a[1] }));
        assert_eq!(p.free_blocks(), 4);
    }

    #[test]
    fn references_are_added_until_a_block_has_none_and_released_to_zero() {
        let p = pool(4, 16);
        let mut a = Vec::new();
        alloc(&p, 2, &mut a).unwrap();
        assert_eq!(p.add_refs(&a), 2);
        assert_eq!((p.refs(a[0]), p.needs_copy(a[0])), (Some(2), true));
        p.release(&a);
        assert_eq!((p.refs(a[0]), p.needs_copy(a[0])), (Some(1), false));
        p.free(&a[1..]).unwrap();
        // A block with no reference left takes none: the count stops there.
        assert_eq!(p.add_refs(&a), 1);
        assert_eq!((p.refs(a[0]), p.refs(a[1])), (Some(2), Some(0)));
        p.release(&[a[0], a[0]]);
        assert_eq!((p.used_blocks(), p.refs(a[0])), (0, Some(0)));
    }

    #[test]
    fn fenced_give_backs_wait_for_their_fence_in_any_order() {
        let p = pool(4, 4);
        let mut a = Sequence::new(Arc::clone(&p));
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

    fn key(n: u8) -> BlockHash {
        BlockHash([n; 32])
    }

    /// A sequence of full blocks of 4 tokens, published as `keys`.
    fn published(p: &Arc<MutexPool>, keys: &[BlockHash]) -> Sequence<MutexPool> {
        let mut s = Sequence::new(Arc::clone(p));
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
        let mut b = Sequence::new(Arc::clone(&p));
        assert_eq!(b.try_match_prefix(&[key(1), key(2), key(9), key(3)]), 2);
        assert_eq!((b.len(), b.blocks()), (8, &table[..2]));
        assert_eq!((p.evictable_blocks(), p.used_blocks()), (1, 2));
        assert_eq!(p.refs(table[0]), Some(1));
        // A non-empty sequence matches nothing and changes nothing.
        assert_eq!(b.try_match_prefix(&[key(3)]), 0);
        assert_eq!(b.len(), 8);
        // A second matcher shares the blocks; a repeated key ends a match.
        let mut c = Sequence::new(Arc::clone(&p));
        assert_eq!(c.try_match_prefix(&[key(1), key(1)]), 1);
        assert_eq!(p.refs(table[0]), Some(2));
        assert_eq!(c.try_match_prefix(&[]), 0);
        let stats = p.prefix_stats();
        assert_eq!((stats.queried_blocks, stats.hit_blocks), (6, 3));
        drop((b, c));
        assert_eq!(p.evictable_blocks(), 3);
    }

    #[test]
    fn publish_is_first_wins_and_covers_only_full_blocks() {
        let p = pool(8, 4);
        let a = published(&p, &[key(1), key(2)]);
        let mut b = Sequence::new(Arc::clone(&p));
        b.try_append(11).unwrap(); // 2 full blocks and a partial one
                                   // Key 1 stays with a's block; key 7 is new; the partial block and
                                   // the surplus key are left out.
        assert_eq!(b.publish(&[key(1), key(7), key(8), key(9)]), 1);
        assert_eq!(p.cached_blocks(), 3);
        // Publishing again changes nothing.
        assert_eq!(b.publish(&[key(1), key(7)]), 0);
        let mut c = Sequence::new(Arc::clone(&p));
        assert_eq!(c.try_match_prefix(&[key(1), key(2)]), 2);
        assert_eq!(c.blocks(), a.blocks());
        // An empty sequence has no full block to publish.
        assert_eq!(Sequence::new(Arc::clone(&p)).publish(&[key(5)]), 0);
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
        alloc(&p, 1, &mut got).unwrap();
        assert_eq!(p.cached_blocks(), 4, "the uncached free block goes first");
        assert_eq!(p.prefix_stats().evictions, 0);
        // Refused: more than is available; nothing is evicted.
        let mut none = Vec::new();
        assert!(matches!(
            alloc(&p, 5, &mut none),
            Err(ReserveError::Full { .. })
        ));
        assert!(matches!(
            p.try_alloc_with_headroom(1, 4, &mut none),
            Err(ReserveError::Full { .. })
        ));
        assert!(none.is_empty());
        assert_eq!((p.cached_blocks(), p.prefix_stats().evictions), (4, 0));
        alloc(&p, 3, &mut got).unwrap();
        assert_eq!(&got[1..], &[ta[1], ta[0], tb[1]]);
        assert_eq!(p.prefix_stats().evictions, 3);
        let mut left = Sequence::new(Arc::clone(&p));
        assert_eq!(left.try_match_prefix(&[key(3), key(4)]), 1);
        assert_eq!(left.blocks(), &tb[..1]);
        p.free(&got).unwrap();
        drop(left);
        assert_eq!(p.reset_prefix_cache(), 1);
        assert_eq!((p.cached_blocks(), p.free_blocks()), (0, 5));
    }

    /// A cached block is never written while its key can match: held
    /// alone, a truncate into it drops its key; shared, the append copies.
    #[test]
    fn a_cached_block_is_written_only_without_its_key() {
        let p = pool(4, 4);
        let mut a = published(&p, &[key(1), key(2)]);
        let tail = a.blocks()[1];
        a.truncate(6); // back into the cached second block, held alone
        assert_eq!(p.cached_blocks(), 1);
        let (_, copy) = a.try_append_cow(1).unwrap();
        assert_eq!(copy, None);
        assert_eq!(a.blocks()[1], tail);
        let mut b = Sequence::new(Arc::clone(&p));
        assert_eq!(b.try_match_prefix(&[key(1), key(2)]), 1);
        // Shared with a matcher: the append copies instead.
        drop(b);
        let mut c = Sequence::new(Arc::clone(&p));
        assert_eq!(c.try_match_prefix(&[key(1)]), 1);
        a.truncate(2);
        let (_, copy) = a.try_append_cow(1).unwrap();
        assert!(copy.is_some());
        assert_eq!(p.cached_blocks(), 1);
        assert_ne!(a.blocks()[0], c.blocks()[0]);
        let mut d = Sequence::new(Arc::clone(&p));
        assert_eq!(d.try_match_prefix(&[key(1)]), 1);
        assert_eq!(d.blocks(), c.blocks());
    }
}
