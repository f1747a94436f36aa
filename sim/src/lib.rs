//! `kvslots-sim`: multi-threaded LLM inference workers on one shared paged
//! KV cache, driven by a real trace or a synthetic workload, on the
//! lock-free `kvslots` allocator or on a mutex baseline.
//!
//! The binary (`cargo run --release -p kvslots-sim`) is a thin wrapper over
//! [`cli`]; the engine lives in [`engine`], generic over
//! [`backend::KvBackend`] so that both allocators run the same code.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
pub mod baseline;
pub mod cli;
pub mod engine;
pub mod export;
pub mod fault;
pub mod model;
pub mod mooncake;
pub mod oracle;
pub mod prefix;
pub mod report;
pub mod workload;
