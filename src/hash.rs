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
//! [`hash_blocks_with`], [`BlockHash::first_with`] and
//! [`BlockHash::next_with`] also fold tagged extra keys ([`ExtraKey`]: a
//! LoRA adapter, a cache salt, a multimodal input's hash, a custom extra)
//! into the keys of the blocks they apply to. [`BlockHash`]'s docs give the
//! byte layout, why it is collision resistant although it is not the
//! standard SHA-256 digest, and why SHA-256.
//!
//! # Allocation
//!
//! Nothing here allocates on the heap except [`hash_blocks`] and
//! [`hash_blocks_with`] growing their output (one `reserve`). A block's
//! tokens are laid out in a buffer on the stack and handed to the
//! compression function up to 128 tokens a call; a block's extra keys are
//! written through one 64-byte piece on the stack.

use std::ops::Range;

use sha2::digest::generic_array::GenericArray;
use sha2::digest::typenum::U64;
use sha2::{Digest, Sha256};

use crate::error::ExtraKeyError;

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
/// # Extra keys
///
/// A block that [`ExtraKey`]s apply to ([`hash_blocks_with`],
/// [`BlockHash::first_with`], [`BlockHash::next_with`]) starts a string of
/// its own, from SHA-256's initial state again, instead of continuing its
/// parent's:
///
/// | piece | bytes |
/// |---|---|
/// | extras header: one 64-byte block | `"kvslots extra v1"` (16 bytes), the chain's state before the block (32 bytes: the parent's key, or for block 0 the state after the header above, written as a key), the block size in tokens as a little-endian `u64` (8 bytes), the length `L` in bytes of the entries as a little-endian `u64` (8 bytes) |
/// | the entries | `L` bytes, then zero bytes up to a multiple of 64 |
/// | the block's tokens | as for any block |
///
/// The entries are those of the extras that apply to the block, LoRA
/// adapters first, then cache salts, multimodal inputs and custom extras,
/// each kind in the order given. An entry is a kind byte (1 LoRA, 2 cache
/// salt, 3 multimodal, 4 custom), then each of its byte strings as its
/// length (a little-endian `u64`) and its bytes (a LoRA's or a cache
/// salt's bytes; a multimodal input's hash; a custom extra's tag, then its
/// bytes), then for a positional extra its first and end positions less
/// the block's first position (little-endian `i64`s, two's complement).
///
/// The key is the state after the block's tokens, and the blocks after it
/// continue from it as usual, until the next block with extras. Blocks
/// before the first block with extras are keyed exactly as without
/// extras.
///
/// So every key is the last chaining value of a chain from SHA-256's
/// initial state over one of two kinds of string: the header and blocks
/// `0..=i`, or, from the last block `j <= i` with extras, the extras
/// header, `j`'s entries and blocks `j..=i`. The first 16 bytes tell the
/// kinds apart. An extras string decodes back to its inputs: the extras
/// header has a fixed length and gives the entries' length and the block
/// size; the entries decode one by one (kind, lengths, fixed-size
/// positions); then come whole blocks. And it commits everything before
/// block `j` through the chain's state, a key (or a header's state) like
/// any other. So different inputs, extras included, give different
/// strings, and the argument below applies to every key: equal keys mean
/// equal extras too. Tags and lengths make extras of different kinds, or
/// split differently between entries, different strings: a LoRA adapter
/// and a cache salt with the same bytes give different keys.
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
/// block sizes, equal tokens, equal extra keys and an equal number of
/// blocks. Different salts (tenants, LoRA adapters, cache salts) and
/// different extra keys therefore never share a key.
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

/// The tag that starts the string of a block with extra keys.
const EXTRA_TAG: &[u8; 16] = b"kvslots extra v1";

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

