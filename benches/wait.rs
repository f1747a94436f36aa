//! Wake-up latency: from a release to the waiter it grants running,
//! [`SlotCounter::reserve`] against `tokio::sync::Semaphore::acquire_many`
//! on the same runtime, and [`SlotCounter::reserve_blocking`] between two
//! threads.
//!
//! One *operation* is one hand-off of a single unit between two waiters:
//! two tasks (or threads) share a capacity of 1 and loop "wait for it,
//! yield, give it back". Each give-back finds the other waiter queued (a
//! FIFO queue serves the one that has waited longest), so each operation
//! is one release waking one waiter, and criterion's time per iteration is
//! the mean hand-off latency: the release, the wake-up, the rescheduling
//! of the woken task and its poll.
//!
//! | id | wait | give back |
//! |---|---|---|
//! | `kvslots_reserve` | `counter.reserve(1).await` | drop of the guard |
//! | `tokio_semaphore` | `semaphore.acquire_many(1).await` | drop of the permit |
//! | `kvslots_reserve_blocking` | `counter.reserve_blocking(1, None)` on two threads | drop of the guard |
//!
//! The async rows run on a 2-worker multi-threaded tokio runtime. Run with
//! `cargo bench --bench wait`; figures belong in `BENCHMARKS.md`, with the
//! date, the machine and the command.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvslots::SlotCounter;
use tokio::sync::Semaphore;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap()
}

/// `iters` hand-offs between two tasks on a counter of 1.
fn kvslots_async(rt: &tokio::runtime::Runtime, iters: u64) -> Duration {
    let counter = Arc::new(SlotCounter::new(1));
    rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    for _ in 0..iters / 2 {
                        let held = counter.reserve(1).await.unwrap();
                        tokio::task::yield_now().await;
                        drop(held);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        start.elapsed()
    })
}

/// `iters` hand-offs between two tasks on a semaphore of 1 permit.
fn tokio_semaphore(rt: &tokio::runtime::Runtime, iters: u64) -> Duration {
    let semaphore = Arc::new(Semaphore::new(1));
    rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let semaphore = Arc::clone(&semaphore);
                tokio::spawn(async move {
                    for _ in 0..iters / 2 {
                        let held = semaphore.acquire_many(1).await.unwrap();
                        tokio::task::yield_now().await;
                        drop(held);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        start.elapsed()
    })
}

/// `iters` hand-offs between two threads on a counter of 1.
fn kvslots_blocking(iters: u64) -> Duration {
    let counter = Arc::new(SlotCounter::new(1));
    let start = Instant::now();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let counter = Arc::clone(&counter);
            thread::spawn(move || {
                for _ in 0..iters / 2 {
                    let held = counter.reserve_blocking(1, None).unwrap();
                    thread::yield_now();
                    drop(held);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    start.elapsed()
}

fn handoff(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("handoff");
    group.throughput(Throughput::Elements(1));
    group.bench_function("kvslots_reserve", |b| {
        b.iter_custom(|iters| kvslots_async(&rt, iters))
    });
    group.bench_function("tokio_semaphore", |b| {
        b.iter_custom(|iters| tokio_semaphore(&rt, iters))
    });
    group.bench_function("kvslots_reserve_blocking", |b| {
        b.iter_custom(kvslots_blocking)
    });
    group.finish();
}

criterion_group!(benches, handoff);
criterion_main!(benches);
