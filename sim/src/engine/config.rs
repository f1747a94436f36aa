//! The scheduler's settings: how requests are admitted, the per-request
//! [`Profile`] (uniform, or the default mix), and the rest of
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
    /// Check, atomically, that the whole prompt plus the watermark is free,
    /// as vLLM's `can_allocate` does, taking only the prompt's block past
    /// its cached prefix (a `try_reserve` of that block with the rest and
    /// the watermark as headroom), so that the sequence is running and its chunks are
    /// growth; the chunks then take the rest without a reservation, so
    /// another worker may take the blocks first (and a chunk may then
    /// preempt).
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

/// How a worker with nothing running waits for a waiting request that
/// does not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IdleWait {
    /// In the allocator: kvslots' FIFO queue (the grant is made, all or
    /// nothing, by the thread whose give-back lets the head in, and new
    /// admissions leave a queued request what it asks for), the baseline's
    /// condition variable (the waiter retries when woken).
    #[default]
    Queue,
    /// Outside it: the admission is retried every
    /// [`POLL_TICK`](crate::engine::POLL_TICK), as a scheduler loop on a
    /// timer would, on both allocators alike. Running groups' growth takes
    /// what is given back first, as with a lock.
    Poll,
}

impl std::fmt::Display for IdleWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IdleWait::Queue => "queue",
            IdleWait::Poll => "poll",
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
    /// How a worker with nothing running waits for blocks.
    pub idle_wait: IdleWait,
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
    /// Whether each request gets its own profile from the mix (see
    /// [`EngineConfig::profile`]) instead of `admission`, `spec` and
    /// `samples`.
    pub mix: bool,
    /// Prefix caching: a request whose content the workload names
    /// (`hash_ids`) matches its prompt's cached prefix before admission and
    /// publishes its prompt's full blocks once prefilled.
    pub prefix_cache: bool,
    /// Asynchronous scheduling: the device runs this many steps behind
    /// the scheduler, so the blocks a step gives back (preemption, the
    /// rollback of rejected drafts, completion, a copy-on-write's source)
    /// are retired under the step's fence and go back when the step
    /// completes, this many steps later. 0: every give-back is immediate.
    pub async_depth: usize,
    /// How long one allocator call may run before the watchdog declares it
    /// stuck (a livelock) and ends the run.
    pub stuck_after: Duration,
    /// Iterations a worker may run without any request finishing anywhere
    /// (or, while it waits for blocks, a thousandth as many waits) before it
    /// declares a livelock and stops the run. The command line sets it to
    /// at least twice the tokens of the longest request: a worker may step
    /// through a request one iteration a token.
    pub stall_limit: u64,
    /// Time between two monitor samples.
    pub monitor_interval: Duration,
    /// Publish the prompt's full blocks after every prefill chunk, not
    /// only once the prompt is in (as vLLM caches blocks as they are
    /// computed): a sliding window gives blocks back between chunks, and
    /// only blocks published before that can be matched.
    pub publish_chunks: bool,
    /// The groups of layers of the sequences (one table each): one full
    /// group for a plain model, the preset's groups for a hybrid one. The
    /// admission counts blocks in every group.
    pub groups: kvslots::KvGroups,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            admission: Admission::Reserve,
            workers: 4,
            watermark_blocks: 0,
            idle_wait: IdleWait::Queue,
            chunk: 512,
            spec: 0,
            accept: 0.7,
            samples: 1,
            max_running: 64,
            seed: 0,
            mix: false,
            prefix_cache: true,
            async_depth: 0,
            stuck_after: Duration::from_secs(10),
            stall_limit: 20_000_000,
            monitor_interval: Duration::from_micros(200),
            publish_chunks: false,
            groups: kvslots::KvGroups::new([kvslots::KvGroup::Full]).expect("one group"),
        }
    }
}

/// How one request is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// How it is admitted.
    pub admission: Admission,
    /// Draft tokens per decode step (0: one token a step).
    pub spec: usize,
    /// Samples (1: no fork).
    pub samples: usize,
}

