//! Waiting for capacity: the FIFO wait queue ([`WaitQueue`]), the waiting
//! half of an async call ([`Waiter`]) and of a blocking one
//! ([`wait_blocking`]), over any allocator that implements [`Units`].
//!
//! The queue knows nothing about slots or blocks: it grants its head by
//! calling [`Units::take`] ("take `n` units, all or nothing, ignoring the
//! waiters"), and the allocator pokes it ([`WaitQueue::notify`]) after
//! every release. The rules it keeps and the orderings it relies on are
//! described in [`crate::implementation`] ("Waiting").
//!
//! A waiting call starts with [`first_attempt`]: the lock-free path when
//! nobody is queued, straight into the queue otherwise, so that a new
//! waiter never passes one queued before it.

mod blocking;
mod future;
mod queue;
mod unwound;

pub(crate) use blocking::wait_blocking;
pub(crate) use future::Waiter;
pub(crate) use queue::{Status, WaitQueue, Wake};
pub(crate) use unwound::Unwound;

use crate::error::ReserveError;

/// What a waiting call for `n` units with `headroom` does first: `Some`
/// with its outcome when it is decided without queueing (nothing to take,
/// `NeverFits`, `Closed`, or granted on the lock-free path), `None` when
/// the caller must queue.
///
/// While anyone is pending (`owed() != 0`) the caller queues without trying
/// the lock-free path, so that it is granted only after every waiter queued
/// before it (the grant loop serves in order). With nobody pending it tries
/// the lock-free path as a `try_*` call would (which leaves what the
/// waiters are owed, should one queue meanwhile) and queues if that is
/// refused as retryable.
pub(crate) fn first_attempt<U: Units + ?Sized>(
    units: &U,
    n: usize,
    headroom: usize,
) -> Option<Result<(), ReserveError>> {
    if n == 0 || n.saturating_add(headroom) > units.capacity() || units.queue().owed() == 0 {
        match units.try_take(n, headroom) {
            Err(err) if n > 0 && err.is_retryable() => None,
            other => Some(other),
        }
    } else {
        None
    }
}

/// An allocator of interchangeable units that waiters can queue on.
pub(crate) trait Units {
    /// The allocator's lock-free admission as `try_*` calls make it: takes
    /// `n` units if `n + headroom` are free beyond what the queued waiters
    /// are owed (`Full` if not even `n + headroom` are free,
    /// `BehindWaiters` if they are, but not beside what is owed).
    fn try_take(&self, n: usize, headroom: usize) -> Result<(), ReserveError>;
    /// Takes `n` units if `n + headroom` are free, ignoring the waiters
    /// (the grant loop takes for the head). Fails with `Closed` once the
    /// allocator is closed.
    fn take(&self, n: usize, headroom: usize) -> Result<(), ReserveError>;
    /// Gives back `n` units taken by `take`, without notifying the queue
    /// (its caller holds the queue's lock and runs the grant loop itself).
    fn give_back(&self, n: usize);
    /// The total number of units.
    fn capacity(&self) -> usize;
    /// The allocator's wait queue.
    fn queue(&self) -> &WaitQueue;
    /// A read-modify-write that changes nothing, `AcqRel`, on every word
    /// that a release of units writes (each release being an `AcqRel`
    /// read-modify-write of one of them): the waiter's half of the
    /// hand-shake that keeps wake-ups from being lost (see
    /// `WaitQueue::first_look`).
    fn sync_with_releases(&self);
}
