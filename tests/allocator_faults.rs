//! A sequence over an allocator that panics, or that breaks the
//! `BlockAllocator` contract, loses no block and gives none back twice.
//!
//! `Ledger` keeps its own books (a count for each block, the blocks each
//! fence holds) and one fault at a time: a method that unwinds after doing
//! its work, which the trait allows, or an answer the contract forbids (an
//! allocation that appends too few or too many ids, a `needs_copy` that
//! turns from false to true), which a sequence turns into a panic before it
//! changes. Each test checks the books once everything is dropped and
//! every fence completed: no reference left, none dropped twice.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvslots::{
    BlockAllocator, BlockId, HybridSequence, KvGroup, KvGroups, ReserveError, Sequence,
    SequenceCall,
};

/// What `Ledger` panics with.
const LEDGER_PANIC: &str = "an allocator that panics (tests/allocator_faults.rs)";

/// One fault, armed until it fires.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Fault {
    None,
    /// `retire` records the ids under their fence, then panics.
    RetireThenPanic,
    /// The `n`-th call of `needs_copy` from now panics.
    NeedsCopyPanicAt(usize),
    /// An allocation appends its ids, then panics.
    AllocThenPanic,
    /// An allocation appends one id fewer than asked and succeeds.
    AllocShort,
    /// An allocation appends one id more than asked and succeeds.
    AllocLong,
    /// An allocation appends one id and fails.
    AllocFailsWithOne,
    /// `needs_copy` says false at its first call from now, true after.
    NeedsCopyTurnsTrue,
    /// `add_refs` says it shared one block more than it was given.
    AddRefsLies,
    /// `block_size` panics at every call.
    BlockSizePanics,
    /// `release` drops the references, then panics.
    ReleaseThenPanic,
}

#[derive(Default)]
struct Books {
    refs: Vec<u32>,
    free: Vec<u32>,
    fenced: HashMap<u64, Vec<BlockId>>,
    double_releases: Vec<BlockId>,
    needs_copy_calls: usize,
}

/// An allocator that keeps its own books, and one fault.
struct Ledger {
    num_blocks: usize,
    books: Mutex<Books>,
    fault: Mutex<Fault>,
}

impl Ledger {
    fn new(num_blocks: usize) -> Arc<Ledger> {
        let books = Books {
            refs: vec![0; num_blocks],
            free: (0..num_blocks as u32).rev().collect(),
            ..Books::default()
        };
        Arc::new(Ledger {
            num_blocks,
            books: Mutex::new(books),
            fault: Mutex::new(Fault::None),
        })
    }

    fn arm(&self, fault: Fault) {
        self.books.lock().unwrap().needs_copy_calls = 0;
        *self.fault.lock().unwrap() = fault;
    }

    fn fault(&self) -> Fault {
        *self.fault.lock().unwrap()
    }

    /// Disarms the fault and panics.
    fn fire(&self) -> ! {
        self.arm(Fault::None);
        panic!("{LEDGER_PANIC}");
    }

    fn drop_refs(&self, ids: &[BlockId]) {
        let mut books = self.books.lock().unwrap();
        for &id in ids {
            let count = &mut books.refs[id.index()];
            if *count == 0 {
                books.double_releases.push(id);
                continue;
            }
            *count -= 1;
            if *count == 0 {
                books.free.push(id.index() as u32);
            }
        }
    }

    /// The blocks that hold a reference.
    fn held(&self) -> usize {
        self.books
            .lock()
            .unwrap()
            .refs
            .iter()
            .filter(|&&c| c > 0)
            .count()
    }

    /// Completes every fence, then checks that no reference is left and
    /// none was dropped twice.
    fn assert_whole(&self) {
        let fenced: Vec<Vec<BlockId>> = self
            .books
            .lock()
            .unwrap()
            .fenced
            .drain()
            .map(|(_, ids)| ids)
            .collect();
        for ids in &fenced {
            self.drop_refs(ids);
        }
        let books = self.books.lock().unwrap();
        let held: Vec<usize> = (0..self.num_blocks)
            .filter(|&i| books.refs[i] > 0)
            .collect();
        assert!(
            books.double_releases.is_empty() && held.is_empty(),
            "released twice: {:?}; still held: {held:?}",
            books.double_releases
        );
    }
}

