//! Loom models of waiting on a [`BlockPool`](crate::BlockPool) whose
//! admission is counted over two shards: the lost-wake-up hand-shake
//! between a waiter and a release on another shard, a waiter against a
//! slow-path admission that holds blocks in transit, and the growth of a
//! running sequence past a queued head. The checks are those of
//! `pool.rs` (shadow holder counts, conservation, a happens-before
//! witness per block; see `crate::loom_tests::pool_world`), plus: every waiter
//! ends granted all it asked for, and nobody is left queued.
//!
//! Run with `scripts/loom pool_wait`.
//!
//! A blocking waiter sleeps on loom's condition variable and an async one
//! is driven by loom's `block_on`, which parks its thread until the waker
//! runs: a blocking waiter that is never woken leaves every thread
//! blocked, which loom reports as a deadlock. (A `block_on` that is never
//! woken makes loom abort the test process while it unwinds, so the
//! negative controls use blocking waiters; the async waiters run in the
//! sound models.)
//!
//! Threads are numbered in the order they first admit or release blocks
//! (their home shard is that number modulo 2). The main thread allocates
//! before it spawns anyone, so it is thread 0 (home shard 0); in the
//! two-thread model the releaser is thread 1 (home shard 1).
//!
//! Two properties of loom shape the lost-wake-up model. A refused gather
//! yields between its passes (`stale_retry`), and loom runs a yielded
//! thread only once every other thread is blocked or has yielded too: a
//! releaser that is simply running would finish its release in the
//! waiter's first yield, before the waiter queues. And after a thread
//! yields, loom no longer lets it read a value it had already read before
//! the yield once a newer one exists. So the releaser of
//! [`release_on_other_shard`] first spins (yielding) on a `Relaxed` flag
//! that the waiter sets as it starts, and is a thread that has never read
//! `owed` before: then loom reaches the store-buffering schedule that the
//! hand-shake exists to exclude.
//!
//! | model | threads, blocks | preemptions | fault caught |
//! |---|---|---|---|
//! | [`release_on_other_shard`] | 2, 2 | 2 | `late_enqueue` (deadlock, blocking waiter, with and without `after_start`), `unfenced_wait` (deadlock, blocking waiter, `after_start`); the async waiters share the shape and its controls |
//! | [`waiter_vs_gather_in_transit`] | 3, 2 | 1 | `quiet_gather` (deadlock) |
//! | [`growth_past_queued_head`] | 1, 3 | - | `growth_waits` (growth refused) |
//! | [`headroom_head_against_relay`] | 3, 4 | 2 | `owed_without_headroom` (head starved) |
//! | [`panicking_waker_against_releases`] | 2, 2 | 2 | `wake_before_count` (blocks not conserved) |
//! | [`panicking_waker_beside_a_granted_waiter`] | 2, 2 | 2 | `panic_cuts_batch` (lost wakeup) |
//! | [`gather_unwound_by_a_waker`] | 3, 2 | 2 | `panic_keeps_admission` (blocks not conserved) |

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use crate::loom_tests::pool_world::{
    check, Allocs, PoolWorld, GROWTH_WAITS, LATE_ENQUEUE, OWED_WITHOUT_HEADROOM, PANIC_CUTS_BATCH,
    PANIC_KEEPS_ADMISSION, QUIET_GATHER, SOUND, UNFENCED_WAIT, WAKE_BEFORE_COUNT,
};
use crate::loom_tests::Flag;
use crate::sync::{AtomicBool, Faults, Ordering};
use crate::{BlockId, ReserveError, Sequence};
use loom::thread;

/// A pool of `num_blocks` one-slot blocks over two shards.
fn new_world(num_blocks: usize, faults: Faults) -> Arc<PoolWorld> {
    PoolWorld::with_shards(num_blocks, 1, 2, faults, "thread")
}

/// How a model's waiter waits.
#[derive(Debug, Clone, Copy)]
enum Way {
    /// `alloc_blocking` with no timeout.
    Blocking,
    /// The `alloc` future, driven by loom's `block_on`.
    Async,
}

