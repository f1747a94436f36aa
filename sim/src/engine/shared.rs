//! What the workers, the producer and the monitor share: progress, the stop
//! flag and the errors, the parked idle workers, the KV-memory oracle, and
//! the call watch the livelock watchdog reads.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::stats::OpKind;
use crate::oracle::Oracle;

/// State shared by the threads of one run.
pub(super) struct Shared {
    /// Requests completed or rejected, for progress and stall detection.
    pub(super) finished: AtomicUsize,
    /// Set to stop every worker early (a failure).
    pub(super) abort: AtomicBool,
    /// Failures, in the order they were seen (the first few).
    errors: Mutex<Vec<String>>,
    /// Workers waiting for blocks.
    pub(super) idle: IdleWorkers,
    /// The simulated device memory and the shadow of block holders.
    pub(super) oracle: Oracle,
    /// Per worker: the allocator call it is in, and since when.
    pub(super) watch: Vec<CallWatch>,
    /// The run's start, the origin of the watch's times.
    pub(super) start: Instant,
}

/// The most failures a run keeps.
const MAX_ERRORS: usize = 16;

impl Shared {
    pub(super) fn new(workers: usize, oracle: Oracle) -> Self {
        Shared {
            finished: AtomicUsize::new(0),
            abort: AtomicBool::new(false),
            errors: Mutex::new(Vec::new()),
            idle: IdleWorkers::new(),
            oracle,
            watch: (0..workers).map(|_| CallWatch::default()).collect(),
            start: Instant::now(),
        }
    }

    /// Records a failure and stops the run.
    pub(super) fn fail(&self, msg: String) {
        let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if errors.len() < MAX_ERRORS {
            errors.push(msg);
        }
        drop(errors);
        // Relaxed: a stop request; workers poll it once an iteration.
        self.abort.store(true, Ordering::Relaxed);
        self.idle.wake_all();
    }

    /// Whether the run is being stopped.
    pub(super) fn aborted(&self) -> bool {
        // Relaxed: a stop request, polled.
        self.abort.load(Ordering::Relaxed)
    }

    /// The failures seen so far.
    pub(super) fn errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Nanoseconds since the run's start, at least 1 (0 means "not in a
    /// call" in the watch).
    pub(super) fn now_ns(&self) -> u64 {
        (self.start.elapsed().as_nanos() as u64).max(1)
    }
}

/// One worker's current allocator call, on its own cache line.
#[derive(Default)]
#[repr(align(128))]
pub(super) struct CallWatch {
    /// When the call began ([`Shared::now_ns`]); 0 outside calls.
    since_ns: AtomicU64,
    /// The call's [`OpKind`], as its index.
    kind: AtomicU8,
}

impl CallWatch {
    /// Marks the start of a call.
    #[inline]
    pub(super) fn enter(&self, kind: OpKind, now_ns: u64) {
        // Relaxed (both): the watchdog only needs to see, eventually, a
        // start that is not followed by an exit; a stale read delays it by
        // one monitor interval at most.
        self.kind.store(kind as u8, Ordering::Relaxed);
        self.since_ns.store(now_ns, Ordering::Relaxed);
    }

    /// Marks the end of the call.
    #[inline]
    pub(super) fn exit(&self) {
        // Relaxed: as in `enter`.
        self.since_ns.store(0, Ordering::Relaxed);
    }

    /// The call in progress for longer than `limit` at `now_ns`, if any:
    /// its kind and how long it has run.
    pub(super) fn stuck(&self, now_ns: u64, limit: Duration) -> Option<(OpKind, Duration)> {
        // Relaxed: as in `enter`.
        let since = self.since_ns.load(Ordering::Relaxed);
        let kind = OpKind::ALL[usize::from(self.kind.load(Ordering::Relaxed)) % OpKind::ALL.len()];
        let running = Duration::from_nanos(now_ns.saturating_sub(since));
        (since != 0 && running > limit).then_some((kind, running))
    }
}

/// Idle workers, parked until another worker frees blocks.
pub(super) struct IdleWorkers {
    /// How many are registered; read without the lock by whoever frees.
    parked: AtomicUsize,
    threads: Mutex<Vec<std::thread::Thread>>,
}

impl IdleWorkers {
    fn new() -> Self {
        IdleWorkers {
            parked: AtomicUsize::new(0),
            threads: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<std::thread::Thread>> {
        self.threads.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn register(&self) {
        self.lock().push(std::thread::current());
        // SeqCst, with the fence in `wake_all`: either this registration is
        // seen by a waker that freed blocks, or the admission attempt that
        // follows it sees those blocks (a store-load pair on both sides).
        self.parked.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    pub(super) fn unregister(&self) {
        let me = std::thread::current().id();
        let mut threads = self.lock();
        if let Some(i) = threads.iter().position(|t| t.id() == me) {
            threads.swap_remove(i);
        }
        // Relaxed: the count only gates the waker's lock; the list under
        // the lock is the truth.
        self.parked.fetch_sub(1, Ordering::Relaxed);
    }

    /// Wakes every parked worker; called after freeing blocks.
    pub(super) fn wake_all(&self) {
        // SeqCst: pairs with the fence in `register` (see there).
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) > 0 {
            for t in self.lock().iter() {
                t.unpark();
            }
        }
    }
}
