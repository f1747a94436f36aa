//! The KV-memory oracle: a simulated device memory that checks what the
//! allocator hands out, independently of the allocator's own counters.
//!
//! # The memory
//!
//! One stamp per token slot (`num_blocks * block_size` of them) says which
//! request, sample, attempt and position last wrote the slot. The engine
//! behaves like a server: every append writes the stamps of all the
//! positions it covers through the slot mapping the allocator returned
//! (draft tokens included, before any truncate), every [`BlockCopy`] copies
//! stamps, and attention reads earlier positions back through the block
//! table (a sampled position at every step, the drafts before they are
//! verified, and every position of a sequence before it is dropped). A
//! stamp that is not the one the sequence wrote is a failure naming the
//! request, sample, position and block.
//!
//! # Cached prompt blocks
//!
//! With prefix caching, a sequence may start with blocks another request
//! wrote (the block's publisher), matched from the cache. So the positions
//! of a prompt's full trace blocks (the cacheable ones, see
//! [`crate::prefix`]) are stamped with a *content stamp* instead: the
//! content id of their trace block (a chain of the request's trace hash
//! ids up to that block, computed independently of the cache's keys) and
//! the position. Every request whose prompt has the same ids up to a block
//! writes, and expects, the same stamps there; a matched block that holds
//! another prefix's content (or a stale one) reads back the wrong content
//! id and fails the run.
//!
//! Cached blocks are shared across workers, so the shadow cannot compare
//! their counts with the pool's at every call (another worker may be
//! between its call and its shadow update): for the entries of a table
//! that were matched or published ([`Tracked::share`]) it only checks, at
//! the hand-out and at the give-back, that the pool counts the block as
//! held. The final sweep, once every worker has stopped, compares every
//! block exactly.
//!
//! # The shadow
//!
//! Beside the memory, a count per block of the live sequence tables that
//! hold it, kept from the tables the allocator returns: it must equal the
//! pool's reference count for every block a call hands to a sequence, and
//! for every block just before a call gives it back; a slot is written only
//! through a block exactly one table holds, at the place the table says; an
//! append changes no entry of the table other than the shared tail it
//! copies on write; and at the end no block is held and the pool counts no
//! reference.
//!
//! # Why both counts are compared at the hand-out and at the give-back
//!
//! Apart from cached prompt blocks (above), a block is shared only between
//! the sequences of one group (a fork's child is pushed into its parent's
//! group), and a group lives on one
//! worker from admission to its drop (a preempted group is dropped and its
//! request queued again on the same worker, to be admitted afresh), which
//! drives its sequences one call at a time. So with a correct allocator
//! every holder of a block a sequence holds is on that sequence's worker,
//! no other thread moves the block's count in the pool or in the shadow,
//! and the two are equal exactly, whenever that worker looks.
//!
//! The hand-out check alone has a blind spot: if a broken pool hands a
//! block to one worker while a sequence on another is giving it back, the
//! hand-out's comparison can land after the giver's shadow was lowered but
//! before the pool's count was, and read 1 on both sides; afterwards the
//! shadow counts the block held while the pool counts it free, and when the
//! new holder gives it back both reach 0 again, so the end-of-run sweep
//! sees nothing. The give-back check catches that state at the new
//! holder's give-back (or sooner, at the giver's, if the broken hand-out
//! had already moved the pool's count): it names the block, the request and
//! both counts.
//!
//! # Steps in flight (`--async-depth`)
//!
//! With asynchronous scheduling the blocks a sequence gives back are
//! retired under the fence of the step that reads them and go back only
//! when the engine completes that step. Beside the holders, the shadow
//! keeps a count per block of the retired references still in flight
//! ([`Oracle::give_back_fenced`], [`Oracle::retire_copy_source`]): the
//! pool must count `holders + in flight` references wherever it counted
//! `holders` above; a block handed to a new owner, or written, while a
//! step in flight reads it fails the run; and before each step completes
//! ([`Oracle::before_complete`]) the pool must still count every reference
//! that the step holds (a retirement given back early shows there even if
//! no one has taken the block yet). The give-back lowers the holders
//! before it raises the in-flight count, and the complete lowers the
//! in-flight count before the call, so the sum never exceeds what a
//! correct pool counts, also while other workers look.
//!
//! # Orderings
//!
//! Stamps and shadow counts are `Relaxed`: the pool orders one holder's use
//! of a block before the next holder's (Release when it frees, Acquire when
//! it allocates), and the shadow of a block is lowered before the call that
//! gives it back (raised again after a refused call, which gives nothing
//! back) and raised after the call that took it, so with a correct
//! allocator no two threads ever touch one block's stamps or count at once.
//! With a broken one they may race; the values then read are still some
//! value written, which is what makes the failure visible.

use std::collections::TryReserveError;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::backend::{BlockCopy, KvBackend, KvSeq};

/// Who wrote a slot: the fields of a stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The request's id (kept modulo 2^20).
    pub request: usize,
    /// The group of layers whose table the slot was written through (0 for
    /// a plain model; modulo 16).
    pub group: usize,
    /// The sample (0 for the parent; modulo 256).
    pub sample: usize,
    /// How many times the request was preempted before (modulo 256).
    pub attempt: u32,
    /// The token position (modulo 2^22).
    pub position: usize,
}

const WRITTEN: u64 = 1 << 63;
/// Set (with `WRITTEN`) in a content stamp: a content id's low 36 bits,
/// the group, then the position.
const CONTENT: u64 = 1 << 62;
const CONTENT_BITS: u32 = 36;
const REQUEST_BITS: u32 = 20;
const GROUP_BITS: u32 = 4;
const POSITION_BITS: u32 = 22;

