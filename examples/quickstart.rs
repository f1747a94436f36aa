//! Several inference workers admit multi-token appends against one shared
//! `SlotCounter`; each request is admitted whole or refused whole, and the
//! example prints what was admitted, what was refused and why.
//!
//! Run it with `cargo run --release --example quickstart`.

use std::sync::{Arc, Barrier};
use std::thread;

use kvslots::{ReserveError, SlotCounter};

/// Token slots in the (deliberately tiny) KV cache.
const CAPACITY: usize = 64;
/// Worker threads.
const WORKERS: usize = 4;

/// What one worker asks for, in order: prefill chunks, speculative drafts,
/// and one request larger than the whole cache.
const REQUESTS: [[usize; 4]; WORKERS] = [
    [12, 4, 4, 100],
    [20, 8, 1, 3],
    [16, 16, 2, 5],
    [9, 7, 30, 1],
];

#[derive(Default)]
struct Tally {
    admitted: usize,
    admitted_slots: usize,
    full: usize,
    never_fits: usize,
    log: Vec<String>,
}

fn main() {
    let counter = Arc::new(SlotCounter::new(CAPACITY));
    // Start every worker at once, so that their appends really race, and
    // hold every guard until all workers are done asking, so that the 138
    // slots of the requests that can fit (238 asked for in all, with the
    // one of 100) compete for the 64 there are.
    let start = Arc::new(Barrier::new(WORKERS));
    let done = Arc::new(Barrier::new(WORKERS));

    let handles: Vec<_> = REQUESTS
        .iter()
        .enumerate()
        .map(|(worker, requests)| {
            let counter = Arc::clone(&counter);
            let start = Arc::clone(&start);
            let done = Arc::clone(&done);
            let requests = *requests;
            thread::spawn(move || {
                let mut tally = Tally::default();
                // Guards held by this worker's running sequences.
                let mut running = Vec::new();
                start.wait();
                for n in requests {
                    match counter.try_reserve_owned(n) {
                        Ok(guard) => {
                            tally.admitted += 1;
                            tally.admitted_slots += n;
                            tally
                                .log
                                .push(format!("worker {worker}: admitted {n:>3} slots"));
                            running.push(guard);
                        }
                        Err(err @ ReserveError::Full { .. }) => {
                            tally.full += 1;
                            tally
                                .log
                                .push(format!("worker {worker}: refused  {n:>3} slots: {err}"));
                        }
                        Err(err) => {
                            tally.never_fits += 1;
                            tally
                                .log
                                .push(format!("worker {worker}: rejected {n:>3} slots: {err}"));
                        }
                    }
                    assert!(counter.used() <= counter.capacity());
                }
                done.wait();
                // Speculative rollback: keep only the first token of the
                // last admitted append.
                if let Some(last) = running.last_mut() {
                    last.shrink_to(1);
                }
                tally
                // `running` is dropped here: every slot goes back.
            })
        })
        .collect();

    let tallies: Vec<Tally> = handles
        .into_iter()
        .map(|h| h.join().expect("worker panicked"))
        .collect();

    println!("kvslots quickstart: {WORKERS} workers, one SlotCounter of {CAPACITY} slots\n");
    for tally in &tallies {
        for line in &tally.log {
            println!("  {line}");
        }
    }
    let admitted: usize = tallies.iter().map(|t| t.admitted).sum();
    let slots: usize = tallies.iter().map(|t| t.admitted_slots).sum();
    let full: usize = tallies.iter().map(|t| t.full).sum();
    let never: usize = tallies.iter().map(|t| t.never_fits).sum();
    println!();
    println!("admitted:  {admitted} requests, {slots} slots in all (each whole)");
    println!("refused:   {full} (Full: retry once others release)");
    println!("rejected:  {never} (NeverFits: larger than the whole cache)");
    println!(
        "peak used: {} of {} slots; used now: {}",
        counter.peak_used(),
        counter.capacity(),
        counter.used()
    );
    assert_eq!(counter.used(), 0, "every guard gave its slots back");
    assert!(counter.peak_used() <= counter.capacity());
}
