//! [`KvGroups`]: the groups of layers of a hybrid model, and
//! [`GroupKeys`]: the prefix cache's keys of each group.

use std::collections::TryReserveError;
use std::fmt;
use std::sync::Arc;

use crate::error::KvGroupsError;
use crate::hash::{key_of, BlockHash, Piece, IV};

/// The kind of one group of layers: what its block table must keep.
///
/// A hybrid model's layers fall into groups whose KV cache lives in the
/// same pool (one [`BlockPool`](crate::BlockPool), one block size) but
/// with a block table each. A group's kind says which of a sequence's
/// blocks its layers still read, and so which blocks its table keeps and
/// what a prefix-cache hit needs in it.
///
/// # Examples
///
/// ```
/// use kvslots::KvGroup;
///
/// let local = KvGroup::SlidingWindow { window_tokens: 1024 };
/// // After 3000 tokens the next token (position 3000) reads positions
/// // 1977..3000: blocks of 16 from number 123 on.
/// assert_eq!(local.first_needed_block(3000, 16), 123);
/// assert_eq!(KvGroup::Full.first_needed_block(3000, 16), 0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KvGroup {
    /// Full (global) attention: every token attends to every token before
    /// it, so the table keeps every block, and a prefix-cache hit needs
    /// every block of the prefix.
    Full,
    /// Sliding-window (local) attention: the token at position `p` attends
    /// to the `window_tokens` positions `p + 1 - window_tokens..=p` (itself
    /// included, as Hugging Face's `sliding_window` and vLLM count it). The
    /// table gives back the blocks wholly before the window of the next
    /// token (they become [`BlockId::NULL`](crate::BlockId::NULL) entries),
    /// and a prefix-cache hit needs only the blocks inside the window that
    /// ends at the hit.
    SlidingWindow {
        /// The tokens a token attends to, itself included; at least 1.
        window_tokens: usize,
    },
    /// Chunked local attention (Llama 4's `attention_chunk_size`, vLLM's
    /// `ChunkedLocalAttentionSpec`): the positions are cut into chunks of
    /// `chunk_tokens`, and the token at position `p` attends to the
    /// positions of its own chunk before it, `p / chunk_tokens *
    /// chunk_tokens..=p`. The table gives back the blocks wholly before
    /// the next token's chunk (as a sliding window's, they become
    /// [`BlockId::NULL`](crate::BlockId::NULL) entries), and a prefix-cache
    /// hit needs only the blocks of the chunk it ends in: none when it
    /// ends on a chunk's first position.
    ChunkedLocal {
        /// The positions of a chunk; at least 1.
        chunk_tokens: usize,
    },
}