/// Waits for `n` blocks the way `way` says; they must all come (the pool
/// is never closed in these models). Each is taken in the shadow and its
/// payload written.
fn wait_for(world: &PoolWorld, n: usize, way: Way) -> Vec<BlockId> {
    let mut ids = Vec::new();
    let result = match way {
        Way::Blocking => world.pool.alloc_blocking(n, &mut ids, None),
        Way::Async => loom::future::block_on(world.pool.alloc(n, &mut ids)),
    };
    assert_eq!(result, Ok(()), "a waiter was not granted");
    assert_eq!(ids.len(), n, "partial grant");
    for &id in &ids {
        world.take(id);
        world.write(id);
    }
    ids
}

/// Checks the end state: nobody queued, and every block back.
fn assert_drained(world: &PoolWorld) {
    assert_eq!(world.pool.waiters(), 0, "a waiter was left queued");
    world.assert_conserved_and_bounded();
}

/// A release on the other shard than the waiter's home, over a pool of 2
/// (one count in each shard). The main thread (home shard 0) takes both
/// blocks, hands one to a releaser thread (home shard 1), and waits for one
/// block; the releaser frees its block, so its count goes back to shard 1,
/// which the waiter's fast path never looks at. Whatever the order, the
/// waiter must be granted: its attempt after queueing sees the count, or
/// the release sees it queued. With `after_start` the releaser first
/// spins until the waiter has started (see the module doc).
///
/// Under `unfenced_wait` the waiter skips its read-modify-write of the
/// shards' words after publishing what it is owed: its attempt can read
/// shard 1 as it was before the release while the releaser's `Relaxed`
/// load of `owed` reads the 0 from before the enqueue, and the waiter
/// sleeps for ever. Under `late_enqueue` the waiter does not try again
/// once queued, and a release between its refused attempt and its enqueue
/// wakes nobody.
fn release_on_other_shard(faults: Faults, way: Way, after_start: bool) {
    check(move || {
        let world = new_world(2, faults);
        let mut held = world.alloc(2).expect("a fresh pool of 2");
        let freed = held.split_off(1);
        let started = Arc::new(AtomicBool::new(false));
        let releaser = {
            let world = Arc::clone(&world);
            let started = Arc::clone(&started);
            thread::spawn(move || {
                if after_start {
                    // Relaxed: the flag must add no happens-before edge
                    // between the two threads.
                    while !started.load(Ordering::Relaxed) {
                        thread::yield_now();
                    }
                }
                world.give_back(&freed);
            })
        };
        // Relaxed: see the releaser's load.
        started.store(true, Ordering::Relaxed);
        let ids = wait_for(&world, 1, way);
        world.give_back(&ids);
        releaser.join().unwrap();
        world.give_back(&held);
        assert_drained(&world);
    });
}

#[test]
fn release_on_other_shard_blocking_sound() {
    release_on_other_shard(SOUND, Way::Blocking, false);
}

#[test]
fn release_on_other_shard_async_sound() {
    release_on_other_shard(SOUND, Way::Async, false);
}

#[test]
fn release_on_other_shard_after_start_blocking_sound() {
    release_on_other_shard(SOUND, Way::Blocking, true);
}

#[test]
fn release_on_other_shard_after_start_async_sound() {
    release_on_other_shard(SOUND, Way::Async, true);
}

#[test]
#[should_panic(expected = "deadlock")]
fn release_on_other_shard_blocking_late_enqueue_is_caught() {
    release_on_other_shard(LATE_ENQUEUE, Way::Blocking, false);
}

#[test]
#[should_panic(expected = "deadlock")]
fn release_on_other_shard_after_start_blocking_late_enqueue_is_caught() {
    release_on_other_shard(LATE_ENQUEUE, Way::Blocking, true);
}

#[test]
#[should_panic(expected = "deadlock")]
fn release_on_other_shard_after_start_blocking_unfenced_wait_is_caught() {
    release_on_other_shard(UNFENCED_WAIT, Way::Blocking, true);
}

