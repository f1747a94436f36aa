//! Promises of the waiting machinery's docs (README's guarantees row,
//! `kvslots::implementation` "Waiting", the rustdoc of the waiting calls)
//! at their edges: panicking wakers beside granted and closed waiters, new
//! work with a prefix hit or an empty guard against a queued head, no
//! other task's waker run by a `try_*` call, and `NeverFits` only for what
//! can never fit. Polled by hand with counting wakers, so every step is
//! deterministic.

mod common;

use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Poll, Wake, Waker};

use kvslots::{hash_blocks, BlockPool, ReserveError, Sequence, SlotCounter};

use common::{poll_once, waker, wakes};

/// A waker that panics the first time it is woken, and counts later wakes
/// (an executor's waker that fails once, e.g. on a full run queue).
#[derive(Default)]
struct PanicsOnce {
    panicked: AtomicBool,
    wakes: AtomicUsize,
}

impl Wake for PanicsOnce {
    fn wake(self: Arc<Self>) {
        if !self.panicked.swap(true, Ordering::SeqCst) {
            panic!("a waker that panics once");
        }
        self.wakes.fetch_add(1, Ordering::SeqCst);
    }
}

fn expect_panic<R>(f: impl FnOnce() -> R) {
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    assert!(out.is_err(), "the waker's panic did not reach the caller");
}

/// README: "waiters are served whole, in arrival order, ... with no lost
/// wake-up; ... a waker that panics loses no block". One release grants two
/// waiters; the first one's waker panics. The first waiter is then polled
/// (say its executor polls it for another reason) and collects its grant,
/// and gives its blocks back. The second waiter was granted by the same
/// release and holds its blocks, but nothing ever wakes it: its waker went
/// back to its entry "for the next step that runs the grant loop", and with
/// nobody pending no release runs it. Its task sleeps for ever holding two
/// blocks of the pool.
#[test]
fn a_waiter_granted_beside_a_panicking_waker_is_woken() {
    let pool = Arc::new(BlockPool::new(4, 16));
    let mut held = Vec::new();
    pool.try_alloc(4, &mut held).unwrap();
    let bad = Arc::new(PanicsOnce::default());
    let bad_waker = Waker::from(Arc::clone(&bad));
    let (good, good_wakes) = waker();
    let (mut first_ids, mut second_ids) = (Vec::new(), Vec::new());
    let mut first = Box::pin(pool.alloc(2, &mut first_ids));
    let mut second = Box::pin(pool.alloc(2, &mut second_ids));
    assert!(poll_once(first.as_mut(), &bad_waker).is_pending());
    assert!(poll_once(second.as_mut(), &good).is_pending());
    // Grants both; the first waker panics out of the free.
    expect_panic(|| pool.free(&held));
    assert_eq!(pool.used_blocks(), 4, "both waiters are granted");
    // The first task runs anyway and collects its grant, then finishes.
    assert!(matches!(
        poll_once(first.as_mut(), &bad_waker),
        Poll::Ready(Ok(()))
    ));
    drop(first);
    pool.free(&first_ids).unwrap();
    // Every later release: nobody is pending, so no grant loop runs.
    let mut more = Vec::new();
    pool.try_alloc(2, &mut more).unwrap();
    pool.free(&more).unwrap();
    assert_eq!(
        wakes(&good_wakes),
        1,
        "a waiter granted by the release whose other waker panicked was never woken \
         (it holds its {} blocks, unwoken, with nobody queued)",
        pool.used_blocks()
    );
    assert!(matches!(
        poll_once(second.as_mut(), &good),
        Poll::Ready(Ok(()))
    ));
    drop(second);
    pool.free(&second_ids).unwrap();
    assert_eq!(pool.used_blocks(), 0);
}

