//! Block-key benchmark: [`hash_blocks`] (one SHA-256 compression a 16-token
//! block, the key being SHA-256's chaining state) against a chain of full
//! SHA-256 digests and two BLAKE3 chains.
//!
//! | group | one operation |
//! |---|---|
//! | `hash_blocks` | the keys of a 2,048-token prompt in blocks of 16 (128 full blocks); throughput counts blocks, so criterion's time per element is the time per 16-token block |
//!
//! | id | one block's key |
//! |---|---|
//! | `kvslots_sha256` | [`kvslots::hash_blocks`]: the parent's state, one SHA-256 compression of the block's 64 bytes (`sha2::compress256`, which takes the CPU's SHA extensions, `sha_ni`, when it detects them at run time) |
//! | `sha256_digest` | the standard SHA-256 digest of a 16-byte tag, the parent's 32-byte key and the tokens (112 bytes: two compressions and a finalisation), through `sha2::Sha256` |
//! | `blake3` | `blake3::hash` over the same 112 bytes (two compressions) |
//! | `blake3_keyed` | `blake3::keyed_hash` of the block's 64 bytes under the parent's key: one BLAKE3 compression, BLAKE3's counterpart of `kvslots_sha256` |
//! | `sha256_compress` | the floor: one bare `sha2::compress256` call a block on the prompt's pieces laid out in advance, chained, with no keys written out |
//! | `kvslots_lora` | [`kvslots::hash_blocks_with`] with a LoRA adapter: extras on block 0 only, every other block as `kvslots_sha256` |
//! | `kvslots_image_every_block` | [`kvslots::hash_blocks_with`] with an image (a 32-byte hash) whose placeholder covers the whole prompt: every block has an extras header and one entry, three compressions |
//!
//! The three peers start from a key of block 0 made the same way as their
//! later keys (a tag and the salt in place of the parent); only the
//! per-block cost matters here. `benches/vllm_block_hash.py` times the
//! chain vLLM computes in Python
//! (`hashlib.sha256(pickle.dumps((parent, tuple(tokens), extra)))`) on the
//! same prompt, for the comparison with what servers do today.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvslots::{hash_blocks, hash_blocks_with, BlockHash, ExtraKey};
use sha2::digest::generic_array::GenericArray;
use sha2::digest::typenum::U64;
use sha2::{Digest, Sha256};

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

/// The tag that starts a later block's string in the digest chains.
const TAG_NEXT: &[u8; 16] = b"kvslots next  v1";

/// A chain of one-call hashes of strings gathered on the stack: block 0's
/// string is a tag, the salt's length and the salt, then the tokens; a
/// later block's is [`TAG_NEXT`], the parent's key, then the tokens.
fn digest_chain(
    salt: &[u8],
    tokens: &[u32],
    block_size: usize,
    out: &mut Vec<BlockHash>,
    hash: impl Fn(&[u8]) -> [u8; 32],
) {
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
                buf[..16].copy_from_slice(TAG_NEXT);
                buf[16..48].copy_from_slice(&p.0);
                len = 48;
            }
        }
        for t in block {
            buf[len..len + 4].copy_from_slice(&t.to_le_bytes());
            len += 4;
        }
        let key = BlockHash(hash(&buf[..len]));
        out.push(key);
        parent = Some(key);
    }
}

/// Standard SHA-256 digests, one a block.
fn sha256_blocks(salt: &[u8], tokens: &[u32], block_size: usize, out: &mut Vec<BlockHash>) {
    digest_chain(salt, tokens, block_size, out, |s| Sha256::digest(s).into());
}

/// BLAKE3 over the same strings as [`sha256_blocks`].
fn blake3_blocks(salt: &[u8], tokens: &[u32], block_size: usize, out: &mut Vec<BlockHash>) {
    digest_chain(salt, tokens, block_size, out, |s| {
        *blake3::hash(s).as_bytes()
    });
}

/// BLAKE3 keyed by the parent's key over the block's tokens alone (block
/// 0 keyed by the BLAKE3 digest of the salt): a 16-token block is one
/// BLAKE3 compression.
fn blake3_keyed_blocks(salt: &[u8], tokens: &[u32], block_size: usize, out: &mut Vec<BlockHash>) {
    let blocks = tokens.chunks_exact(block_size);
    out.reserve(blocks.len());
    let mut key = *blake3::hash(salt).as_bytes();
    let mut buf = [0u8; 512];
    for block in blocks {
        for (dst, t) in buf.chunks_exact_mut(4).zip(block) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        key = *blake3::keyed_hash(&key, &buf[..4 * block.len()]).as_bytes();
        out.push(BlockHash(key));
    }
}

/// [`hash_blocks_with`] with a LoRA adapter (block 0's key only).
fn lora_blocks(salt: &[u8], tokens: &[u32], block_size: usize, out: &mut Vec<BlockHash>) {
    let extras = [ExtraKey::Lora(b"sql-adapter-v3")];
    hash_blocks_with(salt, tokens, block_size, &extras, out).expect("valid extras");
}

/// [`hash_blocks_with`] with an image over every token (every block's key).
fn image_blocks(salt: &[u8], tokens: &[u32], block_size: usize, out: &mut Vec<BlockHash>) {
    let extras = [ExtraKey::Multimodal {
        hash: &[0x5a; 32],
        positions: 0..tokens.len(),
    }];
    hash_blocks_with(salt, tokens, block_size, &extras, out).expect("valid extras");
}

fn bench_hash_blocks(c: &mut Criterion) {
    let tokens = prompt();
    let salt = b"tenant-0";
    let mut out = Vec::with_capacity(PROMPT / BLOCK);

    type Chain = fn(&[u8], &[u32], usize, &mut Vec<BlockHash>);
    let peers: [(&str, Chain); 6] = [
        ("kvslots_sha256", hash_blocks),
        ("sha256_digest", sha256_blocks),
        ("blake3", blake3_blocks),
        ("blake3_keyed", blake3_keyed_blocks),
        ("kvslots_lora", lora_blocks),
        ("kvslots_image_every_block", image_blocks),
    ];

    // Each gives one key per full block, all distinct.
    for (name, chain) in peers {
        out.clear();
        chain(salt, &tokens, BLOCK, &mut out);
        assert_eq!(out.len(), PROMPT / BLOCK, "{name}");
        let mut sorted = out.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), out.len(), "{name}");
    }

    let mut group = c.benchmark_group("hash_blocks");
    group.throughput(Throughput::Elements((PROMPT / BLOCK) as u64));
    for (name, chain) in peers {
        group.bench_function(BenchmarkId::new(name, PROMPT), |b| {
            b.iter(|| {
                out.clear();
                chain(black_box(salt), black_box(&tokens), BLOCK, &mut out);
                black_box(out.last().copied())
            })
        });
    }
    // The floor: the compressions alone.
    let pieces: Vec<GenericArray<u8, U64>> = tokens
        .chunks_exact(BLOCK)
        .map(|block| {
            let bytes: Vec<u8> = block.iter().flat_map(|t| t.to_le_bytes()).collect();
            GenericArray::clone_from_slice(&bytes)
        })
        .collect();
    group.bench_function(BenchmarkId::new("sha256_compress", PROMPT), |b| {
        b.iter(|| {
            let mut state = [0x6a09_e667u32; 8];
            for piece in black_box(&pieces) {
                sha2::compress256(&mut state, std::slice::from_ref(piece));
                black_box(&state);
            }
            state
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
