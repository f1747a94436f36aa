//! The per-block arrays of a pool, allocated fallibly: a pool too large for
//! memory is refused with a typed error instead of aborting the process.
//! Every array's room is reserved before any is written, so that a refusal
//! comes before the pool has touched (written) any of its memory.

use std::collections::TryReserveError;

/// Room for `len` values of `T`, reserved and not yet written.
pub(crate) struct Room<T> {
    values: Vec<T>,
    len: usize,
}

impl<T> Room<T> {
    /// Reserves room for `len` values, or returns the allocator's refusal
    /// (nothing is left allocated then).
    pub(crate) fn reserve(len: usize) -> Result<Room<T>, TryReserveError> {
        let mut values = Vec::new();
        values.try_reserve_exact(len)?;
        Ok(Room { values, len })
    }

    /// Writes `init(0), init(1), ...` into the room (no allocation: the
    /// room holds them).
    pub(crate) fn fill(mut self, init: impl FnMut(usize) -> T) -> Box<[T]> {
        self.values.extend((0..self.len).map(init));
        self.values.into_boxed_slice()
    }
}

/// The bytes of `len` values of `T`, saturating.
pub(crate) const fn bytes_of<T>(len: usize) -> usize {
    len.saturating_mul(std::mem::size_of::<T>())
}
