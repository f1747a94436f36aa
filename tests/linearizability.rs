//! Linearizability of [`SlotCounter`], [`BlockPool`] and the prefix cache,
//! checked on histories recorded from real threads.
//!
//! loom explores small models exhaustively, and the stress tests check
//! invariants at the end of long runs. This file checks every *result* that
//! the real, unmodified types returned to real threads: each round runs four
//! `std` threads that start together at a [`Barrier`] and make up to eight
//! random calls each on one fresh counter (or pool) with a tiny capacity (2
//! to 6), so that refusals are common. Every call is stamped from one
//! logical clock before it is invoked and after it returns, and recorded
//! with its arguments and its result. The round passes if some order of the
//! calls
//!
//! * respects real time (a call that returned before another was invoked
//!   comes first),
//! * and, replayed one by one on a plain sequential model, gives every call
//!   exactly the result it really got (including the `available` of a
//!   `Full` refusal and the `used` of an `ExceedsUsed` one, so those must be
//!   values the allocator really held at the call's linearization point),
//! * and ends in the state the allocator really is in after the round.
//!
//! The search is Wing & Gong's, with Lowe's memoisation: a set of
//! (linearized calls as a bit mask, model state) pairs already known to be
//! dead ends. Each thread's calls are totally ordered, so few masks are
//! reachable (at most 9^4 in a counter round) and the search is instant.
//!
//! `BlockPool` takes effect in two steps (its count, then its ids; see
//! [`PoolOp`]); its model has one linearization point per step, both inside
//! the call. A unit test shows why a one-step model does not fit. The
//! pool admits through per-shard counts, and an allocation that gathers
//! from several shards holds blocks in transit, so its model accepts a
//! `Full` that counts blocks other overlapping allocations may hold (see
//! [`PoolOp`]); a unit test checks that an unjustified refusal is still
//! caught. Pool rounds run on one shard and on 2 or 3.
//!
//! The prefix cache's rounds publish and match a few keys on a pool that
//! never evicts; a publish takes effect in two steps (a claim, then a
//! commit or a loss, see [`PrefixOp`]).
//!
//! The checker can fail: it is unit-tested on hand-written histories, and a
//! check-then-add counter written below must be caught as not linearizable
//! within 2,000 rounds (in practice the first few). A passing round shows
//! that the interleavings that happened were linearizable, not that all of
//! them are.
//!
//! The last two tests pin a bug: a free refused because it names a block
//! more often than it has references drops references before it finds out,
//! and puts them back afterwards, which concurrent callers can observe.
//!
//! Set `KVSLOTS_LIN_ROUNDS` to run more rounds than the CI default.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use kvslots::{
    BlockHash, BlockId, BlockPool, FreeError, ReleaseError, Reservation, ReserveError, Sequence,
    SlotCounter,
};

/// Threads per round.
const THREADS: usize = 4;
/// The most calls one thread makes in one round.
const MAX_OPS: u64 = 8;
/// Rounds per randomized test in CI (override with `KVSLOTS_LIN_ROUNDS`).
const DEFAULT_ROUNDS: u64 = 5_000;

fn rounds() -> u64 {
    std::env::var("KVSLOTS_LIN_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS)
}

// ===========================================================================
// The checker
// ===========================================================================

/// A sequential specification.
trait Spec {
    /// The abstract state.
    type State: Clone + Eq + Hash + Debug;
    /// One completed call, with its arguments and the result it returned.
    type Op: Debug;
    /// The state after `op`, if the specification, applied to `state`,
    /// returns exactly the result recorded in `op`; `None` if it would have
    /// returned something else (or the call is impossible in `state`).
    fn step(&self, state: &Self::State, op: &Self::Op) -> Option<Self::State>;
}

/// One completed call (or one step of a call that takes effect in two),
/// stamped from the round's logical clock.
#[derive(Debug, Clone)]
struct Event<O> {
    thread: usize,
    /// A second step: it must be linearized after the event just before it
    /// in the history (the first step of the same call).
    then: bool,
    /// Stamped before the call was invoked.
    call: u64,
    /// Stamped after the call returned.
    ret: u64,
    op: O,
}

/// Searches for a linearization of `history` from `init`; if `end` is given,
/// the linearization must also end in that state. Returns the indices of the
/// calls in a linearization order, or `None` if there is none.
fn linearize<S: Spec>(
    spec: &S,
    init: &S::State,
    history: &[Event<S::Op>],
    end: Option<&S::State>,
) -> Option<Vec<usize>> {
    assert!(history.len() <= 128, "the checker takes at most 128 events");
    assert!(
        history.iter().all(|e| e.call < e.ret),
        "each call must be stamped before it returns"
    );
    assert!(
        history.first().map_or(true, |e| !e.then)
            && history.windows(2).all(|w| {
                !w[1].then
                    || (w[0].thread, w[0].call, w[0].ret) == (w[1].thread, w[1].call, w[1].ret)
            }),
        "a second step must follow the first step of the same call"
    );
    let full = match history.len() {
        128 => u128::MAX,
        n => (1u128 << n) - 1,
    };
    let mut search = Search {
        spec,
        history,
        end,
        dead: HashSet::new(),
        order: Vec::with_capacity(history.len()),
    };
    if search.extend(0, full, init.clone()) {
        Some(search.order)
    } else {
        None
    }
}

struct Search<'a, S: Spec> {
    spec: &'a S,
    history: &'a [Event<S::Op>],
    end: Option<&'a S::State>,
    /// (linearized events, state) pairs from which no linearization exists.
    dead: HashSet<(u128, S::State)>,
    /// The calls linearized so far, in order.
    order: Vec<usize>,
}

impl<S: Spec> Search<'_, S> {
    /// Whether the calls not in `done` can be linearized after `done`, from
    /// `state`.
    fn extend(&mut self, done: u128, full: u128, state: S::State) -> bool {
        if done == full {
            return self.end.map_or(true, |end| *end == state);
        }
        // Masks only grow along a path, so a pair met again was met on an
        // earlier path that failed (a success ends the whole search).
        if !self.dead.insert((done, state.clone())) {
            return false;
        }
        let pending = |i: usize| done & (1u128 << i) == 0;
        // A pending call can go next only if it was invoked before every
        // pending call returned: otherwise that call precedes it in real time.
        let horizon = (0..self.history.len())
            .filter(|&i| pending(i))
            .map(|i| self.history[i].ret)
            .min()
            .expect("some call is pending");
        for i in 0..self.history.len() {
            // Second steps wait for their first.
            if !pending(i)
                || self.history[i].call > horizon
                || self.history[i].then && pending(i - 1)
            {
                continue;
            }
            if let Some(next) = self.spec.step(&state, &self.history[i].op) {
                self.order.push(i);
                if self.extend(done | 1u128 << i, full, next) {
                    return true;
                }
                self.order.pop();
            }
        }
        false
    }
}

/// The history as a readable table, in invocation order.
fn show<O: Debug>(history: &[Event<O>]) -> String {
    let mut sorted: Vec<&Event<O>> = history.iter().collect();
    sorted.sort_by_key(|e| e.call);
    let mut out = String::new();
    for e in sorted {
        out.push_str(&format!(
            "  thread {} [{:>3}, {:>3}] {:?}\n",
            e.thread, e.call, e.ret, e.op
        ));
    }
    out
}

/// Where each thread writes down its calls.
struct Recorder<'a, O> {
    clock: &'a AtomicU64,
    thread: usize,
    events: Vec<Event<O>>,
}

impl<'a, O> Recorder<'a, O> {
    fn new(clock: &'a AtomicU64, thread: usize) -> Self {
        Recorder {
            clock,
            thread,
            events: Vec::with_capacity(2 * MAX_OPS as usize),
        }
    }

    /// Runs `call` between two clock stamps: returns its result and the
    /// stamps, for [`push`](Self::push).
    fn time<R>(&self, call: impl FnOnce() -> R) -> (R, u64, u64) {
        // SeqCst (test code): the stamps must follow real time. Every stamp
        // is a read-modify-write of one word, so a call whose `ret` stamp is
        // read by a later `call` stamp also happens-before that later call
        // (and the later call sees everything the earlier one did).
        let call_stamp = self.clock.fetch_add(1, Ordering::SeqCst);
        let result = call();
        // SeqCst: as above.
        let ret_stamp = self.clock.fetch_add(1, Ordering::SeqCst);
        (result, call_stamp, ret_stamp)
    }

    fn push(&mut self, call: u64, ret: u64, op: O) {
        self.events.push(Event {
            thread: self.thread,
            then: false,
            call,
            ret,
            op,
        });
    }

    /// Records the second step of the call just pushed.
    fn push_then(&mut self, call: u64, ret: u64, op: O) {
        assert!(self.events.last().is_some_and(|e| e.call == call));
        self.events.push(Event {
            thread: self.thread,
            then: true,
            call,
            ret,
            op,
        });
    }

    /// Runs `call` between two clock stamps and records it as `describe` of
    /// its result.
    fn record<R>(&mut self, call: impl FnOnce() -> R, describe: impl FnOnce(&R) -> O) -> R {
        let (result, call, ret) = self.time(call);
        self.push(call, ret, describe(&result));
        result
    }
}

