//! [`WaitQueue`]: the FIFO of waiters of one allocator, and the grant loop
//! that hands released units to them in order.
//!
//! Everything here runs under the queue's mutex, except two things that
//! the lock-free paths read or run: [`WaitQueue::owed`] (one load, what the
//! pending waiters are owed; 0 when nobody waits) and
//! [`WaitQueue::notify`] (that load after every release, and the lock only
//! when someone waits).
//!
//! No code of the caller's runs under the lock: a step that grants or
//! closes counts every grant and publishes `owed` under it, moves the
//! wakers of the entries it settled into a batch ([`Wakes`]), and wakes
//! them once every lock holder lets go of the lock through
//! [`WaitQueue::unlock`]; a waker it replaced or removed is dropped then
//! too. So a waker may panic or poll inline: the queue is consistent when
//! it runs, and a panic leaves nothing taken for an entry that still looks
//! pending. A waker's panic is caught until every other waker of the
//! batch has run, and then resumed: an entry settled beside it is woken
//! all the same.

use std::collections::VecDeque;
use std::task::Waker;

use crate::error::ReserveError;
use crate::sync::{AtomicUsize, CachePadded, Condvar, Faults, Mutex, MutexGuard, Ordering};

use super::Units;

/// The waiters of one allocator, in arrival order.
pub(crate) struct WaitQueue {
    /// The words the lock-free paths read, in their own cache line, written
    /// only under the lock (by waiters, cancellations, grants and `close`),
    /// never by the `try_*` paths.
    published: CachePadded<Published>,
    /// The queue itself.
    inner: Mutex<Inner>,
    /// Where blocking waiters sleep; notified on every grant and on close.
    sleepers: Condvar,
    /// The allocator's capacity: `owed` never exceeds it (at the capacity
    /// no new admission fits, so there is no need to count further).
    capacity: usize,
    /// Loom's negative controls (none outside them).
    faults: Faults,
}

/// The two words of the queue that are read without the lock.
struct Published {
    /// What the pending waiters are owed ([`Inner::owed`]: at least 1 while
    /// any is pending), or 0 when none is: the units a new `try_*`
    /// admission must leave free, and the word a release checks to know
    /// whether to run the grant loop.
    owed: AtomicUsize,
    /// The number of entries (pending, or granted and not yet collected by
    /// their waiter): [`WaitQueue::waiters`].
    len: AtomicUsize,
}

/// The queue under the lock: entries in ticket order, the granted ones
/// first (grants go in order, and removals keep the order).
pub(crate) struct Inner {
    entries: VecDeque<Entry>,
    /// How many entries at the front are granted: the head is
    /// `entries[granted]`.
    granted: usize,
    /// The next ticket to hand out.
    next: u64,
    /// Set by `close`: no entry is granted any more, and pending ones end
    /// with `Closed`.
    closed: bool,
    /// The sum of the pending entries' `n` (saturating).
    pending: usize,
    /// What the pending entries need, granted in arrival order with each
    /// one's headroom free at its grant: the largest, over the pending
    /// entries, of the `n`s up to and including it plus its headroom,
    /// capped at the capacity; 0 when none is pending (or after `close`).
    /// A new admission that leaves this much free delays no waiter.
    owed: usize,
    /// The wakes to run, and the wakers to drop, once the lock is let go
    /// of ([`WaitQueue::unlock`]).
    wakes: Wakes,
}

impl Inner {
    /// Keeps a removed or replaced `wake` to be dropped after the lock:
    /// dropping a waker can drop a task, and with it other futures of this
    /// allocator, whose drop takes the lock.
    fn retire(&mut self, wake: Wake) {
        if let Wake::Task(waker) = wake {
            self.wakes.retired.push(waker);
        }
    }
}

/// The most task wakers one batch holds; more are moved out and woken in
/// further batches.
const WAKE_BATCH: usize = 32;