/// An input besides its tokens that a block's keys and values depend on,
/// tagged with its kind: what [`hash_blocks_with`],
/// [`BlockHash::first_with`] and [`BlockHash::next_with`] fold into the
/// keys of the blocks it applies to.
///
/// Each kind is written under its own tag, and every byte string with its
/// length, so extras of different kinds never give the same key, whatever
/// their bytes: a LoRA adapter named `x`, a cache salt `x`, an image whose
/// hash is `x` and a prompt salted `x` all key a prompt differently, and
/// so do `[Lora(b"ab"), CacheSalt(b"c")]` and `[Lora(b"a"),
/// CacheSalt(b"bc")]`.
///
/// Which blocks an extra applies to:
///
/// * **whole-prompt** extras ([`Lora`](Self::Lora),
///   [`CacheSalt`](Self::CacheSalt)) enter block 0's key; every later key
///   continues from block 0's, so they separate every block of the prompt,
///   and the decode blocks that [`BlockHash::next`] chains after it;
/// * **positional** extras ([`Multimodal`](Self::Multimodal),
///   [`Custom`](Self::Custom)) enter the key of every block whose tokens
///   overlap their `positions`, with those positions relative to the
///   block's first token, so the same item at another offset in a block
///   gives another key. A block that no extra applies to is keyed as
///   [`hash_blocks`] keys it: the blocks of a prompt before its first image
///   share the keys of the same text without the image.
///
/// The order of a list matters only within a kind: a block lays out its
/// LoRA extras first, then cache salts, multimodal inputs and custom
/// extras, each kind in the order given.
///
/// # Examples
///
/// ```
/// use kvslots::{hash_blocks, hash_blocks_with, ExtraKey};
///
/// // A system prompt (blocks 0 and 1), then an image whose 20 placeholder
/// // tokens sit at positions 36..56 (blocks 2 and 3).
/// let prompt: Vec<u32> = (0..64).collect();
/// let image = ExtraKey::Multimodal { hash: b"sha256:9f2c...", positions: 36..56 };
/// let (mut with_image, mut text) = (Vec::new(), Vec::new());
/// hash_blocks_with(b"", &prompt, 16, &[image], &mut with_image).unwrap();
/// hash_blocks(b"", &prompt, 16, &mut text);
/// assert_eq!(with_image[..2], text[..2]); // the system prompt is shared
/// assert_ne!(with_image[2], text[2]);
///
/// // A LoRA adapter changes every key, as would another salt.
/// let mut adapted = Vec::new();
/// hash_blocks_with(b"", &prompt, 16, &[ExtraKey::Lora(b"sql-adapter")], &mut adapted).unwrap();
/// assert!(adapted.iter().zip(&text).all(|(a, t)| a != t));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExtraKey<'a> {
    /// A LoRA adapter: bytes that name it for good (its name and path, or
    /// an id that is never reused for other weights). Whole-prompt.
    Lora(&'a [u8]),
    /// A per-request cache salt (vLLM's `cache_salt`): requests share
    /// cached blocks only with requests under the same salt. Whole-prompt.
    /// The `salt` argument of the hashing functions is another input,
    /// meant for a server-wide or tenant-wide salt; either isolates.
    CacheSalt(&'a [u8]),
    /// A multimodal input (an image, an audio clip): its content hash, and
    /// the prompt positions of the placeholder tokens that stand for it
    /// (`offset..offset + length`). Positional.
    Multimodal {
        /// The input's content hash (or any identifier that names its
        /// content for good).
        hash: &'a [u8],
        /// Its placeholder tokens' positions in the prompt; not empty.
        positions: Range<usize>,
    },
    /// Anything else that a span of tokens' keys and values depend on,
    /// under a tag of the caller's: prompt embeddings (the digest of the
    /// embeddings of one block, over that block's positions), a
    /// model revision (over `0..1`, block 0 only). Positional. Its tag is
    /// written after a kind of its own, so no tag collides with the
    /// built-in kinds.
    Custom {
        /// The caller's name for this kind of extra.
        tag: &'a [u8],
        /// The extra's bytes.
        bytes: &'a [u8],
        /// The prompt positions it applies to; not empty.
        positions: Range<usize>,
    },
}

impl ExtraKey<'_> {
    /// The kind byte that starts the entry; blocks lay out their entries
    /// in this order.
    fn kind(&self) -> u8 {
        match self {
            ExtraKey::Lora(_) => 1,
            ExtraKey::CacheSalt(_) => 2,
            ExtraKey::Multimodal { .. } => 3,
            ExtraKey::Custom { .. } => 4,
        }
    }

    /// The positions of a positional extra; `None` for a whole-prompt one.
    fn positions(&self) -> Option<&Range<usize>> {
        match self {
            ExtraKey::Lora(_) | ExtraKey::CacheSalt(_) => None,
            ExtraKey::Multimodal { positions, .. } | ExtraKey::Custom { positions, .. } => {
                Some(positions)
            }
        }
    }

    /// Whether it enters the key of the block of `len` tokens whose first
    /// token is at position `start`.
    fn applies(&self, start: usize, len: usize) -> bool {
        !self.ends_by(start) && self.starts_before(start.saturating_add(len))
    }

    /// Whether it enters no block that begins at `start` or later (a
    /// whole-prompt extra enters the first block only).
    fn ends_by(&self, start: usize) -> bool {
        self.positions().map_or(start > 0, |p| p.end <= start)
    }

    /// Whether it may enter a block that ends before `end`: it is
    /// whole-prompt, or its first position is before `end`.
    fn starts_before(&self, end: usize) -> bool {
        self.positions().map_or(true, |p| p.start < end)
    }

    /// The entry's length in bytes (see [`encode`](Self::encode)).
    fn encoded_len(&self) -> usize {
        1 + match self {
            ExtraKey::Lora(bytes) | ExtraKey::CacheSalt(bytes) => 8 + bytes.len(),
            ExtraKey::Multimodal { hash, .. } => 8 + hash.len() + 16,
            ExtraKey::Custom { tag, bytes, .. } => 8 + tag.len() + 8 + bytes.len() + 16,
        }
    }

    /// Writes the entry for the block whose first token is at `start`: the
    /// kind byte, each byte string as its length (a little-endian `u64`)
    /// and its bytes, and a positional extra's first and end positions
    /// less `start` (little-endian `i64`s, two's complement).
    fn encode(&self, start: usize, stream: &mut Stream) {
        let bytes = |stream: &mut Stream, bytes: &[u8]| {
            // A usize always fits a u64 on the platforms Rust supports.
            stream.write(&(bytes.len() as u64).to_le_bytes());
            stream.write(bytes);
        };
        let relative = |stream: &mut Stream, p: &Range<usize>| {
            // Wrapping: a bijection of the position for a given `start`.
            stream.write(&(p.start as u64).wrapping_sub(start as u64).to_le_bytes());
            stream.write(&(p.end as u64).wrapping_sub(start as u64).to_le_bytes());
        };
        stream.write(&[self.kind()]);
        match self {
            ExtraKey::Lora(b) | ExtraKey::CacheSalt(b) => bytes(stream, b),
            ExtraKey::Multimodal { hash, positions } => {
                bytes(stream, hash);
                relative(stream, positions);
            }
            ExtraKey::Custom {
                tag,
                bytes: b,
                positions,
            } => {
                bytes(stream, tag);
                bytes(stream, b);
                relative(stream, positions);
            }
        }
    }
}

