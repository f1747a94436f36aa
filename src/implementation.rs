//! How `kvslots` works inside: the design notes, for reviewers and
//! maintainers. This module holds documentation only.
//!
//! The guarantees a user relies on (all or nothing, `used <= capacity`,
//! what happens-before what) are stated on the public types; this page says
//! how the code keeps them.
//!
//! # Contents
//!
//! * [Layout](#layout): the core pool, its layers, and where each feature
//!   lives; the allocator under a sequence.
//! * [The admission counter](#the-admission-counter): the state word and
//!   its compare-and-swap loops.
//! * [The free list](#the-free-list): per-shard bitmaps of free block ids.
//! * [Shards](#shards): why the free list is cut in several bitmaps.
//! * [Admission](#admission): the pool's free counts per shard, the fast
//!   path, the gather and its transit window.
//! * [Allocating and freeing blocks](#allocating-and-freeing-blocks).
//! * [Reference counts](#reference-counts): sharing blocks, and why every
//!   shared drop is a CAS.
//! * [Sequences](#sequences): block tables, forks and copy-on-write.
//! * [Hybrid models](#hybrid-models): a table per group of layers, one
//!   admission, sliding windows, matches across groups.
//! * [Prefix cache](#prefix-cache): the state word, keys and their index,
//!   publishing, matching, peeking, eviction order, statistics.
//! * [KV events](#kv-events): the rings of the cache's stores and
//!   removals, their order per key and across keys, losses, the consumer.
//! * [Waiting](#waiting): the FIFO wait queue, grants on the waiter's
//!   behalf, who gets what, cancellation, and the lost-wakeup argument.
//! * [Fenced release](#fenced-release): references kept until a device
//!   step completes.
//! * [Orderings](#orderings): what each atomic operation orders, type by
//!   type.
//! * [Model checking](#model-checking): the atomics facade, the loom
//!   models inside the crate, and the faults of their negative controls.
//!
//! # Layout
//!
//! A feature is local: each lives in one folder or one file.
//!
//! ```text
//! src/
//!   lib.rs            the crate docs and the public names
//!   implementation.rs these notes
//!   allocator.rs      BlockAllocator: the calls a Sequence makes to its pool
//!   sequence.rs       Sequence<A = BlockPool>: block tables, copy-on-write, forks
//!   hybrid/           hybrid models over one pool
//!     groups.rs       KvGroups, KvGroup, GroupKeys (each group's keys)
//!     sequence.rs     HybridSequence<A = BlockPool>: a Sequence table per group
//!   table.rs          the block-table arithmetic Sequence applies
//!   array.rs          the per-block arrays, allocated fallibly
//!   hash.rs           hash_blocks and BlockHash: the prefix cache's keys
//!   error.rs          the typed errors; id.rs, BlockId
//!   counter/          SlotCounter, its guards and its waiting
//!   wait/             the FIFO wait queue, over any allocator of units
//!   sync/             the atomics facade, the model checkers' seam
//!   loom_tests/       the loom models and their negative controls: unit
//!                     tests under cfg(all(test, kvslots_loom)), one file a
//!                     subject (pool.rs, prefix.rs, wait.rs, ...)
//!   pool/             BlockPool
//!     mod.rs          the core pool: construction, queries, allocation, the
//!                     drop path with its last-reference hook, BlockAllocator
//!     builder.rs      BlockPoolBuilder: shards, layers, checked and allocated
//!     admission.rs    per-shard admission counts
//!     free_list.rs    per-shard bitmaps of free block ids
//!     refs.rs         the per-block state word; the core's operations on it
//!     over_free.rs    the over-free check of BlockPool::free
//!     wait.rs         BlockPool::alloc and alloc_blocking
//!     fence.rs        the fenced release layer
//!     prefix/         the prefix cache layer
//!       mod.rs        its storage and statistics; matching, eviction, reset
//!       publish.rs    publishing: claim, index entry, rescan, commit
//!       state.rs      its transitions of the state word
//!       keys.rs       the keys and the index over them
//!       lru.rs        the eviction order
//!       events.rs     KV events: the rings, their records, the consumer
//!     stats.rs        BlockPool::stats: the gauges and counters in one struct
//! ```
//!
//! **The core pool** is admission, the free list, a state word per block
//! (with its reference count) and waiting: 8 bytes and two bits a block (an
//! 8-byte state word, a bit of the free list's bitmap and a bit of its
//! fresh bitmap), plus a few
//! cache lines per shard. **The prefix cache** is a layer a pool is built with or without
//! ([`BlockPoolBuilder::prefix_cache`](crate::BlockPoolBuilder::prefix_cache)):
//! its storage (keys, index, eviction stamps and ring, 70 bytes a block;
//! statistics' cells) is one boxed struct that a pool without it does not
//! allocate. The core knows of it at two places only, both off the fast
//! paths: the drop path's *last-reference hook* (a drop that takes a
//! `CACHED` block's count to 0 hands the block to the cache, which stamps
//! it evictable, instead of giving it back to the free list) and an allocation
//! that finds the free list short (it asks the cache to evict). Without a
//! cache no block is ever `CACHED`, so the hook never fires and a short
//! free list only means blocks in transit; the prefix calls return their
//! "nothing cached" answers. **KV events** are a part of the prefix cache
//! chosen on its own ([`BlockPoolBuilder::kv_events`](crate::BlockPoolBuilder::kv_events)):
//! rings allocated with the cache, and a check of one `Option` on the
//! publish, eviction and truncate paths when they are off.
//! **Fenced release** keeps nothing per block,
//! only a few lock-guarded maps per pool, and adds nothing to the
//! allocation paths: every pool has it.
//!
//! **The allocator under a sequence.** [`Sequence`](crate::Sequence) holds
//! an `Arc<A>` of any [`BlockAllocator`](crate::BlockAllocator) and calls
//! nothing else: an allocation for a new sequence
//! (`try_alloc_with_headroom`) or for a running one's growth
//! (`try_alloc_growth`, which does not wait behind queued admissions), its
//! blocking form, `add_refs` for a fork's shared blocks, `release` for
//! every give-back, `needs_copy` (one `Acquire` load of the state word in
//! a `BlockPool`) before writing into a tail that may be shared or cached,
//! the prefix calls (`match_prefix`, `publish`, `uncache_if_sole`, which
//! default to caching nothing) and the fence calls (`retire`,
//! `retire_owned`). Each is one operation of the pool, so a sequence over
//! a `BlockPool` makes one pool operation a call, with no indirection:
//! `Sequence<BlockPool>` is monomorphised (no dynamic dispatch), and only
//! its async `reserve` is `BlockPool`'s alone (its future is the pool's
//! wait-queue entry). The simulator runs its mutex baseline as another
//! allocator under the same `Sequence`, every call under one lock.
//!
//! # The admission counter
//!
//! A [`SlotCounter`](crate::SlotCounter) of `capacity` slots keeps its whole
//! state in one word, in a cache line of its own:
//!
//! ```text
//! state = used << 1 | CLOSED
//! ```
//!
//! The closed flag is the low bit, the used count the rest (so
//! [`SlotCounter::MAX_CAPACITY`](crate::SlotCounter::MAX_CAPACITY) is
//! `usize::MAX >> 1`). Every `try_reserve*`, [`admit`](crate::admit)-style
//! call and guard `try_grow` goes through one compare-and-swap loop on that
//! word, in the shape of tokio's `batch_semaphore::try_acquire`:
//!
//! ```text
//! needed = n + headroom                     (saturating)
//! // Could it ever fit?
//! if needed > capacity: Closed if closed, else NeverFits
//! cur = state.load(Relaxed)                 (a first guess)
//! loop {
//!     // Closed?
//!     if cur & CLOSED: return Closed
//!     // Enough free?
//!     available = capacity - (cur >> 1)     (saturating)
//!     if needed > available: return Full { requested: n, available }
//!     // Nothing to take? The read above is the linearization point.
//!     if n == 0: return Ok
//!     match state.compare_exchange_weak(cur, cur + (n << 1), Acquire, Relaxed) {
//!         Ok  => record the peak; return Ok
//!         Err(actual) => cur = actual; back off
//!     }
//! }
//! ```
//!
//! The check and the add are one atomic step, so two appenders can never
//! both pass a check that only one of them fits, and no thread ever
//! observes a partial admission: the CAS commits the whole request or
//! fails and retries against the fresh value. `Full { available }` reports
//! a value the word really held at the refusal.
//!
//! On contention the loop backs off exponentially, from 4 spin hints up to
//! 64: a failed CAS means that the line just moved to another core, and
//! retrying at once only pulls it back before that core has finished.
//!
//! Giving back slots that a guard holds is one `fetch_sub`: the guard proves
//! they are held, so nothing needs checking.
//! [`SlotCounter::release`](crate::SlotCounter::release) takes an
//! untrusted count, so it is a CAS
//! loop of the same shape ("Is that much in use?") that refuses an
//! over-release and changes nothing.
//!
//! Because the closed flag lives in the word it guards, closing is
//! linearizable with admission: every admission's CAS is ordered against
//! the `fetch_or` that closes, in the word's modification order, so an
//! admission either happened before the close or sees it and fails.
//!
//! The high-water mark (`peak_used`) sits in a second padded word, written
//! only when a new peak is reached, so that in steady state the hot path
//! only reads it.
//!
//! # The free list
//!
//! A [`BlockPool`](crate::BlockPool)'s free block ids are kept in bitmaps,
//! one per shard (see [Shards](#shards)): bit `b` of a shard's word `w` is
//! the shard's id `64 * w + b`, set while that block is free. A shard's
//! words start on a cache line of their own (16 words, 1,024 ids, to a
//! line), and a summary word per shard, on its own line, marks the groups
//! of words that may hold a free id (bit `j` for words `j * g .. (j + 1) *
//! g`, `g` the least power of two at least `ceil(words / 64)`, so that a
//! shift finds a word's bit: one word a bit for shards of up to 4,096
//! ids).
//!
//! ```text
//! take k:   w = the lowest group the summary marks, its first word with bits
//!           cur = word.load(Relaxed)
//!           take = the lowest min(k, ones(cur)) bits of cur
//!           word.compare_exchange(cur, cur & !take, Acquire, Relaxed)
//! give:     word.fetch_or(bits of the listed ids in that word, Release)
//! ```
//!
//! One CAS takes up to 64 blocks and one `fetch_or` gives back every
//! listed block of a word, so a request costs a few read-modify-writes
//! whatever its length: a sequence's blocks mostly come from one or two
//! words (lowest ids first), and a give-back gathers its ids word by word
//! before returning them. A full word is emitted as a range of ids.
//!
//! A second bitmap of the same shape, the *fresh* bitmap, marks the blocks
//! that a sequence holds through an uncounted reference (see
//! [Reference counts](#reference-counts)): a sequence that takes at
//! least 8 blocks from one word sets their bits (one `fetch_or`) and
//! writes no state word; the give-back clears them (one `fetch_and`) before the
//! `fetch_or` that frees them. Only a block's holder changes its bit.
//!
//! There is no ABA problem to guard against, so no tag: a word's value
//! names exactly the free blocks in it, so a CAS that finds the value it
//! read takes blocks that are free now, whatever happened in between. (A
//! Treiber stack's head names only its top; its next link can be stale,
//! which is what a stack's tag catches.)
//!
//! The summary is a hint. A take that finds a marked group empty clears
//! its bit (`fetch_and`) and then reads the group's words again, setting
//! the bit back if one holds an id; a give-back that fills an empty word
//! reads the summary after its `fetch_or` and sets the bit if it is
//! clear. All four are `SeqCst`, so in their single total order either the
//! give-back's read comes after the clear (and it sets the bit) or the
//! re-check comes after the `fetch_or` (and sees its ids). On x86 these
//! are the plain loads and locked instructions that `Relaxed` ones would
//! be. Correctness does not rest on the summary: an allocation that finds
//! too few blocks through the summaries and the prefix cache's evictable
//! blocks looks through every word of every shard (and marks what it
//! finds) before it looks again.
//!
//! Bookkeeping is about 78 bytes per block: a bit of each bitmap, an
//! 8-byte state word (reference count, flags, generation), and the prefix
//! cache's 70 bytes (see [Prefix cache](#prefix-cache)), plus one
//! `CachePadded` slot (a cache line, 128 bytes on x86-64) per shard for its
//! words, per shard summary, per shard admission count and per statistics
//! cell, two for the closed flag and the peak, and a fixed minimum for tiny
//! pools.
//!
//! # Shards
//!
//! A shard is one of those bitmaps. The free list is cut into
//! [`BlockPool::shards`](crate::BlockPool::shards) of them
//! ([`BlockPool::new`](crate::BlockPool::new) picks one per
//! [`BLOCKS_PER_SHARD`](crate::BlockPool::BLOCKS_PER_SHARD) blocks, up to
//! [`DEFAULT_SHARDS`](crate::BlockPool::DEFAULT_SHARDS);
//! [`BlockPool::with_shards`](crate::BlockPool::with_shards) sets the count).
//!
//! Each shard owns a contiguous range of ids (`span = ceil(num_blocks /
//! shards)` ids each), and a freed id always goes back to the shard that
//! owns it. A thread's takes start at its home shard and take from the
//! others, in turn, only when it is short. Threads are numbered in the
//! order they first allocate or free (a thread-local cached from a global
//! counter), and a thread's home is its number modulo the shard count
//! (computed with a multiplication, not a division), so threads need no
//! registration.
//!
//! A worker that frees and reallocates sequences thus takes and gives back
//! bits in words that no other thread touches, which stay in its core's
//! cache. Admission is counted per shard as well (see
//! [Admission](#admission)), so a thread that allocates from and frees to
//! its home shard writes no word that other threads write, as long as
//! there are no more threads than shards.
//!
//! `BlockPool::with_shards(.., 1)` gives the single bitmap (and a single
//! admission count) back. The measurements are in `BENCHMARKS.md`.
//!
//! A give-back returns its ids one `fetch_or` per run of ids in one word
//! (one in all for up to 64 ids that share a word, as a sequence's blocks
//! mostly do). Which shard holds an id is never visible in the API: all or
//! nothing, `Full` and the counts are those of the whole pool.
//!
//! # Admission
//!
//! A [`BlockPool`](crate::BlockPool) does not admit through one
//! `SlotCounter` word: with every allocation and every free making a
//! read-modify-write on one word, that word's line moves between the cores
//! twice per operation, which costs more than the rest of the operation
//! under contention. Instead each shard has a word of its own, on its own
//! cache line:
//!
//! ```text
//! shard word = version << 32 | free         (free: blocks, as counts)
//! ```
//!
//! The free counts of all shards, plus what running allocations hold in
//! transit, are the pool's free blocks (uncached free and evictable). They
//! start as the free list's ids (shard `s` counts the ids it owns), but a
//! count is not tied to an id: a free adds to the freeing thread's home
//! shard, wherever its ids go, and an evictable block's count goes there
//! too when its last reference is dropped. The version is bumped by every
//! change of the word; only the gather reads it.
//!
//! ```text
//! needed = n + headroom                     (saturating)
//! if needed > capacity: Closed if closed, else NeverFits
//! if closed: return Closed
//! // Fast path: one CAS on the home shard's word.
//! if home.free >= needed: home -= n (version + 1)
//! // Slow path (gather): take from each shard in turn, home first.
//! else loop {
//!     for each shard s from home: take min(s.free, needed - held) with a CAS
//!         if held == needed: give needed - n to home; done
//!     if this pass took nothing and the versions' sum equals the last pass's:
//!         give held to home; return Full { available: held }
//! }
//! // Closed meanwhile? (read after the take)
//! if closed: give n back; return Closed
//! ```
//!
//! A gather holds what it took *in transit*: those blocks are free, but no
//! other call can take them until the gather gives back what it does not
//! keep. So under concurrency a `Full` may come while other calls hold
//! blocks in transit; it is still justified. A refusal comes only after a
//! pass that took nothing and read every shard's version as it was at the
//! end of the pass before. Versions only grow, so equal sums mean that no
//! shard changed between this call's two reads of it; every one of those
//! intervals contains the instant between the two passes, when every
//! shard therefore held exactly what the call had left there: nothing
//! (it takes all that a shard has while it is short). At that instant the
//! free blocks outside other running calls were exactly what it held,
//! fewer than needed. A single pass would not do: blocks can move from a
//! shard not yet visited to one already visited (taken there by one
//! thread, freed by another whose home the visited shard is) and be
//! missed, though they were never all in use at once (a unit test in
//! `pool/admission.rs` moves counts behind a gather's scan for two passes
//! and fails if the gather refuses without the version check). A version wraps
//! after 2^32 changes of one shard during one gather, as the free list's
//! tag would.
//!
//! In a single-threaded run nothing moves behind a gather, so its first
//! pass takes every free block and the second refuses with exactly the
//! free count: `Full { available }`, `free_blocks()` and headroom answer
//! exactly as with one counter. A success never admits more than is free:
//! a gather succeeds only holding `needed` counts, each of which was a free
//! block. The gather is lock-free (a pass that neither takes nor refuses
//! saw another call's successful CAS) but not wait-free.
//!
//! The closed flag is a word of its own, read before the admission and
//! again after it, both `SeqCst` as the takes are. In the single total
//! order of `SeqCst` operations a successful call's take precedes its
//! second read, which precedes the close's store, so the call was admitted
//! before the close; a call that reads the flag set fails `Closed`, giving
//! back what it took (transit again). A call that starts after `close`
//! returned reads the flag set in its first read and touches nothing. The
//! loom model `admission::alloc_vs_close` races a close against a fast-path
//! allocation and a refused gather; its control, `close_keeps_admission`
//! (a call that finds the flag set after its take keeps what it took), is
//! caught as blocks not conserved.
//!
//! `free_blocks()` and `used_blocks()` sum the shards' counts, read one
//! after another: exact when no call runs, capped at `num_blocks`
//! otherwise. The peak is raised on the fast path from the home shard's
//! count plus the other shards' counts as the home shard's last gather
//! summed them (a field on the home shard's line, so the fast path reads
//! no line that other threads write), and on the slow path from a fresh
//! sum: exact with one thread, an estimate with several.
//!
//! Evictable blocks are admitted like free ones and taken with
//! `evict_into` once admitted; a match that revives one admits it first
//! (from the matching thread's home shard, or by a gather), and
//! `reset_prefix_cache` admits each block it drops the key of, ignoring the
//! closed flag, and gives it back through the free.
//!
//! # Allocating and freeing blocks
//!
//! [`BlockPool::try_alloc`](crate::BlockPool::try_alloc) is two steps,
//! neither of which can leave a partial result:
//!
//! 1. The count is admitted through the pool's per-shard counts (see
//!    [Admission](#admission)). `Full`, `NeverFits` and `Closed` come from
//!    here, and nothing has changed when they do.
//! 2. The ids are taken from the shards, and what they lack is evicted
//!    from the prefix cache's evictable blocks (see
//!    [Prefix cache](#prefix-cache)). Frees give their ids back (or leave
//!    a cached block evictable) before they give the count back, and a
//!    match admits a block before it revives one, so the shards and the
//!    evictable blocks together always hold at least the admitted count:
//!    this step cannot fail, though it may look again (through every word,
//!    whatever the summaries say) when other threads moved blocks while
//!    it scanned.
//!
//! [`BlockPool::free`](crate::BlockPool::free) checks every listed id with
//! loads before it changes anything (in range? allocated? a raw caller's,
//! not a sequence's? listed no more often than it has references?), so a
//! refused call changes nothing that another thread could observe. The
//! over-free check stays near linear in the list's length without
//! allocating: short lists are compared pairwise, longer ones screened
//! through a 4,096-bit filter, and only a list with ids on a shared bit is
//! tallied exactly, one window of 8,192 indices at a time. Then it drops
//! one reference per id, gathers the blocks whose count reached zero word
//! by word, gives them back, and gives the count back (to the freeing
//! thread's home shard).
//!
//! # Reference counts
//!
//! Each block has a 29-bit count, the low bits of its state word (see
//! [Prefix cache](#prefix-cache)): 0 while it is free or evictable, its
//! number of holders while allocated. A fork adds a reference to each
//! shared block, with a CAS that never raises a count from 0 nor past
//! `2^29 - 1` (`BlockAllocator::add_refs` stops at such a block and says
//! how many it added; [`Sequence::try_fork`](crate::Sequence::try_fork)
//! then panics, as `Arc` aborts on an overflowing count, and the child
//! gives back what it took); a free or a sequence drops them. A count of
//! 0 there would mean that a raw `free` took the forking sequence's
//! reference, which the sequence flag below rules out. Raw holders share
//! a block with [`BlockPool::add_refs`](crate::BlockPool::add_refs), which
//! refuses a sequence's block.
//!
//! **The sequence flag.** A block taken for a
//! [`Sequence`](crate::Sequence) (by its appends and reservations, by an
//! eviction for it, or by a match that revives it from a count of 0)
//! carries `SEQUENCE` in its state word; forks and revivals of a held
//! block keep it, and the drop that takes the count to 0 clears it. So
//! while a block has references, `SEQUENCE` says that every holder is a
//! sequence (or a fence on one's behalf). A raw
//! [`BlockPool::free`](crate::BlockPool::free) refuses such a block
//! ([`FreeError::HeldBySequence`](crate::FreeError::HeldBySequence)), in
//! its checks and again in its CAS, which compares the whole word: a free
//! whose checks passed while a raw caller held the block, and that finds
//! it freed and taken for a sequence since, fails its CAS and reports
//! [`FreeError::Raced`](crate::FreeError::Raced). No raw free ever writes
//! a flagged word.
//!
//! **The sealed calls.** The calls a sequence makes on its blocks
//! ([`BlockAllocator`](crate::BlockAllocator)'s `release`, `add_refs`,
//! `retire`, its allocations, matches and publishes) take a
//! [`SequenceCall`](crate::SequenceCall), a token only this crate builds:
//! no code outside it can list a sequence's block in a call that changes
//! its word (a double release, or a release of
//! [`Sequence::blocks`](crate::Sequence::blocks) racing the sequence's
//! drop). With raw calls refusing the flag, only a block's holders write
//! its word while it is a sequence's (the prefix cache's transitions act
//! on cached or claimed words, which a sole drop leaves alone; see the
//! state word's module doc in `src/pool/refs.rs` for each writer). So a
//! sequence that reads its block's word as `SEQUENCE` with a count of 1,
//! neither cached nor claimed (`Acquire`: a co-holder's drop happens
//! before), is its only holder and clears it with a plain store, and
//! gives the block back with the rest of its give-back's word (whose
//! `Release` `fetch_or` publishes it). A block's first reference is a
//! plain store too (a free block has no holder to race): a load and a
//! store a block when taken and when given back.
//!
//! **Fresh blocks.** When a sequence's take (a prompt's append or
//! reservation, a prefill chunk) gets at least 8 blocks from one word of
//! the free list's bitmap, it writes no state word for them at all (fewer
//! from a word, and the blocks it evicts, are counted): each is held
//! through one *uncounted* reference, its taker's, and its bit in the free
//! list's fresh bitmap says so (set by the take, one `fetch_or` for the
//! word, or a plain store when the take emptied the word). Its state word
//! stays *bare*, as the
//! free list left it: no count, key or claim. The holder gives such a
//! block back without reading or writing the word: its give-back reads
//! the fresh bits of the word its ids are in, and a run of consecutive
//! fresh ids (compared sixteen at a time) goes back with one `fetch_and`
//! of the fresh word (a store of 0 when the run is the whole word) and one
//! `fetch_or` of the free word. A give-back whose whole list is one run
//! of consecutive ids, all fresh (a prompt's blocks as its take left them,
//! given back by a truncate or the sequence's drop), skips even that: one
//! pass compares the ids with the run from the first (sixteen at a time,
//! with no branch), which also finds them in range; the fresh bits of each
//! word of the run are read, then cleared and the free bits set, and no
//! per-block step is left. A list that is not such a run takes the path
//! above, with nothing changed by the look. Before a fresh
//! block is shared (a fork's `add_refs`) or claimed (a publish), its
//! holder counts the reference: a load of each listed block's word, and
//! for a bare one (the caller holds it, so it is fresh) a store of
//! `SEQUENCE` and a count of 1; then it clears those blocks' fresh bits
//! (`Release`, one `fetch_and` a word, or a store of 0 for a word whose
//! blocks are all the caller's), and the fork or the claims
//! proceed on counted words. The bits go before any claim: once a block
//! is cached a matcher can hold it too, and a bit still set would make
//! the matcher give it back as fresh. A fence that retires a
//! fresh block holds the uncounted reference on the sequence's behalf and
//! gives it back the same way at `complete`.
//!
//! Nothing else writes a bare word: a raw free or add, a revival, an
//! eviction and a rival publisher's deferral or kill each need a count,
//! `CACHED` or `BUSY` in the word, which their CAS compares whole. The
//! fresh bit itself is written only by the block's holder (the take's
//! mark, the count's or the give-back's clear): a read-modify-write while
//! other holders' bits may share the word, a plain store when the caller
//! holds every block of the word (no other thread writes the word then,
//! and the blocks' previous holders cleared their bits before giving them
//! back, which the take acquired). A raw call's checks, and
//! [`BlockPool::ref_count`](crate::BlockPool::ref_count), tell a fresh
//! block from a free one by the bit: a bare word sends them to the bit,
//! and a clear bit back to the word (`Acquire` both, after the word's
//! `Acquire` load), so a block that its holder counted meanwhile reads as
//! counted, and one that reads bare, clear and bare was free, or in a take
//! or a give-back under way, at a moment of the call. So a raw free of a
//! fresh block is refused as `HeldBySequence`, exactly as a counted
//! sequence block is. Fewer than 8 blocks from a word are counted at
//! once: for a few blocks, a store each costs less than the mark and the
//! clear, two read-modify-writes (a take of a block or two, or a take
//! from a fragmented pool that gets a few blocks from each of many
//! words).
//!
//! Every other drop is a CAS from the count it read to one less: a shared
//! block's (two sequences can drop their references at once), a cached
//! one's (a matcher can revive it), and a raw caller's (a double free
//! through the public `free`, listing a block that a raw caller holds, can
//! race the holder's own free). If two drops each read a count of 1 and
//! stored 0, both would see themselves as the last holder and give the
//! block back twice; with a CAS exactly one takes the count from 1 to 0.
//! The loser finds no reference left: a `free` returns `Raced`, a
//! sequence's drop gives back nothing for that block.
//!
//! A free whose drop loses such a race does not undo the drops it already
//! made: adding a reference back could resurrect a block that its other
//! holders freed, and someone reallocated, in the meantime (an ABA on the
//! count). So `Raced` is the one refusal that is not all or nothing.
//!
//! # Sequences
//!
//! A [`Sequence`](crate::Sequence) is a block table: its length in tokens
//! and one reference to each block holding them, in order, followed by any
//! reserved blocks. Appends take exactly the blocks the new tokens need,
//! all or none; truncating gives back the blocks no longer needed.
//!
//! After a fork, parent and child share every *full* block (read-only from
//! then on) and each has a private last block: the child's is a fresh block
//! that the caller fills with the returned [`BlockCopy`](crate::BlockCopy).
//! Appends only ever write into the last, partly filled block or into new
//! blocks, so neither side writes into a block the other can read. The one
//! way to make a shared block writable again is to truncate into the shared
//! prefix; the next append must then copy that block on write, which
//! [`Sequence::try_append_cow`](crate::Sequence::try_append_cow) does and
//! reports, and which makes plain
//! [`Sequence::try_append`](crate::Sequence::try_append) panic rather than
//! lose the copy. The replaced block keeps the sequence's reference until
//! its next successful append or shortening truncate (or its drop), so the
//! device copy can still read it.
//!
//! A truncate into a block that was once full sets a hint that the tail
//! may be shared; only then does an append read the block's state
//! (`needs_copy`: shared, or cached).
//!
//! # Hybrid models
//!
//! A [`HybridSequence`](crate::HybridSequence) is a list of
//! [`Sequence`](crate::Sequence) tables, one per group of
//! [`KvGroups`](crate::KvGroups), all over the same `Arc<A>`, plus a list
//! of blocks in transit and a plan per group, both sized when the sequence
//! is made. It calls nothing of the pool that a plain sequence does not
//! (the [`BlockAllocator`](crate::BlockAllocator) trait), so it runs over
//! any allocator, and every rule of a table (copy-on-write, forks, fenced
//! release, first-wins publishing) is the table's own code.
//!
//! **Holders.** Every block in a table is a sequence's: the hybrid
//! sequence takes blocks only through the allocator's calls for
//! sequences (`try_alloc_with_headroom`, `try_alloc_growth`,
//! `alloc_with_headroom_blocking`, the waiting `reserve`'s allocation
//! for a sequence, `match_prefix`, and `add_refs` for a fork), so in a
//! `BlockPool` they carry the sequence flag ([Reference
//! counts](#reference-counts)), and a raw
//! [`BlockPool::free`](crate::BlockPool::free) of one is refused
//! (`HeldBySequence`). They go back only through the tables' `release`
//! and `retire` (a fence's completion drops them as `release` would): a
//! block the sequence holds alone, neither cached nor claimed, with an
//! `Acquire` load and a plain store of its word (a racing double
//! `release` of it, which only the crate could write, is not survived:
//! loom's `release_race` control), any other with the CAS loop. A
//! window's block reused for new
//! tokens keeps its reference and its flag; since no raw free takes a
//! sequence's reference, nothing but a misused `release` (as for any
//! sequence's block) can drop it between the reuse's check
//! (below) and the sequence's write (loom's `free_ignores_sequence`
//! control lets a raw free take it: the window then reuses, or gives
//! back a second time, a block that is free).
//!
//! **One admission.** An append plans every group first (the blocks each
//! needs, and whether it copies its tail; the plan is kept, since a tail's
//! need for a copy can change from `true` to `false` meanwhile), sums
//! them, and asks the pool once (`try_alloc_growth`, or
//! `try_alloc_with_headroom` for a sequence that holds nothing) into the
//! list in transit; only then are the tables changed, each taking its
//! planned share in group order. A refusal returns before any table or
//! window changed. Reservations and forks do the same with one
//! allocation. The loom control `per_group_admission` (one allocation per
//! group, the earlier groups' blocks given back when a later one is
//! refused) shows why: two such appends can both be refused although one
//! of them fits.
//!
//! **Null entries.** A table's leading entries may be
//! [`BlockId::NULL`](crate::BlockId::NULL): the blocks its sliding window
//! gave back. A `Sequence` counts them (`null`), never passes them to the
//! pool (release, retire, fork's shared blocks, publish all start after
//! them), and a truncate or shrink only shortens the count. Entry `i` is
//! always block `i` of the sequence, so the slot mapping and a kernel's
//! block table keep their shape; a kernel never reads a null entry, since
//! it lies before the window.
//!
//! **Windows.** The token at position `p` of a `SlidingWindow {
//! window_tokens: w }` group reads positions `p + 1 - w..=p`. An append
//! of tokens `old_len..` makes the blocks wholly before `(old_len + 1 -
//! w) / block_size` unreadable by any later token, so the same call gives
//! them back: the call is the point by which the device step that read
//! them last has run (as for a copy-on-write's source). Those the sequence
//! holds alone and uncached (`needs_copy` false: a snapshot that only
//! turns from `true` to `false` while the sequence holds the block) take
//! the place of new blocks before the pool is asked: they pass straight
//! from one entry to another, with their reference, so a decode in steady
//! state makes no pool call for its sliding groups, and an append that
//! needs a block fits whenever its window frees one. The others (shared
//! with a fork, or cached, so that a match may take them) go back through
//! the pool's release, whose `Release` orders the sequence's last read
//! before the next owner's write (loom's `relaxed_free` control). With
//! `try_append_fenced` they are retired under the fence instead, and none
//! is reused. A truncate to a length whose next token's window reaches a
//! null entry (`len < null * block_size + w - 1`, other than 0) is refused
//! (`HybridError::TruncateOutsideWindow`): the keys and values there are
//! gone. A truncate back into the last append's tokens never is.
//!
//! **Keys.** The same tokens hold other keys and values in another group,
//! so each group has keys of its own ([`GroupKeys`](crate::GroupKeys)): one
//! SHA-256 compression of the block's content key with the group's number
//! and kind, from SHA-256's initial state, under a tag of its own. All the
//! groups' keys live in the pool's one index, and [KV events](#kv-events)
//! name them as the index holds them: a hybrid publish stores a chain per
//! group under that group's keys. A sliding group publishes from the first
//! block its window still holds, through the allocator's `publish_after`
//! with the group's key of the block before as the chain's parent (given
//! back or not), so a router sees each group's chain unbroken.
//!
//! **Matching across groups.** A hit of `k` blocks needs, in a full group,
//! blocks `0..k`; in a sliding group, the blocks of the window of the
//! token at position `k * block_size`. The match takes: the full groups'
//! prefixes (each group asking only for the prefix the groups before it
//! matched, and cutting back the earlier ones when it is shorter); then,
//! for each sliding group, a run of matched blocks ending at the candidate
//! `k`: the window's missing head is matched forward from its first
//! block, and a miss at block `i` means no window ending past `i` is whole,
//! so the run above `i` goes back and the candidate becomes `i` (vLLM's
//! backward scan, with references taken as it goes: what is held cannot
//! be evicted before the match returns). A sliding group that lowers `k`
//! has the full groups cut back and the sliding groups look again, until
//! a pass lowers nothing: then every group holds exactly what `k` needs.
//! Each step only lowers `k`, and a group's answer is the largest count
//! at most `k` it serves, so the fixed point is the largest count every
//! group serves. Blocks taken on the way and not kept go back (counting
//! as recently released); the pool's statistics count their queries and
//! hits. The loom control `unreconciled_match` (a single pass) leaves a
//! table that disagrees with the length when an eviction races the match.
//!
//! # Prefix cache
//!
//! ## The state word
//!
//! Each block's `AtomicU64` state word (`pool/refs.rs` holds its layout
//! and the core's operations, `pool/prefix/state.rs` the prefix cache's)
//! is the single truth about it; in a pool without a prefix cache only the
//! count is ever set:
//!
//! ```text
//! bits  0..29   reference count (at most 2^29 - 1, as before a panic)
//! bit   29      SEQUENCE every holder is a sequence (see Reference counts)
//! bit   30      DEFERRED a rival publisher of the same key on a higher
//!                        block id gave up in this claim's favour
//! bit   31      CACHED   the block holds a key that can match
//! bit   32      BUSY     a publisher has claimed it to give it a key
//! bit   33      KILLED   a rival publisher of the same key won, or the
//!                        claim's key is not written yet (not armed)
//! bits 34..64   generation, bumped whenever the block loses a key or a claim
//! ```
//!
//! A block is *free* (count 0, not cached: in the free list), *held* (count
//! above 0, cached or not) or *evictable* (count 0, cached: not in the free
//! list). The admission counts count free and evictable blocks, which is
//! what an allocation may take; a match admits a block before it revives
//! an evictable one, exactly as an allocation would: at an evictable
//! block with no admission left in hand it admits as many as it has keys
//! left, at most 64 and at most what its home shard sees free (its own
//! count and its view of the others', less what waiters are owed: a
//! request larger than what is free would be refused only after the slow
//! path's scan of every shard), with one read-modify-write (or else one),
//! uses one per revival, and gives back what it did not use when it ends;
//! the peak is raised then, from what it kept. A match into a sequence
//! that holds only reserved blocks
//! ([`try_match_prefix`](crate::Sequence::try_match_prefix) after a
//! reservation) lends a reserved block instead, while it has one left to
//! lend: the block goes back to the free list with its admission kept, and
//! that admission is the revival's. The count of free and evictable blocks
//! never exceeds what the counter says is free: the lent block is free
//! before the revival takes the evictable one. A lent block's credit that
//! no revival used (the block was evicted between the lend and the CAS)
//! takes a block back for the sequence, so the reservation loses nothing.
//! A [`HybridSequence`](crate::HybridSequence)'s match into a reservation
//! first plans, taking nothing, how far every group agrees with revivals
//! that the reserved blocks and the pool's room beside the waiters pay for
//! (each key looked up once, its block's count read to tell a revival from
//! a share), and matches no further, so that it lets go of a block it
//! revived only when the cache or the room changed since the plan: a block
//! it let go of that another match took meanwhile stays that holder's with
//! its admission, and the reservation is then short of it unless the pool
//! has a free block.
//! It lends the same way, group by group (each full group what the
//! revivals planned in the sliding groups' windows and in the full groups
//! after it leave of the reserved blocks), and a matched block that the final prefix does not need
//! goes back with its admission kept too, as a credit (none for a block
//! another holder still holds): at the end each group gets as many blocks
//! as it reserved beyond the match, first from the reserved blocks not
//! lent, then paid by credits (no admission: the free list's take or an
//! eviction), and what is left of both is given back, so the admission
//! count never counts a block twice.
//! Every change of
//! a state that another thread may act on is a CAS from the exact value
//! read, so a generation names one incarnation of a block's key.
//!
//! The generation has 30 bits and wraps. A CAS from a state read earlier
//! (a match's revival, an eviction, a kill) is fooled only if, while the
//! thread that read it stalls between its read and its CAS, the same block
//! loses a key or a claim a multiple of 2^30 (about 1.07e9) times and comes
//! back to the same count and flags. A loss is an eviction, a reset or a
//! truncate that drops the key (each needing a new allocation and publish
//! of the block before the next), or a publish of the block that loses or
//! is refused (a claim and an unclaim, the cheapest, with no allocation):
//! even at ten million losses a second on that one block, a stall of over
//! 100 seconds between the thread's read and its CAS. The count has 29 bits
//! (a count past `2^29 - 1`, about half a billion holders of one block,
//! panics, as `Arc`'s aborts) and the sequence flag one, which leaves the
//! generation its 30.
//!
//! A claim holds a reference of its own: `BUSY` is set together with one
//! more count, and the commit or the unclaim clears `BUSY` and drops that
//! reference in the same CAS. A claimed block is therefore never free,
//! whatever its holders do meanwhile, including a double free that takes
//! the publishing sequence's reference (a raw `BlockPool::free` refuses a
//! sequence's block, see [Reference counts](#reference-counts); the claim
//! does not rely on that, and loom's claim controls let the free ignore
//! the flag).
//! Drops, the checks of `free`, `ref_count`, `needs_copy` and a fork's added
//! reference count only the holders' references (the count less the
//! claim's), so no drop can take the claim's reference; whichever of the
//! commit (or unclaim) and the holders' drops takes the last reference
//! gives the block back through the usual path: evictable with its new key
//! after a commit, to the free list after an unclaim. The other design, a
//! last drop that clears a claim it finds and a commit that then fails,
//! would let the block be handed to a new owner while its publisher still
//! writes its key words and holds an index entry for it.
//!
//! ## Keys and the index
//!
//! A key is any 32 bytes; `hash_blocks` and `hash_blocks_with` compute
//! them from a prompt's tokens, a salt and tagged extra keys (LoRA
//! adapters, cache salts, multimodal inputs; `BlockHash`'s docs give the
//! layout). A block's key is kept in four `AtomicU64` words per block,
//! written only by its publisher: while the block is claimed (`BUSY`), or
//! just before the claim by a sequence that holds the block alone (see
//! [Publishing](#publishing)); read after an `Acquire` of the state word
//! or of an index slot. The
//! index is a fixed array of `AtomicU64` slots, 2.5 per block, in buckets
//! of 8 (one cache line; fewer slots per bucket in pools under 8 blocks):
//! a slot is empty or holds a block id and a 32-bit fingerprint of its
//! key. A key has two candidate buckets, always two different ones; an
//! insert takes the emptier, a lookup reads both. The index is only a
//! hint: every candidate's state is loaded (`Acquire`), its whole key
//! compared, and the reference taken with a CAS from that exact state,
//! which fails if the generation (and so possibly the key) changed.
//!
//! The buckets and the fingerprint come from a keyed hash of the key, not
//! from its bytes: a key is any 32 bytes (`BlockHash` is public), and keys
//! that are sequential, mostly constant, made of words that depend on each
//! other, or built on purpose to share buckets would otherwise crowd into
//! a few buckets, whose publishes then find no room (lost hits, never a
//! wrong one). The hash folds the key's four words with eight seed words
//! that each pool draws at random when it is built (from `std`'s
//! `RandomState`; fixed under loom and shuttle, so that schedules replay).
//! A *folded multiply* of two words is their 128-bit product with its two
//! halves XORed: `a = fold(w0 ^ s0, w1 ^ s1)`, `b = fold(w2 ^ s2, w3 ^ s3)`,
//! `h1 = fold(a ^ s4, b ^ s5)`, `h2 = fold(a ^ s6, b ^ s7)`. The high
//! bits of `h1` pick the first bucket (a multiply and a shift, no
//! division), those of `h2` the second among the others, and `h1`'s low 32
//! bits are the fingerprint. Each output depends on every bit of the key
//! and of the seed, so a set of keys chosen without knowing the seed lands
//! as uniformly random keys do; it is the keyed multiply-mix of `foldhash`
//! and `ahash`'s fallback, four multiplications a lookup, not a
//! cryptographic function: an attacker who could learn a pool's placement
//! (by timing its publishes, say) could aim keys at one pool's buckets, and
//! would gain refused publishes of those keys, the cost of a cache miss.
//! Keys from `hash_blocks` (SHA-256 states) are uniform already; for them
//! the hash changes nothing but the cost (see `BENCHMARKS.md`).
//!
//! Two choices keep every bucket short, and 2.5 slots per block keep the
//! emptier of a key's two buckets from being found full in practice: with
//! every block cached a bucket holds 3.2 entries on average, and the
//! emptier of two buckets holds more than 5 only at a few inserts in a
//! million (the distribution under churn is in `BENCHMARKS.md`). If both
//! are ever full, the publish leaves the block uncached. The library's
//! hits equal the reference's on the conversation trace at every pool
//! size, for uniform, sequential, low-entropy, correlated and crafted
//! keys alike (`tests/prefix_replay.rs`).
//!
//! An index entry lives as long as its block's key or claim: a publish
//! that loses or is refused removes its own entry, and an eviction, a
//! reset removes the block's entry before the block is handed out, and
//! a truncate that drops a key removes it before the sequence writes into
//! the block. So the index holds at most one entry a block, under any
//! concurrency, and what fills a bucket is blocks that hold keys (or claim
//! them) now.
//!
//! Bookkeeping per block: 8 (state) + 32 (key) + 20 (index) + 8 (release
//! stamp) + 10 (eviction candidates: 1.25 slots of 8) + a bit (the free
//! list's bitmap) + a bit (its map of fresh blocks) + a bit (the refill's
//! map) = 78 bytes and three bits.
//!
//! ## Publishing
//!
//! `publish` of key `K` on a held, uncached block `b`: first look `K` up as
//! a match would (without taking a reference); if a committed block holds
//! it, `b` loses at once, having claimed nothing. Otherwise claim `b` (CAS
//! in `BUSY`, `KILLED` and the claim's reference), write `K`'s words, arm
//! the claim (clear `KILLED`, a `Release` RMW); or, if the publishing
//! sequence holds `b` alone (its state word `SEQUENCE` with a count of 1
//! and no flag) and called the pool itself, write `K`'s words first and
//! claim `b` armed with one `Release` store of `BUSY` and the claim's
//! reference. Then insert `(fingerprint, b)`
//! into a bucket (a `Release` CAS), make a read-modify-write that changes nothing
//! (`fetch_add(0)`, `AcqRel`) on the first slot of `K`'s first bucket, then
//! rescan both buckets (`Acquire` loads) for rivals holding `K`:
//!
//! * a rival that committed (`CACHED`) holds `K`: `b` loses (first wins);
//! * a rival that claimed it too: the lower block id wins; `b` defers to a
//!   lower one (CAS in `DEFERRED`) and loses, and kills a higher one (CAS
//!   in `KILLED`, which makes the rival's commit fail), unless that rival
//!   committed first;
//! * a killed claim, a stale entry (a block whose key is being dropped) or
//!   another key is ignored.
//!
//! A claim is killed until it is armed because an entry can outlive the
//! claim that made it: a rescan that loaded a loser's entry can read the
//! state of a later claim of the same block, under another key, whose key
//! words are not written yet (or not visible to it), and would take it for
//! a rival. A rescan that reads the state after the arm (`Acquire`) sees
//! the later claim's key words, and one that reads it before sees a killed
//! claim; the entry the later claim inserts after its arm is found as any.
//!
//! A sole holder needs neither the CAS nor the arm. From its `Acquire`
//! load of `SEQUENCE` with a count of 1 until its claim, no other thread
//! writes the block's state or key words: a raw call refuses a sequence's
//! block, a fork adds a reference only through the publishing sequence
//! (busy publishing) and, the sequence calling the pool itself, in the
//! pool's count (an allocator that forwards to the pool may count a
//! fork's share on its own and let the pool see one reference for two
//! holders: the sequence names its allocator in its `SequenceCall` only
//! if that is a `BlockPool`, which a hidden trait method says and which
//! code outside the crate can neither override nor call, and the pool
//! takes the store claim only when it is the one named; any other call
//! takes the CAS claim, `tests/forwarded_publish.rs`; and no allocator
//! hands a block that such a sequence holds to a sequence of its own,
//! `BlockAllocator`'s contract, as the sole give-back and
//! `uncache_if_sole` already need), a revival, an
//! eviction and a rival's deferral or kill each need `CACHED` or `BUSY` in the word, and a key is written
//! only by a publisher of the block (the same argument as a sole holder's
//! give-back, [Reference counts](#reference-counts)). Its key words,
//! written before the claim's `Release` store, are seen by any rescan that
//! reads the claim. The claim saves two read-modify-writes of a publish's
//! five; a shared block (a fork's) is claimed with the CAS, and loom's
//! `shared_sole_claim` control, a store claim on a shared block, lets two
//! holders claim it at once.
//!
//! Then `b` commits (CAS from `BUSY` to `CACHED`, dropping the claim's
//! reference, `AcqRel`) unless it was killed. A loser removes its entry
//! and gives up its claim (a new generation, so that a late kill or
//! deferral cannot hit a later claim). Every publisher of `K` makes its
//! read-modify-write on the same word, after its insert; every write to a slot is a
//! read-modify-write, so the later of two publishers reads from the
//! release sequence of the earlier one's and synchronises with it: its
//! rescan sees the earlier one's entry (unless that one already lost and
//! removed it). Whichever sees whom, at most one commits, and of two
//! publishers that see each other's claims exactly one does.
//!
//! Nobody gives up on trust alone. A claim that loses while `DEFERRED` is
//! set does not give up: the CAS that would give it up finds the mark,
//! clears it instead, and the publisher puts its entry back and rescans.
//! A claim whose commit fails on `KILLED` clears it and rescans too: if
//! its killer is still claimed it defers to it, and if the killer lost
//! meanwhile it may commit. So the key can rest on a rival's claim only
//! while that claim will either commit or look again after the rival's
//! mark: a publish that returns without caching its key saw a block
//! holding the key, during the publish or in a look that began after it
//! deferred (by induction down the block ids, which a chain of deferrals
//! strictly lowers), unless the key's two index buckets were full when
//! the claim it deferred to put its entry back to look again (that claim
//! then gives up, as any publish that finds no room: a miss, never a wrong
//! hit). Without this, three overlapping publishes could leave the key
//! on no block: a claim that lost to a holder which then went,
//! and a later publish that deferred to that claim. Each extra look is
//! caused by another publish's mark or kill, so publishing stays
//! lock-free. The first lookup is kept as the cheap path: a publish of a
//! key that a block already holds claims nothing.
//!
//! ## Matching
//!
//! For each key in turn: look the key up, `Acquire` the candidate's state,
//! compare its key, and take a reference with a CAS from that state (on an
//! evictable block, after admitting one block of capacity, given back if
//! the CAS fails). A candidate whose state moved is read again; a miss ends
//! the match. So does a key whose block this match already took: a held
//! block keeps its key and a key names one cached block at a time, so
//! that is the first key repeating an earlier one, which chained hashes
//! never do. The blocks a match takes are distinct, and a table never
//! outgrows the pool. The first 32 hits are compared with the blocks taken
//! directly; a longer match builds a filter of block ids on the stack,
//! sized to the pool (32,768 bits in a pool of up to 32,768 blocks,
//! 131,072 bits in a larger one), and scans the blocks taken only on a hit
//! in it. In a pool of up to 131,072 blocks the filter has a bit per block,
//! so a hit is a repeated key and the match costs time linear in its
//! length. In a larger pool, ids that differ by a multiple of 131,072
//! share a bit, and each hit on a shared bit scans the blocks taken: such
//! a match (every one of more than 131,072 blocks) can cost up to its
//! length squared.
//!
//! ## Peeking
//!
//! `BlockPool::peek_prefix` walks a match's path without its
//! read-modify-writes: for each key, look it up and check each candidate,
//! stopping at the first miss. It takes no reference, so it cannot hold a
//! block's key still while it compares it, as a match's CAS from the state
//! it read does; it reads the state twice instead, a seqlock whose
//! sequence is the generation:
//!
//! 1. load the state (`Acquire`): cached, generation `g`; the commit of
//!    its key (`Release`) happens-before, so the key words of `g` are
//!    visible;
//! 2. load the four key words (`Acquire`) and compare them;
//! 3. load the state again: still generation `g` (so still cached: the
//!    loss of the key is a new generation).
//!
//! The block's key words change only after it has lost the key of `g` (an
//! eviction, a reset or a truncate, each a new generation), and whoever
//! writes them saw that loss first: a claim (a CAS on the state, which
//! needs the block not cached) or a sole holder's `Acquire` load of its
//! uncached state, then four `Release` stores. A word of a later key read
//! in step 2 synchronises with its store, so step 3 sees the loss or a
//! later state (coherence), and its generation is not `g`. So when step 3
//! passes, every word compared was the key of `g`, and the block held
//! that key from step 1 to step 3: each key a peek counts was cached at a
//! moment of the call. A moved generation is read again. The stop at a
//! repeated key is the match's, with a block id seen twice confirmed by
//! comparing the keys (with nothing taken, a block may hold another key
//! by its second sighting). Each key's moment is its own: with publishes
//! and evictions running, a repeated key that moved to another block
//! between its two lookups counts twice, which no match does. The loom model `prefix::peek_vs_republish`
//! checks the three steps against an eviction and a republish of the
//! block, with the key words stored `Relaxed` and with step 3 left out as
//! its controls.
//!
//! A hybrid peek (`BlockPool::peek_hybrid_prefix`) runs
//! `HybridSequence::try_match_prefix`'s search with peeks in place of the
//! group matches: the full groups' prefixes, then each sliding (or
//! chunked) group's window ending at the candidate length, lowered until
//! every group agrees. Where the match keeps the blocks a group has found
//! when another group lowers the length, the peek searches the window
//! afresh (it keeps nothing, so it allocates nothing): for chained keys
//! the two find the same length, for keys that repeat one they can
//! differ.
//!
//! ## Eviction order
//!
//! When a cached block's last reference goes, it gets a release stamp from
//! a pool-wide 64-bit clock (a give-back takes a range of stamps for each batch of
//! up to 32 of its blocks and writes each block's stamp as soon as its drop
//! returns; a sequence gives its blocks back last block first, so that a
//! prompt's tail is evicted before its head). An allocation pops the free
//! list first; for the rest it evicts: a CAS from the evictable state to
//! held (count 1, not cached, next generation), then it removes the
//! block's index entry before the block is handed out.
//!
//! Evictors take candidates from a ring of `num_blocks + num_blocks / 4`
//! `(stamp, id)` words (the id in as many bits as the pool's largest one
//! needs, at most 32; the stamp's low bits in the rest, at least 32; every
//! evictable block fits, with room for stale
//! candidates: those of blocks revived and released again since), oldest
//! first, at positions that only grow. An evictor copies up to 32
//! candidates and then claims their positions with one CAS (`Release`): a refill reads the position (`Acquire`) before it
//! rewrites a slot for a position a ring later, so no evictor reads a slot
//! that a refill has begun to fill. A block that becomes evictable is
//! appended as the youngest (a give-back appends its batches with one CAS
//! each), unless the ring is full or *overflowed* (an evictable block is
//! missing from it; appends then stop). An append *misses* when it skips
//! an overflowed or full ring, or when its CAS on the length finds another
//! writer there (the two may have overwritten each other's entries); a
//! miss bumps a count that sits beside the overflowed bit in one word and
//! sets the bit.
//!
//! **Refills.** Once an overflowed ring holds at most an eighth of its
//! capacity, the first evictor to see it claims a flag and refills it while the
//! others go on popping the candidates left: a scan of every state word
//! selects the oldest evictable blocks that have no current candidate (the
//! candidates left are marked for the scan in a map of one bit a block, so
//! every evictable block without a current candidate is a choice), as many
//! as the free slots take, and appends them sorted. The refill ends the
//! overflow only if its placing pass wrote every such block it saw (a
//! block released between its passes may be ranked by its old stamp and
//! take the place the histogram counted for an older one; the map is
//! cleared whole after the scan, since a racing append may have rewritten
//! the slots it marked from) and no miss came since its scan began:
//! it clears the bit with a CAS from the word it read before the scan, so
//! a block that a race left out after the scan passed it keeps the ring
//! overflowed until the next refill finds it. The selection uses no heap and
//! allocates nothing: a pass for the range of ranks (a stamp's signed
//! distance from the clock read when the scan began, so that a block
//! released during the scan ranks youngest), a histogram of 1,024 buckets
//! (of a power-of-two width, a shift a block) whose oldest buckets that
//! fit are kept (taken again over a narrower range only if even the
//! oldest bucket does not fit), and a pass that places each kept block in
//! its bucket's range; each bucket is then sorted in place, and the sorted
//! entries published with a `Release` CAS of the ring's length: the first
//! bucket at once, then each time their count doubles, and the rest at the
//! end. So with one thread the
//! order is exactly least recently released first, as in the reference;
//! while few blocks are evictable, releases keep the ring filled and
//! evictions need no scan, and while many are, a scan serves
//! `num_blocks / 4` evictions or more.
//!
//! Nobody waits on the flag for long: an evictor that finds the ring empty
//! while another refills gives up its time slice up to 16 times (with more
//! threads than cores, the refiller may be the thread waiting for a core),
//! and then sweeps the pool from a rotating hand, taking first the
//! evictable blocks stamped within `num_blocks / 16` stamps after the last
//! candidate taken (the next oldest), then within `num_blocks / 2`, then
//! any.
//!
//! Under concurrency the order is approximate: a stamp is written just
//! after the drop that made the block evictable, a batch's stamps are
//! taken at its first drop (a give-back descheduled midway leaves up to a
//! batch stamped early), a block left out of the ring by a miss waits for
//! the next refill (the ring stays overflowed until one finds it), and
//! a sweep takes roughly the oldest. Every candidate is re-checked against
//! its block's stamp (the low bits its word holds) and its state's CAS, so
//! the order is the only thing that is approximate. A stale candidate
//! passes the stamp check only if its block was released again a multiple
//! of `2^(64 - id_bits)` releases later (2^44 in a pool of a million
//! blocks), and only while it still sits in the ring.
//!
//! `reset_prefix_cache` evicts every evictable block the same way (its
//! capacity admitted first, also on a closed pool) and frees it.
//!
//! ## Statistics
//!
//! Keys queried, blocks hit and evictions are counted in cache-padded
//! cells (one per free-list shard, at least 16), written with `Relaxed`
//! adds by the threads whose number picks them (as a thread's number picks
//! its home shard), except the hits: a match adds them with `Release`
//! after its `Relaxed` add of the keys it queried, and `prefix_stats`
//! reads each cell's hits with `Acquire` before its queries, so a snapshot
//! never shows more hits than queries. `prefix_stats` sums the cells. A match thus adds no
//! write to a line that other threads write, as long as there are no more
//! threads than cells.
//!
//! # KV events
//!
//! A pool built with KV events reports each change of its prefix cache to
//! a consumer ([`BlockPool::drain_events`](crate::BlockPool::drain_events)):
//! a *store* when a publish commits a key, a *removal* when an eviction, a
//! reset or a truncate drops one. The producers are those paths, and they
//! stay lock-free and allocation-free.
//!
//! **The rings.** There is one ring per free-list shard, each an array of
//! cache-padded slots (a position word, a meta word with the kind and the
//! block id, the key's four words and the parent key's four: 128 bytes)
//! and a `tail`. A key's records always go to the ring its index
//! fingerprint picks (a hash under the pool's seed: keys a user chooses
//! cannot pile into one ring). A producer reads `tail`, checks that the
//! slot at `tail % capacity` is free (its position word equals `tail`:
//! the consumer has read the record it held a lap ago), and takes the
//! position with a CAS on `tail`; it writes the payload with `Relaxed`
//! stores and publishes it with a `Release` store of `tail + 1` into the
//! position word. A slot whose position word is behind means the ring is
//! full: the producer does not wait, and its event is lost.
//!
//! **Reserve, then act.** A transition takes its position *before* the CAS
//! on the block's state word that makes it, and *after* the observation
//! that makes it possible: a publish after the rescan that found no rival
//! (just before its commit), an eviction or a reset after its `Acquire`
//! load of the evictable state (it reads the key words then; the CAS from
//! that exact state proves them unchanged), a truncate after its `Acquire`
//! load of the sole-held cached state. If the CAS fails, the position gets
//! a void record, which the consumer skips; if it succeeds, the record is
//! written (or, when the ring was full, the loss is counted, with the
//! position it would have had). So each successful transition is reported
//! once, and nothing else is.
//!
//! **Order per key.** The tail's CAS is `AcqRel`, so a ring's positions
//! are taken in an order that agrees with happens-before both ways: if
//! transition `A` took an earlier position than `B`, everything `A`'s
//! thread did before its reservation happens-before everything `B`'s does
//! after its own. Now let `B` be the transition of a key that follows `A`:
//! `B` is possible only because its observation saw `A`'s act (the
//! removal's load sees the commit that stored the key; the next store's
//! rescan sees the previous block's eviction, directly in its state word
//! or through its index entry's removal, which follow that eviction; a
//! block evicted and republished passes from the evictor to its next owner
//! through the allocation). Had `B` taken the earlier position, `B`'s
//! observation would happen-before `A`'s act and could not have seen it
//! (coherence). So a key's records lie in its ring in the order of its
//! transitions: store, removal, store, ... The loom models
//! (`src/loom_tests/events.rs`) check this against an eviction and
//! against a truncate racing a republish of the key on another block, and
//! catch a removal reserved after its CAS and a store reserved before its
//! claim.
//!
//! **Across keys and rings.** Within a ring the order is the reservations'
//! (consistent with happens-before); across rings there is none. The
//! consumer reads each ring from its head up to the first position not
//! yet written (a record whose producer is between its reservation and
//! its write, one CAS long, holds back its ring's later records until the
//! next drain), then merges the rings' records keeping each ring's order
//! but for one move: a store whose parent key is stored by a record still
//! to come waits for it. When every ring's next record waits, the parent's
//! store that one of them waits for (in its own ring or another), and up
//! the chain the stores that one waits for in turn, are moved ahead of the
//! records before them in their rings, the topmost first, as far as no
//! removal of a store's key and no lost events come before it there, so
//! that each key's records keep their order; failing that (a cycle, which
//! only a chain of made-up keys that repeats a key can form), the first
//! ring's next record goes. An index of the records by key, built at the
//! first such move, finds each parent's store in one lookup; every lookup
//! of a climb but its last moves a store, and a climb that moves nothing
//! is not made again until a record it depends on (its parent key's, or
//! the lost events in the way) is merged, so a drain's merge stays within
//! a few lookups a record and a ring however its chains lie. A store whose parent is the key
//! just stored (for the same group) joins its
//! [`KvEvent::BlockStored`](crate::KvEvent), and consecutive removals of
//! one group form one [`KvEvent::BlockRemoved`](crate::KvEvent).
//!
//! **Groups.** A record's meta word carries, beside its kind and block id,
//! the group of layers of the publish that stored the key (16 bits: none,
//! or a [`HybridSequence`](crate::HybridSequence)'s group index plus one).
//! A store knows it from its publisher. A removal reads it from a per-block
//! tag (two bytes a block, allocated with the rings) that the publisher
//! writes after its claim and before its commit, as it writes the key's
//! words: the tag's store is `Relaxed`, published by the commit's
//! `Release`, and a remover reads it once the block is its own (its
//! eviction CAS succeeded, or it holds the block alone and dropped the
//! key), so no claim can rewrite it between the publish it reports and
//! the read. A claim that fails writes nothing; the loom control
//! `early_group_tag` (the tag written before the claim, so a holder whose
//! claim loses overwrites the winner's) is caught by
//! `group_of_a_shared_block`.
//!
//! **Losses.** A loss counts into its ring's `lost` and raises `lost_at` to
//! the tail it found (`fetch_max`, then the count's `Release` add). The
//! consumer reports the count as [`KvEvent::Dropped`](crate::KvEvent) once
//! it has read every record before that position: a record of the same
//! key after the report describes a later transition (a record that
//! happens-before the lost event took an earlier position), so a router
//! that clears its view there and replays what follows never holds a key
//! the pool has removed.
//!
//! **The consumer** takes a mutex of its own (consumers take turns; no
//! producer touches it), numbers the non-empty batches, and opens the
//! stream with [`KvEvent::AllBlocksCleared`](crate::KvEvent) (a new pool's
//! cache is empty). It allocates (the merge, the events); the producers
//! never do.
//!
//! # Waiting
//!
//! [`SlotCounter::reserve`](crate::SlotCounter::reserve),
//! [`reserve_owned`](crate::SlotCounter::reserve_owned),
//! [`reserve_blocking`](crate::SlotCounter::reserve_blocking),
//! [`reserve_owned_blocking`](crate::SlotCounter::reserve_owned_blocking),
//! [`BlockPool::alloc`](crate::BlockPool::alloc),
//! [`alloc_blocking`](crate::BlockPool::alloc_blocking) and
//! [`Sequence::reserve`](crate::Sequence::reserve) /
//! [`reserve_blocking`](crate::Sequence::reserve_blocking) wait in one
//! FIFO queue per allocator (the pool waits on its admission counter's).
//! The queue (module `wait`) knows nothing about slots or blocks: it takes
//! units for its head through a trait (`Units::take`: all or nothing,
//! ignoring the waiters), and the allocator pokes it after every release.
//!
//! **The queue.** A `std::sync::Mutex` (loom's and shuttle's under the
//! model checkers) over a `VecDeque` of entries in ticket order: the
//! granted ones first (grants go in order), then the pending ones, whose
//! first is the *head*. An entry holds its request, its headroom and how
//! to wake it (a task's `Waker`, or the condition variable that blocking
//! waiters sleep on). The deque's buffer is the one allocation of waiting,
//! and it is reused: a wait allocates only when the queue grows past its
//! largest size so far (and clones its task's waker). Two words beside the
//! lock, in a cache line of their own, are read without it: `owed`, what
//! the pending waiters are owed (0 when no one is pending), and the entry
//! count that [`waiters`](crate::SlotCounter::waiters) returns. Only the
//! waiting paths write them, under the lock.
//!
//! **What the waiters are owed.** Granted in arrival order, the `i`-th
//! pending waiter is served once the `n`s of those before it are taken and
//! its own `n` plus its headroom are free; so the pending waiters need
//! `owed = max over i of (n_1 + ... + n_i + headroom_i)` free units (capped
//! at the capacity: at the capacity nothing new fits anyway). A newcomer
//! raises it in O(1); a grant or a removal recounts the pending entries
//! (stopping at the capacity). A new admission that leaves `owed` free
//! delays no waiter, headroom included.
//!
//! **Grants on the waiter's behalf.** The grant loop (under the lock)
//! takes the head's `n` units if `n + headroom` are free, counts the entry
//! granted, and goes on with the next head; it stops at the first head
//! that does not fit, so no waiter passes an earlier one. The units are
//! the waiter's from that moment ([`used`](crate::SlotCounter::used) shows
//! them): its next poll only collects them. The loop runs when a waiter
//! queues, after every release that finds someone pending, and when a
//! waiter leaves.
//!
//! **Who gets what.** While anyone is pending, a new admission
//! ([`try_reserve`](crate::SlotCounter::try_reserve),
//! [`admit`](crate::SlotCounter::admit),
//! [`try_alloc`](crate::BlockPool::try_alloc), an append to a
//! [`Sequence`](crate::Sequence) that holds no block beyond a prefix it
//! matched with no reservation (an empty one, or a new request whose
//! prompt hit the prefix cache), a [`Sequence::try_reserve`](crate::Sequence::try_reserve),
//! a revival by [`try_match_prefix`](crate::Sequence::try_match_prefix)
//! that no reserved block of the sequence pays for,
//! a zero-block check with headroom) leaves `owed` free, so a large
//! waiting request, with or without headroom, is never starved by a
//! stream of small `try_*` requests; and a new waiter does not try the
//! lock-free path at all: it queues behind the others, and the grant loop
//! serves it after them. Growth of what a caller already holds
//! ([`Sequence::try_append`](crate::Sequence::try_append) and
//! `try_append_cow` on a sequence that holds a block beyond its matched
//! prefix, or that matched into a reservation, which admitted it, and
//! holds a block;
//! [`try_fork`](crate::Sequence::try_fork) of one, the
//! `try_grow` of a guard that holds slots) does not
//! wait behind the queue: it takes any free unit, as a scheduler lets its
//! running sequences decode before it admits waiting ones. That delays the
//! head only while running work grows, which ends when it finishes (and
//! gives back) or is preempted; new work cannot overtake the head. An
//! admission is the reservation, not a block kept: a request whose match
//! took the place of every reserved block runs on shared blocks alone,
//! so (as with forks) the running sequences are not bounded by the
//! pool's blocks, and while nobody waits one free block can admit such
//! requests one after another. The head's headroom (a [`Sequence::reserve`](crate::Sequence::reserve)
//! admission's watermark) is left free at its grant, for that growth:
//!
//! | situation | a new admission for `k` (headroom `h`) | growth by `k` | the head (`n`, headroom `H`) | a waiter behind the head |
//! |---|---|---|---|---|
//! | nobody waits | takes `k` if `k + h` are free | takes `k` if free | — | — |
//! | someone waits | takes `k` only if `k + h + owed` are free (`BehindWaiters` if only `k + h` are); a new waiter queues at the back | takes `k` if free | granted as soon as `n + H` are free, by the release that frees them | granted after the head, as soon as its `n` plus its headroom are free beside the head's `n`; waits its turn, even if it would fit now |
//! | the head leaves (dropped, timed out) | as above, with the new `owed` | as above | a granted head's units go back and are handed on | re-checked at once |
//! | after `close` | `Closed` | `Closed` | woken with `Closed` (a grant made before stays) | woken with `Closed` |
//!
//! A `try_*` refusal because of the waiters is
//! [`BehindWaiters { requested, available, owed }`](crate::ReserveError::BehindWaiters):
//! at the refusal, `requested + headroom <= available < requested +
//! headroom + owed`. [`Full`](crate::ReserveError::Full) always means
//! short of `requested + headroom` itself. A blocking call that times out
//! leaves the queue and makes one last `try_*` attempt, whose refusal it
//! returns.
//!
//! **What a sequence can never get.** A [`Sequence`](crate::Sequence)'s
//! calls (`try_append`, `try_append_cow`, `try_reserve`, `reserve`,
//! `reserve_blocking`, `try_fork`) cannot be given the blocks in the
//! sequence's own table while they wait or retry: a request larger than
//! the pool less those is `NeverFits` at once, with that rest as the
//! capacity, rather than a retryable `Full` or a wait that never ends. (A
//! copy-on-write source the sequence keeps is not counted: the caller gives
//! it back with `retire_copy_source` once the copy is made, so a request
//! short only of it is `Full`.) (An append does not count
//! the block for a shared tail's copy there, which its other holders'
//! drops make unneeded; a reservation, whose size is fixed when it is
//! made, does.)
//!
//! **Where locks are taken.** Never on a `try_*` path that nobody waits
//! behind; a `try_*` call adds one `Relaxed` load of `owed` (skipped for
//! an empty request without headroom), and a counter's, or a pool's that
//! its home shard admits on the fast path, takes no lock at all. A
//! release (guard drop, `release`, a pool free, a sequence's truncate or
//! drop) adds that load (its read-modify-write becomes `AcqRel`, free on
//! x86), and takes the lock only when `owed` is not 0. So does a pool's
//! `try_*` call that gathers (its home shard short of the request and
//! `owed`): what it held in transit goes back as a release does, and
//! while anyone is pending it runs the grant loop under the lock, and the
//! wakes that loop leaves (see below). A waiting call takes the lock to
//! queue, at each later poll, and to leave.
//!
//! **Wakers run after the lock.** No code of the caller's runs under the
//! lock. A step that grants (or closes) counts every grant and publishes
//! `owed` first, notifies the blocking sleepers (a `notify_all`), and
//! moves the settled tasks' wakers into a fixed batch of 32 (no
//! allocation; more go in further batches), which is woken once the lock
//! is let go of; wakers that a removal or a new poll replaced are dropped
//! then too (dropping a waker can drop a task, and the futures in it,
//! whose drop takes the lock). So a waker may poll inline, and a waker
//! that panics finds the queue consistent: nothing is taken for an entry
//! that still looks pending. The panic is caught until every other waker
//! of the batch (and of the batches after it) has run, so every entry
//! settled beside it is woken all the same (nothing else would wake it:
//! with nobody pending no release runs the grant loop, and after `close`
//! nothing does), and is then resumed in the caller whose step settled
//! the entry (a release, a poll, a drop, a blocking call that queues or
//! whose timeout runs out, or a pool's `try_*` call whose gather gave
//! blocks back, see "Where locks are taken"). A waiter records its ticket
//! before the wakes of its own first look run, so that if they unwind it
//! is queued, and its drop (a future's, or a blocking call's guard)
//! leaves the queue. A poll that collects its grant (or its `Closed`)
//! marks its wait done before it lets go of the lock; if the wakes after
//! the lock then unwind (its own replaced waker's drop included), the
//! grant it collected is handed on, as a release would, before the panic
//! goes on: the caller never gets it. A step that runs while its thread
//! unwinds already (the drop of a future, a reservation or a sequence
//! whose task panicked, or of a blocking call's entry as the call unwinds)
//! runs every wake all the same but drops a waker's panic: resumed there,
//! it would abort the process. A poll clones its
//! new waker before it takes the lock, and a waker it does not keep is
//! dropped after the lock, as every other.
//!
//! **What the caller of a step that unwinds finds.** Everything whole:
//! no block lost, none listed by two holders. A pool's `try_*` call whose
//! gather's wakes unwind has taken nothing (what it admitted goes back,
//! and the waiters look again, before the panic goes on; loom model
//! `gather_unwound_by_a_waker`, control `panic_keeps_admission`). A
//! `Sequence` makes its own changes first and gives back last, with its
//! table cut (or its window's entries made null) however the release
//! ends: a `truncate` whose table's give-back unwinds still keeps its
//! copy-on-write source (as after a copy-on-write append), a drop gives
//! its table back even if the source's give-back unwinds, and an append
//! gives back its previous copy's source before it commits (unwound
//! there, the append is undone, its new blocks reserved in the table, and
//! no copy to make is lost). Where a
//! call gives back in several steps (a `HybridSequence`'s truncate,
//! shrink, append or match, over its groups, with each group's copy
//! made known before its previous source goes; a match's revivals and
//! its give-back of what it admitted ahead; `BlockPool::complete_all`,
//! over the fences), it catches the panic, finishes every step, and
//! resumes it at its end (`tests/waker_panic.rs`).
//!
//! The same holds when the panic is a custom allocator's
//! (`tests/allocator_faults.rs`): a fenced truncate cuts its table however
//! the allocator's `retire` ends, and retires its copy-on-write source
//! all the same, as a sequence's `retire` does (a `HybridSequence`'s
//! retires every table), so that no block goes back before its fence; a
//! sequence reads the block size once, when it is made, so no later call
//! is cut short by it; a sliding window picks the blocks it recycles
//! into an append before it changes its table, so a `needs_copy` that
//! unwinds there leaves that window whole, and the append is undone with
//! its blocks given back (the other windows stay moved on); blocks an
//! allocation appended before it unwound, which a `HybridSequence` holds
//! apart from its tables until it hands them out, are given back by its
//! next call that allocates or matches (an append that takes blocks, a
//! reservation, a match), its `retire` or its drop.
//! A sequence also holds the allocator to all or nothing: an allocation
//! that succeeds with more or fewer ids than asked, or fails with some, is
//! a panic before the sequence changes (the ids of a success given back
//! first), as is an `add_refs` that counts more blocks than it was given;
//! and it asks `needs_copy` once for each decision, so an answer that
//! turns from false to true (which the contract forbids) is followed as
//! given, or is a panic, never a copy skipped.
//!
//! **No lost wake-up.** A waiter that finds the allocator short (or
//! someone queued) queues (writing `owed` under the lock), makes a read-modify-write that changes
//! nothing (`AcqRel`) on every word a release writes (the counter's state
//! word; each shard word of a pool), and runs the grant loop itself; a
//! releaser gives its units back with an `AcqRel` read-modify-write of one
//! of those words and then loads `owed`. The two read-modify-writes are
//! ordered in that word's modification order, and the second reads from
//! the first: if the waiter's comes first, the releaser's load sees it
//! queued and runs the loop; if the release comes first, the waiter's
//! loop sees the released units. Read-modify-writes on one word do what a
//! pair of `SeqCst` fences would, without a full barrier on the release
//! path (on x86 the release's locked instruction is one already), and
//! loom models them exactly. The loom models' controls remove the
//! waiter's second attempt (`late_enqueue`) or its read-modify-writes
//! (`unfenced_wait`), and loom catches the lost wake-up. Three more loom
//! models cover the rules above: a head with headroom against a relay of
//! small admissions (control `owed_without_headroom`: `owed` is the head's
//! `n` alone, and the head starves), a waker that panics against two
//! releases (control `wake_before_count`: the head is woken before its
//! grant is counted, and its unit is lost), and a waker that panics beside
//! a waiter granted in the same batch (control `panic_cuts_batch`: the
//! rest of the batch is dropped uncalled, and that waiter is never
//! woken).
//!
//! **Cancellation.** Dropping a future (or a blocking call timing out)
//! takes the lock and removes its entry: a granted one gives its units
//! back and the grant loop hands them on; a pending head lets the loop
//! re-check the waiters behind it (they may fit where it did not). A
//! future that resolved has no entry, and its guard is an ordinary guard.
//!
//! **Close.** `close` sets the allocator's closed flag first (so no grant
//! can succeed), then marks the queue closed and wakes every pending entry
//! (after the lock, as above); a waiter finds `Closed` at its next poll. A waiter that queues after the flag is
//! set fails at its first grant attempt.
//!
//! **The pool.** A grant admits blocks on the pool's counter; the waiter
//! then takes their ids from the free list exactly as `try_alloc` does
//! after its admission, so the ids are written to the caller's vector only
//! when the future resolves.
//!
//! # Fenced release
//!
//! A fenced give-back ([`Sequence::retire`](crate::Sequence::retire),
//! [`Sequence::truncate_fenced`](crate::Sequence::truncate_fenced),
//! [`Sequence::retire_copy_source`](crate::Sequence::retire_copy_source))
//! does not drop its references: it lists the block ids under the fence in
//! one of 8 cache-padded `Mutex<HashMap<u64, Vec<BlockId>>>` (the map
//! `fence % 8`), and [`BlockPool::complete`](crate::BlockPool::complete)
//! takes the fence's list out and drops the references through the same
//! path a sequence's drop takes (`release`: a load and a plain store for
//! a sole reference to a sequence's block, the CAS loop for any other, one `fetch_or`
//! per word given back, the admission count given back after them). So
//! a fenced block stays counted as used until then, and a cached one
//! becomes evictable only then. A retire moves the sequence's own table in
//! as the fence's list when the fence has none yet (no allocation but the
//! fence map's entry, which may grow the map), and
//! appends it otherwise; a truncate appends the ids it drops (the list's
//! growth is the only allocation).
//!
//! The lock is there because a lock-free list of heap nodes needs `unsafe`
//! (a Treiber stack of boxed nodes reclaims them with raw pointers), and
//! because a "take all, push back the unfinished" stack loses completions
//! that race (a complete that runs while another thread holds a fence's
//! list finds nothing). Retire and complete happen once per sequence or
//! truncate and once per step, not per block or token, and each holds the
//! lock only to move a list in or out; nothing else takes it, so the
//! allocation and free paths stay lock-free. Fences are names, not a
//! clock: each completes exactly its own retirements, found by a lookup,
//! so completing out of order costs nothing. `pending_release_blocks` is
//! a `Relaxed` gauge, raised before a retirement is listed (so a racing
//! complete never takes it below 0) and lowered once a complete has taken
//! the list out, before its references go.
//!
//! # Orderings
//!
//! ## `SlotCounter`
//!
//! * **Admission is `Acquire`** (the successful CAS). It synchronises with
//!   the `Release` of whoever gave the slots back, so everything the
//!   previous holder wrote into those slots happens-before the new holder
//!   uses them.
//! * **Giving back is `AcqRel`** (a guard's `fetch_sub`, the CAS in
//!   `release`): `Release` for the same reason, seen from the other side,
//!   and `Acquire` for the wait queue's hand-shake (see
//!   [Waiting](#waiting)).
//! * **Failed CASes and refusals are `Relaxed`**: a refusal hands out
//!   nothing, so there is nothing to order; the value it reports was really
//!   held.
//! * **`close` is `Release`** and `is_closed` `Acquire`: the flag shares the
//!   word with the count, so its place among admissions is fixed by the
//!   word's modification order whatever the ordering; the pair only lets a
//!   thread that sees the flag through `is_closed` also see what the closer
//!   did first. An admission refused with `Closed` promises no such thing:
//!   it may have seen the flag through a `Relaxed` load or a failed CAS.
//! * **`peak_used` and the getters are `Relaxed`**: they are statistics and
//!   snapshots, and order nothing.
//! * **The wait queue's `owed` and count words are `Relaxed`**: written
//!   under the queue's lock; a releaser's read of `owed` is ordered by the
//!   read-modify-write hand-shake described in [Waiting](#waiting), and a
//!   `try_*` call's or a new waiter's read needs no order (a stale value
//!   puts the call before the enqueue it missed). A grant is an admission
//!   (`Acquire`), and a cancelled grant goes back as a release
//!   (`Release`).
//!
//! ## The pool's admission
//!
//! * **Takes are `SeqCst` CASes** (the fast path's and the gather's): the
//!   `Acquire` half synchronises with the `Release` of whoever gave the
//!   blocks back (every change of a shard word is a read-modify-write, so
//!   a take continues the release sequence of every earlier give-back to
//!   that shard); the total order places each take against the closed
//!   flag (see [Admission](#admission)).
//! * **Giving back is an `AcqRel` `fetch_add`**: `Release` for the same
//!   reason, seen from the other side, and `Acquire` for the wait queue's
//!   hand-shake (see [Waiting](#waiting)). A count that a gather moves keeps its chain:
//!   the gatherer acquired it and releases it again.
//! * **The closed flag is `SeqCst`** (the store in `close`, both reads in
//!   an admission, `is_closed`): the two reads bracket the take in the
//!   single total order.
//! * **The gather's loads are `SeqCst`**, so the versions it compares
//!   between passes are in the same total order as the takes; **failed
//!   CASes are `Relaxed`** (only a retry follows).
//! * **The peak, the other shards' estimate and the getters' sums are
//!   `Relaxed`**: statistics and snapshots, ordering nothing (the estimate
//!   also sizes a match's admission ahead, which the admission's CAS then
//!   makes or refuses).
//!
//! ## The free list
//!
//! * **Giving back is a `Release` read-modify-write** (a `SeqCst`
//!   `fetch_or`): the freer's writes into the blocks happen-before any
//!   later take that reads that word.
//! * **Taking is an `Acquire` CAS**: every change of a word is a
//!   read-modify-write, so each give-back heads a release sequence that all
//!   later values of that word continue; whoever takes a block
//!   synchronises with every earlier give-back to its word, and so with
//!   the block's last holders. The load before the CAS is `Relaxed`: only
//!   a guess that the CAS validates.
//! * **The summaries' accesses are `SeqCst`** where they pair a take's
//!   clearing with a give-back's filling (see [The free list](#the-free-list)),
//!   `Relaxed` elsewhere: a hint, which a last look through every word
//!   backs up.
//!
//! ## `BlockPool`
//!
//! * **Freeing is `Release`**: a reference drop is an `AcqRel` CAS on the
//!   block's count (the `Release` half orders this holder's accesses
//!   before the last drop; the `Acquire` half lets the last dropper see
//!   every other holder's), or, for a sequence's sole reference, an
//!   `Acquire` load (it reads from every other holder's drop) and a
//!   `Relaxed` store, which the give-back's `Release` publishes; the give-back to
//!   the free list is `Release`, and the count is given back with a
//!   `Release` `fetch_add` on the freeing thread's home shard.
//! * **Allocation is `Acquire`**: the admission CAS and the free list's
//!   take. So everything a previous owner wrote into a block happens-before
//!   the next owner touches it.
//! * **Setting a taken block's count to 1 and adding a reference for a
//!   fork are `Relaxed`**: the block is exclusively ours, or we already
//!   hold a reference, and the new reference travels to its holder through
//!   whatever hands over the sequence (as with `Arc::clone`).
//! * **The fresh bitmap**: a take's mark is a `Relaxed` `fetch_or` and a
//!   give-back's clear a `Relaxed` `fetch_and` before the give-back's
//!   `Release` `fetch_or` of the free word, so a block's next holder, whose
//!   take acquires that, marks it after the previous holder's clear in the
//!   fresh word's order. A caller that holds every block of a word (its
//!   take emptied the word) marks and clears with plain stores of the
//!   same orderings: no other thread writes the word until those blocks
//!   go back, and every earlier write of it happens-before the take. Counting a fresh block's reference is a `Relaxed`
//!   store of its state word followed by a `Release` `fetch_and` of its
//!   bit, which a raw call's check reads with `Acquire` before it reads
//!   the state word again: a bit read clear means the count is seen. The
//!   check may read a later value of the fresh word, written by another
//!   holder's `Relaxed` mark or clear of its own bits: those are
//!   read-modify-writes, which continue the clear's release sequence (a
//!   plain store of the word needs a holder of all its blocks, so none
//!   comes between a count's clear and the give-back of that block), so
//!   the check still synchronises with the clear (the loom models
//!   `ref_count_vs_fork_beside_a_give_back` and `ref_count_vs_publish`
//!   race exactly that).
//! * **`needs_copy` is `Acquire`** (one load: shared, or cached): if
//!   another holder dropped its reference, its reads of the block
//!   happen-before this sequence decides to write into it.
//! * **The checks of `free` and `ref_count` are `Acquire` loads**: a
//!   validation read or a snapshot (the drops that follow are what order),
//!   `Acquire` only so that a bare word's fresh bit is read after it, and
//!   the word again after the bit.
//!
//! ## The prefix cache
//!
//! * **The commit is `AcqRel`** (the CAS from `BUSY` to `CACHED` that drops
//!   the claim's reference), and the index insert `Release`: the
//!   publisher's writes into the block and its key words happen-before any
//!   thread that reads that state (or a later value of its release
//!   sequence: every later change of the word is a read-modify-write) or
//!   that slot with `Acquire`. The `Acquire` half, like a last drop's, lets
//!   a commit that drops the block's last reference see every holder's
//!   accesses before it gives the block back; so does the unclaim's
//!   `AcqRel`.
//! * **The CAS claim is `Relaxed`**: its caller holds a reference, so the
//!   block is not free, and it publishes nothing (the arm after the key
//!   words is the `Release`). **A sole holder's claim is a `Release`
//!   store** after its key words, in place of the arm, and its load of the
//!   state before them is `Acquire`: a co-holder's last drop, and the key
//!   words of any claim it gave up, happen-before the new key words.
//! * **A match loads the state with `Acquire` and revives with an
//!   `Acquire` CAS**: it sees the publisher's writes before it compares
//!   the key, and a revival of an evictable block synchronises with the
//!   last holder's drop (`AcqRel`), as an allocation does.
//! * **The key words are stored `Release`**, written while the block is
//!   claimed (or just before a sole holder's claim), after the claim or
//!   the sole holder's `Acquire` load of the state: a peek's `Acquire`
//!   loads of them order its second read of the state after the loss of
//!   the key they replace (see [Peeking](#peeking)). For matches and
//!   publishers the arm or the sole claim, the insert and the commit
//!   publish them, and they read them `Relaxed` after an `Acquire`: a key
//!   rewritten since the read implies a new generation, which the
//!   reader's CAS on the exact state catches.
//! * **An eviction is an `Acquire` CAS** on the state word: the last
//!   holder's accesses happen-before the evictor's.
//! * **Every CAS from a state read earlier relies on the generation**
//!   (a revival, an eviction, a kill): orderings cannot tell two
//!   incarnations of a block apart, the 30-bit generation does, unless the
//!   block loses a key or a claim a multiple of 2^30 times while the
//!   thread stalls between its read and its CAS (see
//!   [The state word](#the-state-word) for what that takes).
//! * **The rescan's read-modify-write is `AcqRel`**, its loads `Acquire`,
//!   and the kill an `AcqRel` CAS: they order the race between two
//!   publishers (see [Publishing](#publishing)).
//! * **Stamps, candidates and statistics are `Relaxed`**: hints and
//!   counters, re-checked by the CASes above or ordering nothing; except
//!   a match's add of its hits (`Release`) and the snapshot's load of them
//!   (`Acquire`), which order a cell's queries before its hits (see
//!   [Statistics](#statistics)).
//!
//! ## KV events
//!
//! * **A ring's `tail` CAS is `AcqRel`**: the order of the reservations is
//!   the order of a key's transitions (see [KV events](#kv-events)).
//! * **A slot's position word**: the producer's store of `pos + 1` is
//!   `Release` and the consumer's load `Acquire`, so the payload's
//!   `Relaxed` words are read as written; the consumer's store of
//!   `pos + capacity` is `Release` and the producer's load `Acquire`, so the
//!   consumer's reads of a lap's record happen-before the next lap's
//!   writes.
//! * **A loss**: `lost_at` is raised (`Relaxed`) before `lost` is added to
//!   (`Release`), and the consumer loads `lost` with `Acquire` before
//!   `lost_at`: the position it reads covers every loss it counts.
//!
//! ## `Sequence`
//!
//! A sequence is a plain `Send` value used by one thread at a time; all its
//! synchronisation is the pool's (`Acquire` on allocation and match,
//! `Release` on free and publish).
//!
//! # Model checking
//!
//! Every atomic (and the wait queue's mutex, condition variable and
//! fence) goes through one private facade module, `sync`: `std`'s
//! types normally, loom's in the crate's own unit tests under
//! `RUSTFLAGS="--cfg kvslots_loom"` (`cfg(all(test, kvslots_loom))`, as
//! tokio's `cfg(all(test, loom))`), shuttle's with
//! `RUSTFLAGS="--cfg kvslots_shuttle"`. The cfgs are crate-specific on
//! purpose: a plain `--cfg loom` would also switch every dependency that
//! knows about loom. The facade holds the only other differences under a
//! model checker: a retry after a possibly stale load yields (loom would
//! otherwise let the load return the same stale value forever), threads
//! are numbered by loom's per-execution thread-locals, the prefix index's
//! hash takes a fixed seed (so that every execution places every key in
//! the same buckets, and the models can pick keys that share a first
//! bucket), and the faults of
//! loom's negative controls (a free list whose take is a load and a plain
//! store, `Relaxed` frees, a blind undo of a raced free, a raw free that
//! ignores the sequence flag, a sequence's sole drop as a load and a plain
//! store, a fork's reference added to a block whose
//! count is 0, a match that keeps what it admitted ahead and did not use, a
//! revival without the generation check, a `Relaxed` publish, an eviction
//! of a referenced block, a publisher that does not kill a rival's claim,
//! a claim without a reference of its own, a claim's last drop not given
//! back, a publish that claims without looking its key up first, a claim
//! that is a rival before its key is written, a claim that gives up on a
//! deferral without looking again, lookups that read only a key's first
//! index bucket, a rescan whose read-modify-write is in the bucket of the
//! publisher's own entry, a fenced retirement that gives its references
//! back at once, an admission fast path that takes with a plain store, a
//! refused gather that keeps what it took, a gather that gives blocks back
//! without re-checking the waiters, a waiter that queues without trying
//! again, a cancelled waiter that keeps its grant or does not re-check the
//! waiters behind it, a close that wakes no one, a waiter without its
//! hand-shake, growth that waits behind a queued head, a queue that owes
//! new admissions only its head's request, a head woken before its grant
//! is counted, a panicking waker that drops the rest of its batch
//! uncalled, a KV event removal reserved after its CAS, a store reserved
//! before its claim, a record published `Relaxed`, a loss not counted, a
//! hybrid append admitted group by group, a window's block reused without
//! its check, a hybrid match that settles each group once) are switched
//! on through hooks that are the correct behaviour in every other build.
//!
//! **The loom models live inside the crate**, in `src/loom_tests/`, as
//! tokio keeps its `loom_*.rs` tests: unit tests compiled only under
//! `cfg(all(test, kvslots_loom))`, which `scripts/loom` runs
//! (`cargo test --lib --release` with the cfg; `scripts/loom NAME` runs
//! the tests under `loom_tests::NAME::`). In that build, and only there,
//! `Faults` has its fields and the models build pools and counters with
//! them (`BlockPool::with_faults`, `BlockPoolBuilder::faults`,
//! `SlotCounter::with_faults`, all crate-private and compiled only there);
//! in every other build, the release build included, `Faults` is an empty
//! type (a constant assertion checks it) and every hook a constant, so no
//! fault reaches shipped code.
//! Under `--cfg kvslots_loom` the crate's other unit tests are left out,
//! so that build is the models and their controls; and any other build of
//! the library under that cfg (its integration tests, a dependent crate)
//! keeps `std`'s atomics. No public item exists for the model checkers:
//! the shuttle schedules (`tests/shuttle*.rs`) drive the public API, with
//! shuttle's own atomics for their witnesses and wrong allocators.