/// A small deterministic PRNG (splitmix64), so that no dependency is needed
/// and each round's choices follow from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// A request size for a capacity of `cap`: mostly `1..=cap`, sometimes
    /// 0, `cap + 1` or `usize::MAX`.
    fn size(&mut self, cap: usize) -> usize {
        match self.below(20) {
            0 => 0,
            1 => cap + 1,
            2 => usize::MAX,
            _ => self.range(1, cap as u64) as usize,
        }
    }
}

// ===========================================================================
// SlotCounter: the specification
// ===========================================================================

/// The counter's abstract state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct CounterState {
    used: usize,
    closed: bool,
}

/// A completed call on a counter, with its result.
#[derive(Debug, Clone)]
#[allow(dead_code)] // `via` is read only through Debug, in failure reports
enum CounterOp {
    /// `admit(requested)`, which returned `admitted`.
    Admit { requested: isize, admitted: usize },
    /// `try_reserve(n)` (headroom 0), `try_reserve_with_headroom(n, headroom)`
    /// or a guard's `try_grow(n)` (headroom 0), named by `via`.
    Reserve {
        via: &'static str,
        n: usize,
        headroom: usize,
        result: Result<(), ReserveError>,
    },
    /// A guard of `n` slots dropped, or a `shrink_to` that gave `n` back.
    GiveBack { via: &'static str, n: usize },
    /// `release(n)`.
    Release {
        n: usize,
        result: Result<(), ReleaseError>,
    },
    /// `close()`.
    Close,
    /// `used()`, which returned `seen`.
    Used { seen: usize },
}

/// The sequential specification of a counter of `capacity` slots: written
/// out plainly here, not borrowed from the crate.
struct CounterSpec {
    capacity: usize,
}

impl CounterSpec {
    fn reserve(
        &self,
        s: &CounterState,
        n: usize,
        headroom: usize,
    ) -> (Result<(), ReserveError>, CounterState) {
        let needed = n.saturating_add(headroom);
        let available = self.capacity - s.used;
        // Closed wins over NeverFits: after close every admission fails as
        // Closed, whatever its size.
        let result = if s.closed {
            Err(ReserveError::Closed)
        } else if needed > self.capacity {
            Err(ReserveError::NeverFits {
                requested: n,
                capacity: self.capacity,
            })
        } else if needed > available {
            Err(ReserveError::Full {
                requested: n,
                available,
            })
        } else {
            Ok(())
        };
        let used = if result.is_ok() { s.used + n } else { s.used };
        (result, CounterState { used, ..*s })
    }
}

impl Spec for CounterSpec {
    type State = CounterState;
    type Op = CounterOp;

