//! Lock-free, all-or-nothing KV-cache block allocation for multi-threaded
//! LLM inference workers.
//!
//! An inference server keeps every running sequence's keys and values in a
//! fixed pool of device memory, cut into blocks of token slots. A
//! multi-token append (a prefill chunk, `k` speculative draft tokens, a
//! fork for parallel sampling) must take **all its blocks or none**: a
//! partial admission leaks blocks and stalls the scheduler, an overcommit
//! overwrites another sequence's cache. `kvslots` keeps that rule without a
//! lock, so that many worker threads can admit, grow, roll back, fork,
//! cache and free at once.
//!
//! # Usage
//!
//! * [`BlockPool`]: a paged KV cache of `num_blocks` blocks of `block_size`
//!   slots; [`BlockPool::try_alloc`] takes `n` distinct block ids or none,
//!   [`BlockPool::free`] drops references, all or nothing (see
//!   [`FreeError::Raced`] for the one exception). [`BlockPool::new`] builds
//!   a pool with the prefix cache (KV events are the builder's); [`BlockPool::builder`] picks its shards and
//!   layers ([`BlockPoolBuilder::prefix_cache`]: the core pool takes 8
//!   bytes and two bits a block, the prefix cache 70 more) and returns a
//!   [`ConfigError`] for a configuration it refuses (a zero block size, too
//!   many blocks or shards, too little memory) where `new` panics.
//! * [`Sequence`]: one sequence's block table over a shared pool: the
//!   multi-token append ([`Sequence::try_append`]), whole-prompt reservation
//!   ([`Sequence::try_reserve`]), the slot mapping kernels take
//!   ([`Sequence::slot`], [`Sequence::extend_slots`]), rollback
//!   ([`Sequence::truncate`]) and forks that share full blocks
//!   ([`Sequence::try_fork`], with the [`BlockCopy`] to make).
//!   [`Sequence::try_append_cow`] is the append after a truncate into a
//!   block shared with a fork, returning the copy-on-write to make
//!   ([`Sequence::try_append`] panics there rather than lose it).
//! * [`HybridSequence`]: one sequence of a hybrid model (Gemma 2/3,
//!   gpt-oss, Mistral's sliding-window models: sliding-window layers beside
//!   full-attention ones; Llama 4: chunked local attention beside full), a
//!   [`Sequence`] table per group of layers ([`KvGroups`] of
//!   [`KvGroup::Full`], [`KvGroup::SlidingWindow`] and
//!   [`KvGroup::ChunkedLocal`]) over one pool. Its appends, reservations and forks take every group's
//!   blocks with one admission, all or nothing across the groups; a
//!   sliding group gives back, in the same append, the blocks wholly
//!   before its window ([`BlockId::NULL`] entries in its table), reusing
//!   them for the append's new blocks when it holds them alone; its
//!   prefix match ([`HybridSequence::try_match_prefix`], with each group's
//!   [`GroupKeys`]) takes the longest prefix every group can serve (a full
//!   group needs every block, a sliding group only its window at the
//!   hit).
//! * [`BlockAllocator`]: what a sequence needs from its pool, as a trait:
//!   `Sequence<A = BlockPool>` runs over any allocator (the simulator's
//!   mutex baseline is one), a trait object included. Its calls that change
//!   a sequence's blocks take a [`SequenceCall`], which only the crate's
//!   sequences build.
//! * Prefix caching (a pool built with it): [`hash_blocks`] computes the
//!   content keys ([`BlockHash`]) of a prompt's full blocks, and
//!   [`hash_blocks_with`] also folds in tagged extra keys ([`ExtraKey`]:
//!   LoRA adapters, cache salts, multimodal inputs) per block;
//!   [`Sequence::publish`] caches a sequence's full blocks under them, and
//!   [`Sequence::try_match_prefix`] takes the cached blocks of the longest
//!   matching prefix into a new sequence; [`BlockPool::peek_prefix`] (and
//!   [`BlockPool::peek_hybrid_prefix`]) counts them without taking them,
//!   for a scheduler that ranks or budgets waiting requests by their hits.
//!   Unreferenced cached blocks count as free and are evicted least
//!   recently released first; [`BlockPool::prefix_stats`] reports hits and
//!   evictions.
//! * KV events for KV-aware routers (a pool built with
//!   [`BlockPoolBuilder::kv_events`]): the prefix cache's stores and
//!   removals as [`KvEvent`]s in vLLM's shapes, recorded lock-free in
//!   bounded rings and handed over in numbered batches by
//!   [`BlockPool::drain_events`], each key's events in order (a hybrid
//!   sequence's under its groups' keys, a chain per group).
//! * Metrics: [`BlockPool::stats`] returns every gauge and counter of the
//!   pool in one [`PoolStats`].
//! * Fenced release, for asynchronous scheduling: [`Sequence::retire`] and
//!   [`Sequence::truncate_fenced`] keep the blocks a device step may still
//!   read in use until [`BlockPool::complete`] declares the step's fence
//!   done (fences complete in any order);
//!   [`BlockPool::pending_release_blocks`] counts them.
//! * Waiting instead of retrying: [`BlockPool::alloc`],
//!   [`Sequence::reserve`], [`SlotCounter::reserve`] and
//!   [`SlotCounter::reserve_owned`] are futures, and each has a
//!   `*_blocking` form for thread-based workers (see [Waiting](#waiting)).
//! * [`SlotCounter`]: the admission rule applied atomically to a shared
//!   count of token slots, as plain counts ([`SlotCounter::admit`] /
//!   [`SlotCounter::release`]) or as RAII guards ([`Reservation`],
//!   [`OwnedReservation`]) that can be split, merged, shrunk (speculative
//!   rollback), grown and forgotten; [`admit`] is the rule as a pure
//!   `const fn`.
//! * `close` ([`BlockPool::close`], [`SlotCounter::close`]) stops
//!   admission while releases keep working, so workers can drain on
//!   shutdown.
//! * [`table`]: the block-table arithmetic `Sequence` applies, for block
//!   tables kept elsewhere.
//!
//! Every refusal is a typed error (the error enums are `#[non_exhaustive]`)
//! and changes nothing.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use std::thread;
//! use kvslots::SlotCounter;
//!
//! let counter = Arc::new(SlotCounter::new(64));
//! let workers: Vec<_> = (0..4)
//!     .map(|_| {
//!         let counter = Arc::clone(&counter);
//!         thread::spawn(move || {
//!             // A 12-token prefill chunk: all of it, or nothing.
//!             if let Ok(mut chunk) = counter.try_reserve(12) {
//!                 // 4 speculative draft tokens, of which 1 is accepted.
//!                 if chunk.try_grow(4).is_ok() {
//!                     chunk.shrink_to(13);
//!                 }
//!                 assert!(counter.used() <= counter.capacity());
//!             } // dropped: its slots go back
//!         })
//!     })
//!     .collect();
//! for w in workers {
//!     w.join().unwrap();
//! }
//! assert_eq!(counter.used(), 0);
//! ```
//!
//! A paged cache, as a worker thread uses it:
//!
//! ```
//! use std::sync::Arc;
//! use kvslots::{BlockPool, Sequence};
//!
//! let pool = Arc::new(BlockPool::new(64, 16));
//! let mut seq = Sequence::new(Arc::clone(&pool));
//! seq.try_reserve(100, 4).unwrap(); // admit a 100-token prompt, 4 blocks of headroom
//! let mut slots = Vec::new();
//! for chunk in [64, 36] {
//!     let positions = seq.try_append(chunk).unwrap(); // chunked prefill
//!     slots.clear();
//!     seq.extend_slots(positions, &mut slots).unwrap(); // the kernel's slot mapping
//! }
//! let drafts = seq.try_append(4).unwrap(); // 4 speculative tokens
//! seq.truncate(drafts.start + 1); // 1 accepted
//! assert_eq!(seq.len(), 101);
//! drop(seq);
//! assert_eq!(pool.free_blocks(), 64);
//! ```
//!
//! # Waiting
//!
//! A request that does not fit can wait in the allocator's queue: waiters
//! are served strictly in arrival order, each granted whole, with or
//! without headroom (the units are taken on the waiter's behalf by the
//! release that frees them, and its task is woken), and a new caller
//! never passes a queued waiter: a new waiter queues behind it, and while
//! anyone waits a `try_*` admission takes units only if the waiters, each
//! granted in order with its headroom, still fit beside it (otherwise
//! [`ReserveError::BehindWaiters`]). The growth of running sequences does
//! not wait behind the queue. `NeverFits` is returned at once (for a
//! [`Sequence`], also a request that cannot fit beside its own blocks);
//! `close` wakes every waiter with `Closed`; a blocking call's timeout
//! returns `Full` or `BehindWaiters`. Dropping a waiting future is always
//! safe: it gives back anything granted to it and lets the waiters behind
//! it be served. Wakers run outside the queue's lock. The
//! library uses std's `Waker` and depends on no async runtime. The
//! [design notes](implementation#waiting) give the rules (with a table of
//! who gets what, including how running sequences keep room to grow) and
//! where a lock is taken; `examples/async_worker.rs` and
//! `examples/blocking_worker.rs` show a worker of each kind.
//!
//! The growth of running sequences does not wait behind a queued head,
//! but it cannot take back what the head was granted: the release that
//! lets the head in grants it there and then, before the running
//! sequences' next steps can grow into the blocks. Schedulers that share
//! a pool and queue their idle workers' admissions there give those
//! admissions the room their running sequences would have grown into,
//! and preempt more. A sequence that holds nothing (or only what it
//! matched with no reservation) is new work, whose first append waits
//! behind the queue: a scheduler that admits a prompt by a check rather
//! than a reservation keeps its first block (a
//! [`Sequence::try_reserve`] of it, the rest of the prompt as headroom),
//! so that its chunks are growth. A scheduler that must not lose its
//! running sequences' room to new admissions retries its admission (a
//! `try_*` call on a timer) instead of queueing, as vLLM's scheduler serves its running
//! requests before its waiting ones; the queue is for callers that must
//! not be starved (`kvslots-sim --idle-wait` measures both, in
//! `BENCHMARKS.md`).
//!
//! ```
//! use std::sync::Arc;
//! use kvslots::SlotCounter;
//!
//! let counter = Arc::new(SlotCounter::new(8));
//! let held = counter.try_reserve_owned(8).unwrap();
//! let worker = std::thread::spawn({
//!     let counter = Arc::clone(&counter);
//!     move || counter.reserve_blocking(6, None).map(|r| r.len())
//! });
//! drop(held); // hands the slots to the waiter, whenever it queued
//! assert_eq!(worker.join().unwrap(), Ok(6));
//! ```
//!
//! # Correctness
//!
//! `kvslots` is `#![forbid(unsafe_code)]`. Its atomics go through one facade
//! module, so the same code runs under [loom] (`--cfg kvslots_loom`), which
//! explores every interleaving of the counter's two-thread models and the
//! other models' interleavings up to a preemption bound
//! (`LOOM_MAX_PREEMPTIONS`, 2 in CI and by default; five models search at
//! 1), and
//! under [shuttle] (`--cfg kvslots_shuttle`), which runs randomised and PCT
//! schedules of 8 threads. The loom models are the crate's own unit tests
//! (`src/loom_tests/`, compiled only under `cfg(all(test, kvslots_loom))`,
//! as tokio keeps its own); the shuttle schedules drive the public API from
//! `tests/`. Every loom model has a negative control: a known wrong way
//! (admitting token by token, a free list that takes without a
//! read-modify-write, `Relaxed` frees, a raw free that takes a sequence's
//! reference, a publish without its release, and others) injected into the
//! same code, which loom must catch. The faults are crate-private and exist
//! only in the models' build (elsewhere their hooks are constants), and no
//! public item exists for the model checkers. Rayon stress tests drive
//! millions of mixed operations on many threads while an observer samples
//! the invariants, a linearizability checker replays recorded histories,
//! property tests compare against sequential models, and the census runs
//! every public function with bad input. The README lists the commands.
//!
//! | guarantee | verified by |
//! |---|---|
//! | a request is admitted whole or not at all | seed fixtures; loom models of every operation pair; stress; linearizability checker; shuttle |
//! | `used <= capacity` at every instant, under any interleaving | loom shadow counters; stress observers sampling during the run; shuttle |
//! | check and add are one atomic step | loom negative control: check-then-add must be caught |
//! | close is linearizable with admission | loom close-vs-admit; linearizability checker |
//! | no block has two owners; nothing leaks | loom ownership arrays and conservation; stress ownership array; shuttle; property tests against a sequential model |
//! | a request spanning several free-list shards is still all or nothing; a freed block goes back to the shard that owns it | loom models on two shards; stress, property tests and shuttle over sharded pools |
//! | a pool admits through per-shard free counts: all or nothing across shards; a `BlockPool` `Full` is exact single-threaded and, under concurrency, justified (at some instant of the call, the free blocks outside other running calls, which may hold blocks in transit between shards, were fewer than requested); `free_blocks()`/`used_blocks()` are sums, exact when no call runs; `peak_used_blocks()` exact single-threaded, an estimate otherwise | loom fast-path and gather-vs-gather models (controls: a plain-store take, a refused gather that keeps what it took); a unit test that moves counts behind a gather's scan (it fails if a gather refuses without its version check); linearizability checker with the relaxed `Full` (an unjustified refusal must be caught); shuttle and stress over sharded pools |
//! | what a slot holder wrote happens-before the next holder's admission | loom hand-off models (guard drop and `release`); `Relaxed` admission and give-back controls must be caught |
//! | a freed block's contents happen-before its next owner | loom `UnsafeCell` witness; a `Relaxed` free control must be caught |
//! | the free list hands a free block to one taker: one CAS takes up to 64 blocks from a bitmap word (no ABA: a word's value names exactly its free blocks) | loom controls whose take is a load and a plain store must be caught, on one shard and across two; a real-thread storm of small takes |
//! | a double free racing any give-back (a raw `free`, a sequence's drop, truncate or `shrink_to_fit`, a copy-on-write source, a fork, a publish) gives no block back twice, gives the used count back once per block, and leaves no key on a block that an allocation hands out; a raw `free` refuses a block that sequences hold (`FreeError::HeldBySequence`, nothing changed), in its checks and in its CAS; no code outside the crate can change a sequence-held block's word (the `BlockAllocator` calls that would take a `SequenceCall`, which only the crate builds; `BlockPool::add_refs` refuses the block as `free` does), except an allocator implementation that breaks the trait's contract with the token it is given during a call, so a sole holder gives its block back with a load and a plain store, and a fresh block (8 or more taken from one word of the free list, its reference uncounted and marked in the fresh bitmap) with no write of its word (and, in a run of fresh blocks, no read either) | loom models (`fresh.rs`: two takes' marks in one bitmap word, a fork's and a publish's count of fresh blocks against the drops, `ref_count` against the count, a raw free of a fresh block against its give-back; controls: a plain mark, a store of the whole word by a holder of part of it, a count that leaves the mark, a `Relaxed` clear, a raw free that takes the uncounted reference; `whole_attack.rs`: a whole short word's fork, truncate, fence and a two-shard give-back against a rival's take), with controls for a raw free that ignores the sequence flag (racing a sequence's plain drop, and a stale free of a block a sequence took since), an unchecked fork and a publisher's claim without its own reference that must be caught; real-thread races (a stale double free racing a sequence that retakes the blocks; a raw `free` or `add_refs` racing a sequence's drop, and a fork's parent and child dropped at once, in `tests/release_race.rs`) and random misuse rounds; loom models of a fork's co-holder racing the sole drop, with the double release through the token (misuse only the crate could write) as the control; compile-fail examples that outside code cannot build the token |
//! | bad input is a typed error and changes nothing (one exception: a double free caught racing another holder's free is `FreeError::Raced`, and the call's other references are dropped) | the census (`tests/census.rs`): every public function with 0, 1, `usize::MAX`, out-of-range, duplicated and foreign ids and after `close`, each row's typed error and unchanged state; a pool too large for memory under an address-space limit; the racing case by a loom model and the linearizability checker; the simulator's flags and trace malformations in `sim/tests/census.rs` |
//! | a block retired under a fence is not handed out before the fence completes, in any completion order | unit tests; a real-thread stress; loom retire and fenced-truncate vs complete vs alloc, with an early-release control that must be caught; `kvslots-sim --async-depth` and its `early-release` fault |
//! | a match returns only blocks whose key is the one asked for, and what the publisher wrote before `publish` happens-before the matcher's use; a held block is never evicted; a cached block is never written while its key can match | loom models (match vs evicting append, two revivals, release vs match, reset vs match, a match's revivals admitted ahead vs an evicting append, an `UnsafeCell` witness) with controls for a revival without the generation check, a `Relaxed` publish, eviction of a referenced block and a match that keeps what it admitted ahead and did not use; rayon and real-thread stress with per-block content stamps; real-thread attacks on long matches whose revivals are admitted in runs, on full pools, into reservations, beside waiters, resets and a close (`tests/ahead_attack.rs`); linearizability checker and property tests against a sequential cache |
//! | a key is on at most one block (first wins), and a publish that returns without caching its key saw a block holding it: a rival it deferred to commits or looks again | loom models of two and three publishes of one key, of two holders of one block publishing it at once, and of a rival's block reclaimed under another key, held alone or shared (controls: a publisher that does not kill a rival, a claim that gives up on a deferral, a claim that rivals can see before its key is written, by CAS or by a sole holder's store, a store claim on a shared block); `tests/forwarded_publish.rs` (a forwarder that counts a fork's share itself, so the pool counts one reference for two holders, whose parent and fork publish their block at once: cached once, never evictable while held); shuttle PCT and real-thread races of three publishes |
//! | a publish offers every full block not known to hold a key: it skips only the blocks the sequence matched or that a publish left cached (by it, or by another holder such as a fork's parent), and offers again a block whose key is on another block, or whose claim another holder had in flight, until it gets its key | `tests/mark_attack.rs` (random scripts checked block by block against a per-key probe, threads of forks, matches, truncates, resets and evictions, families and rivals publishing one block at once, hybrid scripts, custom and forwarding allocators); loom `mark.rs` (a fork's publish that finds its parent's claim in flight, which then loses; control `claim_refused_as_cached`) |
//! | eviction takes the least recently released evictable block first: exactly with one thread (an exact-LRU reference's hits on the Mooncake trace, whatever the keys); with more, nearly (an evictor never reads a candidate slot that a refill is rewriting, a block a race left out of the eviction ring keeps it overflowed until a refill whose scan began after the race finds it, a block released during a refill's scan ranks youngest) | `tests/prefix_replay.rs` (hits and evictions equal to a sequential LRU cache's); `tests/prefix_lru_threads.rs` (warm prefixes on a full pool survive with one and two threads); loom models of an evictor against a refill (control: candidates claimed before they are copied) and of a release against a refill of an overflowed ring (controls: a refill clears the overflow whatever appends missed during its scan; a refill judges its fit by its first pass, which a release between its passes outdates), and of a release whose append read the overflowed bit clear racing a refill that publishes bucket by bucket (control: a refill that takes what it published before its raced publish for the whole refill); `tests/prefix_lru_races.rs` (after threads race, no block is left behind younger ones); unit tests of the refill's selection (skewed, repeated and far-apart stamps, stamps ahead of its clock, marked candidates) and of one thread's eviction order with stamps over 2^31, 2^32 and 2^42 apart, through refills, sweeps and stale candidates |
//! | KV events report each key's stores and removals once each, in the order of its transitions (a store before its removal, a removal from one block before the store on the next); events lost to a full ring are counted and reported where they were lost, and the view rebuilt after that report never holds a removed key | loom models of an eviction and a truncate racing a republish of the key, a drain racing a publish, a full ring (controls: a removal reserved after its CAS, a store reserved before its claim, a record published `Relaxed`, an uncounted loss); real threads with a draining consumer checked against the pool's final state, with a ring that never fills and one that overflows, a hybrid publish's chain per group under the group keys (`tests/events.rs`); the simulator's events file on synthetic, Mooncake and hybrid runs |
//! | a match into a reservation keeps the capacity (the matched blocks take the first reserved blocks' places), and a reserved block lent to pay for a revival is free before the revival takes the evictable block: the counter never says more blocks are free than the free list and the evictable blocks hold; a lent block whose revival lost its race takes a block back; a closed pool lends nothing | loom `match_into_a_reservation_vs_evicting_append` (control: a lend that gives its admission back as well); `tests/reservation_attack.rs` (real threads with evicting appenders, waiters, async waiters, resets, shards, KV events and a concurrent close; waker panics out of the give-back; forwarding allocators with and without lending); `tests/prefix.rs` |
//! | a peek (`BlockPool::peek_prefix`) counts only keys cached at a moment of the call (no torn or uncommitted key, never another key's block found through a shared fingerprint), takes nothing and changes no order or count; with nothing running it equals the match that follows, and a hybrid peek the hybrid match | loom `peek_vs_republish` (torn keys included) and `peek_of_a_colliding_key` (controls: key words stored `Relaxed`, no second read of the state, no key comparison); `tests/peek_attack.rs` (torn keys under real-thread churn, crafted and misuse lists, pools around the filter's sizes, a brute-force hybrid model); the `model` and `hybrid_model` property tests (a peek before every match) |
//! | no heap allocation on the hot paths | a counting global allocator (the KV event producers included) |
//! | a layer not chosen takes no memory (8 bytes and two bits a block for the core pool, 70 more for the prefix cache); on a pool without the prefix cache its calls cache nothing and change nothing; a core pool behaves as a full one in everything else | a counting global allocator (`tests/footprint.rs`); `tests/layers.rs`: each prefix call's result and the unchanged state, random scripts with the same outcomes on both kinds of pool |
//! | a `HybridSequence` takes every group's blocks with one admission (never some groups' blocks without the others'); a window (a sliding window, or a chunked group's chunk) gives back only blocks no later token reads, and reuses only blocks it holds alone and uncached; a match holds exactly what every group needs at the hit, under each group's own keys, and a match into a reservation leaves every group as many blocks as it reserved beyond the hit (planned first, taking nothing, for the hit whose revivals it can pay for, so that it lets go of a block only when the cache or the pool's room changed since; capacity kept unless a concurrent match takes a block it let go of while the pool is full; the pool's admission counting each block once); its blocks are a sequence's, so a raw `free` of one is refused (`HeldBySequence`) on every path (appends, reservations, a window's reuse, forks, matches, a fence's retirement) | `tests/hybrid_model.rs` (random scripts against a reference model over sliding, chunked and full layouts and block sizes of 1 to 8: shapes, null entries, references, truncate's shortest length and the hit by brute force); `tests/hybrid.rs` (every rule and bad input, the state unchanged on refusal, a raw free refused on each path); `tests/hybrid_reservation_attack.rs` (matches into reservations against brute force, looking up only what they keep, behind waiters, with wakers that panic, and with real threads over a shadow); `tests/hybrid_shortfall_attack.rs` (the plan behind waiters, wakers inside the match, two matchers of one prompt in lockstep, stress with evicting appenders and resets, misuse); loom models of two hybrid sequences (controls: admission group by group, reuse without the check, a match that settles each group once, a match into a reservation that releases what it lets go of and keeps its credit, a `Relaxed` give-back) and of a window's give-back and reuse against a raw double free (control: a raw free that ignores the sequence flag); the simulator's hybrid presets, checked by its oracle per group (a grant left short topped up or given back) |
//! | a `Sequence` keeps its rules over any `BlockAllocator` | `tests/allocator.rs` (a third allocator, with the trait's default prefix calls, trait objects, and an allocator that forwards to a `BlockPool`, passing the token through); the simulator runs its mutex baseline as a `MutexPool` under the same `Sequence`, checked by its oracle, with parity of results on random scripts (`sim/tests/parity.rs`) |
//! | an allocator method that unwinds leaves a `Sequence` or `HybridSequence` whole (no block given back twice or before its fence, none lost that the sequence held), and an allocation that is not all or nothing is a panic before the sequence changes | `tests/allocator_faults.rs` (an allocator that keeps its own books, with one fault at a time: a `retire`, `needs_copy`, allocation or `block_size` that unwinds, an allocation with too few or too many ids, a `needs_copy` that turns from false to true, an `add_refs` that overcounts) |
//! | waiters are served whole, in arrival order, with or without headroom, with no lost wake-up; a new caller (waiting or `try_*`) never passes a queued waiter, and a `try_*` refused for the waiters says so (`BehindWaiters`); cancellation and timeouts hand on what was granted; a waker that panics loses no block and keeps no other waiter from being woken, and the call its panic comes out of leaves its sequence or pool whole; `close` wakes every waiter | unit tests (`tests/wait.rs`: a relay of small admissions against a head with headroom, on real threads, bounded by rounds; a later waiter behind a headroom head; wakers that panic; `tests/waker_panic.rs`: a sequence's truncate, append and drop, a hybrid truncate, shrink and append, `complete` and `complete_all` unwound by a waker); loom models with controls for a lost wake-up (a waiter that does not try again once queued; a waiter without its hand-shake), a cancelled grant kept, a cancelled head that re-checks no one, a silent close; pool waiting over shards (loom: a release on another shard than the waiter's, a waiter against a gather holding blocks in transit, a running sequence's growth past a queued head, a headroom head against a relay of small admissions, a waker that panics against two releases, beside a waiter granted in the same batch, and after a gather; controls: no hand-shake, no retry once queued, a gather that gives blocks back without re-checking the waiters, growth that waits behind the head, a queue that owes admissions only its head's request, a head woken before its grant is counted, a panicking waker that drops the rest of its batch uncalled; a gather that keeps its admission when its wakes unwind); shuttle FIFO, head-starvation and random-cancellation models; a tokio stress test |
//!
//! # Performance
//!
//! Admission is one compare-and-swap on one cache-padded word, with
//! exponential backoff on contention; giving back a guard is one `AcqRel`
//! `fetch_sub`, then one load to see whether anyone waits. While nobody
//! waits, no lock is taken and nothing is allocated on these paths (a
//! give-back that finds waiters grants them what it freed under the wait
//! queue's mutex).
//! A block allocation is that admission plus one CAS on a bitmap word of
//! the calling thread's home shard of the free list (for up to 64 blocks),
//! whatever the pool size.
//! `benches/contention.rs` measures admission against `std::sync::Mutex`,
//! `parking_lot::Mutex`, `tokio::sync::Semaphore` and a bare
//! `fetch_add`/`fetch_sub` pair, and `benches/pool.rs` the block pool
//! against mutex-guarded free lists; `BENCHMARKS.md` has the figures, with
//! when a lock is cheaper. The layers cost nothing on these paths: the
//! core pool consults the prefix cache only when a cached block's last
//! reference goes and when the free list runs short, and a pool without
//! one never does.
//!
//! # Implementation
//!
//! The [`implementation`] module describes the module layout (the core
//! pool and its layers), the admission words and their CAS loops, the free
//! list (per-shard bitmaps) and its shards, reference counts,
//! sequences and copy-on-write, the prefix cache, waiting, fenced release,
//! and the memory orderings of each type.
//!
//! [loom]: https://docs.rs/loom
//! [shuttle]: https://docs.rs/shuttle

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod allocator;
mod array;
mod counter;
mod error;
mod hash;
mod hybrid;
mod id;
pub mod implementation;
#[cfg(all(test, kvslots_loom))]
mod loom_tests;
mod pool;
mod sequence;
mod sync;
pub mod table;
mod wait;

