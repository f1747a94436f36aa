//! Model-based property tests: random sequences of every public operation on
//! [`SlotCounter`] and its guards, and on [`BlockPool`] and [`Sequence`],
//! compared step by step with a plain sequential model.
//!
//! Each case is a random list of operations. Each operation runs once on the
//! real allocator and once on the model. The test then compares the return
//! values and errors (`Full { available }` included) and every getter.
//! proptest shrinks a failing case to a minimal list with minimal sizes.
//!
//! The models are written out by hand instead of with
//! proptest-state-machine, for two reasons. A [`Reservation`] borrows its
//! counter, and a state-machine test's owned system under test cannot hold a
//! guard that borrows from itself. Also, every argument here is *resolved
//! against the current state* when the operation runs: sizes such as
//! "available + 1" or "capacity + 1", and handles given as an [`Index`] into
//! the guards or sequences alive at that point. The strategies therefore
//! need no state, and every shrunk list is still a valid list. proptest
//! drops operations and shrinks each field towards `Zero` and index 0.
//!
//! The model uses `u128` arithmetic for "does it fit", so it shares no
//! overflow handling with the code under test.
//!
//! Cases: 1024 per property by default (a few seconds in a debug build);
//! set `KVSLOTS_PROPTEST_CASES` for more, e.g.
//! `KVSLOTS_PROPTEST_CASES=50000 cargo test -p kvslots --test model --release`.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use kvslots::{
    BlockCopy, BlockHash, BlockId, BlockPool, FreeError, OwnedReservation, PositionError,
    PrefixStats, ReleaseError, Reservation, ReserveError, Sequence, SlotCounter,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