impl Stamp {
    /// The stamp as stored: a set top bit, then the fields, each cut to its
    /// width.
    #[inline]
    pub fn pack(self) -> u64 {
        WRITTEN
            | (self.request as u64 & ((1 << REQUEST_BITS) - 1)) << 42
            | (self.group as u64 & ((1 << GROUP_BITS) - 1)) << 38
            | (self.sample as u64 & 0xff) << 30
            | u64::from(self.attempt & 0xff) << POSITION_BITS
            | (self.position as u64 & ((1 << POSITION_BITS) - 1))
    }

    /// The fields of a stored stamp; `None` for a slot never written or a
    /// content stamp.
    pub fn unpack(raw: u64) -> Option<Stamp> {
        (raw & (WRITTEN | CONTENT) == WRITTEN).then_some(Stamp {
            request: ((raw >> 42) & ((1 << REQUEST_BITS) - 1)) as usize,
            group: ((raw >> 38) & ((1 << GROUP_BITS) - 1)) as usize,
            sample: ((raw >> 30) & 0xff) as usize,
            attempt: ((raw >> POSITION_BITS) & 0xff) as u32,
            position: (raw & ((1 << POSITION_BITS) - 1)) as usize,
        })
    }

    /// The content stamp of `position`, written through group `group`'s
    /// table, in a trace block whose content id is `content`.
    #[inline]
    pub fn content(content: u64, group: usize, position: usize) -> u64 {
        WRITTEN
            | CONTENT
            | (content & ((1 << CONTENT_BITS) - 1)) << (GROUP_BITS + POSITION_BITS)
            | (group as u64 & ((1 << GROUP_BITS) - 1)) << POSITION_BITS
            | (position as u64 & ((1 << POSITION_BITS) - 1))
    }

    fn describe(raw: u64) -> String {
        let group = |g: u64| {
            if g == 0 {
                String::new()
            } else {
                format!(" group {g}")
            }
        };
        if raw & (WRITTEN | CONTENT) == WRITTEN | CONTENT {
            return format!(
                "the content stamp of content {:#x}{} position {}",
                (raw >> (GROUP_BITS + POSITION_BITS)) & ((1 << CONTENT_BITS) - 1),
                group((raw >> POSITION_BITS) & ((1 << GROUP_BITS) - 1)),
                raw & ((1 << POSITION_BITS) - 1)
            );
        }
        match Stamp::unpack(raw) {
            None => "a slot never written".to_string(),
            Some(s) => format!(
                "the stamp of request {}{} sample {} attempt {} position {}",
                s.request,
                group(s.group as u64),
                s.sample,
                s.attempt,
                s.position
            ),
        }
    }
}

/// Whose positions a sequence holds: positions below `fork_len` were
/// written by sample 0 (the parent, before the fork), the others by
/// `sample`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Writer {
    /// The request's id.
    pub request: usize,
    /// The sample.
    pub sample: usize,
    /// The request's attempt.
    pub attempt: u32,
    /// The parent's length when this sample was forked (0 for the parent).
    pub fork_len: usize,
}

impl Writer {
    /// The stamp position `position` of this sequence must hold in group
    /// `group`.
    #[inline]
    pub fn stamp(&self, group: usize, position: usize) -> u64 {
        Stamp {
            request: self.request,
            group,
            sample: if position < self.fork_len {
                0
            } else {
                self.sample
            },
            attempt: self.attempt,
            position,
        }
        .pack()
    }
}

/// The oracle's record of one live sequence's table in one group of
/// layers: who it writes as, and the table as the shadow counts it.
#[derive(Debug, Clone)]
pub struct Tracked<Id> {
    /// Who writes this sequence's positions.
    pub writer: Writer,
    /// The group of layers whose table this is (0 for a plain model).
    pub group: usize,
    /// The content id of each cacheable (full) trace block of the prompt:
    /// its positions get content stamps (empty without prefix caching).
    content: Arc<[u64]>,
    /// Leading table entries that other workers' sequences may hold too:
    /// blocks matched from the cache, and published ones.
    shared: usize,
    /// The table as of the sequence's last allocator call.
    table: Vec<Id>,
    /// A block a copy-on-write replaced, which the sequence still holds
    /// until its next call.
    retired: Option<Id>,
    /// The entries a sliding window is giving back in the call under way
    /// (for [`Oracle::keep_window`] if it is refused).
    leaving: Vec<(usize, Id)>,
}

impl<Id: Copy> Tracked<Id> {
    /// A sequence with an empty table.
    pub fn new(writer: Writer) -> Self {
        Tracked::with_content(writer, Arc::from([]))
    }

    /// A sequence with an empty table whose prompt's cacheable trace blocks
    /// have the `content` ids.
    pub fn with_content(writer: Writer, content: Arc<[u64]>) -> Self {
        Tracked {
            writer,
            group: 0,
            content,
            shared: 0,
            table: Vec::new(),
            retired: None,
            leaving: Vec::new(),
        }
    }

    /// The records of a sequence's `groups` tables: this one's writer and
    /// content, group `g`'s table (empty) for each `g`.
    pub fn groups(self, groups: usize) -> Vec<Self>
    where
        Id: Clone,
    {
        (0..groups)
            .map(|group| Tracked {
                group,
                ..self.clone()
            })
            .collect()
    }

    /// Records that the first `entries` table entries may be held by other
    /// workers' sequences too (matched from the cache, or published).
    pub fn share(&mut self, entries: usize) {
        self.shared = self.shared.max(entries);
    }

