//! [`wait_blocking`]: the waiting half of the `*_blocking` calls, for
//! thread-based workers.

use std::time::{Duration, Instant};

use crate::error::ReserveError;

use super::{Status, Units, Wake};

/// Takes `n` units with `headroom` free besides, waiting in the queue for
/// at most `timeout` (`None`: until granted or closed).
///
/// The lock-free path is tried first; a `Full` refusal queues the caller,
/// which sleeps on the queue's condition variable (under the queue's lock,
/// which the sleep releases). On timeout the caller leaves the queue (the
/// waiters behind it are re-checked) and gets `Full` with the units free at
/// that moment. A timeout too far ahead for [`Instant`] waits without one.
pub(crate) fn wait_blocking<U: Units + ?Sized>(
    units: &U,
    n: usize,
    headroom: usize,
    timeout: Option<Duration>,
) -> Result<(), ReserveError> {
    match units.try_take(n, headroom) {
        Err(ReserveError::Full { .. }) if n > 0 => {}
        other => return other,
    }
    let deadline = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
    let queue = units.queue();
    let mut inner = queue.lock();
    let Some(ticket) = queue.enqueue(&mut inner, units, n, headroom, Wake::Thread)? else {
        return Ok(());
    };
    loop {
        let left = match deadline {
            None => None,
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    queue.cancel(&mut inner, units, ticket);
                    return Err(ReserveError::Full {
                        requested: n,
                        available: units.available(),
                    });
                }
                Some(deadline - now)
            }
        };
        inner = queue.sleep(inner, left);
        match queue.status(&mut inner, ticket) {
            Status::Granted => return Ok(()),
            Status::Closed => return Err(ReserveError::Closed),
            Status::Waiting => {}
        }
    }
}
