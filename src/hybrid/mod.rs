//! Hybrid models: a block table per group of layers over one pool
//! ([`KvGroups`], [`HybridSequence`]), and each group's prefix-cache keys
//! ([`GroupKeys`]), and a peek at a model's cached prefix
//! ([`BlockPool::peek_hybrid_prefix`](crate::BlockPool::peek_hybrid_prefix)).

mod groups;
mod peek;
mod sequence;

pub use groups::{GroupKeys, KvGroup, KvGroups};
pub use sequence::HybridSequence;

#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
mod extremes;
