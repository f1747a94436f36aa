//! The waiting ways to take slots: [`SlotCounter::reserve`] and
//! [`SlotCounter::reserve_owned`] (futures: [`Reserve`], [`ReserveOwned`])
//! and [`SlotCounter::reserve_blocking`], over the counter's wait queue
//! (`crate::wait`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::counter::guard::{OwnedReservation, Reservation};
use crate::counter::SlotCounter;
use crate::error::ReserveError;
use crate::wait::{wait_blocking, Waiter};

impl SlotCounter {
    /// Reserves `n` slots, all or nothing, waiting in arrival order until
    /// they are free; resolves to the guard.
    ///
    /// The first poll tries [`try_reserve`](Self::try_reserve)'s lock-free
    /// path when nobody is queued; if that is refused, or someone is
    /// queued, the future joins the back of the queue (it counts in
    /// [`waiters`](Self::waiters) from that poll on) and is woken when its
    /// slots have been taken for it, after every waiter queued before it. A queued waiter holds nothing that
    /// [`used`](Self::used) shows until it is granted whole.
    ///
    /// Cancellation-safe: dropping the future before it resolves leaves
    /// nothing taken, hands on slots that were granted to it but not yet
    /// collected, and lets the waiters behind it be served.
    ///
    /// # Errors
    ///
    /// * [`ReserveError::NeverFits`] at once if `n > capacity()`.
    /// * [`ReserveError::Closed`] at once after [`close`](Self::close), and
    ///   for a waiter queued when `close` is called.
    ///
    /// The future never resolves to `Full` or `BehindWaiters`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{ReserveError, SlotCounter};
    ///
    /// let counter = SlotCounter::new(4);
    /// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// runtime.block_on(async {
    ///     let held = counter.reserve(3).await.unwrap();
    ///     assert_eq!(held.len(), 3);
    ///     assert!(matches!(
    ///         counter.reserve(5).await, // at once
    ///         Err(ReserveError::NeverFits { requested: 5, capacity: 4 })
    ///     ));
    /// });
    /// ```
    pub fn reserve(&self, n: usize) -> Reserve<'_> {
        Reserve {
            counter: self,
            wait: Waiter::new(n, 0),
        }
    }

    /// Like [`reserve`](Self::reserve), resolving to an
    /// [`OwnedReservation`]; the future itself holds an [`Arc`] of the
    /// counter, so both are `'static` and can cross `tokio::spawn`.
    ///
    /// # Errors
    ///
    /// As [`reserve`](Self::reserve).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::SlotCounter;
    ///
    /// let counter = Arc::new(SlotCounter::new(4));
    /// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let held = runtime.block_on(counter.reserve_owned(4)).unwrap();
    /// let waiting = runtime.spawn(counter.reserve_owned(2));
    /// drop(held); // wakes the waiter
    /// let second = runtime.block_on(waiting).unwrap().unwrap();
    /// assert_eq!(second.len(), 2);
    /// ```
    pub fn reserve_owned(self: &Arc<Self>, n: usize) -> ReserveOwned {
        ReserveOwned {
            counter: Arc::clone(self),
            wait: Waiter::new(n, 0),
        }
    }

    /// Reserves `n` slots, all or nothing, sleeping in arrival order until
    /// they are free, for at most `timeout` (`None`: no limit).
    ///
    /// The thread counts in [`waiters`](Self::waiters) from the moment it
    /// is about to sleep; it sleeps on the queue's condition variable.
    ///
    /// # Errors
    ///
    /// * [`ReserveError::NeverFits`] at once if `n > capacity()`.
    /// * [`ReserveError::Closed`] at once after [`close`](Self::close), and
    ///   when `close` is called while the thread waits.
    /// * When `timeout` runs out the caller leaves the queue and makes one
    ///   last [`try_reserve`](Self::try_reserve): its refusal,
    ///   [`ReserveError::Full`] (with the slots free at that moment) or
    ///   [`ReserveError::BehindWaiters`] (free, but owed to waiters still
    ///   queued), is returned, and the caller holds nothing.
    ///
    /// # Panics
    ///
    /// If the waker of an async waiter that this call wakes panics: its
    /// queueing, and its leaving the queue when `timeout` runs out, can
    /// grant the waiters behind it, whose wakers then run on this thread.
    /// The panic comes once every other waker has run, with nothing held
    /// by this call (see [Waiting](crate::implementation#waiting)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use kvslots::{ReserveError, SlotCounter};
    ///
    /// let counter = SlotCounter::new(4);
    /// let held = counter.reserve_blocking(3, None).unwrap();
    /// assert_eq!(
    ///     counter.reserve_blocking(2, Some(Duration::from_millis(1))).unwrap_err(),
    ///     ReserveError::Full { requested: 2, available: 1 }
    /// );
    /// assert_eq!(counter.waiters(), 0);
    /// # drop(held);
    /// ```
    pub fn reserve_blocking(
        &self,
        n: usize,
        timeout: Option<Duration>,
    ) -> Result<Reservation<'_>, ReserveError> {
        wait_blocking(self, n, 0, timeout)?;
        Ok(Reservation::new(self, n))
    }

    /// Like [`reserve_blocking`](Self::reserve_blocking), returning an
    /// [`OwnedReservation`], which holds an [`Arc`] of the counter and so
    /// can be moved to another thread or kept past the borrow.
    ///
    /// # Errors
    ///
    /// As [`reserve_blocking`](Self::reserve_blocking).
    ///
    /// # Panics
    ///
    /// As [`reserve_blocking`](Self::reserve_blocking).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::thread;
    /// use kvslots::SlotCounter;
    ///
    /// let counter = Arc::new(SlotCounter::new(4));
    /// let held = counter.reserve_owned_blocking(4, None).unwrap();
    /// let waiter = thread::spawn({
    ///     let counter = Arc::clone(&counter);
    ///     move || counter.reserve_owned_blocking(2, None)
    /// });
    /// while counter.waiters() == 0 {
    ///     thread::yield_now();
    /// }
    /// drop(held); // wakes the waiter
    /// let second = waiter.join().unwrap().unwrap();
    /// assert_eq!((second.len(), counter.used()), (2, 2));
    /// ```
    pub fn reserve_owned_blocking(
        self: &Arc<Self>,
        n: usize,
        timeout: Option<Duration>,
    ) -> Result<OwnedReservation, ReserveError> {
        wait_blocking(&**self, n, 0, timeout)?;
        Ok(OwnedReservation::new(Arc::clone(self), n))
    }

    /// How many waiters are queued: futures from the first poll that
    /// returned `Pending` until they are dropped or resolve, and blocking
    /// calls while they sleep. A snapshot.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::task::{Context, Poll, Waker};
    /// use kvslots::SlotCounter;
    ///
    /// # struct Noop;
    /// # impl std::task::Wake for Noop { fn wake(self: std::sync::Arc<Self>) {} }
    /// # let waker = Waker::from(std::sync::Arc::new(Noop));
    /// let counter = SlotCounter::new(2);
    /// let held = counter.try_reserve(2).unwrap();
    /// let mut waiting = pin!(counter.reserve(1));
    /// let mut cx = Context::from_waker(&waker);
    /// assert!(waiting.as_mut().poll(&mut cx).is_pending());
    /// assert_eq!(counter.waiters(), 1);
    /// drop(held); // grants the waiter its slot
    /// assert_eq!(counter.used(), 1);
    /// let Poll::Ready(Ok(granted)) = waiting.as_mut().poll(&mut cx) else { panic!() };
    /// assert_eq!((granted.len(), counter.waiters()), (1, 0));
    /// ```
    pub fn waiters(&self) -> usize {
        self.queued()
    }
}

