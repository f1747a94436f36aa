//! RAII guards over slots taken from a [`SlotCounter`]: [`Reservation`]
//! (borrows the counter) and [`OwnedReservation`] (holds an [`Arc`] of it).
//!
//! A guard gives its slots back when dropped, also while its thread unwinds
//! from a panic, so a crashed worker cannot leak KV-cache slots. Splitting,
//! merging and forgetting only move counts between guards (no atomic
//! operation); shrinking gives the excess back at once with one `fetch_sub`;
//! growing is one all-or-nothing admission.

use std::fmt;
use std::sync::Arc;

use crate::counter::SlotCounter;
use crate::error::ReserveError;

/// The ways to take slots as a guard.
impl SlotCounter {
    /// Reserves `n` slots, all or nothing, and returns a guard that gives
    /// them back when dropped.
    ///
    /// `try_reserve(0)` succeeds with an empty guard (on an open counter).
    ///
    /// # Errors
    ///
    /// * [`ReserveError::Closed`] once [`close`](Self::close) was called
    ///   (whatever `n`).
    /// * [`ReserveError::NeverFits`] if `n > capacity()`; retrying is
    ///   pointless.
    /// * [`ReserveError::Full`] if fewer than `n` slots are free; `available`
    ///   is the count the counter held when it refused.
    /// * [`ReserveError::BehindWaiters`] if `n` slots are free, but not
    ///   beside what waiters queued by [`reserve`](Self::reserve) or
    ///   [`reserve_blocking`](Self::reserve_blocking) are owed.
    ///
    /// On error nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{ReserveError, SlotCounter};
    ///
    /// let counter = SlotCounter::new(4);
    /// let r = counter.try_reserve(4).unwrap();
    /// assert_eq!(r.len(), 4);
    /// assert_eq!(
    ///     counter.try_reserve(1).unwrap_err(),
    ///     ReserveError::Full { requested: 1, available: 0 }
    /// );
    /// ```
    pub fn try_reserve(&self, n: usize) -> Result<Reservation<'_>, ReserveError> {
        self.try_reserve_raw(n, 0)?;
        Ok(Reservation::new(self, n))
    }

    /// Like [`try_reserve`](Self::try_reserve), but the guard holds an
    /// [`Arc`] of the counter, so it is `'static` and can be moved into
    /// another thread or stored in a request's state.
    ///
    /// # Errors
    ///
    /// As [`try_reserve`](Self::try_reserve).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::SlotCounter;
    ///
    /// let counter = Arc::new(SlotCounter::new(4));
    /// let r = counter.try_reserve_owned(2).unwrap();
    /// std::thread::spawn(move || drop(r)).join().unwrap();
    /// assert_eq!(counter.used(), 0);
    /// ```
    pub fn try_reserve_owned(self: &Arc<Self>, n: usize) -> Result<OwnedReservation, ReserveError> {
        self.try_reserve_raw(n, 0)?;
        Ok(OwnedReservation::new(Arc::clone(self), n))
    }

    /// Reserves `n` slots only if `headroom` more would still be free
    /// afterwards: `used + n + headroom <= capacity`.
    ///
    /// This is the watermark a scheduler applies to *new* sequences, so that
    /// the running ones keep room to grow; plain
    /// [`try_reserve`](Self::try_reserve) (and `try_grow`) may use the
    /// headroom. Neither `n` nor `headroom` can overflow, up to `usize::MAX`.
    ///
    /// # Errors
    ///
    /// * [`ReserveError::Closed`] once [`close`](Self::close) was called.
    /// * [`ReserveError::NeverFits`] if `n + headroom > capacity()` (as in
    ///   vLLM, such a request would never pass the watermark).
    /// * [`ReserveError::Full`] if `n + headroom` slots are not free;
    ///   `available` is the free count the counter held when it refused
    ///   (headroom not subtracted).
    /// * [`ReserveError::BehindWaiters`] if they are, but not beside what
    ///   the queued waiters are owed.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{ReserveError, SlotCounter};
    ///
    /// let counter = SlotCounter::new(10);
    /// let first = counter.try_reserve_with_headroom(6, 2).unwrap();
    /// // 4 free, but 3 + 2 of headroom do not fit:
    /// assert_eq!(
    ///     counter.try_reserve_with_headroom(3, 2).unwrap_err(),
    ///     ReserveError::Full { requested: 3, available: 4 }
    /// );
    /// // a running sequence may still grow into the headroom:
    /// let grow = counter.try_reserve(3).unwrap();
    /// assert_eq!(counter.used(), 9);
    /// # drop((first, grow));
    /// ```
    pub fn try_reserve_with_headroom(
        &self,
        n: usize,
        headroom: usize,
    ) -> Result<Reservation<'_>, ReserveError> {
        self.try_reserve_raw(n, headroom)?;
        Ok(Reservation::new(self, n))
    }
}

