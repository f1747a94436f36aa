//! A small per-thread number: which free-list shard a thread calls home.

/// A small number that stays the same for the calling thread: the
/// free-list shard it calls home.
///
/// Threads are numbered in the order they first ask, which is when they
/// first allocate from or free to any pool (admission, its release and a
/// take from the free list ask): a thread-local cached from a counter, so
/// that `n` threads spread over `n` shards without registering.
///
/// Under loom the counter and the thread-local are loom's
/// (`loom::lazy_static!`, `loom::thread_local!`), which start afresh in
/// every execution of a model, so a schedule numbers its threads the same
/// way each time loom replays it. The counter itself is a `std` atomic: it
/// is bookkeeping outside the model and adds no scheduling point. Under
/// shuttle it is the model's own thread number.
#[inline]
pub(crate) fn thread_index() -> usize {
    #[cfg(all(test, kvslots_loom))]
    {
        use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
        loom::lazy_static! {
            static ref NEXT: StdAtomicUsize = StdAtomicUsize::new(0);
        }
        loom::thread_local! {
            // Relaxed: only uniqueness matters, and a RMW gives that.
            static INDEX: usize = NEXT.fetch_add(1, StdOrdering::Relaxed);
        }
        INDEX.with(|index| *index)
    }
    #[cfg(all(kvslots_shuttle, not(all(test, kvslots_loom))))]
    {
        usize::from(shuttle::thread::current().id())
    }
    #[cfg(not(any(all(test, kvslots_loom), kvslots_shuttle)))]
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

/// Division by a fixed `n`, with multiplications instead of a division
/// (Lemire's "faster remainder by direct computation"), exact for every
/// 32-bit dividend: the calling thread's home among `n` places
/// ([`home`](Self::home), on every fast path), and a block's shard.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Divisor {
    /// The divisor, at least 1.
    n: u32,
    /// `ceil(2^64 / n)`, or 0 for a divisor of 1.
    magic: u64,
}

impl Divisor {
    /// Division by `n > 0` (at most `u32::MAX`).
    pub(crate) fn new(n: usize) -> Divisor {
        debug_assert!(n > 0 && n <= u32::MAX as usize);
        let n = n as u32;
        let magic = if n == 1 {
            0
        } else {
            (u64::MAX / u64::from(n)).wrapping_add(1)
        };
        Divisor { n, magic }
    }

    /// `index % n` (for `index` below 2^32).
    #[inline]
    pub(crate) fn rem(self, index: usize) -> usize {
        let low = self.magic.wrapping_mul(u64::from(index as u32));
        ((u128::from(low) * u128::from(self.n)) >> 64) as usize
    }

    /// `index / n`.
    #[inline]
    pub(crate) fn div(self, index: u32) -> u32 {
        if self.n == 1 {
            return index;
        }
        ((u128::from(self.magic) * u128::from(index)) >> 64) as u32
    }

    /// The calling thread's home: `thread_index() % n` (for thread
    /// numbers below 2^32).
    #[inline]
    pub(crate) fn home(self) -> usize {
        self.rem(thread_index())
    }
}

#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
mod tests {
    use super::Divisor;

    #[test]
    fn divisions_are_exact() {
        for n in [
            1usize,
            2,
            3,
            7,
            16,
            64,
            67,
            1000,
            1024,
            65_537,
            u32::MAX as usize,
        ] {
            let d = Divisor::new(n);
            let samples = (0..5000u32).chain([
                u32::MAX - 1,
                u32::MAX,
                n as u32 - 1,
                n as u32,
                (n as u32).wrapping_mul(3),
            ]);
            for i in samples {
                assert_eq!(d.rem(i as usize), i as usize % n, "{i} % {n}");
                assert_eq!(d.div(i), i / n as u32, "{i} / {n}");
            }
        }
    }
}