/// The same on a `SlotCounter` with more waiters than one batch of wakes
/// holds (32): the first waker panics; every other waiter the release
/// granted must still be woken, although nobody is left pending.
#[test]
fn a_counter_release_wakes_all_it_grants_though_a_waker_panics() {
    const WAITERS: usize = 40;
    let counter = SlotCounter::new(WAITERS);
    let held = counter.try_reserve(WAITERS).unwrap();
    let bad = Waker::from(Arc::new(PanicsOnce::default()));
    let (w, count) = waker();
    let mut futs: Vec<_> = (0..WAITERS).map(|_| Box::pin(counter.reserve(1))).collect();
    assert!(poll_once(futs[0].as_mut(), &bad).is_pending());
    for fut in &mut futs[1..] {
        assert!(poll_once(fut.as_mut(), &w).is_pending());
    }
    expect_panic(|| drop(held));
    assert_eq!(counter.used(), WAITERS, "every waiter is granted");
    // The first waiter collects and releases its slot: nobody is pending,
    // so this release runs no grant loop.
    let Poll::Ready(Ok(r)) = poll_once(futs[0].as_mut(), &bad) else {
        panic!("the first waiter was granted");
    };
    drop(r);
    assert_eq!(
        wakes(&count),
        WAITERS - 1,
        "granted waiters were left unwoken after another waiter's waker panicked"
    );
}

/// Implementation, "Who gets what": "new work cannot overtake the head";
/// README: "a new caller never passes a queued waiter". A new request whose
/// prompt starts with a cached prefix that a running sequence holds matches
/// it (no admission: the blocks are shared), and its sequence then holds
/// blocks, so its first append counts as the growth of a running sequence
/// and takes the blocks the queued head is owed. A relay of such requests
/// (every prompt of a server with a shared system prompt) starves the head
/// exactly as the relay of `try_alloc` calls of issue 22 did.
#[test]
fn a_new_request_with_a_prefix_hit_does_not_pass_a_queued_head() {
    let pool = Arc::new(BlockPool::new(8, 4));
    // A running sequence holds a published 1-block system prompt.
    let system: Vec<u32> = (0..4).collect();
    let mut keys = Vec::new();
    hash_blocks(b"", &system, 4, &mut keys);
    let mut running = Sequence::new(Arc::clone(&pool));
    running.try_append(4).unwrap();
    assert_eq!(running.publish(&keys), 1);
    // Another holder takes 4 more: 3 free.
    let mut hog = Vec::new();
    pool.try_alloc(4, &mut hog).unwrap();
    // The head waits for 4 blocks: owed 4, 3 free.
    let (w, head_wakes) = waker();
    let mut head_ids = Vec::new();
    let mut head = pin!(pool.alloc(4, &mut head_ids));
    assert!(poll_once(head.as_mut(), &w).is_pending());
    assert_eq!(pool.waiters(), 1);
    // A plain new admission of 2 blocks is refused: the head is owed them.
    assert!(matches!(
        pool.try_alloc(2, &mut Vec::new()),
        Err(ReserveError::BehindWaiters { .. })
    ));
    // The same request with a prefix hit: match, then append its 8 tokens.
    let mut newcomer = Sequence::new(Arc::clone(&pool));
    assert_eq!(newcomer.try_match_prefix(&keys), 1);
    let appended = newcomer.try_append(8);
    assert!(
        matches!(appended, Err(ReserveError::BehindWaiters { .. })),
        "a new request took {} blocks owed to the queued head (its append: {appended:?}); \
         the head is left with {} free of the 4 it waits for",
        newcomer.blocks().len() - 1,
        pool.free_blocks()
    );
    // The hog lets go: the head must be granted first.
    pool.free(&hog).unwrap();
    assert_eq!(wakes(&head_wakes), 1);
}

