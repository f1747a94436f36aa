//! The waiting calls, one behaviour at a time, polled by hand with a
//! counting waker so that every step is deterministic: `SlotCounter::reserve`,
//! `reserve_owned`, `reserve_blocking`, `BlockPool::alloc`, `alloc_blocking`,
//! `Sequence::reserve`, `reserve_blocking`, and `waiters()`; FIFO order,
//! the `try_*` calls yielding to the head, cancellation, close, timeouts and
//! bad input (a typed error, nothing changed).

use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

use kvslots::{BlockPool, ReserveError, Sequence, SlotCounter};

mod common;

use common::{poll_once, waker, wakes};

#[test]
fn reserve_resolves_at_once_when_free() {
    let counter = SlotCounter::new(4);
    let (w, _) = waker();
    let mut fut = pin!(counter.reserve(3));
    let Poll::Ready(Ok(held)) = poll_once(fut.as_mut(), &w) else {
        panic!("3 of 4 free slots must be granted at the first poll");
    };
    assert_eq!((held.len(), counter.used(), counter.waiters()), (3, 3, 0));
}

#[test]
fn reserve_zero_takes_nothing() {
    let counter = SlotCounter::new(1);
    let _all = counter.try_reserve(1).unwrap();
    let (w, _) = waker();
    let Poll::Ready(Ok(empty)) = poll_once(pin!(counter.reserve(0)), &w) else {
        panic!("an empty reservation never waits");
    };
    assert!(empty.is_empty());
    assert_eq!((counter.used(), counter.waiters()), (1, 0));
}

#[test]
fn reserve_never_fits_at_once_and_changes_nothing() {
    let counter = Arc::new(SlotCounter::new(4));
    let _held = counter.try_reserve(1).unwrap();
    let (w, _) = waker();
    for n in [5, usize::MAX] {
        let out = poll_once(pin!(counter.reserve(n)), &w);
        assert!(matches!(
            out,
            Poll::Ready(Err(ReserveError::NeverFits { requested, capacity: 4 })) if requested == n
        ));
        assert_eq!(
            counter.reserve_blocking(n, None).unwrap_err(),
            ReserveError::NeverFits {
                requested: n,
                capacity: 4
            }
        );
        assert_eq!(
            counter.reserve_owned_blocking(n, None).unwrap_err(),
            ReserveError::NeverFits {
                requested: n,
                capacity: 4
            }
        );
        assert_eq!((counter.used(), counter.waiters()), (1, 0));
    }
}

#[test]
fn reserve_after_close_fails_at_once_and_changes_nothing() {
    let counter = Arc::new(SlotCounter::new(4));
    let _held = counter.try_reserve(1).unwrap();
    counter.close();
    let (w, _) = waker();
    assert!(matches!(
        poll_once(pin!(counter.reserve(1)), &w),
        Poll::Ready(Err(ReserveError::Closed))
    ));
    assert_eq!(
        counter.reserve_blocking(1, None).unwrap_err(),
        ReserveError::Closed
    );
    assert_eq!(
        counter.reserve_owned_blocking(1, None).unwrap_err(),
        ReserveError::Closed
    );
    assert_eq!((counter.used(), counter.waiters()), (1, 0));
}

#[test]
fn waiter_is_granted_by_a_release_and_woken() {
    let counter = SlotCounter::new(4);
    let held = counter.try_reserve(4).unwrap();
    let (w, count) = waker();
    let mut fut = pin!(counter.reserve(2));
    assert!(poll_once(fut.as_mut(), &w).is_pending());
    assert_eq!((counter.waiters(), counter.used()), (1, 4));
    drop(held);
    // Granted on the waiter's behalf by the release: the slots are taken.
    assert_eq!((wakes(&count), counter.used()), (1, 2));
    let Poll::Ready(Ok(granted)) = poll_once(fut.as_mut(), &w) else {
        panic!("a woken waiter must be granted");
    };
    assert_eq!((granted.len(), counter.waiters()), (2, 0));
}

#[test]
fn repoll_refreshes_the_waker() {
    let counter = SlotCounter::new(1);
    let held = counter.try_reserve(1).unwrap();
    let (first, first_count) = waker();
    let (second, second_count) = waker();
    let mut fut = pin!(counter.reserve(1));
    assert!(poll_once(fut.as_mut(), &first).is_pending());
    assert!(poll_once(fut.as_mut(), &second).is_pending());
    drop(held);
    assert_eq!((wakes(&first_count), wakes(&second_count)), (0, 1));
    assert!(matches!(
        poll_once(fut.as_mut(), &second),
        Poll::Ready(Ok(_))
    ));
}

#[test]
fn a_small_waiter_does_not_pass_a_large_head() {
    let counter = SlotCounter::new(4);
    let mut held = counter.try_reserve(4).unwrap();
    let (w, _) = waker();
    let mut large = pin!(counter.reserve(3));
    let mut small = pin!(counter.reserve(1));
    assert!(poll_once(large.as_mut(), &w).is_pending());
    assert!(poll_once(small.as_mut(), &w).is_pending());
    assert_eq!(counter.waiters(), 2);
    held.shrink_to(2); // 2 free: the head needs 3
    assert!(poll_once(small.as_mut(), &w).is_pending());
    assert_eq!(counter.used(), 2);
    held.shrink_to(0); // 4 free: head first, then the small one
    assert_eq!(counter.used(), 4);
    assert!(matches!(poll_once(large.as_mut(), &w), Poll::Ready(Ok(r)) if r.len() == 3));
    assert!(matches!(poll_once(small.as_mut(), &w), Poll::Ready(Ok(r)) if r.len() == 1));
}