impl BlockAllocator for Ledger {
    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn block_size(&self) -> usize {
        if self.fault() == Fault::BlockSizePanics {
            panic!("{LEDGER_PANIC}");
        }
        4
    }

    fn try_alloc_with_headroom(
        &self,
        _: &SequenceCall<'_>,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
    ) -> Result<(), ReserveError> {
        let fault = self.fault();
        let taken = match fault {
            Fault::AllocShort => n - 1,
            Fault::AllocLong => n + 1,
            _ => n,
        };
        {
            let mut books = self.books.lock().unwrap();
            let available = books.free.len();
            if n + headroom > available {
                return Err(ReserveError::Full {
                    requested: n,
                    available,
                });
            }
            if fault == Fault::AllocFailsWithOne {
                // An id it does not take.
                out.push(BlockId::new(*books.free.last().unwrap()));
            } else {
                for _ in 0..taken {
                    let id = books.free.pop().unwrap();
                    books.refs[id as usize] = 1;
                    out.push(BlockId::new(id));
                }
            }
        }
        match fault {
            Fault::AllocThenPanic => self.fire(),
            Fault::AllocShort | Fault::AllocLong => self.arm(Fault::None),
            Fault::AllocFailsWithOne => {
                self.arm(Fault::None);
                return Err(ReserveError::Full {
                    requested: n,
                    available: 0,
                });
            }
            _ => {}
        }
        Ok(())
    }

    fn alloc_with_headroom_blocking(
        &self,
        by: &SequenceCall<'_>,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
        _: Option<Duration>,
    ) -> Result<(), ReserveError> {
        self.try_alloc_with_headroom(by, n, headroom, out)
    }

    fn add_refs(&self, _: &SequenceCall<'_>, ids: &[BlockId]) -> usize {
        let mut books = self.books.lock().unwrap();
        for (k, id) in ids.iter().enumerate() {
            if books.refs[id.index()] == 0 {
                return k;
            }
            books.refs[id.index()] += 1;
        }
        drop(books);
        if self.fault() == Fault::AddRefsLies {
            self.arm(Fault::None);
            return ids.len() + 1;
        }
        ids.len()
    }

    fn release(&self, _: &SequenceCall<'_>, ids: &[BlockId]) {
        self.drop_refs(ids);
        if self.fault() == Fault::ReleaseThenPanic {
            self.fire();
        }
    }

    fn needs_copy(&self, id: BlockId) -> bool {
        let call = {
            let mut books = self.books.lock().unwrap();
            books.needs_copy_calls += 1;
            books.needs_copy_calls
        };
        match self.fault() {
            Fault::NeedsCopyPanicAt(n) if n == call => self.fire(),
            Fault::NeedsCopyTurnsTrue if call > 1 => return true,
            _ => {}
        }
        self.books.lock().unwrap().refs[id.index()] > 1
    }

    fn retire(&self, _: &SequenceCall<'_>, fence: u64, ids: &[BlockId]) -> usize {
        self.books
            .lock()
            .unwrap()
            .fenced
            .entry(fence)
            .or_default()
            .extend_from_slice(ids);
        if self.fault() == Fault::RetireThenPanic {
            self.fire();
        }
        ids.len()
    }
}

