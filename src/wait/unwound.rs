//! A waker's panic held while the operation it came out of finishes.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use super::queue::drop_payload;

/// The first panic caught out of the steps of an operation (a waker's,
/// resumed by a give-back or by an admission whose gather gave blocks
/// back: see "Wakers run after the lock" in [`crate::implementation`]),
/// resumed when this is dropped, once the operation has done every step:
/// so that the panic leaves its state whole (a sequence whose table lists
/// exactly the blocks it holds, and whose length counts them).
///
/// Declare it before anything the operation's result borrows, so that it
/// drops last. During unwinding (a drop that runs because something else
/// panicked) the payload is dropped instead: a second panic would abort
/// the process.
#[must_use = "the panic caught is resumed when this drops"]
pub(crate) struct Unwound(Option<Box<dyn Any + Send>>);

impl Unwound {
    /// Nothing caught yet.
    pub(crate) const fn new() -> Unwound {
        Unwound(None)
    }

    /// Runs `f`, catching its panic (the first is kept, later ones
    /// dropped).
    #[inline]
    pub(crate) fn catch(&mut self, f: impl FnOnce()) {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(f)) {
            if self.0.is_none() {
                self.0 = Some(payload);
            } else {
                drop_payload(payload);
            }
        }
    }

    /// Whether a panic was caught.
    pub(crate) fn caught(&self) -> bool {
        self.0.is_some()
    }
}

impl Drop for Unwound {
    fn drop(&mut self) {
        if let Some(payload) = self.0.take() {
            if std::thread::panicking() {
                drop_payload(payload);
            } else {
                resume_unwind(payload);
            }
        }
    }
}