#[test]
fn try_calls_leave_what_the_head_is_owed() {
    let counter = SlotCounter::new(4);
    let mut held = counter.try_reserve(4).unwrap();
    let (w, _) = waker();
    let mut head = pin!(counter.reserve(3));
    assert!(poll_once(head.as_mut(), &w).is_pending());
    held.shrink_to(2);
    // 2 free, owed to the head: a try_* call refuses rather than take them,
    // and says so.
    assert_eq!(
        counter.try_reserve(1).unwrap_err(),
        ReserveError::BehindWaiters {
            requested: 1,
            available: 2,
            owed: 3
        }
    );
    // Short even without the waiters: `Full`.
    assert_eq!(
        counter.try_reserve(3).unwrap_err(),
        ReserveError::Full {
            requested: 3,
            available: 2
        }
    );
    assert_eq!(counter.admit(1), 0);
    assert_eq!(counter.used(), 2);
    // An empty reservation owes nothing.
    assert!(counter.try_reserve(0).is_ok());
    drop(held);
    assert!(matches!(poll_once(head.as_mut(), &w), Poll::Ready(Ok(_))));
    // Nobody waits now: the free slot goes to whoever asks.
    assert!(counter.try_reserve(1).is_ok());
}

#[test]
fn dropping_a_pending_waiter_leaves_nothing() {
    let counter = SlotCounter::new(2);
    let held = counter.try_reserve(2).unwrap();
    let (w, _) = waker();
    {
        let mut fut = pin!(counter.reserve(1));
        assert!(poll_once(fut.as_mut(), &w).is_pending());
        assert_eq!(counter.waiters(), 1);
    }
    assert_eq!((counter.waiters(), counter.used()), (0, 2));
    drop(held);
    assert_eq!(counter.used(), 0);
}

#[test]
fn dropping_a_granted_unpolled_waiter_hands_its_grant_on() {
    let counter = SlotCounter::new(2);
    let held = counter.try_reserve(2).unwrap();
    let (w, _) = waker();
    let (w2, count2) = waker();
    let mut first = Box::pin(counter.reserve(2));
    let mut second = pin!(counter.reserve(2));
    assert!(poll_once(first.as_mut(), &w).is_pending());
    assert!(poll_once(second.as_mut(), &w2).is_pending());
    drop(held);
    assert_eq!((counter.used(), wakes(&count2)), (2, 0)); // granted to `first`
    drop(first); // never collected: its slots go to `second`
    assert_eq!(
        (counter.used(), wakes(&count2), counter.waiters()),
        (2, 1, 1)
    );
    assert!(matches!(poll_once(second.as_mut(), &w2), Poll::Ready(Ok(r)) if r.len() == 2));
    assert_eq!(counter.waiters(), 0);
}

#[test]
fn dropping_a_pending_head_rechecks_the_waiters_behind() {
    let counter = SlotCounter::new(4);
    let mut held = counter.try_reserve(4).unwrap();
    let (w, _) = waker();
    let (w2, count2) = waker();
    let mut large = Box::pin(counter.reserve(4));
    let mut small = pin!(counter.reserve(1));
    assert!(poll_once(large.as_mut(), &w).is_pending());
    assert!(poll_once(small.as_mut(), &w2).is_pending());
    held.shrink_to(3);
    assert_eq!(wakes(&count2), 0);
    drop(large);
    assert_eq!((wakes(&count2), counter.used()), (1, 4));
    assert!(matches!(poll_once(small.as_mut(), &w2), Poll::Ready(Ok(_))));
}

#[test]
fn close_wakes_every_waiter_with_closed() {
    let counter = SlotCounter::new(2);
    let held = counter.try_reserve(2).unwrap();
    let (w, count) = waker();
    let mut a = pin!(counter.reserve(1));
    let mut b = pin!(counter.reserve(2));
    assert!(poll_once(a.as_mut(), &w).is_pending());
    assert!(poll_once(b.as_mut(), &w).is_pending());
    counter.close();
    assert_eq!(wakes(&count), 2);
    assert!(matches!(
        poll_once(a.as_mut(), &w),
        Poll::Ready(Err(ReserveError::Closed))
    ));
    assert!(matches!(
        poll_once(b.as_mut(), &w),
        Poll::Ready(Err(ReserveError::Closed))
    ));
    assert_eq!((counter.waiters(), counter.used()), (0, 2));
    drop(held);
    assert_eq!(counter.used(), 0);
}

#[test]
fn a_grant_made_before_close_is_kept() {
    let counter = SlotCounter::new(1);
    let held = counter.try_reserve(1).unwrap();
    let (w, _) = waker();
    let mut fut = pin!(counter.reserve(1));
    assert!(poll_once(fut.as_mut(), &w).is_pending());
    drop(held);
    counter.close();
    assert!(matches!(poll_once(fut.as_mut(), &w), Poll::Ready(Ok(r)) if r.len() == 1));
}

#[test]
#[should_panic(expected = "polled after it completed")]
fn polling_after_completion_panics() {
    let counter = SlotCounter::new(1);
    let (w, _) = waker();
    let mut fut = pin!(counter.reserve(1));
    assert!(poll_once(fut.as_mut(), &w).is_ready());
    let _ = poll_once(fut.as_mut(), &w);
}

