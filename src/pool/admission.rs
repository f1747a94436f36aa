//! The admission of a [`BlockPool`](super::BlockPool): how many blocks an
//! allocation may take, counted per shard so that a thread that allocates
//! from and frees to its home shard writes no line that another thread
//! writes. The design and the orderings are described in
//! [`crate::implementation`] ("Admission", "Orderings").
//!
//! Each shard has one word on its own cache line, `version << 32 | free`:
//! `free` blocks (uncached free ones and evictable ones, as counts, not
//! ids) admitted through this shard, and a `version` bumped by every
//! change of the word. The free counts of all shards sum to the blocks
//! that no call holds; blocks that a running call has taken from a shard
//! and not yet handed out or given back are *in transit*.
//!
//! * **Fast path.** An allocation whose home shard has `n + headroom` free
//!   takes `n` there with one CAS. A release adds to the releasing
//!   thread's home shard with one `fetch_add`.
//! * **Slow path** ([`Admission::gather`]). Otherwise the call takes from
//!   its home shard and then the others, in turn, what each has (up to
//!   what it still needs), holding them in transit. Once it holds
//!   `n + headroom` it keeps `n` and gives the rest to its home shard.
//!   If a whole pass takes nothing and finds every shard's version as it
//!   left it on the pass before, no shard changed between the two passes,
//!   so at the instant between them the free blocks outside other running
//!   calls were exactly what it holds, fewer than it needs: it gives them
//!   all back and refuses with `Full`.
//! * **Closed** is a word of its own, read before admission and again
//!   after it, so a call either took its blocks before the close (in the
//!   single total order of `SeqCst` operations) or fails `Closed` and gives
//!   back what it took.

use crate::error::ReserveError;
use crate::sync::{
    self, AtomicBool, AtomicU64, AtomicUsize, Backoff, CachePadded, Divisor, Faults, Ordering,
};
use crate::wait::{Units, Unwound, WaitQueue};

/// The low half of a shard's word: its free count.
const FREE_MASK: u64 = u32::MAX as u64;
/// One step of the version, in the high half of a shard's word.
const VERSION: u64 = 1 << 32;

/// The free count of a shard's word.
const fn free_of(word: u64) -> usize {
    (word & FREE_MASK) as usize
}

/// The version of a shard's word.
const fn version_of(word: u64) -> u64 {
    word >> 32
}

/// One shard's admission state, on a cache line of its own.
struct Shard {
    /// `version << 32 | free`.
    word: AtomicU64,
    /// The free counts of every other shard as this shard's last slow path
    /// (or the pool's creation) found them: with this shard's own count, an
    /// estimate of the pool's free blocks, exact while one thread uses the
    /// pool, for the peak and for how many blocks a match admits ahead
    /// (it hands out nothing: the admission's CAS decides).
    others: AtomicUsize,
}

/// Per-shard free counts, the closed flag and the peak of a
/// [`BlockPool`](super::BlockPool).
pub(super) struct Admission {
    shards: Box<[CachePadded<Shard>]>,
    /// Set once by `close`; read-mostly, so it stays shared in every core.
    closed: CachePadded<AtomicBool>,
    /// The high-water mark of used blocks (see [`peak_used`](Self::peak_used)).
    peak: CachePadded<AtomicUsize>,
    /// Immutable after construction.
    capacity: usize,
    /// Which shard a thread calls home.
    homes: Divisor,
    /// The faults of loom's negative controls (none outside them).
    faults: Faults,
    /// The waiters of [`BlockPool::alloc`](super::BlockPool::alloc) and its
    /// kin, in arrival order (`crate::wait`). Its published words (what the
    /// waiters are owed, the waiter count) sit on their own padded line,
    /// written only by the waiting paths.
    queue: WaitQueue,
}

