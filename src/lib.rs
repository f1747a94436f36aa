//! Lock-free, all-or-nothing KV-cache slot allocation for multi-threaded LLM
//! inference workers.
//!
//! An inference server keeps every running sequence's keys and values in a
//! fixed pool of device memory, cut into token slots. A multi-token append
//! (a prefill chunk, `k` speculative draft tokens) must take **all its slots
//! or none**: a partial admission leaks slots and stalls the scheduler, an
//! overcommit overwrites another sequence's cache. `kvslots` keeps that rule
//! without a lock, so that many worker threads can admit, grow, roll back and
//! free at once.
//!
//! # Usage
//!
//! * [`admit`]: the admission rule as a pure `const fn`.
//! * [`SlotCounter`]: the rule applied atomically to a shared used-counter,
//!   as plain counts ([`SlotCounter::admit`] / [`SlotCounter::release`]) or
//!   as RAII guards ([`Reservation`], [`OwnedReservation`]) that can be
//!   split, merged, shrunk (speculative rollback), grown and forgotten.
//! * [`SlotCounter::close`] stops admission while releases keep working, so
//!   workers can drain on shutdown.
//! * [`BlockPool`]: a paged KV cache of `num_blocks` blocks of `block_size`
//!   slots; [`BlockPool::try_alloc`] takes `n` distinct block ids or none,
//!   [`BlockPool::free`] drops references, all or nothing (see
//!   [`FreeError::Raced`] for the one exception). [`BlockPool::builder`]
//!   builds one with a [`ConfigError`] for a configuration it refuses (a
//!   zero block size, too many blocks or shards, too little memory) where
//!   [`BlockPool::new`] panics.
//! * [`Sequence`]: one sequence's block table over a shared pool: the
//!   multi-token append ([`Sequence::try_append`]), whole-prompt reservation
//!   ([`Sequence::try_reserve`]), the slot mapping kernels take
//!   ([`Sequence::slot`], [`Sequence::extend_slots`]), rollback
//!   ([`Sequence::truncate`]) and forks that share full blocks
//!   ([`Sequence::try_fork`], with the [`BlockCopy`] to make).
//! * [`Sequence::try_append_cow`]: the append after a truncate into a block
//!   shared with a fork, returning the copy-on-write to make
//!   ([`Sequence::try_append`] panics there rather than lose it).
//! * [`table`]: the block-table arithmetic `Sequence` applies, for block
//!   tables kept elsewhere.
//! * Prefix caching: [`hash_blocks`] computes the content keys
//!   ([`BlockHash`]) of a prompt's full blocks, and [`hash_blocks_with`]
//!   also folds in tagged extra keys ([`ExtraKey`]: LoRA adapters, cache
//!   salts, multimodal inputs) per block;
//!   [`Sequence::publish`] caches a sequence's full blocks under them, and
//!   [`Sequence::try_match_prefix`] takes the cached blocks of the longest
//!   matching prefix into a new sequence. Unreferenced cached blocks count
//!   as free and are evicted least recently released first;
//!   [`BlockPool::prefix_stats`] reports hits and evictions.
//! * Waiting instead of retrying: [`SlotCounter::reserve`],
//!   [`SlotCounter::reserve_owned`], [`BlockPool::alloc`] and
//!   [`Sequence::reserve`] are futures, and each has a `*_blocking` form
//!   for thread-based workers (see [Waiting](#waiting)).
//! * Fenced release, for asynchronous scheduling: [`Sequence::retire`] and
//!   [`Sequence::truncate_fenced`] keep the blocks a device step may still
//!   read in use until [`BlockPool::complete`] declares the step's fence
//!   done (fences complete in any order);
//!   [`BlockPool::pending_release_blocks`] counts them.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use std::thread;
//! use kvslots::SlotCounter;
//!
//! let counter = Arc::new(SlotCounter::new(64));
//! let workers: Vec<_> = (0..4)
//!     .map(|_| {
//!         let counter = Arc::clone(&counter);
//!         thread::spawn(move || {
//!             // A 12-token prefill chunk: all of it, or nothing.
//!             if let Ok(mut chunk) = counter.try_reserve(12) {
//!                 // 4 speculative draft tokens, of which 1 is accepted.
//!                 if chunk.try_grow(4).is_ok() {
//!                     chunk.shrink_to(13);
//!                 }
//!                 assert!(counter.used() <= counter.capacity());
//!             } // dropped: its slots go back
//!         })
//!     })
//!     .collect();
//! for w in workers {
//!     w.join().unwrap();
//! }
//! assert_eq!(counter.used(), 0);
//! ```
//!
//! A paged cache, as a worker thread uses it:
//!
//! ```
//! use std::sync::Arc;
//! use kvslots::{BlockPool, Sequence};
//!
//! let pool = Arc::new(BlockPool::new(64, 16));
//! let mut seq = Sequence::new(Arc::clone(&pool));
//! seq.try_reserve(100, 4).unwrap(); // admit a 100-token prompt, 4 blocks of headroom
//! let mut slots = Vec::new();
//! for chunk in [64, 36] {
//!     let positions = seq.try_append(chunk).unwrap(); // chunked prefill
//!     slots.clear();
//!     seq.extend_slots(positions, &mut slots).unwrap(); // the kernel's slot mapping
//! }
//! let drafts = seq.try_append(4).unwrap(); // 4 speculative tokens
//! seq.truncate(drafts.start + 1); // 1 accepted
//! assert_eq!(seq.len(), 101);
//! drop(seq);
//! assert_eq!(pool.free_blocks(), 64);
//! ```
//!
//! # Waiting
//!
//! A request that does not fit can wait in the allocator's queue: waiters
//! are served strictly in arrival order, each granted whole, with or
//! without headroom (the units are taken on the waiter's behalf by the
//! release that frees them, and its task is woken), and a new caller
//! never passes a queued waiter: a new waiter queues behind it, and while
//! anyone waits a `try_*` admission takes units only if the waiters, each
//! granted in order with its headroom, still fit beside it (otherwise
//! [`ReserveError::BehindWaiters`]). The growth of running sequences does
//! not wait behind the queue. `NeverFits` is returned at once (for a
//! [`Sequence`], also a request that cannot fit beside its own blocks);
//! `close` wakes every waiter with `Closed`; a blocking call's timeout
//! returns `Full` or `BehindWaiters`. Dropping a waiting future is always
//! safe: it gives back anything granted to it and lets the waiters behind
//! it be served. Wakers run outside the queue's lock. The
//! library uses std's `Waker` and depends on no async runtime. The
//! [design notes](implementation#waiting) give the rules (with a table of
//! who gets what, including how running sequences keep room to grow) and
//! where a lock is taken; `examples/async_worker.rs` and
//! `examples/blocking_worker.rs` show a worker of each kind.
//!
//! ```
//! use std::sync::Arc;
//! use kvslots::SlotCounter;
//!
//! let counter = Arc::new(SlotCounter::new(8));
//! let held = counter.try_reserve_owned(8).unwrap();
//! let worker = std::thread::spawn({
//!     let counter = Arc::clone(&counter);
//!     move || counter.reserve_blocking(6, None).map(|r| r.len())
//! });
//! drop(held); // hands the slots to the waiter, whenever it queued
//! assert_eq!(worker.join().unwrap(), Ok(6));
//! ```
//!
//! # Safety and Correctness
//!
//! `kvslots` is `#![forbid(unsafe_code)]`. Its atomics go through one facade
//! module, so the same code runs under [loom] (`--cfg kvslots_loom`), which
//! explores every interleaving of two-thread models and of three-thread
//! models up to a preemption bound (`LOOM_MAX_PREEMPTIONS`, 2 in CI), at
//! capacities 1 to 5, and checks that no admission is partial, that `used <= capacity` at
//! every step, and that everything is given back once every guard is gone.
//! Every model has a negative control: the two known wrong ways to admit
//! (token by token, and against total capacity) and the check-then-add race
//! are written against the same facade, and loom must catch each of them.
//! The block pool's models do the same for allocation, frees, shards,
//! reference counts and sequences, with a negative control per injected
//! fault (a free list that takes without a read-modify-write, `Relaxed`
//! frees, a raw free that takes a sequence's reference, and others).
//! Rayon stress tests drive millions of mixed operations on many threads
//! while an observer samples the invariant, and the same facade runs the
//! shuttle schedules (`--cfg kvslots_shuttle`) on 8 threads. See the README
//! for the commands.
//!
//! # Performance
//!
//! Admission is one compare-and-swap on one cache-padded word, with
//! exponential backoff on contention; giving back a guard is one
//! `fetch_sub`, then a fence and one load to see whether anyone waits. No
//! lock is taken and nothing is allocated on these paths.
//! A block allocation is that admission plus one CAS on the calling
//! thread's home shard of the free list, whatever the pool size.
//! `benches/contention.rs` measures admission against `std::sync::Mutex`,
//! `parking_lot::Mutex`, `tokio::sync::Semaphore` and a bare
//! `fetch_add`/`fetch_sub` pair, and `benches/pool.rs` the block pool
//! against mutex-guarded free lists; `BENCHMARKS.md` has the figures, with
//! when a lock is cheaper.
//!
//! # Implementation
//!
//! The [`implementation`] module describes the state word and its CAS
//! loops, the free list (per-shard bitmaps) and its shards, reference
//! counts, sequences and copy-on-write, and the memory orderings of each
//! type.
//!
//! [loom]: https://docs.rs/loom

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod array;
mod counter;
mod error;
mod free_list;
mod hash;
mod id;
pub mod implementation;
mod pool;
mod sequence;
mod sync;
pub mod table;
mod wait;