#[test]
fn reserve_blocking_times_out_with_full_and_leaves_the_queue() {
    let counter = Arc::new(SlotCounter::new(3));
    let _held = counter.try_reserve(2).unwrap();
    for timeout in [Duration::ZERO, Duration::from_millis(2)] {
        let full = ReserveError::Full {
            requested: 2,
            available: 1,
        };
        assert_eq!(
            counter.reserve_blocking(2, Some(timeout)).unwrap_err(),
            full
        );
        assert_eq!((counter.used(), counter.waiters()), (2, 0));
        assert_eq!(
            counter
                .reserve_owned_blocking(2, Some(timeout))
                .unwrap_err(),
            full
        );
        assert_eq!((counter.used(), counter.waiters()), (2, 0));
    }
    // What fits is taken at once, whatever the timeout.
    assert_eq!(
        counter
            .reserve_blocking(1, Some(Duration::ZERO))
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn reserve_blocking_is_woken_by_a_release() {
    let counter = Arc::new(SlotCounter::new(2));
    let held = counter.try_reserve_owned(2).unwrap();
    let waiter = thread::spawn({
        let counter = Arc::clone(&counter);
        move || counter.reserve_blocking(2, None).map(|r| r.forget())
    });
    common::wait_until(|| counter.waiters() == 1);
    drop(held);
    assert_eq!(waiter.join().unwrap(), Ok(2));
    assert_eq!((counter.used(), counter.waiters()), (2, 0));
    counter.release(2).unwrap();
}

/// The owned form: the waiting thread gets a guard it can keep (it holds
/// the counter), and its drop, on another thread, gives the slots back.
#[test]
fn reserve_owned_blocking_is_woken_by_a_release_and_its_guard_outlives_the_call() {
    let counter = Arc::new(SlotCounter::new(3));
    let held = counter.try_reserve_owned(3).unwrap();
    let waiter = thread::spawn({
        let counter = Arc::clone(&counter);
        move || counter.reserve_owned_blocking(2, None)
    });
    common::wait_until(|| counter.waiters() == 1);
    drop(held);
    let granted = waiter.join().unwrap().unwrap();
    assert_eq!(granted.len(), 2);
    assert_eq!((counter.used(), counter.waiters()), (2, 0));
    thread::spawn(move || drop(granted)).join().unwrap();
    assert_eq!(counter.used(), 0);
}

#[test]
fn reserve_blocking_is_woken_by_close() {
    let counter = Arc::new(SlotCounter::new(1));
    let _held = counter.try_reserve_owned(1).unwrap();
    let waiter = thread::spawn({
        let counter = Arc::clone(&counter);
        move || counter.reserve_blocking(1, None).map(|r| r.forget())
    });
    common::wait_until(|| counter.waiters() == 1);
    counter.close();
    assert_eq!(waiter.join().unwrap(), Err(ReserveError::Closed));
    assert_eq!((counter.used(), counter.waiters()), (1, 0));
}

#[test]
fn blocking_and_async_waiters_share_one_fifo() {
    let counter = Arc::new(SlotCounter::new(2));
    let held = counter.try_reserve_owned(2).unwrap();
    let blocking = thread::spawn({
        let counter = Arc::clone(&counter);
        move || counter.reserve_blocking(2, None).map(|r| r.forget())
    });
    common::wait_until(|| counter.waiters() == 1);
    let (w, count) = waker();
    let mut later = pin!(counter.reserve(1));
    assert!(poll_once(later.as_mut(), &w).is_pending());
    drop(held);
    // The blocking thread came first and takes both slots.
    assert_eq!(blocking.join().unwrap(), Ok(2));
    assert_eq!(wakes(&count), 0);
    counter.release(2).unwrap();
    assert_eq!(wakes(&count), 1);
    assert!(matches!(poll_once(later.as_mut(), &w), Poll::Ready(Ok(_))));
}

#[test]
fn reserve_owned_crosses_tokio_spawn() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let counter = Arc::new(SlotCounter::new(4));
    let held = counter.try_reserve_owned(4).unwrap();
    let task = runtime.spawn(counter.reserve_owned(3));
    common::wait_until(|| counter.waiters() == 1);
    drop(held);
    let granted = runtime.block_on(task).unwrap().unwrap();
    assert_eq!(
        (granted.len(), counter.used(), counter.waiters()),
        (3, 3, 0)
    );
}

#[test]
fn pool_alloc_waits_and_appends_only_when_granted() {
    let pool = BlockPool::new(4, 16);
    let mut held = Vec::new();
    pool.try_alloc(4, &mut held).unwrap();
    let (w, count) = waker();
    let mut out = vec![held[0]]; // a caller's earlier contents stay
    {
        let mut fut = pin!(pool.alloc(3, &mut out));
        assert!(poll_once(fut.as_mut(), &w).is_pending());
        assert_eq!(pool.waiters(), 1);
        pool.free(&held[1..]).unwrap();
        assert_eq!((wakes(&count), pool.used_blocks()), (1, 4));
        assert!(matches!(poll_once(fut.as_mut(), &w), Poll::Ready(Ok(()))));
    }
    assert_eq!(out.len(), 4);
    assert_eq!(out[0], held[0]);
    assert_eq!(pool.waiters(), 0);
    pool.free(&out).unwrap();
    assert_eq!(pool.free_blocks(), 4);
}

#[test]
fn pool_alloc_bad_input_changes_nothing() {
    let pool = BlockPool::new(4, 16);
    let mut held = Vec::new();
    pool.try_alloc(1, &mut held).unwrap();
    let (w, _) = waker();
    let mut out = held.clone();
    for n in [5, usize::MAX] {
        assert!(matches!(
            poll_once(pin!(pool.alloc(n, &mut out)), &w),
            Poll::Ready(Err(ReserveError::NeverFits { capacity: 4, .. }))
        ));
        assert!(matches!(
            pool.alloc_blocking(n, &mut out, None),
            Err(ReserveError::NeverFits { capacity: 4, .. })
        ));
    }
    assert_eq!((out.as_slice(), pool.used_blocks()), (held.as_slice(), 1));
    pool.close();
    assert!(matches!(
        poll_once(pin!(pool.alloc(1, &mut out)), &w),
        Poll::Ready(Err(ReserveError::Closed))
    ));
    assert_eq!(
        pool.alloc_blocking(1, &mut out, None),
        Err(ReserveError::Closed)
    );
    assert_eq!((out.as_slice(), pool.used_blocks()), (held.as_slice(), 1));
    assert_eq!(pool.waiters(), 0);
}

#[test]
fn pool_alloc_dropped_leaves_out_and_pool_unchanged() {
    let pool = BlockPool::new(2, 16);
    let mut held = Vec::new();
    pool.try_alloc(2, &mut held).unwrap();
    let (w, _) = waker();
    let mut out = Vec::new();
    {
        let mut fut = pin!(pool.alloc(1, &mut out));
        assert!(poll_once(fut.as_mut(), &w).is_pending());
        pool.free(&held[..1]).unwrap(); // granted, never collected
        assert_eq!(pool.used_blocks(), 2);
    }
    assert!(out.is_empty());
    assert_eq!((pool.used_blocks(), pool.waiters()), (1, 0));
}

#[test]
fn pool_alloc_blocking_times_out_and_is_woken() {
    let pool = Arc::new(BlockPool::new(3, 16));
    let mut held = Vec::new();
    pool.try_alloc(3, &mut held).unwrap();
    let mut out = Vec::new();
    assert_eq!(
        pool.alloc_blocking(2, &mut out, Some(Duration::ZERO)),
        Err(ReserveError::Full {
            requested: 2,
            available: 0
        })
    );
    assert!(out.is_empty());
    let waiter = thread::spawn({
        let pool = Arc::clone(&pool);
        move || {
            let mut ids = Vec::new();
            pool.alloc_blocking(2, &mut ids, None).map(|()| ids)
        }
    });
    common::wait_until(|| pool.waiters() == 1);
    pool.free(&held).unwrap();
    let ids = waiter.join().unwrap().unwrap();
    assert_eq!((ids.len(), pool.used_blocks(), pool.waiters()), (2, 2, 0));
}

#[test]
fn sequence_reserve_waits_for_the_whole_prompt() {
    let pool = Arc::new(BlockPool::new(4, 16));
    let mut running = Sequence::new(Arc::clone(&pool));
    running.try_append(48).unwrap(); // 3 blocks
    let mut seq = Sequence::new(Arc::clone(&pool));
    let (w, count) = waker();
    {
        let mut fut = pin!(seq.reserve(40, 0)); // 3 blocks
        assert!(poll_once(fut.as_mut(), &w).is_pending());
        running.truncate(32); // 2 free: not enough
        assert_eq!(wakes(&count), 0);
        drop(running);
        assert_eq!(wakes(&count), 1);
        assert!(matches!(poll_once(fut.as_mut(), &w), Poll::Ready(Ok(()))));
    }
    assert_eq!((seq.len(), seq.capacity(), pool.used_blocks()), (0, 48, 3));
    // Nothing missing: resolves at once, takes nothing.
    assert!(matches!(
        poll_once(pin!(seq.reserve(48, 4)), &w),
        Poll::Ready(Ok(()))
    ));
    assert_eq!(pool.used_blocks(), 3);
}

#[test]
fn running_growth_does_not_wait_behind_a_queued_admission() {
    let pool = Arc::new(BlockPool::new(4, 16));
    let mut running = Sequence::new(Arc::clone(&pool));
    running.try_append(64).unwrap();
    let mut seq = Sequence::new(Arc::clone(&pool));
    let (w, _) = waker();
    let mut fut = pin!(seq.reserve(32, 2)); // 2 blocks, 2 kept free
    assert!(poll_once(fut.as_mut(), &w).is_pending());
    // 3 free: the head needs 2 + 2.
    running.truncate(16);
    // A new admission leaves the head what it is owed, its headroom
    // included...
    let mut fresh = Sequence::new(Arc::clone(&pool));
    assert_eq!(
        fresh.try_append(32).unwrap_err(),
        ReserveError::BehindWaiters {
            requested: 2,
            available: 3,
            owed: 4
        }
    );
    assert_eq!(
        pool.try_alloc(2, &mut Vec::new()).unwrap_err(),
        ReserveError::BehindWaiters {
            requested: 2,
            available: 3,
            owed: 4
        }
    );
    // As many as are free: short only of what the head is owed besides.
    assert_eq!(
        pool.try_alloc(3, &mut Vec::new()).unwrap_err(),
        ReserveError::BehindWaiters {
            requested: 3,
            available: 3,
            owed: 4
        }
    );
    // A request for nothing asks nothing of the head.
    let mut none = Vec::new();
    pool.try_alloc(0, &mut none).unwrap();
    assert!(none.is_empty());
    assert_eq!(
        (fresh.len(), fresh.blocks().len(), pool.used_blocks()),
        (0, 0, 1)
    );
    // ...but a running sequence grows into free blocks the head is owed,
    // and so does a fork of it (a partly filled tail: one new block).
    running.try_append(24).unwrap(); // 40 tokens: 3 blocks
    let (child, copy) = running.try_fork().unwrap();
    assert!(copy.is_some());
    assert_eq!((pool.used_blocks(), pool.free_blocks()), (4, 0));
    drop(child);
    assert!(poll_once(fut.as_mut(), &w).is_pending()); // 1 free, needs 4
    drop(running);
    assert!(matches!(poll_once(fut.as_mut(), &w), Poll::Ready(Ok(()))));
    assert_eq!(pool.used_blocks(), 2);
}

#[test]
fn a_guard_grows_past_a_queued_waiter() {
    let counter = SlotCounter::new(4);
    let mut held = counter.try_reserve(2).unwrap();
    let (w, _) = waker();
    let mut head = pin!(counter.reserve(3));
    assert!(poll_once(head.as_mut(), &w).is_pending());
    // A new reservation leaves the 2 free slots to the head...
    assert!(matches!(
        counter.try_reserve(1),
        Err(ReserveError::BehindWaiters { owed: 3, .. })
    ));
    // ...a running reservation's growth takes one.
    held.try_grow(1).unwrap();
    assert_eq!((held.len(), counter.used()), (3, 3));
    drop(held);
    assert!(matches!(poll_once(head.as_mut(), &w), Poll::Ready(Ok(_))));
}

#[test]
fn sequence_reserve_bad_input_and_drop_leave_it_unchanged() {
    let pool = Arc::new(BlockPool::new(4, 16));
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(20).unwrap();
    let before = (seq.len(), seq.blocks().to_vec(), pool.used_blocks());
    let (w, _) = waker();
    assert!(matches!(
        poll_once(pin!(seq.reserve(100, 0)), &w),
        Poll::Ready(Err(ReserveError::NeverFits { .. }))
    ));
    assert!(matches!(
        seq.reserve_blocking(16, 4, None), // 1 block + 4 of headroom
        Err(ReserveError::NeverFits { .. })
    ));
    let mut other = Sequence::new(Arc::clone(&pool));
    other.try_append(32).unwrap();
    {
        let mut fut = pin!(seq.reserve(40, 0)); // needs 2 more, 0 free
        assert!(poll_once(fut.as_mut(), &w).is_pending());
    }
    assert_eq!(
        seq.reserve_blocking(40, 0, Some(Duration::ZERO)),
        Err(ReserveError::Full {
            requested: 2,
            available: 0
        })
    );
    assert_eq!(
        (seq.len(), seq.blocks(), pool.used_blocks()),
        (before.0, &before.1[..], 4)
    );
    drop(other);
    seq.reserve_blocking(40, 0, None).unwrap();
    assert_eq!(seq.capacity(), 64);
    pool.close();
    drop(seq);
    let mut late = Sequence::new(Arc::clone(&pool));
    assert_eq!(late.reserve_blocking(1, 0, None), Err(ReserveError::Closed));
    assert!(late.blocks().is_empty());
    assert_eq!((pool.used_blocks(), pool.waiters()), (0, 0));
}

/// A waker whose last drop drops a pending wait on the same counter (as a
/// task that owns such a future would).
struct OwnsAWait {
    /// Held only to be dropped with the waker.
    _wait: std::sync::Mutex<Pin<Box<kvslots::ReserveOwned>>>,
}

impl Wake for OwnsAWait {
    fn wake(self: Arc<Self>) {}
}

#[test]
fn a_replaced_waker_is_dropped_after_the_lock() {
    let counter = Arc::new(SlotCounter::new(1));
    let _held = counter.try_reserve_owned(1).unwrap();
    let (noop, _) = waker();
    let mut inner_wait = Box::pin(counter.reserve_owned(1));
    assert!(poll_once(inner_wait.as_mut(), &noop).is_pending());
    let owning = Waker::from(Arc::new(OwnsAWait {
        _wait: std::sync::Mutex::new(inner_wait),
    }));
    let mut fut = pin!(counter.reserve(1));
    assert!(poll_once(fut.as_mut(), &owning).is_pending());
    drop(owning); // the queue's clone is now the last one
    assert_eq!(counter.waiters(), 2);
    // A poll with another waker replaces it: its drop cancels the inner
    // wait, which takes the queue's lock (a deadlock if it were dropped
    // under it).
    assert!(poll_once(fut.as_mut(), &noop).is_pending());
    assert_eq!(counter.waiters(), 1);
}

#[test]
fn a_fenced_release_wakes_the_waiters_when_its_fence_completes() {
    let pool = Arc::new(BlockPool::new(2, 16));
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(32).unwrap();
    let (w, count) = waker();
    let mut ids = Vec::new();
    let mut fut = pin!(pool.alloc(2, &mut ids));
    assert!(poll_once(fut.as_mut(), &w).is_pending());
    seq.retire(7); // still read by step 7: still in use
    assert_eq!((wakes(&count), pool.used_blocks()), (0, 2));
    assert!(poll_once(fut.as_mut(), &w).is_pending());
    pool.complete(7);
    assert_eq!((wakes(&count), pool.used_blocks()), (1, 2));
    assert!(matches!(poll_once(fut.as_mut(), &w), Poll::Ready(Ok(()))));
    assert_eq!(pool.waiters(), 0);
}

/// Blocking waiters with no timeout on a pool cut into 4 shards of 2
/// blocks, against `try_alloc` calls whose requests of 3 or 4 blocks take
/// the slow path that holds blocks in transit and gives them back when
/// refused: every give-back must reach the waiters (a lost wake-up hangs a
/// thread, which the watchdog reports). At the end the pool is whole and
/// nobody waits.
#[test]
fn blocking_waiters_on_a_sharded_pool_miss_no_wakeup() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 20_000;
    let pool = Arc::new(BlockPool::with_shards(8, 16, 4));
    let start = Arc::new(std::sync::Barrier::new(THREADS));
    let (done, finished) = std::sync::mpsc::channel();
    for t in 0..THREADS {
        let (pool, done, start) = (Arc::clone(&pool), done.clone(), Arc::clone(&start));
        thread::spawn(move || {
            start.wait();
            let mut rng = common::XorShift::new(t as u64 + 7);
            let mut ids = Vec::new();
            for _ in 0..ROUNDS {
                let n = 1 + rng.below(4);
                if rng.below(2) == 0 {
                    pool.alloc_blocking(n, &mut ids, None)
                        .expect("the pool stays open and every request fits");
                    assert_eq!(ids.len(), n, "partial grant");
                } else if pool.try_alloc(n, &mut ids).is_err() {
                    assert!(ids.is_empty(), "a refused allocation wrote ids");
                    continue;
                }
                pool.free(&ids).unwrap();
                ids.clear();
            }
            done.send(()).unwrap();
        });
    }
    drop(done);
    for _ in 0..THREADS {
        // A watchdog, not a timing assertion: a thread that has not finished
        // after this long is asleep on a wake-up that never came.
        finished
            .recv_timeout(Duration::from_secs(120))
            .expect("a waiter hung: a release did not reach the wait queue");
    }
    assert_eq!((pool.used_blocks(), pool.waiters()), (0, 0));
    assert_eq!(pool.free_blocks(), 8);
    common::assert_pool_whole(&pool);
}

