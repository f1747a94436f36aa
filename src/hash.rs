//! Content keys for full KV-cache blocks: chained, salted, collision-resistant
//! hashes of a prompt's tokens.
//!
//! A prefix cache looks up a block by the tokens it holds *and every token
//! before it*, since a block's keys and values depend on the whole prefix. A
//! [`BlockHash`] names exactly that: block `i`'s key is a hash over its
//! parent's key (block `i - 1`) and its own tokens, and block 0's key is a
//! hash over a salt and its tokens. [`hash_blocks`] computes the keys of all
//! the full blocks of a prompt at once; [`BlockHash::first`] and
//! [`BlockHash::next`] compute them one block at a time, for blocks that
//! fill up during decode. Both give the same keys. [`BlockHash`]'s docs
//! give the encoding, why it is unambiguous, and why SHA-256.
//!
//! # Allocation
//!
//! Nothing here allocates on the heap except [`hash_blocks`] growing its
//! output (one `reserve`). The bytes are gathered in a buffer on the stack
//! and handed to the hasher in large pieces.

use sha2::{Digest, Sha256};

/// The content key of one full KV-cache block: a 32-byte hash of the block's
/// tokens, every token before them and the salt.
///
/// Two blocks share a key only if they hold the same tokens after the same
/// prefix, cut into blocks the same way, under the same salt, short of a
/// SHA-256 collision. [`hash_blocks`] computes the keys of a prompt's full
/// blocks; [`BlockHash::first`] and [`BlockHash::next`] compute them one
/// block at a time.
///
/// # Encoding
///
/// The hash is SHA-256 over one of two byte strings:
///
/// | block | hashed bytes |
/// |---|---|
/// | first | `"kvslots first v1"` (16 bytes), `salt.len()` as a little-endian `u64`, the salt, the tokens as little-endian `u32`s |
/// | later | `"kvslots next  v1"` (16 bytes), the parent's 32 bytes, the tokens as little-endian `u32`s |
///
/// Each string decodes back to its inputs, so two different inputs reach the
/// same key only through a SHA-256 collision:
///
/// * The two tags differ and sit at the same place, so a first block's
///   string never equals a later block's, whatever the parent, salt and
///   tokens.
/// * In a first block's string the salt's length comes before the salt, so
///   the boundary between salt and tokens is fixed. Salt `"abcde"` with
///   tokens `t`, and salt `"a"` with a first token made of the bytes
///   `"bcde"` followed by `t`, are the same bytes once salt and tokens are
///   laid end to end; only the length fields tell them apart. Without the
///   length, moving bytes across that boundary would give two tenants one
///   key.
/// * Everything after the salt (or after the parent, whose length is fixed)
///   is tokens, 4 bytes each, so the number of tokens in the block is the
///   remaining length divided by 4.
///
/// By induction along the chain, equal keys mean equal salts, equal tokens
/// and equal cuts into blocks. Different salts (tenants, LoRA adapters,
/// multimodal inputs folded into a salt) therefore never share a key, and
/// keys are the same on every platform (the byte order is fixed).
///
/// The salt is not a secret: isolation comes from the server choosing it
/// (per tenant, per adapter), never the client. Anyone who knows a salt and
/// a prompt can compute its keys, as the server does.
///
/// # Block size
///
/// `block_size` is not hashed as a separate field, but it is part of the key
/// all the same: each block's string holds its token count (its length), so
/// the keys of one prompt cut into blocks of 16 and into blocks of 32 differ
/// from the first block on. A key therefore names the tokens *and* their cut
/// into blocks, which is what a pool needs (it has one block size, and a key
/// computed for another size must not match). Keys computed with
/// [`hash_blocks`] and with the incremental [`BlockHash::first`] /
/// [`BlockHash::next`] chain agree whenever each block passed to the chain
/// has `block_size` tokens.
///
/// # Why SHA-256
///
/// A key must resist crafted prompts: a collision would let one request read
/// another's cache, so a fast non-cryptographic hash (FxHash, xxHash) will
/// not do. Of the two usual cryptographic choices, SHA-256 (through the
/// `sha2` crate) beats BLAKE3 on these inputs on CPUs with SHA extensions,
/// which x86-64 servers have had for years (`sha_ni`: AMD since Zen, Intel
/// since Ice Lake) and which `sha2` detects at run time. The reason is the
/// input's size. A key's string is short: a 16-token block is 112 bytes,
/// two 64-byte compressions in either hash. BLAKE3's speed comes from SIMD
/// across many 1 KiB chunks at once (8 with AVX2, 16 with AVX-512), and a
/// string under 1 KiB is a single chunk, compressed one 64-byte block after
/// the other in 128-bit registers; SHA-256's compression runs in dedicated
/// instructions (`sha256rnds2` does two rounds in one). `benches/hash.rs`
/// measures both on the same strings (and `benches/vllm_block_hash.py` the
/// chain vLLM computes in Python). On a CPU without SHA extensions `sha2`
/// falls back to portable code, where BLAKE3 would likely be the faster;
/// the keys are the same either way. SHA-256 also
/// keeps the crate's dependencies small (no C or assembly build step) and
/// its minimum Rust version.
///
/// # Examples
///
/// ```
/// use kvslots::{hash_blocks, BlockHash};
///
/// let prompt: Vec<u32> = (0..40).collect();
/// let mut keys = Vec::new();
/// hash_blocks(b"tenant-a", &prompt, 16, &mut keys);
/// assert_eq!(keys.len(), 2); // 40 tokens: two full blocks of 16, 8 left over
///
/// // The same prefix under another salt gets other keys.
/// let mut other = Vec::new();
/// hash_blocks(b"tenant-b", &prompt, 16, &mut other);
/// assert_ne!(keys[0], other[0]);
///
/// // A key is 32 plain bytes: store it, compare it, order it.
/// let key: BlockHash = keys[1];
/// assert_eq!(key.0.len(), 32);
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

