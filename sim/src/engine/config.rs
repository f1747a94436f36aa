//! The scheduler's settings: how requests are admitted, and the rest of
//! [`EngineConfig`].

use std::time::Duration;

/// How a worker admits a waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Admission {
    /// Reserve the whole prompt's blocks with the watermark's headroom in
    /// one all-or-nothing `try_reserve` into the new sequence (ahead of its
    /// length); the prefill chunks then fill those blocks without taking
    /// any from the pool. Nobody can take an admitted prompt's blocks.
    Reserve,
    /// Only check, atomically, that the whole prompt plus the watermark is
    /// free (a zero-block allocation with headroom), as vLLM's
    /// `can_allocate` does; the chunks are then appended without a
    /// reservation, so another worker may take the blocks first (and a
    /// chunk may then preempt).
    Check,
}

impl std::fmt::Display for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Admission::Reserve => "reserve",
            Admission::Check => "check",
        })
    }
}

/// The scheduler's settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// How waiting requests are admitted.
    pub admission: Admission,
    /// Worker threads.
    pub workers: usize,
    /// Blocks that admission keeps free (the watermark).
    pub watermark_blocks: usize,
    /// Prefill chunk, in tokens (at least 1).
    pub chunk: usize,
    /// Speculative draft tokens per decode step; 0 decodes one token a step.
    pub spec: usize,
    /// Probability that a draft token is accepted.
    pub accept: f64,
    /// Samples per request (1 = no fork).
    pub samples: usize,
    /// Most groups one worker runs at once.
    pub max_running: usize,
    /// Seed for the acceptance draws (per request, so that both allocators
    /// see the same draws).
    pub seed: u64,
    /// Iterations a worker may run without any request finishing anywhere
    /// (or, while it waits for blocks, a thousandth as many waits) before it
    /// declares a livelock and stops the run.
    pub stall_limit: u64,
    /// Time between two monitor samples.
    pub monitor_interval: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            admission: Admission::Reserve,
            workers: 4,
            watermark_blocks: 0,
            chunk: 512,
            spec: 0,
            accept: 0.7,
            samples: 1,
            max_running: 64,
            seed: 0,
            stall_limit: 20_000_000,
            monitor_interval: Duration::from_micros(200),
        }
    }
}