/// Refuses a list with a positional extra that covers no position.
fn check_extras(extras: &[ExtraKey<'_>]) -> Result<(), ExtraKeyError> {
    for (index, extra) in extras.iter().enumerate() {
        if let Some(positions) = extra.positions() {
            if positions.is_empty() {
                return Err(ExtraKeyError::EmptyPositions {
                    index,
                    positions: positions.clone(),
                });
            }
        }
    }
    Ok(())
}

/// SHA-256's compression over a byte string written in parts, from the
/// initial state, with no padding but zeros to a whole piece.
struct Stream {
    state: [u32; 8],
    piece: Piece,
    used: usize,
}

impl Stream {
    fn new() -> Stream {
        Stream {
            state: IV,
            piece: Piece::default(),
            used: 0,
        }
    }

    fn write(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let n = (64 - self.used).min(bytes.len());
            self.piece[self.used..self.used + n].copy_from_slice(&bytes[..n]);
            self.used += n;
            bytes = &bytes[n..];
            if self.used == 64 {
                sha2::compress256(&mut self.state, std::slice::from_ref(&self.piece));
                self.used = 0;
            }
        }
    }

    /// The state after the string, zero-padded to a whole piece.
    fn finish(mut self) -> [u32; 8] {
        if self.used != 0 {
            self.piece[self.used..].fill(0);
            sha2::compress256(&mut self.state, std::slice::from_ref(&self.piece));
        }
        self.state
    }
}