/// The tag that starts a first block's hashed string.
const TAG_FIRST: &[u8; 16] = b"kvslots first v1";
/// The tag that starts a later block's hashed string (same length as
/// [`TAG_FIRST`], so the two strings differ within their first 16 bytes).
const TAG_NEXT: &[u8; 16] = b"kvslots next  v1";

impl BlockHash {
    /// The key of a prompt's first block, holding `tokens`, under `salt`.
    ///
    /// `tokens` is the whole block (normally `block_size` tokens); its length
    /// is part of the key.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{hash_blocks, BlockHash};
    ///
    /// let prompt = [7u32; 16];
    /// let mut keys = Vec::new();
    /// hash_blocks(b"", &prompt, 16, &mut keys);
    /// assert_eq!(BlockHash::first(b"", &prompt), keys[0]);
    /// ```
    #[must_use]
    pub fn first(salt: &[u8], tokens: &[u32]) -> BlockHash {
        let mut input = Input::new(TAG_FIRST);
        // A usize always fits a u64 on the platforms Rust supports.
        input.bytes(&(salt.len() as u64).to_le_bytes());
        input.bytes(salt);
        input.tokens(tokens);
        input.finish()
    }

    /// The key of the block that follows the block keyed `self` and holds
    /// `tokens`: the incremental form, for a block that fills up during
    /// decode.
    ///
    /// The salt is not passed again: it is already in the chain, through
    /// block 0's key.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{hash_blocks, BlockHash};
    ///
    /// let prompt: Vec<u32> = (100..132).collect();
    /// let mut keys = Vec::new();
    /// hash_blocks(b"salt", &prompt, 16, &mut keys);
    ///
    /// // Block by block, as decode completes them.
    /// let k0 = BlockHash::first(b"salt", &prompt[..16]);
    /// let k1 = k0.next(&prompt[16..]);
    /// assert_eq!([k0, k1], keys[..]);
    /// ```
    #[must_use]
    pub fn next(&self, tokens: &[u32]) -> BlockHash {
        let mut input = Input::new(TAG_NEXT);
        input.bytes(&self.0);
        input.tokens(tokens);
        input.finish()
    }
}

