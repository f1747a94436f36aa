//! The lock-free, ABA-safe free list of block ids behind
//! [`BlockPool`](crate::BlockPool): shards, each a Treiber stack threaded
//! through one shared `next` array, with a generation tag beside each head
//! index. The design and the orderings are described in
//! [`crate::implementation`] ("The free list", "Shards", "Orderings").
//!
//! Callers admit the count through the pool's per-shard admission counts
//! before popping and push before giving the count back, so the shards together with the prefix
//! cache's evictable blocks always hold at least as many blocks as have
//! been admitted and not yet taken: the pool pops, evicts for the rest,
//! and looks again only when other threads moved blocks meanwhile.

use std::collections::TryReserveError;

use crate::array::{bytes_of, Room};
use crate::id::BlockId;
use crate::sync::{self, AtomicU32, AtomicU64, Backoff, CachePadded, Faults, Ordering};

/// The index that ends the list.
pub(crate) const NIL: u32 = u32::MAX;

/// A chain of freed ids linked privately (through `next`) before it is
/// pushed: built by [`FreeList::prepend`], pushed by [`FreeList::push`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Chain {
    /// The top id (the last prepended), or `NIL`.
    first: u32,
    /// The bottom id (the first prepended), or `NIL`.
    last: u32,
    /// How many ids.
    len: usize,
    /// The first id of the shard that owns `last`.
    start: u32,
    /// Whether some id belongs to another shard than `last`.
    mixed: bool,
}

impl Chain {
    /// An empty chain.
    pub(crate) const fn new() -> Chain {
        Chain {
            first: NIL,
            last: NIL,
            len: 0,
            start: 0,
            mixed: false,
        }
    }

    /// How many ids it holds.
    pub(crate) const fn len(&self) -> usize {
        self.len
    }
}

pub(crate) struct FreeList {
    /// One `(tag << 32) | top index` word per shard, each on its own line.
    heads: Box<[CachePadded<AtomicU64>]>,
    /// `next[i]`: the id below `i` while `i` is in a shard.
    next: Box<[AtomicU32]>,
    /// Ids per shard: shard `s` owns ids `s * span .. (s + 1) * span`.
    span: u32,
    /// The faults of loom's negative controls (none outside them).
    faults: Faults,
}

const fn pack(tag: u32, index: u32) -> u64 {
    (tag as u64) << 32 | index as u64
}

const fn top(head: u64) -> u32 {
    head as u32
}

const fn tag(head: u64) -> u32 {
    (head >> 32) as u32
}

impl FreeList {
    /// A free list of `shards > 0` shards holding every id `0..len`: shard
    /// `s` gets the `s`-th contiguous slice, lowest id on top.
    pub(crate) fn new(room: Room<AtomicU32>, len: u32, shards: usize, faults: Faults) -> FreeList {
        debug_assert!(shards > 0);
        // Ceiling division, at least 1 so that `owner` never divides by 0.
        let span = len.div_ceil(shards as u32).max(1);
        let next = room.fill(|i| {
            // `i < len <= u32::MAX`: exact.
            let i = i as u32;
            // The last id of a shard (or of the pool) ends its shard.
            let end = i + 1 == len || (i + 1) % span == 0;
            AtomicU32::new(if end { NIL } else { i + 1 })
        });
        let heads = (0..shards as u32)
            .map(|s| {
                let lo = s.saturating_mul(span);
                let top = if lo < len { lo } else { NIL };
                CachePadded::new(AtomicU64::new(pack(0, top)))
            })
            .collect();
        FreeList {
            heads,
            next,
            span,
            faults,
        }
    }

    /// Reserves the room of [`new`](Self::new)'s links for `len` ids.
    pub(crate) fn room(len: usize) -> Result<Room<AtomicU32>, TryReserveError> {
        Room::reserve(len)
    }

    /// The heap bytes [`room`](Self::room) and the shards' heads take.
    pub(crate) fn heap_bytes(len: usize, shards: usize) -> usize {
        bytes_of::<AtomicU32>(len).saturating_add(bytes_of::<CachePadded<AtomicU64>>(shards))
    }

    /// The number of shards.
    pub(crate) fn shards(&self) -> usize {
        self.heads.len()
    }

    /// The calling thread's home shard, where its pops start.
    fn home(&self) -> usize {
        sync::thread_index() % self.heads.len()
    }

    /// The shard that id `id` belongs to, where it goes back when freed.
    fn owner(&self, id: u32) -> usize {
        (id / self.span) as usize
    }

    /// The tag the next successful CAS on a head installs: one more.
    fn next_tag(&self, head: u64) -> u32 {
        self.faults.next_tag(tag(head).wrapping_add(1), tag(head))
    }

