//! The mutex baselines that the benchmarks share, one per concept: a
//! used-slot count behind a lock ([`MutexCounter`], the peer of
//! `SlotCounter`) and a free list of block ids behind a lock
//! ([`MutexFreeList`], the peer of `BlockPool`), each over
//! `std::sync::Mutex` or `parking_lot::Mutex`; and the thread counts of
//! the contended benchmarks ([`threads::bench_threads`]).

// Each benchmark binary uses a part of this module.
#![allow(dead_code)]

pub mod cache;
pub mod threads;

/// A mutex that the baselines can be built on.
pub trait Lock<T>: Send + Sync {
    /// A lock holding `value`.
    fn new(value: T) -> Self;
    /// Runs `f` on the value with the lock held.
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R;
}

impl<T: Send> Lock<T> for std::sync::Mutex<T> {
    fn new(value: T) -> Self {
        std::sync::Mutex::new(value)
    }

    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.lock().unwrap())
    }
}

impl<T: Send> Lock<T> for parking_lot::Mutex<T> {
    fn new(value: T) -> Self {
        parking_lot::Mutex::new(value)
    }

    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.lock())
    }
}

/// A used-slot count behind a lock: to take, lock, check that the request
/// fits and add; to give back, lock and subtract.
pub struct MutexCounter<L> {
    used: L,
    capacity: usize,
}

/// [`MutexCounter`] over `std::sync::Mutex`.
pub type StdMutexCounter = MutexCounter<std::sync::Mutex<usize>>;
/// [`MutexCounter`] over `parking_lot::Mutex`.
pub type PlMutexCounter = MutexCounter<parking_lot::Mutex<usize>>;

impl<L: Lock<usize>> MutexCounter<L> {
    /// A counter of `capacity` free slots.
    pub fn new(capacity: usize) -> Self {
        MutexCounter {
            used: L::new(0),
            capacity,
        }
    }

    /// Takes `n` slots if they fit, all or nothing.
    #[inline]
    pub fn take(&self, n: usize) -> bool {
        self.used.with(|used| {
            let fits = n <= self.capacity - *used;
            if fits {
                *used += n;
            }
            fits
        })
    }

    /// Gives back `n` slots taken with [`take`](Self::take).
    #[inline]
    pub fn give(&self, n: usize) {
        self.used.with(|used| *used -= n);
    }
}

/// A free list of block ids behind a lock: a `Vec<u32>` used as a stack,
/// lowest id on top.
pub struct MutexFreeList<L> {
    free: L,
}

/// [`MutexFreeList`] over `std::sync::Mutex`.
pub type StdMutexFreeList = MutexFreeList<std::sync::Mutex<Vec<u32>>>;
/// [`MutexFreeList`] over `parking_lot::Mutex`.
pub type PlMutexFreeList = MutexFreeList<parking_lot::Mutex<Vec<u32>>>;

impl<L: Lock<Vec<u32>>> MutexFreeList<L> {
    /// A free list holding every id `0..num_blocks`.
    pub fn new(num_blocks: usize) -> Self {
        MutexFreeList {
            free: L::new((0..num_blocks as u32).rev().collect()),
        }
    }

    /// Takes `n` ids into `out` if that many are free, all or nothing.
    #[inline]
    pub fn take(&self, n: usize, out: &mut Vec<u32>) -> bool {
        self.free.with(|free| {
            if free.len() < n {
                return false;
            }
            let at = free.len() - n;
            out.extend(free.drain(at..));
            true
        })
    }

    /// Gives back ids taken with [`take`](Self::take).
    #[inline]
    pub fn give(&self, ids: &[u32]) {
        self.free.with(|free| free.extend_from_slice(ids));
    }
}
