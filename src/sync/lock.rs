//! The locks: a mutex and a condition variable,
//! `std`'s, loom's or shuttle's, by cfg, so that the model checkers see
//! every lock, wait and notification.
//!
//! The mutex guards the wait queue (`crate::wait`) and the fenced-release
//! buckets (`crate::pool`'s fence lists); the condition variable serves
//! the wait queue. No `try_*` path takes a lock while nobody waits (one
//! that gives blocks back while somebody does runs the queue's grant loop).

#[cfg(all(test, kvslots_loom))]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

#[cfg(all(kvslots_shuttle, not(all(test, kvslots_loom))))]
pub(crate) use shuttle::sync::{Condvar, Mutex, MutexGuard};

#[cfg(not(any(all(test, kvslots_loom), kvslots_shuttle)))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