/// Appends to `out` the keys of the full blocks of `tokens`, cut into blocks
/// of `block_size` tokens, under `salt`: `tokens.len() / block_size` keys,
/// block 0's first. A partly filled last block gets no key.
///
/// Key `i` depends on the salt and on every token of blocks `0..=i`, and on
/// nothing else; it equals the incremental chain
/// `BlockHash::first(salt, block 0)`, then `.next(block 1)`, and so on.
/// `out` is appended to (not cleared), and reserved once, so a reused `Vec`
/// allocates nothing.
///
/// # Panics
///
/// Panics if `block_size == 0`, before touching `out`, as
/// [`BlockPool::new`](crate::BlockPool::new) does: no pool has empty blocks,
/// so a zero block size is a configuration bug, and "no keys" would hide it
/// as a cache that never hits.
///
/// # Examples
///
/// ```
/// use kvslots::hash_blocks;
///
/// let mut keys = Vec::with_capacity(128);
/// let prompt: Vec<u32> = (0..100).collect();
/// hash_blocks(b"tenant-7", &prompt, 16, &mut keys);
/// assert_eq!(keys.len(), 6); // 96 tokens in full blocks, 4 left over
///
/// // A longer prompt with the same beginning shares the first keys.
/// let mut longer = Vec::new();
/// let prompt2: Vec<u32> = (0..40).chain(1000..1100).collect();
/// hash_blocks(b"tenant-7", &prompt2, 16, &mut longer);
/// assert_eq!(keys[..2], longer[..2]); // blocks 0 and 1: tokens 0..32
/// assert_ne!(keys[2], longer[2]); // block 2 differs from token 40 on
/// ```
pub fn hash_blocks(salt: &[u8], tokens: &[u32], block_size: usize, out: &mut Vec<BlockHash>) {
    assert!(block_size != 0, "block_size must be non-zero");
    let mut blocks = tokens.chunks_exact(block_size);
    out.reserve(blocks.len());
    let Some(block) = blocks.next() else {
        return;
    };
    let mut key = BlockHash::first(salt, block);
    out.push(key);
    for block in blocks {
        key = key.next(block);
        out.push(key);
    }
}

/// Bytes gathered on the stack before they go to the hasher: enough for the
/// tag, a parent and 112 tokens, so a block of up to 112 tokens is one
/// `update` call.
const BUF: usize = 512;

/// One block's hashed string, fed to SHA-256 through a stack buffer (many
/// 4-byte updates would cost more than the hashing).
struct Input {
    hasher: Sha256,
    buf: [u8; BUF],
    len: usize,
}

impl Input {
    /// Starts a string with `tag`.
    fn new(tag: &[u8; 16]) -> Input {
        let mut buf = [0; BUF];
        buf[..tag.len()].copy_from_slice(tag);
        Input {
            hasher: Sha256::new(),
            buf,
            len: tag.len(),
        }
    }

    /// Hands the buffered bytes to the hasher.
    fn flush(&mut self) {
        self.hasher.update(&self.buf[..self.len]);
        self.len = 0;
    }