impl KvGroup {
    /// The first block, of `block_size` tokens, that a sequence of `len`
    /// tokens still needs in this group: the block of the first position
    /// the next token (position `len`) attends to. 0 for
    /// [`Full`](Self::Full); for [`SlidingWindow`](Self::SlidingWindow),
    /// `(len + 1 - window_tokens) / block_size` (0 while `len + 1` is
    /// within the window); for [`ChunkedLocal`](Self::ChunkedLocal),
    /// `len / chunk_tokens * chunk_tokens / block_size` (a chunk of 0
    /// tokens, which [`KvGroups`] refuses, counts as 1). The blocks before
    /// it are the ones a [`HybridSequence`](crate::HybridSequence) gives
    /// back. It never decreases as `len` grows.
    ///
    /// # Panics
    ///
    /// Panics if `block_size == 0`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::KvGroup;
    ///
    /// let w = KvGroup::SlidingWindow { window_tokens: 4 };
    /// assert_eq!(w.first_needed_block(3, 2), 0); // positions 0..3 all read
    /// assert_eq!(w.first_needed_block(5, 2), 1); // position 5 reads 2..=5
    /// assert_eq!(w.first_needed_block(6, 2), 1); // position 6 reads 3..=6
    ///
    /// let c = KvGroup::ChunkedLocal { chunk_tokens: 8 };
    /// assert_eq!(c.first_needed_block(7, 2), 0); // position 7 reads 0..=7
    /// assert_eq!(c.first_needed_block(8, 2), 4); // position 8 reads itself
    /// assert_eq!(c.first_needed_block(13, 2), 4); // position 13 reads 8..=13
    /// ```
    pub const fn first_needed_block(&self, len: usize, block_size: usize) -> usize {
        match *self {
            KvGroup::Full => {
                // Panics on 0 as the sliding arm does.
                let _ = len / block_size;
                0
            }
            // `(len + 1 - window_tokens) / block_size`, 0 when the window
            // reaches back to position 0.
            KvGroup::SlidingWindow { window_tokens } => match len.checked_add(1) {
                Some(next) => next.saturating_sub(window_tokens) / block_size,
                // `len == usize::MAX`: `len + 1` does not fit, but
                // `len + 1 - window_tokens` does for a window of at least one
                // token.
                None if window_tokens > 0 => (len - (window_tokens - 1)) / block_size,
                // A window of no token (which `KvGroups` refuses):
                // `2^64 / block_size`, saturating.
                None => {
                    (len / block_size).saturating_add((len % block_size + 1 == block_size) as usize)
                }
            },
            // The chunk's first position, `len - len % chunk`: no overflow.
            KvGroup::ChunkedLocal { chunk_tokens } => {
                let chunk = if chunk_tokens == 0 { 1 } else { chunk_tokens };
                (len - len % chunk) / block_size
            }
        }
    }

    /// The shortest length whose next token needs no block before `block`
    /// (`first_needed_block(len, block_size) >= block`), saturating at
    /// `usize::MAX`: the shortest a sequence whose table gave back the
    /// blocks before `block` can be truncated to, besides 0.
    pub(crate) const fn first_len_from(&self, block: usize, block_size: usize) -> usize {
        if block == 0 {
            return 0;
        }
        let start = block.saturating_mul(block_size);
        match *self {
            KvGroup::Full => 0,
            // The first position whose window starts at `start` or later.
            KvGroup::SlidingWindow { window_tokens } => match start.checked_add(window_tokens) {
                Some(end) => end.saturating_sub(1),
                // Past `usize::MAX`: no length reaches `block`.
                None => usize::MAX,
            },
            // The first chunk boundary at `start` or later.
            KvGroup::ChunkedLocal { chunk_tokens } => {
                let chunk = if chunk_tokens == 0 { 1 } else { chunk_tokens };
                match start.checked_next_multiple_of(chunk) {
                    Some(len) => len,
                    None => usize::MAX,
                }
            }
        }
    }

    /// Whether the group gives back the blocks before those its next token
    /// reads (a sliding window or chunked local attention), so that its
    /// table can hold null entries.
    pub(crate) const fn gives_back(&self) -> bool {
        !matches!(self, KvGroup::Full)
    }

    /// The kind's tag and parameter in a group key.
    fn key_words(&self) -> (u8, u64) {
        match *self {
            KvGroup::Full => (1, 0),
            // A usize always fits a u64 on the platforms Rust supports.
            KvGroup::SlidingWindow { window_tokens } => (2, window_tokens as u64),
            KvGroup::ChunkedLocal { chunk_tokens } => (3, chunk_tokens as u64),
        }
    }
}

