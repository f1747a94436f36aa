//! The waiting calls under a real multi-threaded tokio runtime: thousands
//! of tasks reserving on one small counter and allocating on one small
//! pool, cancelling their waits with `select!` against timers, and giving
//! back what they got. At the end every slot and block is back and nobody
//! is queued; throughout, no more than the capacity is held (a shadow
//! count) and every grant is whole.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvslots::{BlockPool, SlotCounter};

mod common;
use common::XorShift;

/// Tasks per run, and waits per task.
const TASKS: usize = 2000;
const ROUNDS: usize = 4;
/// The counter's slots and the pool's blocks.
const CAPACITY: usize = 8;

/// Adds `n` to the shadow count of what is held and checks the capacity.
fn hold(shadow: &AtomicUsize, n: usize) {
    // SeqCst: a test-side count; any ordering that keeps the sum exact
    // would do, as each task adds after its grant and subtracts before its
    // release.
    let now = shadow.fetch_add(n, Ordering::SeqCst) + n;
    assert!(now <= CAPACITY, "overcommit: {now} held");
}

fn unhold(shadow: &AtomicUsize, n: usize) {
    // SeqCst: as in `hold`.
    shadow.fetch_sub(n, Ordering::SeqCst);
}

/// One task: `ROUNDS` waits, each on the counter or the pool, each raced
/// against a timer that cancels it when it fires first.
async fn task(
    id: usize,
    counter: Arc<SlotCounter>,
    pool: Arc<BlockPool>,
    slots: Arc<AtomicUsize>,
    blocks: Arc<AtomicUsize>,
) {
    let mut rng = XorShift::new(id as u64 + 1);
    for _ in 0..ROUNDS {
        let n = 1 + rng.below(CAPACITY / 2);
        let patience = Duration::from_micros(rng.below(200) as u64);
        match rng.below(3) {
            0 => {
                tokio::select! {
                    granted = counter.reserve(n) => {
                        let granted = granted.expect("the counter stays open");
                        assert_eq!(granted.len(), n, "partial grant");
                        hold(&slots, n);
                        tokio::task::yield_now().await;
                        unhold(&slots, n);
                    }
                    _ = tokio::time::sleep(patience) => {}
                }
            }
            1 => {
                // The owned future crosses a spawn. When the timer wins,
                // the `JoinHandle` is dropped: the task goes on waiting, and
                // its grant is dropped (given back) as soon as it resolves.
                let owned = tokio::spawn(counter.reserve_owned(n));
                tokio::select! {
                    granted = owned => {
                        let granted = granted.unwrap().expect("the counter stays open");
                        assert_eq!(granted.len(), n, "partial grant");
                        hold(&slots, n);
                        tokio::task::yield_now().await;
                        unhold(&slots, n);
                    }
                    _ = tokio::time::sleep(patience) => {}
                }
            }
            _ => {
                let mut ids = Vec::new();
                let got = tokio::select! {
                    granted = pool.alloc(n, &mut ids) => {
                        granted.expect("the pool stays open");
                        true
                    }
                    _ = tokio::time::sleep(patience) => false,
                };
                if got {
                    assert_eq!(ids.len(), n, "partial allocation");
                    hold(&blocks, n);
                    tokio::task::yield_now().await;
                    unhold(&blocks, n);
                    pool.free(&ids).unwrap();
                } else {
                    assert!(ids.is_empty(), "a cancelled allocation wrote ids");
                }
            }
        }
    }
}

#[test]
fn thousands_of_tasks_wait_cancel_and_give_everything_back() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_time()
        .build()
        .unwrap();
    let counter = Arc::new(SlotCounter::new(CAPACITY));
    let pool = Arc::new(BlockPool::new(CAPACITY, 16));
    let slots = Arc::new(AtomicUsize::new(0));
    let blocks = Arc::new(AtomicUsize::new(0));
    runtime.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|id| {
                tokio::spawn(task(
                    id,
                    Arc::clone(&counter),
                    Arc::clone(&pool),
                    Arc::clone(&slots),
                    Arc::clone(&blocks),
                ))
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    });
    // Spawned `reserve_owned` tasks whose handle was dropped still run to
    // the end: shutting the runtime down drops whatever is left.
    drop(runtime);
    assert_eq!((counter.used(), counter.waiters()), (0, 0));
    assert_eq!((pool.used_blocks(), pool.waiters()), (0, 0));
    assert_eq!(pool.free_blocks(), CAPACITY);
    assert!(counter.peak_used() <= CAPACITY);
}

#[test]
fn close_ends_every_waiting_task() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    let counter = Arc::new(SlotCounter::new(CAPACITY));
    let held = counter.try_reserve_owned(CAPACITY).unwrap();
    let tasks: Vec<_> = (0..500)
        .map(|i| runtime.spawn(counter.reserve_owned(1 + i % CAPACITY)))
        .collect();
    // Every task is queued once `waiters()` counts them all (yielding, no
    // sleep).
    while counter.waiters() != tasks.len() {
        std::thread::yield_now();
    }
    counter.close();
    for t in tasks {
        assert_eq!(
            runtime.block_on(t).unwrap().unwrap_err(),
            kvslots::ReserveError::Closed
        );
    }
    drop(held);
    assert_eq!((counter.used(), counter.waiters()), (0, 0));
}