/// `Sequence::try_match_prefix`: "The reservation was the sequence's
/// admission, so after a match into it the sequence is running while it
/// holds a block, even when the match took the place of every reserved
/// block". A request granted
/// one block (a check-only admission's first block, after a wait say)
/// whose prefix match takes that block's place is not refused behind the
/// waiters queued after it: it was admitted. The same match with no
/// reservation is new work, as above.
#[test]
fn a_match_into_a_reservation_leaves_the_sequence_admitted() {
    let pool = Arc::new(BlockPool::new(8, 4));
    let system: Vec<u32> = (0..8).collect();
    let mut keys = Vec::new();
    hash_blocks(b"", &system, 4, &mut keys);
    let mut running = Sequence::new(Arc::clone(&pool));
    running.try_append(8).unwrap();
    assert_eq!(running.publish(&keys), 2);
    // Admitted first: one block.
    let mut admitted = Sequence::new(Arc::clone(&pool));
    admitted.try_reserve(4, 0).unwrap();
    let mut hog = Vec::new();
    pool.try_alloc(3, &mut hog).unwrap(); // 2 free
    let (w, head_wakes) = waker();
    let mut head_ids = Vec::new();
    let mut head = pin!(pool.alloc(4, &mut head_ids));
    assert!(poll_once(head.as_mut(), &w).is_pending());
    // The two cached blocks take the reserved one's place (3 free: the
    // head still waits).
    assert_eq!(admitted.try_match_prefix(&keys), 2);
    assert_eq!((admitted.len(), admitted.capacity()), (8, 8));
    assert_eq!((pool.free_blocks(), wakes(&head_wakes)), (3, 0));
    let appended = admitted.try_append(4);
    assert_eq!(
        appended,
        Ok(8..12),
        "an admitted request's growth was refused"
    );
    let mut newcomer = Sequence::new(Arc::clone(&pool));
    assert_eq!(newcomer.try_match_prefix(&keys), 2);
    assert!(matches!(
        newcomer.try_append(4),
        Err(ReserveError::BehindWaiters { .. })
    ));
    assert_eq!((newcomer.len(), newcomer.blocks().len()), (8, 2));
    pool.free(&hog).unwrap();
    assert_eq!(wakes(&head_wakes), 1);
}

/// The relay form of the test above: each new request matches the cached
/// prefix and appends 2 blocks before the previous one finishes, so the
/// free count never climbs back to what the head waits for. Deterministic
/// (one thread, polled by hand), bounded by rounds: the head must be
/// granted once the first request finishes, as it is against a relay of
/// plain `try_alloc` calls.
#[test]
fn a_relay_of_prefix_hits_does_not_starve_a_queued_head() {
    const ROUNDS: usize = 1000;
    let pool = Arc::new(BlockPool::new(8, 4));
    let system: Vec<u32> = (0..4).collect();
    let mut keys = Vec::new();
    hash_blocks(b"", &system, 4, &mut keys);
    let mut running = Sequence::new(Arc::clone(&pool));
    running.try_append(4).unwrap();
    assert_eq!(running.publish(&keys), 1);
    let newcomer = |pool: &Arc<BlockPool>| {
        let mut seq = Sequence::new(Arc::clone(pool));
        assert_eq!(seq.try_match_prefix(&keys), 1);
        seq.try_append(8).map(|_| seq)
    };
    // 7 free; the first request takes 2; the head then waits for 6.
    let mut previous = newcomer(&pool).unwrap();
    let (w, head_wakes) = waker();
    let mut head_ids = Vec::new();
    let mut head = pin!(pool.alloc(6, &mut head_ids));
    assert!(poll_once(head.as_mut(), &w).is_pending());
    let mut admitted = 0;
    for _ in 0..ROUNDS {
        match newcomer(&pool) {
            Ok(next) => {
                admitted += 1;
                drop(std::mem::replace(&mut previous, next));
            }
            Err(_) => drop(std::mem::replace(
                &mut previous,
                Sequence::new(Arc::clone(&pool)),
            )),
        }
        if wakes(&head_wakes) > 0 {
            break;
        }
    }
    assert_eq!(
        wakes(&head_wakes),
        1,
        "{admitted} new requests with a prefix hit were admitted in {ROUNDS} rounds \
         while the head, owed 6 blocks, was never granted"
    );
    assert!(matches!(poll_once(head.as_mut(), &w), Poll::Ready(Ok(()))));
}