impl Admission {
    /// `capacity <= u32::MAX` free blocks over `shards > 0` shards, spread
    /// as the free list spreads its ids (shard `s` counts the ids it owns).
    pub(super) fn new(capacity: usize, shards: usize, faults: Faults) -> Admission {
        debug_assert!(shards > 0 && capacity <= u32::MAX as usize);
        let span = capacity.div_ceil(shards).max(1);
        let owned = |s: usize| capacity.min((s + 1) * span).saturating_sub(s * span);
        let homes = Divisor::new(shards);
        let shards = (0..shards)
            .map(|s| {
                CachePadded::new(Shard {
                    word: AtomicU64::new(owned(s) as u64),
                    others: AtomicUsize::new(capacity - owned(s)),
                })
            })
            .collect();
        Admission {
            shards,
            closed: CachePadded::new(AtomicBool::new(false)),
            peak: CachePadded::new(AtomicUsize::new(0)),
            capacity,
            homes,
            faults,
            queue: WaitQueue::new(capacity, faults),
        }
    }

    /// The heap bytes [`new`](Self::new) asks for with `shards` shards.
    pub(super) fn heap_bytes(shards: usize) -> usize {
        shards.saturating_mul(std::mem::size_of::<CachePadded<Shard>>())
    }

    /// The total number of blocks.
    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The calling thread's home shard, as in the free list.
    fn home(&self) -> usize {
        self.homes.home()
    }

    /// The sum of the shards' free counts, read one after another, at most
    /// the capacity: exact when no call is running.
    pub(super) fn available(&self) -> usize {
        // Relaxed: a snapshot for reporting; it hands out nothing.
        let sum: usize = self
            .shards
            .iter()
            .map(|shard| free_of(shard.word.load(Ordering::Relaxed)))
            .sum();
        sum.min(self.capacity)
    }

    /// The sum of the free counts without the cap, for the loom models'
    /// conservation check and the unit tests below.
    #[cfg(all(test, any(kvslots_loom, not(kvslots_shuttle))))]
    pub(super) fn free_uncapped(&self) -> usize {
        // Relaxed: read once every thread is joined.
        self.shards
            .iter()
            .map(|shard| free_of(shard.word.load(Ordering::Relaxed)))
            .sum()
    }

    /// `capacity() - available()`.
    pub(super) fn used(&self) -> usize {
        self.capacity - self.available()
    }

    /// The high-water mark of used blocks (see `BlockPool::peak_used_blocks`).
    pub(super) fn peak_used(&self) -> usize {
        // Relaxed: a statistic; it orders nothing.
        self.peak.load(Ordering::Relaxed)
    }

    /// Every later admission fails `Closed`.
    pub(super) fn close(&self) {
        // SeqCst: an admission reads the flag after its take (also SeqCst),
        // so in the single total order either its take comes before this
        // store (it succeeded before the close) or its read comes after (it
        // fails `Closed`). Its Release half publishes what the closer did
        // before to a thread that sees the flag through `is_closed`.
        self.closed.store(true, Ordering::SeqCst);
        // Then the waiters: from here on no grant can succeed (the grant
        // loop's admission sees the flag), so those woken end with Closed.
        self.queue.close();
    }

    /// Whether [`close`](Self::close) has been called.
    pub(super) fn is_closed(&self) -> bool {
        // SeqCst: pairs with `close` (see there); it includes the Acquire
        // that lets a thread that sees the flag see what the closer did.
        self.closed.load(Ordering::SeqCst)
    }

    /// Takes `n` blocks if `n + headroom` are free beyond what the queued
    /// waiters are owed, all or nothing.
    pub(super) fn try_reserve_raw(&self, n: usize, headroom: usize) -> Result<(), ReserveError> {
        self.try_reserve_inner(n, headroom, true, true, true, true)
    }

    /// [`try_reserve_raw`](Self::try_reserve_raw) without headroom, and
    /// without raising the peak: for blocks a caller may not all use (a
    /// match's revivals, admitted ahead). The caller gives back what it
    /// does not use and then calls [`note_peak`](Self::note_peak).
    pub(super) fn try_reserve_ahead(&self, n: usize) -> Result<(), ReserveError> {
        self.try_reserve_inner(n, 0, true, true, true, false)
    }