thread_local! {
    /// Whether this thread is inside `panic_of`, whose panics are expected.
    static EXPECTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Keeps the default hook from printing the panics `panic_of` expects;
/// every other panic (a failed assertion) prints as usual.
fn quiet() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !EXPECTED.with(|expected| expected.get()) {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, which must unwind, and returns its panic's message.
fn panic_of(f: impl FnOnce()) -> String {
    quiet();
    EXPECTED.with(|expected| expected.set(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    EXPECTED.with(|expected| expected.set(false));
    let payload = result.expect_err("the call unwinds");
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// A fenced truncate whose `retire` unwinds once it has the blocks: the
/// table is cut all the same, so the drop does not give them back again.
#[test]
fn a_fenced_truncate_whose_retire_unwinds_cuts_the_table() {
    let pool = Ledger::new(8);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(12).unwrap();
    pool.arm(Fault::RetireThenPanic);
    assert_eq!(
        panic_of(|| {
            let _ = seq.truncate_fenced(4, 7);
        }),
        LEDGER_PANIC
    );
    assert_eq!((seq.len(), seq.blocks().len()), (4, 1));
    drop(seq);
    pool.assert_whole();
}

/// The same through a hybrid sequence's fenced truncate.
#[test]
fn a_hybrid_fenced_truncate_whose_retire_unwinds_cuts_every_table() {
    let pool = Ledger::new(8);
    let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    seq.try_append(8).unwrap();
    pool.arm(Fault::RetireThenPanic);
    let message = panic_of(|| {
        let _ = seq.truncate_fenced(4, 7);
    });
    assert_eq!(message, LEDGER_PANIC);
    assert_eq!(seq.len(), 4);
    drop(seq);
    pool.assert_whole();
}

/// A `needs_copy` that unwinds while a sliding window's blocks are being
/// recycled into an append: the append is undone with the allocator's
/// panic, and every block is given back once.
#[test]
fn a_window_recycle_whose_needs_copy_unwinds_undoes_the_append() {
    for at in 1..=4 {
        let pool = Ledger::new(8);
        let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 4 }]).unwrap();
        let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
        seq.try_append(12).unwrap();
        // Appending 8 needs 2 blocks; blocks 0 and 1 leave the window and
        // can be reused. The plan asks `needs_copy` of each (calls 1 and
        // 2), the window's recycling again (3 and 4).
        pool.arm(Fault::NeedsCopyPanicAt(at));
        assert_eq!(
            panic_of(|| drop(seq.try_append(8))),
            LEDGER_PANIC,
            "call {at}"
        );
        assert_eq!(seq.len(), 12, "call {at}");
        // The sequence works on.
        assert_eq!(seq.try_append(8).unwrap(), 12..20, "call {at}");
        drop(seq);
        pool.assert_whole();
    }
}

/// The same with two windows: a `needs_copy` that unwinds in the first
/// window's picking, before it picks any block, while the second window
/// could fill the plan alone, still undoes the append.
#[test]
fn a_needs_copy_that_unwinds_in_one_of_two_windows_undoes_the_append() {
    // The plan asks `needs_copy` of both windows' two leaving blocks
    // (calls 1 to 4), the first window's picking of its two (5 and 6);
    // the second window then has nothing left to pick.
    for at in 1..=6 {
        let pool = Ledger::new(16);
        let window = KvGroup::SlidingWindow { window_tokens: 4 };
        let groups = KvGroups::new([window, window]).unwrap();
        let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
        seq.try_append(12).unwrap();
        let before = [
            seq.blocks(0).unwrap().to_vec(),
            seq.blocks(1).unwrap().to_vec(),
        ];
        pool.arm(Fault::NeedsCopyPanicAt(at));
        assert_eq!(
            panic_of(|| drop(seq.try_append(4))),
            LEDGER_PANIC,
            "call {at}"
        );
        assert_eq!(seq.len(), 12, "call {at}");
        // A window is either as it was or moved on (its blocks before the
        // old length's window given back): never holding another's block.
        for (g, was) in before.iter().enumerate() {
            let now = seq.blocks(g).unwrap();
            assert_eq!(now.len(), was.len(), "call {at}, group {g}");
            for (i, (&a, &b)) in now.iter().zip(was).enumerate() {
                assert!(
                    a == b || a == BlockId::NULL,
                    "call {at}, group {g}, entry {i}"
                );
            }
        }
        assert_eq!(seq.try_append(4).unwrap(), 12..16, "call {at}");
        drop(seq);
        pool.assert_whole();
    }
}

/// Blocks an allocation appended before it unwound are given back by the
/// hybrid sequence's next call, or by its drop or retire.
#[test]
fn blocks_a_panic_left_in_a_hybrid_sequence_are_given_back() {
    let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    type Next = fn(&mut HybridSequence<Ledger>);
    let next: [(&str, Next); 4] = [
        ("try_append", |seq| {
            seq.try_append(4).unwrap();
        }),
        ("try_reserve", |seq| seq.try_reserve(4, 0).unwrap()),
        ("reserve_blocking", |seq| {
            seq.reserve_blocking(4, 0, None).unwrap()
        }),
        ("nothing", |_| {}),
    ];
    for (name, call) in next {
        for retire in [false, true] {
            let pool = Ledger::new(8);
            let mut seq = HybridSequence::new(Arc::clone(&pool), groups.clone());
            pool.arm(Fault::AllocThenPanic);
            assert_eq!(panic_of(|| drop(seq.try_append(4))), LEDGER_PANIC);
            assert_eq!(seq.len(), 0);
            call(&mut seq);
            if name != "nothing" {
                // The next call's 2 blocks, and none of the 2 left over.
                assert_eq!(pool.held(), 2, "{name}");
            }
            if retire {
                seq.retire(3);
            } else {
                drop(seq);
            }
            pool.assert_whole();
        }
    }
}

/// An allocation that succeeds with too few or too many ids, or fails with
/// some, is a breach: the sequence panics before it changes, and gives
/// back the ids of a success.
#[test]
fn an_allocation_not_all_or_nothing_panics_and_changes_nothing() {
    for fault in [
        Fault::AllocShort,
        Fault::AllocLong,
        Fault::AllocFailsWithOne,
    ] {
        // A sequence's append, reserve, blocking reserve and fork.
        let pool = Ledger::new(8);
        let mut seq = Sequence::new(Arc::clone(&pool));
        type Call = fn(&mut Sequence<Ledger>);
        let calls: [Call; 3] = [
            |seq| drop(seq.try_append(8)),
            |seq| {
                let _ = seq.try_reserve(8, 0);
            },
            |seq| {
                let _ = seq.reserve_blocking(8, 0, None);
            },
        ];
        for call in calls {
            pool.arm(fault);
            let message = panic_of(|| call(&mut seq));
            assert!(message.contains("broke all or nothing"), "{message}");
            assert_eq!((seq.len(), seq.blocks().len()), (0, 0), "{fault:?}");
            assert_eq!(pool.held(), 0, "{fault:?}");
        }
        seq.try_append(2).unwrap();
        pool.arm(fault);
        let message = panic_of(|| drop(seq.try_fork()));
        assert!(message.contains("broke all or nothing"), "{message}");
        assert_eq!((seq.len(), seq.blocks().len(), pool.held()), (2, 1, 1));
        drop(seq);
        pool.assert_whole();

        // A hybrid sequence's append, reserve, blocking reserve and fork.
        let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
        let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
        type HybridCall = fn(&mut HybridSequence<Ledger>);
        let calls: [HybridCall; 3] = [
            |seq| drop(seq.try_append(8)),
            |seq| {
                let _ = seq.try_reserve(8, 0);
            },
            |seq| {
                let _ = seq.reserve_blocking(8, 0, None);
            },
        ];
        for call in calls {
            pool.arm(fault);
            let message = panic_of(|| call(&mut seq));
            assert!(message.contains("broke all or nothing"), "{message}");
            assert_eq!((seq.len(), seq.capacity()), (0, 0), "{fault:?}");
            assert_eq!(pool.held(), 0, "{fault:?}");
        }
        seq.try_append(2).unwrap();
        pool.arm(fault);
        let message = panic_of(|| drop(seq.try_fork(&mut Vec::new())));
        assert!(message.contains("broke all or nothing"), "{message}");
        assert_eq!((seq.len(), pool.held()), (2, 2));
        drop(seq);
        pool.assert_whole();
    }
}

/// A copy-on-write append whose allocation comes back short keeps the
/// shared tail in its table.
#[test]
fn a_short_allocation_for_a_copy_keeps_the_shared_tail() {
    let pool = Ledger::new(8);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(4).unwrap();
    let (child, _) = seq.try_fork().unwrap();
    seq.truncate(2);
    let tail = seq.blocks()[0];
    pool.arm(Fault::AllocShort);
    let message = panic_of(|| drop(seq.try_append_cow(1)));
    assert!(message.contains("broke all or nothing"), "{message}");
    assert_eq!((seq.len(), seq.blocks()), (2, &[tail][..]));
    // The append works once the allocator does.
    let (range, copy) = seq.try_append_cow(1).unwrap();
    assert_eq!((range, copy.map(|c| c.src)), (2..3, Some(tail)));
    drop((seq, child));
    pool.assert_whole();
}

/// `try_append` asks `needs_copy` once: the answer it checks is the one it
/// follows, so a tail it writes in place is one the allocator said needs
/// no copy.
#[test]
fn try_append_follows_the_needs_copy_answer_it_checked() {
    let pool = Ledger::new(8);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(4).unwrap();
    seq.truncate(2);
    let tail = seq.blocks()[0];
    pool.arm(Fault::NeedsCopyTurnsTrue);
    assert_eq!(seq.try_append(1), Ok(2..3));
    assert_eq!(seq.blocks(), &[tail][..]);
    assert_eq!(pool.books.lock().unwrap().needs_copy_calls, 1);
    drop(seq);
    pool.assert_whole();
}

/// A hybrid window's recycling that finds fewer blocks than the plan
/// counted (a `needs_copy` that turned from false to true) undoes the
/// append and names the breach.
#[test]
fn a_window_recycle_short_of_the_plan_undoes_the_append() {
    let pool = Ledger::new(8);
    let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 4 }]).unwrap();
    let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    seq.try_append(12).unwrap();
    pool.arm(Fault::NeedsCopyTurnsTrue);
    let message = panic_of(|| drop(seq.try_append(8)));
    assert!(
        message.contains("needs_copy turned from false to true"),
        "{message}"
    );
    assert_eq!(seq.len(), 12);
    pool.arm(Fault::None);
    assert_eq!(seq.try_append(8).unwrap(), 12..20);
    drop(seq);
    pool.assert_whole();
}