/// A waker that always panics.
struct AlwaysPanics;

impl Wake for AlwaysPanics {
    fn wake(self: Arc<Self>) {
        panic!("a waker that always panics");
    }
}

/// README: "`close` wakes every waiter". Two waiters are queued; `close`
/// wakes them, and the first one's waker panics (out of `close`). The
/// second one's waker goes back to its entry for "the next step that runs
/// the grant loop", but after `close` nothing runs it again (`owed` is 0
/// for good, and a new waiter fails at once with `Closed`): the second
/// waiter is never woken, and its task never learns that the pool closed.
#[test]
fn close_wakes_every_waiter_though_a_waker_panics() {
    let pool = Arc::new(BlockPool::new(2, 16));
    let mut held = Vec::new();
    pool.try_alloc(2, &mut held).unwrap();
    let bad = Waker::from(Arc::new(PanicsOnce::default()));
    let (good, good_wakes) = waker();
    let (mut first_ids, mut second_ids) = (Vec::new(), Vec::new());
    let mut first = Box::pin(pool.alloc(1, &mut first_ids));
    let mut second = Box::pin(pool.alloc(1, &mut second_ids));
    assert!(poll_once(first.as_mut(), &bad).is_pending());
    assert!(poll_once(second.as_mut(), &good).is_pending());
    expect_panic(|| pool.close());
    // What a closing server does next: its workers drain.
    assert_eq!(
        poll_once(first.as_mut(), &bad),
        Poll::Ready(Err(ReserveError::Closed))
    );
    drop(first);
    pool.free(&held).unwrap();
    assert_eq!(
        pool.alloc_blocking(1, &mut Vec::new(), None),
        Err(ReserveError::Closed)
    );
    assert_eq!(
        wakes(&good_wakes),
        1,
        "a waiter queued at `close` was never woken (another waiter's waker panicked)"
    );
    drop(second);
}

/// Implementation, "Where locks are taken": "Never on a `try_*` path";
/// the panic of a waker "reaches the caller whose step settled the entry
/// (a release, a poll, a drop)". A `try_alloc` that misses its home
/// shard's fast path while someone is pending gathers, and then runs the
/// wait queue's grant loop under the queue's lock (`queue.notify` in
/// `Admission::try_reserve_inner`), which wakes other tasks' granted
/// waiters from inside the `try_alloc`: here one whose waker panics, so
/// the `try_alloc` (documented to return a typed error) unwinds.
#[test]
fn a_try_alloc_runs_no_other_tasks_waker() {
    let pool = Arc::new(BlockPool::new(4, 16));
    let mut held = Vec::new();
    pool.try_alloc(4, &mut held).unwrap();
    let first_waker = Waker::from(Arc::new(PanicsOnce::default()));
    let second_waker = Waker::from(Arc::new(AlwaysPanics));
    let (w, _) = waker();
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    let mut first = Box::pin(pool.alloc(1, &mut a));
    let mut second = Box::pin(pool.alloc(1, &mut b));
    let mut third = Box::pin(pool.alloc(4, &mut c));
    assert!(poll_once(first.as_mut(), &first_waker).is_pending());
    assert!(poll_once(second.as_mut(), &second_waker).is_pending());
    assert!(poll_once(third.as_mut(), &w).is_pending());
    // Grants the first two; the first waker panics out of the free.
    expect_panic(|| pool.free(&held[..2]));
    assert_eq!(pool.waiters(), 3);
    // A new admission: refused (nothing is free, and the third waiter is
    // owed everything).
    let tried = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.try_alloc(1, &mut Vec::new())
    }));
    assert!(
        matches!(tried, Ok(Err(ReserveError::Full { .. }))),
        "try_alloc ran another task's waker (under the wait queue's grant loop) and \
         unwound with its panic"
    );
    drop((first, second, third));
    pool.free(&held[2..]).unwrap();
    assert_eq!(pool.used_blocks(), 0);
}