pub use allocator::{BlockAllocator, SequenceCall};
pub use counter::guard::{OwnedReservation, Reservation};
pub use counter::wait::{Reserve, ReserveOwned};
pub use counter::SlotCounter;
pub use error::{
    ConfigError, ExtraKeyError, FreeError, HybridError, KvGroupsError, PositionError, ReleaseError,
    ReserveError,
};
pub use hash::{hash_blocks, hash_blocks_with, BlockHash, ExtraKey};
pub use hybrid::{GroupKeys, HybridSequence, KvGroup, KvGroups};
pub use id::BlockId;
pub use pool::{Alloc, BlockPool, BlockPoolBuilder, KvEvent, PoolStats, PrefixStats};
pub use sequence::{BlockCopy, Sequence};

/// The admission rule, as a pure function: how many of `requested` slots to
/// admit when `used` of `capacity` are taken.
///
/// Admits `requested` if `0 < requested <= capacity - used`, and otherwise
/// 0: never a part of a request. A request of zero or less admits nothing,
/// and so does the impossible state `used > capacity`. It never overflows and
/// never panics.
///
/// # Examples
///
/// ```
/// use kvslots::admit;
///
/// assert_eq!(admit(4, 1, 3), 3); // fits exactly
/// assert_eq!(admit(4, 2, 3), 0); // one free short: nothing, not 2
/// assert_eq!(admit(5, 3, 0), 0); // empty append
/// assert_eq!(admit(5, 0, -1), 0); // negative request
/// assert_eq!(admit(1, 2, 1), 0); // overcommitted state: nothing
/// ```
pub const fn admit(capacity: usize, used: usize, requested: isize) -> usize {
    // Empty, negative, or an impossible state? Admit nothing.
    if requested <= 0 || used > capacity {
        return 0;
    }
    // `requested > 0`, so the cast is exact; `used <= capacity`, so the
    // subtraction cannot underflow.
    let requested = requested as usize;
    if requested <= capacity - used {
        requested
    } else {
        0
    }
}

/// The README's code blocks, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
