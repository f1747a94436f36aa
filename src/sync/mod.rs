//! The atomics facade: the one place where `kvslots` names its atomic types,
//! and the one place that knows about the model checkers.
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
//! ([`Faults`], whose hooks are the correct behaviour in every other
//! build).
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
pub use atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
pub(crate) use backoff::{stale_retry, yield_now, Backoff};
pub use faults::Faults;
pub(crate) use lock::{Condvar, Mutex, MutexGuard};
pub(crate) use seed::index_seed;
#[cfg(test)]
pub(crate) use seed::MODEL_SEED;
pub(crate) use thread_index::{thread_index, Divisor};