/// Implementation, "Who gets what": a new admission leaves `owed` free,
/// "new work cannot overtake the head"; growth is "of what a caller
/// already holds". An empty guard holds nothing: `try_reserve(0)` succeeds
/// while anyone waits (it asks nothing), and its `try_grow` is then growth
/// that ignores the queue, so a new caller takes what the head is owed.
#[test]
fn an_empty_guard_does_not_grow_past_a_queued_waiter() {
    let counter = SlotCounter::new(4);
    let held = counter.try_reserve(2).unwrap();
    let (w, _) = waker();
    let mut head = pin!(counter.reserve(3));
    assert!(poll_once(head.as_mut(), &w).is_pending());
    assert!(matches!(
        counter.try_reserve(2),
        Err(ReserveError::BehindWaiters { .. })
    ));
    let mut empty = counter.try_reserve(0).unwrap();
    let grown = empty.try_grow(2);
    assert!(
        grown.is_err(),
        "a new caller's empty guard grew by 2 past a queued waiter owed 3 (free {} of 4)",
        counter.available() + 2
    );
    drop(held);
}

/// `ReserveError::NeverFits`: "can never be admitted, so a scheduler must
/// reject it outright". A sequence's copy-on-write source counts among
/// "the blocks the sequence itself holds", but the sequence lets go of it
/// on request (`retire_copy_source` and the fence's `complete`), after
/// which the very same append fits: it was not "never". A scheduler that
/// follows the error rejects a request that would run.
#[test]
fn never_fits_is_not_reported_for_a_request_that_fits_once_the_copy_source_goes() {
    let pool = Arc::new(BlockPool::new(3, 4));
    let mut seq = Sequence::new(Arc::clone(&pool));
    seq.try_append(8).unwrap(); // 2 full blocks
    let (child, _) = seq.try_fork().unwrap();
    seq.truncate(6); // into the shared second block
    let (_, copy) = seq.try_append_cow(1).unwrap(); // copies into the third
    assert!(copy.is_some());
    drop(child);
    assert_eq!(pool.used_blocks(), 3); // 2 in the table, the copy source
    let refused = seq.try_append(2); // 9 tokens: a third block
    if let Err(ReserveError::NeverFits { .. }) = refused {
        assert_eq!(seq.retire_copy_source(1), 1);
        pool.complete(1);
        let again = seq.try_append(2);
        assert!(
            again.is_err(),
            "the append was refused as NeverFits ({refused:?}), and then fitted: {again:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// From a helper's attack: a poll that collects its outcome and then unwinds
// (its own replaced waker's drop panics after the lock), and a new waker
// whose clone runs the caller's code.
// ---------------------------------------------------------------------------

/// A waker whose drop panics (a task whose drop panics), unless the thread
/// is unwinding already.
struct PanicsOnDrop;

impl Wake for PanicsOnDrop {
    fn wake(self: Arc<Self>) {}
}

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("waker dropped");
        }
    }
}

type Parked<F> = std::sync::Mutex<Option<std::pin::Pin<Box<F>>>>;

/// A waker that polls the future parked in it inline, with a waker that
/// does nothing (a second executor thread could poll it as well), and
/// records whether that poll unwound.
struct PollsParked<F: std::future::Future + Send> {
    parked: Parked<F>,
    unwound: AtomicBool,
}

impl<F: std::future::Future + Send> Wake for PollsParked<F> {
    fn wake(self: Arc<Self>) {
        let mut parked = self.parked.lock().unwrap();
        if let Some(fut) = parked.as_mut() {
            let noop = Waker::from(Arc::new(Noop));
            let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _ = poll_once(fut.as_mut(), &noop);
            }));
            self.unwound.store(polled.is_err(), Ordering::SeqCst);
        }
    }
}

