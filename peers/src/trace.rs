//! The Mooncake conversation trace as prompts of tokens, and each side's
//! block keys for them.
//!
//! The trace (`traces/mooncake-conversation.jsonl`, see `traces/README.md`)
//! has one JSON object a line with `input_length` (prompt tokens) and
//! `hash_ids`, one id per 512-token block of the prompt, the last for a
//! partly filled block; an id names its block and every block before it.
//! The trace has no tokens, so [`prompt_tokens`] makes them up from the
//! ids: token `j` of a trace block is a function of the block's id and `j`
//! alone. Two prompts therefore share their tokens exactly as far as they
//! share ids, and each side keys the same tokens with its own library:
//! [`kvslots::hash_blocks`] and Dynamo's
//! [`TokenBlockSequence`] (xxh3 block
//! hashes chained into positional lineage hashes), both over
//! [`BLOCK_SIZE`]-token blocks. Keys are computed once, before anything is
//! timed ([`Keys`]).

use std::fmt;
use std::path::PathBuf;

use dynamo_tokens::TokenBlockSequence;
use kvbm_logical::{KvbmSequenceHashProvider, SequenceHash};
use kvslots::{hash_blocks, BlockHash};
use serde_json::Value;

use crate::BLOCK_SIZE;

/// Tokens per trace block (one `hash_ids` entry).
pub const TRACE_BLOCK: usize = 512;

/// The environment variable that names the trace file, for benchmark
/// binaries run away from the checkout they were built in.
pub const TRACE_ENV: &str = "KVSLOTS_TRACE";

/// One request of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Prompt tokens (at least 1).
    pub prompt: usize,
    /// One id per [`TRACE_BLOCK`]-token block of the prompt
    /// (`ceil(prompt / 512)` of them).
    pub hash_ids: Vec<u64>,
}

/// A line of the trace that is not a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceError {
    /// The 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub msg: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.msg)
    }
}

impl std::error::Error for TraceError {}

/// Parses a Mooncake JSONL trace: every non-blank line a JSON object with
/// a positive whole `input_length` and `hash_ids`, an array of
/// `ceil(input_length / 512)` non-negative whole numbers (other fields are
/// ignored). The first bad line is the error.
pub fn parse(text: &str) -> Result<Vec<Request>, TraceError> {
    let mut requests = Vec::new();
    for (index, row) in text.lines().enumerate() {
        let line = index + 1;
        let row = row.trim_start_matches('\u{feff}').trim();
        if row.is_empty() {
            continue;
        }
        let bad = |msg: String| TraceError { line, msg };
        let value: Value = serde_json::from_str(row).map_err(|e| bad(e.to_string()))?;
        let prompt = value
            .get("input_length")
            .and_then(Value::as_u64)
            .filter(|&n| n > 0)
            .ok_or_else(|| bad("input_length is not a positive whole number".into()))?
            as usize;
        let ids = value
            .get("hash_ids")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("hash_ids is not an array".into()))?;
        let hash_ids = ids
            .iter()
            .map(|id| id.as_u64())
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| bad("hash_ids holds something other than a whole number".into()))?;
        if hash_ids.len() != prompt.div_ceil(TRACE_BLOCK) {
            return Err(bad(format!(
                "{} hash_ids for {prompt} tokens (one per {TRACE_BLOCK}-token block)",
                hash_ids.len()
            )));
        }
        requests.push(Request { prompt, hash_ids });
    }
    Ok(requests)
}

/// Where the trace is: `$KVSLOTS_TRACE` if set, else
/// `traces/mooncake-conversation.jsonl` in the checkout this crate was
/// built from.
pub fn path() -> PathBuf {
    match std::env::var_os(TRACE_ENV) {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../traces/mooncake-conversation.jsonl"
        )),
    }
}

/// Reads and parses the trace at [`path`]; panics, naming the file and
/// [`TRACE_ENV`], if it cannot (a benchmark or test cannot run without it).
pub fn load() -> Vec<Request> {
    let path = path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (set {TRACE_ENV} to the Mooncake trace's path)",
            path.display()
        )
    });
    parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// splitmix64's finaliser: a bijection of `u64` that spreads every bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Replaces `out` with the request's prompt: token `j` of trace block `i`
/// is made from `hash_ids[i]` and `j` only, below 2^17 (a tokenizer's
/// vocabulary).
pub fn prompt_tokens(request: &Request, out: &mut Vec<u32>) {
    out.clear();
    out.reserve(request.prompt);
    for (i, &id) in request.hash_ids.iter().enumerate() {
        let len = (request.prompt - i * TRACE_BLOCK).min(TRACE_BLOCK);
        let base = mix(id).wrapping_mul(TRACE_BLOCK as u64);
        out.extend((0..len as u64).map(|j| (mix(base.wrapping_add(j)) >> 47) as u32));
    }
}

/// Every request's block keys on one side, in one flat array: the keys of
/// a request's full [`BLOCK_SIZE`]-token blocks, in order.
pub struct Keys<K> {
    keys: Vec<K>,
    /// `keys[starts[i]..starts[i + 1]]` are request `i`'s.
    starts: Vec<usize>,
    prompts: Vec<usize>,
}

impl<K> Keys<K> {
    /// Keys `requests` with `key_prompt(tokens, out)`, which appends the
    /// keys of a prompt's full blocks to `out`.
    fn build(requests: &[Request], mut key_prompt: impl FnMut(&[u32], &mut Vec<K>)) -> Self {
        let blocks = requests.iter().map(|r| r.prompt / BLOCK_SIZE).sum();
        let mut keys = Vec::with_capacity(blocks);
        let mut starts = Vec::with_capacity(requests.len() + 1);
        let mut tokens = Vec::new();
        starts.push(0);
        for request in requests {
            prompt_tokens(request, &mut tokens);
            key_prompt(&tokens, &mut keys);
            assert_eq!(
                keys.len() - starts.last().expect("starts begins with 0"),
                request.prompt / BLOCK_SIZE,
                "one key per full block"
            );
            starts.push(keys.len());
        }
        Keys {
            keys,
            starts,
            prompts: requests.iter().map(|r| r.prompt).collect(),
        }
    }

    /// Requests keyed.
    pub fn len(&self) -> usize {
        self.prompts.len()
    }

    /// True if no request is keyed.
    pub fn is_empty(&self) -> bool {
        self.prompts.is_empty()
    }

    /// Request `i`'s prompt tokens and the keys of its full blocks.
    pub fn request(&self, i: usize) -> (usize, &[K]) {
        (
            self.prompts[i],
            &self.keys[self.starts[i]..self.starts[i + 1]],
        )
    }

    /// Full blocks of all requests (keys held).
    pub fn full_blocks(&self) -> usize {
        self.keys.len()
    }
}

/// kvslots' keys: [`hash_blocks`] with an empty salt.
pub fn kvslots_keys(requests: &[Request]) -> Keys<BlockHash> {
    Keys::build(requests, |tokens, out| {
        hash_blocks(b"", tokens, BLOCK_SIZE, out)
    })
}

/// kvbm-logical's keys: each full block's positional lineage hash from
/// Dynamo's [`TokenBlockSequence::from_slice`] (no salt).
pub fn kvbm_keys(requests: &[Request]) -> Keys<SequenceHash> {
    Keys::build(requests, |tokens, out| {
        let sequence = TokenBlockSequence::from_slice(tokens, BLOCK_SIZE as u32, None);
        out.extend(sequence.blocks().iter().map(|b| b.kvbm_sequence_hash()));
    })
}