/// Absorbs one block: its `tokens`, its first token at position `start`
/// of a chain of blocks of `block_size` tokens, with the `extras` of its
/// prompt. A block that none of them applies to continues `state` as
/// [`absorb`] does; one with extras restarts from SHA-256's initial state
/// with its extras piece (see [`BlockHash`]'s *Extra keys*) and then
/// absorbs its tokens.
fn absorb_block(
    state: &mut [u32; 8],
    block_size: usize,
    start: usize,
    tokens: &[u32],
    extras: &[ExtraKey<'_>],
    buf: &mut [Piece; PIECES],
) {
    let applying = || extras.iter().filter(|e| e.applies(start, tokens.len()));
    if applying().next().is_some() {
        let len: usize = applying().map(ExtraKey::encoded_len).sum();
        let mut stream = Stream::new();
        stream.write(EXTRA_TAG);
        stream.write(&key_of(state).0);
        stream.write(&(block_size as u64).to_le_bytes());
        stream.write(&(len as u64).to_le_bytes());
        for kind in 1..=4 {
            for extra in applying().filter(|e| e.kind() == kind) {
                extra.encode(start, &mut stream);
            }
        }
        *state = stream.finish();
    }
    absorb(state, tokens, buf);
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

    /// [`first`](Self::first) with the extra keys of the prompt: the key
    /// of block 0, holding `tokens`, under `salt`, with every extra of
    /// `extras` that applies to block 0 (the whole-prompt ones, and the
    /// positional ones whose positions overlap `0..tokens.len()`; see
    /// [`ExtraKey`]). With none that applies, the key is `first`'s.
    ///
    /// # Errors
    ///
    /// [`ExtraKeyError::EmptyPositions`] if a positional extra covers no
    /// position.
    ///
    /// # Panics
    ///
    /// Panics if `tokens` is empty, as [`first`](Self::first).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{hash_blocks_with, BlockHash, ExtraKey};
    ///
    /// let prompt: Vec<u32> = (0..32).collect();
    /// let extras = [ExtraKey::CacheSalt(b"user-42")];
    /// let mut keys = Vec::new();
    /// hash_blocks_with(b"", &prompt, 16, &extras, &mut keys).unwrap();
    /// assert_eq!(BlockHash::first_with(b"", &prompt[..16], &extras), Ok(keys[0]));
    /// ```
    pub fn first_with(
        salt: &[u8],
        tokens: &[u32],
        extras: &[ExtraKey<'_>],
    ) -> Result<BlockHash, ExtraKeyError> {
        assert!(!tokens.is_empty(), "a block must hold a token");
        check_extras(extras)?;
        let mut state = header_state(salt, tokens.len());
        let mut buf = [Piece::default(); PIECES];
        absorb_block(&mut state, tokens.len(), 0, tokens, extras, &mut buf);
        Ok(key_of(&state))
    }

    /// [`next`](Self::next) with the extra keys of the prompt: the key of
    /// the block that follows the block keyed `self`, holds `tokens` and
    /// starts at token position `start` of the prompt, with every extra of
    /// `extras` whose positions overlap `start..start + tokens.len()`.
    /// Pass the whole list of the prompt, as to [`hash_blocks_with`]: the
    /// whole-prompt extras entered block 0's key, and apply to no later
    /// block. With none that applies, the key is `next`'s.
    ///
    /// # Errors
    ///
    /// [`ExtraKeyError::EmptyPositions`] if a positional extra covers no
    /// position; [`ExtraKeyError::BlockStart`] if `start` is not a
    /// positive multiple of `tokens.len()` (block 0 is keyed by
    /// [`first_with`](Self::first_with)).
    ///
    /// # Panics
    ///
    /// Panics if `tokens` is empty, as [`next`](Self::next).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{hash_blocks_with, BlockHash, ExtraKey};
    ///
    /// // An image whose placeholder tokens sit at positions 20..40.
    /// let prompt: Vec<u32> = (0..48).collect();
    /// let extras = [ExtraKey::Multimodal { hash: b"img", positions: 20..40 }];
    /// let mut keys = Vec::new();
    /// hash_blocks_with(b"s", &prompt, 16, &extras, &mut keys).unwrap();
    ///
    /// // Block by block, as chunked prefill completes them.
    /// let k0 = BlockHash::first_with(b"s", &prompt[..16], &extras).unwrap();
    /// let k1 = k0.next_with(16, &prompt[16..32], &extras).unwrap();
    /// let k2 = k1.next_with(32, &prompt[32..48], &extras).unwrap();
    /// assert_eq!([k0, k1, k2], keys[..]);
    /// assert_eq!(k0, BlockHash::first(b"s", &prompt[..16])); // no extra applies
    /// ```
    pub fn next_with(
        &self,
        start: usize,
        tokens: &[u32],
        extras: &[ExtraKey<'_>],
    ) -> Result<BlockHash, ExtraKeyError> {
        assert!(!tokens.is_empty(), "a block must hold a token");
        check_extras(extras)?;
        if start == 0 || start % tokens.len() != 0 {
            return Err(ExtraKeyError::BlockStart {
                start,
                block_size: tokens.len(),
            });
        }
        let mut state = state_of(self);
        let mut buf = [Piece::default(); PIECES];
        absorb_block(&mut state, tokens.len(), start, tokens, extras, &mut buf);
        Ok(key_of(&state))
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

/// [`hash_blocks`] with extra keys: appends to `out` the keys of the full
/// blocks of `tokens`, cut into blocks of `block_size` tokens, under
/// `salt`, where each block's key also commits the extras of `extras` that
/// apply to it (see [`ExtraKey`]: LoRA adapters and cache salts enter
/// block 0, a multimodal input or a custom extra every block its positions
/// overlap).
///
/// A block that no extra applies to, and whose earlier blocks had none
/// either, gets [`hash_blocks`]'s key: with an empty `extras` every key is
/// `hash_blocks`'s, and the blocks before a prompt's first image share the
/// keys of the same text without it. Key `i` equals the incremental chain
/// [`BlockHash::first_with`], then [`BlockHash::next_with`] at positions
/// `block_size`, `2 * block_size`, and so on. A positional extra may lie
/// partly or wholly past the full blocks of `tokens` (the rest of a prompt
/// that is still arriving): it applies to the full blocks it overlaps, if
/// any. A block with extras costs one more compression than its tokens,
/// plus one per 64 bytes of its extras' entries (a multimodal entry with a
/// 32-byte hash fits in one). With the positional extras listed in order
/// of their first positions (as a prompt holds its images), a block looks
/// only at the extras near it; in any other order every block looks at
/// every extra (time in blocks times extras).
///
/// # Errors
///
/// [`ExtraKeyError::EmptyPositions`] if a positional extra covers no
/// position: it would enter no key. `out` is then left as it was.
///
/// # Panics
///
/// Panics if `block_size == 0`, before touching `out`, as [`hash_blocks`].
///
/// # Examples
///
/// ```
/// use kvslots::{hash_blocks, hash_blocks_with, ExtraKey};
///
/// let prompt: Vec<u32> = (0..48).collect();
/// let mut keys = Vec::new();
/// // No extras: hash_blocks's keys.
/// hash_blocks_with(b"tenant", &prompt, 16, &[], &mut keys).unwrap();
/// let mut plain = Vec::new();
/// hash_blocks(b"tenant", &prompt, 16, &mut plain);
/// assert_eq!(keys, plain);
///
/// // The same bytes as a LoRA adapter, a cache salt or an image: three
/// // other sets of keys.
/// let kinds = [
///     ExtraKey::Lora(b"x"),
///     ExtraKey::CacheSalt(b"x"),
///     ExtraKey::Multimodal { hash: b"x", positions: 0..48 },
/// ];
/// let mut seen = vec![plain[0]];
/// for extra in kinds {
///     keys.clear();
///     hash_blocks_with(b"tenant", &prompt, 16, &[extra], &mut keys).unwrap();
///     assert!(!seen.contains(&keys[0]));
///     seen.push(keys[0]);
/// }
/// ```
pub fn hash_blocks_with(
    salt: &[u8],
    tokens: &[u32],
    block_size: usize,
    extras: &[ExtraKey<'_>],
    out: &mut Vec<BlockHash>,
) -> Result<(), ExtraKeyError> {
    assert!(block_size != 0, "block_size must be non-zero");
    check_extras(extras)?;
    let blocks = tokens.chunks_exact(block_size);
    out.reserve(blocks.len());
    if blocks.len() == 0 {
        return Ok(());
    }
    let mut state = header_state(salt, block_size);
    let mut buf = [Piece::default(); PIECES];
    // With the positional extras in order of their first position (as a
    // prompt lists its images), each block looks only at a window of the
    // list: `lo` passes the extras that apply to no later block, `hi` stops
    // at the first positional one that starts past this block. Block 0,
    // which the whole-prompt extras enter wherever they are listed, looks
    // at them all; so do the blocks of a list out of order.
    let mut starts = extras
        .iter()
        .filter_map(ExtraKey::positions)
        .map(|p| p.start);
    let in_order = starts.next().map_or(true, |first| {
        starts
            .try_fold(first, |last, s| (last <= s).then_some(s))
            .is_some()
    });
    let (mut lo, mut hi) = (0, 0);
    for (i, block) in blocks.enumerate() {
        let start = i * block_size;
        let window = if in_order && start > 0 {
            while lo < extras.len() && extras[lo].ends_by(start) {
                lo += 1;
            }
            hi = hi.max(lo);
            let end = start.saturating_add(block_size);
            while hi < extras.len() && extras[hi].starts_before(end) {
                hi += 1;
            }
            &extras[lo..hi]
        } else {
            extras
        };
        absorb_block(&mut state, block_size, start, block, window, &mut buf);
        out.push(key_of(&state));
    }
    Ok(())
}

#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
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

    // Extra keys.

    fn keys_with(
        salt: &[u8],
        tokens: &[u32],
        block_size: usize,
        extras: &[ExtraKey<'_>],
    ) -> Vec<BlockHash> {
        let mut out = Vec::new();
        hash_blocks_with(salt, tokens, block_size, extras, &mut out).unwrap();
        out
    }

    /// The extras encoding written out a second way: for each block, the
    /// whole string its key is the state after (the header and every
    /// block, or the extras header of the last block with extras, its
    /// entries and every block from it), built as one `Vec` and
    /// compressed from SHA-256's initial state.
    fn reference_chain_with(
        salt: &[u8],
        tokens: &[u32],
        block_size: usize,
        extras: &[ExtraKey<'_>],
    ) -> Vec<BlockHash> {
        fn pad(v: &mut Vec<u8>) {
            while v.len() % 64 != 0 {
                v.push(0);
            }
        }
        fn run(v: &[u8]) -> [u32; 8] {
            let mut state = IV;
            for piece in v.chunks_exact(64) {
                sha2::compress256(&mut state, &[*Piece::from_slice(piece)]);
            }
            state
        }
        let mut string = Vec::new();
        string.extend_from_slice(b"kvslots chain v1");
        string.extend_from_slice(&Sha256::digest(salt));
        string.extend_from_slice(&(block_size as u64).to_le_bytes());
        string.extend_from_slice(&[0; 8]);
        let mut keys: Vec<BlockHash> = Vec::new();
        for (i, block) in tokens.chunks_exact(block_size).enumerate() {
            let start = i * block_size;
            let mut entries = Vec::new();
            for kind in [1u8, 2, 3, 4] {
                for extra in extras {
                    let positions = match extra {
                        ExtraKey::Lora(_) | ExtraKey::CacheSalt(_) => None,
                        ExtraKey::Multimodal { positions, .. }
                        | ExtraKey::Custom { positions, .. } => Some(positions.clone()),
                    };
                    let applies = match &positions {
                        None => start == 0,
                        Some(p) => p.start < start + block_size && start < p.end,
                    };
                    let (k, strings): (u8, Vec<&[u8]>) = match extra {
                        ExtraKey::Lora(b) => (1, vec![b]),
                        ExtraKey::CacheSalt(b) => (2, vec![b]),
                        ExtraKey::Multimodal { hash, .. } => (3, vec![hash]),
                        ExtraKey::Custom { tag, bytes, .. } => (4, vec![tag, bytes]),
                    };
                    if k != kind || !applies {
                        continue;
                    }
                    entries.push(k);
                    for b in strings {
                        entries.extend_from_slice(&(b.len() as u64).to_le_bytes());
                        entries.extend_from_slice(b);
                    }
                    if let Some(p) = positions {
                        let rel = |x: usize| (x as i128 - start as i128) as i64;
                        entries.extend_from_slice(&rel(p.start).to_le_bytes());
                        entries.extend_from_slice(&rel(p.end).to_le_bytes());
                    }
                }
            }
            if !entries.is_empty() {
                let before = if i == 0 {
                    key_of(&run(&string))
                } else {
                    keys[i - 1]
                };
                string = Vec::from(&b"kvslots extra v1"[..]);
                string.extend_from_slice(&before.0);
                string.extend_from_slice(&(block_size as u64).to_le_bytes());
                string.extend_from_slice(&(entries.len() as u64).to_le_bytes());
                string.extend_from_slice(&entries);
                pad(&mut string);
            }
            for t in block {
                string.extend_from_slice(&t.to_le_bytes());
            }
            pad(&mut string);
            keys.push(key_of(&run(&string)));
        }
        keys
    }

    fn kat_tokens() -> Vec<u32> {
        (0..48u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % 151_936)
            .collect()
    }

    #[test]
    fn extras_known_answer_matches_an_independent_implementation() {
        // The same vectors as the Python of
        // `known_answer_matches_an_independent_implementation` computes,
        // with `compress` as written there and:
        //
        //   def lp(b): return struct.pack("<Q", len(b)) + b
        //   def rel(p, s): return struct.pack("<QQ", (p[0] - s) % 2**64, (p[1] - s) % 2**64)
        //   def entry(x, s):  # ("lora", b) ("salt", b) ("mm", hash, (lo, hi))
        //       if x[0] in ("lora", "salt"):  # or ("custom", tag, b, (lo, hi))
        //           return bytes([1 if x[0] == "lora" else 2]) + lp(x[1])
        //       if x[0] == "mm": return b"\x03" + lp(x[1]) + rel(x[2], s)
        //       return b"\x04" + lp(x[1]) + lp(x[2]) + rel(x[3], s)
        //   def applies(x, s, n):
        //       if x[0] in ("lora", "salt"): return s == 0
        //       return x[-1][0] < s + n and s < x[-1][1]
        //   ORDER = {"lora": 0, "salt": 1, "mm": 2, "custom": 3}
        //   def keys_with(salt, tokens, bs, extras):
        //       header = (b"kvslots chain v1" + hashlib.sha256(salt).digest()
        //                 + struct.pack("<Q", bs) + bytes(8))
        //       h, out = compress(IV, header), []
        //       for i in range(len(tokens) // bs):
        //           s = i * bs
        //           mine = sorted([x for x in extras if applies(x, s, bs)],
        //                         key=lambda x: ORDER[x[0]])
        //           if mine:
        //               entries = b"".join(entry(x, s) for x in mine)
        //               head = (b"kvslots extra v1" + struct.pack(">8I", *h)
        //                       + struct.pack("<QQ", bs, len(entries)))
        //               h = run(IV, head + pad(entries))
        //           h = run(h, pad(struct.pack("<%dI" % bs, *tokens[s:s + bs])))
        //           out.append(struct.pack(">8I", *h).hex())
        //       return out
        //
        // with `pad(b)` zero-padding to a multiple of 64 and `run(h, b)`
        // compressing `b` 64 bytes at a time from `h`. The same code with
        // no extras gives the plain known answers.
        let tokens = kat_tokens();
        let check = |block_size: usize, extras: &[ExtraKey<'_>], expected: &[&str]| {
            let got = keys_with(b"tenant", &tokens, block_size, extras);
            assert_eq!(
                got,
                reference_chain_with(b"tenant", &tokens, block_size, extras)
            );
            let hexes: Vec<String> = got.iter().map(hex).collect();
            assert_eq!(hexes, expected, "block size {block_size}");
        };
        // Given out of the kinds' order: laid out LoRA, cache salt, image.
        let a = [
            ExtraKey::Multimodal {
                hash: b"img-0",
                positions: 20..40,
            },
            ExtraKey::CacheSalt(b"user-7"),
            ExtraKey::Lora(b"adapter-1"),
        ];
        check(
            16,
            &a,
            &[
                "94e7509a9db52b019057590a88e771065042d58f5291b259d381380aa702089f",
                "2ee537a755baa103471efbea0fcc29c325dfbad1adb41ff263a9d6c1bf4e58f2",
                "91e622a80a8a8f893223a78a67340b673c4eabab04d7ee7eb1daece554d65004",
            ],
        );
        // Blocks of 20 (padded), a custom extra on block 0, and a
        // multimodal entry of 65 bytes (two pieces of entries) on block 1.
        let hash = [b'x'; 40];
        let b = [
            ExtraKey::Custom {
                tag: b"prompt_embeds",
                bytes: &[1, 2, 3],
                positions: 0..20,
            },
            ExtraKey::Multimodal {
                hash: &hash,
                positions: 25..60,
            },
        ];
        check(
            20,
            &b,
            &[
                "33782e56e8ed590402efdce51ad19933021adc98d603edad876b26bb10dd2548",
                "e5258e4af6b44fe51193f13fe448dc89c7cba419ee8ba349523d43c337038adc",
            ],
        );
    }

    #[test]
    fn no_extras_gives_hash_blocks_keys() {
        let tokens: Vec<u32> = (0..1000u32).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        for block_size in [1, 15, 16, 17, 128, 129, 1000] {
            assert_eq!(
                keys_with(b"salt", &tokens, block_size, &[]),
                keys(b"salt", &tokens, block_size)
            );
        }
        // Extras that apply to no full block change nothing either: an
        // image past the 62 full blocks, from the partial one on (a prompt
        // still arriving).
        let late = [ExtraKey::Multimodal {
            hash: b"img",
            positions: 992..1200,
        }];
        assert_eq!(
            keys_with(b"salt", &tokens, 16, &late),
            keys(b"salt", &tokens, 16)
        );
    }

    #[test]
    fn blocks_before_the_first_extra_keep_their_keys() {
        let tokens: Vec<u32> = (0..16 * 6).collect();
        let plain = keys(b"s", &tokens, 16);
        // An image over positions 40..70: blocks 2, 3 and 4.
        let image = [ExtraKey::Multimodal {
            hash: b"img",
            positions: 40..70,
        }];
        let got = keys_with(b"s", &tokens, 16, &image);
        assert_eq!(got[..2], plain[..2]);
        for i in 2..6 {
            assert_ne!(got[i], plain[i], "block {i}");
        }
        assert_eq!(got, reference_chain_with(b"s", &tokens, 16, &image));
    }

    #[test]
    fn salt_lora_cache_salt_multimodal_and_custom_with_equal_bytes_differ() {
        let tokens: Vec<u32> = (0..48).collect();
        let all = 0..48;
        let extras = [
            ExtraKey::Lora(b"x"),
            ExtraKey::CacheSalt(b"x"),
            ExtraKey::Multimodal {
                hash: b"x",
                positions: all.clone(),
            },
            ExtraKey::Custom {
                tag: b"",
                bytes: b"x",
                positions: all.clone(),
            },
            ExtraKey::Custom {
                tag: b"x",
                bytes: b"",
                positions: all,
            },
        ];
        // The salt `x` without extras, each extra under an empty salt, and
        // neither.
        let mut variants = vec![keys(b"x", &tokens, 16), keys(b"", &tokens, 16)];
        for extra in extras {
            variants.push(keys_with(b"", &tokens, 16, &[extra]));
        }
        for (i, a) in variants.iter().enumerate() {
            for (j, b) in variants.iter().enumerate().skip(i + 1) {
                for block in 0..3 {
                    assert_ne!(a[block], b[block], "variants {i} and {j}, block {block}");
                }
            }
        }
    }

    #[test]
    fn extras_are_unambiguous() {
        let tokens: Vec<u32> = (0..32).collect();
        let k = |extras: &[ExtraKey<'_>]| keys_with(b"", &tokens, 16, extras);
        let mm =
            |hash: &'static [u8], positions: Range<usize>| ExtraKey::Multimodal { hash, positions };
        let custom = |tag: &'static [u8], bytes: &'static [u8]| ExtraKey::Custom {
            tag,
            bytes,
            positions: 0..32,
        };
        let pairs: Vec<(Vec<ExtraKey<'static>>, Vec<ExtraKey<'static>>)> = vec![
            // Bytes moved across the boundary of two entries.
            (
                vec![ExtraKey::Lora(b"ab"), ExtraKey::CacheSalt(b"c")],
                vec![ExtraKey::Lora(b"a"), ExtraKey::CacheSalt(b"bc")],
            ),
            // One entry or two.
            (
                vec![ExtraKey::Lora(b"ab")],
                vec![ExtraKey::Lora(b"a"), ExtraKey::Lora(b"b")],
            ),
            // A custom tag and its bytes.
            (vec![custom(b"ab", b"c")], vec![custom(b"a", b"bc")]),
            // A custom tag that spells a built-in kind.
            (vec![custom(b"lora", b"x")], vec![ExtraKey::Lora(b"x")]),
            // The same image at another offset, or covering other tokens.
            (vec![mm(b"img", 4..20)], vec![mm(b"img", 5..20)]),
            (vec![mm(b"img", 4..20)], vec![mm(b"img", 4..21)]),
            // Two images or one.
            (
                vec![mm(b"a", 0..8), mm(b"b", 8..16)],
                vec![mm(b"ab", 0..16)],
            ),
            // The order of two images.
            (
                vec![mm(b"a", 0..8), mm(b"b", 8..16)],
                vec![mm(b"b", 8..16), mm(b"a", 0..8)],
            ),
        ];
        for (n, (a, b)) in pairs.iter().enumerate() {
            let (ka, kb) = (k(a), k(b));
            assert_ne!(ka[0], kb[0], "pair {n}: {a:?} and {b:?}");
            assert_eq!(ka, reference_chain_with(b"", &tokens, 16, a), "pair {n}");
        }
        // Kinds are laid out in a fixed order: the order of two extras of
        // different kinds does not matter.
        assert_eq!(
            k(&[ExtraKey::CacheSalt(b"s"), ExtraKey::Lora(b"l")]),
            k(&[ExtraKey::Lora(b"l"), ExtraKey::CacheSalt(b"s")])
        );
    }

    #[test]
    fn an_extras_header_is_never_read_as_tokens() {
        // Prompt `a` has an image on block 1. Prompt `b` has the same block
        // 0, then as tokens the very bytes that block 1's key of `a` starts
        // from (its extras header and entries), then `a`'s block 1 tokens:
        // had the extras continued the chain instead of starting a string
        // of their own, `b`'s block 3 would share `a`'s block 1's key.
        let tokens: Vec<u32> = (100..132).collect();
        let image = [ExtraKey::Multimodal {
            hash: b"img",
            positions: 16..32,
        }];
        let a = keys_with(b"", &tokens, 16, &image);
        let mut stream_bytes = Vec::from(&b"kvslots extra v1"[..]);
        stream_bytes.extend_from_slice(&a[0].0);
        stream_bytes.extend_from_slice(&16u64.to_le_bytes());
        let entry_len = image[0].encoded_len() as u64;
        stream_bytes.extend_from_slice(&entry_len.to_le_bytes());
        let mut stream = Stream::new();
        image[0].encode(16, &mut stream);
        let _ = stream.finish();
        let mut entries = vec![3u8];
        entries.extend_from_slice(&3u64.to_le_bytes());
        entries.extend_from_slice(b"img");
        entries.extend_from_slice(&0i64.to_le_bytes());
        entries.extend_from_slice(&16i64.to_le_bytes());
        entries.resize(64, 0);
        stream_bytes.extend_from_slice(&entries);
        let as_tokens = stream_bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()));
        let b_tokens: Vec<u32> = tokens[..16]
            .iter()
            .copied()
            .chain(as_tokens)
            .chain(tokens[16..].iter().copied())
            .collect();
        let b = keys(b"", &b_tokens, 16);
        assert_eq!(b.len(), 4);
        assert_eq!(a[0], b[0]);
        for key in &a[1..] {
            assert!(!b.contains(key));
        }
    }

    #[test]
    fn a_multimodal_input_applies_to_the_blocks_it_overlaps() {
        let tokens: Vec<u32> = (0..16 * 5).collect();
        let at = |positions: Range<usize>| {
            keys_with(
                b"",
                &tokens,
                16,
                &[ExtraKey::Multimodal {
                    hash: b"img",
                    positions,
                }],
            )
        };
        let plain = keys(b"", &tokens, 16);
        // 20..40 overlaps blocks 1 and 2.
        let got = at(20..40);
        assert_eq!(got[0], plain[0]);
        assert_eq!(
            got,
            reference_chain_with(
                b"",
                &tokens,
                16,
                &[ExtraKey::Multimodal {
                    hash: b"img",
                    positions: 20..40,
                }]
            )
        );
        // Block 3 has no extra: it continues block 2's key as a plain
        // block does.
        assert_eq!(got[3], got[2].next(&tokens[48..64]));
        // A block boundary: 16..32 is block 1 alone, 15..16 block 0 alone.
        assert_eq!(at(16..32)[0], plain[0]);
        assert_ne!(at(15..16)[0], plain[0]);
        assert_eq!(at(15..16)[1], at(15..16)[0].next(&tokens[16..32]));
    }

    #[test]
    fn incremental_equals_batch_with_extras() {
        let tokens: Vec<u32> = (0..600u32).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        let extras = [
            ExtraKey::Lora(b"adapter"),
            ExtraKey::Multimodal {
                hash: b"a",
                positions: 10..70,
            },
            ExtraKey::Multimodal {
                hash: b"b",
                positions: 300..301,
            },
            ExtraKey::Custom {
                tag: b"embeds",
                bytes: &[7; 100],
                positions: 128..256,
            },
        ];
        for block_size in [1, 16, 17, 64, 128, 129, 600] {
            let batch = keys_with(b"salt", &tokens, block_size, &extras);
            assert_eq!(
                batch,
                reference_chain_with(b"salt", &tokens, block_size, &extras)
            );
            let mut chain: Vec<BlockHash> = Vec::new();
            for (i, block) in tokens.chunks_exact(block_size).enumerate() {
                let key = match chain.last() {
                    None => BlockHash::first_with(b"salt", block, &extras).unwrap(),
                    Some(parent) => parent.next_with(i * block_size, block, &extras).unwrap(),
                };
                chain.push(key);
            }
            assert_eq!(batch, chain, "block_size {block_size}");
        }
    }

    /// The batch's window over extras listed in position order gives the
    /// keys of the incremental chain (which looks at every extra for every
    /// block), for random lists: in order or not, disjoint, overlapping and
    /// nested, whole-prompt extras anywhere in them.
    #[test]
    fn the_window_over_ordered_extras_changes_no_key() {
        let tokens: Vec<u32> = (0..700u32).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let names: Vec<[u8; 1]> = (0..16u8).map(|n| [n]).collect();
        for round in 0..300 {
            let count = next(12) as usize;
            let mut ranges: Vec<Range<usize>> = (0..count)
                .map(|_| {
                    let start = next(760) as usize;
                    let span = if next(4) == 0 { 400 } else { 40 };
                    start..start + 1 + next(span) as usize
                })
                .collect();
            if round % 3 != 0 {
                ranges.sort_by_key(|r| r.start);
            }
            let mut extras: Vec<ExtraKey<'_>> = ranges
                .into_iter()
                .enumerate()
                .map(|(i, positions)| {
                    if i % 2 == 0 {
                        ExtraKey::Multimodal {
                            hash: &names[i],
                            positions,
                        }
                    } else {
                        ExtraKey::Custom {
                            tag: b"t",
                            bytes: &names[i],
                            positions,
                        }
                    }
                })
                .collect();
            for _ in 0..next(3) {
                let slots = extras.len() as u64 + 1;
                let at = next(slots) as usize;
                let whole = if next(2) == 0 {
                    ExtraKey::Lora(b"l")
                } else {
                    ExtraKey::CacheSalt(b"c")
                };
                extras.insert(at, whole);
            }
            let block_size = [1, 7, 16, 64][next(4) as usize];
            let batch = keys_with(b"s", &tokens, block_size, &extras);
            let mut chain: Vec<BlockHash> = Vec::new();
            for (i, block) in tokens.chunks_exact(block_size).enumerate() {
                let key = match chain.last() {
                    None => BlockHash::first_with(b"s", block, &extras).unwrap(),
                    Some(parent) => parent.next_with(i * block_size, block, &extras).unwrap(),
                };
                chain.push(key);
            }
            assert_eq!(
                batch, chain,
                "round {round}: {extras:?}, block_size {block_size}"
            );
        }
    }

    #[test]
    fn whole_prompt_extras_enter_block_0_only() {
        let tokens: Vec<u32> = (0..48).collect();
        let lora = [ExtraKey::Lora(b"adapter"), ExtraKey::CacheSalt(b"user")];
        let got = keys_with(b"", &tokens, 16, &lora);
        assert_ne!(got[0], keys(b"", &tokens, 16)[0]);
        assert_eq!(got[1], got[0].next(&tokens[16..32]));
        assert_eq!(
            got[1],
            got[0].next_with(16, &tokens[16..32], &lora).unwrap()
        );
        assert_eq!(got[2], got[1].next(&tokens[32..48]));
    }

    #[test]
    fn an_empty_positional_extra_is_refused_before_anything_changes() {
        let tokens: Vec<u32> = (0..32).collect();
        let mut out = keys(b"s", &tokens, 16);
        let (before, capacity) = (out.clone(), out.capacity());
        // A reversed range, as a caller's arithmetic might produce.
        let (from, to) = (8, 4);
        let extras = [
            ExtraKey::Lora(b"l"),
            ExtraKey::Custom {
                tag: b"t",
                bytes: b"b",
                positions: from..to,
            },
        ];
        assert_eq!(
            hash_blocks_with(b"s", &tokens, 16, &extras, &mut out),
            Err(ExtraKeyError::EmptyPositions {
                index: 1,
                positions: from..to
            })
        );
        assert_eq!((&out, out.capacity()), (&before, capacity));
        let empty = [ExtraKey::Multimodal {
            hash: b"i",
            positions: 3..3,
        }];
        let err = ExtraKeyError::EmptyPositions {
            index: 0,
            positions: 3..3,
        };
        assert_eq!(
            BlockHash::first_with(b"s", &tokens[..16], &empty),
            Err(err.clone())
        );
        assert_eq!(
            before[0].next_with(16, &tokens[16..], &empty),
            Err(err.clone())
        );
        // Also with no tokens at all: the list is checked first.
        assert_eq!(hash_blocks_with(b"s", &[], 16, &empty, &mut out), Err(err));
        assert_eq!(out, before);
    }

    #[test]
    fn next_with_refuses_a_start_off_the_block_grid() {
        let k0 = BlockHash::first(b"s", &[1; 16]);
        for start in [0, 8, 17, 31] {
            assert_eq!(
                k0.next_with(start, &[2; 16], &[]),
                Err(ExtraKeyError::BlockStart {
                    start,
                    block_size: 16
                })
            );
        }
        assert_eq!(k0.next_with(32, &[2; 16], &[]), Ok(k0.next(&[2; 16])));
        assert_eq!(
            ExtraKeyError::BlockStart {
                start: 8,
                block_size: 16
            }
            .to_string(),
            "block start 8 is not a positive multiple of the block size 16"
        );
    }

    #[test]
    #[should_panic(expected = "block_size must be non-zero")]
    fn hash_blocks_with_zero_block_size_panics() {
        let _ = hash_blocks_with(b"s", &[1; 16], 0, &[], &mut Vec::new());
    }

    #[test]
    #[should_panic(expected = "a block must hold a token")]
    fn first_with_panics_on_an_empty_block() {
        let _ = BlockHash::first_with(b"s", &[], &[]);
    }
}