    /// Gives back `n > 0` blocks admitted ahead with
    /// [`try_reserve_ahead`](Self::try_reserve_ahead) and not used, as
    /// [`release_held`](Self::release_held) does (nothing under loom's
    /// `match_keeps_credits` control).
    pub(super) fn give_back_ahead(&self, n: usize) {
        if !self.faults.match_keeps_credits() {
            self.release_held(n);
        }
    }

    /// Raises the peak from the home shard's free count and the other
    /// shards' as its last slow path saw them (as the fast path does):
    /// after a [`try_reserve_ahead`](Self::try_reserve_ahead) and the
    /// give-back of what went unused.
    pub(super) fn note_peak(&self) {
        self.record_peak(self.home_view());
    }

    /// The free count as the calling thread's home shard sees it: its own,
    /// plus the other shards' as its last slow path saw them. Two loads of
    /// the home shard's line; an estimate that hands out nothing.
    fn home_view(&self) -> usize {
        let home = &self.shards[self.home()];
        // Relaxed (both): estimates, as for the peak in `try_reserve_inner`.
        let free = free_of(home.word.load(Ordering::Relaxed));
        let others = home.others.load(Ordering::Relaxed);
        free.saturating_add(others)
    }

    /// An estimate of what an admission could take now: the home shard's
    /// view of the free count ([`home_view`](Self::home_view)) less what
    /// the queued waiters are owed. It decides only how much a caller asks
    /// for (a match's revivals admitted ahead): a request larger than what
    /// is free is refused only after the slow path has scanned every shard.
    pub(super) fn estimate_free(&self) -> usize {
        self.home_view().saturating_sub(self.queue.owed())
    }

    /// Takes `n` blocks if `n` are free, ignoring what the queued waiters
    /// are owed: the growth of blocks a caller already holds (see
    /// [`BlockPool::try_alloc_growth`](super::BlockPool)), which does not
    /// wait behind new admissions.
    pub(super) fn try_grow_raw(&self, n: usize) -> Result<(), ReserveError> {
        // `growth_waits` is loom's negative control: growth that waits
        // behind the head.
        let honor_waiters = self.faults.growth_waits();
        self.try_reserve_inner(n, 0, true, honor_waiters, true, true)
    }

    /// [`try_reserve_raw`](Self::try_reserve_raw) without headroom, also
    /// when closed, and without raising the peak: for blocks that are only
    /// moved, not used (a pool dropping its cached keys).
    pub(super) fn try_reserve_ignoring_close(&self, n: usize) -> Result<(), ReserveError> {
        self.try_reserve_inner(n, 0, false, false, true, false)
    }

