//! What the rayon stress tests (`tests/stress.rs`, `tests/pool_stress.rs`)
//! share: a tiny deterministic PRNG, the observer thread that samples a
//! structure's invariants while the workers run, and the worker pool.
//!
//! Included by each of them with `mod common;` (a directory module, so
//! that cargo does not build it as a test of its own).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::thread;

// ---------------------------------------------------------------------------
// A tiny deterministic PRNG
// ---------------------------------------------------------------------------

/// Marsaglia's xorshift64.
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        // Spread small seeds over the word; the state must not be 0.
        XorShift(seed.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform enough in `0..n` for a test's operation mix (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

// ---------------------------------------------------------------------------
// The observer and the thread pool
// ---------------------------------------------------------------------------

/// Sets the stop flag when dropped, so that a panicking `work` also stops
/// the observer (instead of leaving the scope waiting for it forever).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        // Release: pairs with the observer's Acquire load; it only ends the
        // observer's loop.
        self.0.store(true, Ordering::Release);
    }
}

/// Runs `work` while a separate std thread calls `sample` (which asserts
/// the invariants) over and over; returns what `work` returned and how many
/// samples the observer took (at least one while `work` may run, and one
/// after it ended).
///
/// # Panics
///
/// Panics with "observer saw a broken invariant" if `sample` panicked.
pub fn run_observed<R: Send>(
    mut sample: impl FnMut() + Send,
    work: impl FnOnce() -> R + Send,
) -> (R, u64) {
    let stop = AtomicBool::new(false);
    let started = Barrier::new(2);
    let (stop, started) = (&stop, &started);
    thread::scope(|s| {
        let observer = s.spawn(move || {
            let mut samples = 0u64;
            started.wait();
            loop {
                // Acquire: pairs with the Release store in `StopOnDrop`; it
                // orders nothing the samples depend on, it only ends the
                // loop.
                let stopping = stop.load(Ordering::Acquire);
                sample();
                samples += 1;
                if stopping {
                    break;
                }
            }
            samples
        });
        let result = {
            let _stop = StopOnDrop(stop);
            started.wait();
            work()
        };
        let samples = observer.join().expect("observer saw a broken invariant");
        (result, samples)
    })
}

/// A rayon pool of `threads` workers.
pub fn rayon_pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("rayon pool")
}
