//! [`WaitQueue`]: the FIFO of waiters of one allocator, and the grant loop
//! that hands released units to them in order.
//!
//! Everything here runs under the queue's mutex, except two things that
//! the lock-free paths read or run: [`WaitQueue::owed`] (one load, what the
//! head of the queue is owed; 0 when nobody waits) and
//! [`WaitQueue::notify`] (that load after every release, and
//! the lock only when someone waits).

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
    /// Loom's negative controls (none outside them).
    faults: Faults,
}

/// The two words of the queue that are read without the lock.
struct Published {
    /// What the head of the queue asks for (its `n`, always at least 1), or
    /// 0 when no waiter is pending: the units a `try_*` call must leave
    /// free, and the word a release checks to know whether to run the grant
    /// loop.
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
    /// The waker of the entry last removed or re-registered, kept for the
    /// caller to drop once it has released the lock ([`Inner::retired`]):
    /// dropping a waker can drop a task, and with it other futures of this
    /// allocator, whose drop takes the lock.
    retired: Option<Waker>,
}

impl Inner {
    /// Takes the waker that the last removal or re-registration retired;
    /// drop it after the lock.
    pub(crate) fn retired(&mut self) -> Option<Waker> {
        self.retired.take()
    }

    /// Keeps a removed or replaced `wake` for [`retired`](Self::retired).
    fn retire(&mut self, wake: Wake) {
        if let Wake::Task(waker) = wake {
            self.retired = Some(waker);
        }
    }
}

/// One waiter.
struct Entry {
    ticket: u64,
    n: usize,
    headroom: usize,
    wake: Wake,
}

/// How to wake a waiter.
pub(crate) enum Wake {
    /// An async waiter: its task's waker, refreshed on every poll.
    Task(Waker),
    /// A blocking waiter, sleeping on the queue's condition variable.
    Thread,
}

