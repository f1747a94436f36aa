//! Thread-based workers: each takes requests from a shared list, reserves
//! the whole prompt's blocks, sleeping in the pool's queue until they fit
//! if they do not fit now (`Sequence::reserve_blocking`), then prefills and
//! decodes. On shutdown the pool is closed: a worker still waiting wakes
//! with `Closed`.
//!
//! Run it with `cargo run --example blocking_worker`.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use kvslots::{BlockPool, ReserveError, Sequence};

const BLOCKS: usize = 16;
const BLOCK_SIZE: usize = 16;
const WORKERS: usize = 3;
const DECODE: usize = 4;
/// What a decode step's forward pass takes here (it stands in for the
/// model), so that the workers' requests overlap and compete for blocks.
const STEP: Duration = Duration::from_millis(2);

fn main() {
    let pool = Arc::new(BlockPool::new(BLOCKS, BLOCK_SIZE));
    let requests = Arc::new(Mutex::new(vec![
        100, 40, 180, 64, 90, 120, 30, 150, 75, 60, 200, 16,
    ]));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let pool = Arc::clone(&pool);
            let requests = Arc::clone(&requests);
            thread::spawn(move || {
                let (mut served, mut waited) = (0, 0);
                loop {
                    // The list's lock is let go before the request runs, so
                    // that the workers run (and wait for blocks) at once.
                    let next = requests.lock().unwrap().pop();
                    let Some(prompt) = next else { break };
                    let mut seq = Sequence::new(Arc::clone(&pool));
                    // Sleep until the prompt fits. A request still waiting
                    // after a minute is a bug here, and fails the run.
                    let timeout = Some(Duration::from_secs(60));
                    if seq.try_reserve(prompt + DECODE, 0).is_err() {
                        waited += 1;
                        match seq.reserve_blocking(prompt + DECODE, 0, timeout) {
                            Ok(()) => {}
                            Err(ReserveError::Closed) => break,
                            Err(err) => panic!("request of {prompt} tokens: {err}"),
                        }
                    }
                    seq.try_append(prompt).unwrap();
                    for _ in 0..DECODE {
                        thread::sleep(STEP);
                        seq.try_append(1).unwrap();
                    }
                    served += 1;
                } // each sequence drops here: its blocks wake the next waiter
                (served, waited)
            })
        })
        .collect();
    let (served, waited) = workers
        .into_iter()
        .map(|w| w.join().unwrap())
        .fold((0, 0), |(s, w), (s1, w1)| (s + s1, w + w1));
    println!(
        "served {served} requests ({waited} waited in the pool's queue); peak {} of {BLOCKS} \
         blocks in use",
        pool.peak_used_blocks()
    );
    assert_eq!(served, 12);
    assert_eq!((pool.free_blocks(), pool.waiters()), (BLOCKS, 0));

    // Shutdown: a worker waiting for blocks that will not come back wakes
    // with `Closed` when the pool is closed.
    let mut held = Sequence::new(Arc::clone(&pool));
    held.try_reserve(BLOCKS * BLOCK_SIZE, 0).unwrap();
    let waiter = thread::spawn({
        let pool = Arc::clone(&pool);
        move || Sequence::new(pool).reserve_blocking(1, 0, None)
    });
    while pool.waiters() == 0 {
        thread::yield_now();
    }
    pool.close();
    assert_eq!(waiter.join().unwrap(), Err(ReserveError::Closed));
    println!("closed: the waiting worker stopped");
}