/// A waiter against a gather in transit, over a pool of 2. The main thread
/// takes one block and lends it to a freer thread, which frees it; a
/// gatherer thread asks for both with `try_alloc` (its home shard has at
/// most one, so it gathers, holding what it finds in transit, and gives
/// it all back when refused); the main thread waits for both (blocking).
/// Every block is free once the freer and the gatherer are done, so the
/// waiter must end granted both.
///
/// Under `quiet_gather` a refused gather gives its blocks back without
/// re-checking the waiters. A schedule that loses the wake-up (one
/// preemption): the
/// waiter queues and sleeps; the gatherer takes the free block into
/// transit, and its second pass finds nothing new, so it decides to
/// refuse; the freer frees the lent block and runs the grant loop, which
/// finds one block free (the other is in transit) and grants nothing; the
/// gatherer gives its block back and returns `Full`, waking nobody. Both
/// blocks are free and the waiter sleeps for ever.
fn waiter_vs_gather_in_transit(faults: Faults) {
    crate::loom_tests::check_bounded(1, move || {
        let world = new_world(2, faults);
        let lent = world.alloc(1).expect("1 of a fresh pool of 2");
        let freer = {
            let world = Arc::clone(&world);
            thread::spawn(move || world.give_back(&lent))
        };
        let gatherer = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                if let Ok(ids) = world.alloc(2) {
                    world.give_back(&ids);
                }
            })
        };
        let ids = wait_for(&world, 2, Way::Blocking);
        world.give_back(&ids);
        freer.join().unwrap();
        gatherer.join().unwrap();
        assert_drained(&world);
    });
}

#[test]
fn waiter_vs_gather_in_transit_sound() {
    waiter_vs_gather_in_transit(SOUND);
}

#[test]
#[should_panic(expected = "deadlock")]
fn waiter_vs_gather_in_transit_quiet_gather_is_caught() {
    waiter_vs_gather_in_transit(QUIET_GATHER);
}

/// A waker that does nothing: the single-threaded model polls by hand.
struct Nobody;

impl Wake for Nobody {
    fn wake(self: Arc<Self>) {}
}

/// What the growth model reports when a running sequence's append is
/// refused behind a queued head.
const GROWTH_REFUSED: &str = "growth refused behind a queued head";

/// The growth of a running sequence past a queued head, over a pool of 3,
/// in one thread. A sequence takes one block; an `alloc` of all 3 is
/// polled once and queues (2 are free, the head is owed 3). A new
/// admission (an empty sequence's first append) must be refused, leaving
/// the head what it is owed; the running sequence's next append is
/// growth, which does not wait behind admissions, and must succeed. Once
/// the sequence is dropped, the waiter's next poll must resolve with all
/// 3 blocks.
///
/// Under `growth_waits` the growth leaves the head what it is owed too,
/// and is refused.
fn growth_past_queued_head(faults: Faults) {
    crate::loom_tests::check(move || {
        let world = new_world(3, faults);
        let mut running = Sequence::new(Arc::clone(&world.pool));
        running.try_append(1).expect("1 of a fresh pool of 3");
        let waker = Waker::from(Arc::new(Nobody));
        let mut cx = Context::from_waker(&waker);
        let mut ids = Vec::new();
        // The future is dropped before any assertion on what happened
        // while it was queued, so that a failed model unwinds without
        // touching the queue.
        let mut waiting = Box::pin(world.pool.alloc(3, &mut ids));
        let queued = waiting.as_mut().poll(&mut cx).is_pending();
        let waiters = world.pool.waiters();
        let admitted = Sequence::new(Arc::clone(&world.pool)).try_append(1);
        let grown = running.try_append(1);
        let grown_blocks = running.blocks().len();
        drop(running);
        let granted = waiting.as_mut().poll(&mut cx);
        drop(waiting);
        assert!(queued, "all 3 granted while 1 was held");
        assert_eq!(waiters, 1, "the waiter did not queue");
        assert!(
            matches!(admitted, Err(ReserveError::BehindWaiters { owed: 3, .. })),
            "a new admission took what the queued head is owed: {admitted:?}"
        );
        assert!(grown.is_ok(), "{GROWTH_REFUSED}: {grown:?}");
        assert_eq!(grown_blocks, 2, "growth took the wrong count");
        assert_eq!(
            granted,
            Poll::Ready(Ok(())),
            "the head was not granted once every block was free"
        );
        assert_eq!(ids.len(), 3, "partial grant");
        world.pool.free(&ids).expect("freeing the granted blocks");
        assert_drained(&world);
    });
}

