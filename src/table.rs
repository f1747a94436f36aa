//! The block-table arithmetic of a paged KV cache: how many blocks a
//! sequence of `len` tokens fills, where its next token goes, and how many
//! blocks an append needs.
//!
//! These are the pure rules [`Sequence`](crate::Sequence) applies to its
//! table, public so that code that keeps block tables of its own (a
//! scheduler's estimate, a lock-based baseline to compare against) applies
//! exactly the same rules instead of restating them.
//!
//! # Examples
//!
//! ```
//! use kvslots::table;
//!
//! // 40 tokens in blocks of 16: three blocks, the last holding 8.
//! assert_eq!(table::blocks_for(40, 16), 3);
//! assert_eq!(table::tail(40, 16), (2, 8));
//! // 20 more tokens: 8 fit in the third block, 12 need one more block.
//! assert_eq!(table::growth(40, 3, 20, 16), (1, 0));
//! ```

/// The blocks that hold `len` tokens: `len / block_size`, rounded up.
///
/// # Panics
///
/// Panics if `block_size == 0`.
///
/// # Examples
///
/// ```
/// assert_eq!(kvslots::table::blocks_for(0, 16), 0);
/// assert_eq!(kvslots::table::blocks_for(16, 16), 1);
/// assert_eq!(kvslots::table::blocks_for(17, 16), 2);
/// ```
pub const fn blocks_for(len: usize, block_size: usize) -> usize {
    len.div_ceil(block_size)
}

/// Where token number `len` goes (the next one after `len` tokens): its
/// block's position in the table and the tokens before it in that block,
/// `(len / block_size, len % block_size)`. A second value of 0 means a new
/// block starts there.
///
/// # Panics
///
/// Panics if `block_size == 0`.
///
/// # Examples
///
/// ```
/// assert_eq!(kvslots::table::tail(40, 16), (2, 8));
/// assert_eq!(kvslots::table::tail(32, 16), (2, 0));
/// ```
pub const fn tail(len: usize, block_size: usize) -> (usize, usize) {
    (len / block_size, len % block_size)
}

/// For `n` more tokens after `len` tokens in a table of `held` blocks: how
/// many blocks must be added, and how many of the held blocks the grown
/// sequence would leave wholly unused (blocks reserved ahead that `n`
/// tokens do not reach). With `need` the blocks that hold `len + n`
/// tokens, that is `(need - held, held - need)`, each at least 0.
///
/// It never overflows: `len + n` and `held * block_size` may exceed
/// `usize::MAX`, and a table too short for its `len` tokens counts its
/// missing blocks as blocks to add. The blocks to add saturate at
/// `usize::MAX` (more blocks than any pool has, so an allocation of them
/// is refused as never fitting).
///
/// # Panics
///
/// Panics if `block_size == 0`.
///
/// # Examples
///
/// ```
/// use kvslots::table::growth;
///
/// assert_eq!(growth(40, 3, 8, 16), (0, 0)); // fills the third block
/// assert_eq!(growth(40, 3, 9, 16), (1, 0)); // one token spills over
/// assert_eq!(growth(16, 4, 1, 16), (0, 2)); // two reserved blocks unused
/// assert_eq!(growth(0, 2, 1, usize::MAX), (0, 1)); // no overflow
/// ```
pub const fn growth(len: usize, held: usize, n: usize, block_size: usize) -> (usize, usize) {
    // The usual case: the held blocks' slots fit in usize and hold `len`.
    if let Some(slots) = held.checked_mul(block_size) {
        if slots >= len {
            // Tokens that still fit in the blocks held.
            let room = slots - len;
            return if n <= room {
                (0, (room - n) / block_size)
            } else {
                ((n - room).div_ceil(block_size), 0)
            };
        }
    }
    // Otherwise (slots past usize::MAX, or a table too short for `len`)
    // in u128, where `len + n` cannot overflow.
    let need = (len as u128 + n as u128).div_ceil(block_size as u128);
    let held = held as u128;
    let added = need.saturating_sub(held);
    let unused = held.saturating_sub(need);
    // `unused <= held` fits; `added` may not.
    let added = if added > usize::MAX as u128 {
        usize::MAX
    } else {
        added as usize
    };
    (added, unused as usize)
}