/// The groups of layers of a hybrid model, in order: one block table each
/// in a [`HybridSequence`](crate::HybridSequence), all over one pool.
///
/// A model with full-attention layers only is one [`KvGroup::Full`] group
/// (a plain [`Sequence`](crate::Sequence) does the same with one table).
/// Gemma 3 (five sliding-window layers to one global), gpt-oss (sliding
/// and full layers alternating) or Mistral's sliding-window models have
/// one group per kind, or, as vLLM lays them out, several groups of the
/// same kind, so that every group has the same number of layers and a
/// block (one group's layers for `block_size` tokens) the same size in
/// every group: with 10 global and 52 local layers, 1 full group and 6
/// sliding groups of 10 layers each.
///
/// Cloning is cheap (one reference count): a sequence, its forks and its
/// keys each hold the same list.
///
/// # Examples
///
/// ```
/// use kvslots::{KvGroup, KvGroups, KvGroupsError};
///
/// let gpt_oss = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 128 }, KvGroup::Full])?;
/// assert_eq!(gpt_oss.len(), 2);
/// assert_eq!(gpt_oss.get(1), Some(KvGroup::Full));
/// assert_eq!(KvGroups::new([]).unwrap_err(), KvGroupsError::Empty);
/// # Ok::<(), KvGroupsError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct KvGroups {
    groups: Arc<[KvGroup]>,
}

impl KvGroups {
    /// The most groups [`new`](Self::new) accepts.
    pub const MAX_GROUPS: usize = 1024;

    /// The groups, in order (group `i` is the `i`th).
    ///
    /// # Errors
    ///
    /// [`KvGroupsError::Empty`] for no group,
    /// [`KvGroupsError::TooManyGroups`] for more than
    /// [`MAX_GROUPS`](Self::MAX_GROUPS), [`KvGroupsError::ZeroWindow`]
    /// for a sliding window of 0 tokens, and [`KvGroupsError::ZeroChunk`]
    /// for chunks of 0 tokens.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{KvGroup, KvGroups, KvGroupsError};
    ///
    /// assert_eq!(
    ///     KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 0 }]),
    ///     Err(KvGroupsError::ZeroWindow { group: 1 })
    /// );
    /// ```
    pub fn new(groups: impl IntoIterator<Item = KvGroup>) -> Result<KvGroups, KvGroupsError> {
        let mut list = Vec::new();
        for group in groups {
            if list.len() == Self::MAX_GROUPS {
                return Err(KvGroupsError::TooManyGroups {
                    max: Self::MAX_GROUPS,
                });
            }
            list.push(group);
        }
        let groups: Arc<[KvGroup]> = list.into();
        if groups.is_empty() {
            return Err(KvGroupsError::Empty);
        }
        if let Some(group) = groups
            .iter()
            .position(|g| matches!(g, KvGroup::SlidingWindow { window_tokens: 0 }))
        {
            return Err(KvGroupsError::ZeroWindow { group });
        }
        if let Some(group) = groups
            .iter()
            .position(|g| matches!(g, KvGroup::ChunkedLocal { chunk_tokens: 0 }))
        {
            return Err(KvGroupsError::ZeroChunk { group });
        }
        Ok(KvGroups { groups })
    }

    /// How many groups (at least 1).
    ///
    /// # Examples
    ///
    /// ```
    /// let groups = kvslots::KvGroups::new([kvslots::KvGroup::Full]).unwrap();
    /// assert_eq!(groups.len(), 1);
    /// ```
    #[allow(clippy::len_without_is_empty)] // never empty
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Group `group`, or `None` past the last.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full]).unwrap();
    /// assert_eq!((groups.get(0), groups.get(1)), (Some(KvGroup::Full), None));
    /// ```
    pub fn get(&self, group: usize) -> Option<KvGroup> {
        self.groups.get(group).copied()
    }

    /// The groups, in order.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    /// assert!(groups.as_slice().iter().all(|g| *g == KvGroup::Full));
    /// ```
    pub fn as_slice(&self) -> &[KvGroup] {
        &self.groups
    }

    /// The key of block `base`'s content in group `group` (see
    /// [`GroupKeys`] for the derivation), or `None` past the last group.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{hash_blocks, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    /// let mut base = Vec::new();
    /// hash_blocks(b"", &[1; 16], 16, &mut base);
    /// let (k0, k1) = (groups.key(0, &base[0]).unwrap(), groups.key(1, &base[0]).unwrap());
    /// assert!(k0 != k1 && k0 != base[0]);
    /// ```
    pub fn key(&self, group: usize, base: &BlockHash) -> Option<BlockHash> {
        self.get(group).map(|kind| group_key(group, kind, base))
    }

    /// The keys of `base` (the keys of a prompt's full blocks, from
    /// [`hash_blocks`](crate::hash_blocks)) in every group.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{hash_blocks, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 8 }]).unwrap();
    /// let mut base = Vec::new();
    /// hash_blocks(b"", &[7; 40], 16, &mut base);
    /// let keys = groups.keys(&base);
    /// assert_eq!(keys.blocks(), 2);
    /// assert_eq!(keys.group(1).unwrap()[0], groups.key(1, &base[0]).unwrap());
    /// ```
    pub fn keys(&self, base: &[BlockHash]) -> GroupKeys {
        let mut keys = GroupKeys::new(self);
        keys.extend(base);
        keys
    }
}

