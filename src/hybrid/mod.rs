//! Hybrid models: a block table per group of layers over one pool
//! ([`KvGroups`], [`HybridSequence`]), and each group's prefix-cache keys
//! ([`GroupKeys`]).

mod groups;
mod sequence;

pub use groups::{GroupKeys, KvGroup, KvGroups};
pub use sequence::HybridSequence;