/// Slots held from a [`SlotCounter`], given back when dropped.
///
/// Returned by [`SlotCounter::try_reserve`] and
/// [`SlotCounter::try_reserve_with_headroom`].
#[must_use = "dropping a Reservation gives its slots back at once"]
pub struct Reservation<'a> {
    counter: &'a SlotCounter,
    len: usize,
}

/// Slots held from an `Arc<SlotCounter>`, given back when dropped.
///
/// Returned by [`SlotCounter::try_reserve_owned`]; it is `'static`, so it can
/// be stored in a request's state or moved to another thread.
#[must_use = "dropping an OwnedReservation gives its slots back at once"]
pub struct OwnedReservation {
    counter: Arc<SlotCounter>,
    len: usize,
}

impl<'a> Reservation<'a> {
    pub(crate) fn new(counter: &'a SlotCounter, len: usize) -> Self {
        Reservation { counter, len }
    }

    fn same_counter(&self, other: &Self) -> bool {
        std::ptr::eq(self.counter, other.counter)
    }

    fn with_len(&self, len: usize) -> Self {
        Reservation::new(self.counter, len)
    }
}

impl OwnedReservation {
    pub(crate) fn new(counter: Arc<SlotCounter>, len: usize) -> Self {
        OwnedReservation { counter, len }
    }

    fn same_counter(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.counter, &other.counter)
    }

    fn with_len(&self, len: usize) -> Self {
        OwnedReservation::new(Arc::clone(&self.counter), len)
    }
}