    /// A fork's record: `writer`, the same content, an empty table.
    pub fn forked(&self, writer: Writer) -> Self {
        Tracked {
            writer,
            group: self.group,
            content: Arc::clone(&self.content),
            shared: self.shared,
            table: Vec::new(),
            retired: None,
            leaving: Vec::new(),
        }
    }

    /// The stamp position `position` of this sequence must hold: a content
    /// stamp in a cacheable trace block, else the writer's.
    #[inline]
    pub fn stamp(&self, position: usize) -> u64 {
        match self.content.get(position / crate::prefix::TRACE_BLOCK) {
            Some(&c) => Stamp::content(c, self.group, position),
            None => self.writer.stamp(self.group, position),
        }
    }

    /// The table as the shadow counts it.
    pub fn table(&self) -> &[Id] {
        &self.table
    }
}

impl<Id: Copy> Tracked<Id> {
    /// The leading null entries of the table (blocks its sliding window
    /// gave back), given `is_null`.
    pub fn null_entries(&self, is_null: impl Fn(Id) -> bool) -> usize {
        self.table.iter().take_while(|&&id| is_null(id)).count()
    }
}

/// One reference retired under a fence, as the oracle lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencedRef {
    /// The block's index.
    pub block: usize,
    /// Whether other workers' sequences may hold the block too (a table
    /// entry matched from the cache or published, or a copy-on-write's
    /// source).
    pub shared: bool,
}

/// The simulated device memory and the shadow of who holds each block.
#[derive(Debug)]
pub struct Oracle {
    stamps: Vec<AtomicU64>,
    holders: Vec<AtomicU32>,
    /// Per block, references retired under fences not completed yet.
    in_flight: Vec<AtomicU32>,
    block_size: usize,
}

