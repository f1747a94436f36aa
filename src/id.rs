//! [`BlockId`]: the name of one block of a [`BlockPool`](crate::BlockPool).

use std::fmt;

/// The id of one block in a [`BlockPool`](crate::BlockPool).
///
/// # Examples
///
/// ```
/// use kvslots::BlockId;
///
/// let id = BlockId::new(7);
/// assert_eq!(id.index(), 7);
/// assert!(BlockId::new(1) < id);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(u32);

impl BlockId {
    /// The null entry of a block table: an id no pool hands out
    /// (`u32::MAX`, past [`BlockPool::MAX_BLOCKS`](crate::BlockPool::MAX_BLOCKS)
    /// blocks). A [`HybridSequence`](crate::HybridSequence)'s sliding-window
    /// tables hold it in place of the blocks the window gave back, as
    /// vLLM's null block: an attention kernel never reads it (it lies
    /// outside the window), and a table copied to the device may map it to
    /// any block.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{BlockId, BlockPool};
    ///
    /// assert_eq!(BlockId::NULL.index(), u32::MAX as usize);
    /// assert!(BlockId::NULL.index() >= BlockPool::MAX_BLOCKS);
    /// assert!(BlockId::NULL.is_null() && !BlockId::new(0).is_null());
    /// ```
    pub const NULL: BlockId = BlockId(u32::MAX);

    /// Whether this is [`BlockId::NULL`].
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(kvslots::BlockId::NULL.is_null());
    /// ```
    pub const fn is_null(self) -> bool {
        self.0 == u32::MAX
    }

    /// The id of block number `index`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(kvslots::BlockId::new(3).index(), 3);
    /// ```
    pub const fn new(index: u32) -> BlockId {
        BlockId(index)
    }

    /// The block's number, `0..num_blocks`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(kvslots::BlockId::new(42).index(), 42);
    /// ```
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_null() {
            return f.write_str("the null block");
        }
        write!(f, "block {}", self.0)
    }
}
