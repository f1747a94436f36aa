//! [`SlotCounter`]: the lock-free, all-or-nothing used-counter.
//!
//! A counter of `capacity` slots, of which `used` are taken, in one state
//! word `used << 1 | CLOSED`. Admission follows the rule of
//! [`admit`](crate::admit) in one compare-and-swap loop
//! ([`SlotCounter::try_reserve_raw`]); the guards live in the child module
//! `guard`, and the waiting calls in `wait`, over the counter's
//! [`WaitQueue`]. The design and the orderings are described in
//! [`crate::implementation`] ("The admission counter", "Orderings").

use std::fmt;

use crate::error::{ReleaseError, ReserveError};
use crate::sync::{AtomicUsize, Backoff, CachePadded, Faults, Ordering};
use crate::wait::{Units, WaitQueue};

pub(crate) mod guard;
pub(crate) mod wait;

/// The flag bit in the state word: set once the counter is closed.
const CLOSED: usize = 1;
/// The count is stored above the flag bit.
const SHIFT: u32 = 1;

/// A lock-free counter of KV-cache token slots with all-or-nothing
/// admission.
///
/// Many threads share one counter (by reference or in an [`Arc`](std::sync::Arc)) and admit
/// multi-token appends concurrently: each request is admitted whole or not
/// at all, and `used() <= capacity()` holds at every instant. The `try_*`
/// calls never take a lock, and give-backs (a guard's drop,
/// [`release`](Self::release)) take none while nobody waits; the waiting
/// calls, and a give-back that finds waiters queued (it grants them what
/// it freed), take the wait queue's mutex.
///
/// Slots can be taken in two ways:
///
/// * as RAII guards: [`try_reserve`](Self::try_reserve),
///   [`try_reserve_owned`](Self::try_reserve_owned) and
///   [`try_reserve_with_headroom`](Self::try_reserve_with_headroom) return a
///   [`Reservation`](crate::Reservation) /
///   [`OwnedReservation`](crate::OwnedReservation) that gives its slots back when
///   dropped (also during a panic), and can be split, merged, shrunk and
///   grown;
/// * as plain counts: [`admit`](Self::admit) returns how many slots it took
///   and [`release`](Self::release) gives them back;
/// * waiting, in arrival order, until the slots are free:
///   [`reserve`](Self::reserve) and [`reserve_owned`](Self::reserve_owned)
///   (futures) and [`reserve_blocking`](Self::reserve_blocking) and
///   [`reserve_owned_blocking`](Self::reserve_owned_blocking) (see
///   [Waiting](#waiting)).
///
/// # Examples
///
/// ```
/// use kvslots::SlotCounter;
///
/// let counter = SlotCounter::new(8);
///
/// // A 5-token prefill chunk: all of it or nothing.
/// let prefill = counter.try_reserve(5).unwrap();
/// // 4 speculative draft tokens do not fit in the 3 left: nothing is taken.
/// assert!(counter.try_reserve(4).is_err());
/// assert_eq!(counter.used(), 5);
///
/// drop(prefill);
/// assert_eq!(counter.used(), 0);
/// assert_eq!(counter.peak_used(), 5);
/// ```
///
/// # Memory ordering
///
/// Giving slots back (a guard's drop or [`shrink_to`](crate::Reservation::shrink_to),
/// [`release`](Self::release)) synchronises with the admission that takes
/// them next: whatever the previous holder wrote into those slots
/// happens-before the new holder's successful `try_reserve*`, `try_grow` or
/// [`admit`](Self::admit) returns. A refusal orders nothing. What a thread
/// did before [`close`](Self::close) happens-before another thread's
/// [`is_closed`](Self::is_closed) that returns `true`.
///
/// # Waiting
///
/// A request that does not fit can wait instead of retrying:
/// [`reserve`](Self::reserve) / [`reserve_owned`](Self::reserve_owned)
/// return a future, [`reserve_blocking`](Self::reserve_blocking) /
/// [`reserve_owned_blocking`](Self::reserve_owned_blocking) put the
/// thread to sleep. Waiters are served strictly in arrival order, each
/// granted whole or not at all; a new waiter queues behind those already
/// queued, and while anyone waits the `try_*` calls leave free what the
/// waiters are owed (they refuse with
/// [`BehindWaiters`](ReserveError::BehindWaiters) rather than take it), so
/// a large request is not starved by a stream of small ones; a guard's
/// `try_grow` (growth of what its holder already runs) does not wait
/// behind them.
/// [`waiters`](Self::waiters) counts
/// the queue. [`close`](Self::close) wakes every waiter with
/// [`Closed`](ReserveError::Closed). The `try_*` calls stay lock-free (one
/// more load); the waiting calls take the queue's mutex. The full rules,
/// with the table of who gets what, are in the
/// [crate's design notes](crate::implementation#waiting).
pub struct SlotCounter {
    /// `used << 1 | CLOSED`: the only word admission touches.
    state: CachePadded<AtomicUsize>,
    /// The high-water mark of `used`, in its own line so that reading it on
    /// the hot path does not contend with `state`.
    peak: CachePadded<AtomicUsize>,
    /// Immutable after construction.
    capacity: usize,
    /// The waiters, in arrival order. Its published words (what the waiters
    /// are owed, the waiter count) sit in their own padded line, written
    /// only by the waiting paths.
    queue: WaitQueue,
}

