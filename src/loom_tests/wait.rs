//! Loom models of waiting on a [`SlotCounter`]: the FIFO wait queue, its
//! grants on the waiter's behalf, cancellation, timeouts and close, with
//! loom's own mutex, condition variable and `block_on` (through the
//! crate's facade), so that every lock, sleep and wake is a scheduling
//! point.
//!
//! Run with `scripts/loom wait`.
//!
//! The async waiters are polled by hand with a waker that sets a flag: a
//! waiter's thread polls once and hands a pending future to the main
//! thread, which checks, once every other thread has finished, that the
//! waiter was woken and that its next poll resolves (a grant is made on the
//! waiter's behalf, so it needs no thread of its own to be granted). A
//! blocking waiter that is never woken is reported by loom as a deadlock.
//! Every model also checks that nothing is left taken once every guard is
//! gone (`used() == 0`) and that nobody is left queued (`waiters() == 0`).
//! Each has a negative control, a fault injected through
//! `SlotCounter::with_faults`, that loom must catch:
//!
//! | model | threads | fault caught |
//! |---|---|---|
//! | [`waiter_releaser_canceller`] | 3 | `late_enqueue` (lost wakeup), `cancel_keeps_grant`, `unfenced_wait` (lost wakeup) |
//! | [`close_against_waiters`] | 3 | `silent_close` (deadlock) |
//! | [`timeout_against_grant`] | 3 | `late_enqueue` (lost wakeup) |
//! | [`head_cancelled_against_grant`] | 3 | `cancel_no_recheck` (lost wakeup) |

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::loom_tests::pool_world::{check, SOUND};
use crate::loom_tests::Flag;
use crate::sync::Faults;
use crate::{ReserveError, ReserveOwned, SlotCounter};
use loom::thread;

/// What the models report when a queued async waiter is never woken: a
/// deadlock, as loom reports for a blocking one.
const LOST_WAKEUP: &str = "lost wakeup (deadlock)";

/// What a resolved wait gave: the guard's length, or the error.
type Outcome = Result<usize, ReserveError>;

/// An async waiter polled by hand: its future, once it has returned
/// `Pending`, or what it resolved to at once; and the flag its waker sets.
struct Polled {
    fut: Option<Pin<Box<ReserveOwned>>>,
    at_once: Option<Outcome>,
    flag: Arc<Flag>,
}

impl Polled {
    /// Polls `counter.reserve_owned(n)` once: a grant at once is given
    /// back (and recorded); a pending future is kept.
    fn start(counter: &Arc<SlotCounter>, n: usize) -> Polled {
        let flag = Arc::new(Flag::default());
        let mut fut = Box::pin(counter.reserve_owned(n));
        match Polled::poll(&mut fut, &flag) {
            Poll::Ready(out) => Polled {
                fut: None,
                at_once: Some(out.map(|granted| granted.len())),
                flag,
            },
            Poll::Pending => Polled {
                fut: Some(fut),
                at_once: None,
                flag,
            },
        }
    }

    fn poll(
        fut: &mut Pin<Box<ReserveOwned>>,
        flag: &Arc<Flag>,
    ) -> Poll<Result<crate::OwnedReservation, ReserveError>> {
        let waker = Waker::from(Arc::clone(flag));
        fut.as_mut().poll(&mut Context::from_waker(&waker))
    }

    /// Once every release is done: a pending waiter must have been woken,
    /// and its next poll must resolve to `expected` (`Ok` with `n` slots,
    /// which are then given back, or an error). The future is dropped
    /// before any assertion, so that a failed model unwinds without
    /// touching the queue.
    fn finish(self, n: usize, expected: Result<(), ReserveError>) {
        let expected = expected.map(|()| n);
        let Some(mut fut) = self.fut else {
            assert_eq!(self.at_once, Some(expected), "wrong outcome");
            return;
        };
        let woken = self.flag.was_woken();
        let outcome = match Polled::poll(&mut fut, &self.flag) {
            Poll::Ready(Ok(granted)) => Some(Ok(granted.len())),
            Poll::Ready(Err(err)) => Some(Err(err)),
            Poll::Pending => None,
        };
        drop(fut);
        assert!(woken && outcome.is_some(), "{LOST_WAKEUP}");
        assert_eq!(outcome, Some(expected), "wrong outcome");
    }
}

/// A counter of `capacity` slots with `faults` in its wait queue.
fn new_counter(capacity: usize, faults: Faults) -> Arc<SlotCounter> {
    Arc::new(SlotCounter::with_faults(capacity, faults))
}

/// Checks the end state: everything given back, nobody queued.
fn assert_drained(counter: &SlotCounter) {
    assert_eq!(counter.used(), 0, "slots leaked");
    assert_eq!(counter.waiters(), 0, "a waiter was left queued");
}

/// A future for `n` slots polled once and dropped, granted or not.
fn poll_once_and_drop(counter: &Arc<SlotCounter>, n: usize) {
    drop(Polled::start(counter, n));
}

/// A counter of 1, all held by the main thread. A waiter (polled once) and
/// a canceller (one poll, then drop) race the main thread's release.
/// Whatever the order, the waiter must end granted: if the canceller was
/// queued first and granted, its drop must hand the slot on; if the waiter
/// failed its first attempt just before the release, it must find the slot
/// when it queues.
fn waiter_releaser_canceller(faults: Faults) {
    check(move || {
        let counter = new_counter(1, faults);
        let held = counter.try_reserve_owned(1).unwrap();
        let canceller = {
            let counter = Arc::clone(&counter);
            thread::spawn(move || poll_once_and_drop(&counter, 1))
        };
        let waiter = {
            let counter = Arc::clone(&counter);
            thread::spawn(move || Polled::start(&counter, 1))
        };
        drop(held);
        canceller.join().unwrap();
        waiter.join().unwrap().finish(1, Ok(()));
        assert_drained(&counter);
    });
}