struct Noop;

impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// 40 waiters for one unit each queue on a full allocator, the first with
/// a waker that polls the 34th inline, the 34th with a waker whose drop
/// panics; then `settle` (a release of all 40, or `close`) settles them
/// all. Only 32 wakers go in the first batch, so the 34th keeps its stored
/// waker until the inline poll collects its outcome and replaces it: that
/// waker's drop, after the lock, unwinds out of the poll. Returns the
/// other 39 futures, the 34th (parked), and whether its poll unwound.
#[allow(clippy::type_complexity)]
fn poll_unwinds_after_collecting<F: std::future::Future + Send + 'static>(
    mut wait: impl FnMut() -> F,
    settle: impl FnOnce(),
) -> (Vec<std::pin::Pin<Box<F>>>, std::pin::Pin<Box<F>>, bool) {
    const N: usize = 40;
    let poller = Arc::new(PollsParked::<F> {
        parked: std::sync::Mutex::new(None),
        unwound: AtomicBool::new(false),
    });
    let noop = Waker::from(Arc::new(Noop));
    let mut others = Vec::new();
    for i in 0..N {
        let mut fut = Box::pin(wait());
        let waker = match i {
            0 => Waker::from(Arc::clone(&poller)),
            33 => Waker::from(Arc::new(PanicsOnDrop)),
            _ => noop.clone(),
        };
        assert!(poll_once(fut.as_mut(), &waker).is_pending());
        if i == 33 {
            *poller.parked.lock().unwrap() = Some(fut);
        } else {
            others.push(fut);
        }
    }
    settle();
    let parked = poller.parked.lock().unwrap().take().unwrap();
    (others, parked, poller.unwound.load(Ordering::SeqCst))
}

#[test]
fn a_poll_that_unwinds_after_collecting_its_grant_hands_it_on() {
    let counter: &'static SlotCounter = Box::leak(Box::new(SlotCounter::new(40)));
    let held = std::cell::Cell::new(Some(counter.try_reserve(40).unwrap()));
    let (others, parked, unwound) =
        poll_unwinds_after_collecting(|| counter.reserve(1), || drop(held.take()));
    assert!(
        unwound,
        "the inline poll unwound with its old waker's panic"
    );
    // The unit it collected went back, and on to nobody (all are granted).
    assert_eq!(counter.used(), 39);
    let noop = Waker::from(Arc::new(Noop));
    for mut fut in others {
        let Poll::Ready(Ok(reservation)) = poll_once(fut.as_mut(), &noop) else {
            panic!("a granted waiter resolves to its reservation");
        };
        drop(reservation);
    }
    // Done: its drop leaves nothing to cancel (it panicked on the missing
    // entry, and aborted the process where the future was dropped while
    // unwinding).
    drop(parked);
    assert_eq!((counter.used(), counter.waiters()), (0, 0));
    assert_eq!(counter.reserve_blocking(40, None).unwrap().len(), 40);
}

#[test]
fn a_poll_that_unwinds_after_collecting_its_grant_hands_the_blocks_on() {
    let pool: &'static BlockPool = Box::leak(Box::new(BlockPool::new(40, 4)));
    let mut held = Vec::new();
    pool.try_alloc(40, &mut held).unwrap();
    let held = std::cell::Cell::new(held);
    let (others, parked, unwound) = poll_unwinds_after_collecting(
        || async move {
            let mut ids = Vec::new();
            pool.alloc(1, &mut ids).await.map(|()| ids)
        },
        || pool.free(&held.take()).unwrap(),
    );
    assert!(unwound);
    assert_eq!(pool.used_blocks(), 39);
    let noop = Waker::from(Arc::new(Noop));
    for mut fut in others {
        let Poll::Ready(Ok(ids)) = poll_once(fut.as_mut(), &noop) else {
            panic!("a granted waiter resolves to its block");
        };
        pool.free(&ids).unwrap();
    }
    drop(parked);
    assert_eq!((pool.used_blocks(), pool.waiters()), (0, 0));
    let mut all = Vec::new();
    pool.try_alloc(40, &mut all).unwrap();
    pool.free(&all).unwrap();
}