/// 1024 cases per property, or `KVSLOTS_PROPTEST_CASES`.
fn config() -> ProptestConfig {
    let cases = std::env::var("KVSLOTS_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1024);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// Sizes drawn to hit the edges
// ---------------------------------------------------------------------------

/// An unsigned size, resolved when the operation runs against what is
/// available and the capacity at that point.
#[derive(Debug, Clone, Copy)]
enum Size {
    Zero,
    One,
    Small(usize),
    BelowAvail,
    Avail,
    AboveAvail,
    Cap,
    AboveCap,
    Max,
    Any(usize),
}

impl Size {
    fn resolve(self, avail: usize, cap: usize) -> usize {
        match self {
            Size::Zero => 0,
            Size::One => 1,
            Size::Small(k) => k,
            Size::BelowAvail => avail.saturating_sub(1),
            Size::Avail => avail,
            Size::AboveAvail => avail.saturating_add(1),
            Size::Cap => cap,
            Size::AboveCap => cap.saturating_add(1),
            Size::Max => usize::MAX,
            Size::Any(n) => n,
        }
    }
}

fn size() -> impl Strategy<Value = Size> {
    prop_oneof![
        2 => Just(Size::Zero),
        2 => Just(Size::One),
        4 => (2usize..=9).prop_map(Size::Small),
        2 => Just(Size::BelowAvail),
        3 => Just(Size::Avail),
        3 => Just(Size::AboveAvail),
        1 => Just(Size::Cap),
        1 => Just(Size::AboveCap),
        1 => Just(Size::Max),
        1 => any::<usize>().prop_map(Size::Any),
    ]
}

/// A size for appends: mostly small, so that sequences grow over several
/// steps, with every edge still drawn.
fn append_size() -> impl Strategy<Value = Size> {
    prop_oneof![
        1 => Just(Size::Zero),
        4 => Just(Size::One),
        12 => (2usize..=9).prop_map(Size::Small),
        2 => Just(Size::BelowAvail),
        2 => Just(Size::Avail),
        2 => Just(Size::AboveAvail),
        1 => Just(Size::Cap),
        1 => Just(Size::AboveCap),
        1 => Just(Size::Max),
        1 => any::<usize>().prop_map(Size::Any),
    ]
}

/// A length to truncate to (`BelowAvail` drops one token, `Avail` is a
/// no-op): mostly into the table, so that truncation lands inside shared
/// blocks.
fn truncate_size() -> impl Strategy<Value = Size> {
    prop_oneof![
        2 => Just(Size::Zero),
        2 => Just(Size::One),
        6 => (2usize..=9).prop_map(Size::Small),
        6 => Just(Size::BelowAvail),
        1 => Just(Size::Avail),
        1 => Just(Size::AboveAvail),
        1 => Just(Size::Max),
    ]
}

/// A signed request for [`SlotCounter::admit`].
#[derive(Debug, Clone, Copy)]
enum Req {
    Zero,
    One,
    MinusOne,
    Small(isize),
    Avail,
    AboveAvail,
    Cap,
    AboveCap,
    Min,
    Max,
    Any(isize),
}

impl Req {
    fn resolve(self, avail: usize, cap: usize) -> isize {
        // `cap <= SlotCounter::MAX_CAPACITY == isize::MAX`, so these casts
        // are exact.
        match self {
            Req::Zero => 0,
            Req::One => 1,
            Req::MinusOne => -1,
            Req::Small(k) => k,
            Req::Avail => avail as isize,
            Req::AboveAvail => (avail as isize).saturating_add(1),
            Req::Cap => cap as isize,
            Req::AboveCap => (cap as isize).saturating_add(1),
            Req::Min => isize::MIN,
            Req::Max => isize::MAX,
            Req::Any(n) => n,
        }
    }
}

fn req() -> impl Strategy<Value = Req> {
    prop_oneof![
        2 => Just(Req::Zero),
        2 => Just(Req::One),
        1 => Just(Req::MinusOne),
        4 => (-3isize..=9).prop_map(Req::Small),
        3 => Just(Req::Avail),
        3 => Just(Req::AboveAvail),
        1 => Just(Req::Cap),
        1 => Just(Req::AboveCap),
        1 => Just(Req::Min),
        1 => Just(Req::Max),
        1 => any::<isize>().prop_map(Req::Any),
    ]
}

/// Whether `n + headroom` fits in `avail` of `cap`, as the documented rule
/// says, in `u128` so that nothing can overflow: `Closed` (whatever the
/// size) before `NeverFits` before `Full`.
fn admission(
    n: usize,
    headroom: usize,
    avail: usize,
    cap: usize,
    closed: bool,
) -> Result<(), ReserveError> {
    let needed = n as u128 + headroom as u128;
    if closed {
        Err(ReserveError::Closed)
    } else if needed > cap as u128 {
        Err(ReserveError::NeverFits {
            requested: n,
            capacity: cap,
        })
    } else if needed > avail as u128 {
        Err(ReserveError::Full {
            requested: n,
            available: avail,
        })
    } else {
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// SlotCounter, Reservation, OwnedReservation
// ---------------------------------------------------------------------------

/// Either guard, so that one list of handles covers both.
#[derive(Debug)]
enum Guard<'a> {
    Borrowed(Reservation<'a>),
    Owned(OwnedReservation),
}

impl<'a> Guard<'a> {
    fn len(&self) -> usize {
        match self {
            Guard::Borrowed(r) => r.len(),
            Guard::Owned(r) => r.len(),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Guard::Borrowed(r) => r.is_empty(),
            Guard::Owned(r) => r.is_empty(),
        }
    }

    fn counter(&self) -> &SlotCounter {
        match self {
            Guard::Borrowed(r) => r.counter(),
            Guard::Owned(r) => r.counter(),
        }
    }

    fn split(&mut self, n: usize) -> Option<Guard<'a>> {
        match self {
            Guard::Borrowed(r) => r.split(n).map(Guard::Borrowed),
            Guard::Owned(r) => r.split(n).map(Guard::Owned),
        }
    }

    /// Merges `other` if it is the same kind of guard, else hands it back.
    fn merge(&mut self, other: Guard<'a>) -> Result<(), Guard<'a>> {
        match (self, other) {
            (Guard::Borrowed(a), Guard::Borrowed(b)) => a.merge(b),
            (Guard::Owned(a), Guard::Owned(b)) => a.merge(b),
            (_, other) => return Err(other),
        }
        Ok(())
    }

    fn shrink_to(&mut self, len: usize) {
        match self {
            Guard::Borrowed(r) => r.shrink_to(len),
            Guard::Owned(r) => r.shrink_to(len),
        }
    }

    fn try_grow(&mut self, n: usize) -> Result<(), ReserveError> {
        match self {
            Guard::Borrowed(r) => r.try_grow(n),
            Guard::Owned(r) => r.try_grow(n),
        }
    }

    fn forget(self) -> usize {
        match self {
            Guard::Borrowed(r) => r.forget(),
            Guard::Owned(r) => r.forget(),
        }
    }
}

#[derive(Debug, Clone)]
enum CounterOp {
    Admit(Req),
    Release(Size),
    Reserve(Size),
    ReserveOwned(Size),
    ReserveWithHeadroom(Size, Size),
    Close,
    Split(Index, Size),
    Merge(Index, Index),
    ShrinkTo(Index, Size),
    TryGrow(Index, Size),
    Forget(Index),
    Drop(Index),
}

fn counter_op() -> impl Strategy<Value = CounterOp> {
    prop_oneof![
        8 => req().prop_map(CounterOp::Admit),
        6 => size().prop_map(CounterOp::Release),
        10 => size().prop_map(CounterOp::Reserve),
        6 => size().prop_map(CounterOp::ReserveOwned),
        6 => (size(), size()).prop_map(|(n, h)| CounterOp::ReserveWithHeadroom(n, h)),
        1 => Just(CounterOp::Close),
        5 => (any::<Index>(), size()).prop_map(|(i, n)| CounterOp::Split(i, n)),
        5 => (any::<Index>(), any::<Index>()).prop_map(|(i, j)| CounterOp::Merge(i, j)),
        5 => (any::<Index>(), size()).prop_map(|(i, n)| CounterOp::ShrinkTo(i, n)),
        5 => (any::<Index>(), size()).prop_map(|(i, n)| CounterOp::TryGrow(i, n)),
        3 => any::<Index>().prop_map(CounterOp::Forget),
        5 => any::<Index>().prop_map(CounterOp::Drop),
    ]
}

fn counter_capacity() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1usize),
        2usize..=8,
        Just(SlotCounter::MAX_CAPACITY),
    ]
}

/// The sequential model of a counter and the guards alive on it.
#[derive(Debug)]
struct CounterModel {
    capacity: usize,
    used: usize,
    peak: usize,
    closed: bool,
    /// Slots taken with `admit` or kept with `forget`: what `release` may
    /// give back without taking slots a live guard holds.
    loose: usize,
    /// The length of each live guard, in the same order as the real ones.
    guards: Vec<usize>,
}

impl CounterModel {
    fn new(capacity: usize) -> Self {
        CounterModel {
            capacity,
            used: 0,
            peak: 0,
            closed: false,
            loose: 0,
            guards: Vec::new(),
        }
    }

    fn available(&self) -> usize {
        self.capacity - self.used
    }

    fn reserve(&mut self, n: usize, headroom: usize) -> Result<(), ReserveError> {
        admission(n, headroom, self.available(), self.capacity, self.closed)?;
        self.used += n;
        self.peak = self.peak.max(self.used);
        Ok(())
    }

    fn admit(&mut self, requested: isize) -> usize {
        if requested <= 0 {
            return 0;
        }
        let n = requested as usize;
        match self.reserve(n, 0) {
            Ok(()) => {
                self.loose += n;
                n
            }
            Err(_) => 0,
        }
    }
}

/// Every getter of the counter and of every guard against the model.
fn check_counter(
    step: usize,
    counter: &SlotCounter,
    guards: &[Guard<'_>],
    m: &CounterModel,
) -> Result<(), TestCaseError> {
    // The model's own bookkeeping first: a test bug must not pass silently.
    prop_assert_eq!(
        m.used,
        m.loose + m.guards.iter().sum::<usize>(),
        "step {}: model inconsistent",
        step
    );
    prop_assert_eq!(counter.capacity(), m.capacity, "step {}: capacity", step);
    prop_assert_eq!(counter.used(), m.used, "step {}: used", step);
    prop_assert_eq!(
        counter.available(),
        m.available(),
        "step {}: available",
        step
    );
    prop_assert_eq!(counter.peak_used(), m.peak, "step {}: peak_used", step);
    prop_assert_eq!(counter.is_closed(), m.closed, "step {}: is_closed", step);
    prop_assert_eq!(guards.len(), m.guards.len());
    for (i, (g, &len)) in guards.iter().zip(&m.guards).enumerate() {
        prop_assert_eq!(g.len(), len, "step {}: guard {} len", step, i);
        prop_assert_eq!(
            g.is_empty(),
            len == 0,
            "step {}: guard {} is_empty",
            step,
            i
        );
        prop_assert!(
            std::ptr::eq(g.counter(), counter),
            "step {}: guard {} names another counter",
            step,
            i
        );
    }
    Ok(())
}

/// Compares a reservation attempt with the model's verdict and records a new
/// guard.
fn record_reservation<'a>(
    step: usize,
    what: &str,
    got: Result<Guard<'a>, ReserveError>,
    expected: Result<(), ReserveError>,
    n: usize,
    guards: &mut Vec<Guard<'a>>,
    m: &mut CounterModel,
) -> Result<(), TestCaseError> {
    match (got, expected) {
        (Ok(g), Ok(())) => {
            prop_assert_eq!(g.len(), n, "step {}: {} guard length", step, what);
            guards.push(g);
            m.guards.push(n);
        }
        (Err(e), Err(x)) => prop_assert_eq!(e, x, "step {}: {}", step, what),
        (got, x) => prop_assert!(
            false,
            "step {}: {} returned {:?}, model says {:?}",
            step,
            what,
            got.map(|g| g.len()),
            x
        ),
    }
    Ok(())
}

/// One run of the counter property: the real counter and the guards alive
/// on it, the model, and the step being checked.
struct CounterRun<'a> {
    counter: &'a Arc<SlotCounter>,
    guards: Vec<Guard<'a>>,
    m: CounterModel,
    /// The operation being checked, from 1 (0 is the state before any).
    step: usize,
}

impl<'a> CounterRun<'a> {
    fn new(counter: &'a Arc<SlotCounter>) -> Self {
        CounterRun {
            counter,
            guards: Vec::new(),
            m: CounterModel::new(counter.capacity()),
            step: 0,
        }
    }

    /// Runs `op` on the counter and on the model, and compares what they
    /// returned.
    fn apply(&mut self, op: &CounterOp) -> Result<(), TestCaseError> {
        match *op {
            CounterOp::Admit(r) => self.admit(r),
            CounterOp::Release(s) => self.release(s),
            CounterOp::Reserve(s) => self.reserve(s),
            CounterOp::ReserveOwned(s) => self.reserve_owned(s),
            CounterOp::ReserveWithHeadroom(s, h) => self.reserve_with_headroom(s, h),
            CounterOp::Close => self.close(),
            CounterOp::Split(i, s) => self.split(i, s),
            CounterOp::Merge(i, j) => self.merge(i, j),
            CounterOp::ShrinkTo(i, s) => self.shrink_to(i, s),
            CounterOp::TryGrow(i, s) => self.try_grow(i, s),
            CounterOp::Forget(i) => self.forget(i),
            CounterOp::Drop(i) => self.drop_guard(i),
        }
    }

    /// Every getter against the model.
    fn check(&self) -> Result<(), TestCaseError> {
        check_counter(self.step, self.counter, &self.guards, &self.m)
    }

