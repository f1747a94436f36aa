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
        write!(f, "block {}", self.0)
    }
}