/// The wakes a step under the lock leaves for after it: the wakers of the
/// entries it settled (granted, or closed), moved out of them, in ticket
/// order, and the wakers it replaced or removed, to be dropped. A fixed
/// array, so that waking allocates nothing.
pub(crate) struct Wakes {
    /// `tasks[done..len]` are still to be woken: `(ticket, waker)`.
    tasks: [Option<(u64, Waker)>; WAKE_BATCH],
    done: usize,
    len: usize,
    /// More settled entries await their wake than the array holds.
    more: bool,
    /// Wakers to drop (at most one per step: the one a removal or a new
    /// poll's waker replaced; room for a few).
    retired: Retired,
    /// Under loom's `wake_before_count` only: the head woken before its
    /// grant is counted (the count follows the wake).
    uncounted: Option<u64>,
}

/// A few wakers to drop after the lock.
struct Retired([Option<Waker>; 4]);

impl Retired {
    fn push(&mut self, waker: Waker) {
        match self.0.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(waker),
            // Every step drains these as it lets go of the lock, so this
            // does not happen; dropping under the lock would be the
            // fallback.
            None => drop(waker),
        }
    }
}

impl Wakes {
    fn new() -> Wakes {
        Wakes {
            tasks: std::array::from_fn(|_| None),
            done: 0,
            len: 0,
            more: false,
            retired: Retired(std::array::from_fn(|_| None)),
            uncounted: None,
        }
    }

    fn is_full(&self) -> bool {
        self.len == WAKE_BATCH
    }

    fn push(&mut self, ticket: u64, waker: Waker) {
        self.tasks[self.len] = Some((ticket, waker));
        self.len += 1;
    }

    /// Whether anything is left to wake or to drop.
    fn is_empty(&self) -> bool {
        self.done == self.len && !self.more && self.retired.0.iter().all(Option::is_none)
    }
}

/// One waiter.
struct Entry {
    ticket: u64,
    n: usize,
    headroom: usize,
    wake: Wake,
    /// Whether the entry's outcome (its grant, or `close`) has been
    /// signalled: its waker moved into a batch of [`Wakes`], or the
    /// sleepers notified.
    signalled: bool,
}

/// How to wake a waiter.
pub(crate) enum Wake {
    /// An async waiter: its task's waker, refreshed on every poll.
    Task(Waker),
    /// A blocking waiter, sleeping on the queue's condition variable.
    Thread,
    /// An async waiter whose waker was moved into a batch of [`Wakes`]
    /// (and is called there, whatever other wakers do).
    Moved,
}

/// Where a queued waiter stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Granted: the units are the waiter's, and its entry is gone.
    Granted,
    /// The allocator was closed before it was granted; its entry is gone.
    Closed,
    /// Still waiting.
    Waiting,
}

impl WaitQueue {
    /// An empty queue for an allocator of `capacity` units, carrying
    /// `faults`.
    pub(crate) fn new(capacity: usize, faults: Faults) -> WaitQueue {
        WaitQueue {
            published: CachePadded::new(Published {
                owed: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
            }),
            inner: Mutex::new(Inner {
                entries: VecDeque::new(),
                granted: 0,
                next: 0,
                closed: false,
                pending: 0,
                owed: 0,
                wakes: Wakes::new(),
            }),
            sleepers: Condvar::new(),
            capacity,
            faults,
        }
    }

    /// What the pending waiters are owed, 0 when nobody waits: the one load
    /// a `try_*` call adds, and what a new waiter reads to know whether it
    /// must queue behind someone.
    #[inline]
    pub(crate) fn owed(&self) -> usize {
        // Relaxed: a `try_*` call that reads a stale 0 (or a stale smaller
        // value) is ordered before the enqueue it missed (it took what was
        // free before that waiter queued); one that happens-after an
        // enqueue reads it by coherence. Nothing is handed out on the
        // strength of this load alone: the admission CAS decides.
        self.published.owed.load(Ordering::Relaxed)
    }

    /// How many waiters are queued (pending, or granted and not yet
    /// collected).
    pub(crate) fn waiters(&self) -> usize {
        // Relaxed: a snapshot for metrics and tests; it orders nothing.
        self.published.len.load(Ordering::Relaxed)
    }