    fn admit(&mut self, r: Req) -> Result<(), TestCaseError> {
        let step = self.step;
        let counter = self.counter;
        let CounterRun { m, .. } = self;
        let (cap, avail) = (m.capacity, m.available());
        let r = r.resolve(avail, cap);
        let expected = m.admit(r);
        prop_assert_eq!(counter.admit(r), expected, "step {}: admit({})", step, r);
        Ok(())
    }

    fn release(&mut self, s: Size) -> Result<(), TestCaseError> {
        let step = self.step;
        let counter = self.counter;
        let CounterRun { m, .. } = self;
        let cap = m.capacity;
        let mut n = s.resolve(m.loose, cap);
        // Giving back slots that a live guard holds is outside the
        // contract (the guard's drop would give them back again),
        // and the counter cannot tell. Such a draw becomes the
        // smallest over-release instead.
        if n > m.loose && n <= m.used {
            n = m.used + 1;
        }
        if n > m.used {
            prop_assert_eq!(
                counter.release(n),
                Err(ReleaseError::ExceedsUsed {
                    released: n,
                    used: m.used
                }),
                "step {}: release({})",
                step,
                n
            );
        } else {
            prop_assert_eq!(counter.release(n), Ok(()), "step {}: release({})", step, n);
            m.used -= n;
            m.loose -= n;
        }
        Ok(())
    }

    /// A reservation of `n` slots with `headroom`, made by `reserve` on the
    /// counter and compared with the model's verdict; `what` names the call.
    fn reserve_with(
        &mut self,
        what: &str,
        n: usize,
        headroom: usize,
        reserve: impl FnOnce(&'a Arc<SlotCounter>) -> Result<Guard<'a>, ReserveError>,
    ) -> Result<(), TestCaseError> {
        let expected = self.m.reserve(n, headroom);
        let got = reserve(self.counter);
        let CounterRun { guards, m, .. } = self;
        record_reservation(self.step, what, got, expected, n, guards, m)
    }

    fn reserve(&mut self, s: Size) -> Result<(), TestCaseError> {
        let n = s.resolve(self.m.available(), self.m.capacity);
        self.reserve_with("try_reserve", n, 0, |c| {
            c.try_reserve(n).map(Guard::Borrowed)
        })
    }

    fn reserve_owned(&mut self, s: Size) -> Result<(), TestCaseError> {
        let n = s.resolve(self.m.available(), self.m.capacity);
        self.reserve_with("try_reserve_owned", n, 0, |c| {
            c.try_reserve_owned(n).map(Guard::Owned)
        })
    }

    fn reserve_with_headroom(&mut self, s: Size, h: Size) -> Result<(), TestCaseError> {
        let (cap, avail) = (self.m.capacity, self.m.available());
        let n = s.resolve(avail, cap);
        // Relative to what is left after `n`: `Avail` fits exactly,
        // `AboveAvail` is one short.
        let headroom = h.resolve(avail.saturating_sub(n), cap);
        self.reserve_with("try_reserve_with_headroom", n, headroom, |c| {
            c.try_reserve_with_headroom(n, headroom)
                .map(Guard::Borrowed)
        })
    }

    fn close(&mut self) -> Result<(), TestCaseError> {
        let counter = self.counter;
        let CounterRun { m, .. } = self;
        counter.close();
        m.closed = true;
        Ok(())
    }

    fn split(&mut self, i: Index, s: Size) -> Result<(), TestCaseError> {
        let step = self.step;
        let CounterRun { guards, m, .. } = self;
        let cap = m.capacity;
        if guards.is_empty() {
            return Ok(());
        }
        let i = i.index(guards.len());
        let len = m.guards[i];
        let n = s.resolve(len, cap);
        match guards[i].split(n) {
            Some(part) => {
                prop_assert!(n <= len, "step {}: split({}) of {} succeeded", step, n, len);
                prop_assert_eq!(part.len(), n, "step {}: split part", step);
                m.guards[i] -= n;
                m.guards.push(n);
                guards.push(part);
            }
            None => prop_assert!(n > len, "step {}: split({}) of {} refused", step, n, len),
        }
        Ok(())
    }

    fn merge(&mut self, i: Index, j: Index) -> Result<(), TestCaseError> {
        let CounterRun { guards, m, .. } = self;
        if guards.len() < 2 {
            return Ok(());
        }
        let mut i = i.index(guards.len());
        let mut j = j.index(guards.len() - 1);
        if j >= i {
            j += 1;
        }
        let other = guards.remove(j);
        let other_len = m.guards.remove(j);
        if j < i {
            i -= 1;
        }
        match guards[i].merge(other) {
            Ok(()) => m.guards[i] += other_len,
            // A borrowed and an owned guard: not mergeable by type.
            Err(other) => {
                guards.push(other);
                m.guards.push(other_len);
            }
        }
        Ok(())
    }

    fn shrink_to(&mut self, i: Index, s: Size) -> Result<(), TestCaseError> {
        let CounterRun { guards, m, .. } = self;
        let cap = m.capacity;
        if guards.is_empty() {
            return Ok(());
        }
        let i = i.index(guards.len());
        let len = m.guards[i];
        let n = s.resolve(len, cap);
        guards[i].shrink_to(n);
        if n < len {
            m.used -= len - n;
            m.guards[i] = n;
        }
        Ok(())
    }

    fn try_grow(&mut self, i: Index, s: Size) -> Result<(), TestCaseError> {
        let step = self.step;
        let CounterRun { guards, m, .. } = self;
        let (cap, avail) = (m.capacity, m.available());
        if guards.is_empty() {
            return Ok(());
        }
        let i = i.index(guards.len());
        let n = s.resolve(avail, cap);
        let expected = m.reserve(n, 0);
        prop_assert_eq!(
            guards[i].try_grow(n),
            expected,
            "step {}: try_grow({})",
            step,
            n
        );
        if expected.is_ok() {
            m.guards[i] += n;
        }
        Ok(())
    }

    fn forget(&mut self, i: Index) -> Result<(), TestCaseError> {
        let step = self.step;
        let CounterRun { guards, m, .. } = self;
        if guards.is_empty() {
            return Ok(());
        }
        let i = i.index(guards.len());
        let len = m.guards.remove(i);
        prop_assert_eq!(guards.remove(i).forget(), len, "step {}: forget", step);
        m.loose += len;
        Ok(())
    }

    fn drop_guard(&mut self, i: Index) -> Result<(), TestCaseError> {
        let CounterRun { guards, m, .. } = self;
        if guards.is_empty() {
            return Ok(());
        }
        let i = i.index(guards.len());
        drop(guards.remove(i));
        m.used -= m.guards.remove(i);
        Ok(())
    }
}

fn run_counter(capacity: usize, ops: &[CounterOp]) -> Result<(), TestCaseError> {
    let counter = Arc::new(SlotCounter::new(capacity));
    let mut run = CounterRun::new(&counter);
    run.check()?;
    for (step, op) in ops.iter().enumerate() {
        run.step = step + 1;
        run.apply(op)?;
        run.check()?;
    }
    let CounterRun { guards, m, .. } = run;
    // Conservation: every guard gone and every loose slot released, nothing
    // is left in use.
    drop(guards);
    prop_assert_eq!(counter.release(m.loose), Ok(()));
    prop_assert_eq!(counter.used(), 0, "slots leaked");
    prop_assert_eq!(counter.available(), capacity);
    prop_assert!(counter.peak_used() <= capacity);
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// `SlotCounter`, `Reservation` and `OwnedReservation` agree with the
    /// sequential model after every operation.
    #[test]
    fn counter_and_guards_follow_the_model(
        capacity in counter_capacity(),
        ops in prop::collection::vec(counter_op(), 1..80),
    ) {
        run_counter(capacity, &ops)?;
    }
}

// ---------------------------------------------------------------------------
// BlockPool and Sequence
// ---------------------------------------------------------------------------

/// One id in a list given to `free`.
#[derive(Debug, Clone)]
enum Piece {
    /// An id of a raw allocation (one reference, held by the test).
    Held(Index),
    /// Any allocated id (a sequence's, possibly shared).
    Allocated(Index),
    /// A free id (never allocated, or a double free).
    Unallocated(Index),
    /// The previous id of the list again (an over-free, once it is listed
    /// more times than it has references).
    Again,
    /// `num_blocks`, `num_blocks + 1` or `u32::MAX`.
    OutOfRange(usize),
}

#[derive(Debug, Clone)]
enum PoolOp {
    Alloc {
        n: Size,
        headroom: Option<Size>,
        prefilled: bool,
    },
    FreeHeld {
        holding: Index,
        count: Index,
    },
    FreeMixed(Vec<Piece>),
    Close,
    /// `Sequence::new`, or `with_capacity` with a token hint.
    NewSeq(Option<Size>),
    Append {
        seq: SeqSel,
        n: Size,
        cow_api: bool,
    },
    Truncate {
        seq: SeqSel,
        len: Cut,
    },
    Fork(SeqSel),
    DropSeq(SeqSel),
    Slot {
        seq: SeqSel,
        pos: Size,
    },
    ExtendSlots {
        seq: SeqSel,
        start: Size,
        end: Size,
    },
    /// `try_match_prefix` with the first `len` keys of a family, on a new
    /// sequence or on a live one (which must be empty to match).
    Match {
        seq: Option<SeqSel>,
        family: u8,
        len: usize,
    },
    /// `publish` of the first `len` keys of a family.
    Publish {
        seq: SeqSel,
        family: u8,
        len: usize,
    },
    /// `reset_prefix_cache`.
    Reset,
}

/// Families of keys: family `f`'s key `i` is number `FAMILY_KEYS * f + i`,
/// except that families 0 and 1 share their first two keys (a shared
/// prefix).
const FAMILY_KEYS: usize = 4;

/// Key number `n`: its first two words are `n` and `n + 1`, the rest is
/// `n` spread (the pool places keys by a hash of its own, so any distinct
/// keys do).
fn model_key(n: usize) -> BlockHash {
    let n = n as u64;
    let mut key = [0u8; 32];
    for (i, word) in [n, n + 1, n.wrapping_mul(0x9E37_79B9_7F4A_7C15), n]
        .iter()
        .enumerate()
    {
        key[i * 8..i * 8 + 8].copy_from_slice(&word.to_le_bytes());
    }
    BlockHash(key)
}

/// The key numbers of family `family`'s first `len` blocks.
fn family_keys(family: u8, len: usize) -> Vec<usize> {
    (0..len.min(FAMILY_KEYS))
        .map(|i| {
            if family == 1 && i < 2 {
                i
            } else {
                FAMILY_KEYS * usize::from(family) + i
            }
        })
        .collect()
}

/// Which sequence an operation applies to.
#[derive(Debug, Clone)]
enum SeqSel {
    /// The one the previous sequence operation used (so that chains such as
    /// fork, truncate into the shared prefix, append are common).
    Same,
    /// Any live sequence.
    Pick(Index),
}

fn seq_sel() -> impl Strategy<Value = SeqSel> {
    prop_oneof![Just(SeqSel::Same), any::<Index>().prop_map(SeqSel::Pick)]
}

impl SeqSel {
    fn resolve(&self, live: usize, last: usize) -> usize {
        match self {
            SeqSel::Same => last.min(live - 1),
            SeqSel::Pick(i) => i.index(live),
        }
    }
}

/// The length a truncation goes back to.
#[derive(Debug, Clone)]
enum Cut {
    To(Size),
    /// Into the middle of one of the sequence's shared blocks, so that the
    /// next append has to copy it on write (`len - 1` if none is shared).
    IntoShared(Index, Index),
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        3 => any::<Index>().prop_map(Piece::Held),
        3 => any::<Index>().prop_map(Piece::Allocated),
        3 => any::<Index>().prop_map(Piece::Unallocated),
        2 => Just(Piece::Again),
        1 => (0usize..3).prop_map(Piece::OutOfRange),
    ]
}

