//! [`wait_blocking`]: the waiting half of the `*_blocking` calls, for
//! thread-based workers.

use std::time::{Duration, Instant};

use crate::error::ReserveError;

use super::{first_attempt, Status, Units, Wake};

/// Takes `n` units with `headroom` free besides, waiting in the queue for
/// at most `timeout` (`None`: until granted or closed).
///
/// The lock-free path is tried first when nobody is queued (see
/// [`first_attempt`]); otherwise, or if it is refused, the caller queues and
/// sleeps on the queue's condition variable (under the queue's lock, which
/// the sleep releases). When the timeout runs out the caller leaves the
/// queue (the waiters behind it are re-checked) and makes one last
/// lock-free attempt, as a `try_*` call would at that moment: it returns
/// that attempt's outcome (`Full`, or `BehindWaiters` when what is free is
/// owed to waiters still queued). A timeout too far ahead for [`Instant`]
/// waits without one.
pub(crate) fn wait_blocking<U: Units + ?Sized>(
    units: &U,
    n: usize,
    headroom: usize,
    timeout: Option<Duration>,
) -> Result<(), ReserveError> {
    if let Some(done) = first_attempt(units, n, headroom) {
        return done;
    }
    let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
    let queue = units.queue();
    // Leaves the queue if the call unwinds while queued (another waiter's
    // waker that panics, woken by this call's grant loop).
    let mut queued = Queued {
        units,
        ticket: None,
    };
    let mut inner = queue.lock();
    let ticket = match queue.enqueue(&mut inner, n, headroom, Wake::Thread) {
        Ok(ticket) => ticket,
        Err(err) => {
            queue.unlock(inner);
            return Err(err);
        }
    };
    queued.ticket = Some(ticket);
    queue.first_look(&mut inner, units);
    if queue.has_wakes(&inner) {
        queue.unlock(inner);
        inner = queue.lock();
    }
    loop {
        match queue.status(&mut inner, ticket) {
            Status::Granted => {
                queued.ticket = None;
                queue.unlock(inner);
                return Ok(());
            }
            Status::Closed => {
                queued.ticket = None;
                queue.unlock(inner);
                return Err(ReserveError::Closed);
            }
            Status::Waiting => {}
        }
        let left = match deadline {
            None => None,
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    queued.ticket = None;
                    queue.cancel(&mut inner, units, ticket);
                    // The lock goes (and the waiters granted behind this
                    // one are woken) before the last attempt, whose slow
                    // path may take the lock.
                    queue.unlock(inner);
                    return units.try_take(n, headroom);
                }
                Some(deadline - now)
            }
        };
        // Nothing to wake here: only `status` ran since the last unlock.
        inner = queue.sleep(inner, left);
    }
}

/// A blocking waiter's entry, left if the call unwinds while it is queued.
struct Queued<'a, U: Units + ?Sized> {
    units: &'a U,
    ticket: Option<u64>,
}

impl<U: Units + ?Sized> Drop for Queued<'_, U> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            let queue = self.units.queue();
            let mut inner = queue.lock();
            queue.cancel(&mut inner, self.units, ticket);
            queue.unlock(inner);
        }
    }
}