#[test]
fn a_poll_that_unwinds_after_collecting_closed_is_done() {
    let counter: &'static SlotCounter = Box::leak(Box::new(SlotCounter::new(40)));
    let held = counter.try_reserve(40).unwrap();
    let (others, parked, unwound) =
        poll_unwinds_after_collecting(|| counter.reserve(1), || counter.close());
    assert!(unwound);
    let noop = Waker::from(Arc::new(Noop));
    for mut fut in others {
        assert!(matches!(
            poll_once(fut.as_mut(), &noop),
            Poll::Ready(Err(ReserveError::Closed))
        ));
    }
    drop(parked);
    drop(held);
    assert_eq!((counter.used(), counter.waiters()), (0, 0));
}

mod clone_runs_callers_code {
    use super::*;
    use kvslots::OwnedReservation;
    use std::sync::Mutex;
    use std::task::{RawWaker, RawWakerVTable};

    static ARMED: AtomicBool = AtomicBool::new(false);
    static HELD: Mutex<Option<OwnedReservation>> = Mutex::new(None);

    // SAFETY (all four): the data pointer is null and never read.
    unsafe fn clone(data: *const ()) -> RawWaker {
        if ARMED.swap(false, Ordering::SeqCst) {
            // The caller's code in the waker's clone: a release.
            drop(HELD.lock().unwrap().take());
        }
        RawWaker::new(data, &VTABLE)
    }

    unsafe fn nothing(_: *const ()) {}

    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, nothing, nothing, nothing);

    /// A re-poll with a new waker clones it; the clone ran under the
    /// queue's lock, and a clone that releases units took that lock again
    /// on the same thread: a deadlock (the test's thread never finished).
    #[test]
    fn a_new_wakers_clone_that_releases_units_runs_after_the_lock() {
        let counter = Arc::new(SlotCounter::new(2));
        let mut held = counter.try_reserve_owned(2).unwrap();
        *HELD.lock().unwrap() = Some(held.split(1).unwrap());
        let (done, finished) = std::sync::mpsc::channel();
        let waiting = Arc::clone(&counter);
        std::thread::spawn(move || {
            let mut fut = Box::pin(waiting.reserve_owned(2));
            assert!(poll_once(fut.as_mut(), &Waker::from(Arc::new(Noop))).is_pending());
            // SAFETY: the vtable's functions ignore the (null) data.
            let cloning = unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) };
            ARMED.store(true, Ordering::SeqCst);
            // The clone released one slot; one more is needed.
            let polled = poll_once(fut.as_mut(), &cloning).is_pending();
            drop(fut);
            done.send(polled).unwrap();
        });
        // A bound on a deadlock, not a timing: the poll takes microseconds.
        let polled = finished.recv_timeout(std::time::Duration::from_secs(60));
        if polled.is_err() {
            // The queue's lock is held for good: leave it be.
            std::mem::forget(held);
            std::mem::forget(counter);
            panic!("the re-poll deadlocked: the waker's clone ran under the queue's lock");
        }
        assert_eq!(polled, Ok(true));
        assert_eq!((counter.used(), counter.waiters()), (1, 0));
        drop(held);
        assert_eq!(counter.used(), 0);
    }
}

/// A waker that panics the first time it is woken (no count kept).
#[derive(Default)]
struct PanicsFirstTime(AtomicBool);

impl Wake for PanicsFirstTime {
    fn wake(self: Arc<Self>) {
        if !self.0.swap(true, Ordering::SeqCst) {
            panic!("the executor's run queue is full");
        }
    }
}