fn pool_op() -> impl Strategy<Value = PoolOp> {
    // Closing is rare (about one case in ten closes at all, at a random
    // point), so that most cases keep allocating.
    prop_oneof![
        16 => (size(), prop::option::of(size()), any::<bool>()).prop_map(|(n, headroom, prefilled)| {
            PoolOp::Alloc { n, headroom, prefilled }
        }),
        20 => (any::<Index>(), any::<Index>())
            .prop_map(|(holding, count)| PoolOp::FreeHeld { holding, count }),
        24 => prop::collection::vec(piece(), 1..=4).prop_map(PoolOp::FreeMixed),
        1 => Just(PoolOp::Close),
        6 => prop::option::of(size()).prop_map(PoolOp::NewSeq),
        90 => (seq_sel(), append_size(), any::<bool>())
            .prop_map(|(seq, n, cow_api)| PoolOp::Append { seq, n, cow_api }),
        80 => (seq_sel(), truncate_size()).prop_map(|(seq, len)| PoolOp::Truncate { seq, len: Cut::To(len) }),
        20 => (seq_sel(), any::<Index>(), any::<Index>())
            .prop_map(|(seq, b, t)| PoolOp::Truncate { seq, len: Cut::IntoShared(b, t) }),
        32 => seq_sel().prop_map(PoolOp::Fork),
        12 => seq_sel().prop_map(PoolOp::DropSeq),
        16 => (seq_sel(), size()).prop_map(|(seq, pos)| PoolOp::Slot { seq, pos }),
        16 => (seq_sel(), size(), size())
            .prop_map(|(seq, start, end)| PoolOp::ExtendSlots { seq, start, end }),
        30 => (prop::option::of(seq_sel()), 0u8..3, 0usize..=FAMILY_KEYS + 1)
            .prop_map(|(seq, family, len)| PoolOp::Match { seq, family, len }),
        30 => (seq_sel(), 0u8..3, 0usize..=FAMILY_KEYS + 1)
            .prop_map(|(seq, family, len)| PoolOp::Publish { seq, family, len }),
        2 => Just(PoolOp::Reset),
    ]
}

fn pool_shape() -> impl Strategy<Value = (usize, usize)> {
    (
        prop_oneof![1 => Just(0usize), 2 => Just(1usize), 6 => 2usize..=6, 6 => 7usize..=16, 4 => 17usize..=32],
        prop_oneof![
            1 => Just(1usize),
            4 => Just(2usize),
            3 => Just(3usize),
            3 => Just(4usize),
            1 => Just(16usize),
        ],
    )
}

/// The sequential model of one sequence.
#[derive(Debug, Clone, Default)]
struct SeqModel {
    len: usize,
    blocks: Vec<BlockId>,
    /// The block a copy-on-write replaced; its reference is kept until the
    /// next change to the sequence.
    retired: Option<BlockId>,
}

/// The sequential model of a pool, the raw allocations the test holds, and
/// the sequences alive on it.
#[derive(Debug)]
struct PoolModel {
    num_blocks: usize,
    block_size: usize,
    closed: bool,
    peak: usize,
    /// References per block.
    refs: Vec<u32>,
    /// Raw allocations: each id holds one reference owned by the test.
    raw: Vec<Vec<BlockId>>,
    seqs: Vec<SeqModel>,
    /// The key number each block holds, if cached.
    keys: Vec<Option<usize>>,
    /// Key number to the block holding it.
    index: HashMap<usize, BlockId>,
    /// The evictable blocks, least recently released first.
    lru: Vec<BlockId>,
    /// The prefix cache's statistics.
    stats: PrefixStats,
}

impl PoolModel {
    fn new(num_blocks: usize, block_size: usize) -> Self {
        PoolModel {
            num_blocks,
            block_size,
            closed: false,
            peak: 0,
            refs: vec![0; num_blocks],
            raw: Vec::new(),
            seqs: Vec::new(),
            keys: vec![None; num_blocks],
            index: HashMap::new(),
            lru: Vec::new(),
            stats: PrefixStats::default(),
        }
    }

