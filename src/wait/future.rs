//! [`Waiter`]: the state of one async wait, shared by the crate's named
//! futures (`Reserve`, `ReserveOwned`, `Alloc`), which add what to do with
//! a grant.

use std::task::{Context, Poll};

use crate::error::ReserveError;

use super::{Status, Units, Wake};

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

    /// How many units the wait is for.
    pub(crate) fn n(&self) -> usize {
        self.n
    }

    /// Polls the wait: the first poll tries the lock-free path and queues
    /// the waiter if it is `Full`; later polls collect a grant, or `Closed`,
    /// or refresh the waker. `Ok` means the `n` units are the caller's.
    ///
    /// # Panics
    ///
    /// If polled again after it resolved.
    pub(crate) fn poll<U: Units + ?Sized>(
        &mut self,
        units: &U,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), ReserveError>> {
        let result = match self.state {
            State::Done => panic!("a kvslots wait future was polled after it completed"),
            State::Ready => Ok(()),
            State::Start => match units.try_take(self.n, self.headroom) {
                Err(ReserveError::Full { .. }) if self.n > 0 => {
                    let queue = units.queue();
                    let mut inner = queue.lock();
                    let wake = Wake::Task(cx.waker().clone());
                    let queued = queue.enqueue(&mut inner, units, self.n, self.headroom, wake);
                    // Any waker removed under the lock is dropped after it.
                    let retired = inner.retired();
                    drop(inner);
                    drop(retired);
                    match queued {
                        Ok(Some(ticket)) => {
                            self.state = State::Queued(ticket);
                            return Poll::Pending;
                        }
                        Ok(None) => Ok(()),
                        Err(err) => Err(err),
                    }
                }
                other => other,
            },
            State::Queued(ticket) => {
                let queue = units.queue();
                let mut inner = queue.lock();
                let status = queue.status(&mut inner, ticket);
                if status == Status::Waiting {
                    queue.set_waker(&mut inner, ticket, cx.waker());
                }
                // Any waker removed or replaced under the lock is dropped
                // after it.
                let retired = inner.retired();
                drop(inner);
                drop(retired);
                match status {
                    Status::Granted => Ok(()),
                    Status::Closed => Err(ReserveError::Closed),
                    Status::Waiting => return Poll::Pending,
                }
            }
        };
        self.state = State::Done;
        Poll::Ready(result)
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
            // The entry's waker is dropped after the lock.
            let retired = inner.retired();
            drop(inner);
            drop(retired);
        }
    }
}