    fn step(&self, s: &CounterState, op: &CounterOp) -> Option<CounterState> {
        match *op {
            CounterOp::Admit {
                requested,
                admitted,
            } => {
                let free = self.capacity - s.used;
                let expected = if s.closed || requested <= 0 || requested as usize > free {
                    0
                } else {
                    requested as usize
                };
                (admitted == expected).then_some(CounterState {
                    used: s.used + expected,
                    ..*s
                })
            }
            CounterOp::Reserve {
                n,
                headroom,
                result,
                ..
            } => {
                let (expected, next) = self.reserve(s, n, headroom);
                (result == expected).then_some(next)
            }
            CounterOp::GiveBack { n, .. } => (n <= s.used).then_some(CounterState {
                used: s.used - n,
                ..*s
            }),
            CounterOp::Release { n, result } => {
                let (expected, used) = if n > s.used {
                    (
                        Err(ReleaseError::ExceedsUsed {
                            released: n,
                            used: s.used,
                        }),
                        s.used,
                    )
                } else {
                    (Ok(()), s.used - n)
                };
                (result == expected).then_some(CounterState { used, ..*s })
            }
            CounterOp::Close => Some(CounterState { closed: true, ..*s }),
            CounterOp::Used { seen } => (seen == s.used).then_some(*s),
        }
    }
}

// ===========================================================================
// SlotCounter: rounds on real threads
// ===========================================================================

/// Runs `body` on [`THREADS`] scoped threads that start together at a
/// [`Barrier`], each with its own [`Recorder`] (all stamping from one
/// clock) and its own [`Rng`] seeded from `rng`; returns each thread's
/// events and what its `body` returned, in thread order.
fn run_threads<O: Send, R: Send>(
    rng: &mut Rng,
    body: impl Fn(&mut Recorder<'_, O>, &mut Rng) -> R + Sync,
) -> Vec<(Vec<Event<O>>, R)> {
    let clock = AtomicU64::new(0);
    let barrier = Barrier::new(THREADS);
    let seeds: Vec<u64> = (0..THREADS).map(|_| rng.next()).collect();
    let (clock, barrier, body) = (&clock, &barrier, &body);
    thread::scope(|s| {
        let handles: Vec<_> = seeds
            .iter()
            .enumerate()
            .map(|(t, &seed)| {
                s.spawn(move || {
                    let mut rec = Recorder::new(clock, t);
                    let mut rng = Rng(seed);
                    barrier.wait();
                    let out = body(&mut rec, &mut rng);
                    (rec.events, out)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// What a thread still holds when its calls are done: guards, and a count
/// taken with `admit`.
type Leftovers<'c> = (Vec<Reservation<'c>>, usize);

/// One thread of a counter round: the counter, the thread's recorder and
/// PRNG, and what it holds (guards, and a count taken with `admit`).
struct CounterThread<'c, 'r, 'e> {
    counter: &'c SlotCounter,
    rec: &'r mut Recorder<'e, CounterOp>,
    rng: &'r mut Rng,
    guards: Vec<Reservation<'c>>,
    admitted: usize,
}

impl CounterThread<'_, '_, '_> {
    /// `try_reserve` of a random size, or `try_reserve_with_headroom` with a
    /// random headroom too.
    fn reserve(&mut self, with_headroom: bool) {
        let counter = self.counter;
        let cap = counter.capacity();
        let CounterThread {
            rec, rng, guards, ..
        } = self;
        let n = rng.size(cap);
        let (via, headroom) = if with_headroom {
            let headroom = match rng.below(8) {
                0 => usize::MAX,
                _ => rng.range(0, cap as u64) as usize,
            };
            ("try_reserve_with_headroom", headroom)
        } else {
            ("try_reserve", 0)
        };
        let r = rec.record(
            || {
                if with_headroom {
                    counter.try_reserve_with_headroom(n, headroom)
                } else {
                    counter.try_reserve(n)
                }
            },
            |r| CounterOp::Reserve {
                via,
                n,
                headroom,
                result: r.as_ref().map(|_| ()).map_err(|e| *e),
            },
        );
        guards.extend(r.ok());
    }

    /// `admit` of a random request, negative and extreme ones included.
    fn admit(&mut self) {
        let counter = self.counter;
        let cap = self.counter.capacity();
        let CounterThread {
            rec, rng, admitted, ..
        } = self;
        let requested = match rng.below(12) {
            0 => -1,
            1 => isize::MIN,
            2 => isize::MAX,
            _ => rng.range(0, cap as u64 + 1) as isize,
        };
        let got = rec.record(
            || counter.admit(requested),
            |&admitted| CounterOp::Admit {
                requested,
                admitted,
            },
        );
        *admitted += got;
    }

    /// Drops a random guard.
    fn drop_guard(&mut self) {
        let CounterThread {
            rec, rng, guards, ..
        } = self;
        let g = guards.swap_remove(rng.below(guards.len() as u64) as usize);
        let n = g.len();
        rec.record(
            || drop(g),
            |_| CounterOp::GiveBack {
                via: "drop guard",
                n,
            },
        );
    }

    /// `release` of what `admit` took here, or of more than is ever in use.
    fn release(&mut self) {
        let counter = self.counter;
        let cap = self.counter.capacity();
        let CounterThread {
            rec, rng, admitted, ..
        } = self;
        // Only what this thread took, or more than can ever be in
        // use: a successful over-release would take another thread's
        // slots, which its guards would then give back a second time.
        let n = match rng.below(4) {
            0 => 0,
            1 if *admitted > 0 => rng.range(1, *admitted as u64) as usize,
            1 => cap + 1,
            2 => *admitted,
            _ => [cap + 1, usize::MAX][rng.below(2) as usize],
        };
        let r = rec.record(
            || counter.release(n),
            |&result| CounterOp::Release { n, result },
        );
        if r.is_ok() {
            *admitted -= n;
        }
    }

    /// `try_grow` of a random guard.
    fn grow(&mut self) {
        let cap = self.counter.capacity();
        let CounterThread {
            rec, rng, guards, ..
        } = self;
        let i = rng.below(guards.len() as u64) as usize;
        let n = rng.size(cap);
        let g = &mut guards[i];
        // On success the guard counts the grown slots itself.
        let _ = rec.record(
            || g.try_grow(n),
            |&result| CounterOp::Reserve {
                via: "try_grow",
                n,
                headroom: 0,
                result,
            },
        );
    }

    /// `shrink_to` of a random guard.
    fn shrink(&mut self) {
        let CounterThread {
            rec, rng, guards, ..
        } = self;
        let i = rng.below(guards.len() as u64) as usize;
        let g = &mut guards[i];
        let len = rng.range(0, g.len() as u64) as usize;
        let n = g.len() - len;
        rec.record(
            || g.shrink_to(len),
            |_| CounterOp::GiveBack {
                via: "shrink_to",
                n,
            },
        );
    }

    /// Splits a random guard, and merges the part into another or keeps it.
    fn split_or_merge(&mut self) {
        let CounterThread { rng, guards, .. } = self;
        // Split and merge move counts between guards and touch no
        // shared state, so they are not calls on the counter; the
        // drops that follow must still give back the right amounts.
        let i = rng.below(guards.len() as u64) as usize;
        let k = rng.range(0, guards[i].len() as u64) as usize;
        let part = guards[i].split(k).expect("k <= len");
        if guards.len() > 1 && rng.below(2) == 0 {
            let j = (i + 1) % guards.len();
            guards[j].merge(part);
        } else {
            guards.push(part);
        }
    }

    /// Reads `used`.
    fn used(&mut self) {
        let counter = self.counter;
        let CounterThread { rec, .. } = self;
        rec.record(|| counter.used(), |&seen| CounterOp::Used { seen });
    }

    /// Closes the counter (in a round that may close), or reads `used`.
    fn close_or_used(&mut self, may_close: bool) {
        let counter = self.counter;
        let CounterThread { rec, .. } = self;
        if may_close {
            rec.record(|| counter.close(), |_| CounterOp::Close);
        } else {
            rec.record(|| counter.used(), |&seen| CounterOp::Used { seen });
        }
    }
}

/// One thread's calls in a counter round.
fn counter_thread<'c>(
    counter: &'c SlotCounter,
    rec: &mut Recorder<'_, CounterOp>,
    rng: &mut Rng,
    may_close: bool,
) -> Leftovers<'c> {
    let mut t = CounterThread {
        counter,
        rec,
        rng,
        guards: Vec::new(),
        admitted: 0,
    };
    for _ in 0..t.rng.range(1, MAX_OPS) {
        let mut roll = t.rng.below(100);
        // Calls on a guard need one; fall back to a plain reservation.
        let on_a_guard = (46..62).contains(&roll) || (72..94).contains(&roll);
        if on_a_guard && t.guards.is_empty() {
            roll = 0;
        }
        match roll {
            0..=21 => t.reserve(false),
            22..=31 => t.reserve(true),
            32..=45 => t.admit(),
            46..=61 => t.drop_guard(),
            62..=71 => t.release(),
            72..=81 => t.grow(),
            82..=87 => t.shrink(),
            88..=93 => t.split_or_merge(),
            94..=96 => t.used(),
            _ => t.close_or_used(may_close),
        }
    }
    (t.guards, t.admitted)
}

/// Runs one counter round from `seed`; `Err` describes a violation.
fn counter_round(seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let cap = rng.range(2, 6) as usize;
    let may_close = rng.below(4) == 0;
    let counter = SlotCounter::new(cap);
    let outcomes = run_threads(&mut rng, |rec, rng| {
        counter_thread(&counter, rec, rng, may_close)
    });

    // The state after the round, read once every thread is done.
    let end = CounterState {
        used: counter.used(),
        closed: counter.is_closed(),
    };
    let mut history = Vec::new();
    let mut leftovers = Vec::new();
    for (events, left) in outcomes {
        history.extend(events);
        leftovers.push(left);
    }
    let spec = CounterSpec { capacity: cap };
    let init = CounterState {
        used: 0,
        closed: false,
    };
    if linearize(&spec, &init, &history, Some(&end)).is_none() {
        return Err(format!(
            "seed {seed:#x}: SlotCounter history (capacity {cap}) is not linearizable \
             (end state {end:?}):\n{}",
            show(&history)
        ));
    }
    // Everything still held goes back.
    for (guards, admitted) in leftovers {
        drop(guards);
        counter
            .release(admitted)
            .map_err(|e| format!("seed {seed:#x}: {e}"))?;
    }
    if counter.used() != 0 {
        return Err(format!("seed {seed:#x}: {} slots leaked", counter.used()));
    }
    Ok(())
}

#[test]
fn slot_counter_histories_are_linearizable() {
    let n = rounds();
    for round in 0..n {
        if let Err(e) = counter_round(0xC0_0000 + round) {
            panic!("round {round}: {e}");
        }
    }
}

// ===========================================================================
// BlockPool: the specification
// ===========================================================================

/// The pool's abstract state. Pools in these rounds have at most 8 blocks
/// and nothing shares a block, so one bit per block is its reference count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PoolState {
    /// Blocks admitted by the pool's count (what `free_blocks` and `Full`
    /// report against).
    used: usize,
    /// Blocks that have an owner.
    allocated: u64,
    closed: bool,
    /// The history indices of the allocations linearized so far (their
    /// admission decided), for the transit bound.
    admitted: u128,
}

/// A completed call on a pool, with its result.
///
/// `BlockPool` takes effect in two steps, as its module documentation says:
/// an allocation is admitted by the pool's count and then takes its ids
/// from the free list; a free drops the references (and returns the ids)
/// and then gives the count back. The two steps of one call are recorded
/// as two events with the call's interval, the second of which must be
/// linearized after the first. Fused into one step (a fully atomic
/// allocation), real histories are *not* linearizable: an allocation whose
/// count is admitted while it is preempted before popping can later pop an
/// id that other threads allocated and freed in between, while every
/// `free_blocks()` and `Full { available }` in between already counted it.
/// No block ever has two owners, and every count reported is one the pool
/// held; the two-step model checks exactly that.
///
/// Blocks in transit relax two answers. The pool's admission counts free
/// blocks per shard, and an allocation that its home shard cannot serve
/// holds what it takes from the shards until it has enough (or gives it
/// all back): a `Full` then reports the free blocks outside the other
/// running calls, which the model bounds by the most that the allocations
/// overlapping the call in real time can hold at its linearization point
/// (see [`Overlap`]). A refusal is justified only if it reports at most
/// the free blocks at its linearization point and at least those minus
/// that bound: with no overlapping allocation, exactly them. And a
/// `free_blocks()` is a sum of the shards' counts read one after another:
/// exact when no other call overlaps it, and otherwise, on a one-shard
/// pool, between the free blocks minus `transit` and the free blocks; on a
/// sharded pool only at most `num_blocks`.
#[derive(Debug, Clone)]
enum PoolOp {
    /// `try_alloc_with_headroom(n, headroom, out)` (`try_alloc` when
    /// `headroom` is 0), at its admission: the result is decided here.
    /// `index` (its place in the history) and `overlapping` are set by
    /// [`annotate_transit`].
    Admit {
        n: usize,
        headroom: usize,
        result: Result<(), ReserveError>,
        index: usize,
        overlapping: Vec<Overlap>,
    },
    /// The second step of a successful allocation of `n`: the ids it
    /// appended.
    Take { n: usize, ids: Vec<u32> },
    /// `free(ids)`, at its reference drops: the result is decided here.
    Free {
        ids: Vec<u32>,
        result: Result<(), FreeError>,
    },
    /// The second step of a successful free: `n` blocks' count given back.
    GiveBack { n: usize },
    /// `free_blocks()`, which returned `seen`; `overlapping` and `alone`
    /// are set by [`annotate_transit`].
    FreeBlocks {
        seen: usize,
        overlapping: Vec<Overlap>,
        alone: bool,
    },
    /// `close()`.
    Close,
}

struct PoolSpec {
    num_blocks: usize,
    /// The pool's free-list (and admission) shards.
    shards: usize,
}

/// Another thread's allocation whose interval overlaps a call's: what it
/// may hold in transit.
#[derive(Debug, Clone, Copy)]
struct Overlap {
    /// Its place in the history (its `Admit` event).
    index: usize,
    /// What it may hold before its admission is decided: `n + headroom`
    /// (0 for a `NeverFits`, which takes nothing).
    before: usize,
    /// What it may still hold after: the headroom it gives back after a
    /// success, what it took before a `Closed` re-check, the count it
    /// gives back after a `Full`.
    after: usize,
}

/// Sets each `Admit`'s `index` and each `Admit`'s and `FreeBlocks`'s
/// `overlapping` (the other threads' allocations whose interval overlaps
/// its own), and each `FreeBlocks`'s `alone` (no other thread's call
/// overlaps it).
fn annotate_transit(history: &mut [Event<PoolOp>], num_blocks: usize) {
    // (thread, call, ret, what it may hold) per allocation.
    let mut admits: Vec<(usize, u64, u64, Overlap)> = Vec::new();
    let mut spans: Vec<(usize, u64, u64)> = Vec::new();
    for (index, e) in history.iter_mut().enumerate() {
        spans.push((e.thread, e.call, e.ret));
        if let PoolOp::Admit {
            n,
            headroom,
            result,
            index: at,
            ..
        } = &mut e.op
        {
            *at = index;
            let needed = n.saturating_add(*headroom);
            let before = if needed > num_blocks { 0 } else { needed };
            let after = match result {
                Ok(()) => *headroom,
                Err(ReserveError::Full { available, .. }) => *available,
                Err(ReserveError::Closed) => before,
                Err(_) => 0,
            };
            admits.push((
                e.thread,
                e.call,
                e.ret,
                Overlap {
                    index,
                    before,
                    after,
                },
            ));
        }
    }
    for e in history.iter_mut() {
        let other = |&(thread, call, ret): &(usize, u64, u64)| {
            thread != e.thread && call < e.ret && e.call < ret
        };
        let alone = !spans.iter().any(other);
        let found: Vec<Overlap> = admits
            .iter()
            .filter(|(thread, call, ret, _)| other(&(*thread, *call, *ret)))
            .map(|&(.., overlap)| overlap)
            .collect();
        match &mut e.op {
            PoolOp::Admit { overlapping, .. } => *overlapping = found,
            PoolOp::FreeBlocks {
                overlapping,
                alone: lone,
                ..
            } => {
                *overlapping = found;
                *lone = alone;
            }
            _ => {}
        }
    }
}

/// The most blocks that `overlapping` allocations can hold in transit in
/// `s`: before its admission is linearized, what one may take; after, what
/// it may still give back. At most `num_blocks`.
fn transit(s: &PoolState, overlapping: &[Overlap], num_blocks: usize) -> usize {
    overlapping
        .iter()
        .map(|o| {
            if s.admitted & 1u128 << o.index != 0 {
                o.after
            } else {
                o.before
            }
        })
        .sum::<usize>()
        .min(num_blocks)
}

impl PoolSpec {
    /// The result `free(ids)` must return in `s`, and the blocks it frees.
    fn free(&self, s: &PoolState, ids: &[u32]) -> Result<u64, FreeError> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.num_blocks) {
            return Err(FreeError::OutOfRange {
                id: BlockId::new(id),
                num_blocks: self.num_blocks,
            });
        }
        let mut freed = 0u64;
        for &id in ids {
            let bit = 1u64 << id;
            if s.allocated & !freed & bit == 0 {
                return Err(if freed & bit != 0 {
                    FreeError::OverFreed {
                        id: BlockId::new(id),
                    }
                } else {
                    FreeError::NotAllocated {
                        id: BlockId::new(id),
                    }
                });
            }
            freed |= bit;
        }
        Ok(freed)
    }
}

impl Spec for PoolSpec {
    type State = PoolState;
    type Op = PoolOp;