    /// Pops up to `k > 0` ids and appends them to `out`; returns how many:
    /// from the home shard in one CAS if it holds them, else what it has
    /// and the rest from the other shards in turn, one pass over them.
    ///
    /// The caller has admitted `k` through the pool's counter, which
    /// guarantees that the shards and the prefix cache's evictable blocks
    /// together hold them, and reserved room for `k` more ids in `out`
    /// (nothing here allocates). When this returns fewer, the caller
    /// evicts or looks again.
    pub(crate) fn pop(&self, k: usize, out: &mut Vec<BlockId>) -> usize {
        debug_assert!(k > 0);
        let shards = self.heads.len();
        let mut shard = self.home();
        let mut need = k;
        for _ in 0..shards {
            need -= self.pop_upto(shard, need, out);
            // Got them all?
            if need == 0 {
                break;
            }
            shard += 1;
            if shard == shards {
                shard = 0;
            }
        }
        k - need
    }

    /// Pops up to `k` ids from shard `shard` in one CAS, appends them to
    /// `out` and returns how many.
    fn pop_upto(&self, shard: usize, k: usize, out: &mut Vec<BlockId>) -> usize {
        let head_word = &self.heads[shard];
        let base = out.len();
        let backoff = Backoff::new();
        // Acquire: synchronises with every earlier push onto this shard (see
        // `crate::implementation`, "Orderings"), so the links walked below are the ones the pushers
        // wrote.
        let mut head = head_word.load(Ordering::Acquire);
        loop {
            let mut index = top(head);
            // Empty?
            if index == NIL {
                return 0;
            }
            let mut taken = 0;
            while taken < k && index != NIL {
                out.push(BlockId::new(index));
                taken += 1;
                // Relaxed: published by the push CAS we acquired; a stale
                // value is caught by the tag check below.
                index = self.next[index as usize].load(Ordering::Relaxed);
            }
            let new = pack(self.next_tag(head), index);
            // Acquire on success: we now own the popped blocks, and the
            // previous owners' writes into them happen-before our use.
            // Acquire on failure: the fresh head is walked next.
            match head_word.compare_exchange_weak(head, new, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => return taken,
                Err(actual) => {
                    head = actual;
                    out.truncate(base);
                    backoff.spin();
                }
            }
        }
    }

    /// Links `id` above `below` in a chain the caller owns (not yet pushed).
    fn link(&self, id: u32, below: u32) {
        // Relaxed: the chain is private until `push_run`'s Release CAS
        // publishes it.
        self.next[id as usize].store(below, Ordering::Relaxed);
    }

    /// The id below `id` in a private chain (not yet pushed), or `NIL`
    /// below its last id.
    fn below(&self, id: u32) -> u32 {
        // Relaxed: our own private chain, linked by this thread.
        self.next[id as usize].load(Ordering::Relaxed)
    }

    /// Links `id` on top of the private chain `chain` (not yet pushed).
    pub(crate) fn prepend(&self, chain: &mut Chain, id: u32) {
        self.link(id, chain.first);
        if chain.len == 0 {
            chain.last = id;
            chain.start = id - id % self.span;
        } else if id.wrapping_sub(chain.start) >= self.span {
            // Another shard's id: `push` must split the chain.
            chain.mixed = true;
        }
        chain.first = id;
        chain.len += 1;
    }

    /// Pushes a private chain: each id goes back to the shard that owns it,
    /// one CAS per run of ids with the same owner (one CAS in all when they
    /// share one, as a sequence's blocks mostly do).
    pub(crate) fn push(&self, chain: &Chain) {
        if chain.len == 0 {
            return;
        }
        if !chain.mixed {
            self.push_run(self.owner(chain.first), chain.first, chain.last);
            return;
        }
        let (mut run, mut shard, mut id) = (chain.first, self.owner(chain.first), chain.first);
        while id != chain.last {
            let below = self.below(id);
            let owner = self.owner(below);
            // Does the run end here? Push it (which relinks `id`, read
            // above) and start the next one.
            if owner != shard {
                self.push_run(shard, run, id);
                (run, shard) = (below, owner);
            }
            id = below;
        }
        self.push_run(shard, run, chain.last);
    }

    /// Pushes the privately linked chain `first ..= last` onto shard
    /// `shard` in one CAS.
    fn push_run(&self, shard: usize, first: u32, last: u32) {
        let head_word = &self.heads[shard];
        let backoff = Backoff::new();
        // Relaxed: only a guess; the CAS validates it.
        let mut head = head_word.load(Ordering::Relaxed);
        loop {
            self.link(last, top(head));
            let new = pack(self.next_tag(head), first);
            // Release on success: the freers' writes into these blocks and
            // the chain's links happen-before the pop that takes them.
            // Relaxed on failure: we only relink and retry.
            match head_word.compare_exchange_weak(
                head,
                new,
                self.faults.free_ordering(Ordering::Release),
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => {
                    head = actual;
                    backoff.spin();
                }
            }
        }
    }
}