impl fmt::Debug for KvGroups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.groups.iter()).finish()
    }
}

/// The tag that starts a group key's input.
const GROUP_TAG: &[u8; 16] = b"kvslots group v1";

/// Block `base`'s key in group number `group` of kind `kind`.
fn group_key(group: usize, kind: KvGroup, base: &BlockHash) -> BlockHash {
    let mut piece = Piece::default();
    piece[..16].copy_from_slice(GROUP_TAG);
    piece[16..48].copy_from_slice(&base.0);
    // `KvGroups::new` keeps the count within `MAX_GROUPS`, so a group's
    // number fits a u32.
    piece[48..52].copy_from_slice(&(group as u32).to_le_bytes());
    let (tag, parameter) = kind.key_words();
    piece[52] = tag;
    piece[53..61].copy_from_slice(&parameter.to_le_bytes());
    let mut state = IV;
    sha2::compress256(&mut state, std::slice::from_ref(&piece));
    key_of(&state)
}

/// The prefix cache's keys of a prompt's full blocks in every group of a
/// [`KvGroups`]: what [`HybridSequence::try_match_prefix`](crate::HybridSequence::try_match_prefix)
/// and [`HybridSequence::publish`](crate::HybridSequence::publish) take.
///
/// The same tokens hold different keys and values in different groups
/// (other layers), so a block of one group must never match in another:
/// each group's keys are derived from the block's content key (from
/// [`hash_blocks`](crate::hash_blocks) or
/// [`BlockHash::next`](crate::BlockHash::next)) with the group tagged in.
/// Block `i`'s key in group `g` is SHA-256's chaining state after one
/// compression, from SHA-256's initial state, of the 64-byte piece
///
/// | bytes | content |
/// |---|---|
/// | 0..16 | `"kvslots group v1"` |
/// | 16..48 | block `i`'s content key |
/// | 48..52 | `g`, a little-endian `u32` |
/// | 52 | the group's kind: 1 full, 2 sliding window, 3 chunked local attention |
/// | 53..61 | the kind's parameter (the window or the chunk in tokens; 0 for full), a little-endian `u64` |
/// | 61..64 | zero |
///
/// written as [`BlockHash`] writes a state. A content key's string starts
/// with another tag (see [`BlockHash`]'s encoding) and has at least two
/// pieces, so a group key shares no input with any content key or any
/// other group's key, and the argument of [`BlockHash`]'s docs applies:
/// equal keys mean the same content, the same group and the same kind,
/// short of a collision in SHA-256's compression function. One
/// compression a block and a group: deriving the keys costs less than
/// hashing the tokens once more per group.
///
/// # Examples
///
/// ```
/// use kvslots::{hash_blocks, BlockHash, GroupKeys, KvGroup, KvGroups};
///
/// let groups = KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 32 }]).unwrap();
/// let prompt: Vec<u32> = (0..50).collect();
/// let mut base = Vec::new();
/// hash_blocks(b"tenant", &prompt, 16, &mut base); // 3 full blocks
/// let mut keys = GroupKeys::new(&groups);
/// keys.extend(&base);
/// assert_eq!(keys.blocks(), 3);
/// // A block filled during decode: its content key, then its group keys.
/// let next = base[2].next(&[7; 16]);
/// keys.push(&next);
/// assert_eq!(keys.blocks(), 4);
/// assert_ne!(keys.group(0).unwrap()[3], keys.group(1).unwrap()[3]);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct GroupKeys {
    groups: KvGroups,
    /// One list per group, each of `blocks` keys.
    keys: Box<[Vec<BlockHash>]>,
}

