//! How long a cache line takes to move between two cores of this machine:
//! two threads hand a counter back and forth through one cache-padded
//! atomic, and the mean one-way handoff is printed in nanoseconds.
//!
//! A lock-free pool moves more cache lines between cores per call than a
//! locked one (each block's state word, the index's buckets, the eviction
//! ring's positions), so its figures beside a lock depend on this number:
//! on a virtual machine whose cores the host places near each other (a
//! shared last-level cache) a handoff takes tens of nanoseconds, on cores
//! far apart a few hundred. Run it before and after a benchmark to know
//! which one the benchmark had:
//!
//! ```text
//! cargo run --release -p kvslots-sim --example core_latency [ROUNDS]
//! ```
//!
//! The threads are not pinned (the host may move them; that is what the
//! probe measures). A thread that waits long gives up its time slice, so
//! the probe ends on a machine with one core too.

use std::hint::spin_loop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Instant;

/// One cache line of its own.
#[repr(align(128))]
struct Padded(AtomicU64);

/// Spins before a waiting thread yields its time slice.
const SPINS_BEFORE_YIELD: u32 = 1 << 14;

/// Waits until `cell` holds `value`.
fn wait_for(cell: &AtomicU64, value: u64) {
    let mut spins = 0u32;
    // Acquire: the handoff is the store below on the other thread; nothing
    // else is handed over, but it keeps the probe's loads in order.
    while cell.load(Ordering::Acquire) != value {
        spins += 1;
        if spins < SPINS_BEFORE_YIELD {
            spin_loop();
        } else {
            thread::yield_now();
        }
    }
}

/// The most rounds a run takes: enough for any measurement (2^33 handoffs
/// take minutes at best), and far from `2 * round + 1` overflowing.
const MAX_ROUNDS: u64 = 1 << 32;

const USAGE: &str = "usage: core_latency [ROUNDS]\n\n\
    Measures the mean one-way handoff of a cache line between two threads.\n\
    ROUNDS: round trips to time, an integer in 1..=4294967296 (default 200000)";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds: u64 = match args.as_slice() {
        [] => 200_000,
        [flag] if flag == "-h" || flag == "--help" => {
            println!("{USAGE}");
            return;
        }
        [n] => match n.parse() {
            Ok(n) if (1..=MAX_ROUNDS).contains(&n) => n,
            _ => {
                eprintln!("core_latency: bad ROUNDS {n:?}\n{USAGE}");
                std::process::exit(2);
            }
        },
        _ => {
            eprintln!("core_latency: too many arguments\n{USAGE}");
            std::process::exit(2);
        }
    };
    let cell = Padded(AtomicU64::new(0));
    let start = Instant::now();
    thread::scope(|s| {
        for parity in 0..2u64 {
            let cell = &cell.0;
            s.spawn(move || {
                for round in 0..rounds {
                    wait_for(cell, 2 * round + parity);
                    // Release: pairs with the other thread's Acquire wait.
                    cell.store(2 * round + parity + 1, Ordering::Release);
                }
            });
        }
    });
    let handoffs = 2 * rounds;
    let ns = start.elapsed().as_nanos() as f64 / handoffs as f64;
    println!("{ns:.0} ns a handoff ({handoffs} handoffs between two threads)");
}
