//! Block-key benchmark: [`hash_blocks`] (SHA-256) against the same chained
//! encoding under BLAKE3.
//!
//! | group | one operation |
//! |---|---|
//! | `hash_blocks` | the keys of a 2,048-token prompt in blocks of 16 (128 full blocks); throughput counts blocks, so criterion's time per element is the time per 16-token block |
//!
//! The peers hash the same byte strings (see the `hash` module's docs):
//!
//! | id | hash |
//! |---|---|
//! | `kvslots_sha256` | [`kvslots::hash_blocks`]: SHA-256 through the `sha2` crate, which takes the CPU's SHA extensions (`sha_ni`) when it detects them at run time |
//! | `blake3` | the same strings through `blake3::hash`, one call per block (its fastest form for a short input) |
//!
//! `benches/vllm_block_hash.py` times the chain vLLM computes in Python
//! (`hashlib.sha256(pickle.dumps((parent, tuple(tokens), extra)))`) on the
//! same prompt, for the comparison with what servers do today.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvslots::{hash_blocks, BlockHash};

/// Prompt length in tokens.
const PROMPT: usize = 2048;
/// Tokens per block.
const BLOCK: usize = 16;

/// A prompt of plausible token ids (a 152k vocabulary).
fn prompt() -> Vec<u32> {
    (0..PROMPT as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % 151_936)
        .collect()
}

/// The `hash` module's encoding under BLAKE3: each block's string gathered
/// on the stack and hashed in one call.
fn blake3_blocks(salt: &[u8], tokens: &[u32], block_size: usize, out: &mut Vec<BlockHash>) {
    let blocks = tokens.chunks_exact(block_size);
    out.reserve(blocks.len());
    let mut parent: Option<BlockHash> = None;
    let mut buf = [0u8; 512];
    for block in blocks {
        let mut len;
        match parent {
            None => {
                buf[..16].copy_from_slice(b"kvslots first v1");
                buf[16..24].copy_from_slice(&(salt.len() as u64).to_le_bytes());
                buf[24..24 + salt.len()].copy_from_slice(salt);
                len = 24 + salt.len();
            }
            Some(p) => {
                buf[..16].copy_from_slice(b"kvslots next  v1");
                buf[16..48].copy_from_slice(&p.0);
                len = 48;
            }
        }
        for t in block {
            buf[len..len + 4].copy_from_slice(&t.to_le_bytes());
            len += 4;
        }
        let key = BlockHash(*blake3::hash(&buf[..len]).as_bytes());
        out.push(key);
        parent = Some(key);
    }
}

fn bench_hash_blocks(c: &mut Criterion) {
    let tokens = prompt();
    let salt = b"tenant-0";
    let mut out = Vec::with_capacity(PROMPT / BLOCK);

    // Both give one key per full block.
    hash_blocks(salt, &tokens, BLOCK, &mut out);
    let mut b3 = Vec::new();
    blake3_blocks(salt, &tokens, BLOCK, &mut b3);
    assert_eq!(out.len(), PROMPT / BLOCK);
    assert_eq!(b3.len(), out.len());

    let mut group = c.benchmark_group("hash_blocks");
    group.throughput(Throughput::Elements((PROMPT / BLOCK) as u64));
    group.bench_function(BenchmarkId::new("kvslots_sha256", PROMPT), |b| {
        b.iter(|| {
            out.clear();
            hash_blocks(black_box(salt), black_box(&tokens), BLOCK, &mut out);
            black_box(out.last().copied())
        })
    });
    group.bench_function(BenchmarkId::new("blake3", PROMPT), |b| {
        b.iter(|| {
            out.clear();
            blake3_blocks(black_box(salt), black_box(&tokens), BLOCK, &mut out);
            black_box(out.last().copied())
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(5));
    targets = bench_hash_blocks
}
criterion_main!(benches);
