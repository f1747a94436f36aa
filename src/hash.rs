//! Content keys for full KV-cache blocks: chained, salted, collision-resistant
//! hashes of a prompt's tokens.
//!
//! A prefix cache looks up a block by the tokens it holds *and every token
//! before it*, since a block's keys and values depend on the whole prefix. A
//! [`BlockHash`] names exactly that: block `i`'s key is SHA-256's chaining
//! state after absorbing a header that commits the salt and the block size,
//! then the tokens of blocks `0..=i`. Block `i + 1`'s key continues from
//! block `i`'s, so each block costs the compression of its own tokens only:
//! one SHA-256 compression for a block of 16 tokens. [`hash_blocks`]
//! computes the keys of all the full blocks of a prompt at once;
//! [`BlockHash::first`] and [`BlockHash::next`] compute them one block at a
//! time, for blocks that fill up during decode. Both give the same keys.
//! [`BlockHash`]'s docs give the byte layout, why it is collision resistant
//! although it is not the standard SHA-256 digest, and why SHA-256.
//!
//! # Allocation
//!
//! Nothing here allocates on the heap except [`hash_blocks`] growing its
//! output (one `reserve`). A block's tokens are laid out in a buffer on the
//! stack and handed to the compression function up to 128 tokens a call.

use sha2::digest::generic_array::GenericArray;
use sha2::digest::typenum::U64;
use sha2::{Digest, Sha256};