/// A head that asks for headroom (`Sequence::reserve(16, 8)`: 1 block with
/// 8 free besides, 9 of a pool of 10) is owed its headroom too: a later
/// waiter queues behind it rather than take 4 of the 8 free, and the
/// `try_*` calls and a blocking call that times out say why they were
/// refused. A release that frees 9 grants the head first, then the waiter.
#[test]
fn a_later_waiter_does_not_overtake_a_headroom_head() {
    let pool = Arc::new(BlockPool::new(10, 16));
    let mut held = Vec::new();
    pool.try_alloc(2, &mut held).unwrap(); // 8 free
    let mut seq = Sequence::new(Arc::clone(&pool));
    let (head_waker, head_wakes) = waker();
    let (later_waker, later_wakes) = waker();
    let mut ids = Vec::new();
    {
        let mut head = pin!(seq.reserve(16, 8));
        assert!(poll_once(head.as_mut(), &head_waker).is_pending());
        let mut later = pin!(pool.alloc(4, &mut ids));
        assert!(
            poll_once(later.as_mut(), &later_waker).is_pending(),
            "a later waiter passed a queued head that asks for headroom"
        );
        assert_eq!((pool.waiters(), pool.used_blocks()), (2, 2));
        let behind = ReserveError::BehindWaiters {
            requested: 4,
            available: 8,
            owed: 9,
        };
        let mut other = Vec::new();
        assert_eq!(pool.try_alloc(4, &mut other), Err(behind));
        assert_eq!(
            pool.alloc_blocking(4, &mut other, Some(Duration::ZERO)),
            Err(behind)
        );
        let mut fresh = Sequence::new(Arc::clone(&pool));
        assert_eq!(
            fresh.try_reserve(16, 0),
            Err(ReserveError::BehindWaiters {
                requested: 1,
                available: 8,
                owed: 9
            })
        );
        assert!(other.is_empty() && fresh.blocks().is_empty());
        assert_eq!((pool.waiters(), pool.used_blocks()), (2, 2));
        // 9 free: the head is granted (1 block, 8 left), then the waiter.
        pool.free(&held[..1]).unwrap();
        assert_eq!((wakes(&head_wakes), wakes(&later_wakes)), (1, 1));
        assert!(matches!(
            poll_once(head.as_mut(), &head_waker),
            Poll::Ready(Ok(()))
        ));
        assert!(matches!(
            poll_once(later.as_mut(), &later_waker),
            Poll::Ready(Ok(()))
        ));
    }
    assert_eq!((seq.capacity(), ids.len(), pool.used_blocks()), (16, 4, 6));
    assert_eq!(pool.waiters(), 0);
}

