//! Waiting for blocks from Python: the core crate's allocation future,
//! polled on the calling thread with the interpreter detached, so that
//! other Python threads run meanwhile, while the waiter keeps its place in
//! the pool's FIFO queue.
//!
//! The thread parks between polls (the pool's release wakes it through the
//! future's waker) and re-attaches every [`SIGNAL_CHECK`] to run Python's
//! signal handlers, so that Ctrl-C interrupts a wait: the future is then
//! dropped, which cancels the wait and hands on anything granted to it.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// How often a waiting thread runs Python's signal handlers.
pub(crate) const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// Wakes the waiting thread.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `future` on this thread until it resolves (`Ok(Some(output))`),
/// `deadline` passes (`Ok(None)`; the future is dropped, which cancels the
/// wait) or a signal handler raises (Ctrl-C: `KeyboardInterrupt`; the
/// future is dropped too). Call it attached: it detaches for each turn of
/// polling and parking, and runs the signal handlers attached between
/// turns, so that it never attaches from a detached closure (which, during
/// the interpreter's finalization, would panic).
pub(crate) fn block_on<F: Future + Send>(
    py: Python<'_>,
    future: F,
    deadline: Option<Instant>,
) -> PyResult<Option<F::Output>>
where
    F::Output: Send,
{
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut future = pin!(future);
    loop {
        let turn = py.detach(|| {
            let mut cx = Context::from_waker(&waker);
            if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                return Turn::Ready(out);
            }
            let mut nap = SIGNAL_CHECK;
            if let Some(deadline) = deadline {
                let now = Instant::now();
                if now >= deadline {
                    return Turn::TimedOut;
                }
                nap = nap.min(deadline - now);
            }
            // A wake before the park makes it return at once (the unpark
            // token), so no wake-up is lost between the poll and the park.
            thread::park_timeout(nap);
            Turn::Again
        });
        match turn {
            Turn::Ready(out) => return Ok(Some(out)),
            Turn::TimedOut => return Ok(None),
            Turn::Again => py.check_signals()?,
        }
    }
}

/// How a turn of [`block_on`] ended.
enum Turn<T> {
    Ready(T),
    TimedOut,
    Again,
}

/// The deadline `timeout` from now; `None` (no limit) for `None` or a
/// timeout too far ahead for `Instant`.
pub(crate) fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| Instant::now().checked_add(t))
}
