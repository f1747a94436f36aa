//! Planted faults: a backend wrapper that breaks one of the allocator's
//! promises on purpose, so that a run shows the checks catch it (the check
//! of the checker, `--plant-fault KIND`).
//!
//! The wrapper sits between the engine and a real backend and changes what
//! the engine sees; the library itself has no hook for it. Each fault fires
//! once, at the [`FIRE_AT`]th occasion for it, so that a small workload
//! meets it early.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use kvslots::ReserveError;

use kvslots::BlockHash;

use kvslots::KvGroups;

use crate::backend::{Copies, KvBackend, KvSeq, PrefixCounts};

/// The occasion (counted over the whole run) at which a fault fires.
pub const FIRE_AT: u64 = 50;

/// A planted fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// An append's slot mapping hands its last position a slot of a block
    /// the sequence does not own.
    ShortAppend,
    /// A fork shares the parent's partly filled last block instead of
    /// copying it into a block of the child's own.
    SharedForkTail,
    /// A dropped sequence's blocks are never given back (caught at the end
    /// of the run, or sooner at the give-back of a block it shared with a
    /// sibling still live).
    Leak,
    /// An append hands out a block that another sequence holds: the last
    /// block an append on the same worker thread handed to another
    /// sequence, while that sequence still holds it. (A worker drives its
    /// sequences alone, so the holder cannot give the block back before
    /// the oracle has seen the append; and a block the holder gave back
    /// may be the very block the pool hands out next, which would make the
    /// fault a no-op.)
    DoubleHandOut,
    /// An append that crosses into a new block takes one block too many.
    OverAllocate,
    /// The pool loses one reference to the block an append handed out,
    /// once the engine has checked the hand-out and mapped the slots, while
    /// the sequence holds the block alone: the state a hand-out racing a
    /// give-back on another worker leaves (the shadow counts the block
    /// held, the pool counts it free). No hand-out check sees it (the block
    /// is handed to no one else) nor the end-of-run sweep (the count is
    /// right again once the block goes back): only the give-back check. If
    /// the sequence forks first (the child's hand-out check would see it),
    /// the loss is taken back and the fault fires at a later append.
    LostReference,
    /// A worker panics inside an append.
    WorkerPanic,
    /// An append never returns (a livelock).
    StuckCall,
    /// With `--async-depth`, a fenced truncate (of rejected drafts) gives
    /// the blocks it drops back at once instead of when the step that reads
    /// them completes: a block can be handed out again while a step in
    /// flight reads it. Caught by the oracle when the step completes (the
    /// pool no longer counts the references the step holds), or sooner, if
    /// the block is handed out again first. (Fired at a truncate because
    /// drafts are never published: the blocks it drops are this worker's
    /// alone, so the oracle compares their counts exactly.)
    EarlyRelease,
}

impl Fault {
    /// Every kind.
    pub const ALL: [Fault; 9] = [
        Fault::ShortAppend,
        Fault::SharedForkTail,
        Fault::Leak,
        Fault::DoubleHandOut,
        Fault::OverAllocate,
        Fault::LostReference,
        Fault::WorkerPanic,
        Fault::StuckCall,
        Fault::EarlyRelease,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Fault::ShortAppend => "short-append",
            Fault::SharedForkTail => "shared-fork-tail",
            Fault::Leak => "leak",
            Fault::DoubleHandOut => "double-hand-out",
            Fault::OverAllocate => "over-allocate",
            Fault::LostReference => "lost-reference",
            Fault::WorkerPanic => "worker-panic",
            Fault::StuckCall => "stuck-call",
            Fault::EarlyRelease => "early-release",
        }
    }

    /// Whether the fault has occasions only with fenced release
    /// (`--async-depth` above 0).
    pub fn needs_async(self) -> bool {
        self == Fault::EarlyRelease
    }

    /// Whether the fault has occasions only with draft tokens (`--spec`
    /// above 0, or the default mix): it fires at the rollback of rejected
    /// drafts.
    pub fn needs_drafts(self) -> bool {
        self == Fault::EarlyRelease
    }
}

/// What the fault's sequences share.
#[derive(Debug)]
struct State<Id> {
    fault: Fault,
    /// Occasions seen so far.
    occasions: AtomicU64,
    /// Whether the fault has fired.
    fired: AtomicBool,
    /// Sequence ids, for telling sequences apart.
    next_seq: AtomicU64,
    /// Per worker thread, the last block an append on it handed out, and
    /// to which sequence, for as long as that sequence holds it alone.
    last_new: Mutex<Vec<(ThreadId, u64, Id)>>,
    /// The block whose reference the pool lost, and its sequence.
    lost: Mutex<Option<Lost>>,
    num_blocks: usize,
    block_size: usize,
}