impl GroupKeys {
    /// No keys yet, for `groups`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{GroupKeys, KvGroup, KvGroups};
    ///
    /// let keys = GroupKeys::new(&KvGroups::new([KvGroup::Full]).unwrap());
    /// assert_eq!(keys.blocks(), 0);
    /// ```
    pub fn new(groups: &KvGroups) -> GroupKeys {
        GroupKeys {
            groups: groups.clone(),
            keys: (0..groups.len()).map(|_| Vec::new()).collect(),
        }
    }

    /// The groups the keys are for.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{GroupKeys, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full]).unwrap();
    /// assert_eq!(GroupKeys::new(&groups).groups(), &groups);
    /// ```
    pub fn groups(&self) -> &KvGroups {
        &self.groups
    }

    /// How many blocks have keys (the same in every group).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{hash_blocks, KvGroup, KvGroups};
    ///
    /// let mut base = Vec::new();
    /// hash_blocks(b"", &[3; 32], 16, &mut base);
    /// assert_eq!(KvGroups::new([KvGroup::Full]).unwrap().keys(&base).blocks(), 2);
    /// ```
    pub fn blocks(&self) -> usize {
        self.keys[0].len()
    }

    /// Group `group`'s keys, block 0 first, or `None` past the last group.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{hash_blocks, KvGroup, KvGroups};
    ///
    /// let groups = KvGroups::new([KvGroup::Full]).unwrap();
    /// let mut base = Vec::new();
    /// hash_blocks(b"", &[3; 16], 16, &mut base);
    /// let keys = groups.keys(&base);
    /// assert_eq!(keys.group(0), Some(&[groups.key(0, &base[0]).unwrap()][..]));
    /// assert_eq!(keys.group(1), None);
    /// ```
    pub fn group(&self, group: usize) -> Option<&[BlockHash]> {
        self.keys.get(group).map(Vec::as_slice)
    }

    /// Adds the next block's keys, from its content key `base`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{BlockHash, GroupKeys, KvGroup, KvGroups};
    ///
    /// let mut keys = GroupKeys::new(&KvGroups::new([KvGroup::Full]).unwrap());
    /// keys.push(&BlockHash::first(b"", &[1; 16]));
    /// assert_eq!(keys.blocks(), 1);
    /// ```
    pub fn push(&mut self, base: &BlockHash) {
        for (g, (keys, &kind)) in self.keys.iter_mut().zip(self.groups.as_slice()).enumerate() {
            keys.push(group_key(g, kind, base));
        }
    }

    /// Adds the keys of the next blocks, from their content keys `base`,
    /// in order.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{hash_blocks, GroupKeys, KvGroup, KvGroups};
    ///
    /// let mut base = Vec::new();
    /// hash_blocks(b"", &[5; 64], 16, &mut base);
    /// let mut keys = GroupKeys::new(&KvGroups::new([KvGroup::Full]).unwrap());
    /// keys.extend(&base[..1]);
    /// keys.extend(&base[1..]);
    /// assert_eq!(keys.blocks(), 4);
    /// ```
    pub fn extend(&mut self, base: &[BlockHash]) {
        for keys in self.keys.iter_mut() {
            keys.reserve(base.len());
        }
        for b in base {
            self.push(b);
        }
    }

