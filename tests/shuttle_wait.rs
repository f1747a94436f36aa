//! shuttle: randomised and PCT schedules of the waiting calls, with more
//! threads than loom can explore. Run with `scripts/shuttle` (which runs
//! `tests/shuttle.rs` too).
//!
//! Under `--cfg kvslots_shuttle` the wait queue's mutex and condition
//! variable are shuttle's, and `shuttle::future::block_on` drives the
//! futures, so every lock, sleep and wake is a scheduling point. The
//! models check:
//!
//! * FIFO order: waiters queued in a known order (each thread queues only
//!   once the one before it is counted in `waiters()`), async and blocking
//!   mixed, with a small request behind a large one, are granted in that
//!   order;
//! * no starvation of the head: a waiter for the whole counter, while
//!   other threads keep trying to take single slots as a holder gives its
//!   slots back one at a time, is granted, and no `try_*` call takes a
//!   slot while it is queued;
//! * nothing leaked after random cancellations: threads reserve on a
//!   counter and allocate on a pool with futures dropped after one poll,
//!   zero timeouts and waits to completion; no more than the capacity is
//!   ever held, and at the end everything is back and nobody is queued.
//!
//! Negative control: a large waiter that polls `try_reserve` in a loop
//! instead of queuing keeps no place, and the small request behind it is
//! served first; the FIFO model must catch it (`#[should_panic]`).
#![cfg(kvslots_shuttle)]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use kvslots::{BlockPool, SlotCounter};
use shuttle::rand::{thread_rng, Rng};
use shuttle::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use shuttle::sync::{Arc, Mutex};
use shuttle::thread;

mod shuttle_runner;
use shuttle_runner::{check_pct, check_random, iterations};

/// A waker that does nothing (for futures polled once and dropped).
struct Noop;

impl Wake for Noop {
    fn wake(self: std::sync::Arc<Self>) {}
}

/// Yields until `count()` reads `n`.
fn yield_until(n: usize, count: impl Fn() -> usize) {
    while count() != n {
        thread::yield_now();
    }
}

/// How a FIFO waiter takes its slots.
#[derive(Clone, Copy)]
enum Way {
    Async,
    Blocking,
    /// The negative control: `try_reserve` in a loop, no queue.
    Polling,
}

/// Requests, in queue order, on a counter of 2: a small one behind a large
/// head must not pass it.
const FIFO_SIZES: [usize; 4] = [2, 1, 2, 1];

/// The FIFO model: the main thread holds the whole counter until the
/// waiters are queued in the order of `FIFO_SIZES`, then gives it back.
/// Each waiter records its index once granted and then gives its slots
/// back; grants cannot overlap (every pair of neighbours needs more than
/// the counter has), so the record is the grant order.
fn fifo_model(ways: [Way; 4]) {
    let counter = Arc::new(SlotCounter::new(2));
    let held = counter.try_reserve_owned(2).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..FIFO_SIZES.len())
        .map(|i| {
            let counter = Arc::clone(&counter);
            let order = Arc::clone(&order);
            let way = ways[i];
            thread::spawn(move || {
                let n = FIFO_SIZES[i];
                // Queue after the ones before (a polling waiter never
                // queues, and is not counted).
                let before = ways[..i]
                    .iter()
                    .filter(|w| !matches!(w, Way::Polling))
                    .count();
                yield_until(before, || counter.waiters());
                let granted = match way {
                    Way::Async => shuttle::future::block_on(counter.reserve(n)).unwrap(),
                    Way::Blocking => counter.reserve_blocking(n, None).unwrap(),
                    Way::Polling => loop {
                        if let Ok(r) = counter.try_reserve(n) {
                            break r;
                        }
                        thread::yield_now();
                    },
                };
                order.lock().unwrap().push(i);
                drop(granted);
            })
        })
        .collect();
    let queued = ways.iter().filter(|w| !matches!(w, Way::Polling)).count();
    yield_until(queued, || counter.waiters());
    drop(held);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3], "served out of order");
    assert_eq!((counter.used(), counter.waiters()), (0, 0), "leaked");
}

const FIFO_WAYS: [Way; 4] = [Way::Async, Way::Blocking, Way::Async, Way::Blocking];

#[test]
fn fifo_random() {
    check_random(|| fifo_model(FIFO_WAYS), iterations(2000));
}

#[test]
fn fifo_pct() {
    check_pct(|| fifo_model(FIFO_WAYS), iterations(2000));
}

#[test]
#[should_panic(expected = "served out of order")]
fn fifo_polling_waiter_is_caught() {
    // The large third waiter polls instead of queuing, so it keeps no
    // place: the small one behind it is served first.
    check_random(
        || fifo_model([Way::Async, Way::Blocking, Way::Polling, Way::Async]),
        1000,
    );
}

