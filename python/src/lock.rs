//! The mutex that keeps a core sequence inside its Python object.
//!
//! The core's sequences take `&mut self`, so a Python `Sequence` (or
//! `HybridSequence`) keeps its core sequence behind a mutex, and a call
//! that waits (`reserve`) or walks many blocks holds that mutex with the
//! interpreter detached. Another thread's call on the same sequence then
//! waits for the mutex. It waits detached (so that the holder, and every
//! other Python thread, can run) and re-attaches every
//! [`SIGNAL_CHECK`](crate::wait::SIGNAL_CHECK) to run Python's signal
//! handlers: Ctrl-C (`KeyboardInterrupt`) interrupts a call that waits
//! behind another thread's `reserve`, as it interrupts the `reserve`
//! itself. An uncontended lock is one compare-and-swap, taken attached.

use parking_lot::{Mutex, MutexGuard};
use pyo3::prelude::*;

use crate::wait::SIGNAL_CHECK;

/// A mutex whose contended wait runs detached from the interpreter and
/// can be interrupted by a signal handler's exception.
pub(crate) struct SeqLock<T>(Mutex<T>);

impl<T: Send> SeqLock<T> {
    /// A mutex holding `value`.
    pub(crate) fn new(value: T) -> SeqLock<T> {
        SeqLock(Mutex::new(value))
    }

    /// Locks the mutex: at once if it is free, else waiting detached, in
    /// turns of [`SIGNAL_CHECK`] between which Python's signal handlers
    /// run. Raises what a handler raises (Ctrl-C: `KeyboardInterrupt`),
    /// without the lock.
    pub(crate) fn lock(&self, py: Python<'_>) -> PyResult<MutexGuard<'_, T>> {
        if let Some(guard) = self.0.try_lock() {
            return Ok(guard);
        }
        loop {
            // The closure runs on this thread; its guard must be `Send`
            // only to leave it (`Ungil`), which parking_lot's `send_guard`
            // feature makes it.
            if let Some(guard) = py.detach(|| self.0.try_lock_for(SIGNAL_CHECK)) {
                return Ok(guard);
            }
            py.check_signals()?;
        }
    }
}