    /// Drops block `id`'s key.
    fn uncache(&mut self, id: BlockId) {
        if let Some(key) = self.keys[id.index()].take() {
            self.index.remove(&key);
        }
        self.lru.retain(|&b| b != id);
    }

    fn used(&self) -> usize {
        self.refs.iter().filter(|&&r| r > 0).count()
    }

    fn free(&self) -> usize {
        self.num_blocks - self.used()
    }

    fn admission(&self, n: usize, headroom: usize) -> Result<(), ReserveError> {
        admission(n, headroom, self.free(), self.num_blocks, self.closed)
    }

    /// The admission rule for sequence `i`'s calls that ask for `n`
    /// blocks with `headroom`, of which `needed` (all but a shared tail's
    /// copy) can never be taken beside the blocks in its table (a kept
    /// copy-on-write source does not count: it goes back once the copy is
    /// made): `NeverFits` with the rest of the pool as the capacity
    /// (`Closed` first after a close).
    fn seq_admission(
        &self,
        i: usize,
        n: usize,
        needed: usize,
        headroom: usize,
    ) -> Result<(), ReserveError> {
        let s = &self.seqs[i];
        let room = self.num_blocks - s.blocks.len();
        if self.closed {
            Err(ReserveError::Closed)
        } else if needed as u128 + headroom as u128 > room as u128 {
            Err(ReserveError::NeverFits {
                requested: n,
                capacity: room,
            })
        } else {
            self.admission(n, headroom)
        }
    }

    /// Records blocks just handed out: they must be distinct, in range and
    /// free before; each now has one reference.
    fn take_fresh(&mut self, step: usize, ids: &[BlockId]) -> Result<(), TestCaseError> {
        for (k, id) in ids.iter().enumerate() {
            prop_assert!(
                id.index() < self.num_blocks,
                "step {}: {} out of range",
                step,
                id
            );
            prop_assert!(
                !ids[..k].contains(id),
                "step {}: {} handed out twice in one call",
                step,
                id
            );
            prop_assert_eq!(
                self.refs[id.index()],
                0,
                "step {}: {} handed out while referenced",
                step,
                id
            );
        }
        // Uncached free blocks first; only then the least recently
        // released cached ones, whose keys go.
        let uncached = (0..self.num_blocks)
            .filter(|&b| self.refs[b] == 0 && self.keys[b].is_none())
            .count();
        let evicted = ids.len().saturating_sub(uncached);
        let mut expected: Vec<BlockId> = self.lru[..evicted].to_vec();
        let mut got: Vec<BlockId> = ids
            .iter()
            .copied()
            .filter(|id| self.keys[id.index()].is_some())
            .collect();
        expected.sort();
        got.sort();
        prop_assert_eq!(got, expected, "step {}: evicted blocks", step);
        for id in ids {
            self.uncache(*id);
            self.refs[id.index()] = 1;
        }
        self.stats.evictions += evicted as u64;
        self.peak = self.peak.max(self.used());
        Ok(())
    }

    fn drop_ref(&mut self, id: BlockId) {
        self.refs[id.index()] -= 1;
        // A cached block whose last reference goes is the most recently
        // released evictable block.
        if self.refs[id.index()] == 0 && self.keys[id.index()].is_some() {
            self.lru.push(id);
        }
    }

    /// What `free(ids)` must return: the whole call or nothing. The error
    /// names an offending id; the checks run one kind at a time, each over
    /// the whole list in order: out of range first, then not allocated (no
    /// reference at all), then held by sequences (a block no raw
    /// allocation holds), then over-freed (listed more times than it has
    /// references).
    fn expected_free(&self, ids: &[BlockId]) -> Result<(), FreeError> {
        if let Some(&id) = ids.iter().find(|id| id.index() >= self.num_blocks) {
            return Err(FreeError::OutOfRange {
                id,
                num_blocks: self.num_blocks,
            });
        }
        if let Some(&id) = ids.iter().find(|id| self.refs[id.index()] == 0) {
            return Err(FreeError::NotAllocated { id });
        }
        if let Some(&id) = ids
            .iter()
            .find(|id| !self.raw.iter().any(|h| h.contains(id)))
        {
            return Err(FreeError::HeldBySequence { id });
        }
        let mut listed: HashMap<BlockId, u32> = HashMap::new();
        for &id in ids {
            let times = listed.entry(id).or_insert(0);
            *times += 1;
            if *times > self.refs[id.index()] {
                return Err(FreeError::OverFreed { id });
            }
        }
        Ok(())
    }

    fn forget_raw(&mut self, ids: &[BlockId]) {
        for id in ids {
            for h in &mut self.raw {
                h.retain(|x| x != id);
            }
        }
        self.raw.retain(|h| !h.is_empty());
    }

    fn slot(&self, s: &SeqModel, pos: usize) -> Option<usize> {
        let bs = self.block_size;
        (pos < s.len).then(|| s.blocks[pos / bs].index() * bs + pos % bs)
    }

    fn release_retired(&mut self, i: usize) {
        // The caller has made the copy by now: its source may go.
        if let Some(id) = self.seqs[i].retired.take() {
            self.drop_ref(id);
        }
    }
}

/// Every getter of the pool and of every sequence against the model.
fn check_pool(
    step: usize,
    pool: &Arc<BlockPool>,
    seqs: &[Sequence],
    m: &PoolModel,
) -> Result<(), TestCaseError> {
    // The model's own bookkeeping: recount every reference it thinks exists.
    let mut counted = vec![0u32; m.num_blocks];
    for id in m.raw.iter().flatten() {
        counted[id.index()] += 1;
    }
    for s in &m.seqs {
        for id in s.blocks.iter().chain(&s.retired) {
            counted[id.index()] += 1;
        }
        prop_assert_eq!(
            s.blocks.len(),
            s.len.div_ceil(m.block_size),
            "step {}: model table size",
            step
        );
    }
    prop_assert_eq!(&counted, &m.refs, "step {}: model inconsistent", step);

    prop_assert_eq!(pool.num_blocks(), m.num_blocks, "step {}: num_blocks", step);
    prop_assert_eq!(pool.block_size(), m.block_size, "step {}: block_size", step);
    prop_assert_eq!(pool.used_blocks(), m.used(), "step {}: used_blocks", step);
    prop_assert_eq!(pool.free_blocks(), m.free(), "step {}: free_blocks", step);
    prop_assert_eq!(
        pool.peak_used_blocks(),
        m.peak,
        "step {}: peak_used_blocks",
        step
    );
    prop_assert_eq!(pool.is_closed(), m.closed, "step {}: is_closed", step);
    for (index, &refs) in m.refs.iter().enumerate() {
        let id = BlockId::new(index as u32);
        prop_assert_eq!(
            pool.ref_count(id),
            Some(refs as usize),
            "step {}: ref_count({})",
            step,
            id
        );
    }
    let cached = m.keys.iter().filter(|k| k.is_some()).count();
    prop_assert_eq!(pool.cached_blocks(), cached, "step {}: cached_blocks", step);
    prop_assert_eq!(
        pool.evictable_blocks(),
        m.lru.len(),
        "step {}: evictable_blocks",
        step
    );
    prop_assert_eq!(pool.prefix_stats(), m.stats, "step {}: prefix_stats", step);
    prop_assert_eq!(pool.ref_count(BlockId::new(m.num_blocks as u32)), None);
    prop_assert_eq!(pool.ref_count(BlockId::new(u32::MAX)), None);

    prop_assert_eq!(seqs.len(), m.seqs.len());
    for (i, (s, sm)) in seqs.iter().zip(&m.seqs).enumerate() {
        prop_assert_eq!(s.len(), sm.len, "step {}: seq {} len", step, i);
        prop_assert_eq!(
            s.is_empty(),
            sm.len == 0,
            "step {}: seq {} is_empty",
            step,
            i
        );
        prop_assert_eq!(
            s.blocks(),
            &sm.blocks[..],
            "step {}: seq {} blocks",
            step,
            i
        );
        prop_assert!(
            Arc::ptr_eq(s.pool(), pool),
            "step {}: seq {} names another pool",
            step,
            i
        );
    }
    Ok(())
}

