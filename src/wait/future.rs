//! [`Waiter`]: the state of one async wait, shared by the crate's named
//! futures (`Reserve`, `ReserveOwned`, `Alloc`), which add what to do with
//! a grant.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::task::{Context, Poll};

use crate::error::ReserveError;
use crate::sync::MutexGuard;

use super::queue::Inner;
use super::{first_attempt, Status, Units, Wake};

/// One async wait for `n` units with `headroom`: not yet polled, queued
/// under a ticket, or finished.
///
/// It holds no reference to the allocator (the futures that embed it do):
/// each call takes the allocator, and the embedding future's `Drop` calls
/// [`cancel`](Self::cancel), which gives back a grant it never collected.
#[derive(Debug)]
pub(crate) struct Waiter {
    n: usize,
    headroom: usize,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not polled yet.
    Start,
    /// Resolves to `Ok` at the first poll: nothing to take.
    Ready,
    /// Resolves to this error at the first poll, taking nothing.
    Refused(ReserveError),
    /// In the queue under this ticket.
    Queued(u64),
    /// Resolved.
    Done,
}

impl Waiter {
    /// A wait for `n` units, leaving `headroom` free besides.
    pub(crate) fn new(n: usize, headroom: usize) -> Waiter {
        Waiter {
            n,
            headroom,
            state: State::Start,
        }
    }

    /// A wait that resolves to `Ok` at once, taking nothing.
    pub(crate) fn ready() -> Waiter {
        Waiter {
            n: 0,
            headroom: 0,
            state: State::Ready,
        }
    }

    /// A wait that resolves to `err` at once, taking nothing.
    pub(crate) fn refused(err: ReserveError) -> Waiter {
        Waiter {
            n: 0,
            headroom: 0,
            state: State::Refused(err),
        }
    }

    /// How many units the wait is for.
    pub(crate) fn n(&self) -> usize {
        self.n
    }

    /// Polls the wait: the first poll tries the lock-free path when nobody
    /// is queued and queues the waiter otherwise, or if that is refused
    /// (see [`first_attempt`]); later polls collect a grant, or `Closed`,
    /// or refresh the waker. `Ok` means the `n` units are the caller's.
    ///
    /// # Panics
    ///
    /// If polled again after it resolved. A waker that panics when this
    /// poll wakes or drops it (another waiter's, which this poll's grant
    /// loop woke, or this wait's own, replaced) propagates out of the
    /// poll: the wait is then queued, and dropping it leaves the queue, or
    /// it is done, and a grant it collected was handed on.
    pub(crate) fn poll<U: Units + ?Sized>(
        &mut self,
        units: &U,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), ReserveError>> {
        let result = match self.state {
            State::Done => panic!("a kvslots wait future was polled after it completed"),
            State::Ready => Ok(()),
            State::Refused(err) => Err(err),
            State::Start => match first_attempt(units, self.n, self.headroom) {
                Some(done) => done,
                None => {
                    let queue = units.queue();
                    let wake = Wake::Task(cx.waker().clone());
                    let mut inner = queue.lock();
                    match queue.enqueue(&mut inner, self.n, self.headroom, wake) {
                        Ok(ticket) => {
                            // Recorded before the grant loop's wakes run
                            // (another waiter's waker may panic): if they
                            // unwind, this future is queued, and its drop
                            // leaves the queue.
                            self.state = State::Queued(ticket);
                            queue.first_look(&mut inner, units);
                            if queue.has_wakes(&inner) {
                                queue.unlock(inner);
                                inner = queue.lock();
                            }
                            let status = queue.status(&mut inner, ticket);
                            return self.settle(units, inner, status);
                        }
                        Err(err) => {
                            queue.unlock(inner);
                            Err(err)
                        }
                    }
                }
            },
            State::Queued(ticket) => {
                // Cloned before the lock: a waker's clone is the caller's
                // code, which may release units (and so take the lock).
                let waker = cx.waker().clone();
                let queue = units.queue();
                let mut inner = queue.lock();
                let status = queue.status(&mut inner, ticket);
                if status == Status::Waiting {
                    queue.set_waker(&mut inner, ticket, waker);
                } else {
                    // Dropped after the lock, as every waker.
                    queue.retire(&mut inner, waker);
                }
                return self.settle(units, inner, status);
            }
        };
        self.state = State::Done;
        Poll::Ready(result)
    }

    /// Ends a poll that asked the queue for this wait's `status` under
    /// `inner`: lets go of the lock (running the wakes left for after it,
    /// and dropping the wakers let go of) and returns the outcome.
    ///
    /// A granted or closed wait is `Done` before the lock goes, its entry
    /// being gone. If the wakes after the lock unwind (a waker that panics,
    /// this wait's own replaced one included), the poll unwinds; a grant it
    /// collected is handed on first, as a release would, since the caller
    /// never gets it.
    fn settle<U: Units + ?Sized>(
        &mut self,
        units: &U,
        inner: MutexGuard<'_, Inner>,
        status: Status,
    ) -> Poll<Result<(), ReserveError>> {
        if status != Status::Waiting {
            self.state = State::Done;
        }
        let queue = units.queue();
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| queue.unlock(inner))) {
            if status == Status::Granted {
                let mut inner = queue.lock();
                queue.hand_back(&mut inner, units, self.n);
                // The first panic is the one resumed; the wakes of this
                // hand-back all run (see `WaitQueue::unlock`).
                let _ = catch_unwind(AssertUnwindSafe(|| queue.unlock(inner)));
            }
            resume_unwind(panic);
        }
        match status {
            Status::Granted => Poll::Ready(Ok(())),
            Status::Closed => Poll::Ready(Err(ReserveError::Closed)),
            Status::Waiting => Poll::Pending,
        }
    }

    /// Leaves the queue if the wait is queued: gives back a grant that was
    /// not collected and lets the queue re-check the waiters behind it.
    /// Called by the embedding future's `Drop`; a no-op otherwise.
    pub(crate) fn cancel<U: Units + ?Sized>(&mut self, units: &U) {
        if let State::Queued(ticket) = self.state {
            self.state = State::Done;
            let queue = units.queue();
            let mut inner = queue.lock();
            queue.cancel(&mut inner, units, ticket);
            // The entry's waker is dropped, and the waiters granted after
            // it are woken, after the lock.
            queue.unlock(inner);
        }
    }
}