/// The content key of one full KV-cache block: 32 bytes that name the
/// block's tokens, every token before them, the salt and the block size.
///
/// Two blocks share a key only if they hold the same tokens after the same
/// prefix, cut into blocks of the same size, under the same salt, short of
/// a collision in SHA-256's compression function (or a preimage of
/// SHA-256's initial state under it). [`hash_blocks`] computes the keys of a prompt's
/// full blocks; [`BlockHash::first`] and [`BlockHash::next`] compute them
/// one block at a time.
///
/// # Encoding
///
/// A prompt's keys come from one byte string, absorbed 64 bytes at a time
/// by SHA-256's compression function, starting from SHA-256's initial
/// state (FIPS 180-4, section 5.3.3):
///
/// | piece | bytes |
/// |---|---|
/// | header: one 64-byte block | `"kvslots chain v1"` (16 bytes), the SHA-256 digest of the salt (32 bytes), the block size in tokens as a little-endian `u64` (8 bytes), 8 zero bytes |
/// | block `i` of the prompt | its tokens as little-endian `u32`s, then zero bytes up to a multiple of 64: one 64-byte block for 16 tokens, two for 17 to 32, and so on |
///
/// Block `i`'s key is the state after block `i`'s bytes: SHA-256's eight
/// 32-bit state words, each written big-endian (the order a SHA-256 digest
/// writes them in). Block `i + 1`'s key continues from that state through
/// block `i + 1`'s bytes, so [`BlockHash::next`] needs only the parent's key
/// and the new block's tokens.
///
/// A key is **not** the SHA-256 digest of those bytes: no padding or length
/// block is compressed after them, so a key is the state SHA-256 is in just
/// before it would pad. Reproducing a key elsewhere takes a SHA-256
/// compression function that takes and returns the state:
/// `sha2::compress256` in Rust, or in Python (whose `hashlib` hides its
/// state) the compression function written out from FIPS 180-4, about 25
/// lines; the known-answer test in this module's source carries such a
/// script.
///
/// For one block size the string decodes back to its inputs: the header
/// has a fixed length, every block is the same whole number of 64-byte
/// pieces, and a block's zero padding sits at fixed places after its
/// `block_size` tokens. Two salts give two headers unless their SHA-256
/// digests collide; two block sizes always give two headers. So different
/// inputs give different strings, and keys are the same on every platform
/// (the byte order is fixed).
///
/// # Why the keys do not collide
///
/// Each key is the last chaining value of a Merkle–Damgård chain over whole
/// 64-byte pieces, with no length committed at the end. Take two different
/// strings that end in the same state and walk back from their last pieces
/// while both compressions at a step had the same inputs (state in, piece):
///
/// * If the walk reaches a step whose inputs differ, that step's outputs
///   are still equal (they are the next step's equal input states, or the
///   keys), so that step is a collision of the compression function. Two
///   different strings of the same length (same block size and block
///   count, as any two keys at the same place in two prompts) always end
///   here, since they differ in some piece.
/// * Otherwise the shorter string runs out first, with every input equal:
///   the longer string's chain came back to SHA-256's initial state after
///   a non-empty prefix, a preimage of that fixed value under the
///   compression function. (SHA-256's final length block rules this case
///   out for the standard digest; here it rests on preimage resistance,
///   which no attack on the full compression function comes near.)
///
/// The first case is the assumption the Merkle–Damgård proof of SHA-256's
/// own collision resistance rests on. The compression function's easily
/// computed fixed points (a state `h` with `compress(h, m) = h` for a
/// chosen piece `m`) would let a string grow by `m` without changing its
/// key, an instance of the first case, but only from that `h`: reaching
/// one from a real chain is a search over 256-bit states, about 2^128 work
/// at best, a collision search's cost. Nothing is secret, so length
/// extension (anyone can continue a chain from a key) is no weakness:
/// continuing a chain is what [`BlockHash::next`] does, and the salt is not
/// a secret either. Isolation comes from the server choosing the salt (per
/// tenant, per adapter), never the client; anyone who knows a salt and a
/// prompt can compute its keys, as the server does.
///
/// Short of breaking one of these, equal keys mean equal salts, equal
/// block sizes, equal tokens and an equal number of blocks. Different salts (tenants,
/// LoRA adapters, multimodal inputs folded into a salt) therefore never
/// share a key.
///
/// # Block size
///
/// The block size is in the header, so the keys of one prompt cut into
/// blocks of 16 and into blocks of 32 differ from the first block on: a key
/// names the tokens *and* their cut into blocks, which is what a pool needs
/// (it has one block size, and a key computed for another size must not
/// match). [`BlockHash::first`] takes the length of the block it is given
/// as the block size; [`BlockHash::next`] must be given blocks of that same
/// length, and then agrees with [`hash_blocks`]. A key does not carry the
/// block size, so `next` cannot check this: a block of another length gets
/// a key with no guarantee (with blocks of 16, a block of 15 tokens pads to
/// the same 64 bytes as those 15 tokens followed by token 0).
///
/// # Why SHA-256
///
/// A key must resist crafted prompts: a collision would let one request
/// read another's cache, so a fast non-cryptographic hash (FxHash, xxHash)
/// will not do. A 16-token block is 64 bytes, one compression with either
/// of the two usual cryptographic choices (BLAKE3 keyed by the parent's key
/// also takes one), and SHA-256's compression (through the `sha2` crate) is
/// the faster on CPUs with SHA extensions, which x86-64 servers have had
/// for years (`sha_ni`: AMD since Zen, Intel since Ice Lake) and which
/// `sha2` detects at run time: it runs in dedicated instructions
/// (`sha256rnds2` does two rounds in one), while BLAKE3's speed comes from
/// SIMD across many 1 KiB chunks at once, which a 64-byte input cannot use.
/// `benches/hash.rs` measures this chain against the standard digest chain
/// (a full SHA-256 digest a block, over a tag, the parent's digest and the
/// tokens: two compressions and a finalisation), BLAKE3 over the same
/// bytes, and BLAKE3 keyed by the parent; `benches/vllm_block_hash.py`
/// measures the chain vLLM computes in Python. On a CPU without SHA
/// extensions `sha2` falls back to portable code, where BLAKE3 would
/// likely be the faster; the keys are the same either way. SHA-256 also
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

/// The tag that starts the header.
const TAG: &[u8; 16] = b"kvslots chain v1";

/// SHA-256's initial state (FIPS 180-4, section 5.3.3): `sha2` does not
/// export it. The tests check it against `sha2`'s own digest.
pub(crate) const IV: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// One 64-byte input of the compression function.
pub(crate) type Piece = GenericArray<u8, U64>;

/// Tokens in one [`Piece`].
const TOKENS_PER_PIECE: usize = 16;

/// Pieces laid out on the stack and compressed in one call: 128 tokens. A
/// longer block takes several calls; one call over many pieces keeps the
/// state in registers between them.
const PIECES: usize = 8;

/// SHA-256's state as a key: the words big-endian, as a digest writes them.
pub(crate) fn key_of(state: &[u32; 8]) -> BlockHash {
    let mut key = [0; 32];
    for (dst, word) in key.chunks_exact_mut(4).zip(state) {
        dst.copy_from_slice(&word.to_be_bytes());
    }
    BlockHash(key)
}