impl SlotCounter {
    /// The largest capacity a counter can have: the count shares its word
    /// with the closed flag, so it has one bit less than `usize`.
    pub const MAX_CAPACITY: usize = usize::MAX >> SHIFT;

    /// Creates a counter of `capacity` free slots.
    ///
    /// A capacity of zero is valid: such a counter refuses every non-empty
    /// request with [`ReserveError::NeverFits`].
    ///
    /// # Panics
    ///
    /// Panics if `capacity` is larger than [`SlotCounter::MAX_CAPACITY`].
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::SlotCounter;
    ///
    /// let counter = SlotCounter::new(4096);
    /// assert_eq!(counter.capacity(), 4096);
    /// assert_eq!(counter.available(), 4096);
    /// ```
    pub fn new(capacity: usize) -> SlotCounter {
        SlotCounter::build(capacity, Faults::default())
    }

    /// [`new`](Self::new) with the faults of one of loom's negative
    /// controls: the loom models' build only.
    #[cfg(all(test, kvslots_loom))]
    pub(crate) fn with_faults(capacity: usize, faults: Faults) -> SlotCounter {
        SlotCounter::build(capacity, faults)
    }

    /// A counter of `capacity` slots whose wait queue carries `faults`
    /// (none outside the loom models' build).
    fn build(capacity: usize, faults: Faults) -> SlotCounter {
        assert!(
            capacity <= Self::MAX_CAPACITY,
            "SlotCounter capacity {capacity} exceeds MAX_CAPACITY"
        );
        SlotCounter {
            state: CachePadded::new(AtomicUsize::new(0)),
            peak: CachePadded::new(AtomicUsize::new(0)),
            capacity,
            queue: WaitQueue::new(capacity, faults),
        }
    }

    /// The total number of slots.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(kvslots::SlotCounter::new(16).capacity(), 16);
    /// ```
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// A snapshot of the number of slots in use. Other threads may change it
    /// at any moment; it never exceeds [`capacity`](Self::capacity), also
    /// after a misused [`release`](Self::release) has wrapped the count
    /// (then it reads `capacity()`, as the counter admits nothing more).
    ///
    /// # Examples
    ///
    /// ```
    /// let counter = kvslots::SlotCounter::new(16);
    /// let _held = counter.try_reserve(3).unwrap();
    /// assert_eq!(counter.used(), 3);
    /// ```
    pub fn used(&self) -> usize {
        // Relaxed: a snapshot for reporting; it hands out nothing. Capped:
        // `used <= capacity` unless a misused `release` wrapped the count in
        // a release build, after which every admission is refused.
        (self.state.load(Ordering::Relaxed) >> SHIFT).min(self.capacity)
    }

