//! Backends for the engine's tests (each test binary compiles this module
//! and uses what it needs).

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvslots::{HybridSequence, KvGroups};
use kvslots_sim::backend::{Copies, HybridKvslotsBackend, KvBackend, KvSeq, PrefixCounts};

/// What a [`Lying`] backend's sequences lie about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lie {
    /// Their sliding windows start one block later than they do: the
    /// engine counts out a block the sequence keeps.
    LateWindows,
    /// A match into a reservation gives the reserved blocks back, as a
    /// race can leave a grant short (see
    /// `kvslots::HybridSequence::try_match_prefix`).
    ShortGrants,
    /// As `ShortGrants`, and the first top-up of a grant left short is
    /// refused.
    ShortGrantsRefused,
    /// Every append of a sequence that no reservation or earlier append
    /// admitted (new work) is refused `BehindWaiters`, as the library
    /// refuses it while a waiter is queued.
    NewWorkBehindWaiters,
}

/// A backend over the library's hybrid sequences whose sequences lie to
/// the engine as its [`Lie`] says.
#[derive(Clone)]
pub struct Lying {
    inner: HybridKvslotsBackend,
    lie: Lie,
    /// Whether a top-up was refused yet (`ShortGrantsRefused`).
    refused: Arc<AtomicBool>,
}