#[test]
fn growth_past_queued_head_sound() {
    growth_past_queued_head(SOUND);
}

#[test]
#[should_panic(expected = "growth refused behind a queued head")]
fn growth_past_queued_head_growth_waits_is_caught() {
    growth_past_queued_head(GROWTH_WAITS);
}

/// Polls `fut` once with `waker`.
fn poll_with<F: Future + ?Sized>(fut: std::pin::Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(waker))
}

/// What the relay model reports when the head is still waiting after the
/// relays' rounds.
const STARVED: &str = "head starved by a relay of small admissions";

/// A head that asks for headroom against a relay of small admissions,
/// over a pool of 4. The main thread lends one block to each of two relay
/// threads and queues a head for 1 block with 3 of headroom (all 4 free
/// at its grant: a `Sequence::reserve` polled once, pending while the
/// relays hold their blocks). Each relay then makes one round of "admit 1
/// new block with `try_alloc`, then give the block it held back", as
/// running requests replace each other, while the main thread polls the
/// head again. A relay holds a block at every instant unless its
/// admission is refused, so the head can be granted during the rounds
/// only if the admissions leave it all it is owed, headroom included: once
/// both rounds are done, and before the relays give their last blocks
/// back, the head must have been woken (granted). Then everything is given
/// back and the head's next poll must resolve with its block.
///
/// Under `owed_without_headroom` the queue tells admissions to leave only
/// the head's 1 block: both relay admissions succeed (2 free), each relay
/// still holds a block after its round, and the head, needing 4 free,
/// starves.
fn headroom_head_against_relay(faults: Faults) {
    check(move || {
        let world = new_world(4, faults);
        let lent = world.alloc(2).expect("2 of a fresh pool of 4");
        let flag = Arc::new(Flag::default());
        let waker = Waker::from(Arc::clone(&flag));
        let mut head = Sequence::new(Arc::clone(&world.pool));
        let mut pending = Box::pin(head.reserve(1, 3));
        assert!(
            poll_with(pending.as_mut(), &waker).is_pending(),
            "the head was granted with blocks held"
        );
        let relays: Vec<_> = lent
            .iter()
            .map(|&id| {
                let world = Arc::clone(&world);
                thread::spawn(move || {
                    let next = world.alloc(1).unwrap_or_default();
                    world.give_back(&[id]);
                    next
                })
            })
            .collect();
        let early = poll_with(pending.as_mut(), &waker);
        let held: Vec<Vec<BlockId>> = relays.into_iter().map(|r| r.join().unwrap()).collect();
        let granted_during_relay = flag.was_woken();
        for ids in &held {
            world.give_back(ids);
        }
        let granted = match early {
            Poll::Ready(out) => Some(out),
            Poll::Pending => match poll_with(pending.as_mut(), &waker) {
                Poll::Ready(out) => Some(out),
                Poll::Pending => None,
            },
        };
        drop(pending);
        assert!(granted_during_relay, "{STARVED}");
        assert_eq!(granted, Some(Ok(())), "the head was not granted");
        assert_eq!(head.blocks().len(), 1, "partial grant");
        for &id in head.blocks() {
            world.take(id);
            world.write(id);
            world.drop_ref(id);
        }
        drop(head);
        assert_drained(&world);
    });
}

#[test]
fn headroom_head_against_relay_sound() {
    headroom_head_against_relay(SOUND);
}

#[test]
#[should_panic(expected = "head starved by a relay of small admissions")]
fn headroom_head_against_relay_owed_without_headroom_is_caught() {
    headroom_head_against_relay(OWED_WITHOUT_HEADROOM);
}

/// What the waker of [`panicking_waker_against_releases`] panics with.
const WAKER_PANIC: &str = "a waker that panics (modelled)";

/// A waker that panics when woken.
struct Panics;

impl Wake for Panics {
    fn wake(self: Arc<Self>) {
        panic!("{WAKER_PANIC}");
    }
}

/// Keeps the default panic hook from printing the modelled waker's panic
/// at every execution (other panics print as usual).
fn quiet_waker_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<String>().map(String::as_str) != Some(WAKER_PANIC) {
                previous(info);
            }
        }));
    });
}

