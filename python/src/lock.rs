//! The mutex that keeps a core sequence inside its Python object.
//!
//! The core's sequences take `&mut self`, so a Python `Sequence` (or
//! `HybridSequence`) keeps its core sequence behind a mutex, and a call
//! that waits (`reserve`) or walks many blocks holds that mutex with the
//! interpreter detached. Another thread's call on the same sequence then
//! waits for the mutex. It waits detached (so that the holder, and every
//! other Python thread, can run) and re-attaches every
//! [`signal_check`](crate::wait::signal_check) to run Python's signal
//! handlers: Ctrl-C (`KeyboardInterrupt`) interrupts a call that waits
//! behind another thread's `reserve`, as it interrupts the `reserve`
//! itself. An uncontended lock is one compare-and-swap, taken attached.
//!
//! The mutex remembers which thread holds it. A `reserve` runs the signal
//! handlers of its own thread while it holds the mutex, so a handler (or
//! a finalizer that a handler's garbage collection runs) can call the
//! sequence that its thread holds: waiting would wait for itself, so that
//! call raises `RuntimeError` instead, as CPython's buffered files do on a
//! reentrant call.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::wait::signal_check;

/// No thread holds the mutex (no thread has token 0).
const NOBODY: u64 = 0;

/// The next thread's token.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's token: a number no other thread of the process has.
    // Relaxed: only the counter's atomicity matters (each RMW reads a
    // value no other has read); nothing is published through it.
    static TOKEN: u64 = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
}

/// A thread's token: a number no other thread of the process has, read
/// once for calls that lock many mutexes on the same thread.
#[derive(Clone, Copy)]
pub(crate) struct ThreadToken(u64);

impl ThreadToken {
    /// The calling thread's token.
    pub(crate) fn current() -> ThreadToken {
        ThreadToken(TOKEN.with(|token| *token))
    }
}

/// A mutex whose contended wait runs detached from the interpreter and
/// can be interrupted by a signal handler's exception, and which refuses
/// a thread that holds it already.
pub(crate) struct SeqLock<T> {
    value: Mutex<T>,
    /// The token of the thread that holds `value`, or [`NOBODY`]. Written
    /// only by the holder, under the mutex: set after it locks, cleared
    /// before it unlocks.
    holder: AtomicU64,
}

impl<T: Send> SeqLock<Option<T>> {
    /// Whether the value is gone (closed) now, read without waiting: a
    /// value another call holds now reads as there.
    pub(crate) fn closed_now(&self) -> bool {
        self.try_lock_as(ThreadToken::current())
            .is_some_and(|guard| guard.is_none())
    }
}

/// The held mutex: the value, and the holder's mark, cleared on drop.
pub(crate) struct SeqGuard<'a, T> {
    holder: &'a AtomicU64,
    guard: MutexGuard<'a, T>,
}

impl<T: Send> SeqLock<T> {
    /// A mutex holding `value`.
    pub(crate) fn new(value: T) -> SeqLock<T> {
        SeqLock {
            value: Mutex::new(value),
            holder: AtomicU64::new(NOBODY),
        }
    }

    /// Locks the mutex: at once if it is free, else waiting detached, in
    /// turns of [`signal_check`] between which Python's signal handlers
    /// run. Raises what a handler raises (Ctrl-C: `KeyboardInterrupt`),
    /// without the lock; raises `RuntimeError` at once, without waiting,
    /// if this thread holds the mutex already (a call from a signal
    /// handler or a finalizer run during this thread's `reserve`).
    pub(crate) fn lock(&self, py: Python<'_>) -> PyResult<SeqGuard<'_, T>> {
        loop {
            // Without a deadline, `lock_until` returns only with the lock
            // or an error.
            if let Some(guard) = self.lock_until(py, None)? {
                return Ok(guard);
            }
        }
    }

    /// [`lock`](Self::lock), waiting no later than `deadline` (`None`: no
    /// limit): `Ok(None)` if the deadline passes first.
    pub(crate) fn lock_until(
        &self,
        py: Python<'_>,
        deadline: Option<Instant>,
    ) -> PyResult<Option<SeqGuard<'_, T>>> {
        let me = ThreadToken::current();
        if let Some(guard) = self.try_lock_as(me) {
            return Ok(Some(guard));
        }
        let ThreadToken(me) = me;
        // Relaxed: only this thread ever writes its own token here, and it
        // reads its own writes in program order; another thread's token,
        // or a stale one, never equals ours.
        if self.holder.load(Ordering::Relaxed) == me {
            return Err(PyRuntimeError::new_err(
                "reentrant call on a Sequence that this thread holds: a signal handler \
                 (or a finalizer it ran) called the sequence during its own reserve(); \
                 nothing changed",
            ));
        }
        loop {
            let mut turn = signal_check();
            if let Some(deadline) = deadline {
                match deadline.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => turn = turn.min(left),
                    _ => return Ok(None),
                }
            }
            // The closure runs on this thread; its guard must be `Send`
            // only to leave it (`Ungil`), which parking_lot's `send_guard`
            // feature makes it.
            if let Some(guard) = py.detach(|| self.value.try_lock_for(turn)) {
                return Ok(Some(self.held(guard, ThreadToken(me))));
            }
            py.check_signals()?;
        }
    }

    /// Locks the mutex if it is free now, without waiting (and without
    /// the interpreter: it never calls into Python), for the calling
    /// thread, whose token `me` is; `None` if another call, of this thread
    /// or another, holds it.
    pub(crate) fn try_lock_as(&self, me: ThreadToken) -> Option<SeqGuard<'_, T>> {
        self.value.try_lock().map(|guard| self.held(guard, me))
    }

    /// Marks the calling thread, whose token `me` is, as the holder of
    /// `guard`'s mutex.
    fn held<'a>(
        &'a self,
        guard: MutexGuard<'a, T>,
        ThreadToken(me): ThreadToken,
    ) -> SeqGuard<'a, T> {
        // Relaxed: read only by this thread (see `lock`); the mutex orders
        // the value itself.
        self.holder.store(me, Ordering::Relaxed);
        SeqGuard {
            holder: &self.holder,
            guard,
        }
    }
}

impl<T> Deref for SeqGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for SeqGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for SeqGuard<'_, T> {
    fn drop(&mut self) {
        // Relaxed: as in `held`. This runs before the fields drop, so the
        // mark is cleared before the unlock and never overwrites the next
        // holder's.
        self.holder.store(NOBODY, Ordering::Relaxed);
    }
}
