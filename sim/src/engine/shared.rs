//! What the workers, the producer and the monitor share: progress, the stop
//! flag and the errors, the KV-memory oracle, and the call watch the
//! livelock watchdog reads. (Idle workers wait in the allocator, which
//! wakes them, or retry on a timer.)

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
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
    /// Requests admitted and not yet completed or preempted, over every
    /// worker, sampled for the report.
    pub(super) running: AtomicUsize,
    /// The most `running` has been.
    pub(super) running_peak: AtomicUsize,
    /// Failures, in the order they were seen (the first few).
    errors: Mutex<Vec<String>>,
    /// The simulated device memory and the shadow of block holders.
    pub(super) oracle: Oracle,
    /// Per worker: the allocator call it is in, and since when.
    pub(super) watch: Vec<CallWatch>,
    /// The run's start, the origin of the watch's times.
    pub(super) start: Instant,
    /// The priority group's request id plus 1 (0: none): see
    /// [`hold_priority`](Self::hold_priority).
    priority: AtomicUsize,
    /// Set while the priority group is refused: no worker admits a new
    /// request until it goes on.
    blocked: AtomicBool,
}

/// The most failures a run keeps.
const MAX_ERRORS: usize = 16;

impl Shared {
    pub(super) fn new(workers: usize, oracle: Oracle) -> Self {
        Shared {
            finished: AtomicUsize::new(0),
            abort: AtomicBool::new(false),
            running: AtomicUsize::new(0),
            running_peak: AtomicUsize::new(0),
            errors: Mutex::new(Vec::new()),
            oracle,
            watch: (0..workers).map(|_| CallWatch::default()).collect(),
            start: Instant::now(),
            priority: AtomicUsize::new(0),
            blocked: AtomicBool::new(false),
        }
    }

    /// Makes the running group of request `id` the priority group, unless
    /// another one is; returns whether it is (now or already).
    ///
    /// The priority group is the first group refused with nothing else on
    /// its worker to preempt, and stays so until it is released (it
    /// completes, or the run ends). It is never preempted: while it is
    /// refused ([`set_blocked`](Self::set_blocked)) no worker admits a new
    /// request, and every other group that is refused preempts itself or a
    /// younger group of its worker, so the blocks come back until it fits
    /// (it fits the pool alone), and it completes. Without it, groups that
    /// each need more than the pool has left beside the others can preempt
    /// one another for ever, each freed block going to the next waiter.
    pub(super) fn hold_priority(&self, id: usize) -> bool {
        // Relaxed (all of the priority and blocked words): scheduling
        // hints between workers, which order nothing (the allocator and
        // the oracle order the blocks); each worker sees the others'
        // writes eventually, which is all the progress argument needs.
        match self
            .priority
            .compare_exchange(0, id + 1, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => true,
            Err(holder) => holder == id + 1,
        }
    }

    /// Whether request `id`'s group is the priority group.
    pub(super) fn is_priority(&self, id: usize) -> bool {
        // Relaxed: see `hold_priority`.
        self.priority.load(Ordering::Relaxed) == id + 1
    }

    /// The priority group's request id, if there is one.
    pub(super) fn priority(&self) -> Option<usize> {
        // Relaxed: see `hold_priority`.
        self.priority.load(Ordering::Relaxed).checked_sub(1)
    }

    /// Releases the priority if request `id`'s group holds it.
    pub(super) fn release_priority(&self, id: usize) {
        // Relaxed: see `hold_priority`.
        if self
            .priority
            .compare_exchange(id + 1, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.blocked.store(false, Ordering::Relaxed);
        }
    }

    /// Sets (or clears) whether the priority group is refused; only its
    /// worker calls it.
    pub(super) fn set_blocked(&self, blocked: bool) {
        // Relaxed: see `hold_priority`. The load keeps the line shared
        // while nothing changes.
        if self.blocked.load(Ordering::Relaxed) != blocked {
            self.blocked.store(blocked, Ordering::Relaxed);
        }
    }

    /// Whether the priority group is refused: no new admission now.
    pub(super) fn blocked(&self) -> bool {
        // Relaxed: see `hold_priority`.
        self.blocked.load(Ordering::Relaxed)
    }

    /// Records a failure and stops the run.
    pub(super) fn fail(&self, msg: String) {
        let mut errors = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if errors.len() < MAX_ERRORS {
            errors.push(msg);
        }
        drop(errors);
        // Relaxed: a stop request; workers poll it once an iteration (a
        // worker waiting in the allocator within its wait's timeout).
        self.abort.store(true, Ordering::Relaxed);
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
