//! The per-block arrays of a pool, allocated fallibly: a pool too large for
//! memory is refused with a typed error instead of aborting the process.

use std::collections::TryReserveError;

/// `len` values `init(0), init(1), ...` in a boxed slice, or the allocator's
/// refusal (nothing is left allocated then).
pub(crate) fn try_filled<T>(
    len: usize,
    init: impl FnMut(usize) -> T,
) -> Result<Box<[T]>, TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)?;
    v.extend((0..len).map(init));
    Ok(v.into_boxed_slice())
}

/// The bytes of `len` values of `T`, saturating.
pub(crate) const fn bytes_of<T>(len: usize) -> usize {
    len.saturating_mul(std::mem::size_of::<T>())
}
