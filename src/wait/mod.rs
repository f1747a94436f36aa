//! Waiting for capacity: the FIFO wait queue ([`WaitQueue`]), the waiting
//! half of an async call ([`Waiter`]) and of a blocking one
//! ([`wait_blocking`]), over any allocator that implements [`Units`].
//!
//! The queue knows nothing about slots or blocks: it grants its head by
//! calling [`Units::take`] ("take `n` units, all or nothing, ignoring the
//! waiters"), and the allocator pokes it ([`WaitQueue::notify`]) after
//! every release. The rules it keeps and the orderings it relies on are
//! described in [`crate::implementation`] ("Waiting").

mod blocking;
mod future;
mod queue;

pub(crate) use blocking::wait_blocking;
pub(crate) use future::Waiter;
pub(crate) use queue::{Status, WaitQueue, Wake};

use crate::error::ReserveError;

/// An allocator of interchangeable units that waiters can queue on.
pub(crate) trait Units {
    /// The allocator's lock-free admission as `try_*` calls make it: takes
    /// `n` units if `n + headroom` are free beyond what the queue's head is
    /// owed.
    fn try_take(&self, n: usize, headroom: usize) -> Result<(), ReserveError>;
    /// Takes `n` units if `n + headroom` are free, ignoring the waiters
    /// (the grant loop takes for the head). Fails with `Closed` once the
    /// allocator is closed.
    fn take(&self, n: usize, headroom: usize) -> Result<(), ReserveError>;
    /// Gives back `n` units taken by `take`, without notifying the queue
    /// (its caller holds the queue's lock and runs the grant loop itself).
    fn give_back(&self, n: usize);
    /// A snapshot of the free units.
    fn available(&self) -> usize;
    /// The allocator's wait queue.
    fn queue(&self) -> &WaitQueue;
    /// A read-modify-write that changes nothing, `AcqRel`, on every word
    /// that a release of units writes (each release being an `AcqRel`
    /// read-modify-write of one of them): the waiter's half of the
    /// hand-shake that keeps wake-ups from being lost (see
    /// `WaitQueue::enqueue`).
    fn sync_with_releases(&self);
}