impl Wake {
    fn wake(&self, sleepers: &Condvar) {
        match self {
            Wake::Task(waker) => waker.wake_by_ref(),
            Wake::Thread => sleepers.notify_all(),
        }
    }
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
    /// An empty queue carrying `faults`.
    pub(crate) fn new(faults: Faults) -> WaitQueue {
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
                retired: None,
            }),
            sleepers: Condvar::new(),
            faults,
        }
    }

    /// What the head of the queue asks for, 0 when nobody waits: the one
    /// load a `try_*` call adds.
    #[inline]
    pub(crate) fn owed(&self) -> usize {
        // Relaxed: a `try_*` call that reads a stale 0 is ordered before the
        // enqueue it missed (it took what was free before anyone waited);
        // one that happens-after an enqueue reads it by coherence. Nothing
        // is handed out on the strength of this load alone: the admission
        // CAS decides.
        self.published.owed.load(Ordering::Relaxed)
    }

    /// How many waiters are queued (pending, or granted and not yet
    /// collected).
    pub(crate) fn waiters(&self) -> usize {
        // Relaxed: a snapshot for metrics and tests; it orders nothing.
        self.published.len.load(Ordering::Relaxed)
    }

    /// The queue's lock. A panic under it (a waker that panics) leaves the
    /// queue consistent: every step keeps its invariants before it wakes
    /// anyone, so a poisoned lock is taken as it is.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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

    /// Queues a waiter for `n` units (`n >= 1`) with `headroom`, and runs the
    /// grant loop once. Returns `Ok(None)` if it was granted at once (its
    /// entry is gone again), `Ok(Some(ticket))` if it waits, or `Closed`.
    ///
    /// The caller has tried the lock-free path first and found it `Full`,
    /// and has checked that `n + headroom` fits the capacity.
    pub(crate) fn enqueue<U: Units + ?Sized>(
        &self,
        inner: &mut Inner,
        units: &U,
        n: usize,
        headroom: usize,
        wake: Wake,
    ) -> Result<Option<u64>, ReserveError> {
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
        });
        self.publish(inner);
        if self.faults.late_enqueue() {
            // The fault: no attempt after the enqueue, so a release that
            // came between the caller's failed attempt and the enqueue (and
            // found nobody to wake) is lost.
            return Ok(Some(ticket));
        }
        // The waiter's half of the hand-shake with `notify`: a
        // read-modify-write that changes nothing (`AcqRel`) on every word a
        // release writes, after the `owed` store above. A release is also a
        // read-modify-write (`AcqRel`) on one of those words, so the two are
        // ordered in that word's modification order. If ours comes first,
        // the release reads from it (through the word's release sequence)
        // and so sees the `owed` store when it loads `owed` next: it runs
        // the grant loop. If the release comes first, ours reads from it,
        // and the grant loop's reads of the allocator below see the
        // released units. So no release is missed by both. (No `SeqCst`
        // fence on the release path: on x86 the release's locked
        // instruction already orders it, and a fence would cost the fast
        // path a full barrier per release.)
        if !self.faults.unfenced_wait() {
            units.sync_with_releases();
        }
        self.grant(inner, units);
        match self.status(inner, ticket) {
            Status::Granted => Ok(None),
            Status::Closed => Err(ReserveError::Closed),
            Status::Waiting => Ok(Some(ticket)),
        }
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

    /// Replaces the waker of the pending waiter with `ticket`, unless the
    /// stored one would wake the same task.
    pub(crate) fn set_waker(&self, inner: &mut Inner, ticket: u64, waker: &Waker) {
        let index = Self::index(inner, ticket);
        let old = match &mut inner.entries[index].wake {
            Wake::Task(stored) if stored.will_wake(waker) => return,
            wake => std::mem::replace(wake, Wake::Task(waker.clone())),
        };
        inner.retire(old);
    }

    /// Removes the waiter with `ticket` (a dropped future, a timed-out
    /// blocking call). A granted waiter gives its units back and hands them
    /// on; a pending head lets the waiters behind it be re-checked. Either
    /// way the grant loop runs.
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
        } else if self.faults.cancel_no_recheck() {
            self.publish(inner);
            return;
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
        // `enqueue`). So a 0 read here means that every waiter queued since
        // has tried after this release, and seen it.
        if self.published.owed.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut inner = self.lock();
        self.grant(&mut inner, units);
    }

    /// Closes the queue: pending waiters are woken and end with `Closed`;
    /// later enqueues fail with `Closed`. The allocator has set its own
    /// closed flag first, so no grant can succeed any more.
    pub(crate) fn close(&self) {
        let mut inner = self.lock();
        self.close_locked(&mut inner);
    }

    fn close_locked(&self, inner: &mut Inner) {
        if inner.closed {
            return;
        }
        inner.closed = true;
        if !self.faults.silent_close() {
            for entry in inner.entries.iter().skip(inner.granted) {
                entry.wake.wake(&self.sleepers);
            }
        }
        self.publish(inner);
    }

    /// The grant loop: while the head's `n` (with its headroom free besides)
    /// can be taken, take it on the head's behalf, mark it granted and wake
    /// it; stop at the first head that does not fit, so that no waiter
    /// passes an earlier one.
    fn grant<U: Units + ?Sized>(&self, inner: &mut Inner, units: &U) {
        while !inner.closed {
            let Some(head) = inner.entries.get(inner.granted) else {
                break;
            };
            match units.take(head.n, head.headroom) {
                Ok(()) => {
                    head.wake.wake(&self.sleepers);
                    inner.granted += 1;
                }
                Err(ReserveError::Closed) => self.close_locked(inner),
                Err(_) => break,
            }
        }
        self.publish(inner);
    }

    /// Publishes the head's request and the entry count for the lock-free
    /// readers.
    fn publish(&self, inner: &Inner) {
        let owed = if inner.closed {
            0
        } else {
            inner.entries.get(inner.granted).map_or(0, |head| head.n)
        };
        // Relaxed (both): written only under the lock, so the lock orders
        // the writers; for `owed`, the readers that must see a new head (a
        // releaser's `notify`) are ordered by the read-modify-writes of the
        // hand-shake (see `enqueue`), and `len` is a snapshot for metrics.
        self.published.owed.store(owed, Ordering::Relaxed);
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
        inner
            .entries
            .binary_search_by_key(&ticket, |entry| entry.ticket)
            .expect("a waiter's entry stays queued until it is collected")
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
