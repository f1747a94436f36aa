//! Waiting between the attempts of a compare-and-swap retry loop.

/// Exponential backoff for compare-and-swap retry loops: after a failed CAS,
/// wait [`Backoff::FIRST_SPINS`] spin hints, doubling on each further
/// failure up to [`Backoff::MAX_SPINS`].
///
/// A failed CAS means that the cache line just moved to another core;
/// retrying at once only pulls the line back before that core has finished
/// its own read-modify-write, and the two cores then trade the line on every
/// attempt. `crossbeam_utils::Backoff` starts at 1 spin; a first wait of 4
/// lets the winner finish, which raises throughput on two contending cores
/// (the measurements are in `BENCHMARKS.md`). Longer first waits raise
/// throughput further but let one thread keep the line for longer streaks
/// (less fair), so 4 is the compromise.
///
/// Under the model checkers it only emits spin hints, which are not
/// scheduling points, so it changes nothing loom or shuttle explore.
#[derive(Debug)]
pub(crate) struct Backoff {
    spins: std::cell::Cell<u32>,
}

impl Backoff {
    /// Spin hints of the first wait.
    pub(crate) const FIRST_SPINS: u32 = 4;
    /// The longest wait, in spin hints.
    pub(crate) const MAX_SPINS: u32 = 64;

    /// A backoff whose next wait is the first.
    #[inline]
    pub(crate) fn new() -> Backoff {
        Backoff {
            spins: std::cell::Cell::new(Self::FIRST_SPINS),
        }
    }

    /// Waits, then doubles the next wait (up to the maximum).
    #[inline]
    pub(crate) fn spin(&self) {
        let spins = self.spins.get();
        for _ in 0..spins {
            std::hint::spin_loop();
        }
        self.spins.set((spins * 2).min(Self::MAX_SPINS));
    }
}

/// Backs off before retrying after a read that may have been stale (not a
/// failed CAS, which always reads the latest value).
///
/// Under loom this is a yield: loom lets a plain load keep returning a stale
/// value until the thread yields, so a retry loop that only reloads would
/// spin forever in the model. Under shuttle it yields too; otherwise it is
/// the usual exponential spin.
pub(crate) fn stale_retry(backoff: &Backoff) {
    #[cfg(all(test, kvslots_loom))]
    loom::thread::yield_now();
    #[cfg(all(kvslots_shuttle, not(all(test, kvslots_loom))))]
    shuttle::thread::yield_now();
    backoff.spin();
}

/// Gives up the calling thread's time slice, so that another thread (one
/// whose work it waits for, a bounded number of times) can run: the model
/// checker's yield under loom and shuttle, the operating system's
/// otherwise.
pub(crate) fn yield_now() {
    #[cfg(all(test, kvslots_loom))]
    loom::thread::yield_now();
    #[cfg(all(kvslots_shuttle, not(all(test, kvslots_loom))))]
    shuttle::thread::yield_now();
    #[cfg(not(any(all(test, kvslots_loom), kvslots_shuttle)))]
    std::thread::yield_now();
}