/// The relay of the issue that found the starvation: a head waits (a real
/// thread, `Sequence::reserve_blocking(16, 8, None)` on a pool of 10) for
/// 1 block with 8 free besides, while this thread admits 2 new blocks with
/// `try_alloc` and then gives the previous 2 back, round after round, as
/// running requests replace each other. The relay always holds 2 blocks
/// unless an admission is refused, so the head is granted only if the
/// admissions leave it what it is owed, headroom included. Bounded by
/// rounds, not time: the head must hold its block (counted by the pool)
/// before the relay runs out of rounds.
#[test]
fn a_relay_of_small_admissions_does_not_starve_a_headroom_head() {
    const ROUNDS: usize = 1_000_000;
    for shards in [1, 2] {
        let pool = Arc::new(BlockPool::with_shards(10, 16, shards));
        let mut pair = Vec::new();
        pool.try_alloc(2, &mut pair).unwrap(); // 8 free: the head must wait
        let head = thread::spawn({
            let pool = Arc::clone(&pool);
            move || {
                let mut seq = Sequence::new(pool);
                seq.reserve_blocking(16, 8, None).map(|()| seq)
            }
        });
        common::wait_until(|| pool.waiters() == 1);
        let mut next = Vec::new();
        let mut rounds = 0;
        // Only the relay and the head hold blocks, and the relay's calls
        // are the only ones running here: the count is exact.
        while pool.used_blocks() == pair.len() && rounds < ROUNDS {
            rounds += 1;
            match pool.try_alloc(2, &mut next) {
                Ok(()) => {}
                Err(ReserveError::BehindWaiters { owed: 9, .. }) => {}
                Err(err) => panic!("the relay was refused with {err:?}"),
            }
            pool.free(&pair).unwrap();
            pair.clear();
            std::mem::swap(&mut pair, &mut next);
        }
        let starved = pool.used_blocks() == pair.len();
        pool.free(&pair).unwrap();
        let seq = head.join().unwrap().expect("the head is granted");
        assert!(
            !starved,
            "{shards} shard(s): the head starved through {rounds} admissions"
        );
        assert_eq!(seq.capacity(), 16);
        drop(seq);
        assert_eq!((pool.used_blocks(), pool.waiters()), (0, 0));
    }
}

