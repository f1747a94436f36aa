//! Waiting for blocks from Python: the core crate's allocation future,
//! polled on the calling thread with the interpreter detached, so that
//! other Python threads run meanwhile, while the waiter keeps its place in
//! the pool's FIFO queue.
//!
//! The thread parks between polls (the pool's release wakes it through the
//! future's waker). Python's main thread, the only one that runs signal
//! handlers, re-attaches every [`SIGNAL_CHECK`] to run them, so that Ctrl-C
//! interrupts a wait: the future is then dropped, which cancels the wait
//! and hands on anything granted to it. Another thread stays detached
//! until it is woken or its deadline passes, so that a thousand waiting
//! threads do not take the GIL twenty times a second each.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// How often a waiting main thread runs Python's signal handlers.
pub(crate) const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// Whether the calling thread is Python's main thread, the one that runs
/// signal handlers (after `os.fork` in another thread, the forking
/// thread: asked afresh each time). A thread that cannot tell (the
/// interpreter shutting down) counts as the main thread, and keeps running
/// the handlers.
pub(crate) fn runs_signal_handlers(py: Python<'_>) -> bool {
    let main = || -> PyResult<bool> {
        let threading = py.import("threading")?;
        let main = threading.call_method0("main_thread")?.getattr("ident")?;
        let me = threading.call_method0("get_ident")?;
        main.eq(me)
    };
    main().unwrap_or(true)
}

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
    let signals = runs_signal_handlers(py);
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut future = pin!(future);
    loop {
        let turn = py.detach(|| loop {
            let mut cx = Context::from_waker(&waker);
            if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                return Turn::Ready(out);
            }
            // Until the deadline, and on the main thread no longer than
            // until the next run of the signal handlers.
            let mut nap = signals.then_some(SIGNAL_CHECK);
            if let Some(deadline) = deadline {
                let now = Instant::now();
                if now >= deadline {
                    return Turn::TimedOut;
                }
                nap = Some(nap.map_or(deadline - now, |n| n.min(deadline - now)));
            }
            // A wake before the park makes it return at once (the unpark
            // token), so no wake-up is lost between the poll and the park.
            match nap {
                Some(nap) => thread::park_timeout(nap),
                None => thread::park(),
            }
            if signals {
                return Turn::Again;
            }
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