/// An id that no pool here has, to tell what `try_alloc` appended from what
/// was in `out` before.
const SENTINEL: BlockId = BlockId::new(u32::MAX - 7);

/// One run of the pool property: the real pool and the sequences alive on
/// it, the model, and the step being checked.
struct PoolRun {
    pool: Arc<BlockPool>,
    seqs: Vec<Sequence>,
    m: PoolModel,
    /// The sequence the previous sequence operation used.
    last: usize,
    /// The operation being checked, from 1 (0 is the state before any).
    step: usize,
}

impl PoolRun {
    /// A pool with one empty sequence on it.
    fn new(num_blocks: usize, block_size: usize, shards: usize) -> Self {
        let pool = Arc::new(BlockPool::with_shards(num_blocks, block_size, shards));
        let mut m = PoolModel::new(num_blocks, block_size);
        let seqs = vec![Sequence::new(Arc::clone(&pool))];
        m.seqs.push(SeqModel::default());
        PoolRun {
            pool,
            seqs,
            m,
            last: 0,
            step: 0,
        }
    }

    /// Runs `op` on the pool and on the model, and compares what they
    /// returned.
    fn apply(&mut self, op: &PoolOp) -> Result<(), TestCaseError> {
        match op {
            PoolOp::Alloc {
                n,
                headroom,
                prefilled,
            } => self.alloc(*n, *headroom, *prefilled),
            PoolOp::FreeHeld { holding, count } => self.free_held(holding, count),
            PoolOp::FreeMixed(pieces) => self.free_mixed(pieces),
            PoolOp::Close => self.close(),
            PoolOp::NewSeq(tokens) => self.new_seq(*tokens),
            PoolOp::Append { seq, n, cow_api } => self.append(seq, *n, *cow_api),
            PoolOp::Truncate { seq, len } => self.truncate(seq, len),
            PoolOp::Fork(seq) => self.fork(seq),
            PoolOp::DropSeq(seq) => self.drop_seq(seq),
            PoolOp::Slot { seq, pos } => self.slot(seq, *pos),
            PoolOp::ExtendSlots { seq, start, end } => self.extend_slots(seq, *start, *end),
            PoolOp::Match { seq, family, len } => self.match_prefix(seq.as_ref(), *family, *len),
            PoolOp::Publish { seq, family, len } => self.publish(seq, *family, *len),
            PoolOp::Reset => self.reset(),
        }
    }

    /// Every getter against the model.
    fn check(&self) -> Result<(), TestCaseError> {
        check_pool(self.step, &self.pool, &self.seqs, &self.m)
    }

    /// The live sequence `seq` selects, which becomes the last one used;
    /// `None` if no sequence is alive.
    fn pick(&mut self, seq: &SeqSel) -> Option<usize> {
        if self.seqs.is_empty() {
            return None;
        }
        self.last = seq.resolve(self.seqs.len(), self.last);
        Some(self.last)
    }

    fn alloc(
        &mut self,
        n: Size,
        headroom: Option<Size>,
        prefilled: bool,
    ) -> Result<(), TestCaseError> {
        let step = self.step;
        let PoolRun { pool, m, .. } = self;
        let num_blocks = m.num_blocks;
        let free = m.free();
        let n = n.resolve(free, num_blocks);
        let headroom = headroom.map(|h| h.resolve(free.saturating_sub(n), num_blocks));
        let before: Vec<BlockId> = if prefilled {
            vec![SENTINEL]
        } else {
            Vec::new()
        };
        let mut out = before.clone();
        let (got, expected) = match headroom {
            None => (pool.try_alloc(n, &mut out), m.admission(n, 0)),
            Some(h) => (
                pool.try_alloc_with_headroom(n, h, &mut out),
                m.admission(n, h),
            ),
        };
        prop_assert_eq!(
            got,
            expected,
            "step {}: try_alloc({}, headroom {:?})",
            step,
            n,
            headroom
        );
        prop_assert_eq!(
            &out[..before.len()],
            &before[..],
            "step {}: out prefix",
            step
        );
        if expected.is_ok() {
            prop_assert_eq!(out.len(), before.len() + n, "step {}: ids appended", step);
            let fresh = out[before.len()..].to_vec();
            m.take_fresh(step, &fresh)?;
            if !fresh.is_empty() {
                m.raw.push(fresh);
            }
        } else {
            prop_assert_eq!(&out, &before, "step {}: out changed on error", step);
        }
        Ok(())
    }

    fn free_held(&mut self, holding: &Index, count: &Index) -> Result<(), TestCaseError> {
        let step = self.step;
        let PoolRun { pool, m, .. } = self;
        if m.raw.is_empty() {
            return Ok(());
        }
        let h = holding.index(m.raw.len());
        let k = count.index(m.raw[h].len() + 1);
        let ids = m.raw[h][..k].to_vec();
        prop_assert_eq!(m.expected_free(&ids), Ok(()), "test bug");
        prop_assert_eq!(pool.free(&ids), Ok(()), "step {}: free({:?})", step, ids);
        for &id in &ids {
            m.drop_ref(id);
        }
        m.forget_raw(&ids);
        Ok(())
    }

    fn free_mixed(&mut self, pieces: &[Piece]) -> Result<(), TestCaseError> {
        let step = self.step;
        let PoolRun { pool, m, .. } = self;
        let num_blocks = m.num_blocks;
        let held: Vec<BlockId> = m.raw.iter().flatten().copied().collect();
        let allocated: Vec<BlockId> = (0..num_blocks)
            .filter(|&b| m.refs[b] > 0)
            .map(|b| BlockId::new(b as u32))
            .collect();
        let unallocated: Vec<BlockId> = (0..num_blocks)
            .filter(|&b| m.refs[b] == 0)
            .map(|b| BlockId::new(b as u32))
            .collect();
        let pick =
            |from: &[BlockId], i: &Index| (!from.is_empty()).then(|| from[i.index(from.len())]);
        let mut ids: Vec<BlockId> = Vec::new();
        for p in pieces {
            let id = match p {
                Piece::Held(i) => pick(&held, i),
                Piece::Allocated(i) => pick(&allocated, i),
                Piece::Unallocated(i) => pick(&unallocated, i),
                Piece::Again => ids.last().copied(),
                Piece::OutOfRange(k) => Some(BlockId::new(
                    [num_blocks as u32, num_blocks as u32 + 1, u32::MAX][*k],
                )),
            };
            ids.extend(id);
        }
        // A block that sequences hold is refused (`HeldBySequence`): a
        // raw free never takes a sequence's reference.
        let expected = m.expected_free(&ids);
        prop_assert_eq!(pool.free(&ids), expected, "step {}: free({:?})", step, ids);
        if expected.is_ok() {
            for &id in &ids {
                m.drop_ref(id);
            }
            m.forget_raw(&ids);
        }
        Ok(())
    }

    fn close(&mut self) -> Result<(), TestCaseError> {
        let PoolRun { pool, m, .. } = self;
        pool.close();
        m.closed = true;
        Ok(())
    }

    fn new_seq(&mut self, tokens: Option<Size>) -> Result<(), TestCaseError> {
        let PoolRun { pool, seqs, m, .. } = self;
        let bs = m.block_size;
        let slots = m.num_blocks * m.block_size;
        let seq = match tokens {
            None => Sequence::new(Arc::clone(pool)),
            // Up to `usize::MAX`: only a hint, capped at the pool.
            Some(t) => Sequence::with_capacity(Arc::clone(pool), t.resolve(m.free() * bs, slots)),
        };
        seqs.push(seq);
        m.seqs.push(SeqModel::default());
        Ok(())
    }