/// A waker that panics when woken.
struct PanickingWaker;

impl Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        panic!("a waker that panics");
    }
}

fn panicking_waker() -> Waker {
    Waker::from(Arc::new(PanickingWaker))
}

/// Runs `f`, which must panic (a waker that panics, called inside it).
fn expect_panic<R>(f: impl FnOnce() -> R) {
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    assert!(out.is_err(), "the waker's panic did not reach the caller");
}

/// A release grants two waiters and the first one's waker panics out of
/// the release: both grants are counted (nothing is taken for an entry
/// that still looks pending), the second waiter is woken all the same,
/// and once everything is dropped no block is lost.
#[test]
fn a_panicking_waker_loses_no_block() {
    let pool = Arc::new(BlockPool::new(4, 16));
    let mut held = Vec::new();
    pool.try_alloc(4, &mut held).unwrap();
    let bad = panicking_waker();
    let (good, good_wakes) = waker();
    let (mut first_ids, mut second_ids) = (Vec::new(), Vec::new());
    {
        let mut first = Box::pin(pool.alloc(2, &mut first_ids));
        let mut second = Box::pin(pool.alloc(2, &mut second_ids));
        assert!(poll_once(first.as_mut(), &bad).is_pending());
        assert!(poll_once(second.as_mut(), &good).is_pending());
        expect_panic(|| pool.free(&held));
        assert_eq!((pool.used_blocks(), pool.waiters()), (4, 2));
        drop(first); // granted, never collected: its 2 blocks go back
        assert_eq!(wakes(&good_wakes), 1);
        assert!(matches!(
            poll_once(second.as_mut(), &good),
            Poll::Ready(Ok(()))
        ));
    }
    assert!(first_ids.is_empty());
    assert_eq!((second_ids.len(), pool.used_blocks()), (2, 2));
    pool.free(&second_ids).unwrap();
    assert_eq!((pool.used_blocks(), pool.waiters()), (0, 0));
    common::assert_pool_whole(&pool);
}

