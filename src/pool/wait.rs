//! The waiting ways to allocate blocks: [`BlockPool::alloc`] (the future
//! [`Alloc`]) and [`BlockPool::alloc_blocking`], over the wait queue of the
//! pool's admission counter (`crate::wait`); a grant admits the blocks, and
//! the waiter then takes their ids from the free list as `try_alloc` does.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::{BlockPool, Holder};
use crate::error::ReserveError;
use crate::id::BlockId;
use crate::wait::{wait_blocking, Waiter};

impl BlockPool {
    /// Allocates exactly `n` blocks, all or nothing, waiting in arrival
    /// order until they are free, and then appends their distinct ids to
    /// `out` (each with one reference), as [`try_alloc`](Self::try_alloc)
    /// does.
    ///
    /// The first poll tries `try_alloc`'s lock-free path when nobody is
    /// queued; if that is refused, or someone is queued, the future joins
    /// the back of the pool's queue (it counts in
    /// [`waiters`](Self::waiters) from that poll on) and is granted after
    /// every waiter queued before it. A queued waiter holds
    /// no block until it is granted all `n`; `out` is written only when the
    /// future resolves to `Ok`.
    ///
    /// Cancellation-safe: dropping the future before it resolves leaves
    /// nothing taken and `out`'s contents unchanged, hands on blocks that
    /// were granted to it but not yet collected, and lets the waiters
    /// behind it be served.
    ///
    /// # Errors
    ///
    /// * [`ReserveError::NeverFits`] at once if `n > num_blocks()`.
    /// * [`ReserveError::Closed`] at once after [`close`](Self::close), and
    ///   for a waiter queued when `close` is called.
    ///
    /// On error `out`'s contents and the pool are unchanged (`out`'s
    /// capacity may have grown). The future never resolves to `Full` or
    /// `BehindWaiters`.
    ///
    /// Drop a future to leave the queue; never `mem::forget` it: a
    /// forgotten waiter stays queued, owed what it asked, so every later
    /// admission waits behind it (or is refused `BehindWaiters`) for the
    /// pool's life.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::BlockPool;
    ///
    /// let pool = Arc::new(BlockPool::new(4, 16));
    /// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// let mut held = Vec::new();
    /// pool.try_alloc(4, &mut held).unwrap();
    /// let waiting = runtime.spawn({
    ///     let pool = Arc::clone(&pool);
    ///     async move {
    ///         let mut ids = Vec::new();
    ///         pool.alloc(3, &mut ids).await.map(|()| ids)
    ///     }
    /// });
    /// pool.free(&held).unwrap(); // wakes the waiter
    /// let ids = runtime.block_on(waiting).unwrap().unwrap();
    /// assert_eq!((ids.len(), pool.used_blocks()), (3, 3));
    /// ```
    pub fn alloc<'a>(&'a self, n: usize, out: &'a mut Vec<BlockId>) -> Alloc<'a> {
        self.alloc_with_headroom(n, 0, out, Holder::Raw)
    }

