//! kvslots beside another block manager: NVIDIA Dynamo's Rust KV block
//! manager, [`kvbm_logical`] (crates.io `kvbm-logical`, Apache-2.0).
//!
//! This crate is not part of the kvslots workspace (it has its own
//! `Cargo.lock`): `kvbm-logical` pins `tokio` and brings `prometheus`,
//! `serde` and `bincode`, which the library and its tests never build.
//! It holds what the benchmark (`benches/kvbm.rs`) and the tests share:
//!
//! * [`trace`]: the Mooncake conversation trace (`traces/` in the
//!   repository), turned into prompts of tokens and into each side's block
//!   keys: [`kvslots::hash_blocks`] for kvslots, Dynamo's
//!   `TokenBlockSequence` for kvbm-logical, over the same tokens;
//! * [`replay`]: one scheduler request on either side (match the cached
//!   prefix, allocate the rest all or nothing, register the new full
//!   blocks, drop everything, last block first), and a whole-trace replay
//!   over worker threads that counts the hits of each side.
//!
//! Both sides use 16-token blocks (vLLM's and `kvbm-logical`'s default).
//! `kvbm-logical` is built as [`replay::kvbm_manager`] does: an LRU inactive
//! pool (least recently released evicted first, as kvslots does) and
//! [`BlockDuplicationPolicy::Reject`](kvbm_logical::pools::BlockDuplicationPolicy)
//! (one block per key, as kvslots' first-wins publish), with a registry
//! without frequency tracking. With one thread both sides then make the same
//! decisions, so their hit counts are equal (`tests/replay.rs` checks it).

#![warn(missing_docs)]

pub mod replay;
pub mod trace;

/// Tokens per block on both sides.
pub const BLOCK_SIZE: usize = 16;