/// A blocking waiter granted by the same release as a task whose waker
/// panics is woken all the same (the sleepers are notified first). Bounded
/// by a generous watchdog that only a waiter left asleep runs into.
#[test]
fn a_panicking_waker_leaves_no_blocking_waiter_asleep() {
    let pool = Arc::new(BlockPool::new(4, 16));
    let mut held = Vec::new();
    pool.try_alloc(4, &mut held).unwrap();
    let mut task_ids = Vec::new();
    let mut task = Box::pin(pool.alloc(2, &mut task_ids));
    assert!(poll_once(task.as_mut(), &panicking_waker()).is_pending());
    let (done, finished) = std::sync::mpsc::channel();
    let sleeper = thread::spawn({
        let pool = Arc::clone(&pool);
        move || {
            let mut ids = Vec::new();
            let out = pool.alloc_blocking(2, &mut ids, None);
            done.send(()).unwrap();
            out.map(|()| ids)
        }
    });
    common::wait_until(|| pool.waiters() == 2);
    // The sleeper holds the queue's lock from its enqueue through its
    // first look, whose grant loop would run the task's waker on the
    // sleeper's thread had the release below come first. Another
    // waiter's enqueue takes the lock, so it comes after that look, and
    // the release's own grant loop (on this thread) wakes the task.
    {
        let mut probe_ids = Vec::new();
        let mut probe = Box::pin(pool.alloc(1, &mut probe_ids));
        let (probe_waker, _) = waker();
        assert!(poll_once(probe.as_mut(), &probe_waker).is_pending());
    }
    assert_eq!(pool.waiters(), 2);
    expect_panic(|| pool.free(&held));
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("a blocking waiter granted beside a panicking waker was never woken");
    let ids = sleeper.join().unwrap().unwrap();
    assert_eq!(ids.len(), 2);
    drop(task);
    pool.free(&ids).unwrap();
    assert_eq!((pool.used_blocks(), pool.waiters()), (0, 0));
}

/// A waker that counts its wakes and then panics.
#[derive(Default)]
struct CountsThenPanics(AtomicUsize);

impl Wake for CountsThenPanics {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
        panic!("a waker that panics");
    }
}

/// A release that grants two waiters whose wakers both panic calls both
/// (a panic does not cut the batch short) and unwinds once, with the
/// first panic; dropping the two waiters then hands their grants back,
/// and nothing is left queued or taken.
#[test]
fn a_release_whose_wakers_all_panic_wakes_every_one_and_unwinds_once() {
    let pool = Arc::new(BlockPool::new(2, 16));
    let mut held = Vec::new();
    pool.try_alloc(2, &mut held).unwrap();
    let (a_count, b_count) = (
        Arc::new(CountsThenPanics::default()),
        Arc::new(CountsThenPanics::default()),
    );
    let (a_waker, b_waker) = (
        Waker::from(Arc::clone(&a_count)),
        Waker::from(Arc::clone(&b_count)),
    );
    let (mut a_ids, mut b_ids) = (Vec::new(), Vec::new());
    let mut a = Box::pin(pool.alloc(1, &mut a_ids));
    let mut b = Box::pin(pool.alloc(1, &mut b_ids));
    assert!(poll_once(a.as_mut(), &a_waker).is_pending());
    assert!(poll_once(b.as_mut(), &b_waker).is_pending());
    expect_panic(|| pool.free(&held)); // both granted, both woken
    assert_eq!(
        (
            a_count.0.load(Ordering::SeqCst),
            b_count.0.load(Ordering::SeqCst)
        ),
        (1, 1)
    );
    assert_eq!((pool.waiters(), pool.used_blocks()), (2, 2));
    drop((a, b));
    assert!(a_ids.is_empty() && b_ids.is_empty());
    assert_eq!((pool.waiters(), pool.used_blocks()), (0, 0));
    common::assert_pool_whole(&pool);
}