    /// [`alloc`](Self::alloc) that leaves `headroom` blocks free besides, as
    /// [`try_alloc_with_headroom`](Self::try_alloc_with_headroom) does: the
    /// grant waits until `n + headroom` blocks are free and takes `n`.
    pub(crate) fn alloc_with_headroom<'a>(
        &'a self,
        n: usize,
        headroom: usize,
        out: &'a mut Vec<BlockId>,
        holder: Holder,
    ) -> Alloc<'a> {
        // Room for the ids first (it could panic or allocate), and only for
        // a request that can fit at all, as in `try_alloc_with_headroom`.
        if n <= self.num_blocks() {
            out.reserve(n);
        }
        Alloc {
            pool: self,
            out,
            wait: Waiter::new(n, headroom),
            holder,
        }
    }

    /// An [`Alloc`] that resolves to `err` at once and allocates nothing.
    pub(crate) fn alloc_refused<'a>(
        &'a self,
        err: ReserveError,
        out: &'a mut Vec<BlockId>,
    ) -> Alloc<'a> {
        Alloc {
            pool: self,
            out,
            wait: Waiter::refused(err),
            holder: Holder::Sequence,
        }
    }

    /// An [`Alloc`] that resolves to `Ok` at once and allocates nothing.
    pub(crate) fn alloc_nothing<'a>(&'a self, out: &'a mut Vec<BlockId>) -> Alloc<'a> {
        Alloc {
            pool: self,
            out,
            wait: Waiter::ready(),
            holder: Holder::Sequence,
        }
    }

    /// Allocates exactly `n` blocks, all or nothing, sleeping in arrival
    /// order until they are free, for at most `timeout` (`None`: no
    /// limit), and appends their ids to `out` as
    /// [`try_alloc`](Self::try_alloc) does.
    ///
    /// # Errors
    ///
    /// * [`ReserveError::NeverFits`] at once if `n > num_blocks()`.
    /// * [`ReserveError::Closed`] at once after [`close`](Self::close), and
    ///   when `close` is called while the thread waits.
    /// * When `timeout` runs out the caller leaves the queue and makes one
    ///   last [`try_alloc`](Self::try_alloc): its refusal,
    ///   [`ReserveError::Full`] (with the blocks free at that moment) or
    ///   [`ReserveError::BehindWaiters`] (free, but owed to waiters still
    ///   queued), is returned.
    ///
    /// On error `out`'s contents and the pool are unchanged.
    ///
    /// # Deadlocks
    ///
    /// The wait cannot see what its own thread holds: with no `timeout`, a
    /// thread that waits for blocks that only it can give back (blocks it
    /// holds, a sequence's copy-on-write source it keeps, references
    /// retired under a fence it has yet to complete) sleeps for ever. Give
    /// those back first, or pass a timeout.
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
    /// use std::sync::Arc;
    /// use std::thread;
    /// use kvslots::BlockPool;
    ///
    /// let pool = Arc::new(BlockPool::new(4, 16));
    /// let mut held = Vec::new();
    /// pool.alloc_blocking(4, &mut held, None).unwrap();
    /// let waiter = thread::spawn({
    ///     let pool = Arc::clone(&pool);
    ///     move || {
    ///         let mut ids = Vec::new();
    ///         pool.alloc_blocking(2, &mut ids, None).map(|()| ids)
    ///     }
    /// });
    /// pool.free(&held).unwrap(); // whenever the waiter sleeps, this wakes it
    /// assert_eq!(waiter.join().unwrap().unwrap().len(), 2);
    /// ```
    pub fn alloc_blocking(
        &self,
        n: usize,
        out: &mut Vec<BlockId>,
        timeout: Option<Duration>,
    ) -> Result<(), ReserveError> {
        self.alloc_with_headroom_blocking(n, 0, out, timeout, Holder::Raw)
    }

    /// [`alloc_blocking`](Self::alloc_blocking) that leaves `headroom`
    /// blocks free besides.
    pub(crate) fn alloc_with_headroom_blocking(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<BlockId>,
        timeout: Option<Duration>,
        holder: Holder,
    ) -> Result<(), ReserveError> {
        if n <= self.num_blocks() {
            out.reserve(n);
        }
        wait_blocking(&self.counter, n, headroom, timeout)?;
        self.take_admitted(n, out, holder);
        Ok(())
    }

    /// How many waiters are queued for blocks: futures from the first poll
    /// that returned `Pending` until they are dropped or resolve, and
    /// blocking calls while they sleep. A snapshot.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = kvslots::BlockPool::new(4, 16);
    /// assert_eq!(pool.waiters(), 0);
    /// ```
    pub fn waiters(&self) -> usize {
        self.counter.queued()
    }
}

/// The future of [`BlockPool::alloc`] (and of
/// [`Sequence::reserve`](crate::Sequence::reserve)): resolves to `Ok` once
/// the blocks are granted and their ids appended, or to an error. Dropping
/// it cancels the wait (see [`BlockPool::alloc`]).
#[must_use = "futures do nothing unless polled; dropping it leaves the queue"]
pub struct Alloc<'a> {
    pool: &'a BlockPool,
    out: &'a mut Vec<BlockId>,
    wait: Waiter,
    /// Who the blocks are for: a raw caller, or a sequence.
    holder: Holder,
}

impl Future for Alloc<'_> {
    type Output = Result<(), ReserveError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let granted = std::task::ready!(this.wait.poll(&this.pool.counter, cx));
        Poll::Ready(granted.map(|()| {
            this.pool
                .take_admitted(this.wait.n(), this.out, this.holder)
        }))
    }
}

impl Drop for Alloc<'_> {
    fn drop(&mut self) {
        self.wait.cancel(&self.pool.counter);
    }
}

impl fmt::Debug for Alloc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Alloc")
            .field("n", &self.wait.n())
            .field("pool", self.pool)
            .finish()
    }
}