impl<Id> State<Id> {
    /// Whether `fault` is due at this occasion (counting it): planted, not
    /// fired yet, and at least the [`FIRE_AT`]th occasion.
    fn due(&self, fault: Fault) -> bool {
        // Relaxed (both): a count and a once-flag; the fault's effect is
        // checked through the pool's and the oracle's own orderings.
        self.fault == fault
            && !self.fired.load(Ordering::Relaxed)
            && self.occasions.fetch_add(1, Ordering::Relaxed) + 1 >= FIRE_AT
    }

    /// Marks the fault fired; `false` if another thread fired it first.
    fn fire(&self) -> bool {
        // Relaxed: as in `due`.
        !self.fired.swap(true, Ordering::Relaxed)
    }

    /// Whether `fault` fires at this occasion: due, and fired now.
    fn fires(&self, fault: Fault) -> bool {
        self.due(fault) && self.fire()
    }

    /// Forgets the blocks recorded for sequence `seq` that `still_held`
    /// says it no longer holds alone. Call it before a call that may give
    /// them back or share them, or after one on the sequence's own thread.
    fn forget(&self, seq: u64, still_held: impl Fn(&Id) -> bool) {
        let mut last = self.last_new.lock().unwrap_or_else(|e| e.into_inner());
        last.retain(|(_, s, block)| *s != seq || still_held(block));
    }
}

/// A reference the pool lost ([`Fault::LostReference`]).
#[derive(Debug, Clone, Copy)]
struct Lost {
    /// The sequence holding the block.
    seq: u64,
    /// The block's index.
    block: usize,
    /// Whether the pool's count shows the loss yet (from the slot mapping
    /// of the append that handed the block out).
    shown: bool,
}

impl<Id> State<Id> {
    /// Runs `f` on the lost reference if it is sequence `seq`'s.
    fn lost_of(&self, seq: u64, f: impl FnOnce(&mut Option<Lost>)) {
        if self.fault != Fault::LostReference {
            return;
        }
        let mut lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        if lost.is_some_and(|l| l.seq == seq) {
            f(&mut lost);
        }
    }
}

/// A backend with a planted fault.
#[derive(Debug)]
pub struct Faulty<B: KvBackend> {
    inner: B,
    state: Arc<State<B::Id>>,
}

impl<B: KvBackend> Clone for Faulty<B> {
    fn clone(&self) -> Self {
        Faulty {
            inner: self.inner.clone(),
            state: Arc::clone(&self.state),
        }
    }
}

impl<B: KvBackend> Faulty<B> {
    /// `inner` with `fault` planted.
    pub fn new(inner: B, fault: Fault) -> Self {
        let state = Arc::new(State {
            fault,
            occasions: AtomicU64::new(0),
            fired: AtomicBool::new(false),
            next_seq: AtomicU64::new(0),
            last_new: Mutex::new(Vec::new()),
            lost: Mutex::new(None),
            num_blocks: inner.num_blocks(),
            block_size: inner.block_size(),
        });
        Faulty { inner, state }
    }

    /// Whether the fault has fired (and stayed fired: a lost reference
    /// taken back before its check fires again later).
    pub fn fired(&self) -> bool {
        // Relaxed: read once the run is over (its threads joined).
        self.state.fired.load(Ordering::Relaxed)
    }

    /// The occasions for the fault the run gave it before it fired (all of
    /// them, if it never did).
    pub fn occasions(&self) -> u64 {
        // Relaxed: as in `fired`.
        self.state.occasions.load(Ordering::Relaxed)
    }
}

/// A sequence of a [`Faulty`] backend: the real one (absent once leaked),
/// and a table that differs from the real one where a fault says so.
#[derive(Debug)]
pub struct FaultySeq<S: KvSeq> {
    inner: Option<S>,
    id: u64,
    state: Arc<State<S::Id>>,
    /// A table entry replaced by a fault: `(index, block)`.
    alias: Option<(usize, S::Id)>,
    /// The table the engine sees while an alias is in place.
    shown: Vec<S::Id>,
}

impl<S: KvSeq> FaultySeq<S> {
    fn new(inner: S, state: Arc<State<S::Id>>) -> Self {
        // Relaxed: a unique id, nothing more.
        let id = state.next_seq.fetch_add(1, Ordering::Relaxed);
        FaultySeq {
            inner: Some(inner),
            id,
            state,
            alias: None,
            shown: Vec::new(),
        }
    }

    fn seq(&self) -> &S {
        self.inner
            .as_ref()
            .expect("only a dropped sequence is leaked")
    }

    fn seq_mut(&mut self) -> &mut S {
        self.inner
            .as_mut()
            .expect("only a dropped sequence is leaked")
    }