/// The mix's classes, out of [`MIX_CLASSES`]: plain below `MIX_SPEC`,
/// then speculative, then forked, then check-only admission.
const MIX_SPEC: u64 = 10;
const MIX_FORK: u64 = 14;
const MIX_CHECK: u64 = 17;
/// Classes in the mix (each 5% of the requests).
pub const MIX_CLASSES: u64 = 20;
/// Samples of a forked request in the mix.
pub const MIX_SAMPLES: usize = 4;

impl EngineConfig {
    /// The drafts a step of the mix's speculative requests:
    /// `block_size * 3 / 2`, at least 2, so that an append can need two new
    /// blocks.
    pub fn profile_spec(&self, block_size: usize) -> usize {
        (block_size + block_size / 2).max(2)
    }

    /// How `request` is run. Without the mix, every request gets
    /// `admission`, `spec` and `samples`. With it, by a hash of the seed and
    /// the request's id: 50% plain (reserved prompt, one token a step, one
    /// sample); 20% speculative with `block_size * 3 / 2` drafts a step (at
    /// least 2; appends that need two new blocks, and truncation); 15% with
    /// [`MIX_SAMPLES`] samples (forks that copy a partly filled tail); 15%
    /// admitted check-only (prefill chunks that take many blocks each).
    pub fn profile(&self, request: usize, block_size: usize) -> Profile {
        let uniform = Profile {
            admission: self.admission,
            spec: self.spec,
            samples: self.samples,
        };
        if !self.mix {
            return uniform;
        }
        let plain = Profile {
            admission: Admission::Reserve,
            spec: 0,
            samples: 1,
        };
        let h = (self.seed ^ (request as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_mul(0xBF58_476D_1CE4_E5B9)
            >> 32;
        match h % MIX_CLASSES {
            c if c < MIX_SPEC => plain,
            c if c < MIX_FORK => Profile {
                spec: self.profile_spec(block_size),
                ..plain
            },
            c if c < MIX_CHECK => Profile {
                samples: MIX_SAMPLES,
                ..plain
            },
            _ => Profile {
                admission: Admission::Check,
                ..plain
            },
        }
    }

    /// The blocks a reservation of a `tokens`-token prompt takes: its
    /// blocks in every group.
    pub fn reserve_blocks(&self, tokens: usize, block_size: usize) -> usize {
        tokens
            .div_ceil(block_size)
            .saturating_mul(self.groups.len())
    }

    /// The blocks a `tokens`-token prompt holds at once while it is
    /// prefilled in chunks (what a check-only admission checks): all of
    /// its blocks in a full group; in a sliding (or chunked local) group,
    /// at most the window (or attention chunk) before a prefill chunk and
    /// the prefill chunk.
    pub fn prefill_blocks(&self, tokens: usize, block_size: usize) -> usize {
        self.prefill_blocks_beside(tokens, block_size, |_| 0)
    }

    /// [`prefill_blocks`](Self::prefill_blocks) of the `tokens` a prompt
    /// has left, beside the blocks its sequence holds already, `held(g)`
    /// in group `g` (a matched prefix): the blocks it takes at once while
    /// those tokens are prefilled. A sliding (or chunked local) group's
    /// held blocks count toward its window and chunk, not on top of them.
    pub fn prefill_blocks_beside(
        &self,
        tokens: usize,
        block_size: usize,
        held: impl Fn(usize) -> usize,
    ) -> usize {
        let all = tokens.div_ceil(block_size);
        self.groups
            .as_slice()
            .iter()
            .enumerate()
            .map(|(g, kind)| match *kind {
                kvslots::KvGroup::SlidingWindow {
                    window_tokens: window,
                }
                | kvslots::KvGroup::ChunkedLocal {
                    chunk_tokens: window,
                } => {
                    let at_once = window
                        .saturating_add(self.chunk)
                        .div_ceil(block_size)
                        .saturating_add(1);
                    let held = held(g);
                    held.saturating_add(all).min(at_once).saturating_sub(held)
                }
                _ => all,
            })
            .fold(0, usize::saturating_add)
    }
}