    /// The queue's lock. Let go of it with [`unlock`](Self::unlock), which
    /// runs the wakes the step left. No caller code runs under it, so it
    /// is poisoned only by a bug of the queue's own; a poisoned lock is
    /// taken as it is.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Lets go of the lock, then wakes the entries the steps under it
    /// settled and drops the wakers they let go of. Every holder of the
    /// lock lets go of it this way (or by sleeping on the condition
    /// variable, after steps that leave nothing to wake).
    ///
    /// # Panics
    ///
    /// If a waker panics, once every other waker has run. The queue is
    /// consistent then (see the module doc). Not while the thread unwinds
    /// already (a drop during unwinding: of a future or a reservation
    /// whose task panicked), where a second panic would abort the process:
    /// the waker's panic is dropped then.
    pub(crate) fn unlock(&self, mut inner: MutexGuard<'_, Inner>) {
        if inner.wakes.is_empty() {
            return;
        }
        let wakes = std::mem::replace(&mut inner.wakes, Wakes::new());
        drop(inner);
        Batch { queue: self, wakes }.run();
    }

    /// Whether a step left wakes to run (then the caller lets go of the
    /// lock before it looks again, see [`unlock`](Self::unlock)).
    pub(crate) fn has_wakes(&self, inner: &Inner) -> bool {
        !inner.wakes.is_empty()
    }