impl Lying {
    /// `inner`, lying as `lie` says.
    pub fn new(lie: Lie, inner: HybridKvslotsBackend) -> Lying {
        Lying {
            inner,
            lie,
            refused: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// A sequence of a [`Lying`] backend.
pub struct LyingSeq {
    seq: HybridSequence,
    lie: Lie,
    refused: Arc<AtomicBool>,
    /// Whether its last match into a reservation left it short.
    short: bool,
    /// Whether a reservation or an append admitted it
    /// (`NewWorkBehindWaiters`).
    admitted: bool,
}

impl LyingSeq {
    /// Notes an admission: the sequence holds blocks past its length, or
    /// appended.
    fn note_admitted<T, E>(&mut self, done: Result<T, E>, appended: bool) -> Result<T, E> {
        if done.is_ok() && (appended || self.seq.capacity() > self.seq.len()) {
            self.admitted = true;
        }
        done
    }
}

impl KvSeq for LyingSeq {
    type Id = kvslots::BlockId;
    type Keys = kvslots::GroupKeys;
    fn index(id: Self::Id) -> usize {
        id.index()
    }
    fn is_null(id: Self::Id) -> bool {
        id.is_null()
    }
    fn len(&self) -> usize {
        self.seq.len()
    }
    fn groups(&self) -> usize {
        KvSeq::groups(&self.seq)
    }
    fn table(&self, group: usize) -> &[Self::Id] {
        KvSeq::table(&self.seq, group)
    }
    fn first_needed_block(&self, group: usize, len: usize) -> usize {
        let real = KvSeq::first_needed_block(&self.seq, group, len);
        if real > 0 && self.lie == Lie::LateWindows {
            real + 1
        } else {
            0
        }
    }
    fn capacity(&self) -> usize {
        self.seq.capacity()
    }
    fn try_reserve(&mut self, tokens: usize, headroom: usize) -> Result<(), kvslots::ReserveError> {
        // Relaxed: a once-flag of one worker's run; it orders nothing.
        if std::mem::take(&mut self.short)
            && self.lie == Lie::ShortGrantsRefused
            && !self.refused.swap(true, Ordering::Relaxed)
        {
            return Err(kvslots::ReserveError::Full {
                requested: tokens,
                available: 0,
            });
        }
        let done = self.seq.try_reserve(tokens, headroom);
        self.note_admitted(done, false)
    }
    fn reserve_blocking(
        &mut self,
        tokens: usize,
        headroom: usize,
        timeout: Option<std::time::Duration>,
    ) -> Result<(), kvslots::ReserveError> {
        let done = self.seq.reserve_blocking(tokens, headroom, timeout);
        self.note_admitted(done, false)
    }
    fn try_append(
        &mut self,
        n: usize,
        fence: Option<u64>,
        copies: &mut Copies<Self::Id>,
    ) -> Result<std::ops::Range<usize>, kvslots::ReserveError> {
        if self.lie == Lie::NewWorkBehindWaiters && !self.admitted && n > 0 {
            return Err(kvslots::ReserveError::BehindWaiters {
                requested: 1,
                available: 1,
                owed: 1,
            });
        }
        let done = KvSeq::try_append(&mut self.seq, n, fence, copies);
        self.note_admitted(done, true)
    }
    fn truncate(&mut self, len: usize) -> usize {
        let gone = KvSeq::truncate(&mut self.seq, len);
        if self.seq.capacity() == 0 {
            // Emptied: new work again, as in the library.
            self.admitted = false;
        }
        gone
    }
    fn truncate_fenced(&mut self, len: usize, fence: u64) -> usize {
        KvSeq::truncate_fenced(&mut self.seq, len, fence)
    }
    fn retire(self, fence: u64) -> usize {
        self.seq.retire(fence)
    }
    fn retire_copy_source(&mut self, fence: u64) -> usize {
        self.seq.retire_copy_source(fence)
    }
    fn try_fork(&self, copies: &mut Copies<Self::Id>) -> Result<Self, kvslots::ReserveError> {
        KvSeq::try_fork(&self.seq, copies).map(|seq| LyingSeq {
            seq,
            lie: self.lie,
            refused: Arc::clone(&self.refused),
            short: false,
            admitted: self.admitted,
        })
    }
    fn extend_slots(
        &self,
        group: usize,
        positions: std::ops::Range<usize>,
        out: &mut Vec<usize>,
    ) -> Result<(), String> {
        KvSeq::extend_slots(&self.seq, group, positions, out)
    }
    fn key_blocks(keys: &Self::Keys) -> usize {
        keys.blocks()
    }
    fn clear_keys(keys: &mut Self::Keys) {
        keys.clear();
    }
    fn try_match_prefix(&mut self, keys: &Self::Keys) -> usize {
        let reserved = self.seq.is_empty() && self.seq.capacity() > 0;
        let k = KvSeq::try_match_prefix(&mut self.seq, keys);
        if reserved && self.lie != Lie::LateWindows {
            self.short = self.seq.shrink_to_fit() > 0;
        }
        k
    }
    fn publish(&mut self, keys: &Self::Keys) -> usize {
        KvSeq::publish(&mut self.seq, keys)
    }
}

impl KvBackend for Lying {
    type Seq = LyingSeq;
    type Id = kvslots::BlockId;
    fn name(&self) -> &'static str {
        match self.lie {
            Lie::LateWindows => "lying-windows",
            Lie::ShortGrants | Lie::ShortGrantsRefused => "short-grants",
            Lie::NewWorkBehindWaiters => "behind-waiters",
        }
    }
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn used_blocks(&self) -> usize {
        self.inner.used_blocks()
    }
    fn peak_used_blocks(&self) -> usize {
        self.inner.peak_used_blocks()
    }
    fn ref_count(&self, index: usize) -> Option<usize> {
        self.inner.ref_count(index)
    }
    fn try_alloc_with_headroom(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<Self::Id>,
    ) -> Result<(), kvslots::ReserveError> {
        self.inner.try_alloc_with_headroom(n, headroom, out)
    }
    fn free(&self, ids: &[Self::Id]) -> Result<(), String> {
        self.inner.free(ids)
    }
    fn new_seq(&self, tokens: usize) -> LyingSeq {
        LyingSeq {
            seq: self.inner.new_seq(tokens),
            lie: self.lie,
            refused: Arc::clone(&self.refused),
            short: false,
            admitted: false,
        }
    }
    fn new_keys(&self) -> kvslots::GroupKeys {
        self.inner.new_keys()
    }
    fn extend_keys(&self, keys: &mut kvslots::GroupKeys, base: &[kvslots::BlockHash]) {
        self.inner.extend_keys(keys, base);
    }
    fn kv_groups(&self) -> &KvGroups {
        self.inner.kv_groups()
    }
    fn complete(&self, fence: u64) -> usize {
        self.inner.complete(fence)
    }
    fn peak_pending_release_blocks(&self) -> usize {
        self.inner.peak_pending_release_blocks()
    }
    fn cached_blocks(&self) -> usize {
        self.inner.cached_blocks()
    }
    fn evictable_blocks(&self) -> usize {
        self.inner.evictable_blocks()
    }
    fn prefix_stats(&self) -> PrefixCounts {
        self.inner.prefix_stats()
    }
}