impl Oracle {
    /// Memory for `num_blocks` blocks of `block_size` slots, none written,
    /// no block held.
    ///
    /// # Panics
    ///
    /// Panics if the memory cannot be allocated ([`try_new`](Self::try_new)
    /// returns the refusal instead).
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Oracle::try_new(num_blocks, block_size).expect("memory for the KV-memory oracle")
    }

    /// [`new`](Self::new), with the allocator's refusal as an error (also
    /// when `num_blocks * block_size` overflows); nothing is left allocated
    /// then.
    pub fn try_new(num_blocks: usize, block_size: usize) -> Result<Self, TryReserveError> {
        fn zeroed<T>(n: usize, zero: impl Fn() -> T) -> Result<Vec<T>, TryReserveError> {
            let mut v = Vec::new();
            v.try_reserve_exact(n)?;
            v.extend((0..n).map(|_| zero()));
            Ok(v)
        }
        // An overflowing slot count asks for more than any allocator has.
        let slots = num_blocks.saturating_mul(block_size);
        Ok(Oracle {
            stamps: zeroed(slots, || AtomicU64::new(0))?,
            holders: zeroed(num_blocks, || AtomicU32::new(0))?,
            in_flight: zeroed(num_blocks, || AtomicU32::new(0))?,
            block_size,
        })
    }

    /// The heap memory, in bytes, [`new`](Self::new) takes (8 bytes a slot
    /// and 8 a block), saturating.
    pub fn memory_bytes(num_blocks: usize, block_size: usize) -> usize {
        num_blocks
            .saturating_mul(block_size)
            .saturating_mul(std::mem::size_of::<AtomicU64>())
            .saturating_add(num_blocks.saturating_mul(2 * std::mem::size_of::<AtomicU32>()))
    }

    /// Checks and lowers the shadow for the blocks a call is about to give
    /// back: every entry from `keep` on (the blocks a truncate to a length
    /// that needs `keep` blocks gives back, or all of them for a drop), and
    /// any block a copy-on-write retired. Call it before the call. Each
    /// block must be counted by the pool exactly as many times as live
    /// tables hold it (see the module's give-back check); the shadow is
    /// lowered whatever the check finds, and the first block that
    /// disagrees is named.
    pub fn before_release<B: KvBackend>(
        &self,
        backend: &B,
        t: &mut Tracked<B::Id>,
        keep: usize,
    ) -> Result<(), String> {
        self.give_back(backend, t, keep, None)
    }

    /// [`before_release`](Self::before_release) for a give-back under a
    /// fence (a fenced truncate, a retired sequence): the blocks stay in
    /// flight until the fence completes, and their indices are appended to
    /// `fenced`, the fence's list (for [`before_complete`](Self::before_complete)).
    pub fn give_back_fenced<B: KvBackend>(
        &self,
        backend: &B,
        t: &mut Tracked<B::Id>,
        keep: usize,
        fenced: &mut Vec<FencedRef>,
    ) -> Result<(), String> {
        self.give_back(backend, t, keep, Some(fenced))
    }

    fn give_back<B: KvBackend>(
        &self,
        backend: &B,
        t: &mut Tracked<B::Id>,
        keep: usize,
        mut fenced: Option<&mut Vec<FencedRef>>,
    ) -> Result<(), String> {
        let retired = t.retired.map(B::Seq::index);
        let mut first = self.release_retired(backend, t).map(|_| ());
        let entries = t.table.iter().enumerate().skip(keep);
        let held = entries.filter(|&(_, &id)| !B::Seq::is_null(id));
        for (i, block) in held.map(|(i, &id)| (i, B::Seq::index(id))) {
            let shared = i < t.shared;
            let checked = self.check_and_lower(backend, &t.writer, block, i, shared);
            if first.is_ok() {
                first = checked;
            }
            if let Some(list) = fenced.as_deref_mut() {
                self.fly(block, shared, list);
            }
        }
        if let (Some(block), Some(list)) = (retired, fenced) {
            // A copy-on-write's source may be a block matched from the
            // cache: shared, to be safe.
            self.fly(block, true, list);
        }
        t.table.truncate(keep);
        first
    }

    /// Counts a retired reference to `block` in flight (after its holder
    /// was lowered) and lists it under its fence.
    fn fly(&self, block: usize, shared: bool, list: &mut Vec<FencedRef>) {
        if let Some(f) = self.in_flight.get(block) {
            // Relaxed: see the module's orderings.
            f.fetch_add(1, Ordering::Relaxed);
            list.push(FencedRef { block, shared });
        }
    }

    /// Hands the block a copy-on-write retired (if any) to a fence, as
    /// the sequence's `retire_copy_source` does: checked and lowered as at
    /// a give-back, then in flight under the fence (listed in `fenced`).
    pub fn retire_copy_source<B: KvBackend>(
        &self,
        backend: &B,
        t: &mut Tracked<B::Id>,
        fenced: &mut Vec<FencedRef>,
    ) -> Result<(), String> {
        let retired = self.release_retired(backend, t);
        if let Ok(Some(id)) = retired {
            // As in `give_back`: shared, to be safe.
            self.fly(B::Seq::index(id), true, fenced);
        }
        retired.map(|_| ())
    }

    /// The check before a step's fence completes, for the blocks retired
    /// under it (`fenced`, one entry per retired reference): the pool must
    /// still count, besides the live tables' references, every reference
    /// in flight (this step's among them); for a block other workers'
    /// sequences may hold too (matched or published), whose shadow updates
    /// interleave with this check, only that it counts one. Lowers the
    /// in-flight counts whatever it finds; names the first block that
    /// disagrees.
    pub fn before_complete<B: KvBackend>(
        &self,
        backend: &B,
        fence: u64,
        fenced: &[FencedRef],
    ) -> Result<(), String> {
        let mut first = Ok(());
        for &FencedRef { block, shared } in fenced {
            let (Some(h), Some(f)) = (self.holders.get(block), self.in_flight.get(block)) else {
                continue;
            };
            // Relaxed: see the module's orderings.
            let held = h.load(Ordering::Relaxed) as usize;
            let flying = f.fetch_sub(1, Ordering::Relaxed) as usize;
            let counted = backend.ref_count(block).unwrap_or(0);
            let short = if shared {
                counted == 0
            } else {
                counted < held + flying
            };
            if short && first.is_ok() {
                first = Err(format!(
                    "block {block}, retired under fence {fence}, was given back before the step \
                     completed: the pool counts {counted} references, but {held} live sequences \
                     and {flying} steps in flight hold it"
                ));
            }
        }
        first
    }

    /// Checks and lowers the shadow for a block a copy-on-write retired:
    /// the sequence's next call that changes its table (an append of at
    /// least one token, a truncate below its length, the drop) gives it
    /// back. Call it before such a call; it returns the block, for
    /// [`keep_retired`](Self::keep_retired) if the call is refused.
    pub fn release_retired<B: KvBackend>(
        &self,
        backend: &B,
        t: &mut Tracked<B::Id>,
    ) -> Result<Option<B::Id>, String> {
        let Some(id) = t.retired.take() else {
            return Ok(None);
        };
        let block = B::Seq::index(id);
        self.check_and_lower(backend, &t.writer, block, usize::MAX, false)
            .map(|()| Some(id))
    }

    /// Counts a retired block in again after a call that was refused (a
    /// refused call changes nothing, so the sequence still holds it).
    pub fn keep_retired<S: KvSeq>(&self, t: &mut Tracked<S::Id>, retired: Option<S::Id>) {
        if let Some(id) = retired {
            if let Some(h) = self.holders.get(S::index(id)) {
                // Relaxed: see the module's orderings.
                h.fetch_add(1, Ordering::Relaxed);
            }
            t.retired = Some(id);
        }
    }

    /// The give-back check of `block` (table entry `entry`, or
    /// `usize::MAX` for a retired block), then the lowering of its shadow.
    /// A `shared` entry (matched or published, so other workers' sequences
    /// may be between their call and their shadow update on it) must only
    /// be counted as held; the final sweep compares it exactly.
    fn check_and_lower<B: KvBackend>(
        &self,
        backend: &B,
        w: &Writer,
        block: usize,
        entry: usize,
        shared: bool,
    ) -> Result<(), String> {
        // A block past the pool was never counted (see `after_call`).
        let Some(h) = self.holders.get(block) else {
            return Ok(());
        };
        // Relaxed: see the module's orderings.
        let held = h.load(Ordering::Relaxed) as usize;
        let flying = self.flying(block);
        let counted = backend.ref_count(block).unwrap_or(0);
        self.lower(block);
        if held + flying == counted || (shared && counted > 0) {
            return Ok(());
        }
        if flying > 0 {
            return Err(format!(
                "request {} sample {}: block {block}, about to be given back, is held by {held} \
                 live sequences and {flying} steps in flight but the pool counts {counted} \
                 references",
                w.request, w.sample
            ));
        }
        let which = if entry == usize::MAX {
            "retired by a copy-on-write".to_string()
        } else {
            format!("table entry {entry}")
        };
        Err(format!(
            "request {} sample {}: block {block} ({which}), about to be given back, is held by \
             {held} live sequences but the pool counts {counted} references",
            w.request, w.sample
        ))
    }

    /// References to `block` retired under fences not completed yet.
    fn flying(&self, block: usize) -> usize {
        // Relaxed: see the module's orderings.
        self.in_flight
            .get(block)
            .map_or(0, |f| f.load(Ordering::Relaxed) as usize)
    }

    fn lower(&self, block: usize) {
        // A block past the pool was never counted (see `after_call`).
        if let Some(h) = self.holders.get(block) {
            // Relaxed: see the module's orderings.
            let _ = h.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// Takes in the table of `seq` after an allocator call that may have
    /// added blocks (an append, a reservation, a fork), from entry `from`
    /// on (an append changes nothing before the block its first token goes
    /// into, `len / block_size`; [`same_table`](Self::same_table) checks
    /// that): an entry the call replaced must be the source of the copy it
    /// returned, and every block the table gained must be counted by the
    /// pool exactly as many times as live tables hold it.
    pub fn after_call<B: KvBackend>(
        &self,
        backend: &B,
        t: &mut Tracked<B::Id>,
        seq: &B::Seq,
        from: usize,
        copy: Option<BlockCopy<B::Id>>,
    ) -> Result<(), String> {
        let new = seq.table(t.group);
        let w = &t.writer;
        // Entries before `from` are compared once, by `same_table`, before
        // the sequence is dropped (comparing them at every call would cost
        // a decode step the whole table).
        let from = from.min(t.table.len()).min(new.len());
        // The shadow follows the table whatever is wrong with it, so that
        // the blocks are counted out again when the sequence goes.
        let mut first = Ok(());
        for i in from..t.table.len() {
            let old = t.table[i];
            if new.get(i) == Some(&old) {
                continue;
            }
            match copy {
                Some(c) if c.src == old => t.retired = Some(old),
                _ => {
                    self.lower(B::Seq::index(old));
                    if first.is_ok() {
                        first = Err(format!(
                            "request {} sample {}: table entry {i} (block {}) changed without a copy",
                            w.request,
                            w.sample,
                            B::Seq::index(old)
                        ));
                    }
                }
            }
        }
        for (i, &id) in new.iter().enumerate().skip(from) {
            if t.table.get(i) == Some(&id) || B::Seq::is_null(id) {
                continue;
            }
            let block = B::Seq::index(id);
            let Some(h) = self.holders.get(block) else {
                if first.is_ok() {
                    first = Err(format!(
                        "request {} sample {}: table entry {i} is block {block}, past the pool",
                        w.request, w.sample
                    ));
                }
                continue;
            };
            // Relaxed: see the module's orderings.
            let held = h.fetch_add(1, Ordering::Relaxed) as usize + 1;
            let flying = self.flying(block);
            let counted = backend.ref_count(block).unwrap_or(0);
            // An entry shared with other workers' sequences (matched or
            // published), whose calls and shadow updates interleave with
            // this one: the pool must count it as held, the exact count
            // waits for the sweep.
            let wrong = if i < t.shared {
                counted == 0
            } else {
                held + flying != counted
            };
            if wrong && flying > 0 && first.is_ok() {
                first = Err(format!(
                    "request {} sample {}: block {block} (table entry {i}) is handed out while \
                     {flying} steps in flight still read it: {held} live sequences and the steps \
                     hold it, but the pool counts {counted} references",
                    w.request, w.sample
                ));
            }
            if wrong && first.is_ok() {
                first = Err(format!(
                    "request {} sample {}: block {block} (table entry {i}) is held by {held} live \
                     sequences but the pool counts {counted} references",
                    w.request, w.sample
                ));
            }
        }
        t.table.truncate(from);
        t.table.extend_from_slice(&new[from..]);
        first
    }

    /// Checks that the sequence's table is the one the shadow counts.
    pub fn same_table<S: KvSeq>(&self, t: &Tracked<S::Id>, seq: &S) -> Result<(), String> {
        if seq.table(t.group) == t.table() {
            return Ok(());
        }
        Err(format!(
            "request {} sample {} group {}: the table holds {:?}, the calls made it {:?}",
            t.writer.request,
            t.writer.sample,
            t.group,
            seq.table(t.group),
            t.table()
        ))
    }

    /// Checks and lowers the shadow for the blocks a sliding window is
    /// about to give back in an append (table entries from the first one
    /// still held up to `upto`), and returns how many. Call it before the
    /// append; then [`window_gone`](Self::window_gone) once it succeeded,
    /// or [`keep_window`](Self::keep_window) if it was refused.
    pub fn before_window<B: KvBackend>(
        &self,
        backend: &B,
        t: &mut Tracked<B::Id>,
        upto: usize,
    ) -> (usize, Result<(), String>) {
        t.leaving.clear();
        let upto = upto.min(t.table.len());
        let from = t.null_entries(B::Seq::is_null).min(upto);
        let mut first = Ok(());
        for i in from..upto {
            let id = t.table[i];
            let block = B::Seq::index(id);
            let shared = i < t.shared;
            let checked = self.check_and_lower(backend, &t.writer, block, i, shared);
            if first.is_ok() {
                first = checked;
            }
            t.leaving.push((i, id));
        }
        (t.leaving.len(), first)
    }

    /// After an append that succeeded: the entries
    /// [`before_window`](Self::before_window) counted out must be null in
    /// the sequence's table, as they become in the shadow's; with
    /// `fenced`, the step's list, their references are in flight under
    /// the step's fence.
    pub fn window_gone<S: KvSeq>(
        &self,
        t: &mut Tracked<S::Id>,
        seq: &S,
        mut fenced: Option<&mut Vec<FencedRef>>,
    ) -> Result<(), String> {
        let new = seq.table(t.group);
        let mut first = Ok(());
        for &(i, id) in &t.leaving {
            if let Some(list) = fenced.as_deref_mut() {
                self.fly(S::index(id), i < t.shared, list);
            }
            match new.get(i) {
                Some(&now) if S::is_null(now) => t.table[i] = now,
                _ => {
                    if first.is_ok() {
                        first = Err(format!(
                            "request {} sample {} group {}: table entry {i} (block {}) left the \
                             window but the table still holds {:?}",
                            t.writer.request,
                            t.writer.sample,
                            t.group,
                            S::index(id),
                            new.get(i)
                        ));
                    }
                }
            }
        }
        t.leaving.clear();
        first
    }

    /// Undoes [`before_window`](Self::before_window) after the append was
    /// refused (a refused append gives nothing back): the shadow's counts
    /// come back.
    pub fn keep_window<S: KvSeq>(&self, t: &mut Tracked<S::Id>) {
        for &(_, id) in &t.leaving {
            if let Some(h) = self.holders.get(S::index(id)) {
                // Relaxed: see the module's orderings.
                h.fetch_add(1, Ordering::Relaxed);
            }
        }
        t.leaving.clear();
    }

    /// Checks that the table holds exactly `want` blocks.
    pub fn expect_blocks<Id>(
        &self,
        t: &Tracked<Id>,
        want: usize,
        what: &str,
    ) -> Result<(), String> {
        if t.table.len() == want {
            return Ok(());
        }
        Err(format!(
            "request {} sample {}: after {what} the table holds {} blocks, its length needs {want}",
            t.writer.request,
            t.writer.sample,
            t.table.len()
        ))
    }

    /// Makes a device copy: the first `tokens` stamps of `src` into `dst`.
    pub fn copy<S: KvSeq>(&self, c: BlockCopy<S::Id>) -> Result<(), String> {
        let bs = self.block_size;
        let (src, dst) = (S::index(c.src) * bs, S::index(c.dst) * bs);
        if c.tokens > bs || dst + bs > self.stamps.len() || src + bs > self.stamps.len() {
            return Err(format!("a block copy out of the pool: {c:?}"));
        }
        for k in 0..c.tokens {
            // Relaxed: see the module's orderings.
            let v = self.stamps[src + k].load(Ordering::Relaxed);
            self.stamps[dst + k].store(v, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Writes the stamps of `positions` through `slots`, the slot mapping
    /// the allocator returned for them: each slot must be the one the
    /// table gives the position, in a block no other live table holds.
    pub fn write<S: KvSeq>(
        &self,
        t: &Tracked<S::Id>,
        positions: Range<usize>,
        slots: &[usize],
    ) -> Result<(), String> {
        let w = &t.writer;
        if slots.len() != positions.len() {
            return Err(format!(
                "request {} sample {}: {} slots mapped for {} positions",
                w.request,
                w.sample,
                slots.len(),
                positions.len()
            ));
        }
        let start = positions.start;
        self.by_block::<S>(t, positions, |block, base, first, run| {
            // Relaxed: see the module's orderings.
            let holders = self.holders[block].load(Ordering::Relaxed);
            let flying = self.flying(block);
            if flying > 0 {
                return Err(format!(
                    "request {} sample {} position {first}: writes into block {block}, which \
                     {flying} steps in flight still read",
                    w.request, w.sample
                ));
            }
            if holders != 1 {
                return Err(format!(
                    "request {} sample {} position {first}: writes into block {block}, which \
                     {holders} live sequences hold (a slot reachable from two writers)",
                    w.request, w.sample
                ));
            }
            let mapped = &slots[first - start..first - start + run];
            let stamps = &self.stamps[base..base + run];
            for (k, (&slot, stamp)) in mapped.iter().zip(stamps).enumerate() {
                if slot != base + k {
                    let pos = first + k;
                    return Err(format!(
                        "request {} sample {} position {pos}: mapped to slot {slot} (block {}), \
                         but its table entry is block {block}",
                        w.request,
                        w.sample,
                        slot / self.block_size
                    ));
                }
                // Relaxed: see the module's orderings.
                stamp.store(t.stamp(first + k), Ordering::Relaxed);
            }
            Ok(())
        })
    }

    /// Reads `positions` back through the table, as attention does: each
    /// must hold the stamp this sequence wrote.
    pub fn read<S: KvSeq>(
        &self,
        t: &Tracked<S::Id>,
        positions: Range<usize>,
    ) -> Result<(), String> {
        let w = &t.writer;
        self.by_block::<S>(t, positions, |block, base, first, run| {
            for (k, stamp) in self.stamps[base..base + run].iter().enumerate() {
                // Relaxed: see the module's orderings.
                let found = stamp.load(Ordering::Relaxed);
                if found != t.stamp(first + k) {
                    return Err(format!(
                        "request {} sample {} position {}: block {block} holds {}",
                        w.request,
                        w.sample,
                        first + k,
                        Stamp::describe(found)
                    ));
                }
            }
            Ok(())
        })
    }

    /// Calls `f(block, first slot, first position, positions)` for each
    /// run of `positions` in one block of the table.
    fn by_block<S: KvSeq>(
        &self,
        t: &Tracked<S::Id>,
        positions: Range<usize>,
        mut f: impl FnMut(usize, usize, usize, usize) -> Result<(), String>,
    ) -> Result<(), String> {
        let bs = self.block_size;
        let mut pos = positions.start;
        while pos < positions.end {
            let (entry, offset) = (pos / bs, pos % bs);
            let Some(&id) = t.table.get(entry).filter(|&&id| !S::is_null(id)) else {
                return Err(format!(
                    "request {} sample {} group {} position {pos}: no block in the table",
                    t.writer.request, t.writer.sample, t.group
                ));
            };
            let block = S::index(id);
            if block >= self.holders.len() {
                return Err(format!(
                    "request {} sample {} position {pos}: table entry {entry} is block {block}, \
                     past the pool",
                    t.writer.request, t.writer.sample
                ));
            }
            let run = (bs - offset).min(positions.end - pos);
            f(block, block * bs + offset, pos, run)?;
            pos += run;
        }
        Ok(())
    }

    /// After the run: no block is held by a live table and the pool counts
    /// no reference; the first few that disagree, named.
    pub fn sweep<B: KvBackend>(&self, backend: &B) -> Vec<String> {
        let mut out = Vec::new();
        for (block, h) in self.holders.iter().enumerate() {
            // Relaxed: every worker has finished.
            let held = h.load(Ordering::Relaxed);
            let flying = self.flying(block);
            let counted = backend.ref_count(block).unwrap_or(0);
            if held != 0 || flying != 0 || counted != 0 {
                let steps = if flying == 0 {
                    String::new()
                } else {
                    format!(" and {flying} steps in flight")
                };
                out.push(format!(
                    "after the run block {block} is held by {held} sequences{steps}, the pool \
                     counts {counted} references"
                ));
                if out.len() == 4 {
                    break;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip_and_zero_is_unwritten() {
        let s = Stamp {
            request: 12345,
            group: 6,
            sample: 3,
            attempt: 2,
            position: 4095,
        };
        assert_eq!(Stamp::unpack(s.pack()), Some(s));
        assert_eq!(Stamp::unpack(0), None);
        let w = Writer {
            request: 7,
            sample: 2,
            attempt: 0,
            fork_len: 10,
        };
        assert_eq!(Stamp::unpack(w.stamp(0, 9)).unwrap().sample, 0);
        assert_eq!(Stamp::unpack(w.stamp(0, 10)).unwrap().sample, 2);
        // The group tells stamps apart: a slot written through another
        // group's table reads back wrong.
        assert_ne!(w.stamp(1, 10), w.stamp(0, 10));
        assert_eq!(Stamp::unpack(w.stamp(3, 10)).unwrap().group, 3);
        assert_ne!(Stamp::content(5, 0, 10), Stamp::content(5, 1, 10));
        assert!(Stamp::describe(w.stamp(3, 10)).contains("request 7 group 3 sample 2"));
        assert!(Stamp::describe(Stamp::content(5, 2, 10)).contains("group 2 position 10"));
    }

    use crate::backend::{KvBackend, KvslotsBackend};

    fn writer(request: usize) -> Writer {
        Writer {
            request,
            sample: 0,
            attempt: 0,
            fork_len: 0,
        }
    }

    /// Two sequences written through one slot: the first one's read names
    /// its request, position and block; a mapping off its table and a block
    /// the pool does not count as the shadow does are refused too.
    #[test]
    fn a_stamp_overwritten_by_another_sequence_is_named() {
        let b = KvslotsBackend::new(4, 4);
        let o = Oracle::new(4, 4);
        let mut seq = b.new_seq(8);
        seq.try_append(6).unwrap();
        let mut t = Tracked::new(writer(7));
        o.after_call(&b, &mut t, &seq, 0, None).unwrap();
        let mut slots = Vec::new();
        seq.extend_slots(0..6, &mut slots).unwrap();
        o.write::<kvslots::Sequence>(&t, 0..6, &slots).unwrap();
        o.read::<kvslots::Sequence>(&t, 0..6).unwrap();
        // Another request writes position 5's slot.
        let other = Tracked {
            table: t.table.clone(),
            ..Tracked::new(writer(9))
        };
        o.stamps[slots[5]].store(other.writer.stamp(0, 5), Ordering::Relaxed);
        let block = t.table[1].index();
        let err = o.read::<kvslots::Sequence>(&t, 0..6).unwrap_err();
        assert!(err.contains("request 7 sample 0 position 5"), "{err}");
        assert!(
            err.contains(&format!("block {block} holds the stamp of request 9")),
            "{err}"
        );
        // A slot of a block the table does not give the position.
        let mut wrong = slots.clone();
        wrong[5] = (block + 1) % 4 * 4 + 1;
        let err = o.write::<kvslots::Sequence>(&t, 0..6, &wrong).unwrap_err();
        assert!(err.contains("position 5: mapped to slot"), "{err}");
        // A table holding a block twice over: the shadow says 2, the pool 1.
        let mut twice = Tracked::new(writer(8));
        let err = o.after_call(&b, &mut twice, &seq, 0, None).unwrap_err();
        assert!(
            err.contains("held by 2 live sequences but the pool counts 1"),
            "{err}"
        );
        let err = o.before_release(&b, &mut twice, 0).unwrap_err();
        assert!(err.contains("about to be given back"), "{err}");
        o.before_release(&b, &mut t, 0).unwrap();
        drop(seq);
        assert!(o.sweep(&b).is_empty());
    }

    /// A block handed to a sequence on one worker while a sequence on
    /// another is giving it back, with the hand-out's check landing between
    /// the giver's shadow and the pool's count going down: the hand-out
    /// reads 1 and 1, the end-of-run sweep 0 and 0, and only the give-back
    /// check of the new holder sees the shadow count it held while the
    /// pool counts it free.
    #[test]
    fn a_block_handed_out_while_given_back_is_caught_at_its_give_back() {
        let b = KvslotsBackend::new(4, 4);
        let o = Oracle::new(4, 4);
        let mut giver = b.new_seq(4);
        giver.try_append(4).unwrap();
        let mut t = Tracked::new(writer(3));
        o.after_call(&b, &mut t, &giver, 0, None).unwrap();
        let block = t.table[0].index();
        // The giver's shadow goes down (both sides count 1, the check
        // passes)...
        o.before_release(&b, &mut t, 0).unwrap();
        // ...the broken pool hands the block to another sequence before it
        // counts the giver's reference out: the hand-out's check sees 1
        // and 1...
        let mut taker = Tracked::new(writer(5));
        o.after_call(&b, &mut taker, &giver, 0, None).unwrap();
        // ...then the giver's reference goes.
        drop(giver);
        assert_eq!(b.ref_count(block), Some(0));
        let err = o.before_release(&b, &mut taker, 0).unwrap_err();
        assert!(
            err.contains(&format!(
                "request 5 sample 0: block {block} (table entry 0), about to be given back, is \
                 held by 1 live sequences but the pool counts 0 references"
            )),
            "{err}"
        );
        // Nothing else would have told.
        assert!(o.sweep(&b).is_empty());
    }

    /// Blocks a fork shares, and the source a copy-on-write retired, pass
    /// the give-back check on their last holder and on every earlier one;
    /// a refused call's retired block is counted in again.
    #[test]
    fn shared_and_retired_blocks_pass_the_give_back_check() {
        let b = KvslotsBackend::new(8, 4);
        let o = Oracle::new(8, 4);
        let mut parent = b.new_seq(16);
        parent.try_append(8).unwrap();
        let mut pt = Tracked::new(writer(1));
        o.after_call(&b, &mut pt, &parent, 0, None).unwrap();
        let mut copies = Vec::new();
        let mut child = KvSeq::try_fork(&parent, &mut copies).unwrap();
        assert!(copies.is_empty());
        let mut ct = Tracked {
            writer: Writer {
                sample: 1,
                fork_len: 8,
                ..writer(1)
            },
            ..Tracked::new(writer(1))
        };
        o.after_call(&b, &mut ct, &child, 0, None).unwrap();
        // The child rolls back into the shared second block, then appends:
        // a copy-on-write retires it.
        o.before_release(&b, &mut ct, 2).unwrap();
        KvSeq::truncate(&mut child, 6);
        let shared = ct.table[1];
        KvSeq::try_append(&mut child, 1, None, &mut copies).unwrap();
        let (group, c) = copies[0];
        assert_eq!((group, c.src), (0, shared));
        o.after_call(&b, &mut ct, &child, 1, Some(c)).unwrap();
        assert_eq!(ct.retired, Some(shared));
        // A refused append gives nothing back: the shadow counts it again.
        let retired = o.release_retired(&b, &mut ct).unwrap();
        assert_eq!(retired, Some(shared));
        assert!(KvSeq::try_append(&mut child, 100, None, &mut copies).is_err());
        o.keep_retired::<kvslots::Sequence>(&mut ct, retired);
        assert_eq!(o.holders[shared.index()].load(Ordering::Relaxed), 2);
        o.before_release(&b, &mut ct, 0).unwrap();
        drop(child);
        o.before_release(&b, &mut pt, 0).unwrap();
        drop(parent);
        assert!(o.sweep(&b).is_empty());
    }
    /// Fenced give-backs: blocks retired under a fence stay counted in
    /// flight; the pool's count passes every check while the fence is
    /// pending; a block released early is caught before its fence
    /// completes, and so is a hand-out of it while the step is in flight.
    #[test]
    fn a_block_released_before_its_fence_completes_is_caught() {
        let b = KvslotsBackend::new(4, 4);
        let o = Oracle::new(4, 4);
        // A correct fenced truncate: two blocks retired under fence 7.
        let mut seq = b.new_seq(12);
        seq.try_append(12).unwrap();
        let mut t = Tracked::new(writer(1));
        o.after_call(&b, &mut t, &seq, 0, None).unwrap();
        let mut fenced = Vec::new();
        o.give_back_fenced(&b, &mut t, 1, &mut fenced).unwrap();
        KvSeq::truncate_fenced(&mut seq, 4, 7);
        assert_eq!(fenced.len(), 2);
        assert!(fenced.iter().all(|r| !r.shared));
        o.before_complete(&b, 7, &fenced).unwrap();
        assert_eq!(b.complete(7), 2);
        // Released early: the same truncate given back at once.
        seq.try_append(8).unwrap();
        o.after_call(&b, &mut t, &seq, 1, None).unwrap();
        let mut fenced = Vec::new();
        o.give_back_fenced(&b, &mut t, 1, &mut fenced).unwrap();
        KvSeq::truncate(&mut seq, 4);
        // Another sequence is handed one of them while the step reads it.
        let mut other = b.new_seq(4);
        other.try_append(4).unwrap();
        let mut ot = Tracked::new(writer(2));
        let err = o.after_call(&b, &mut ot, &other, 0, None).unwrap_err();
        assert!(err.contains("steps in flight still read it"), "{err}");
        let mut slots = Vec::new();
        other.extend_slots(0..4, &mut slots).unwrap();
        let err = o.write::<kvslots::Sequence>(&ot, 0..4, &slots).unwrap_err();
        assert!(err.contains("which 1 steps in flight still read"), "{err}");
        let err = o.before_complete(&b, 8, &fenced).unwrap_err();
        assert!(
            err.contains("was given back before the step completed"),
            "{err}"
        );
        o.before_release(&b, &mut ot, 0).unwrap();
        drop(other);
        o.before_release(&b, &mut t, 0).unwrap();
        drop(seq);
        assert!(o.sweep(&b).is_empty());
    }
}