    /// The body of all five (with [`Units::take`]): `honor_close` says
    /// whether a closed pool refuses; `honor_waiters` whether the blocks
    /// the queued waiters are owed must stay free; `notify` whether what a
    /// slow path gives back runs the queue's grant loop (not when that
    /// loop itself takes for the head: it holds the queue's lock); `record`
    /// whether the admission counts towards the peak.
    fn try_reserve_inner(
        &self,
        n: usize,
        headroom: usize,
        honor_close: bool,
        honor_waiters: bool,
        notify: bool,
        record: bool,
    ) -> Result<(), ReserveError> {
        // Could it ever fit? (Saturating: `usize::MAX` requests and headroom
        // must not wrap into something small.)
        let needed = n.saturating_add(headroom);
        if needed > self.capacity {
            // Closed wins: after `close` every admission fails as Closed.
            if honor_close && self.is_closed() {
                return Err(ReserveError::Closed);
            }
            return Err(ReserveError::NeverFits {
                requested: n,
                capacity: self.capacity,
            });
        }
        // Closed already? Then nothing is touched.
        if honor_close && self.is_closed() {
            return Err(ReserveError::Closed);
        }
        // While anyone waits, leave what the waiters are owed: the one load
        // the waiting machinery adds to this path (0 when nobody waits). A
        // request for nothing with no headroom asks nothing of anyone; one
        // with headroom (a check) leaves it too.
        let asked = needed;
        let owed = if honor_waiters && asked > 0 {
            self.queue.owed()
        } else {
            0
        };
        let needed = asked.saturating_add(owed);
        let home = self.home();
        let mut gathered = false;
        let result = match self.take_home(home, n, needed) {
            Some(free_after) => {
                if record {
                    // Relaxed: an estimate for the peak, on our own line.
                    let others = self.shards[home].others.load(Ordering::Relaxed);
                    self.record_peak(free_after.saturating_add(others));
                }
                Ok(())
            }
            None => {
                gathered = true;
                self.gather(home, n, needed, record)
            }
        };
        // Closed meanwhile? Read after the take (see `close`); a refusal is
        // then reported as Closed too, as it would have been before.
        if honor_close && self.is_closed() {
            if result.is_ok() && n > 0 && !self.faults.close_keeps_admission() {
                self.release_to(home, n);
            }
            if notify {
                self.queue.notify(self);
            }
            return Err(ReserveError::Closed);
        }
        // A slow path may have given blocks back (the excess over `n`, or
        // all it held when refused) that a waiter failed to find while they
        // were in transit here: the waiters look again.
        if gathered && notify && !self.faults.quiet_gather() {
            match result {
                Ok(()) if n > 0 && !self.faults.panic_keeps_admission() => {
                    self.notify_or_give_back(home, n);
                }
                _ => self.queue.notify(self),
            }
        }
        // Short of the request and its headroom, or only of what the
        // waiters are owed besides?
        result.map_err(|available| {
            if available < asked {
                ReserveError::Full {
                    requested: n,
                    available,
                }
            } else {
                ReserveError::BehindWaiters {
                    requested: n,
                    available,
                    owed,
                }
            }
        })
    }

    /// Runs the grant loop after a slow path that admitted `n > 0` blocks
    /// to shard `home`. A waker's panic out of it (resumed here: see
    /// "Wakers run after the lock" in [`crate::implementation`]) would
    /// leave the call with its blocks admitted and never taken: they are
    /// given back first, and the waiters look again, so that a call that
    /// panics has taken nothing (the peak it raised, an estimate, stays).
    fn notify_or_give_back(&self, home: usize, n: usize) {
        let mut unwound = Unwound::new();
        unwound.catch(|| self.queue.notify(self));
        if unwound.caught() {
            self.release_to(home, n);
            unwound.catch(|| self.queue.notify(self));
        }
    }

    /// The fast path: takes `n` from shard `home` if it has `needed`, in
    /// one CAS, and returns its free count after; `None` if it is short.
    fn take_home(&self, home: usize, n: usize, needed: usize) -> Option<usize> {
        let word = &self.shards[home].word;
        let backoff = Backoff::new();
        // SeqCst: when `n == 0` this load is the admission (no CAS follows),
        // ordered before the closed re-check; otherwise only a first guess
        // that the CAS validates.
        let mut cur = word.load(Ordering::SeqCst);
        loop {
            let free = free_of(cur);
            if free < needed {
                return None;
            }
            if n == 0 {
                return Some(free);
            }
            let next = cur.wrapping_add(VERSION) - n as u64;
            if self.faults.racy_take() {
                // The negative control: a load and a plain store, no RMW.
                word.store(next, Ordering::SeqCst);
                return Some(free - n);
            }
            // SeqCst on success: Acquire pairs with the Release of whoever
            // gave these blocks back (`release_held`), and the take is
            // ordered before the closed re-check (see `close`). Relaxed on
            // failure: we only retry with the fresh value.
            match word.compare_exchange_weak(cur, next, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => return Some(free - n),
                Err(actual) => {
                    cur = actual;
                    backoff.spin();
                }
            }
        }
    }