/// An `add_refs` that says it shared more blocks than it was given makes
/// the fork panic, with the private block given back.
#[test]
fn a_fork_whose_add_refs_overcounts_panics() {
    let pool = Ledger::new(8);
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(6).unwrap();
    pool.arm(Fault::AddRefsLies);
    let message = panic_of(|| drop(seq.try_fork()));
    assert!(
        message.contains("add_refs said it shared 2 of 1"),
        "{message}"
    );
    assert_eq!((seq.len(), seq.blocks().len()), (6, 2));
    // The references it did add went back with the child, with its
    // private block.
    assert_eq!(pool.held(), 2);
    drop(seq);
    pool.assert_whole();
}

/// Whether `id` waits for `fence` in the allocator's books.
fn fenced(pool: &Ledger, fence: u64, id: BlockId) -> bool {
    pool.books
        .lock()
        .unwrap()
        .fenced
        .get(&fence)
        .is_some_and(|ids| ids.contains(&id))
}

/// A sequence whose last append copied a shared tail: it keeps the
/// copy's source, which it alone holds now; returns the source.
fn with_copy_source(pool: &Arc<Ledger>) -> (Sequence<Ledger>, BlockId) {
    let mut seq = Sequence::new(Arc::clone(pool));
    seq.try_append(4).unwrap();
    let (child, _) = seq.try_fork().unwrap();
    seq.truncate(2);
    let copy = seq.try_append_cow(1).unwrap().1.expect("a copy");
    drop(child);
    (seq, copy.src)
}