    fn step(&self, s: &PoolState, op: &PoolOp) -> Option<PoolState> {
        let nb = self.num_blocks;
        let next = match op {
            PoolOp::Admit {
                n,
                headroom,
                result,
                index,
                overlapping,
            } => {
                let (n, needed) = (*n, n.saturating_add(*headroom));
                let free = nb - s.used;
                let transit = transit(s, overlapping, nb);
                // Closed wins over NeverFits, as for the counter.
                let expected = if s.closed {
                    Err(ReserveError::Closed)
                } else if needed > nb {
                    Err(ReserveError::NeverFits {
                        requested: n,
                        capacity: nb,
                    })
                } else if needed > free.saturating_sub(transit) {
                    // Refused with blocks of other running calls in
                    // transit, or with too few free: justified if the count
                    // reported is what was free outside those calls.
                    match *result {
                        Err(ReserveError::Full {
                            requested,
                            available,
                        }) if requested == n
                            && available < needed
                            && available <= free
                            && available + transit >= free =>
                        {
                            *result
                        }
                        _ if needed <= free => Ok(()),
                        _ => return None,
                    }
                } else {
                    Ok(())
                };
                if *result != expected {
                    return None;
                }
                let used = if result.is_ok() { s.used + n } else { s.used };
                PoolState {
                    used,
                    admitted: s.admitted | 1u128 << index,
                    ..*s
                }
            }
            PoolOp::Take { n, ids } => {
                // Exactly n ids, distinct, in range, and free.
                if ids.len() != *n {
                    return None;
                }
                let mut taken = 0u64;
                for &id in ids {
                    if id as usize >= nb || (s.allocated | taken) & 1u64 << id != 0 {
                        return None;
                    }
                    taken |= 1u64 << id;
                }
                PoolState {
                    allocated: s.allocated | taken,
                    ..*s
                }
            }
            PoolOp::Free { ids, result } => match (self.free(s, ids), result) {
                (Ok(freed), Ok(())) => PoolState {
                    allocated: s.allocated & !freed,
                    ..*s
                },
                (Err(expected), Err(got)) if expected == *got => *s,
                // A double free caught racing (after the checks passed):
                // at its failing drop the block was free, and the call
                // dropped every other listed reference.
                (_, Err(FreeError::Raced { id })) => {
                    let raced = id.index() as u32;
                    if s.allocated & 1u64 << raced != 0 {
                        return None;
                    }
                    let at = ids.iter().position(|&i| i == raced)?;
                    let others: Vec<u32> = ids
                        .iter()
                        .enumerate()
                        .filter(|&(k, _)| k != at)
                        .map(|(_, &i)| i)
                        .collect();
                    let freed = self.free(s, &others).ok()?;
                    PoolState {
                        allocated: s.allocated & !freed,
                        ..*s
                    }
                }
                _ => return None,
            },
            PoolOp::GiveBack { n } => PoolState {
                used: s.used.checked_sub(*n)?,
                ..*s
            },
            PoolOp::FreeBlocks {
                seen,
                overlapping,
                alone,
            } => {
                let free = nb - s.used;
                let transit = transit(s, overlapping, nb);
                let fits = if *alone {
                    *seen == free
                } else if self.shards == 1 {
                    *seen <= free && *seen + transit >= free
                } else {
                    *seen <= nb
                };
                if !fits {
                    return None;
                }
                *s
            }
            PoolOp::Close => PoolState { closed: true, ..*s },
        };
        // The count covers every owned block (it is admitted before the ids
        // are taken and given back after they are returned).
        (next.allocated.count_ones() as usize <= next.used).then_some(next)
    }
}

// ===========================================================================
// BlockPool: rounds on real threads
// ===========================================================================

/// What a pool round's threads may do besides well-behaved calls.
#[derive(Clone, Copy)]
struct PoolMix {
    /// Free single ids this thread freed before (double frees); such a free
    /// can take a block another thread now holds, which the model allows.
    /// Every free is of one id in this mode, so that no refused free drops
    /// a reference before it is refused (see the last two tests).
    stale: bool,
    /// Free lists with a duplicate or an out-of-range id after good ones
    /// (the refused free must change nothing).
    bad_tail: bool,
}

/// One thread's calls in a pool round.
fn pool_thread(
    pool: &BlockPool,
    rec: &mut Recorder<'_, PoolOp>,
    rng: &mut Rng,
    mix: PoolMix,
    may_close: bool,
) {
    let nb = pool.num_blocks();
    let mut out: Vec<BlockId> = Vec::with_capacity(nb + 1);
    let mut held: Vec<u32> = Vec::new();
    let mut freed_before: Vec<u32> = Vec::new();
    for _ in 0..rng.range(1, MAX_OPS) {
        let mut roll = rng.below(100);
        if held.is_empty() && (35..75).contains(&roll) {
            roll = 0;
        }
        if (75..85).contains(&roll) && (!mix.stale || freed_before.is_empty()) {
            roll = 85;
        }
        match roll {
            0..=34 => {
                let n = rng.size(nb);
                let headroom = match rng.below(4) {
                    0 => rng.range(1, nb as u64) as usize,
                    _ => 0,
                };
                out.clear();
                let (result, call, ret) =
                    rec.time(|| pool.try_alloc_with_headroom(n, headroom, &mut out));
                rec.push(
                    call,
                    ret,
                    PoolOp::Admit {
                        n,
                        headroom,
                        result,
                        index: 0,
                        overlapping: Vec::new(),
                    },
                );
                if result.is_ok() {
                    let ids: Vec<u32> = out.iter().map(|id| id.index() as u32).collect();
                    held.extend(&ids);
                    rec.push_then(call, ret, PoolOp::Take { n, ids });
                }
            }
            35..=74 => {
                // Some of what this thread holds, in a random order (one id
                // when double frees are on).
                let most = if mix.stale { 1 } else { held.len() as u64 };
                let mut ids: Vec<u32> = Vec::new();
                for _ in 0..rng.range(1, most) {
                    let i = rng.below(held.len() as u64) as usize;
                    if !ids.contains(&held[i]) {
                        ids.push(held[i]);
                    }
                }
                // Sometimes spoil it: a duplicate, or an id out of range.
                if roll >= 65 && mix.bad_tail {
                    match rng.below(2) {
                        0 => ids.push(ids[0]),
                        _ => ids.push([nb as u32, u32::MAX][rng.below(2) as usize]),
                    }
                }
                free_recorded(pool, rec, &ids, &mut held);
                freed_before.extend(&ids);
            }
            75..=84 => {
                let id = freed_before[rng.below(freed_before.len() as u64) as usize];
                free_recorded(pool, rec, &[id], &mut held);
            }
            85..=96 => {
                rec.record(
                    || pool.free_blocks(),
                    |&seen| PoolOp::FreeBlocks {
                        seen,
                        overlapping: Vec::new(),
                        alone: false,
                    },
                );
            }
            _ => {
                if may_close {
                    rec.record(|| pool.close(), |_| PoolOp::Close);
                } else {
                    free_recorded(pool, rec, &[], &mut held);
                }
            }
        }
    }
}

/// Frees `ids` and records it; on success, forgets them from `held` (a
/// double free may take a block another thread holds; it is no one's now).
fn free_recorded(
    pool: &BlockPool,
    rec: &mut Recorder<'_, PoolOp>,
    ids: &[u32],
    held: &mut Vec<u32>,
) {
    let to_free: Vec<BlockId> = ids.iter().map(|&i| BlockId::new(i)).collect();
    let (result, call, ret) = rec.time(|| pool.free(&to_free));
    rec.push(
        call,
        ret,
        PoolOp::Free {
            ids: ids.to_vec(),
            result,
        },
    );
    if result.is_ok() {
        held.retain(|id| !ids.contains(id));
        let mut distinct = ids.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        rec.push_then(call, ret, PoolOp::GiveBack { n: distinct.len() });
    }
}

/// Runs one pool round from `seed` on a pool with `shards` shards; `Err`
/// describes a violation.
fn pool_round(seed: u64, mix: PoolMix, shards: usize) -> Result<(), String> {
    let mut rng = Rng(seed);
    let nb = rng.range(2, 6) as usize;
    let may_close = rng.below(4) == 0;
    let pool = BlockPool::with_shards(nb, 16, shards);
    let logs = run_threads(&mut rng, |rec, rng| {
        pool_thread(&pool, rec, rng, mix, may_close);
    });

    // The state after the round, from the reference counts and the count.
    let mut allocated = 0u64;
    for i in 0..nb {
        match pool.ref_count(BlockId::new(i as u32)) {
            Some(0) => {}
            Some(1) => allocated |= 1 << i,
            other => return Err(format!("seed {seed:#x}: block {i} has count {other:?}")),
        }
    }
    // Each thread's events stay contiguous, so a second step directly
    // follows its first.
    let mut history: Vec<Event<PoolOp>> =
        logs.into_iter().flat_map(|(events, ())| events).collect();
    annotate_transit(&mut history, nb);
    let end = PoolState {
        used: pool.used_blocks(),
        allocated,
        closed: pool.is_closed(),
        // Every allocation is linearized by the end.
        admitted: history
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e.op, PoolOp::Admit { .. }))
            .fold(0, |mask, (i, _)| mask | 1u128 << i),
    };
    let spec = PoolSpec {
        num_blocks: nb,
        shards,
    };
    let init = PoolState {
        used: 0,
        allocated: 0,
        closed: false,
        admitted: 0,
    };
    if linearize(&spec, &init, &history, Some(&end)).is_none() {
        return Err(format!(
            "seed {seed:#x}: BlockPool history ({nb} blocks, {shards} shards) is not linearizable \
             (end state {end:?}):\n{}",
            show(&history)
        ));
    }
    // Once every call is done, the count is exactly the owned blocks, and
    // (if still open) the free list holds exactly the blocks that are free.
    if end.used != allocated.count_ones() as usize {
        return Err(format!(
            "seed {seed:#x}: used_blocks {} but {} blocks referenced",
            end.used,
            allocated.count_ones()
        ));
    }
    if !end.closed {
        let mut rest = Vec::new();
        pool.try_alloc(pool.free_blocks(), &mut rest)
            .map_err(|e| format!("seed {seed:#x}: taking the free blocks: {e}"))?;
        let rest: u64 = rest.iter().fold(0, |m, id| m | 1 << id.index());
        let all = (1u64 << nb) - 1;
        if rest != all & !allocated {
            return Err(format!(
                "seed {seed:#x}: free list held {rest:#b}, expected {:#b}",
                all & !allocated
            ));
        }
    }
    Ok(())
}