    /// A snapshot of the number of free slots, `capacity() - used()`.
    ///
    /// # Examples
    ///
    /// ```
    /// let counter = kvslots::SlotCounter::new(16);
    /// let _held = counter.try_reserve(3).unwrap();
    /// assert_eq!(counter.available(), 13);
    /// ```
    pub fn available(&self) -> usize {
        // `used()` is capped at the capacity, so this never wraps.
        self.capacity - self.used()
    }

    /// The high-water mark of [`used`](Self::used) since the counter was
    /// created.
    ///
    /// It lags admissions that are still running: a call raises the peak
    /// just after its admission is published, so while it runs another
    /// thread can read a `used()` above `peak_used()`. Every admission that
    /// has returned is counted, so once no call is running the peak is
    /// exact, and it is never above the largest `used()` there has been.
    ///
    /// # Examples
    ///
    /// ```
    /// let counter = kvslots::SlotCounter::new(16);
    /// drop(counter.try_reserve(9).unwrap());
    /// assert_eq!(counter.used(), 0);
    /// assert_eq!(counter.peak_used(), 9);
    /// ```
    pub fn peak_used(&self) -> usize {
        // Relaxed: a statistic; it orders nothing.
        self.peak.load(Ordering::Relaxed)
    }

    /// Applies the admission rule atomically: takes `requested` slots if
    /// `0 < requested <= available()` at the moment of the call, and returns
    /// how many it took (`requested` or 0, never a part).
    ///
    /// A zero or negative request admits nothing; a closed counter admits
    /// nothing. Give the slots back with [`release`](Self::release).
    ///
    /// This is [`kvslots::admit`](crate::admit) applied to the counter's
    /// state in one compare-and-swap loop, with one addition: while callers
    /// wait in [`reserve`](Self::reserve) (or its kin), it leaves free what
    /// they are owed, as every new admission does, so it returns 0 where
    /// [`try_reserve`](Self::try_reserve) refuses with
    /// [`ReserveError::BehindWaiters`] (see
    /// [Waiting](crate::implementation#waiting)). With nobody waiting, it
    /// is exactly `kvslots::admit`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::SlotCounter;
    ///
    /// let counter = SlotCounter::new(4);
    /// assert_eq!(counter.admit(3), 3);
    /// assert_eq!(counter.admit(2), 0); // one free short: nothing, not 1
    /// assert_eq!(counter.admit(-1), 0);
    /// counter.release(3).unwrap();
    /// ```
    pub fn admit(&self, requested: isize) -> usize {
        // Empty or negative? Nothing to admit, nothing to touch.
        if requested <= 0 {
            return 0;
        }
        let n = requested as usize;
        match self.try_reserve_raw(n, 0) {
            Ok(()) => n,
            Err(_) => 0,
        }
    }