/// The starvation model: a counter of 4, held by the main thread as 4
/// guards of 1. A head waiter asks for all 4 (blocking, or async); 3
/// threads keep trying to take single slots and give them back; the main
/// thread gives its slots back one at a time. The head must be granted,
/// and while it is queued no `try_reserve(1)` may succeed.
fn starvation_model(blocking_head: bool) {
    let counter = Arc::new(SlotCounter::new(4));
    let mut held: Vec<_> = (0..4)
        .map(|_| counter.try_reserve_owned(1).unwrap())
        .collect();
    let released = Arc::new(AtomicBool::new(false));
    let head = {
        let counter = Arc::clone(&counter);
        let released = Arc::clone(&released);
        thread::spawn(move || {
            let granted = if blocking_head {
                counter.reserve_blocking(4, None).unwrap()
            } else {
                shuttle::future::block_on(counter.reserve(4)).unwrap()
            };
            assert_eq!(granted.len(), 4);
            // SeqCst (shuttle's atomics are sequentially consistent anyway):
            // set before the slots go back.
            released.store(true, Ordering::SeqCst);
            drop(granted);
        })
    };
    let small: Vec<_> = (0..3)
        .map(|_| {
            let counter = Arc::clone(&counter);
            let released = Arc::clone(&released);
            thread::spawn(move || {
                for _ in 0..6 {
                    let queued = counter.waiters() == 1;
                    if let Ok(r) = counter.try_reserve(1) {
                        assert!(
                            !queued || released.load(Ordering::SeqCst),
                            "a try_* call took a slot the head was owed"
                        );
                        thread::yield_now();
                        drop(r);
                    }
                    thread::yield_now();
                }
            })
        })
        .collect();
    yield_until(1, || counter.waiters());
    while let Some(one) = held.pop() {
        drop(one);
        thread::yield_now();
    }
    head.join().unwrap();
    for t in small {
        t.join().unwrap();
    }
    assert_eq!((counter.used(), counter.waiters()), (0, 0), "leaked");
}

#[test]
fn head_is_not_starved_random() {
    check_random(|| starvation_model(true), iterations(1000));
    check_random(|| starvation_model(false), iterations(1000));
}

#[test]
fn head_is_not_starved_pct() {
    check_pct(|| starvation_model(true), iterations(1000));
    check_pct(|| starvation_model(false), iterations(1000));
}

/// The cancellation model: 5 threads, each doing a few random waits on a
/// counter of 3 and a pool of 3 blocks: a future polled once and dropped
/// (granted or not), a zero-timeout blocking call, a wait to completion
/// (async or blocking). A shadow count checks that no more than the
/// capacity is held at once; at the end all is back and nobody is queued.
fn cancellation_model() {
    let counter = Arc::new(SlotCounter::new(3));
    let pool = Arc::new(BlockPool::new(3, 4));
    let shadow = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..5)
        .map(|_| {
            let counter = Arc::clone(&counter);
            let pool = Arc::clone(&pool);
            let shadow = Arc::clone(&shadow);
            thread::spawn(move || {
                let waker = Waker::from(std::sync::Arc::new(Noop));
                for _ in 0..3 {
                    let n = thread_rng().gen_range(1..=3);
                    let held = match thread_rng().gen_range(0..5) {
                        0 => {
                            let mut fut = pin!(counter.reserve(n));
                            let _ = fut.as_mut().poll(&mut Context::from_waker(&waker));
                            0
                        }
                        1 => counter
                            .reserve_blocking(n, Some(Duration::ZERO))
                            .map_or(0, |r| r.forget()),
                        2 => shuttle::future::block_on(counter.reserve(n))
                            .unwrap()
                            .forget(),
                        3 => {
                            let mut ids = Vec::new();
                            {
                                let mut fut = pin!(pool.alloc(n, &mut ids));
                                let _ = fut.as_mut().poll(&mut Context::from_waker(&waker));
                            }
                            pool.free(&ids).unwrap();
                            0
                        }
                        _ => {
                            let mut ids = Vec::new();
                            pool.alloc_blocking(n, &mut ids, None).unwrap();
                            assert_eq!(ids.len(), n, "partial admission");
                            pool.free(&ids).unwrap();
                            0
                        }
                    };
                    if held > 0 {
                        assert_eq!(held, n, "partial admission");
                        // SeqCst: a shadow count of what is held.
                        let now = shadow.fetch_add(held, Ordering::SeqCst) + held;
                        assert!(now <= 3, "overcommit");
                        thread::yield_now();
                        shadow.fetch_sub(held, Ordering::SeqCst);
                        counter.release(held).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!((counter.used(), counter.waiters()), (0, 0), "leaked");
    assert_eq!((pool.used_blocks(), pool.waiters()), (0, 0), "leaked");
}

#[test]
fn random_cancellations_leak_nothing_random() {
    check_random(cancellation_model, iterations(2000));
}

#[test]
fn random_cancellations_leak_nothing_pct() {
    check_pct(cancellation_model, iterations(2000));
}