#[test]
fn block_pool_histories_are_linearizable() {
    // Well-behaved callers: each thread frees only what it holds, sometimes
    // with a duplicate or an out-of-range id appended.
    let mix = PoolMix {
        stale: false,
        bad_tail: true,
    };
    for round in 0..rounds() {
        if let Err(e) = pool_round(0xB0_0000 + round, mix, 1) {
            panic!("round {round}: {e}");
        }
    }
}

#[test]
fn block_pool_histories_with_double_frees_are_linearizable() {
    // Double frees of ids freed before, which another thread may hold by
    // now (the model lets such a free take that block).
    let mix = PoolMix {
        stale: true,
        bad_tail: false,
    };
    for round in 0..rounds() {
        if let Err(e) = pool_round(0xD0_0000 + round, mix, 1) {
            panic!("round {round}: {e}");
        }
    }
}

#[test]
fn sharded_block_pool_histories_are_linearizable() {
    // As above, on pools of 2 and 3 shards, where an allocation that its
    // home shard cannot serve gathers from the others.
    let mix = PoolMix {
        stale: false,
        bad_tail: true,
    };
    for round in 0..rounds() {
        let shards = 2 + (round % 2) as usize;
        if let Err(e) = pool_round(0x5A_0000 + round, mix, shards) {
            panic!("round {round}: {e}");
        }
    }
}

// ===========================================================================
// The prefix cache: publish and match
// ===========================================================================

/// Keys in prefix rounds.
const PREFIX_KEYS: usize = 3;

/// Key number `n` of the prefix rounds.
fn prefix_key(n: usize) -> BlockHash {
    let mut key = [0u8; 32];
    key[0] = n as u8;
    key[8] = n as u8 + 1;
    key[16] = 0x5A ^ n as u8;
    BlockHash(key)
}

/// The prefix cache's abstract state in rounds without eviction: which
/// block caches each key (`0` for none, else the id + 1), and how many
/// publishes of each key are between their two steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PrefixState {
    cached: [u32; PREFIX_KEYS],
    claims: [u8; PREFIX_KEYS],
}

/// A completed call on the prefix cache.
///
/// A publish takes effect in two steps: it claims the key (the claim is
/// not visible to matchers), and then commits (the key is cached on its
/// block: `publish` returned 1) or loses (it returned 0). It may lose only
/// to a key already cached or to another claim of the same key in flight,
/// which then commits or loses in turn; a commit needs the key uncached,
/// so one key is never cached twice, and of publishes that only race each
/// other, one commits. A match of one key is one step: it hits the block
/// that caches the key, or misses when none does.
#[derive(Debug, Clone)]
enum PrefixOp {
    /// The first step of `publish` of `key`.
    Claim { key: usize },
    /// The second step of a `publish` that returned 1.
    Commit { key: usize, block: u32 },
    /// The second step of a `publish` that returned 0.
    Lose { key: usize },
    /// `try_match_prefix(&[key])` on an empty sequence, which matched
    /// `hit`.
    Match { key: usize, hit: Option<u32> },
}

struct PrefixSpec;

impl Spec for PrefixSpec {
    type State = PrefixState;
    type Op = PrefixOp;

    fn step(&self, s: &PrefixState, op: &PrefixOp) -> Option<PrefixState> {
        let mut next = *s;
        match *op {
            PrefixOp::Claim { key } => next.claims[key] += 1,
            PrefixOp::Commit { key, block } => {
                if s.cached[key] != 0 {
                    return None;
                }
                next.cached[key] = block + 1;
                next.claims[key] -= 1;
            }
            PrefixOp::Lose { key } => {
                if s.cached[key] == 0 && s.claims[key] < 2 {
                    return None;
                }
                next.claims[key] -= 1;
            }
            PrefixOp::Match { key, hit } => {
                if s.cached[key] != hit.map_or(0, |b| b + 1) {
                    return None;
                }
            }
        }
        Some(next)
    }
}

/// One thread of a prefix round: publishes (each on a block of its own)
/// and matches of a few keys; it holds what it published until the end.
fn prefix_thread(pool: &Arc<BlockPool>, rec: &mut Recorder<'_, PrefixOp>, rng: &mut Rng) {
    let mut held = Vec::new();
    for _ in 0..rng.range(1, MAX_OPS) {
        let key = rng.below(PREFIX_KEYS as u64) as usize;
        let keys = [prefix_key(key)];
        if rng.below(2) == 0 {
            let mut seq = Sequence::new(Arc::clone(pool));
            seq.try_append(1)
                .expect("rounds never run out of free blocks");
            let (published, call, ret) = rec.time(|| seq.publish(&keys));
            rec.push(call, ret, PrefixOp::Claim { key });
            let finish = match published {
                1 => PrefixOp::Commit {
                    key,
                    block: seq.blocks()[0].index() as u32,
                },
                _ => PrefixOp::Lose { key },
            };
            rec.push_then(call, ret, finish);
            held.push(seq);
        } else {
            let mut seq = Sequence::new(Arc::clone(pool));
            let (k, call, ret) = rec.time(|| seq.try_match_prefix(&keys));
            let hit = (k == 1).then(|| seq.blocks()[0].index() as u32);
            rec.push(call, ret, PrefixOp::Match { key, hit });
        }
    }
}

