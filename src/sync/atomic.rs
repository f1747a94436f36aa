//! The atomic types: `std`'s, loom's or shuttle's, by cfg.

#[cfg(all(test, kvslots_loom))]
pub use loom::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};

#[cfg(all(kvslots_shuttle, not(all(test, kvslots_loom))))]
pub use shuttle::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};

#[cfg(not(any(all(test, kvslots_loom), kvslots_shuttle)))]
pub use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering};

/// Pads and aligns a value to the length of a cache line, so that two hot
/// atomics never share a line (false sharing).
pub(crate) use crossbeam_utils::CachePadded;
