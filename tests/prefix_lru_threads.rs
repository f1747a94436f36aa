//! The eviction order under real threads: least recently released first,
//! also while one thread refills the eviction ring and others evict.
//!
//! Requests take turns over [`WARM`] warm prefixes (request `r` matches
//! prefix `r % WARM`, [`PREFIX`] blocks) and each appends [`COLD`] blocks
//! of keys of its own after it, publishes them and lets go. The pool is
//! full of cached blocks, so every request evicts. A warm prefix comes
//! back every `WARM` requests, while a released block stays the youngest
//! `BLOCKS / COLD` requests or so before it becomes the least recently
//! released: in least recently released order no warm block is ever
//! evicted, and every use of a warm prefix after its first hits it whole.
//! With one request at a time that is exact; with two workers taking
//! requests from a shared cursor it must hold nearly as well for every
//! request whose prefix's previous use has finished (see [`run`] and
//! [`check`]). An evictor that took blocks in another order (a sweep in
//! index order while another thread refilled the ring, a block released
//! during a refill's scan ranked as the oldest, a slot read after a refill
//! began to rewrite it) evicts warm blocks, and later requests miss them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use kvslots::{BlockHash, BlockPool, Sequence};

/// Blocks in the pool.
const BLOCKS: usize = 16_384;
/// Tokens per block.
const BS: usize = 16;
/// Warm prefixes.
const WARM: usize = 32;
/// Blocks of a warm prefix.
const PREFIX: usize = 32;
/// Fresh blocks each request appends after its prefix.
const COLD: usize = 96;

/// Key `n` of family `family` (the warm prefixes are families
/// `0..WARM`; request `r`'s own blocks are family `WARM + r`).
fn key(family: usize, n: usize) -> BlockHash {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&(family as u64).to_le_bytes());
    bytes[8..16].copy_from_slice(&(n as u64).to_le_bytes());
    bytes[16..24].copy_from_slice(&0x9E37_79B9_7F4A_7C15u64.to_le_bytes());
    BlockHash(bytes)
}

/// What a run counted.
struct Run {
    /// Requests whose prefix's previous use had finished before they
    /// matched: each must hit its prefix whole.
    checked: usize,
    /// Prefix blocks those requests missed.
    missed: usize,
    /// Blocks evicted.
    evictions: u64,
}

/// Runs `requests` requests over `threads` workers, which take the next
/// request number from a shared cursor.
///
/// A request whose prefix's previous use (request `r - WARM`) has not
/// finished when it matches is not checked: with a worker descheduled in
/// the middle of a request, the other may run `WARM` requests meanwhile
/// and reach the next use of the same prefix, which then misses what is
/// not published yet (as it would with any cache).
fn run(threads: usize, requests: usize) -> Run {
    let pool = Arc::new(BlockPool::new(BLOCKS, BS));
    let cursor = AtomicUsize::new(0);
    let finished: Vec<AtomicBool> = (0..requests).map(|_| AtomicBool::new(false)).collect();
    let (checked, missed) = (AtomicUsize::new(0), AtomicUsize::new(0));
    thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut keys = Vec::with_capacity(PREFIX + COLD);
                loop {
                    // Relaxed: only hands out distinct request numbers.
                    let r = cursor.fetch_add(1, Ordering::Relaxed);
                    if r >= requests {
                        break;
                    }
                    keys.clear();
                    keys.extend((0..PREFIX).map(|n| key(r % WARM, n)));
                    keys.extend((0..COLD).map(|n| key(WARM + r, n)));
                    // Acquire: pairs with the Release below, so the previous
                    // use's publish (or match) happens-before our match.
                    let check = r >= WARM && finished[r - WARM].load(Ordering::Acquire);
                    let mut seq = Sequence::new(Arc::clone(&pool));
                    let matched = seq.try_match_prefix(&keys);
                    assert!(matched <= PREFIX, "request {r} matched {matched} blocks");
                    seq.try_append((PREFIX + COLD) * BS - seq.len())
                        .expect("the pool has room for every worker's request");
                    seq.publish(&keys);
                    drop(seq);
                    // Release: see the Acquire above.
                    finished[r].store(true, Ordering::Release);
                    if check {
                        // Relaxed (both): counts read after the join.
                        checked.fetch_add(1, Ordering::Relaxed);
                        missed.fetch_add(PREFIX - matched, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(pool.free_blocks(), BLOCKS, "every block given back");
    Run {
        checked: checked.into_inner(),
        missed: missed.into_inner(),
        evictions: pool.prefix_stats().evictions,
    }
}

/// Checks a run of `requests` requests over `threads` workers: the pool
/// evicted all along, and every checked request hit its prefix whole (with
/// one thread), or all but 1% of their prefix blocks were hit (with more).
fn check(threads: usize, requests: usize) -> Run {
    let run = run(threads, requests);
    // The pool is full after about `BLOCKS / COLD` requests; from then on
    // every request evicts a request's worth.
    let full_after = (BLOCKS / COLD + 1) as u64;
    assert!(
        run.evictions >= (requests as u64 - full_after) * COLD as u64,
        "{} evictions",
        run.evictions
    );
    // One request at a time the order is exact. With more, it is nearly
    // so: a thread descheduled in the middle of a give-back leaves up to a
    // batch of its blocks stamped early, and an evictor that finds the
    // ring empty while the refiller waits for a core sweeps (taking the
    // oldest blocks first, roughly). A handful of blocks at most, where
    // the pool's earlier sweep in index order missed 10% to 18% of them
    // here.
    let allowed = if threads == 1 {
        0
    } else {
        run.checked * PREFIX / 100
    };
    assert!(
        run.missed <= allowed,
        "{threads} threads: {} warm blocks missed by {} requests that follow a finished use of their prefix",
        run.missed,
        run.checked
    );
    run
}

#[test]
fn one_thread_never_evicts_a_warm_prefix() {
    let requests = 1_000;
    // One request at a time: every use but the first is checked.
    assert_eq!(check(1, requests).checked, requests - WARM);
}

#[test]
fn two_threads_keep_the_warm_prefixes() {
    let requests = 6_000;
    let run = check(2, requests);
    // Not a vacuous pass: most requests follow a finished use of their
    // prefix (a worker would have to stall for `WARM` of the other's
    // requests at every turn for it to be otherwise).
    assert!(
        run.checked >= requests / 4,
        "{} requests checked",
        run.checked
    );
}