/// Runs one prefix round from `seed`; `Err` describes a violation. The
/// pool has more blocks than a round can take, so nothing is evicted.
fn prefix_round(seed: u64) -> Result<(), String> {
    let mut rng = Rng(seed);
    let pool = Arc::new(BlockPool::new(THREADS * MAX_OPS as usize + 4, 1));
    let logs = run_threads(&mut rng, |rec, rng| prefix_thread(&pool, rec, rng));
    let history: Vec<Event<PrefixOp>> = logs.into_iter().flat_map(|(events, ())| events).collect();
    // The end state: which block each key matches now.
    let mut end = PrefixState {
        cached: [0; PREFIX_KEYS],
        claims: [0; PREFIX_KEYS],
    };
    for (key, cached) in end.cached.iter_mut().enumerate() {
        let mut seq = Sequence::new(Arc::clone(&pool));
        if seq.try_match_prefix(&[prefix_key(key)]) == 1 {
            *cached = seq.blocks()[0].index() as u32 + 1;
        }
    }
    if pool.prefix_stats().evictions != 0 {
        return Err(format!("seed {seed:#x}: a round evicted"));
    }
    let init = PrefixState {
        cached: [0; PREFIX_KEYS],
        claims: [0; PREFIX_KEYS],
    };
    if linearize(&PrefixSpec, &init, &history, Some(&end)).is_none() {
        return Err(format!(
            "seed {seed:#x}: prefix-cache history is not linearizable (end state {end:?}):\n{}",
            show(&history)
        ));
    }
    Ok(())
}

#[test]
fn prefix_cache_histories_are_linearizable() {
    for round in 0..rounds() / 5 {
        if let Err(e) = prefix_round(0xCAC_0000 + round) {
            panic!("round {round}: {e}");
        }
    }
}

#[test]
fn prefix_checker_rejects_a_key_cached_twice_and_a_stale_miss() {
    let spec = PrefixSpec;
    let init = PrefixState {
        cached: [0; PREFIX_KEYS],
        claims: [0; PREFIX_KEYS],
    };
    // Two overlapping publishes of key 0 that both commit.
    let twice = vec![
        ev(0, 0, 3, PrefixOp::Claim { key: 0 }),
        then(0, 0, 3, PrefixOp::Commit { key: 0, block: 1 }),
        ev(1, 1, 2, PrefixOp::Claim { key: 0 }),
        then(1, 1, 2, PrefixOp::Commit { key: 0, block: 2 }),
    ];
    assert!(linearize(&spec, &init, &twice, None).is_none());
    // Two overlapping publishes that both lose, with nothing cached.
    let neither = vec![
        ev(0, 0, 3, PrefixOp::Claim { key: 0 }),
        then(0, 0, 3, PrefixOp::Lose { key: 0 }),
        ev(1, 1, 2, PrefixOp::Claim { key: 0 }),
        then(1, 1, 2, PrefixOp::Lose { key: 0 }),
    ];
    assert!(linearize(&spec, &init, &neither, None).is_none());
    // One commits, the other loses: fine.
    let one = vec![
        ev(0, 0, 3, PrefixOp::Claim { key: 0 }),
        then(0, 0, 3, PrefixOp::Commit { key: 0, block: 1 }),
        ev(1, 1, 2, PrefixOp::Claim { key: 0 }),
        then(1, 1, 2, PrefixOp::Lose { key: 0 }),
    ];
    assert!(linearize(&spec, &init, &one, None).is_some());
    // A miss after the publish returned.
    let stale = vec![
        ev(0, 0, 1, PrefixOp::Claim { key: 0 }),
        then(0, 0, 1, PrefixOp::Commit { key: 0, block: 1 }),
        ev(1, 2, 3, PrefixOp::Match { key: 0, hit: None }),
    ];
    assert!(linearize(&spec, &init, &stale, None).is_none());
    // A hit on another block than the one that cached the key.
    let wrong = vec![
        ev(0, 0, 1, PrefixOp::Claim { key: 0 }),
        then(0, 0, 1, PrefixOp::Commit { key: 0, block: 1 }),
        ev(
            1,
            2,
            3,
            PrefixOp::Match {
                key: 0,
                hit: Some(2),
            },
        ),
    ];
    assert!(linearize(&spec, &init, &wrong, None).is_none());
}

// ===========================================================================
// Negative control: check-then-add
// ===========================================================================

/// The third known wrong way: check the free count, then add in a separate
/// step. Two appenders can both pass the check.
struct CheckThenAdd {
    capacity: usize,
    used: AtomicUsize,
}

impl CheckThenAdd {
    fn try_reserve(&self, n: usize) -> Result<(), ReserveError> {
        if n > self.capacity {
            return Err(ReserveError::NeverFits {
                requested: n,
                capacity: self.capacity,
            });
        }
        // SeqCst (test code): the strongest ordering, so that what the
        // checker catches is the logical race, not a weak-memory effect.
        let used = self.used.load(Ordering::SeqCst);
        let available = self.capacity.saturating_sub(used);
        if n > available {
            return Err(ReserveError::Full {
                requested: n,
                available,
            });
        }
        // Widen the window between the check and the add (no sleep).
        thread::yield_now();
        // SeqCst: as above.
        self.used.fetch_add(n, Ordering::SeqCst);
        Ok(())
    }

    fn give_back(&self, n: usize) {
        // SeqCst: as above.
        self.used.fetch_sub(n, Ordering::SeqCst);
    }
}

/// One round against the check-then-add counter; `false` if its history
/// was not linearizable.
fn check_then_add_round(seed: u64) -> bool {
    let mut rng = Rng(seed);
    let cap = rng.range(2, 6) as usize;
    let bad = CheckThenAdd {
        capacity: cap,
        used: AtomicUsize::new(0),
    };
    let logs = run_threads(&mut rng, |rec, rng| {
        let mut held: Vec<usize> = Vec::new();
        for _ in 0..rng.range(1, MAX_OPS) {
            if !held.is_empty() && rng.below(3) == 0 {
                let n = held.swap_remove(0);
                rec.record(
                    || bad.give_back(n),
                    |_| CounterOp::GiveBack {
                        via: "give_back",
                        n,
                    },
                );
            } else {
                let n = rng.range(1, cap as u64) as usize;
                let r = rec.record(
                    || bad.try_reserve(n),
                    |&result| CounterOp::Reserve {
                        via: "check-then-add",
                        n,
                        headroom: 0,
                        result,
                    },
                );
                if r.is_ok() {
                    held.push(n);
                }
            }
        }
    });
    let history: Vec<Event<CounterOp>> = logs.into_iter().flat_map(|(events, ())| events).collect();
    let init = CounterState {
        used: 0,
        closed: false,
    };
    linearize(&CounterSpec { capacity: cap }, &init, &history, None).is_some()
}

#[test]
fn check_then_add_is_caught_as_not_linearizable() {
    const BUDGET: u64 = 2_000;
    let caught = (0..BUDGET).find(|&round| !check_then_add_round(0xBAD_0000 + round));
    assert!(
        caught.is_some(),
        "the checker passed {BUDGET} rounds of a check-then-add counter"
    );
    eprintln!("check-then-add caught in round {}", caught.unwrap());
}

// ===========================================================================
// The checker on hand-written histories
// ===========================================================================

fn ev<O>(thread: usize, call: u64, ret: u64, op: O) -> Event<O> {
    Event {
        thread,
        then: false,
        call,
        ret,
        op,
    }
}

/// The second step of the call in the event before.
fn then<O>(thread: usize, call: u64, ret: u64, op: O) -> Event<O> {
    Event {
        then: true,
        ..ev(thread, call, ret, op)
    }
}

fn reserve(n: usize, result: Result<(), ReserveError>) -> CounterOp {
    CounterOp::Reserve {
        via: "try_reserve",
        n,
        headroom: 0,
        result,
    }
}

const OPEN_EMPTY: CounterState = CounterState {
    used: 0,
    closed: false,
};

fn full(requested: usize, available: usize) -> Result<(), ReserveError> {
    Err(ReserveError::Full {
        requested,
        available,
    })
}

#[test]
fn checker_accepts_overlapping_calls_in_either_order() {
    let spec = CounterSpec { capacity: 3 };
    // B is invoked after A but must be linearized first: only then is
    // A's refusal (1 available) explained.
    let history = [
        ev(0, 0, 5, reserve(2, full(2, 1))),
        ev(1, 1, 2, reserve(2, Ok(()))),
    ];
    assert_eq!(
        linearize(&spec, &OPEN_EMPTY, &history, None),
        Some(vec![1, 0])
    );
    // A refusal of 2 that reports 3 free: no state explains it.
    let history = [
        ev(0, 0, 5, reserve(2, Ok(()))),
        ev(1, 1, 2, reserve(2, full(2, 3))),
    ];
    assert_eq!(linearize(&spec, &OPEN_EMPTY, &history, None), None);
    // A refusal that reports 1 free, while a reservation of 2 overlaps it:
    // explained by linearizing the reservation first.
    let history = [
        ev(0, 0, 5, reserve(2, Ok(()))),
        ev(1, 1, 2, reserve(3, full(3, 1))),
    ];
    assert_eq!(
        linearize(&spec, &OPEN_EMPTY, &history, None),
        Some(vec![0, 1])
    );
}

