//! The atomics facade: the one place where `kvslots` names its atomic types.
//!
//! Every other module reaches atomics through here, so that the model
//! checkers can swap in their own instrumented types without touching the
//! algorithms:
//!
//! * normally, these are `std::sync::atomic`'s types;
//! * with `RUSTFLAGS="--cfg kvslots_loom"`, they are [loom]'s, and every
//!   access becomes a scheduling point that loom explores exhaustively;
//! * with `RUSTFLAGS="--cfg kvslots_shuttle"`, they are [shuttle]'s, for
//!   randomised schedules of many threads.
//!
//! The cfgs are crate-specific on purpose: a plain `--cfg loom` would also
//! switch every dependency that knows about loom, and would change what is
//! being checked.
//!
//! This module is public, but hidden from the docs, only so that the
//! `loom-tests` crate can write its deliberately wrong negative controls
//! against exactly the same types as the real code.
//!
//! [loom]: https://docs.rs/loom
//! [shuttle]: https://docs.rs/shuttle

#[cfg(kvslots_loom)]
pub use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

#[cfg(all(kvslots_shuttle, not(kvslots_loom)))]
pub use shuttle::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

#[cfg(not(any(kvslots_loom, kvslots_shuttle)))]
pub use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Pads and aligns a value to the length of a cache line, so that two hot
/// atomics never share a line (false sharing).
pub use crossbeam_utils::CachePadded;

/// Exponential backoff for compare-and-swap retry loops: after a failed CAS,
/// wait [`Backoff::FIRST_SPINS`] spin hints, doubling on each further
/// failure up to [`Backoff::MAX_SPINS`].
///
/// `crossbeam_utils::Backoff` starts at 1 spin. On two contending cores,
/// the filtered harness `benches/overlap.rs` measured `try_reserve`+drop at
/// 0.64x of a bare `fetch_add`/`fetch_sub` pair with a first wait of 0
/// spins, 0.73x with 1, 0.85x with 2, 0.96x with 4 and 1.19x with 8 (see
/// the README's Performance section): a failed CAS means the line just
/// moved to another core, and retrying at once only pulls it back before
/// that core is done with it. Longer first waits raise throughput further
/// but let one thread keep the line for longer streaks (less fair), so 4 is
/// the compromise.
///
/// Under the model checkers it only emits spin hints, which are not
/// scheduling points, so it changes nothing loom or shuttle explore.
#[derive(Debug)]
pub struct Backoff {
    spins: std::cell::Cell<u32>,
}

impl Backoff {
    /// Spin hints of the first wait.
    pub const FIRST_SPINS: u32 = 4;
    /// The longest wait, in spin hints.
    pub const MAX_SPINS: u32 = 64;

    /// A backoff whose next wait is the first.
    #[inline]
    pub fn new() -> Backoff {
        Backoff {
            spins: std::cell::Cell::new(Self::FIRST_SPINS),
        }
    }

    /// Waits, then doubles the next wait (up to the maximum).
    #[inline]
    pub fn spin(&self) {
        let spins = self.spins.get();
        for _ in 0..spins {
            std::hint::spin_loop();
        }
        self.spins.set((spins * 2).min(Self::MAX_SPINS));
    }
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff::new()
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
    #[cfg(kvslots_loom)]
    loom::thread::yield_now();
    #[cfg(all(kvslots_shuttle, not(kvslots_loom)))]
    shuttle::thread::yield_now();
    backoff.spin();
}

/// A small number that stays the same for the calling thread: the
/// free-list shard it calls home.
///
/// Threads are numbered in the order they first ask, which is when they
/// first allocate from any pool (only a pop asks; a thread-local cached
/// from a global counter), so that `n` threads spread over `n` shards.
/// Under loom and shuttle it is the model's own thread number, which is the
/// same in every execution of a model (a global counter would not be).
#[inline]
pub(crate) fn thread_index() -> usize {
    #[cfg(kvslots_loom)]
    return model_thread::loom_index();
    #[cfg(all(kvslots_shuttle, not(kvslots_loom)))]
    return usize::from(shuttle::thread::current().id());
    #[cfg(not(any(kvslots_loom, kvslots_shuttle)))]
    {
        use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
        static NEXT: StdAtomicUsize = StdAtomicUsize::new(0);
        thread_local! {
            // Relaxed: only uniqueness matters, and a RMW gives that.
            static INDEX: usize = NEXT.fetch_add(1, StdOrdering::Relaxed);
        }
        // During thread-local teardown: any shard is correct, only slower.
        INDEX.try_with(|index| *index).unwrap_or(0)
    }
}

/// Loom's thread numbers (only under `--cfg kvslots_loom`).
#[cfg(kvslots_loom)]
mod model_thread {
    use std::fmt::Write;

    /// Keeps the decimal digits written to it, as a number.
    struct Digits(usize);

    impl Write for Digits {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            for d in s.bytes().filter(u8::is_ascii_digit) {
                self.0 = self.0 * 10 + usize::from(d - b'0');
            }
            Ok(())
        }
    }

    /// The model's number of the calling thread, read from its id's `Debug`
    /// output (`ThreadId(n)`), the one stable form loom offers.
    pub(super) fn loom_index() -> usize {
        let mut digits = Digits(0);
        let _ = write!(digits, "{:?}", loom::thread::current().id());
        digits.0
    }
}