    /// Replaces table entry `index` with `block` in what the engine sees
    /// (until the entry leaves the table).
    fn set_alias(&mut self, index: usize, block: S::Id) {
        self.alias = Some((index, block));
        self.refresh();
    }

    fn refresh(&mut self) {
        let Some((i, block)) = self.alias else {
            return;
        };
        let real = self.inner.as_ref().map_or(&[][..], |s| s.table(0));
        if i < real.len() {
            self.shown.clear();
            self.shown.extend_from_slice(real);
            self.shown[i] = block;
        } else {
            self.alias = None;
        }
    }
}

impl<S: KvSeq> Drop for FaultySeq<S> {
    fn drop(&mut self) {
        self.state.forget(self.id, |_| false);
        // The lost reference's block goes back (the count is right again).
        self.state.lost_of(self.id, |lost| *lost = None);
        let holds = self.inner.as_ref().is_some_and(|s| !s.table(0).is_empty());
        if holds && self.state.fires(Fault::Leak) {
            std::mem::forget(self.inner.take());
        }
    }
}

/// The faults act on group 0's table (the only one of a plain model);
/// the other groups' tables pass through.
impl<S: KvSeq> KvSeq for FaultySeq<S> {
    type Id = S::Id;
    type Keys = S::Keys;

    fn index(id: S::Id) -> usize {
        S::index(id)
    }
    fn is_null(id: S::Id) -> bool {
        S::is_null(id)
    }
    fn len(&self) -> usize {
        self.seq().len()
    }
    fn groups(&self) -> usize {
        self.seq().groups()
    }
    fn table(&self, group: usize) -> &[S::Id] {
        if group == 0 && self.alias.is_some() {
            &self.shown
        } else {
            self.seq().table(group)
        }
    }
    fn first_needed_block(&self, group: usize, len: usize) -> usize {
        self.seq().first_needed_block(group, len)
    }
    fn capacity(&self) -> usize {
        self.seq().capacity()
    }
    fn try_reserve(&mut self, tokens: usize, headroom: usize) -> Result<(), ReserveError> {
        let r = self.seq_mut().try_reserve(tokens, headroom);
        self.refresh();
        r
    }
    fn reserve_blocking(
        &mut self,
        tokens: usize,
        headroom: usize,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError> {
        let r = self.seq_mut().reserve_blocking(tokens, headroom, timeout);
        self.refresh();
        r
    }
    fn try_append(
        &mut self,
        n: usize,
        fence: Option<u64>,
        copies: &mut Copies<S::Id>,
    ) -> Result<Range<usize>, ReserveError> {
        let state = Arc::clone(&self.state);
        if n > 0 && state.fires(Fault::WorkerPanic) {
            panic!("planted fault: worker-panic inside try_append");
        }
        if n > 0 && state.fires(Fault::StuckCall) {
            // A call that never returns: the watchdog must end the run.
            loop {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let held = self.seq().table(0).len();
        let r = self.seq_mut().try_append(n, fence, copies);
        self.refresh();
        let grew = self.seq().table(0).len() > held;
        if r.is_ok() && grew {
            let first_new = self.seq().table(0)[held];
            let me = std::thread::current().id();
            let mut last = state.last_new.lock().unwrap_or_else(|e| e.into_inner());
            let mine = last.iter().position(|&(thread, _, _)| thread == me);
            match mine.map(|i| last[i]) {
                Some((_, other, block))
                    if other != self.id && state.fires(Fault::DoubleHandOut) =>
                {
                    self.set_alias(held, block);
                }
                _ => {
                    if let Some(i) = mine {
                        last.swap_remove(i);
                    }
                    last.push((me, self.id, first_new));
                }
            }
            drop(last);
            if state.fires(Fault::LostReference) {
                let mut lost = state.lost.lock().unwrap_or_else(|e| e.into_inner());
                *lost = Some(Lost {
                    seq: self.id,
                    block: S::index(first_new),
                    shown: false,
                });
            }
            if state.due(Fault::OverAllocate) {
                // One block beyond what the new length needs (fired only
                // if the pool has it).
                let room = self.seq().capacity() - self.seq().len();
                if self.seq_mut().try_reserve(room + 1, 0).is_ok() {
                    state.fire();
                }
            }
        }
        r
    }
    fn truncate(&mut self, len: usize) -> usize {
        let r = self.seq_mut().truncate(len);
        self.refresh();
        // On the sequence's own thread, the only one that hands its
        // recorded block to another sequence.
        let table = self.seq().table(0);
        self.state.forget(self.id, |block| table.contains(block));
        self.state.lost_of(self.id, |lost| {
            if lost.is_some_and(|l| !table.iter().any(|&id| S::index(id) == l.block)) {
                *lost = None;
            }
        });
        r
    }
    fn truncate_fenced(&mut self, len: usize, fence: u64) -> usize {
        let gives_back =
            len < self.len() && len.div_ceil(self.state.block_size) < self.seq().table(0).len();
        if gives_back && self.state.fires(Fault::EarlyRelease) {
            return self.truncate(len);
        }
        let r = self.seq_mut().truncate_fenced(len, fence);
        self.refresh();
        let table = self.seq().table(0);
        self.state.forget(self.id, |block| table.contains(block));
        self.state.lost_of(self.id, |lost| {
            if lost.is_some_and(|l| !table.iter().any(|&id| S::index(id) == l.block)) {
                *lost = None;
            }
        });
        r
    }
    fn retire(mut self, fence: u64) -> usize {
        self.inner.take().map_or(0, |seq| seq.retire(fence))
    }
    fn retire_copy_source(&mut self, fence: u64) -> usize {
        self.seq_mut().retire_copy_source(fence)
    }
    fn try_fork(&self, copies: &mut Copies<S::Id>) -> Result<Self, ReserveError> {
        // The parent's blocks are shared from now on.
        self.state.forget(self.id, |_| false);
        self.state.lost_of(self.id, |lost| {
            *lost = None;
            // Relaxed: as in `State::due`.
            self.state.fired.store(false, Ordering::Relaxed);
        });
        let before = copies.len();
        let child = self.seq().try_fork(copies)?;
        let mut child = FaultySeq::new(child, Arc::clone(&self.state));
        let bs = self.state.block_size;
        let len = self.len();
        if !len.is_multiple_of(bs) && self.state.fires(Fault::SharedForkTail) {
            // Share the parent's partly filled tail (group 0's) instead of
            // the copy.
            child.set_alias(len / bs, self.table(0)[len / bs]);
            let mut i = before;
            while i < copies.len() {
                if copies[i].0 == 0 {
                    copies.remove(i);
                } else {
                    i += 1;
                }
            }
        }
        Ok(child)
    }
    fn extend_slots(
        &self,
        group: usize,
        positions: Range<usize>,
        out: &mut Vec<usize>,
    ) -> Result<(), String> {
        let last = positions
            .end
            .checked_sub(1)
            .filter(|_| !positions.is_empty());
        self.seq().extend_slots(group, positions, out)?;
        self.state.lost_of(self.id, |lost| {
            if let Some(l) = lost {
                l.shown = true;
            }
        });
        if group == 0 && last.is_some() && self.state.fires(Fault::ShortAppend) {
            // The last position gets the same offset in the next block.
            let (bs, nb) = (self.state.block_size, self.state.num_blocks);
            if let Some(slot) = out.last_mut() {
                *slot = ((*slot / bs + 1) % nb) * bs + *slot % bs;
            }
        }
        Ok(())
    }
    fn key_blocks(keys: &S::Keys) -> usize {
        S::key_blocks(keys)
    }
    fn clear_keys(keys: &mut S::Keys) {
        S::clear_keys(keys);
    }
    fn try_match_prefix(&mut self, keys: &S::Keys) -> usize {
        let k = self.seq_mut().try_match_prefix(keys);
        self.refresh();
        k
    }
    fn publish(&mut self, keys: &S::Keys) -> usize {
        // Published blocks may be matched by other sequences from now on.
        self.state.forget(self.id, |_| false);
        self.seq_mut().publish(keys)
    }
}

impl<B: KvBackend> KvBackend for Faulty<B> {
    type Seq = FaultySeq<B::Seq>;
    type Id = B::Id;

    fn name(&self) -> &'static str {
        self.inner.name()
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
        let count = self.inner.ref_count(index)?;
        if self.state.fault != Fault::LostReference {
            return Some(count);
        }
        let lost = self.state.lost.lock().unwrap_or_else(|e| e.into_inner());
        let short = lost.is_some_and(|l| l.shown && l.block == index);
        Some(count - usize::from(short && count > 0))
    }
    fn try_alloc_with_headroom(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<B::Id>,
    ) -> Result<(), ReserveError> {
        self.inner.try_alloc_with_headroom(n, headroom, out)
    }
    fn free(&self, ids: &[B::Id]) -> Result<(), String> {
        self.inner.free(ids)
    }
    fn new_seq(&self, tokens: usize) -> FaultySeq<B::Seq> {
        FaultySeq::new(self.inner.new_seq(tokens), Arc::clone(&self.state))
    }
    fn new_keys(&self) -> <B::Seq as KvSeq>::Keys {
        self.inner.new_keys()
    }
    fn extend_keys(&self, keys: &mut <B::Seq as KvSeq>::Keys, base: &[BlockHash]) {
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