    /// Reserves room for the keys of at least `blocks` more blocks in
    /// every group, so that an [`extend`](Self::extend) by that many
    /// allocates nothing; as [`Vec::try_reserve`], an error (capacity
    /// overflow, or the allocator's failure) instead of a panic or an
    /// abort. The keys take `blocks * 32` bytes a group, so a key list
    /// that fits in memory can be too many for many groups.
    ///
    /// # Errors
    ///
    /// The first group's [`TryReserveError`]; the keys are unchanged (the
    /// groups before it may keep the room they got).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{hash_blocks, GroupKeys, KvGroup, KvGroups};
    ///
    /// let mut base = Vec::new();
    /// hash_blocks(b"", &[5; 64], 16, &mut base);
    /// let mut keys = GroupKeys::new(&KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap());
    /// keys.try_reserve(base.len()).unwrap();
    /// keys.extend(&base);
    /// assert!(keys.try_reserve(usize::MAX).is_err()); // no panic
    /// assert_eq!(keys.blocks(), 4);
    /// ```
    pub fn try_reserve(&mut self, blocks: usize) -> Result<(), TryReserveError> {
        for keys in self.keys.iter_mut() {
            keys.try_reserve(blocks)?;
        }
        Ok(())
    }

    /// Keeps the first `blocks` blocks' keys (a prompt rolled back); no-op
    /// at or past [`blocks`](Self::blocks).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{hash_blocks, KvGroup, KvGroups};
    ///
    /// let mut base = Vec::new();
    /// hash_blocks(b"", &[5; 64], 16, &mut base);
    /// let mut keys = KvGroups::new([KvGroup::Full]).unwrap().keys(&base);
    /// keys.truncate(1);
    /// assert_eq!(keys.blocks(), 1);
    /// ```
    pub fn truncate(&mut self, blocks: usize) {
        for keys in self.keys.iter_mut() {
            keys.truncate(blocks);
        }
    }

    /// Drops every key, keeping the lists' memory (for the next prompt).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{hash_blocks, KvGroup, KvGroups};
    ///
    /// let mut base = Vec::new();
    /// hash_blocks(b"", &[5; 64], 16, &mut base);
    /// let mut keys = KvGroups::new([KvGroup::Full]).unwrap().keys(&base);
    /// keys.clear();
    /// assert_eq!(keys.blocks(), 0);
    /// ```
    pub fn clear(&mut self) {
        self.truncate(0);
    }
}

impl fmt::Debug for GroupKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupKeys")
            .field("groups", &self.groups)
            .field("blocks", &self.blocks())
            .finish()
    }
}

#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
mod tests {
    use super::*;
    use sha2::digest::generic_array::GenericArray;

    /// The derivation as the docs write it, built byte by byte, and
    /// checked against `sha2`'s own digest of a one-piece message through
    /// the compression function's definition: a key is the state after
    /// that one piece, no padding.
    #[test]
    fn a_group_key_is_one_compression_of_the_documented_piece() {
        let base = BlockHash([0xab; 32]);
        let mut bytes = Vec::new();
        bytes.extend_from_slice(b"kvslots group v1");
        bytes.extend_from_slice(&base.0);
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.push(2);
        bytes.extend_from_slice(&1024u64.to_le_bytes());
        bytes.extend_from_slice(&[0; 3]);
        assert_eq!(bytes.len(), 64);
        let mut state = IV;
        sha2::compress256(&mut state, &[*GenericArray::from_slice(&bytes)]);
        let want = key_of(&state);
        let kind = KvGroup::SlidingWindow {
            window_tokens: 1024,
        };
        assert_eq!(group_key(3, kind, &base), want);
        // Another group, kind or window gives another key.
        assert_ne!(group_key(2, kind, &base), want);
        assert_ne!(group_key(3, KvGroup::Full, &base), want);
        let other = KvGroup::SlidingWindow { window_tokens: 512 };
        assert_ne!(group_key(3, other, &base), want);
        assert_ne!(want, base);
    }
}