    fn append(&mut self, seq: &SeqSel, n: Size, cow_api: bool) -> Result<(), TestCaseError> {
        let step = self.step;
        let Some(i) = self.pick(seq) else {
            return Ok(());
        };
        let PoolRun { seqs, m, .. } = self;
        let bs = m.block_size;
        let slots = m.num_blocks * m.block_size;
        let old = m.seqs[i].clone();
        let room = old.blocks.len() * bs - old.len;
        let n = n.resolve(room + m.free() * bs, slots);
        let range = old.len..old.len.wrapping_add(n);
        // A plain append that needs a copy-on-write panics (naming
        // `try_append_cow`) before changing anything.
        // (A cached tail needs a copy too, shared or not.)
        let tail_block = old.blocks.get(old.len / bs).copied();
        let needs_copy = |m: &PoolModel| {
            old.len % bs != 0
                && tail_block.is_some_and(|b| m.refs[b.index()] > 1 || m.keys[b.index()].is_some())
        };
        let shared_tail = n > 0 && needs_copy(m);
        if !cow_api && shared_tail {
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| seqs[i].try_append(n)));
            prop_assert!(r.is_err(), "step {}: try_append into a shared tail", step);
            return Ok(());
        }
        let (got, copy) = if cow_api {
            match seqs[i].try_append_cow(n) {
                Ok((r, c)) => (Ok(r), c),
                Err(e) => (Err(e), None),
            }
        } else {
            (seqs[i].try_append(n), None)
        };
        if n == 0 {
            prop_assert_eq!(got, Ok(range), "step {}: append(0)", step);
            prop_assert_eq!(copy, None);
            return Ok(());
        }
        let new_blocks: u128 = if n <= room {
            0
        } else {
            ((n - room) as u128).div_ceil(bs as u128)
        };
        let tail = old.len % bs;
        let cow = needs_copy(m);
        let total = new_blocks + u128::from(cow);
        let total = usize::try_from(total).unwrap_or(usize::MAX);
        // Nothing new needed: nothing to admit, so it works on a
        // closed pool too (workers can finish their blocks).
        let expected = if total == 0 {
            Ok(())
        } else {
            let new_blocks = usize::try_from(new_blocks).unwrap_or(usize::MAX);
            m.seq_admission(i, total, new_blocks, 0)
        };
        match (got, expected) {
            (Ok(r), Ok(())) => {
                prop_assert_eq!(r, range, "step {}: append({}) range", step, n);
                let table = seqs[i].blocks().to_vec();
                let base = old.blocks.len();
                let keep = if cow { base - 1 } else { base };
                prop_assert_eq!(table.len(), base + total - usize::from(cow));
                prop_assert_eq!(
                    &table[..keep],
                    &old.blocks[..keep],
                    "step {}: kept blocks",
                    step
                );
                m.take_fresh(step, &table[keep..])?;
                m.release_retired(i);
                let expected_copy = cow.then(|| BlockCopy {
                    src: old.blocks[base - 1],
                    dst: table[base - 1],
                    tokens: tail,
                });
                let sm = &mut m.seqs[i];
                if cow {
                    sm.retired = Some(old.blocks[base - 1]);
                }
                if cow_api {
                    prop_assert_eq!(copy, expected_copy, "step {}: copy-on-write", step);
                }
                sm.blocks = table;
                sm.len += n;
            }
            (Err(e), Err(x)) => {
                prop_assert_eq!(e, x, "step {}: append({})", step, n);
                prop_assert_eq!(copy, None);
            }
            (got, x) => prop_assert!(
                false,
                "step {}: append({}) returned {:?}, model says {:?}",
                step,
                n,
                got,
                x
            ),
        }
        Ok(())
    }

    fn truncate(&mut self, seq: &SeqSel, len: &Cut) -> Result<(), TestCaseError> {
        let step = self.step;
        let Some(i) = self.pick(seq) else {
            return Ok(());
        };
        let PoolRun { seqs, m, .. } = self;
        let bs = m.block_size;
        let slots = m.num_blocks * m.block_size;
        let sm = &m.seqs[i];
        let k = match len {
            Cut::To(size) => size.resolve(sm.len, slots),
            Cut::IntoShared(b, t) => {
                let shared: Vec<usize> = (0..sm.blocks.len())
                    .filter(|&k| m.refs[sm.blocks[k].index()] > 1)
                    .collect();
                if shared.is_empty() || bs == 1 {
                    sm.len.saturating_sub(1)
                } else {
                    shared[b.index(shared.len())] * bs + 1 + t.index(bs - 1)
                }
            }
        };
        let freed = seqs[i].truncate(k);
        if k >= m.seqs[i].len {
            prop_assert_eq!(freed, 0, "step {}: truncate({}) no-op", step, k);
        } else {
            m.release_retired(i);
            let keep = k.div_ceil(bs);
            let gone: Vec<BlockId> = m.seqs[i].blocks.drain(keep..).collect();
            prop_assert_eq!(freed, gone.len(), "step {}: truncate({})", step, k);
            // Last block first.
            for id in gone.into_iter().rev() {
                m.drop_ref(id);
            }
            m.seqs[i].len = k;
            // A cached tail held alone loses its key.
            if k % bs != 0 {
                let tail = m.seqs[i].blocks[k / bs];
                if m.refs[tail.index()] == 1 {
                    m.uncache(tail);
                }
            }
        }
        Ok(())
    }

    fn fork(&mut self, seq: &SeqSel) -> Result<(), TestCaseError> {
        let step = self.step;
        let Some(i) = self.pick(seq) else {
            return Ok(());
        };
        let PoolRun { seqs, m, .. } = self;
        let bs = m.block_size;
        let parent = m.seqs[i].clone();
        let (full, tail) = (parent.len / bs, parent.len % bs);
        let expected = if tail != 0 {
            m.seq_admission(i, 1, 1, 0)
        } else {
            Ok(())
        };
        match (seqs[i].try_fork(), expected) {
            (Ok((child, copy)), Ok(())) => {
                prop_assert_eq!(child.len(), parent.len, "step {}: child len", step);
                let table = child.blocks().to_vec();
                prop_assert_eq!(
                    table.len(),
                    parent.blocks.len(),
                    "step {}: child table",
                    step
                );
                prop_assert_eq!(
                    &table[..full],
                    &parent.blocks[..full],
                    "step {}: shared",
                    step
                );
                let expected_copy = if tail != 0 {
                    m.take_fresh(step, &table[full..])?;
                    Some(BlockCopy {
                        src: parent.blocks[full],
                        dst: table[full],
                        tokens: tail,
                    })
                } else {
                    None
                };
                prop_assert_eq!(copy, expected_copy, "step {}: fork copy", step);
                for &id in &table[..full] {
                    m.refs[id.index()] += 1;
                }
                seqs.push(child);
                m.seqs.push(SeqModel {
                    len: parent.len,
                    blocks: table,
                    retired: None,
                });
            }
            (Err(e), Err(x)) => prop_assert_eq!(e, x, "step {}: fork", step),
            (got, x) => prop_assert!(
                false,
                "step {}: fork returned {:?}, model says {:?}",
                step,
                got.map(|(c, copy)| (c.len(), copy)),
                x
            ),
        }
        Ok(())
    }

    fn drop_seq(&mut self, seq: &SeqSel) -> Result<(), TestCaseError> {
        let Some(i) = self.pick(seq) else {
            return Ok(());
        };
        let PoolRun { seqs, m, .. } = self;
        drop(seqs.remove(i));
        let sm = m.seqs.remove(i);
        // The retired block first, then the table, last block first.
        for id in sm.retired.into_iter().chain(sm.blocks.into_iter().rev()) {
            m.drop_ref(id);
        }
        Ok(())
    }

    fn match_prefix(
        &mut self,
        seq: Option<&SeqSel>,
        family: u8,
        len: usize,
    ) -> Result<(), TestCaseError> {
        let step = self.step;
        let i = match seq {
            None => {
                self.seqs.push(Sequence::new(Arc::clone(&self.pool)));
                self.m.seqs.push(SeqModel::default());
                self.last = self.seqs.len() - 1;
                self.last
            }
            Some(sel) => match self.pick(sel) {
                Some(i) => i,
                None => return Ok(()),
            },
        };
        let PoolRun { seqs, m, pool, .. } = self;
        let numbers = family_keys(family, len);
        let keys: Vec<BlockHash> = numbers.iter().map(|&n| model_key(n)).collect();
        // A peek counts the cached prefix, whatever the capacity, and
        // changes nothing the model tracks (the check after every step
        // compares the statistics and counts, later evictions the order).
        let cached = numbers
            .iter()
            .take_while(|n| m.index.contains_key(n))
            .count();
        prop_assert_eq!(
            pool.peek_prefix(&keys),
            cached,
            "step {}: peek_prefix({:?})",
            step,
            numbers
        );
        let got = seqs[i].try_match_prefix(&keys);
        let sm = &m.seqs[i];
        let acts = sm.len == 0 && sm.blocks.is_empty() && sm.retired.is_none() && !keys.is_empty();
        let mut expected = 0;
        if acts {
            for n in &numbers {
                let Some(&b) = m.index.get(n) else {
                    break;
                };
                if m.refs[b.index()] == 0 {
                    // A revival takes capacity.
                    if m.admission(1, 0).is_err() {
                        break;
                    }
                    m.lru.retain(|&x| x != b);
                }
                m.refs[b.index()] += 1;
                m.peak = m.peak.max(m.used());
                m.seqs[i].blocks.push(b);
                expected += 1;
            }
            m.seqs[i].len = expected * m.block_size;
            m.stats.queried_blocks += keys.len() as u64;
            m.stats.hit_blocks += expected as u64;
        }
        prop_assert_eq!(
            got,
            expected,
            "step {}: try_match_prefix({:?})",
            step,
            numbers
        );
        Ok(())
    }

    fn publish(&mut self, seq: &SeqSel, family: u8, len: usize) -> Result<(), TestCaseError> {
        let step = self.step;
        let Some(i) = self.pick(seq) else {
            return Ok(());
        };
        let PoolRun { seqs, m, .. } = self;
        let numbers = family_keys(family, len);
        let keys: Vec<BlockHash> = numbers.iter().map(|&n| model_key(n)).collect();
        let got = seqs[i].publish(&keys);
        let full = (m.seqs[i].len / m.block_size).min(numbers.len());
        let mut expected = 0;
        for (k, &n) in numbers.iter().enumerate().take(full) {
            let b = m.seqs[i].blocks[k];
            if m.keys[b.index()].is_none() && !m.index.contains_key(&n) {
                m.keys[b.index()] = Some(n);
                m.index.insert(n, b);
                expected += 1;
            }
        }
        prop_assert_eq!(got, expected, "step {}: publish({:?})", step, numbers);
        Ok(())
    }

    fn reset(&mut self) -> Result<(), TestCaseError> {
        let step = self.step;
        let PoolRun { pool, m, .. } = self;
        let got = pool.reset_prefix_cache();
        let gone = std::mem::take(&mut m.lru);
        for &b in &gone {
            m.uncache(b);
        }
        prop_assert_eq!(got, gone.len(), "step {}: reset_prefix_cache", step);
        Ok(())
    }

    fn slot(&mut self, seq: &SeqSel, pos: Size) -> Result<(), TestCaseError> {
        let step = self.step;
        let Some(i) = self.pick(seq) else {
            return Ok(());
        };
        let PoolRun { seqs, m, .. } = self;
        let slots = m.num_blocks * m.block_size;
        let p = pos.resolve(m.seqs[i].len, slots);
        prop_assert_eq!(
            seqs[i].slot(p),
            m.slot(&m.seqs[i], p),
            "step {}: slot({})",
            step,
            p
        );
        Ok(())
    }

    fn extend_slots(&mut self, seq: &SeqSel, start: Size, end: Size) -> Result<(), TestCaseError> {
        let step = self.step;
        let Some(i) = self.pick(seq) else {
            return Ok(());
        };
        let PoolRun { seqs, m, .. } = self;
        let slots = m.num_blocks * m.block_size;
        let len = m.seqs[i].len;
        let positions: Range<usize> = start.resolve(len, slots)..end.resolve(len, slots);
        let mut out = vec![usize::MAX];
        let got = seqs[i].extend_slots(positions.clone(), &mut out);
        if positions.is_empty() {
            prop_assert_eq!(got, Ok(()), "step {}: extend_slots({:?})", step, positions);
            prop_assert_eq!(&out, &[usize::MAX]);
        } else if positions.end > len {
            prop_assert_eq!(
                got,
                Err(PositionError {
                    position: positions.end - 1,
                    len
                }),
                "step {}: extend_slots({:?})",
                step,
                positions
            );
            prop_assert_eq!(&out, &[usize::MAX], "step {}: out changed on error", step);
        } else {
            prop_assert_eq!(got, Ok(()), "step {}: extend_slots({:?})", step, positions);
            let mut expected = vec![usize::MAX];
            expected.extend(positions.clone().map(|p| m.slot(&m.seqs[i], p).unwrap()));
            prop_assert_eq!(
                &out,
                &expected,
                "step {}: extend_slots({:?})",
                step,
                positions
            );
        }
        Ok(())
    }
}