/// The future of [`SlotCounter::reserve`]: resolves to a [`Reservation`]
/// once its slots are granted, or to an error. Dropping it cancels the
/// wait (see [`SlotCounter::reserve`]).
#[must_use = "futures do nothing unless polled; dropping it leaves the queue"]
pub struct Reserve<'a> {
    counter: &'a SlotCounter,
    wait: Waiter,
}

/// The future of [`SlotCounter::reserve_owned`]: resolves to an
/// [`OwnedReservation`]; `'static`. Dropping it cancels the wait.
#[must_use = "futures do nothing unless polled; dropping it leaves the queue"]
pub struct ReserveOwned {
    counter: Arc<SlotCounter>,
    wait: Waiter,
}

impl<'a> Future for Reserve<'a> {
    type Output = Result<Reservation<'a>, ReserveError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let counter = this.counter;
        this.wait
            .poll(counter, cx)
            .map(|granted| granted.map(|()| Reservation::new(counter, this.wait.n())))
    }
}

impl Future for ReserveOwned {
    type Output = Result<OwnedReservation, ReserveError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let counter = &this.counter;
        let n = this.wait.n();
        this.wait
            .poll(&**counter, cx)
            .map(|granted| granted.map(|()| OwnedReservation::new(Arc::clone(counter), n)))
    }
}

impl Drop for Reserve<'_> {
    fn drop(&mut self) {
        self.wait.cancel(self.counter);
    }
}

impl Drop for ReserveOwned {
    fn drop(&mut self) {
        self.wait.cancel(&*self.counter);
    }
}

impl fmt::Debug for Reserve<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reserve")
            .field("n", &self.wait.n())
            .field("counter", self.counter)
            .finish()
    }
}

impl fmt::Debug for ReserveOwned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReserveOwned")
            .field("n", &self.wait.n())
            .field("counter", &*self.counter)
            .finish()
    }
}

#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
mod tests {
    use super::*;
    use std::task::{Wake, Waker};

    struct Noop;

    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }

    /// `owed` is 0 once nobody is pending: after `close`, the drop of a
    /// closed waiter that never collected its `Closed` recounted the
    /// entries left, and published what they were owed for good (every
    /// later release then took the queue's lock). From a helper's attack.
    #[test]
    fn nothing_is_owed_after_close_whatever_entries_are_left() {
        let counter = SlotCounter::new(2);
        let held = counter.try_reserve(2).unwrap();
        let waker = Waker::from(Arc::new(Noop));
        let mut cx = Context::from_waker(&waker);
        let mut a = Box::pin(counter.reserve(1));
        let mut b = Box::pin(counter.reserve(1));
        assert!(a.as_mut().poll(&mut cx).is_pending());
        assert!(b.as_mut().poll(&mut cx).is_pending());
        assert_eq!(counter.queue.owed(), 2);
        counter.close();
        assert_eq!(counter.queue.owed(), 0);
        drop(a);
        assert_eq!(counter.queue.owed(), 0);
        assert!(matches!(
            b.as_mut().poll(&mut cx),
            Poll::Ready(Err(ReserveError::Closed))
        ));
        drop(b);
        assert_eq!((counter.waiters(), counter.queue.owed()), (0, 0));
        drop(held);
        assert_eq!(counter.used(), 0);
    }
}
