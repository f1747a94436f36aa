//! The atomics facade: the one place where `kvslots` names its atomic types,
//! and the one place that knows about the model checkers.
//!
//! Every other module reaches atomics through here, so that the model
//! checkers can swap in their own instrumented types without touching the
//! algorithms:
//!
//! * normally, these are `std::sync::atomic`'s types;
//! * in the crate's own unit tests under `RUSTFLAGS="--cfg kvslots_loom"`
//!   (`cfg(all(test, kvslots_loom))`, the loom models of
//!   `crate::loom_tests`), they are [loom]'s, and every access becomes a
//!   scheduling point that loom explores exhaustively; a build of the
//!   library for anything else (its integration tests, a dependent crate)
//!   keeps `std`'s under that cfg;
//! * with `RUSTFLAGS="--cfg kvslots_shuttle"`, they are [shuttle]'s, for
//!   the randomised schedules of many threads of `tests/shuttle*.rs`, which
//!   use the library from outside.
//!
//! The cfgs are crate-specific on purpose: a plain `--cfg loom` would also
//! switch every dependency that knows about loom, and would change what is
//! being checked.
//!
//! The waiting paths' mutex and condition variable come from here
//! too (`lock`), so that loom and shuttle model the wait queue's locking
//! and wake-ups.
//!
//! Besides the atomic types, this module holds the five things that differ
//! under a model checker: how a retry after a stale read waits
//! ([`stale_retry`]), how a thread gives up its time slice
//! ([`yield_now`]), how threads are numbered ([`thread_index()`]), the
//! seed of a pool's index hash ([`index_seed`]: random, or fixed so that a
//! schedule replays), and the faults that loom's negative controls inject
//! ([`Faults`], empty and with hooks that are the correct behaviour in
//! every build but the loom models').
//!
//! Nothing here is public: the model checkers reach it from inside the
//! crate (loom) or only through its effect on the public types (shuttle).
//!
//! [loom]: https://docs.rs/loom
//! [shuttle]: https://docs.rs/shuttle

mod atomic;
mod backoff;
mod faults;
mod lock;
mod seed;
mod thread_index;

pub(crate) use atomic::CachePadded;
pub(crate) use atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};
pub(crate) use backoff::{stale_retry, yield_now, Backoff};
pub(crate) use faults::Faults;
pub(crate) use lock::{Condvar, Mutex, MutexGuard};
pub(crate) use seed::index_seed;
#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
pub(crate) use seed::MODEL_SEED;
pub(crate) use thread_index::{thread_index, Divisor};