fn run_pool(
    num_blocks: usize,
    block_size: usize,
    shards: usize,
    ops: &[PoolOp],
) -> Result<(), TestCaseError> {
    let mut run = PoolRun::new(num_blocks, block_size, shards);
    run.check()?;
    for (step, op) in ops.iter().enumerate() {
        run.step = step + 1;
        run.apply(op)?;
        run.check()?;
    }
    let PoolRun { pool, seqs, m, .. } = run;

    // Conservation: once every sequence is dropped and every raw allocation
    // freed, every block is free again, with no reference left.
    drop(seqs);
    let held: Vec<BlockId> = m.raw.iter().flatten().copied().collect();
    prop_assert_eq!(pool.free(&held), Ok(()));
    prop_assert_eq!(pool.used_blocks(), 0, "blocks leaked");
    prop_assert_eq!(pool.free_blocks(), num_blocks);
    for b in 0..num_blocks {
        prop_assert_eq!(pool.ref_count(BlockId::new(b as u32)), Some(0));
    }
    prop_assert!(pool.peak_used_blocks() <= num_blocks);
    // The free list holds every block exactly once (if the pool is open).
    if !m.closed {
        let mut all = Vec::new();
        prop_assert_eq!(pool.try_alloc(num_blocks, &mut all), Ok(()));
        all.sort();
        all.dedup();
        prop_assert_eq!(
            all.len(),
            num_blocks,
            "free list lost or duplicated a block"
        );
        pool.free(&all).unwrap();
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// `BlockPool` (raw allocations, good and bad frees) and `Sequence`
    /// (append, copy-on-write, truncate, fork, drop, slot lookups) agree with
    /// the sequential model after every operation, whether the free list
    /// is one shard or several (more shards than blocks included).
    #[test]
    fn pool_and_sequences_follow_the_model(
        (num_blocks, block_size) in pool_shape(),
        shards in prop_oneof![Just(1usize), 2usize..=9],
        ops in prop::collection::vec(pool_op(), 1..80),
    ) {
        run_pool(num_blocks, block_size, shards, &ops)?;
    }
}