/// A task that holds `held` panics (its own bug), dropping `held` as it
/// unwinds; the task's panic is the one that comes out.
fn task_panics_holding<T>(held: T) {
    let task = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _held = held;
        panic!("the task's own bug");
    }));
    let payload = task.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"the task's own bug"));
}

/// A queued future dropped while its task unwinds (the task's own panic)
/// grants the waiter behind it, whose waker panics: that panic, resumed in
/// the drop during unwinding, aborted the process. From a helper's attack;
/// with the fault back, this test binary aborts.
#[test]
fn a_future_dropped_while_its_task_unwinds_does_not_abort() {
    let counter = Arc::new(SlotCounter::new(3));
    let held = counter.try_reserve_owned(2).unwrap(); // 1 free
    let noop = Waker::from(Arc::new(Noop));
    let panicky = Arc::new(PanicsFirstTime::default());
    let mut head = Box::pin(counter.reserve_owned(2));
    assert!(poll_once(head.as_mut(), &noop).is_pending());
    let mut behind = Box::pin(counter.reserve_owned(1));
    assert!(poll_once(behind.as_mut(), &Waker::from(Arc::clone(&panicky))).is_pending());
    // The task's panic, not the waker's, and the waker ran.
    task_panics_holding(head);
    assert!(panicky.0.load(Ordering::SeqCst));
    // `behind` was granted: its unit is its own.
    let Poll::Ready(Ok(one)) = poll_once(behind.as_mut(), &noop) else {
        panic!("the waiter behind was granted");
    };
    assert_eq!((counter.used(), counter.waiters()), (3, 0));
    drop((one, held));
    assert_eq!(counter.used(), 0);
}

/// As above, with a reservation (not a queued future) dropped as its task
/// unwinds: its release grants the waiter whose waker panics.
#[test]
fn a_reservation_dropped_while_its_task_unwinds_does_not_abort() {
    let counter = Arc::new(SlotCounter::new(2));
    let held = counter.try_reserve_owned(2).unwrap();
    let panicky = Arc::new(PanicsFirstTime::default());
    let mut waiting = Box::pin(counter.reserve_owned(2));
    assert!(poll_once(waiting.as_mut(), &Waker::from(Arc::clone(&panicky))).is_pending());
    task_panics_holding(held);
    assert!(panicky.0.load(Ordering::SeqCst));
    let noop = Waker::from(Arc::new(Noop));
    let Poll::Ready(Ok(two)) = poll_once(waiting.as_mut(), &noop) else {
        panic!("the waiter was granted");
    };
    assert_eq!((counter.used(), counter.waiters()), (2, 0));
    drop(two);
    assert_eq!(counter.used(), 0);
}

/// A panic payload whose drop panics (a second attack): the payload of a
/// waker's panic that is dropped, not resumed (here, in a reservation's
/// drop as its task unwinds), panicked again in its drop and aborted the
/// process. With the fault back, this test binary aborts.
#[test]
fn a_wakers_panic_payload_that_panics_in_its_drop_does_not_abort() {
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the payload's drop");
        }
    }
    struct ThrowsBomb;
    impl Wake for ThrowsBomb {
        fn wake(self: Arc<Self>) {
            std::panic::panic_any(Bomb);
        }
    }
    let counter = Arc::new(SlotCounter::new(1));
    let held = counter.try_reserve_owned(1).unwrap();
    let mut waiting = Box::pin(counter.reserve_owned(1));
    assert!(poll_once(waiting.as_mut(), &Waker::from(Arc::new(ThrowsBomb))).is_pending());
    task_panics_holding(held);
    let noop = Waker::from(Arc::new(Noop));
    let Poll::Ready(Ok(one)) = poll_once(waiting.as_mut(), &noop) else {
        panic!("the waiter was granted");
    };
    drop(one);
    assert_eq!((counter.used(), counter.waiters()), (0, 0));
}