/// A sequence holding 1 block of a pool of 8 (4-token blocks) asks for 32
/// tokens more: 8 blocks, which fit the pool but never beside its own
/// block. `NeverFits` at once, from the `try_*`, blocking and async forms
/// alike (with the blocks it could ever get as the capacity), nothing
/// changed; what fits beside it still succeeds; after `close`, `Closed`.
#[test]
fn a_request_that_never_fits_beside_the_sequences_own_blocks_is_never_fits() {
    let pool = Arc::new(BlockPool::new(8, 4));
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(1).unwrap();
    let before = (common::seq_snap(&seq), common::pool_snap(&pool));
    let never = |requested, capacity| ReserveError::NeverFits {
        requested,
        capacity,
    };
    assert_eq!(seq.try_reserve(32, 0), Err(never(8, 7)));
    assert_eq!(seq.try_append(32), Err(never(8, 7)));
    assert_eq!(seq.try_append_cow(32).unwrap_err(), never(8, 7));
    assert_eq!(seq.try_reserve(28, 1), Err(never(7, 7))); // 7 + 1 of headroom
    assert_eq!(seq.reserve_blocking(32, 0, None), Err(never(8, 7)));
    assert_eq!(seq.reserve_blocking(28, 1, None), Err(never(7, 7)));
    let (w, _) = waker();
    assert_eq!(
        poll_once(pin!(seq.reserve(32, 0)), &w),
        Poll::Ready(Err(never(8, 7)))
    );
    assert_eq!((common::seq_snap(&seq), common::pool_snap(&pool)), before);
    assert_eq!(pool.waiters(), 0);
    // 7 more blocks fit beside it; then the pool is all its own, and a
    // fork has no block for the copy of its partly filled tail.
    seq.try_reserve(28, 0).unwrap();
    seq.try_append(28).unwrap(); // 29 tokens in 8 blocks
    let before = (common::seq_snap(&seq), common::pool_snap(&pool));
    assert_eq!(seq.try_fork().unwrap_err(), never(1, 0));
    assert_eq!(seq.try_append(4), Err(never(1, 0)));
    assert_eq!((common::seq_snap(&seq), common::pool_snap(&pool)), before);
    pool.close();
    assert_eq!(seq.try_append(4), Err(ReserveError::Closed));
    assert_eq!(seq.reserve_blocking(32, 0, None), Err(ReserveError::Closed));
}

/// One release that grants more waiters than one batch of wakes holds (32)
/// wakes every one of them: the batch looks again after its first 32.
#[test]
fn a_release_wakes_every_waiter_it_grants_beyond_one_batch() {
    const WAITERS: usize = 70;
    let counter = SlotCounter::new(WAITERS);
    let held = counter.try_reserve(WAITERS).unwrap();
    let (w, count) = waker();
    let mut futs: Vec<_> = (0..WAITERS).map(|_| Box::pin(counter.reserve(1))).collect();
    for fut in &mut futs {
        assert!(poll_once(fut.as_mut(), &w).is_pending());
    }
    assert_eq!(counter.waiters(), WAITERS);
    drop(held);
    assert_eq!(wakes(&count), WAITERS, "a granted waiter was not woken");
    assert_eq!(counter.used(), WAITERS);
    for fut in &mut futs {
        assert!(matches!(poll_once(fut.as_mut(), &w), Poll::Ready(Ok(r)) if r.len() == 1));
    }
    assert_eq!((counter.used(), counter.waiters()), (0, 0));
}

/// A task whose waker polls its future inline, as a minimal executor may.
struct InlinePoller {
    fut: std::sync::Mutex<Option<Pin<Box<kvslots::ReserveOwned>>>>,
    got: std::sync::Mutex<Option<usize>>,
}

impl Wake for InlinePoller {
    fn wake(self: Arc<Self>) {
        let waker = Waker::from(Arc::clone(&self));
        let mut slot = self.fut.lock().unwrap();
        if let Some(fut) = slot.as_mut() {
            if let Poll::Ready(out) = poll_once(fut.as_mut(), &waker) {
                *self.got.lock().unwrap() = Some(out.unwrap().len());
                *slot = None;
            }
        }
    }
}

/// Wakers run after the queue's lock: one that polls its future inline
/// (which takes the lock to collect the grant) does not deadlock.
#[test]
fn a_waker_may_poll_inline() {
    let counter = Arc::new(SlotCounter::new(2));
    let held = counter.try_reserve_owned(2).unwrap();
    let task = Arc::new(InlinePoller {
        fut: std::sync::Mutex::new(Some(Box::pin(counter.reserve_owned(2)))),
        got: std::sync::Mutex::new(None),
    });
    let waker = Waker::from(Arc::clone(&task));
    {
        let mut slot = task.fut.lock().unwrap();
        let fut = slot.as_mut().unwrap();
        assert!(poll_once(fut.as_mut(), &waker).is_pending());
    }
    drop(held); // grants the task, whose waker collects the grant inline
    assert_eq!(*task.got.lock().unwrap(), Some(2));
    assert_eq!((counter.used(), counter.waiters()), (0, 0));
}

/// A grant pays the head what it was owed: once it is granted (its slots
/// taken for it, not collected yet), an admission that fits what is left
/// free is not held back for it.
#[test]
fn a_granted_wait_is_owed_nothing_before_it_is_collected() {
    let counter = SlotCounter::new(5);
    let mut held = counter.try_reserve(4).unwrap();
    let (w, count) = waker();
    let mut fut = Box::pin(counter.reserve(2));
    assert!(poll_once(fut.as_mut(), &w).is_pending());
    // Three slots free: the head is granted two of them.
    held.shrink_to(2);
    assert_eq!(wakes(&count), 1);
    // The third is free to anyone.
    let one = counter.try_reserve(1).unwrap();
    let Poll::Ready(Ok(granted)) = poll_once(fut.as_mut(), &w) else {
        panic!("the granted wait collects its slots");
    };
    assert_eq!(counter.used(), 5);
    drop((granted, one, held));
    assert_eq!(counter.used(), 0);
}