    /// Appends `bytes`.
    fn bytes(&mut self, bytes: &[u8]) {
        if bytes.len() > BUF - self.len {
            self.flush();
            if bytes.len() > BUF {
                self.hasher.update(bytes);
                return;
            }
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    /// Appends `tokens`, each as 4 little-endian bytes.
    fn tokens(&mut self, mut tokens: &[u32]) {
        while !tokens.is_empty() {
            if self.len + 4 > BUF {
                self.flush();
            }
            let room = (BUF - self.len) / 4;
            let (now, rest) = tokens.split_at(room.min(tokens.len()));
            let dst = &mut self.buf[self.len..self.len + 4 * now.len()];
            for (dst, token) in dst.chunks_exact_mut(4).zip(now) {
                dst.copy_from_slice(&token.to_le_bytes());
            }
            self.len += 4 * now.len();
            tokens = rest;
        }
    }

    /// The key of the string.
    fn finish(mut self) -> BlockHash {
        self.flush();
        BlockHash(self.hasher.finalize().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoding, written directly against the `sha2` crate, one field
    /// at a time (no buffering), for a chain of blocks.
    fn reference_chain(salt: &[u8], blocks: &[&[u32]]) -> Vec<BlockHash> {
        let mut keys: Vec<BlockHash> = Vec::new();
        for block in blocks {
            let mut h = Sha256::new();
            match keys.last() {
                None => {
                    h.update(b"kvslots first v1");
                    h.update(u64::try_from(salt.len()).unwrap().to_le_bytes());
                    h.update(salt);
                }
                Some(parent) => {
                    h.update(b"kvslots next  v1");
                    h.update(parent.0);
                }
            }
            for t in *block {
                h.update(t.to_le_bytes());
            }
            keys.push(BlockHash(h.finalize().into()));
        }
        keys
    }

    fn keys(salt: &[u8], tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
        let mut out = Vec::new();
        hash_blocks(salt, tokens, block_size, &mut out);
        out
    }

    fn hex(key: &BlockHash) -> String {
        key.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn known_answer_matches_sha256_directly() {
        let tokens: Vec<u32> = (0..48u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % 151_936)
            .collect();
        let got = keys(b"tenant", &tokens, 16);
        let blocks: Vec<&[u32]> = tokens.chunks(16).collect();
        assert_eq!(got, reference_chain(b"tenant", &blocks));
        // The same vector, fixed, as Python's `hashlib.sha256` computes it
        // from the encoding in `BlockHash`'s docs (a third implementation). A
        // change of encoding (tags, byte order, field order) changes every
        // key a deployed cache holds, so it must be deliberate.
        assert_eq!(
            hex(&got[0]),
            "ef82060fbe0137a799ed060a7f9d8bfbf6720bebb114e964b50a661b868bd957"
        );
        assert_eq!(
            hex(&got[2]),
            "0b0f12af5555b1b77063331bacd155fad779fdef68dd82b181f57820fff08d53"
        );
    }

    #[test]
    fn partial_blocks_get_no_key() {
        let tokens: Vec<u32> = (0..47).collect();
        let got = keys(b"s", &tokens, 16);
        assert_eq!(got.len(), 2);
        // The keys of the full blocks are those of the prompt cut short.
        assert_eq!(got, keys(b"s", &tokens[..32], 16));
        assert!(keys(b"s", &tokens[..15], 16).is_empty());
        assert_eq!(keys(b"s", &tokens[..16], 16).len(), 1);
    }

    #[test]
    fn appends_without_clearing() {
        let tokens: Vec<u32> = (0..64).collect();
        let mut out = keys(b"x", &tokens, 32);
        hash_blocks(b"y", &tokens, 16, &mut out);
        assert_eq!(out.len(), 2 + 4);
        assert_eq!(out[..2], keys(b"x", &tokens, 32)[..]);
        assert_eq!(out[2..], keys(b"y", &tokens, 16)[..]);
    }

    #[test]
    fn a_changed_token_changes_its_block_and_every_later_one() {
        let tokens: Vec<u32> = (0..16 * 6).collect();
        let base = keys(b"s", &tokens, 16);
        for j in 0..6 {
            let mut changed = tokens.clone();
            changed[16 * j + 5] ^= 1;
            let got = keys(b"s", &changed, 16);
            assert_eq!(got[..j], base[..j], "block {j} changed an earlier key");
            for i in j..6 {
                assert_ne!(got[i], base[i], "block {j} left key {i} unchanged");
            }
        }
    }

    #[test]
    fn salts_separate_keys() {
        let tokens: Vec<u32> = (0..32).collect();
        let a = keys(b"tenant-a", &tokens, 16);
        let b = keys(b"tenant-b", &tokens, 16);
        let none = keys(b"", &tokens, 16);
        for i in 0..2 {
            assert_ne!(a[i], b[i]);
            assert_ne!(a[i], none[i]);
            assert_ne!(b[i], none[i]);
        }
    }

    #[test]
    fn salt_token_boundary_is_unambiguous() {
        // Salt "abcde" with tokens t, and salt "a" with the bytes "bcde"
        // moved into a leading token: salt + token bytes are the same byte
        // string, so only the salt's length tells the two apart.
        let tokens: Vec<u32> = (1..=16).collect();
        let shifted: Vec<u32> = std::iter::once(u32::from_le_bytes(*b"bcde"))
            .chain(tokens.iter().copied())
            .collect();
        let concat = |salt: &[u8], tokens: &[u32]| {
            let mut bytes = salt.to_vec();
            tokens.iter().for_each(|t| bytes.extend(t.to_le_bytes()));
            bytes
        };
        assert_eq!(concat(b"abcde", &tokens), concat(b"a", &shifted));
        assert_ne!(
            BlockHash::first(b"abcde", &tokens),
            BlockHash::first(b"a", &shifted)
        );
        // The same shift by one byte ("ab" against "a" and a token whose
        // first byte is 'b'), as whole blocks of 16.
        let mut shifted16 = shifted[..16].to_vec();
        shifted16[0] = u32::from_le_bytes(*b"b\0\0\0");
        assert_ne!(keys(b"ab", &tokens, 16), keys(b"a", &shifted16, 16));
        // The salt's bytes are never read as tokens: salt [1, 0, 0, 0] with
        // token 2, and no salt with tokens 1, 2.
        assert_eq!(concat(&[1, 0, 0, 0], &[2]), concat(b"", &[1, 2]));
        assert_ne!(
            BlockHash::first(&[1, 0, 0, 0], &[2]),
            BlockHash::first(b"", &[1, 2])
        );
    }

    #[test]
    fn block_size_is_part_of_the_key() {
        let tokens: Vec<u32> = (0..64).collect();
        let by16 = keys(b"s", &tokens, 16);
        let by32 = keys(b"s", &tokens, 32);
        let by64 = keys(b"s", &tokens, 64);
        // Each covers tokens 0..64 in its last key, cut differently.
        assert_ne!(by16[3], by32[1]);
        assert_ne!(by16[3], by64[0]);
        assert_ne!(by32[1], by64[0]);
        // And no key of one cut appears in another.
        for k in &by16 {
            assert!(!by32.contains(k) && !by64.contains(k));
        }
    }

    #[test]
    fn first_and_next_strings_never_meet() {
        // A later block's key never equals a first block's key with the
        // same bytes after the tag: the tags differ.
        let parent = BlockHash::first(b"", &[9; 16]);
        let child = parent.next(&[1, 2, 3]);
        let mut salt = Vec::from(&parent.0[..]);
        salt.truncate(24); // the length field + 24 bytes = a parent's 32
        assert_ne!(child, BlockHash::first(&salt, &[1, 2, 3]));
        assert_ne!(child, BlockHash::first(&parent.0, &[1, 2, 3]));
    }

    #[test]
    fn empty_inputs() {
        let mut out = Vec::new();
        hash_blocks(b"salt", &[], 16, &mut out);
        assert!(out.is_empty());
        hash_blocks(b"", &[], 1, &mut out);
        assert!(out.is_empty());
        // An empty salt is a salt like any other.
        let tokens = [5u32; 16];
        assert_eq!(keys(b"", &tokens, 16), [BlockHash::first(b"", &tokens)]);
        assert_ne!(keys(b"", &tokens, 16), keys(b"\0", &tokens, 16));
        // Empty blocks (the incremental form allows them) are keys too,
        // distinct from their parent and from each other's positions.
        let e0 = BlockHash::first(b"", &[]);
        assert_eq!(reference_chain(b"", &[&[], &[]]), [e0, e0.next(&[])]);
        assert_ne!(e0, e0.next(&[]));
    }

    #[test]
    fn incremental_equals_batch() {
        let tokens: Vec<u32> = (0..1000u32).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        for block_size in [1, 3, 16, 17, 128, 129, 999, 1000, 1001] {
            let batch = keys(b"salt", &tokens, block_size);
            let mut chain: Vec<BlockHash> = Vec::new();
            for block in tokens.chunks_exact(block_size) {
                let key = match chain.last() {
                    None => BlockHash::first(b"salt", block),
                    Some(parent) => parent.next(block),
                };
                chain.push(key);
            }
            assert_eq!(batch, chain, "block_size {block_size}");
            assert_eq!(batch.len(), 1000 / block_size);
            // The stack buffer's flushes (blocks longer than it, long salts)
            // hash the same bytes as field-by-field updates.
            let blocks: Vec<&[u32]> = tokens.chunks_exact(block_size).collect();
            assert_eq!(batch, reference_chain(b"salt", &blocks));
        }
        let long_salt = vec![0xa5u8; 3 * BUF + 7];
        let blocks: Vec<&[u32]> = tokens.chunks_exact(200).collect();
        assert_eq!(
            keys(&long_salt, &tokens, 200),
            reference_chain(&long_salt, &blocks)
        );
    }

    #[test]
    fn deterministic() {
        let tokens: Vec<u32> = (0..333).collect();
        assert_eq!(keys(b"d", &tokens, 16), keys(b"d", &tokens, 16));
    }

    #[test]
    fn zero_block_size_panics_before_touching_out() {
        let mut out = keys(b"s", &[1; 16], 16);
        let before = out.clone();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            hash_blocks(b"s", &[1; 16], 0, &mut out);
        }));
        assert!(result.is_err());
        assert_eq!(out, before);
    }

    #[test]
    #[should_panic(expected = "block_size must be non-zero")]
    fn zero_block_size_panics_even_without_tokens() {
        hash_blocks(b"s", &[], 0, &mut Vec::new());
    }
}
