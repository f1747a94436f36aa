//! A small per-thread number: which free-list shard a thread calls home.

/// A small number that stays the same for the calling thread: the
/// free-list shard it calls home.
///
/// Threads are numbered in the order they first ask, which is when they
/// first allocate from or free to any pool (admission, its release and a
/// pop ask): a thread-local cached from a counter, so that `n` threads
/// spread over `n` shards without registering.
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