pub use counter::guard::{OwnedReservation, Reservation};
pub use counter::wait::{Reserve, ReserveOwned};
pub use counter::SlotCounter;
pub use error::{ConfigError, ExtraKeyError, FreeError, PositionError, ReleaseError, ReserveError};
pub use hash::{hash_blocks, hash_blocks_with, BlockHash, ExtraKey};
pub use id::BlockId;
pub use pool::{Alloc, BlockPool, BlockPoolBuilder, PrefixStats};
pub use sequence::{BlockCopy, Sequence};

/// The seam for the model-checking suites (`loom-tests`, `tests/shuttle.rs`):
/// not part of the API, and not covered by semver.
///
/// It gives the suites the atomics facade's types, so that their
/// deliberately wrong allocators use exactly the atomics the real code
/// uses, and a pool with the faults of loom's negative controls.
#[doc(hidden)]
pub mod __model {
    pub use crate::sync::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Faults, Ordering};

    /// A [`BlockPool`](crate::BlockPool) as
    /// [`with_shards`](crate::BlockPool::with_shards) builds it, carrying
    /// `faults`.
    pub fn pool_with_faults(
        num_blocks: usize,
        block_size: usize,
        shards: usize,
        faults: Faults,
    ) -> crate::BlockPool {
        crate::BlockPool::with_faults(num_blocks, block_size, shards, faults)
    }

    /// The sum of `pool`'s per-shard admission counts, without the cap at
    /// `num_blocks` that [`free_blocks`](crate::BlockPool::free_blocks)
    /// applies: once no call is running it must equal `free_blocks()`.
    pub fn admission_free(pool: &crate::BlockPool) -> usize {
        pool.admission_free_uncapped()
    }

    /// A [`SlotCounter`](crate::SlotCounter) of `capacity` slots whose wait
    /// queue carries `faults`.
    pub fn counter_with_faults(capacity: usize, faults: Faults) -> crate::SlotCounter {
        crate::SlotCounter::with_faults(capacity, faults)
    }
}

/// The admission rule, as a pure function: how many of `requested` slots to
/// admit when `used` of `capacity` are taken.
///
/// Admits `requested` if `0 < requested <= capacity - used`, and otherwise
/// 0: never a part of a request. A request of zero or less admits nothing,
/// and so does the impossible state `used > capacity`. It never overflows and
/// never panics.
///
/// # Examples
///
/// ```
/// use kvslots::admit;
///
/// assert_eq!(admit(4, 1, 3), 3); // fits exactly
/// assert_eq!(admit(4, 2, 3), 0); // one free short: nothing, not 2
/// assert_eq!(admit(5, 3, 0), 0); // empty append
/// assert_eq!(admit(5, 0, -1), 0); // negative request
/// assert_eq!(admit(1, 2, 1), 0); // overcommitted state: nothing
/// ```
pub const fn admit(capacity: usize, used: usize, requested: isize) -> usize {
    // Empty, negative, or an impossible state? Admit nothing.
    if requested <= 0 || used > capacity {
        return 0;
    }
    // `requested > 0`, so the cast is exact; `used <= capacity`, so the
    // subtraction cannot underflow.
    let requested = requested as usize;
    if requested <= capacity - used {
        requested
    } else {
        0
    }
}

/// The README's code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