#[test]
fn checker_rejects_an_overcommit() {
    let spec = CounterSpec { capacity: 3 };
    // Both admitted while overlapping: no order makes 2 + 2 fit in 3.
    let history = [
        ev(0, 0, 3, reserve(2, Ok(()))),
        ev(1, 1, 2, reserve(2, Ok(()))),
    ];
    assert_eq!(linearize(&spec, &OPEN_EMPTY, &history, None), None);
    // With a give-back that overlaps both, it is explained.
    let history = [
        ev(0, 0, 3, reserve(2, Ok(()))),
        ev(0, 4, 9, CounterOp::GiveBack { via: "drop", n: 2 }),
        ev(1, 5, 6, reserve(2, Ok(()))),
    ];
    assert_eq!(
        linearize(&spec, &OPEN_EMPTY, &history, None),
        Some(vec![0, 1, 2])
    );
}

#[test]
fn checker_checks_the_available_count_of_a_refusal() {
    let spec = CounterSpec { capacity: 4 };
    let with = |available| {
        [
            ev(0, 0, 1, reserve(3, Ok(()))),
            ev(1, 2, 3, reserve(2, full(2, available))),
        ]
    };
    assert!(linearize(&spec, &OPEN_EMPTY, &with(1), None).is_some());
    for wrong in [0, 2, 4] {
        assert_eq!(
            linearize(&spec, &OPEN_EMPTY, &with(wrong), None),
            None,
            "available {wrong}"
        );
    }
}

#[test]
fn checker_respects_real_time_order() {
    let spec = CounterSpec { capacity: 4 };
    let read_zero = CounterOp::Used { seen: 0 };
    // The read starts after the reservation returned: it cannot see 0.
    let sequential = [
        ev(0, 0, 1, reserve(3, Ok(()))),
        ev(1, 2, 3, read_zero.clone()),
    ];
    assert_eq!(linearize(&spec, &OPEN_EMPTY, &sequential, None), None);
    // Overlapping: the read may go first.
    let overlapping = [ev(0, 0, 3, reserve(3, Ok(()))), ev(1, 1, 2, read_zero)];
    assert_eq!(
        linearize(&spec, &OPEN_EMPTY, &overlapping, None),
        Some(vec![1, 0])
    );
}

#[test]
fn checker_checks_the_end_state() {
    let spec = CounterSpec { capacity: 4 };
    let history = [
        ev(0, 0, 1, reserve(3, Ok(()))),
        ev(1, 2, 3, CounterOp::Close),
    ];
    let end = |used, closed| CounterState { used, closed };
    assert!(linearize(&spec, &OPEN_EMPTY, &history, Some(&end(3, true))).is_some());
    assert_eq!(
        linearize(&spec, &OPEN_EMPTY, &history, Some(&end(0, true))),
        None,
        "a leaked count must be caught"
    );
    assert_eq!(
        linearize(&spec, &OPEN_EMPTY, &history, Some(&end(3, false))),
        None
    );
}

#[test]
fn checker_orders_close_against_admissions() {
    let spec = CounterSpec { capacity: 4 };
    // Admitted after a close that returned before it was invoked.
    let history = [
        ev(0, 0, 1, CounterOp::Close),
        ev(
            1,
            2,
            3,
            CounterOp::Admit {
                requested: 2,
                admitted: 2,
            },
        ),
    ];
    assert_eq!(linearize(&spec, &OPEN_EMPTY, &history, None), None);
    let history = [
        ev(0, 0, 3, CounterOp::Close),
        ev(
            1,
            1,
            2,
            CounterOp::Admit {
                requested: 2,
                admitted: 2,
            },
        ),
    ];
    assert!(linearize(&spec, &OPEN_EMPTY, &history, None).is_some());
}

#[test]
fn checker_checks_release_errors() {
    let spec = CounterSpec { capacity: 4 };
    let release = |n, used| CounterOp::Release {
        n,
        result: Err(ReleaseError::ExceedsUsed { released: n, used }),
    };
    let history = |used| {
        [
            ev(
                0,
                0,
                1,
                CounterOp::Admit {
                    requested: 2,
                    admitted: 2,
                },
            ),
            ev(1, 2, 3, release(3, used)),
        ]
    };
    assert!(linearize(&spec, &OPEN_EMPTY, &history(2), None).is_some());
    assert_eq!(linearize(&spec, &OPEN_EMPTY, &history(0), None), None);
}

const POOL_EMPTY: PoolState = PoolState {
    used: 0,
    allocated: 0,
    closed: false,
    admitted: 0,
};

/// A successful allocation's two steps.
fn alloc(thread: usize, call: u64, ret: u64, ids: &[u32]) -> [Event<PoolOp>; 2] {
    [
        ev(
            thread,
            call,
            ret,
            PoolOp::Admit {
                n: ids.len(),
                headroom: 0,
                result: Ok(()),
                index: 0,
                overlapping: Vec::new(),
            },
        ),
        then(
            thread,
            call,
            ret,
            PoolOp::Take {
                n: ids.len(),
                ids: ids.to_vec(),
            },
        ),
    ]
}

/// A successful free's two steps.
fn free_ok(thread: usize, call: u64, ret: u64, ids: &[u32]) -> [Event<PoolOp>; 2] {
    [
        ev(
            thread,
            call,
            ret,
            PoolOp::Free {
                ids: ids.to_vec(),
                result: Ok(()),
            },
        ),
        then(thread, call, ret, PoolOp::GiveBack { n: ids.len() }),
    ]
}

#[test]
fn checker_checks_pool_ids() {
    let spec = PoolSpec {
        num_blocks: 3,
        shards: 1,
    };
    // Overlapping allocations handing out the same block.
    let history = [alloc(0, 0, 3, &[0, 1]), alloc(1, 1, 2, &[1])].concat();
    assert_eq!(linearize(&spec, &POOL_EMPTY, &history, None), None);
    // A duplicate within one allocation, or an id out of range.
    for ids in [&[2, 2][..], &[3][..]] {
        assert_eq!(
            linearize(&spec, &POOL_EMPTY, &alloc(0, 0, 1, ids), None),
            None
        );
    }
    // Fewer ids than admitted.
    let mut short = alloc(0, 0, 1, &[1, 2]);
    short[1].op = PoolOp::Take { n: 2, ids: vec![1] };
    assert_eq!(linearize(&spec, &POOL_EMPTY, &short, None), None);
    // Disjoint is fine; the freed block can be handed out again.
    let history = [
        alloc(0, 0, 3, &[0, 1]),
        alloc(1, 1, 2, &[2]),
        free_ok(1, 4, 5, &[2]),
        alloc(0, 6, 7, &[2]),
    ]
    .concat();
    assert!(linearize(&spec, &POOL_EMPTY, &history, None).is_some());
    // A double free must be refused, and with the right error.
    let history = |result| {
        let mut h = alloc(0, 0, 1, &[0]).to_vec();
        h.push(ev(
            0,
            2,
            3,
            PoolOp::Free {
                ids: vec![0, 0],
                result,
            },
        ));
        h
    };
    let over = Err(FreeError::OverFreed {
        id: BlockId::new(0),
    });
    let not = Err(FreeError::NotAllocated {
        id: BlockId::new(0),
    });
    assert!(linearize(&spec, &POOL_EMPTY, &history(over), None).is_some());
    assert_eq!(linearize(&spec, &POOL_EMPTY, &history(not), None), None);
    // (An `Ok` has a second step, so a lone `Ok` free is malformed here.)
}

/// A refused allocation of `n` that reported `available`.
fn refused(thread: usize, call: u64, ret: u64, n: usize, available: usize) -> Event<PoolOp> {
    ev(
        thread,
        call,
        ret,
        PoolOp::Admit {
            n,
            headroom: 0,
            result: full(n, available),
            index: 0,
            overlapping: Vec::new(),
        },
    )
}