/// A hybrid sequence's `retire` whose first table's retire unwinds still
/// retires the others: none of its blocks goes back before the fence.
#[test]
fn a_hybrid_retire_that_unwinds_fences_every_table() {
    let pool = Ledger::new(8);
    let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    seq.try_append(8).unwrap();
    pool.arm(Fault::RetireThenPanic);
    let message = panic_of(|| {
        seq.retire(7);
    });
    assert_eq!(message, LEDGER_PANIC);
    assert_eq!(pool.held(), 4);
    pool.assert_whole();
}

/// A hybrid sequence's `retire` whose give-back of blocks a panic left in
/// transit unwinds still retires every table.
#[test]
fn a_hybrid_retire_whose_leftovers_release_unwinds_fences_every_table() {
    let pool = Ledger::new(8);
    let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
    seq.try_append(4).unwrap();
    pool.arm(Fault::AllocThenPanic);
    assert_eq!(panic_of(|| drop(seq.try_append(4))), LEDGER_PANIC);
    assert_eq!(pool.held(), 4);
    pool.arm(Fault::ReleaseThenPanic);
    let message = panic_of(|| {
        seq.retire(7);
    });
    assert_eq!(message, LEDGER_PANIC);
    // The 2 left in transit went back; the tables' 2 wait for the fence.
    assert_eq!(pool.held(), 2);
    pool.assert_whole();
}