    /// Sleeps on the queue's condition variable (blocking waiters only).
    pub(crate) fn sleep<'a>(
        &'a self,
        guard: MutexGuard<'a, Inner>,
        timeout: Option<std::time::Duration>,
    ) -> MutexGuard<'a, Inner> {
        match timeout {
            None => self
                .sleepers
                .wait(guard)
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
            Some(timeout) => {
                self.sleepers
                    .wait_timeout(guard, timeout)
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .0
            }
        }
    }

    /// Queues a waiter for `n` units (`n >= 1`) with `headroom` behind
    /// every other, and returns its ticket, or `Closed`. Nothing is woken:
    /// the caller records the ticket (so that a panic from here on leaves
    /// the queue through the caller's drop) and then calls
    /// [`first_look`](Self::first_look).
    ///
    /// The caller has checked that `n + headroom` fits the capacity.
    pub(crate) fn enqueue(
        &self,
        inner: &mut Inner,
        n: usize,
        headroom: usize,
        wake: Wake,
    ) -> Result<u64, ReserveError> {
        debug_assert!(n > 0, "a waiter for nothing is granted without waiting");
        if inner.closed {
            return Err(ReserveError::Closed);
        }
        let ticket = inner.next;
        inner.next += 1;
        inner.entries.push_back(Entry {
            ticket,
            n,
            headroom,
            wake,
            signalled: false,
        });
        // The newcomer's need: everything pending before it, its own `n`,
        // and its headroom free besides.
        inner.pending = inner.pending.saturating_add(n);
        if self.faults.owed_without_headroom() {
            self.recount(inner);
        } else {
            let need = inner.pending.saturating_add(headroom).min(self.capacity);
            inner.owed = inner.owed.max(need);
        }
        self.publish(inner);
        Ok(ticket)
    }

    /// A newly queued waiter's first look: the hand-shake with the
    /// releases, then the grant loop. The caller then asks for its
    /// [`status`](Self::status), after letting go of the lock if the loop
    /// left wakes to run.
    pub(crate) fn first_look<U: Units + ?Sized>(&self, inner: &mut Inner, units: &U) {
        if self.faults.late_enqueue() {
            // The fault: no attempt after the enqueue, so a release that
            // came between the caller's failed attempt and the enqueue (and
            // found nobody to wake) is lost.
            return;
        }
        // The waiter's half of the hand-shake with `notify`: a
        // read-modify-write that changes nothing (`AcqRel`) on every word a
        // release writes, after the `owed` store of `enqueue`. A release is
        // also a read-modify-write (`AcqRel`) on one of those words, so the
        // two are ordered in that word's modification order. If ours comes
        // first, the release reads from it (through the word's release
        // sequence) and so sees the `owed` store when it loads `owed` next:
        // it runs the grant loop. If the release comes first, ours reads
        // from it, and the grant loop's reads of the allocator below see
        // the released units. So no release is missed by both. (No `SeqCst`
        // fence on the release path: on x86 the release's locked
        // instruction already orders it, and a fence would cost the fast
        // path a full barrier per release.)
        if !self.faults.unfenced_wait() {
            units.sync_with_releases();
        }
        self.grant(inner, units);
    }

    /// Where the waiter with `ticket` stands; a granted or closed entry is
    /// removed (the waiter has collected it).
    pub(crate) fn status(&self, inner: &mut Inner, ticket: u64) -> Status {
        let index = Self::index(inner, ticket);
        if index < inner.granted {
            let entry = inner.entries.remove(index).expect("indexed entry");
            inner.retire(entry.wake);
            inner.granted -= 1;
            self.publish(inner);
            Status::Granted
        } else if inner.closed {
            let entry = inner.entries.remove(index).expect("indexed entry");
            inner.retire(entry.wake);
            self.publish(inner);
            Status::Closed
        } else {
            Status::Waiting
        }
    }

    /// Replaces the waker of the pending waiter with `ticket` by `waker`
    /// (cloned by the caller before the lock), unless the stored one would
    /// wake the same task; the one let go of is dropped after the lock.
    pub(crate) fn set_waker(&self, inner: &mut Inner, ticket: u64, waker: Waker) {
        let index = Self::index(inner, ticket);
        let old = match &mut inner.entries[index].wake {
            Wake::Task(stored) if stored.will_wake(&waker) => Wake::Task(waker),
            wake => std::mem::replace(wake, Wake::Task(waker)),
        };
        inner.retire(old);
    }

    /// Keeps `waker` to be dropped after the lock.
    pub(crate) fn retire(&self, inner: &mut Inner, waker: Waker) {
        inner.retire(Wake::Task(waker));
    }

    /// Gives back `n` units that a waiter collected (its entry gone) but
    /// whose call unwinds before handing them to its caller, and hands them
    /// on to the waiters, as a release would.
    pub(crate) fn hand_back<U: Units + ?Sized>(&self, inner: &mut Inner, units: &U, n: usize) {
        units.give_back(n);
        self.grant(inner, units);
    }

    /// Removes the waiter with `ticket` (a dropped future, a timed-out
    /// blocking call, a waiter whose call unwinds). A granted waiter gives
    /// its units back and hands them on; a pending one lets the waiters
    /// behind it be re-checked (they may fit where it did not, or owe less
    /// now). Either way the grant loop runs.
    pub(crate) fn cancel<U: Units + ?Sized>(&self, inner: &mut Inner, units: &U, ticket: u64) {
        let index = Self::index(inner, ticket);
        let entry = inner.entries.remove(index).expect("indexed entry");
        inner.retire(entry.wake);
        if index < inner.granted {
            inner.granted -= 1;
            // Given back under the lock, without `notify` (which would take
            // the lock again): the grant loop below hands the units on.
            units.give_back(entry.n);
            if self.faults.cancel_keeps_grant() {
                self.publish(inner);
                return;
            }
        } else {
            inner.pending = inner.pending.saturating_sub(entry.n);
            self.recount(inner);
            if self.faults.cancel_no_recheck() {
                self.publish(inner);
                return;
            }
        }
        self.grant(inner, units);
    }

    /// Runs the grant loop if anyone waits: called after every release of
    /// units, lock-free unless someone waits.
    #[inline]
    pub(crate) fn notify<U: Units + ?Sized>(&self, units: &U) {
        // Relaxed: the caller's release was an `AcqRel` read-modify-write
        // on a word that every enqueue also writes (after its `owed` store)
        // with one; whichever comes second in that word's modification
        // order reads from the first, which is what the pairing needs (see
        // `first_look`). So a 0 read here means that every waiter queued since
        // has tried after this release, and seen it.
        if self.published.owed.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut inner = self.lock();
        self.grant(&mut inner, units);
        self.unlock(inner);
    }

    /// Closes the queue: pending waiters are woken and end with `Closed`;
    /// later enqueues fail with `Closed`. The allocator has set its own
    /// closed flag first, so no grant can succeed any more.
    pub(crate) fn close(&self) {
        let mut inner = self.lock();
        self.close_locked(&mut inner);
        self.unlock(inner);
    }

    fn close_locked(&self, inner: &mut Inner) {
        if inner.closed {
            return;
        }
        inner.closed = true;
        inner.pending = 0;
        inner.owed = 0;
        self.publish(inner);
        if !self.faults.silent_close() {
            self.signal(inner);
        }
    }

    /// The grant loop: while the head's `n` (with its headroom free besides)
    /// can be taken, take it on the head's behalf and count it granted;
    /// stop at the first head that does not fit, so that no waiter passes
    /// an earlier one. Then publish, and wake those granted.
    fn grant<U: Units + ?Sized>(&self, inner: &mut Inner, units: &U) {
        let before = inner.granted;
        while !inner.closed {
            let Some(head) = inner.entries.get(inner.granted) else {
                break;
            };
            match units.take(head.n, head.headroom) {
                Ok(()) => {
                    if self.faults.wake_before_count() && matches!(head.wake, Wake::Task(_)) {
                        // The fault: the head is woken before its grant is
                        // counted (the count follows its wake, see
                        // `Batch::run`); it stays pending meanwhile.
                        let ticket = head.ticket;
                        let head = &mut inner.entries[inner.granted];
                        if let Wake::Task(waker) = std::mem::replace(&mut head.wake, Wake::Moved) {
                            head.signalled = true;
                            inner.wakes.push(ticket, waker);
                            inner.wakes.uncounted = Some(ticket);
                        }
                        break;
                    }
                    inner.pending = inner.pending.saturating_sub(head.n);
                    inner.granted += 1;
                }
                // `close_locked` publishes and wakes everyone.
                Err(ReserveError::Closed) => return self.close_locked(inner),
                Err(_) => break,
            }
        }
        if inner.granted != before {
            self.recount(inner);
        }
        self.publish(inner);
        self.signal(inner);
    }

    /// Signals every entry whose outcome has not been signalled yet: the
    /// granted ones, and after `close` every one. The blocking waiters with
    /// one `notify_all` (which runs no caller code); the tasks' wakers are
    /// moved into the batch that [`unlock`](Self::unlock) wakes, up to its
    /// size (then `more` says that the batch must look again).
    fn signal(&self, inner: &mut Inner) {
        let end = if inner.closed {
            inner.entries.len()
        } else {
            inner.granted
        };
        let Inner { entries, wakes, .. } = inner;
        let mut threads = false;
        for entry in entries.range_mut(..end) {
            if entry.signalled {
                continue;
            }
            match entry.wake {
                Wake::Thread => {
                    entry.signalled = true;
                    threads = true;
                }
                Wake::Task(_) if wakes.is_full() => wakes.more = true,
                Wake::Task(_) => {
                    if let Wake::Task(waker) = std::mem::replace(&mut entry.wake, Wake::Moved) {
                        entry.signalled = true;
                        wakes.push(entry.ticket, waker);
                    }
                }
                // Moved into a batch, where it is called: signalled.
                Wake::Moved => entry.signalled = true,
            }
        }
        if threads {
            self.sleepers.notify_all();
        }
    }

    /// Counts the grant of the head with `ticket` after its wake (the
    /// `wake_before_count` fault only).
    fn count_late(&self, inner: &mut Inner, ticket: u64) {
        if let Ok(index) = Self::search(inner, ticket) {
            if index == inner.granted {
                let n = inner.entries[index].n;
                inner.pending = inner.pending.saturating_sub(n);
                inner.granted += 1;
                self.recount(inner);
                self.publish(inner);
            }
        }
    }

    /// Recomputes [`Inner::owed`] from the pending entries, after a grant
    /// or a removal: the scan stops once the need reaches the capacity.
    fn recount(&self, inner: &mut Inner) {
        if inner.closed {
            // Nobody is pending after `close`, whatever entries are left
            // to collect their `Closed`.
            inner.owed = 0;
            return;
        }
        if self.faults.owed_without_headroom() {
            // The fault: the head's `n` alone.
            inner.owed = inner.entries.get(inner.granted).map_or(0, |head| head.n);
            return;
        }
        let (mut sum, mut need) = (0usize, 0usize);
        for entry in inner.entries.range(inner.granted..) {
            sum = sum.saturating_add(entry.n);
            need = need.max(sum.saturating_add(entry.headroom));
            if need >= self.capacity {
                need = self.capacity;
                break;
            }
        }
        inner.owed = need;
    }

    /// Publishes what the pending waiters are owed and the entry count for
    /// the lock-free readers.
    fn publish(&self, inner: &Inner) {
        // Relaxed (both): written only under the lock, so the lock orders
        // the writers; for `owed`, the readers that must see a new waiter
        // (a releaser's `notify`) are ordered by the read-modify-writes of
        // the hand-shake (see `first_look`), and `len` is a snapshot for
        // metrics.
        self.published.owed.store(inner.owed, Ordering::Relaxed);
        self.published
            .len
            .store(inner.entries.len(), Ordering::Relaxed);
    }

    /// The index of the entry with `ticket` (entries are in ticket order).
    ///
    /// # Panics
    ///
    /// If there is none: a waiter's entry stays until that waiter collects
    /// or cancels it.
    fn index(inner: &Inner, ticket: u64) -> usize {
        Self::search(inner, ticket).expect("a waiter's entry stays queued until it is collected")
    }

    /// Where the entry with `ticket` is, if it is still queued.
    fn search(inner: &Inner, ticket: u64) -> Result<usize, usize> {
        inner
            .entries
            .binary_search_by_key(&ticket, |entry| entry.ticket)
    }
}