/// The methods both guards share; `$setup` is the doc examples' first line.
macro_rules! guard_methods {
    ($name:ident, $guard:ty, $setup:literal, $reserve:literal) => {
        impl $guard {
            /// The number of slots this guard holds.
            ///
            /// # Examples
            ///
            /// ```
            #[doc = $setup]
            #[doc = concat!("let r = counter.", $reserve, "(3).unwrap();")]
            /// assert_eq!(r.len(), 3);
            /// ```
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether this guard holds no slot.
            ///
            /// # Examples
            ///
            /// ```
            #[doc = $setup]
            #[doc = concat!("let r = counter.", $reserve, "(0).unwrap();")]
            /// assert!(r.is_empty());
            /// ```
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// The counter the slots came from.
            ///
            /// # Examples
            ///
            /// ```
            #[doc = $setup]
            #[doc = concat!("let r = counter.", $reserve, "(3).unwrap();")]
            /// assert_eq!(r.counter().used(), 3);
            /// ```
            pub fn counter(&self) -> &SlotCounter {
                &self.counter
            }

            /// Splits `n` slots off into a new guard from the same counter;
            /// `self` keeps the rest. Returns `None`, and changes nothing, if
            /// `n > self.len()`. No atomic operation is involved.
            ///
            /// # Examples
            ///
            /// ```
            #[doc = $setup]
            #[doc = concat!("let mut r = counter.", $reserve, "(5).unwrap();")]
            /// let draft = r.split(2).unwrap();
            /// assert_eq!((r.len(), draft.len()), (3, 2));
            /// assert!(r.split(4).is_none());
            /// assert_eq!(counter.used(), 5);
            /// ```
            pub fn split(&mut self, n: usize) -> Option<Self> {
                // Enough to split off?
                if n > self.len {
                    return None;
                }
                self.len -= n;
                Some(self.with_len(n))
            }

            /// Moves all of `other`'s slots into `self`. No atomic operation
            /// is involved.
            ///
            /// # Panics
            ///
            /// Panics if the two guards come from different counters.
            ///
            /// # Examples
            ///
            /// ```
            #[doc = $setup]
            #[doc = concat!("let mut a = counter.", $reserve, "(2).unwrap();")]
            #[doc = concat!("let b = counter.", $reserve, "(3).unwrap();")]
            /// a.merge(b);
            /// assert_eq!(a.len(), 5);
            /// assert_eq!(counter.used(), 5);
            /// ```
            pub fn merge(&mut self, mut other: Self) {
                assert!(
                    self.same_counter(&other),
                    "cannot merge reservations from different counters"
                );
                // Both counts are held from one counter, so their sum is at
                // most its capacity and cannot overflow.
                self.len += std::mem::take(&mut other.len);
            }

            /// Shrinks the guard to `len` slots and gives the excess back at
            /// once (a speculative rollback). Never grows: a `len` at or
            /// above [`len`](Self::len) is a no-op.
            ///
            /// # Examples
            ///
            /// ```
            #[doc = $setup]
            /// // 1 verified token + 4 draft tokens; 2 drafts are accepted.
            #[doc = concat!("let mut r = counter.", $reserve, "(5).unwrap();")]
            /// r.shrink_to(3);
            /// assert_eq!(counter.used(), 3);
            /// r.shrink_to(10);
            /// assert_eq!(r.len(), 3);
            /// ```
            pub fn shrink_to(&mut self, len: usize) {
                // Anything to give back?
                if len >= self.len {
                    return;
                }
                let excess = self.len - len;
                self.len = len;
                self.counter.release_held(excess);
            }

            /// Takes `n` more slots into this guard, all or nothing (a
            /// running sequence growing). May use the headroom that
            /// [`SlotCounter::try_reserve_with_headroom`] keeps free, and
            /// the slots owed to queued waiters: the growth of a guard that
            /// holds slots does not wait behind new admissions. A guard
            /// that holds none is new work: its growth is a new admission,
            /// as [`SlotCounter::try_reserve`] makes.
            ///
            /// # Errors
            ///
            /// As [`SlotCounter::try_reserve`] (`BehindWaiters` only for a
            /// guard that holds no slot); on error the guard and the
            /// counter are unchanged.
            ///
            /// # Examples
            ///
            /// ```
            #[doc = $setup]
            #[doc = concat!("let mut r = counter.", $reserve, "(6).unwrap();")]
            /// r.try_grow(2).unwrap();
            /// assert_eq!(r.len(), 8);
            /// assert!(r.try_grow(1).is_err());
            /// assert_eq!(r.len(), 8);
            /// ```
            pub fn try_grow(&mut self, n: usize) -> Result<(), ReserveError> {
                if self.len == 0 {
                    self.counter.try_reserve_raw(n, 0)?;
                } else {
                    self.counter.try_grow_raw(n)?;
                }
                self.len += n;
                Ok(())
            }

            /// Consumes the guard without giving its slots back and returns
            /// their count, for a later [`SlotCounter::release`].
            ///
            /// # Examples
            ///
            /// ```
            #[doc = $setup]
            #[doc = concat!("let n = counter.", $reserve, "(3).unwrap().forget();")]
            /// assert_eq!(counter.used(), 3);
            /// counter.release(n).unwrap();
            /// ```
            pub fn forget(mut self) -> usize {
                std::mem::take(&mut self.len)
            }
        }

        impl Drop for $guard {
            fn drop(&mut self) {
                if self.len > 0 {
                    self.counter.release_held(self.len);
                }
            }
        }

        impl fmt::Debug for $guard {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name))
                    .field("len", &self.len)
                    .field("counter", &*self.counter)
                    .finish()
            }
        }
    };
}

guard_methods!(
    Reservation,
    Reservation<'_>,
    "let counter = kvslots::SlotCounter::new(8);",
    "try_reserve"
);

guard_methods!(
    OwnedReservation,
    OwnedReservation,
    "let counter = std::sync::Arc::new(kvslots::SlotCounter::new(8));",
    "try_reserve_owned"
);