/// A sequence's `retire` retires the copy-on-write source it keeps with
/// its table, and counts it.
#[test]
fn a_retire_fences_the_copy_source() {
    let pool = Ledger::new(8);
    let (seq, src) = with_copy_source(&pool);
    assert_eq!(seq.retire(7), 2);
    assert_eq!(pool.held(), 2);
    assert!(fenced(&pool, 7, src));
    pool.assert_whole();
}

/// A sequence's `retire` whose table's retire unwinds still retires the
/// copy-on-write source it keeps, which its drop would give back at once.
#[test]
fn a_retire_that_unwinds_fences_the_copy_source() {
    let pool = Ledger::new(8);
    let (seq, src) = with_copy_source(&pool);
    pool.arm(Fault::RetireThenPanic);
    let message = panic_of(|| {
        seq.retire(7);
    });
    assert_eq!(message, LEDGER_PANIC);
    assert_eq!(pool.held(), 2);
    assert!(fenced(&pool, 7, src));
    pool.assert_whole();
}

/// A fenced truncate whose table's retire unwinds still retires the
/// copy-on-write source, which the next append would give back at once.
#[test]
fn a_fenced_truncate_that_unwinds_fences_the_copy_source() {
    let pool = Ledger::new(8);
    let (mut seq, src) = with_copy_source(&pool);
    seq.try_reserve(4, 0).unwrap();
    pool.arm(Fault::RetireThenPanic);
    let message = panic_of(|| {
        seq.truncate_fenced(2, 7);
    });
    assert_eq!(message, LEDGER_PANIC);
    assert_eq!((seq.len(), seq.blocks().len()), (2, 1));
    assert!(fenced(&pool, 7, src));
    assert_eq!(seq.retire_copy_source(8), 0);
    drop(seq);
    pool.assert_whole();
}

/// A sequence reads its allocator's block size once, when it is made: a
/// `block_size` that unwinds later cannot cut a call short (a hybrid
/// sequence's groups would disagree on their length). Appends, truncates
/// and copy-on-write never read it again.
#[test]
fn a_sequence_reads_the_block_size_once() {
    let pool = Ledger::new(64);
    let groups = KvGroups::new([
        KvGroup::Full,
        KvGroup::SlidingWindow { window_tokens: 4 },
        KvGroup::Full,
    ])
    .unwrap();
    let mut hybrid = HybridSequence::new(Arc::clone(&pool), groups);
    let mut seq = Sequence::new(Arc::clone(&pool));
    hybrid.try_append(6).unwrap();
    seq.try_append(6).unwrap();
    // A fork makes new sequences, which read it (before they change
    // anything).
    let mut copies = Vec::new();
    let child = hybrid.try_fork(&mut copies).unwrap();
    let (fork, _) = seq.try_fork().unwrap();
    pool.arm(Fault::BlockSizePanics);
    hybrid.truncate(5).unwrap();
    hybrid.try_append_cow(2, &mut copies).unwrap();
    seq.truncate(5);
    seq.try_append_cow(2).unwrap();
    for _ in 0..3 {
        hybrid.try_append(3).unwrap();
        seq.try_append(3).unwrap();
    }
    hybrid.truncate_fenced(14, 3).unwrap();
    seq.truncate_fenced(14, 3);
    assert_eq!((hybrid.len(), seq.len()), (14, 14));
    assert!(hybrid.len() <= hybrid.capacity());
    pool.arm(Fault::None);
    drop((hybrid, child, seq, fork));
    pool.assert_whole();
}