    /// Gives back `n` slots taken with [`admit`](Self::admit) or kept with a
    /// guard's `forget`.
    ///
    /// Releasing zero is a no-op. Releasing more than is in use is refused
    /// with [`ReleaseError::ExceedsUsed`] and changes nothing. Releases work
    /// on a closed counter.
    ///
    /// The counter cannot tell whose slots are released: releasing slots
    /// that a live guard still holds is a logic error (that guard's drop
    /// would then give back slots that are no longer in use, and until it
    /// drops, the counter admits slots that the guard's holder still
    /// uses). Debug builds catch it with an assertion when the guard drops,
    /// if the used count then goes below 0; release builds let it wrap,
    /// after which the counter refuses every admission (`Full`) rather
    /// than admit without bound, and [`used`](Self::used) reads
    /// `capacity()`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::SlotCounter;
    ///
    /// let counter = SlotCounter::new(4);
    /// let n = counter.try_reserve(2).unwrap().forget();
    /// assert_eq!(counter.used(), 2);
    /// counter.release(n).unwrap();
    /// assert_eq!(counter.used(), 0);
    /// assert!(counter.release(1).is_err());
    /// ```
    pub fn release(&self, n: usize) -> Result<(), ReleaseError> {
        if n == 0 {
            return Ok(());
        }
        let backoff = Backoff::new();
        // Relaxed: only a first guess; the CAS below validates it.
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            // Is that much in use?
            let used = cur >> SHIFT;
            if n > used {
                return Err(ReleaseError::ExceedsUsed { released: n, used });
            }
            let next = cur - (n << SHIFT);
            // Release on success: the caller's writes into these slots
            // happen-before whoever admits them next (its Acquire CAS);
            // Acquire too, for the wait queue's hand-shake (see
            // `WaitQueue::first_look`). Relaxed on failure: we only retry with
            // the fresh value.
            match self
                .state
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.queue.notify(self);
                    return Ok(());
                }
                Err(actual) => {
                    cur = actual;
                    backoff.spin();
                }
            }
        }
    }

    /// Closes the counter: from now on every admission fails
    /// ([`ReserveError::Closed`], and [`admit`](Self::admit) returns 0),
    /// while releases and guard drops keep working, so workers can drain.
    /// Every queued waiter is woken and ends with `Closed` (a waiter granted
    /// before the close keeps its grant). Closing twice is harmless.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::{ReserveError, SlotCounter};
    ///
    /// let counter = SlotCounter::new(8);
    /// let held = counter.try_reserve(2).unwrap();
    /// counter.close();
    /// assert!(counter.is_closed());
    /// assert_eq!(counter.try_reserve(1).unwrap_err(), ReserveError::Closed);
    /// drop(held);
    /// assert_eq!(counter.used(), 0);
    /// ```
    pub fn close(&self) {
        // Release: the flag's place among admissions is fixed by the word's
        // modification order whatever the ordering; Release only publishes
        // what the closer did before closing to a thread that then sees the
        // flag through `is_closed` (Acquire). No Acquire half: `close` reads
        // nothing that a later step of the closer relies on.
        self.state.fetch_or(CLOSED, Ordering::Release);
        // Then the waiters: from here on no grant can succeed (the grant
        // loop's admission sees the flag), so those woken end with Closed.
        self.queue.close();
    }

    /// Whether [`close`](Self::close) has been called.
    ///
    /// # Examples
    ///
    /// ```
    /// let counter = kvslots::SlotCounter::new(8);
    /// assert!(!counter.is_closed());
    /// counter.close();
    /// assert!(counter.is_closed());
    /// ```
    pub fn is_closed(&self) -> bool {
        // Acquire: pairs with the Release in `close`.
        self.state.load(Ordering::Acquire) & CLOSED != 0
    }

    /// The admission CAS loop behind every `try_reserve*`, without a guard:
    /// takes `n` slots if `n + headroom` are free beyond what the queued
    /// waiters are owed, all or nothing.
    pub(crate) fn try_reserve_raw(&self, n: usize, headroom: usize) -> Result<(), ReserveError> {
        self.try_reserve_inner(n, headroom, true)
    }

    /// Takes `n` slots if `n` are free, ignoring what the queued waiters
    /// are owed: a guard's growth
    /// ([`Reservation::try_grow`](crate::Reservation::try_grow)), which does
    /// not wait behind new admissions.
    pub(crate) fn try_grow_raw(&self, n: usize) -> Result<(), ReserveError> {
        self.try_reserve_inner(n, 0, false)
    }

    /// The loop behind both: `honor_waiters` says whether the slots the
    /// queued waiters are owed must stay free (not for growth, nor when the
    /// grant loop takes them for the head).
    fn try_reserve_inner(
        &self,
        n: usize,
        headroom: usize,
        honor_waiters: bool,
    ) -> Result<(), ReserveError> {
        // Could it ever fit? (Saturating: `usize::MAX` requests and headroom
        // must not wrap into something small.)
        let needed = n.saturating_add(headroom);
        if needed > self.capacity {
            // Closed wins: after `close` every admission fails as Closed.
            if self.is_closed() {
                return Err(ReserveError::Closed);
            }
            return Err(ReserveError::NeverFits {
                requested: n,
                capacity: self.capacity,
            });
        }
        // While anyone waits, leave what the waiters are owed: the one load
        // the waiting machinery adds to this path (0 when nobody waits). A
        // request for nothing with no headroom asks nothing of anyone; one
        // with headroom (a check) leaves it too.
        let owed = if honor_waiters && needed > 0 {
            self.queue.owed()
        } else {
            0
        };
        let backoff = Backoff::new();
        // Relaxed: only a first guess; the CAS below validates it and is
        // what orders the admission.
        let mut cur = self.state.load(Ordering::Relaxed);
        loop {
            // Closed?
            if cur & CLOSED != 0 {
                return Err(ReserveError::Closed);
            }
            // Enough free? `used <= capacity` holds unless `release` was
            // misused on slots a guard still holds (a logic error, caught by
            // an assertion in debug builds; in release builds the guard's
            // drop then wraps `used`): saturating, so that even then the
            // counter refuses instead of admitting past capacity.
            let available = self.capacity.saturating_sub(cur >> SHIFT);
            if needed > available {
                return Err(ReserveError::Full {
                    requested: n,
                    available,
                });
            }
            // Enough beside what the waiters are owed?
            if needed.saturating_add(owed) > available {
                return Err(ReserveError::BehindWaiters {
                    requested: n,
                    available,
                    owed,
                });
            }
            // Nothing to take? The read above is the linearization point.
            if n == 0 {
                return Ok(());
            }
            let next = cur + (n << SHIFT);
            // Acquire on success: pairs with the Release of whoever gave
            // these slots back, so their writes happen-before our use.
            // Relaxed on failure: we only retry (or refuse) with the fresh
            // value, and a refusal hands out nothing.
            match self
                .state
                .compare_exchange_weak(cur, next, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.record_peak(next >> SHIFT);
                    return Ok(());
                }
                Err(actual) => {
                    cur = actual;
                    backoff.spin();
                }
            }
        }
    }

    /// Gives back `n` slots that a guard proves are held: one `fetch_sub`.
    pub(crate) fn release_held(&self, n: usize) {
        // Release: the holder's writes into these slots happen-before the
        // next admission that takes them (its Acquire CAS).
        self.give_back_quietly(n);
        self.queue.notify(self);
    }

    /// The `fetch_sub` of [`release_held`](Self::release_held), without
    /// running the wait queue's grant loop (for the queue itself, which
    /// holds its lock and runs the loop).
    fn give_back_quietly(&self, n: usize) {
        // AcqRel: the Release of `release_held` (see there), and the
        // Acquire of the wait queue's hand-shake (see
        // `WaitQueue::first_look`).
        let prev = self.state.fetch_sub(n << SHIFT, Ordering::AcqRel);
        debug_assert!(prev >> SHIFT >= n, "guard released more than was used");
    }

    /// How many waiters are queued on the counter (for the pool, which
    /// waits on its counter).
    pub(crate) fn queued(&self) -> usize {
        self.queue.waiters()
    }

    fn record_peak(&self, used: usize) {
        // Relaxed (both): the peak is a statistic and orders nothing. The
        // load keeps the line shared in steady state; only a new peak
        // writes it.
        if used > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(used, Ordering::Relaxed);
        }
    }
}

impl fmt::Debug for SlotCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Relaxed: a snapshot for printing.
        let state = self.state.load(Ordering::Relaxed);
        f.debug_struct("SlotCounter")
            .field("capacity", &self.capacity)
            .field("used", &(state >> SHIFT).min(self.capacity))
            .field("peak_used", &self.peak_used())
            .field("closed", &(state & CLOSED != 0))
            .field("waiters", &self.queue.waiters())
            .finish()
    }
}

/// The counter as the wait queue sees it: slots are its units.
impl Units for SlotCounter {
    fn try_take(&self, n: usize, headroom: usize) -> Result<(), ReserveError> {
        self.try_reserve_raw(n, headroom)
    }

    fn take(&self, n: usize, headroom: usize) -> Result<(), ReserveError> {
        self.try_reserve_inner(n, headroom, false)
    }

    fn give_back(&self, n: usize) {
        self.give_back_quietly(n);
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn queue(&self) -> &WaitQueue {
        &self.queue
    }

    fn sync_with_releases(&self) {
        // AcqRel, changing nothing: see `WaitQueue::first_look`.
        self.state.fetch_add(0, Ordering::AcqRel);
    }
}