/// A batch of wakes being run after the lock (see [`Batch::run`] for a
/// waker that panics).
struct Batch<'a> {
    queue: &'a WaitQueue,
    wakes: Wakes,
}

impl Batch<'_> {
    /// Wakes every waker of the batch (and of the batches after it, while
    /// more settled entries wait), and drops the retired wakers. A waker
    /// that panics does not stop the others: its panic is caught, every
    /// other wake still runs (an entry granted or closed whose waker were
    /// skipped would not be woken again: with nobody pending no release
    /// runs the grant loop, and after `close` nothing does), and the first
    /// panic is resumed once the batch is done.
    fn run(mut self) {
        let mut panicked = None;
        loop {
            while self.wakes.done < self.wakes.len {
                let slot = &mut self.wakes.tasks[self.wakes.done];
                self.wakes.done += 1;
                let (ticket, waker) = slot.take().expect("a batched waker");
                let woke = catch(&mut panicked, || waker.wake());
                if !woke && self.queue.faults.panic_cuts_batch() {
                    // The fault: the rest of the batch is dropped uncalled.
                    self.wakes.done = self.wakes.len;
                    self.wakes.more = false;
                }
                if self.wakes.uncounted == Some(ticket) {
                    self.wakes.uncounted = None;
                    // The `wake_before_count` fault: the count follows a
                    // wake that returns, and is lost with one that panics.
                    if woke {
                        let mut inner = self.queue.lock();
                        self.queue.count_late(&mut inner, ticket);
                        drop(inner);
                    }
                }
            }
            for retired in &mut self.wakes.retired.0 {
                if let Some(waker) = retired.take() {
                    catch(&mut panicked, || drop(waker));
                }
            }
            if !self.wakes.more {
                break;
            }
            // More settled entries than one batch holds: the next ones.
            let mut inner = self.queue.lock();
            self.queue.signal(&mut inner);
            self.wakes = std::mem::replace(&mut inner.wakes, Wakes::new());
            drop(inner);
        }
        if let Some(payload) = panicked {
            // During unwinding (this batch runs in a drop) a second panic
            // would abort the process: the wakes all ran, the panic goes.
            if std::thread::panicking() {
                drop_payload(payload);
            } else {
                std::panic::resume_unwind(payload);
            }
        }
    }
}

/// Runs `f`, catching its panic into `first` (unless an earlier one is
/// there); returns whether it returned.
fn catch(first: &mut Option<Box<dyn std::any::Any + Send>>, f: impl FnOnce()) -> bool {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(()) => true,
        Err(payload) => {
            if first.is_none() {
                *first = Some(payload);
            } else {
                drop_payload(payload);
            }
            false
        }
    }
}

/// Drops a panic's payload that is not resumed. Its drop is the caller's
/// code and may panic too: that panic is caught, and its own payload
/// forgotten (a panic escaping here, in a drop during unwinding, would
/// abort the process).
pub(crate) fn drop_payload(payload: Box<dyn std::any::Any + Send>) {
    if let Err(again) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(payload))) {
        std::mem::forget(again);
    }
}

impl std::fmt::Debug for WaitQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitQueue")
            .field("waiters", &self.waiters())
            .field("owed", &self.owed())
            .finish()
    }
}