    /// The slow path: takes from every shard in turn, starting at `home`,
    /// until it holds `needed`; keeps `n` and gives the rest to `home`.
    /// Refuses with what it held when two passes in a row found nothing
    /// to take and no shard changed between them (see the module doc),
    /// having given it all back.
    fn gather(&self, home: usize, n: usize, needed: usize, record: bool) -> Result<(), usize> {
        self.gather_watched(home, n, needed, record, |_| {})
    }

    /// [`gather`](Self::gather), calling `visited(s)` after each visit of
    /// shard `s`: the unit tests move counts behind the scan there, as
    /// other threads can.
    fn gather_watched(
        &self,
        home: usize,
        n: usize,
        needed: usize,
        record: bool,
        mut visited: impl FnMut(usize),
    ) -> Result<(), usize> {
        let count = self.shards.len();
        let backoff = Backoff::new();
        let mut held = 0;
        let mut last_versions = None;
        loop {
            let mut versions = 0u64;
            let mut took = false;
            let mut s = home;
            for _ in 0..count {
                let (taken, version) = self.take_upto(s, needed - held);
                held += taken;
                took |= taken > 0;
                versions = versions.wrapping_add(version);
                if held == needed {
                    if needed > n {
                        self.release_to(home, needed - n);
                    }
                    self.refresh(home, record);
                    return Ok(());
                }
                visited(s);
                s += 1;
                if s == count {
                    s = 0;
                }
            }
            if !took && last_versions == Some(versions) {
                if held > 0 && !self.faults.keep_refused() {
                    self.release_to(home, held);
                }
                self.refresh(home, false);
                return Err(held);
            }
            last_versions = Some(versions);
            if !took {
                // Another call changed a shard since our last pass: look
                // again (a yield under the model checkers, whose loads may
                // otherwise stay stale).
                sync::stale_retry(&backoff);
            }
        }
    }

    /// Takes up to `k > 0` from shard `s`, in one CAS; returns how many,
    /// and the shard's version as this call left it (after its CAS, or as
    /// read when the shard had nothing).
    fn take_upto(&self, s: usize, k: usize) -> (usize, u64) {
        let word = &self.shards[s].word;
        let backoff = Backoff::new();
        // SeqCst: the versions read here must be the latest this thread can
        // see, in the same total order as the takes and the closed flag.
        let mut cur = word.load(Ordering::SeqCst);
        loop {
            let free = free_of(cur);
            if free == 0 {
                return (0, version_of(cur));
            }
            let take = free.min(k);
            let next = cur.wrapping_add(VERSION) - take as u64;
            // SeqCst on success, as in `take_home`. Relaxed on failure: we
            // only retry with the fresh value.
            match word.compare_exchange_weak(cur, next, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => return (take, version_of(next)),
                Err(actual) => {
                    cur = actual;
                    backoff.spin();
                }
            }
        }
    }

    /// After a slow path (which moved counts between shards): records this
    /// shard's view of the others and, if `record` (a counted admission),
    /// raises the peak from a fresh sum.
    fn refresh(&self, home: usize, record: bool) {
        // Relaxed (all): estimates for the peak; they order nothing.
        let mut total = 0usize;
        let mut mine = 0usize;
        for (s, shard) in self.shards.iter().enumerate() {
            let free = free_of(shard.word.load(Ordering::Relaxed));
            total = total.saturating_add(free);
            if s == home {
                mine = free;
            }
        }
        self.shards[home]
            .others
            .store(total - mine, Ordering::Relaxed);
        if record {
            self.record_peak(total);
        }
    }

    /// Gives back `n` blocks that the caller holds (freed or made
    /// evictable, or admitted and not handed out) to its home shard.
    pub(super) fn release_held(&self, n: usize) {
        self.release_to(self.home(), n);
        self.queue.notify(self);
    }

    /// How many waiters are queued.
    pub(super) fn queued(&self) -> usize {
        self.queue.waiters()
    }