/// Runs `f`, which may panic with the modelled waker's panic (and with
/// nothing else).
fn tolerate_waker_panic(f: impl FnOnce()) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        let message = payload.downcast_ref::<String>().map(String::as_str);
        assert_eq!(message, Some(WAKER_PANIC), "an unexpected panic");
    }
}

/// A waker that panics, over a pool of 2, both blocks held by the main
/// thread. Two async waiters for 1 block each are polled once: the first
/// with a waker that panics, the second with one that sets a flag. A
/// releaser thread frees one block while the main thread frees the other;
/// each free runs the grant loop, and a free whose loop wakes the first
/// waiter unwinds with its panic (caught there). Then the first waiter is
/// dropped (whatever it was granted goes back), the second must have been
/// woken and resolve with its block, and every block must come back.
///
/// Under `wake_before_count` the grant loop wakes the first waiter before
/// it counts the grant: the panic leaves a block taken for an entry that
/// still looks pending (and the next loop takes another for it), and the
/// first waiter's drop gives nothing back.
fn panicking_waker_against_releases(faults: Faults) {
    quiet_waker_panics();
    check(move || {
        let world = new_world(2, faults);
        let held = world.alloc(2).expect("a fresh pool of 2");
        let (mut first_ids, mut second_ids) = (Vec::new(), Vec::new());
        let panics = Waker::from(Arc::new(Panics));
        let flag = Arc::new(Flag::default());
        let flagged = Waker::from(Arc::clone(&flag));
        let mut first = Box::pin(world.pool.alloc(1, &mut first_ids));
        let mut second = Box::pin(world.pool.alloc(1, &mut second_ids));
        assert!(poll_with(first.as_mut(), &panics).is_pending());
        assert!(poll_with(second.as_mut(), &flagged).is_pending());
        let releaser = {
            let world = Arc::clone(&world);
            let freed = held[1..].to_vec();
            thread::spawn(move || tolerate_waker_panic(|| world.give_back(&freed)))
        };
        tolerate_waker_panic(|| world.give_back(&held[..1]));
        releaser.join().unwrap();
        tolerate_waker_panic(|| drop(first));
        let woken = flag.was_woken();
        let outcome = poll_with(second.as_mut(), &flagged);
        drop(second);
        for &id in &second_ids {
            world.take(id);
            world.write(id);
        }
        if outcome.is_ready() {
            world.give_back(&second_ids);
        }
        assert!(first_ids.is_empty(), "a dropped waiter wrote ids");
        assert_drained(&world);
        assert!(woken, "lost wakeup: the second waiter was never woken");
        assert_eq!(
            outcome,
            Poll::Ready(Ok(())),
            "the second waiter was not granted"
        );
    });
}

