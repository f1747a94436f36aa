//! The lock-free, ABA-safe free list of block ids behind
//! [`BlockPool`](crate::BlockPool).
//!
//! A Treiber stack threaded through an index array: `next[i]` is the id
//! below block `i` in the stack, and the head word packs
//! `(generation tag << 32) | top index` into one `AtomicU64`. Every
//! successful compare-and-swap on the head bumps the tag, so a thread that
//! read the head, was preempted while the same top id was popped and pushed
//! back, and then tries its CAS, fails instead of installing a stale `next`
//! (the ABA problem). The tag is 32 bits: an ABA would need 2^32 successful
//! operations on this one word between a thread's read and its CAS.
//!
//! A whole request moves in one CAS: [`FreeList::pop_chain`] walks `k` links
//! from the head and swings the head past them; [`FreeList::push_chain`]
//! links the freed ids together privately and swings the head onto the
//! chain. A walk over a snapshot that went stale while it was read either
//! runs into the end of the list or fails the tag check, and retries.
//!
//! Callers admit the count through a [`SlotCounter`](crate::SlotCounter)
//! before popping and push before releasing the count, so the stack always
//! holds at least as many ids as have been admitted and not yet popped:
//! `pop_chain` cannot come up short.
//!
//! # Orderings
//!
//! * Pushing is a `Release` CAS: the freer's writes into the blocks (and the
//!   links of the chain) happen-before any later pop that reads the head.
//! * Popping is an `Acquire` CAS (and `Acquire` head loads): every CAS on the
//!   head is a read-modify-write, so each push heads a release sequence that
//!   all later head values continue; whoever pops synchronises with every
//!   earlier push, and so sees the links it walks and the blocks it takes.
//! * The `next` links are `Relaxed`: they are published by the push CAS and
//!   read after an `Acquire` of the head; a link read from a stale snapshot
//!   is caught by the tag check, not by ordering.

use crate::pool::BlockId;
use crate::sync::{self, AtomicU32, AtomicU64, Backoff, CachePadded, Ordering};

/// The index that ends the list.
pub(crate) const NIL: u32 = u32::MAX;

/// Faults that the loom negative controls inject into the real free list.
#[cfg(kvslots_loom)]
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Never bump the generation tag (opens the ABA race).
    pub no_tag: bool,
    /// Push and drop references with `Relaxed` instead of `Release`.
    pub relaxed_free: bool,
}

pub(crate) struct FreeList {
    /// `(tag << 32) | top index`; the only contended word.
    head: CachePadded<AtomicU64>,
    /// `next[i]`: the id below `i` while `i` is in the list.
    next: Box<[AtomicU32]>,
    #[cfg(kvslots_loom)]
    pub(crate) faults: Faults,
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
    /// A list holding every id `0..len`, lowest on top.
    pub(crate) fn new(len: u32) -> FreeList {
        let next = (0..len)
            .map(|i| AtomicU32::new(if i + 1 < len { i + 1 } else { NIL }))
            .collect();
        FreeList {
            head: CachePadded::new(AtomicU64::new(pack(0, if len > 0 { 0 } else { NIL }))),
            next,
            #[cfg(kvslots_loom)]
            faults: Faults::default(),
        }
    }

    fn next_tag(&self, head: u64) -> u32 {
        #[cfg(kvslots_loom)]
        if self.faults.no_tag {
            return tag(head);
        }
        tag(head).wrapping_add(1)
    }

    /// The ordering of a push (and of dropping a reference): `Release`,
    /// unless a loom negative control asks for the bug.
    pub(crate) fn free_ordering(&self, good: Ordering) -> Ordering {
        #[cfg(kvslots_loom)]
        if self.faults.relaxed_free {
            return Ordering::Relaxed;
        }
        good
    }

    /// Pops exactly `k > 0` ids in one CAS and appends them to `out`.
    ///
    /// The caller must have admitted `k` through the pool's counter, which
    /// guarantees the list holds them.
    pub(crate) fn pop_chain(&self, k: usize, out: &mut Vec<BlockId>) {
        debug_assert!(k > 0);
        let base = out.len();
        let backoff = Backoff::new();
        // Acquire: synchronises with every earlier push (see # Orderings),
        // so the links walked below are the ones the pushers wrote.
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let mut index = top(head);
            let mut complete = true;
            for _ in 0..k {
                // Ran off the end? The snapshot went stale under us.
                if index == NIL {
                    complete = false;
                    break;
                }
                out.push(BlockId::new(index));
                // Relaxed: published by the push CAS we acquired; a stale
                // value is caught by the tag check below.
                index = self.next[index as usize].load(Ordering::Relaxed);
            }
            if complete {
                let new = pack(self.next_tag(head), index);
                // Acquire on success: we now own the popped blocks, and the
                // previous owners' writes into them happen-before our use.
                // Acquire on failure: the fresh head is walked next.
                match self.head.compare_exchange_weak(
                    head,
                    new,
                    Ordering::Acquire,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return,
                    Err(actual) => {
                        head = actual;
                        out.truncate(base);
                        backoff.spin();
                    }
                }
            } else {
                out.truncate(base);
                sync::stale_retry(&backoff);
                // Acquire: as the first load.
                head = self.head.load(Ordering::Acquire);
            }
        }
    }

    /// Links `id` above `below` in a chain the caller owns (not yet pushed).
    pub(crate) fn link(&self, id: u32, below: u32) {
        // Relaxed: the chain is private until `push_chain`'s Release CAS
        // publishes it.
        self.next[id as usize].store(below, Ordering::Relaxed);
    }

    /// Pushes the privately linked chain `first ..= last` in one CAS.
    pub(crate) fn push_chain(&self, first: u32, last: u32) {
        let backoff = Backoff::new();
        // Relaxed: only a guess; the CAS validates it.
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            self.link(last, top(head));
            let new = pack(self.next_tag(head), first);
            // Release on success: the freers' writes into these blocks and
            // the chain's links happen-before the pop that takes them.
            // Relaxed on failure: we only relink and retry.
            match self.head.compare_exchange_weak(
                head,
                new,
                self.free_ordering(Ordering::Release),
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