#[test]
fn waiter_releaser_canceller_sound() {
    waiter_releaser_canceller(SOUND);
}

#[test]
#[should_panic(expected = "lost wakeup")]
fn waiter_releaser_canceller_late_enqueue_is_caught() {
    waiter_releaser_canceller(Faults {
        late_enqueue: true,
        ..SOUND
    });
}

#[test]
#[should_panic(expected = "lost wakeup")]
fn waiter_releaser_canceller_unfenced_wait_is_caught() {
    waiter_releaser_canceller(Faults {
        unfenced_wait: true,
        ..SOUND
    });
}

#[test]
#[should_panic(expected = "lost wakeup")]
fn waiter_releaser_canceller_cancel_keeps_grant_is_caught() {
    waiter_releaser_canceller(Faults {
        cancel_keeps_grant: true,
        ..SOUND
    });
}

/// A counter of 1, held by the main thread, which closes it while an async
/// waiter and a blocking waiter wait (or are about to). Both must end with
/// `Closed`: before they queue (the closed flag), or woken by `close`.
fn close_against_waiters(faults: Faults) {
    check(move || {
        let counter = new_counter(1, faults);
        let held = counter.try_reserve_owned(1).unwrap();
        let task = {
            let counter = Arc::clone(&counter);
            thread::spawn(move || Polled::start(&counter, 1))
        };
        let sleeper = {
            let counter = Arc::clone(&counter);
            thread::spawn(move || {
                let out = counter.reserve_blocking(1, None).map(|r| r.len());
                assert_eq!(out, Err(ReserveError::Closed), "a waiter outlived close");
            })
        };
        counter.close();
        sleeper.join().unwrap();
        task.join().unwrap().finish(1, Err(ReserveError::Closed));
        drop(held);
        assert_drained(&counter);
    });
}

#[test]
fn close_against_waiters_sound() {
    close_against_waiters(SOUND);
}

#[test]
#[should_panic(expected = "deadlock")]
fn close_against_waiters_silent_close_is_caught() {
    close_against_waiters(Faults {
        silent_close: true,
        ..SOUND
    });
}

/// A counter of 1, held by the main thread, which gives it back. A blocking
/// waiter with a zero timeout (it queues, then times out unless it was
/// granted first) and an async waiter race that release. The blocking one
/// ends granted or refused (its grant racing its timeout: `Full`, or
/// `BehindWaiters` when the slot is free but owed to the async waiter);
/// whatever it got is given back, and the async waiter must end granted.
fn timeout_against_grant(faults: Faults) {
    check(move || {
        let counter = new_counter(1, faults);
        let held = counter.try_reserve_owned(1).unwrap();
        let timed = {
            let counter = Arc::clone(&counter);
            thread::spawn(
                move || match counter.reserve_blocking(1, Some(Duration::ZERO)) {
                    Ok(granted) => assert_eq!(granted.len(), 1, "partial grant"),
                    // A timed-out wait reports its last attempt's
                    // refusal: short, or (the slot free but owed to the
                    // async waiter, whose grant is on its way) behind it.
                    Err(err) => assert!(
                        matches!(
                            err,
                            ReserveError::Full { requested: 1, available }
                                | ReserveError::BehindWaiters { requested: 1, available, owed: 1 }
                                if available <= 1
                        ),
                        "a timeout reported an impossible refusal"
                    ),
                },
            )
        };
        let waiter = {
            let counter = Arc::clone(&counter);
            thread::spawn(move || Polled::start(&counter, 1))
        };
        drop(held);
        timed.join().unwrap();
        waiter.join().unwrap().finish(1, Ok(()));
        assert_drained(&counter);
    });
}

#[test]
fn timeout_against_grant_sound() {
    timeout_against_grant(SOUND);
}

#[test]
#[should_panic(expected = "lost wakeup")]
fn timeout_against_grant_late_enqueue_is_caught() {
    timeout_against_grant(Faults {
        late_enqueue: true,
        ..SOUND
    });
}

/// A counter of 2, held by the main thread, which gives 1 back. A waiter
/// for 2 is polled once and dropped (a head that gives up, as a timeout
/// does), and a waiter for 1 races both. The waiter for 1 must end granted
/// even when it queued behind the one for 2, which must re-check the
/// waiters behind it as it leaves.
fn head_cancelled_against_grant(faults: Faults) {
    check(move || {
        let counter = new_counter(2, faults);
        let mut held = counter.try_reserve_owned(2).unwrap();
        let head = {
            let counter = Arc::clone(&counter);
            thread::spawn(move || poll_once_and_drop(&counter, 2))
        };
        let waiter = {
            let counter = Arc::clone(&counter);
            thread::spawn(move || Polled::start(&counter, 1))
        };
        held.shrink_to(1);
        head.join().unwrap();
        waiter.join().unwrap().finish(1, Ok(()));
        drop(held);
        assert_drained(&counter);
    });
}

#[test]
fn head_cancelled_against_grant_sound() {
    head_cancelled_against_grant(SOUND);
}

#[test]
#[should_panic(expected = "lost wakeup")]
fn head_cancelled_against_grant_cancel_no_recheck_is_caught() {
    head_cancelled_against_grant(Faults {
        cancel_no_recheck: true,
        ..SOUND
    });
}