#[test]
fn panicking_waker_against_releases_sound() {
    panicking_waker_against_releases(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn panicking_waker_against_releases_wake_before_count_is_caught() {
    panicking_waker_against_releases(WAKE_BEFORE_COUNT);
}

/// A waker that panics beside a waiter granted by the same release, over
/// a pool of 2 held by the main thread: two async waiters for 1 block
/// each, the first polled with a waker that panics, the second with one
/// that sets a flag; a releaser thread frees one block while the main
/// thread frees the other. When one grant loop grants both (both blocks
/// back before either loop runs), the first waker's panic must not keep
/// the second from being woken. Then the first waiter collects its grant
/// (its task polled for another reason) and gives its block back: with
/// nobody pending no grant loop runs any more, so a wake skipped earlier
/// would never come. The second waiter must have been woken, and resolve
/// with its block.
///
/// Under `panic_cuts_batch` a panicking waker drops the rest of its batch
/// uncalled: the second waiter, granted in the same batch, is never woken.
fn panicking_waker_beside_a_granted_waiter(faults: Faults) {
    quiet_waker_panics();
    check(move || {
        let world = new_world(2, faults);
        let held = world.alloc(2).expect("a fresh pool of 2");
        let (mut first_ids, mut second_ids) = (Vec::new(), Vec::new());
        let panics = Waker::from(Arc::new(Panics));
        let flag = Arc::new(Flag::default());
        let flagged = Waker::from(Arc::clone(&flag));
        let mut first = Box::pin(world.pool.alloc(1, &mut first_ids));
        let mut second = Box::pin(world.pool.alloc(1, &mut second_ids));
        assert!(poll_with(first.as_mut(), &panics).is_pending());
        assert!(poll_with(second.as_mut(), &flagged).is_pending());
        let releaser = {
            let world = Arc::clone(&world);
            let freed = held[1..].to_vec();
            thread::spawn(move || tolerate_waker_panic(|| world.give_back(&freed)))
        };
        tolerate_waker_panic(|| world.give_back(&held[..1]));
        releaser.join().unwrap();
        // Both are granted by now: the first collects and gives back.
        assert_eq!(
            poll_with(first.as_mut(), &panics),
            Poll::Ready(Ok(())),
            "the first waiter was not granted"
        );
        drop(first);
        for &id in &first_ids {
            world.take(id);
            world.write(id);
        }
        world.give_back(&first_ids);
        let woken = flag.was_woken();
        let outcome = poll_with(second.as_mut(), &flagged);
        drop(second);
        for &id in &second_ids {
            world.take(id);
            world.write(id);
        }
        if outcome.is_ready() {
            world.give_back(&second_ids);
        }
        assert_drained(&world);
        assert!(woken, "lost wakeup: the second waiter was never woken");
        assert_eq!(
            outcome,
            Poll::Ready(Ok(())),
            "the second waiter was not granted"
        );
    });
}

#[test]
fn panicking_waker_beside_a_granted_waiter_sound() {
    panicking_waker_beside_a_granted_waiter(SOUND);
}

#[test]
#[should_panic(expected = "lost wakeup: the second waiter was never woken")]
fn panicking_waker_beside_a_granted_waiter_panic_cuts_batch_is_caught() {
    panicking_waker_beside_a_granted_waiter(PANIC_CUTS_BATCH);
}

/// A `try_alloc` whose gather runs the grant loop that wakes a waker that
/// panics, over a pool of 2 over two shards, both blocks held by the main
/// thread (home shard 0). An async waiter for 1 block is polled once with a
/// waker that panics. A freer thread gives both blocks back while a
/// gatherer thread (home shard 0 or 1) calls `try_alloc(1)`: leaving the
/// waiter its block, it needs 2, more than one shard holds, so it
/// gathers, and the grant loop it then runs may grant the waiter and
/// unwind with the waker's panic. A call that unwinds must have taken
/// nothing, one that returns `Ok` its block; once the waiter is dropped
/// (what it was granted goes back), every block must be back.
///
/// Under `panic_keeps_admission` the gather keeps its admission when the
/// grant loop unwinds: the call leaves with a block admitted and never
/// taken, lost to every later admission.
fn gather_unwound_by_a_waker(faults: Faults) {
    quiet_waker_panics();
    check(move || {
        let world = new_world(2, faults);
        let held = world.alloc(2).expect("a fresh pool of 2");
        let mut waiter_ids = Vec::new();
        let mut waiter = Box::pin(world.pool.alloc(1, &mut waiter_ids));
        let panics = Waker::from(Arc::new(Panics));
        assert!(poll_with(waiter.as_mut(), &panics).is_pending());
        let freer = {
            let world = Arc::clone(&world);
            thread::spawn(move || tolerate_waker_panic(|| world.give_back(&held)))
        };
        let gatherer = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                let mut ids = Vec::new();
                let mut result = None;
                tolerate_waker_panic(|| result = Some(world.pool.try_alloc(1, &mut ids)));
                match result {
                    Some(Ok(())) => {
                        assert_eq!(ids.len(), 1, "partial grant");
                        world.take(ids[0]);
                        world.write(ids[0]);
                        world.give_back(&ids);
                    }
                    // Refused, or unwound: nothing taken.
                    _ => assert!(ids.is_empty(), "a refused call wrote ids"),
                }
            })
        };
        freer.join().unwrap();
        gatherer.join().unwrap();
        tolerate_waker_panic(|| drop(waiter));
        assert_drained(&world);
    });
}

#[test]
fn gather_unwound_by_a_waker_sound() {
    gather_unwound_by_a_waker(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn gather_unwound_by_a_waker_panic_keeps_admission_is_caught() {
    gather_unwound_by_a_waker(PANIC_KEEPS_ADMISSION);
}
