//! Waiting for blocks from Python: the core crate's allocation future,
//! polled on the calling thread with the interpreter detached, so that
//! other Python threads run meanwhile, while the waiter keeps its place in
//! the pool's FIFO queue.
//!
//! The thread parks between polls (the pool's release wakes it through the
//! future's waker) and re-attaches every [`signal_check`] to run Python's
//! signal handlers, so that Ctrl-C interrupts a wait: the future is then
//! dropped, which cancels the wait and hands on anything granted to it.
//!
//! Python runs signal handlers only on its main thread, and each
//! re-attach takes the GIL from whichever thread runs Python, so the
//! threads that cannot run a handler re-attach rarely: a thousand threads
//! waiting in the pool then cost the thread running Python next to
//! nothing (`python/bench/waiters.py`).

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// How often a waiting thread on which Python runs signal handlers
/// re-attaches to run them: soon enough that Ctrl-C feels immediate.
const MAIN_THREAD_CHECK: Duration = Duration::from_millis(50);

/// How often any other waiting thread re-attaches. Python runs no signal
/// handler there, so this only bounds the wait for Ctrl-C should the
/// thread be Python's main thread after all ([`is_first_thread`] names
/// the process's first thread, which an embedding program may not have
/// started Python on).
const OTHER_THREAD_CHECK: Duration = Duration::from_secs(1);

/// How long the calling thread waits, detached, between two runs of
/// Python's signal handlers.
pub(crate) fn signal_check() -> Duration {
    thread_local! {
        /// The process this thread last looked in, and whether it is that
        /// process's first thread. A thread that forks becomes the child's
        /// only (and main) thread, so the answer is kept per process.
        static FIRST: Cell<Option<(u32, bool)>> = const { Cell::new(None) };
    }
    let pid = std::process::id();
    // A `Cell` has no destructor, so the value outlives nothing; should it
    // be out of reach all the same, check as often as the main thread.
    let first = FIRST
        .try_with(|cell| match cell.get() {
            Some((seen, first)) if seen == pid => first,
            _ => {
                let first = is_first_thread();
                cell.set(Some((pid, first)));
                first
            }
        })
        .unwrap_or(true);
    if first {
        MAIN_THREAD_CHECK
    } else {
        OTHER_THREAD_CHECK
    }
}

/// Whether the calling thread is the process's first thread, the one the
/// `python` executable runs Python's main thread (and so its signal
/// handlers) on. Decided without the interpreter: asking Python would run
/// Python code, inside which a pending signal's handler could run and its
/// exception be lost. On Linux the first thread's id is the process id;
/// `/proc/thread-self` links to `<pid>/task/<tid>`. Where that cannot be
/// read, or elsewhere than Linux, every thread counts as the first (each
/// re-attaches as often as the main thread).
fn is_first_thread() -> bool {
    #[cfg(target_os = "linux")]
    {
        let Ok(link) = std::fs::read_link("/proc/thread-self") else {
            return true;
        };
        let tid = link
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.parse::<u32>().ok());
        match tid {
            Some(tid) => tid == std::process::id(),
            None => true,
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        true
    }
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
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut future = pin!(future);
    loop {
        let turn = py.detach(|| {
            let mut cx = Context::from_waker(&waker);
            if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                return Turn::Ready(out);
            }
            let mut nap = signal_check();
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