/// The state a key was read from ([`key_of`]'s inverse).
fn state_of(key: &BlockHash) -> [u32; 8] {
    let mut state = [0; 8];
    for (word, src) in state.iter_mut().zip(key.0.chunks_exact(4)) {
        *word = u32::from_be_bytes([src[0], src[1], src[2], src[3]]);
    }
    state
}

/// The state after the header, which commits `salt` and `block_size`.
fn header_state(salt: &[u8], block_size: usize) -> [u32; 8] {
    let mut header = Piece::default();
    header[..16].copy_from_slice(TAG);
    header[16..48].copy_from_slice(&Sha256::digest(salt));
    // A usize always fits a u64 on the platforms Rust supports.
    header[48..56].copy_from_slice(&(block_size as u64).to_le_bytes());
    let mut state = IV;
    sha2::compress256(&mut state, std::slice::from_ref(&header));
    state
}

/// Absorbs one block's `tokens` into `state`: the tokens as little-endian
/// `u32`s, zero-padded to a whole number of pieces, laid out in `buf`.
/// [`hash_blocks`] passes one `buf` for all its blocks, so the buffer is
/// zeroed once a prompt, not once a block.
fn absorb(state: &mut [u32; 8], tokens: &[u32], buf: &mut [Piece; PIECES]) {
    for group in tokens.chunks(TOKENS_PER_PIECE * PIECES) {
        let mut used = 0;
        for (piece, tokens) in buf.iter_mut().zip(group.chunks(TOKENS_PER_PIECE)) {
            if let Ok(whole) = <&[u32; TOKENS_PER_PIECE]>::try_from(tokens) {
                // A whole piece, of a length the compiler knows: the
                // common case, laid out without a loop.
                for (dst, token) in piece.chunks_exact_mut(4).zip(whole) {
                    dst.copy_from_slice(&token.to_le_bytes());
                }
            } else {
                for (dst, token) in piece.chunks_exact_mut(4).zip(tokens) {
                    dst.copy_from_slice(&token.to_le_bytes());
                }
                // Only a block's last piece is partial; the buffer may
                // hold an earlier block's bytes there.
                piece[4 * tokens.len()..].fill(0);
            }
            used += 1;
        }
        sha2::compress256(state, &buf[..used]);
    }
}

impl BlockHash {
    /// The key of a prompt's first block, holding `tokens`, under `salt`.
    ///
    /// `tokens.len()` is the block size (normally the pool's): it goes into
    /// the header, and every later block of the chain must hold as many
    /// tokens (see [`BlockHash`]'s *Block size*).
    ///
    /// # Panics
    ///
    /// Panics if `tokens` is empty: no pool has empty blocks (as
    /// [`hash_blocks`] with a zero block size).
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
        assert!(!tokens.is_empty(), "a block must hold a token");
        let mut state = header_state(salt, tokens.len());
        absorb(&mut state, tokens, &mut [Piece::default(); PIECES]);
        key_of(&state)
    }

    /// The key of the block that follows the block keyed `self` and holds
    /// `tokens`: the incremental form, for a block that fills up during
    /// decode.
    ///
    /// `self` is the chain's state, so the result depends on `self` and
    /// `tokens` only; the salt and the block size are already in the chain,
    /// through block 0's key. `tokens` must hold as many tokens as every
    /// other block of the chain (the block size; see [`BlockHash`]'s *Block
    /// size*): a key does not carry the block size, so this cannot be
    /// checked.
    ///
    /// # Panics
    ///
    /// Panics if `tokens` is empty: an empty block would absorb nothing and
    /// get its parent's key.
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
        assert!(!tokens.is_empty(), "a block must hold a token");
        let mut state = state_of(self);
        absorb(&mut state, tokens, &mut [Piece::default(); PIECES]);
        key_of(&state)
    }
}

