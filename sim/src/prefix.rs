//! Prefix-cache keys and content ids from a request's trace hash ids.
//!
//! A Mooncake-format trace names a prompt's content by one hash id per
//! [`TRACE_BLOCK`] (512) tokens, chained: an id names its block *and every
//! block before it*. The simulator has no tokens, only those ids (the
//! synthetic workload makes ids the same way), and derives two things from
//! them, each by its own 64-bit chain over the ids of trace blocks `0..=i`
//! (so that they agree for two prompts exactly when, short of a 64-bit
//! collision, their ids agree up to block `i`):
//!
//! **Keys.** Since 512 is a multiple of the pool's block size, trace block
//! `i` is `512 / block_size` pool blocks; pool block `j` of it gets the
//! [`BlockHash`] whose 32 bytes are a 64-bit mix of the key chain at `i`
//! and `j`, expanded ([`block_keys`]). Only the prompt's *full* trace blocks
//! (`input_length / 512` of them) get keys: the last, partly filled trace
//! block's id also covers tokens the prompt does not hold, so its pool
//! blocks are never cached. Equal trace prefixes give equal keys, and a
//! different id gives its block and every later one other keys. (A server
//! hashes the tokens themselves with `kvslots::hash_blocks`, a SHA-256
//! chain; hashing made-up tokens that way here would cost the run more than
//! everything else it does, and the pool treats a key as 32 opaque bytes
//! either way.)
//!
//! **Content ids.** The KV-memory oracle stamps cacheable prompt positions
//! with the content id of their trace block ([`content_ids`]) instead of
//! the request's id, so that a block matched from the cache (written by
//! another request, its publisher) can be checked: a matched block that
//! does not hold this prompt's prefix (a wrong key, a block reused under a
//! stale key) reads back another content id and fails the run. The content
//! chain is seeded apart from the key chain, so the check does not lean on
//! the keys being right.

use kvslots::BlockHash;

/// Tokens per trace block: one hash id names this many prompt tokens.
pub const TRACE_BLOCK: usize = 512;

/// Seeds the key chain (any constant other than the content chain's 0).
const KEY_SEED: u64 = 0x6b76_736c_6f74_735f;

/// A 64-bit finaliser (splitmix64's): every input bit changes about half
/// the output bits.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One step of a chain: the link after `chain` for the trace id `id`.
#[inline]
fn link(chain: u64, id: u64) -> u64 {
    mix(chain ^ mix(id))
}

/// Full trace blocks of a `prompt`-token prompt: the cacheable ones.
#[inline]
pub fn full_trace_blocks(prompt: usize) -> usize {
    prompt / TRACE_BLOCK
}

/// The key of pool block `sub` (of `per`) of the trace block whose key
/// chain is `chain`: four 64-bit words mixed from all three (so that, as in
/// the library's keys, the cut into blocks is part of the key).
#[inline]
fn key(chain: u64, sub: usize, per: usize) -> BlockHash {
    let seed = mix(chain ^ mix(sub as u64 | (per as u64) << 32));
    let mut bytes = [0u8; 32];
    for (w, word) in bytes.chunks_exact_mut(8).enumerate() {
        let v = mix(seed.wrapping_add((w as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)));
        word.copy_from_slice(&v.to_le_bytes());
    }
    BlockHash(bytes)
}

/// Appends to `out` the keys of the pool blocks (of `block_size` tokens,
/// which must divide 512) that the full trace blocks of a `prompt`-token
/// prompt with `hash_ids` cover: `prompt / 512 * (512 / block_size)` of
/// them.
///
/// # Panics
///
/// Panics if `block_size` does not divide 512 (the command line refuses
/// such a block size when prefix caching is on).
pub fn block_keys(hash_ids: &[u64], prompt: usize, block_size: usize, out: &mut Vec<BlockHash>) {
    assert!(
        block_size > 0 && TRACE_BLOCK.is_multiple_of(block_size),
        "the block size {block_size} does not divide {TRACE_BLOCK}"
    );
    let per = TRACE_BLOCK / block_size;
    let full = full_trace_blocks(prompt).min(hash_ids.len());
    out.reserve(full * per);
    let mut chain = KEY_SEED;
    for &id in &hash_ids[..full] {
        chain = link(chain, id);
        out.extend((0..per).map(|sub| key(chain, sub, per)));
    }
}

/// The content id of each full trace block of a `prompt`-token prompt with
/// `hash_ids`: a chain of the ids up to and including that block.
pub fn content_ids(hash_ids: &[u64], prompt: usize) -> Vec<u64> {
    let full = full_trace_blocks(prompt).min(hash_ids.len());
    let mut chain = 0u64;
    hash_ids[..full]
        .iter()
        .map(|&id| {
            chain = link(chain, id);
            chain
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_cover_full_trace_blocks_and_follow_the_prefix() {
        let mut a = Vec::new();
        block_keys(&[1, 2, 3], 1500, 128, &mut a);
        // 1500 tokens: 2 full trace blocks of 4 pool blocks each.
        assert_eq!(a.len(), 8);
        let mut b = Vec::new();
        block_keys(&[1, 2, 9, 4], 2048, 128, &mut b);
        assert_eq!(b.len(), 16);
        assert_eq!(a[..], b[..8]);
        let mut c = Vec::new();
        block_keys(&[1, 7, 3], 1536, 128, &mut c);
        assert_eq!(a[..4], c[..4]);
        assert!(a[4..].iter().zip(&c[4..8]).all(|(x, y)| x != y));
        // Every key of a prompt differs from every other.
        let distinct: std::collections::HashSet<_> = b.iter().collect();
        assert_eq!(distinct.len(), b.len());
        // The same ids cut into smaller blocks give more, other keys.
        let mut d = Vec::new();
        block_keys(&[1, 2, 3], 1500, 16, &mut d);
        assert_eq!(d.len(), 64);
        assert!(d.iter().all(|k| !a.contains(k)));
    }

    #[test]
    fn content_ids_name_the_whole_prefix() {
        let a = content_ids(&[1, 2, 3], 1536);
        let b = content_ids(&[1, 2, 4], 1400);
        let c = content_ids(&[5, 2, 3], 1536);
        assert_eq!(a.len(), 3);
        assert_eq!(b.len(), 2);
        assert_eq!(a[..2], b[..]);
        assert!(a.iter().zip(&c).all(|(x, y)| x != y));
    }
}