    /// Gives `n > 0` blocks to shard `s`: one `fetch_add`.
    fn release_to(&self, s: usize, n: usize) {
        // Release: the holder's writes into these blocks happen-before the
        // next take that reads this value or a later one (every change of
        // the word is a read-modify-write, so later values continue this
        // release sequence).
        //
        // Acquire too, for the wait queue's hand-shake (see
        // `WaitQueue::first_look`).
        let prev = self.shards[s].word.fetch_add(
            VERSION + n as u64,
            self.faults.count_release_ordering(Ordering::AcqRel),
        );
        debug_assert!(
            free_of(prev) + n <= self.capacity,
            "admission released more blocks than the pool has"
        );
    }

    /// Raises the peak to `capacity - free` (capped at the capacity).
    fn record_peak(&self, free: usize) {
        let used = self.capacity.saturating_sub(free);
        // Relaxed (both): the peak is a statistic and orders nothing. The
        // load keeps the line shared in steady state; only a new peak
        // writes it.
        if used > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(used, Ordering::Relaxed);
        }
    }
}

/// The pool's admission as the wait queue sees it: blocks are its units.
impl Units for Admission {
    fn try_take(&self, n: usize, headroom: usize) -> Result<(), ReserveError> {
        self.try_reserve_raw(n, headroom)
    }

    fn take(&self, n: usize, headroom: usize) -> Result<(), ReserveError> {
        self.try_reserve_inner(n, headroom, true, false, false, true)
    }

    fn give_back(&self, n: usize) {
        self.release_to(self.home(), n);
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn queue(&self) -> &WaitQueue {
        &self.queue
    }

    fn sync_with_releases(&self) {
        for shard in self.shards.iter() {
            // AcqRel, changing nothing (not even the version, so a gather
            // sees no change): see `WaitQueue::first_look`.
            shard.word.fetch_add(0, Ordering::AcqRel);
        }
    }
}

#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
mod tests {
    use super::*;

    /// Moves one count at a time from shard `from` to shard `to`, as an
    /// allocation from `from` whose block another thread then frees to its
    /// home `to` would: the pool's free count dips by one during each move.
    fn move_all(admission: &Admission, from: usize, to: usize) {
        while admission.take_upto(from, 1).0 == 1 {
            admission.release_to(to, 1);
        }
    }

    /// The version check: a pass that takes nothing refuses only if no
    /// shard changed since the pass before. Here 3 counts (4 blocks, 1 held
    /// elsewhere) keep moving from the shard the gather visits next to the
    /// one it just visited, for two whole passes, so each of those passes
    /// sees only empty shards, while at every instant at least 2 counts
    /// sit in the shards: a refusal of 2 would not be justified. The gather
    /// must look again and take 2 once the counts stop moving.
    #[test]
    fn a_gather_does_not_refuse_while_counts_move_behind_its_scan() {
        let admission = Admission::new(4, 4, Faults::default());
        assert_eq!(admission.take_upto(0, 1).0, 1);
        let mut visits = 0;
        let result = admission.gather_watched(0, 2, 2, true, |s| {
            visits += 1;
            if visits <= 8 {
                move_all(&admission, (s + 1) % 4, s);
            }
        });
        assert_eq!(result, Ok(()));
        assert!(
            visits > 8,
            "the gather refused or stopped after {visits} visits"
        );
        assert_eq!(admission.free_uncapped(), 1);
    }

    /// Single-threaded, a gather's refusal reports exactly the free count
    /// and gives it all back (to its home shard).
    #[test]
    fn a_refused_gather_reports_the_free_count_and_gives_it_back() {
        let admission = Admission::new(8, 4, Faults::default());
        assert_eq!(admission.take_upto(1, 2).0, 2);
        assert_eq!(admission.gather(3, 7, 7, true), Err(6));
        assert_eq!(admission.free_uncapped(), 6);
        assert_eq!(free_of(admission.shards[3].word.load(Ordering::Relaxed)), 6);
        assert_eq!(admission.gather(3, 6, 6, true), Ok(()));
        assert_eq!(admission.free_uncapped(), 0);
        assert_eq!(admission.peak_used(), 8);
    }
}