/// Appends to `out` the keys of the full blocks of `tokens`, cut into blocks
/// of `block_size` tokens, under `salt`: `tokens.len() / block_size` keys,
/// block 0's first. A partly filled last block gets no key.
///
/// Key `i` depends on the salt, the block size and every token of blocks
/// `0..=i`, and on nothing else; it equals the incremental chain
/// `BlockHash::first(salt, block 0)`, then `.next(block 1)`, and so on.
/// Each block costs the compression of its own tokens (one SHA-256
/// compression for 16 tokens), plus, once a call, the header's and the
/// salt's digest. `out` is appended to (not cleared), and reserved once, so
/// a reused `Vec` allocates nothing.
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
    let blocks = tokens.chunks_exact(block_size);
    out.reserve(blocks.len());
    if blocks.len() == 0 {
        return;
    }
    let mut state = header_state(salt, block_size);
    let mut buf = [Piece::default(); PIECES];
    for block in blocks {
        absorb(&mut state, block, &mut buf);
        out.push(key_of(&state));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoding written out a second way: the whole string built as
    /// one `Vec`, then compressed a piece at a time with
    /// `sha2::compress256`, a key taken wherever a block's bytes end.
    fn reference_chain(salt: &[u8], tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
        let mut string = Vec::new();
        string.extend_from_slice(b"kvslots chain v1");
        string.extend_from_slice(&Sha256::digest(salt));
        string.extend_from_slice(&u64::try_from(block_size).unwrap().to_le_bytes());
        string.extend_from_slice(&[0; 8]);
        let mut ends = Vec::new();
        for block in tokens.chunks_exact(block_size) {
            for t in block {
                string.extend_from_slice(&t.to_le_bytes());
            }
            while string.len() % 64 != 0 {
                string.push(0);
            }
            ends.push(string.len());
        }
        let mut state = IV;
        let mut keys = Vec::new();
        for (i, piece) in string.chunks_exact(64).enumerate() {
            sha2::compress256(&mut state, &[*Piece::from_slice(piece)]);
            if ends.contains(&(64 * (i + 1))) {
                let bytes: Vec<u8> = state.iter().flat_map(|w| w.to_be_bytes()).collect();
                keys.push(BlockHash(bytes.try_into().unwrap()));
            }
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

    /// SHA-256's padding piece for a string of `len` bytes, `len` a
    /// multiple of 64: a 1 bit, zeros, the length in bits big-endian.
    fn padding(len: usize) -> Piece {
        let mut piece = Piece::default();
        piece[0] = 0x80;
        piece[56..].copy_from_slice(&(8 * u64::try_from(len).unwrap()).to_be_bytes());
        piece
    }

    #[test]
    fn initial_state_is_sha256s() {
        // SHA-256 of the empty string is one compression of the padding
        // from the initial state.
        let mut state = IV;
        sha2::compress256(&mut state, &[padding(0)]);
        assert_eq!(key_of(&state).0[..], Sha256::digest(b"")[..]);
    }

    #[test]
    fn keys_are_sha256s_state_before_padding() {
        // With blocks of 16 every piece is whole, so SHA-256 of the header
        // and blocks 0..=i is key i compressed once more with the padding:
        // the standard digest, through `sha2`'s own hasher, checks the keys.
        let tokens: Vec<u32> = (0..64u32).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        let got = keys(b"salt", &tokens, 16);
        let mut string = Vec::from(&b"kvslots chain v1"[..]);
        string.extend_from_slice(&Sha256::digest(b"salt"));
        string.extend_from_slice(&16u64.to_le_bytes());
        string.extend_from_slice(&[0; 8]);
        for (i, block) in tokens.chunks_exact(16).enumerate() {
            block
                .iter()
                .for_each(|t| string.extend_from_slice(&t.to_le_bytes()));
            let mut state = state_of(&got[i]);
            sha2::compress256(&mut state, &[padding(string.len())]);
            assert_eq!(
                key_of(&state).0[..],
                Sha256::digest(&string)[..],
                "block {i}"
            );
            // And a key is not the digest itself.
            assert_ne!(got[i].0[..], Sha256::digest(&string)[..]);
        }
    }

    #[test]
    fn known_answer_matches_an_independent_implementation() {
        let tokens: Vec<u32> = (0..48u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % 151_936)
            .collect();
        let got = keys(b"tenant", &tokens, 16);
        assert_eq!(got, reference_chain(b"tenant", &tokens, 16));
        // The same vectors, fixed, as a third implementation computes them:
        // Python with the compression function written out from FIPS 180-4
        // (checked against `hashlib.sha256` on strings of 0 to 200 bytes):
        //
        //   def compress(h, piece):  # h: 8 ints; piece: 64 bytes
        //       w = list(struct.unpack(">16I", piece))
        //       for i in range(16, 64):
        //           s0 = rotr(w[i-15], 7) ^ rotr(w[i-15], 18) ^ (w[i-15] >> 3)
        //           s1 = rotr(w[i-2], 17) ^ rotr(w[i-2], 19) ^ (w[i-2] >> 10)
        //           w.append((w[i-16] + s0 + w[i-7] + s1) & M)
        //       a, b, c, d, e, f, g, hh = h
        //       for i in range(64):
        //           t1 = (hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25))
        //                 + ((e & f) ^ (~e & g)) + K[i] + w[i]) & M
        //           t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22))
        //                 + ((a & b) ^ (a & c) ^ (b & c))) & M
        //           a, b, c, d, e, f, g, hh = (t1 + t2) & M, a, b, c, (d + t1) & M, e, f, g
        //       return [(x + y) & M for x, y in zip(h, [a, b, c, d, e, f, g, hh])]
        //
        //   def keys(salt, tokens, bs):
        //       header = (b"kvslots chain v1" + hashlib.sha256(salt).digest()
        //                 + struct.pack("<Q", bs) + bytes(8))
        //       h, out = compress(IV, header), []
        //       for i in range(len(tokens) // bs):
        //           data = struct.pack("<%dI" % bs, *tokens[i * bs:(i + 1) * bs])
        //           data += bytes(-len(data) % 64)
        //           for j in range(0, len(data), 64):
        //               h = compress(h, data[j:j + 64])
        //           out.append(struct.pack(">8I", *h).hex())
        //       return out
        //
        // with M = 2**32 - 1, rotr(x, n) = ((x >> n) | (x << (32 - n))) & M,
        // and K and IV SHA-256's constants. A change of encoding changes
        // every key a deployed cache holds, so it must be deliberate.
        assert_eq!(
            hex(&got[0]),
            "f909d3b2c083902e4dd98290982cbf2361f2b2ebc810bbabc0acfd0d53ee3a77"
        );
        assert_eq!(
            hex(&got[2]),
            "c90dca8fad9e5d60e70b6fe76ebd247c6663218057fbe45039c62809fa25315d"
        );
        // A block size that pads (20 tokens: 80 bytes, two pieces).
        let by20 = keys(b"tenant", &tokens, 20);
        assert_eq!(by20, reference_chain(b"tenant", &tokens, 20));
        assert_eq!(
            hex(&by20[1]),
            "4cbbfd963a2c398abcbd2e60897ca73a8109b0dba2beb3c5f5173a54bba4edc1"
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
            for at in [0, 5, 15] {
                let mut changed = tokens.clone();
                changed[16 * j + at] ^= 1 << (at % 32);
                let got = keys(b"s", &changed, 16);
                assert_eq!(got[..j], base[..j], "block {j} changed an earlier key");
                for i in j..6 {
                    assert_ne!(got[i], base[i], "block {j} left key {i} unchanged");
                }
            }
        }
    }

    #[test]
    fn a_longer_prompt_shares_the_shorter_ones_keys() {
        let tokens: Vec<u32> = (0..16 * 9).map(|i| i * 7 + 3).collect();
        let all = keys(b"p", &tokens, 16);
        for n in 0..=9 {
            assert_eq!(keys(b"p", &tokens[..16 * n], 16), all[..n]);
        }
    }

    #[test]
    fn salts_separate_keys() {
        let tokens: Vec<u32> = (0..32).collect();
        let a = keys(b"tenant-a", &tokens, 16);
        let b = keys(b"tenant-b", &tokens, 16);
        let none = keys(b"", &tokens, 16);
        let zero = keys(b"\0", &tokens, 16);
        for i in 0..2 {
            assert_ne!(a[i], b[i]);
            assert_ne!(a[i], none[i]);
            assert_ne!(b[i], none[i]);
            assert_ne!(zero[i], none[i]);
        }
        // A salt longer than a piece, and one that differs in its last byte.
        let mut long = vec![0xa5u8; 1000];
        let l1 = keys(&long, &tokens, 16);
        long[999] ^= 1;
        let l2 = keys(&long, &tokens, 16);
        assert_ne!(l1[0], l2[0]);
        assert_eq!(l1, reference_chain(&vec![0xa5u8; 1000], &tokens, 16));
    }

    #[test]
    fn salt_bytes_are_never_read_as_tokens() {
        // Salt "abcde" with tokens t, and salt "a" with the bytes "bcde"
        // moved into a leading token: the same bytes laid end to end.
        let tokens: Vec<u32> = (1..=16).collect();
        let shifted: Vec<u32> = std::iter::once(u32::from_le_bytes(*b"bcde"))
            .chain(tokens.iter().copied())
            .collect();
        assert_ne!(
            BlockHash::first(b"abcde", &tokens),
            BlockHash::first(b"a", &shifted[..16])
        );
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
        // Each covers tokens 0..64 in its last key, cut differently, and
        // the three strings after the header are the same bytes.
        assert_ne!(by16[3], by32[1]);
        assert_ne!(by16[3], by64[0]);
        assert_ne!(by32[1], by64[0]);
        // And no key of one cut appears in another.
        for k in &by16 {
            assert!(!by32.contains(k) && !by64.contains(k));
        }
        // 15 tokens pad to the same 64 bytes as those 15 and a token 0: only
        // the header's block size tells the two apart.
        let fifteen: Vec<u32> = (1..=15).collect();
        let sixteen: Vec<u32> = fifteen.iter().copied().chain([0]).collect();
        assert_ne!(keys(b"s", &fifteen, 15), keys(b"s", &sixteen, 16));
    }

    #[test]
    fn next_needs_the_chains_block_size() {
        // The documented limit of the incremental form: a key does not
        // carry the block size, so a short block pads like the full block
        // ending in zeros.
        let k0 = BlockHash::first(b"s", &[9; 16]);
        let short: Vec<u32> = (1..=15).collect();
        let padded: Vec<u32> = short.iter().copied().chain([0]).collect();
        assert_eq!(k0.next(&short), k0.next(&padded));
        assert_ne!(k0.next(&short), k0.next(&[1; 16]));
    }

    #[test]
    fn keys_within_a_chain_are_distinct() {
        // Blocks with equal tokens still get distinct keys: each key is a
        // state further along the chain.
        let got = keys(b"r", &[0; 16 * 50], 16);
        for (i, a) in got.iter().enumerate() {
            assert!(!got[i + 1..].contains(a), "key {i} repeats");
        }
        let zeros = keys(b"", &[0; 16], 16);
        assert_ne!(zeros[0], BlockHash([0; 32]));
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
        assert_eq!(keys(b"", &tokens, 16), reference_chain(b"", &tokens, 16));
    }

    #[test]
    #[should_panic(expected = "a block must hold a token")]
    fn first_panics_on_an_empty_block() {
        let _ = BlockHash::first(b"s", &[]);
    }

    #[test]
    #[should_panic(expected = "a block must hold a token")]
    fn next_panics_on_an_empty_block() {
        let _ = BlockHash::first(b"s", &[1; 16]).next(&[]);
    }

    #[test]
    fn incremental_equals_batch() {
        let tokens: Vec<u32> = (0..1000u32).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        // Sizes that fill a piece, pad one, span several stack buffers
        // (more than 128 tokens) and end a buffer with a partial piece.
        for block_size in [1, 3, 15, 16, 17, 32, 127, 128, 129, 200, 999, 1000, 1001] {
            let batch = keys(b"salt", &tokens, block_size);
            let mut chain: Vec<BlockHash> = Vec::new();
            for block in tokens.chunks_exact(block_size) {
                let key = match chain.last() {
                    None => BlockHash::first(b"salt", block),
                    // The incremental form needs only the parent's 32 bytes.
                    Some(parent) => BlockHash(parent.0).next(block),
                };
                chain.push(key);
            }
            assert_eq!(batch, chain, "block_size {block_size}");
            assert_eq!(batch.len(), 1000 / block_size);
            assert_eq!(
                batch,
                reference_chain(b"salt", &tokens, block_size),
                "block_size {block_size}"
            );
        }
    }

    #[test]
    fn key_and_state_round_trip() {
        let state = [1, 0x0203_0405, u32::MAX, 0, 7, 8, 9, 0x8000_0000];
        assert_eq!(state_of(&key_of(&state)), state);
        assert_eq!(key_of(&state).0[4..8], [2, 3, 4, 5]);
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
