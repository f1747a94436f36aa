//! Loom models of waiting on a [`SlotCounter`]: the FIFO wait queue, its
//! grants on the waiter's behalf, cancellation, timeouts and close, with
//! loom's own mutex, condition variable and `block_on` (through the
//! crate's facade), so that every lock, sleep and wake is a scheduling
//! point.
//!
//! Run with
//! `RUSTFLAGS="--cfg kvslots_loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test -p loom-tests --release --test wait`.
//!
//! Every model checks that each waiter ends (granted or with the error the
//! model allows: loom reports a waiter that sleeps forever as a deadlock),
//! that nothing is left taken once every guard is gone (`used() == 0`) and
//! that nobody is left queued (`waiters() == 0`). Each has a negative
//! control, a fault injected through `kvslots::__model`, that loom must
//! catch as a deadlock:
//!
//! | model | threads | fault caught |
//! |---|---|---|
//! | [`waiter_releaser_canceller`] | 3 | `late_enqueue` (lost wakeup), `cancel_keeps_grant` |
//! | [`close_against_waiters`] | 3 | `silent_close` |
//! | [`timeout_against_grant`] | 3 | `cancel_no_recheck` |
#![cfg(kvslots_loom)]
#![forbid(unsafe_code)]

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use kvslots::__model::{counter_with_faults, Faults};
use kvslots::{ReserveError, SlotCounter};
use loom::thread;
use loom_tests::pool_world::{check, SOUND};

/// A waker that does nothing: the canceller polls once and drops its
/// future, so it is never woken.
struct Noop;

impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// A counter of `capacity` slots with `faults` in its wait queue.
fn new_counter(capacity: usize, faults: Faults) -> Arc<SlotCounter> {
    Arc::new(counter_with_faults(capacity, faults))
}

/// Checks the end state: everything given back, nobody queued.
fn assert_drained(counter: &SlotCounter) {
    assert_eq!(counter.used(), 0, "slots leaked");
    assert_eq!(counter.waiters(), 0, "a waiter was left queued");
}

/// A counter of 1, all held by the main thread. A waiter (`block_on` of
/// `reserve(1)`) and a canceller (one poll of `reserve(1)`, then drop)
/// race the main thread's release. Whatever the order, the waiter must be
/// granted: if the canceller was queued first and granted, its drop must
/// hand the slot on; if the waiter failed its first attempt just before
/// the release, it must find the slot when it queues.
fn waiter_releaser_canceller(faults: Faults) {
    check(move || {
        let counter = new_counter(1, faults);
        let held = counter.try_reserve_owned(1).unwrap();
        let canceller = {
            let counter = Arc::clone(&counter);
            thread::spawn(move || {
                let waker = Waker::from(Arc::new(Noop));
                let mut fut = pin!(counter.reserve(1));
                // Pending (queued), or granted at once; dropped either way.
                let _ = fut.as_mut().poll(&mut Context::from_waker(&waker));
            })
        };
        let waiter = {
            let counter = Arc::clone(&counter);
            thread::spawn(move || {
                let granted = loom::future::block_on(counter.reserve(1)).expect("no close here");
                assert_eq!(granted.len(), 1, "partial grant");
            })
        };
        drop(held);
        canceller.join().unwrap();
        waiter.join().unwrap();
        assert_drained(&counter);
    });
}

#[test]
fn waiter_releaser_canceller_sound() {
    waiter_releaser_canceller(SOUND);
}

#[test]
#[should_panic(expected = "deadlock")]
fn waiter_releaser_canceller_late_enqueue_is_caught() {
    waiter_releaser_canceller(Faults {
        late_enqueue: true,
        ..SOUND
    });
}

#[test]
#[should_panic(expected = "deadlock")]
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
            thread::spawn(move || {
                let out = loom::future::block_on(counter.reserve(1)).map(|r| r.len());
                assert_eq!(out, Err(ReserveError::Closed), "a waiter outlived close");
            })
        };
        let sleeper = {
            let counter = Arc::clone(&counter);
            thread::spawn(move || {
                let out = counter.reserve_blocking(1, None).map(|r| r.len());
                assert_eq!(out, Err(ReserveError::Closed), "a waiter outlived close");
            })
        };
        counter.close();
        task.join().unwrap();
        sleeper.join().unwrap();
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

/// A counter of 2, held by the main thread, which gives 1 back. A blocking
/// waiter for 2 with a zero timeout (it queues, then times out) and an
/// async waiter for 1 race that release. The blocking waiter can never be
/// granted (the main thread keeps 1) and must time out with `Full`; the
/// async waiter must be granted the released slot even when it queued
/// behind the blocking one, which must re-check it as it leaves.
fn timeout_against_grant(faults: Faults) {
    check(move || {
        let counter = new_counter(2, faults);
        let mut held = counter.try_reserve_owned(2).unwrap();
        let timed = {
            let counter = Arc::clone(&counter);
            thread::spawn(move || {
                let out = counter.reserve_blocking(2, Some(Duration::ZERO));
                assert!(
                    matches!(out, Err(ReserveError::Full { requested: 2, available }) if available <= 1),
                    "a timeout reported an impossible count"
                );
            })
        };
        let waiter = {
            let counter = Arc::clone(&counter);
            thread::spawn(move || {
                let granted = loom::future::block_on(counter.reserve(1)).expect("no close here");
                assert_eq!(granted.len(), 1, "partial grant");
            })
        };
        held.shrink_to(1);
        timed.join().unwrap();
        waiter.join().unwrap();
        drop(held);
        assert_drained(&counter);
    });
}

#[test]
fn timeout_against_grant_sound() {
    timeout_against_grant(SOUND);
}

#[test]
#[should_panic(expected = "deadlock")]
fn timeout_against_grant_cancel_no_recheck_is_caught() {
    timeout_against_grant(Faults {
        cancel_no_recheck: true,
        ..SOUND
    });
}