#[test]
fn checker_catches_an_unjustified_full() {
    let spec = PoolSpec {
        num_blocks: 4,
        shards: 2,
    };
    let check = |mut history: Vec<Event<PoolOp>>| {
        annotate_transit(&mut history, 4);
        linearize(&spec, &POOL_EMPTY, &history, None).is_some()
    };
    // Alone, a refusal must report exactly the free blocks, and only when
    // too few are free.
    assert!(!check(vec![refused(0, 0, 1, 4, 4)]));
    assert!(!check(vec![refused(0, 0, 1, 3, 2)]));
    let mut history = alloc(0, 0, 1, &[0, 1]).to_vec();
    history.push(refused(0, 2, 3, 3, 2));
    assert!(check(history));
    let mut history = alloc(0, 0, 1, &[0, 1]).to_vec();
    history.push(refused(0, 2, 3, 3, 1));
    assert!(!check(history));
    // With another allocation of 1 running (it may hold one block in
    // transit), a refusal of 4 may report 3 free, but not 2: the blocks
    // missing from its count must be ones the other call could hold.
    let other = || alloc(1, 0, 10, &[2]).to_vec();
    let mut history = other();
    history.push(refused(0, 1, 2, 4, 3));
    assert!(check(history));
    let mut history = other();
    history.push(refused(0, 1, 2, 4, 2));
    assert!(!check(history));
    // Once the other call has returned, its block is held, not in transit:
    // 3 free, and a refusal of 3 is not justified.
    let mut history = alloc(1, 0, 1, &[2]).to_vec();
    history.push(refused(0, 2, 3, 3, 2));
    assert!(!check(history));
    // And a refusal is never justified by a count above the free blocks.
    let mut history = other();
    history.push(refused(0, 11, 12, 4, 4));
    assert!(!check(history));
}

/// A specification whose calls are lists of another's steps, applied
/// atomically: a two-step call made one-step.
struct Fused<S>(S);

impl<S: Spec> Spec for Fused<S> {
    type State = S::State;
    type Op = Vec<S::Op>;

    fn step(&self, state: &S::State, ops: &Vec<S::Op>) -> Option<S::State> {
        ops.iter()
            .try_fold(state.clone(), |s, op| self.0.step(&s, op))
    }
}

#[test]
fn checker_tells_a_two_step_allocation_from_an_atomic_one() {
    // Thread 0's allocation is admitted, then preempted before it takes an
    // id; meanwhile thread 1 takes block 0 and frees it, and thread 2 sees
    // the count include thread 0 all along. Thread 0 then takes block 0.
    let spec = PoolSpec {
        num_blocks: 2,
        shards: 1,
    };
    let reads = |t, call, seen| {
        ev(
            t,
            call,
            call + 1,
            PoolOp::FreeBlocks {
                seen,
                overlapping: Vec::new(),
                alone: false,
            },
        )
    };
    let mut history = alloc(0, 0, 20, &[0]).to_vec();
    history.extend(alloc(1, 1, 2, &[0]));
    history.push(reads(2, 3, 0));
    history.extend(free_ok(1, 5, 6, &[0]));
    history.push(reads(2, 7, 1));
    assert!(linearize(&spec, &POOL_EMPTY, &history, None).is_some());
    // As one atomic step per call, no order explains it: taking block 0
    // before thread 1 does clashes with thread 1's allocation, and taking
    // it after thread 1 freed it contradicts the first read (none free).
    let mut fused: Vec<Event<Vec<PoolOp>>> = Vec::new();
    for e in history {
        if e.then {
            fused.last_mut().unwrap().op.push(e.op);
        } else {
            fused.push(Event {
                op: vec![e.op],
                thread: e.thread,
                then: false,
                call: e.call,
                ret: e.ret,
            });
        }
    }
    assert_eq!(linearize(&Fused(spec), &POOL_EMPTY, &fused, None), None);
}

// ===========================================================================
// A refused free must be atomic
// ===========================================================================

/// Probes per round in the two tests below.
const PROBES: usize = 1_000;

/// Thread Z owns block `a` and keeps freeing it and taking it back
/// (`free(&[a])`, then `try_alloc(1)`, which can only return `a`). Thread X
/// keeps calling `free(&[a, a])`, a double free, which is always refused
/// (`OverFreed` while `a` is allocated, `NotAllocated` while it is free)
/// and, by contract, changes nothing. So when Z frees `a`, `a` has been
/// allocated since Z took it, and the only linearizable result is `Ok`; a
/// `NotAllocated` means Z saw a state that X's refused call left only in
/// between (it drops its references one by one and puts them back when it
/// meets the bad id).
#[test]
fn refused_free_is_atomic_for_a_concurrent_double_free() {
    let rounds = rounds() / 10;
    let mut seen_inside = 0;
    for round in 0..rounds {
        let pool = BlockPool::new(1, 16);
        let mut out = Vec::with_capacity(1);
        pool.try_alloc(1, &mut out).unwrap();
        let a = out[0];
        let barrier = Barrier::new(2);
        let done = AtomicBool::new(false);
        thread::scope(|s| {
            s.spawn(|| {
                barrier.wait();
                // Relaxed (test code): only ends the loop; orders nothing.
                while !done.load(Ordering::Relaxed) {
                    match pool.free(&[a, a]) {
                        Err(FreeError::OverFreed { id } | FreeError::NotAllocated { id })
                            if id == a => {}
                        other => panic!("round {round}: free([a, a]) returned {other:?}"),
                    }
                }
            });
            s.spawn(|| {
                barrier.wait();
                for _ in 0..PROBES {
                    match pool.free(&[a]) {
                        Ok(()) => {
                            out.clear();
                            assert_eq!(pool.try_alloc(1, &mut out), Ok(()), "round {round}");
                            assert_eq!(out, [a], "round {round}");
                        }
                        Err(FreeError::NotAllocated { id }) if id == a => seen_inside += 1,
                        other => panic!("round {round}: free([a]) returned {other:?}"),
                    }
                }
                // Relaxed: as above.
                done.store(true, Ordering::Relaxed);
            });
        });
    }
    assert_eq!(
        seen_inside,
        0,
        "{seen_inside} of {} frees of an allocated block were refused with \
         NotAllocated: they saw the inside of a concurrent refused free([a, a])",
        rounds * PROBES as u64
    );
}

/// Blocks `a1..a6` are held by a sequence, and thread Y keeps forking the
/// sequence and dropping the fork (so each goes from one reference to two
/// and back). Thread X keeps calling `free(&[a1, .., a6, a1, a1])`, a
/// double free of a sequence's blocks: each call is refused with
/// `HeldBySequence { a1 }` and, by contract, changes nothing. So the `a`s
/// must stay allocated all along, with the sequence's references. (A
/// refusal found only after dropping `a1`, and then undone, would let Y's
/// drop of the fork be the last one: `a1` would go back to the free list
/// while the sequence still holds it, and the undo would give the free
/// block a reference.)
#[test]
fn refused_free_leaves_a_shared_block_allocated() {
    const SHARED: usize = 6;
    let rounds = rounds() / 10;
    let mut corrupted = Vec::new();
    for round in 0..rounds {
        // Blocks of one token, so that every appended token fills a block
        // and forking allocates no block.
        let pool = Arc::new(BlockPool::new(SHARED, 1));
        let mut parent = Sequence::new(Arc::clone(&pool));
        parent.try_append(SHARED).unwrap();
        let a1 = parent.blocks()[0];
        let mut list = parent.blocks().to_vec();
        list.extend([a1, a1]);
        let barrier = Barrier::new(2);
        let done = AtomicBool::new(false);
        let (x_saw, y_saw) = thread::scope(|s| {
            let x = s.spawn(|| {
                barrier.wait();
                // Relaxed (test code): only ends the loop; orders nothing.
                while !done.load(Ordering::Relaxed) {
                    let result = pool.free(&list);
                    if result != Err(FreeError::HeldBySequence { id: a1 }) {
                        return Some(format!("free(list) returned {result:?}"));
                    }
                }
                None
            });
            // Y alone calls the parent meanwhile (a sequence is not `Sync`).
            let (barrier, done, pool, parent) = (&barrier, &done, &pool, &mut parent);
            let y = s.spawn(move || {
                barrier.wait();
                let mut saw = None;
                for _ in 0..PROBES {
                    // A debug assertion in the fork's drop may catch the
                    // damage first (its own free is refused).
                    let probe = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        drop(parent.try_fork().unwrap().0);
                    }));
                    // Only X's refused frees touch the pool besides us, and
                    // they must change nothing: the blocks are still in use.
                    if probe.is_err() || pool.used_blocks() != SHARED {
                        saw = Some(format!(
                            "after a fork's drop: {} blocks in use{}",
                            pool.used_blocks(),
                            if probe.is_err() {
                                ", and the drop panicked"
                            } else {
                                ""
                            }
                        ));
                        break;
                    }
                }
                // Relaxed: as above.
                done.store(true, Ordering::Relaxed);
                saw
            });
            (x.join().unwrap(), y.join().unwrap())
        });
        let intact = parent
            .blocks()
            .iter()
            .all(|&id| pool.ref_count(id) == Some(1));
        if x_saw.is_none() && y_saw.is_none() && pool.used_blocks() == SHARED && intact {
            drop(parent);
            assert_eq!(pool.used_blocks(), 0, "round {round}");
        } else {
            corrupted.push(format!("round {round}: {x_saw:?} {y_saw:?}"));
            // Some of its blocks may be in the free list already: dropping
            // the parent could free them a second time.
            std::mem::forget(parent);
        }
    }
    assert!(
        corrupted.is_empty(),
        "in {} of {rounds} rounds, a refused free([a1, .., a6, a1, a1]) raced with \
         the drop of a fork sharing the a's, and the parent's blocks were damaged \
         (given back to the pool while the parent holds them, or the fork's own \
         free refused); first: {}",
        corrupted.len(),
        corrupted[0]
    );
}