/// The table entries to set aside for a sequence of up to `tokens` tokens
/// over a pool of `num_blocks` blocks: the blocks they need (never more
/// than the pool has), plus one spare entry through which a copy-on-write
/// append passes its new block without reallocating; 0 for no tokens.
/// The sum saturates at `usize::MAX` (a pool has at most
/// [`BlockPool::MAX_BLOCKS`](crate::BlockPool::MAX_BLOCKS) blocks, so a
/// real pool never reaches it).
///
/// # Panics
///
/// Panics if `block_size == 0`.
///
/// # Examples
///
/// ```
/// use kvslots::table::entries;
///
/// assert_eq!(entries(100, 16, 1024), 8); // 7 blocks and the spare
/// assert_eq!(entries(100, 16, 4), 5); // capped at the pool's 4, and the spare
/// assert_eq!(entries(0, 16, 1024), 0);
/// assert_eq!(entries(usize::MAX, 1, usize::MAX), usize::MAX); // saturates
/// ```
pub const fn entries(tokens: usize, block_size: usize, num_blocks: usize) -> usize {
    let blocks = blocks_for(tokens, block_size);
    let blocks = if blocks < num_blocks {
        blocks
    } else {
        num_blocks
    };
    if blocks == 0 {
        0
    } else {
        blocks.saturating_add(1)
    }
}

#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
mod tests {
    use super::*;

    /// `growth` against adding tokens one by one to a table.
    #[test]
    fn growth_agrees_with_filling_token_by_token() {
        for bs in 1..=5 {
            for len in 0..=12 {
                for held in blocks_for(len, bs)..=blocks_for(len, bs) + 3 {
                    for n in 0..=12 {
                        let need = blocks_for(len + n, bs);
                        let added = need.saturating_sub(held);
                        let unused = held.saturating_sub(need);
                        assert_eq!(
                            growth(len, held, n, bs),
                            (added, unused),
                            "len {len} held {held} n {n} bs {bs}"
                        );
                    }
                }
            }
        }
    }

    /// `growth` at the edges: past `usize::MAX` slots or tokens, and with
    /// a table too short for its tokens, against the same rule computed in
    /// `u128`.
    #[test]
    fn growth_never_overflows() {
        let wide = |len: usize, held: usize, n: usize, bs: usize| {
            let need = (len as u128 + n as u128).div_ceil(bs as u128);
            let held = held as u128;
            let added = need.saturating_sub(held).min(usize::MAX as u128);
            (added as usize, held.saturating_sub(need) as usize)
        };
        let edges = [
            0,
            1,
            2,
            3,
            15,
            16,
            17,
            usize::MAX / 2,
            usize::MAX - 1,
            usize::MAX,
        ];
        for &bs in &[1, 2, 16, usize::MAX / 2, usize::MAX] {
            for &len in &edges {
                for &held in &edges {
                    for &n in &edges {
                        assert_eq!(
                            growth(len, held, n, bs),
                            wide(len, held, n, bs),
                            "len {len} held {held} n {n} bs {bs}"
                        );
                    }
                }
            }
        }
        assert_eq!(growth(0, 2, 1, usize::MAX), (0, 1));
    }

    #[test]
    fn tail_and_blocks_agree() {
        for bs in 1..=5 {
            for len in 0..=20 {
                let (index, filled) = tail(len, bs);
                assert_eq!(index * bs + filled, len);
                assert!(filled < bs);
                assert_eq!(blocks_for(len, bs), index + usize::from(filled > 0));
            }
        }
    }

    #[test]
    fn entries_caps_at_the_pool_and_adds_a_spare() {
        assert_eq!(entries(1, 16, 1), 2);
        assert_eq!(entries(usize::MAX, 16, 3), 4);
        assert_eq!(entries(0, 16, 0), 0);
        assert_eq!(entries(16, 16, 0), 0);
        assert_eq!(entries(usize::MAX, 1, usize::MAX), usize::MAX);
        assert_eq!(entries(usize::MAX, 1, usize::MAX - 1), usize::MAX);
    }
}
