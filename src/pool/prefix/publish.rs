//! Publishing: a sequence's full block gets a content key, first wins, with
//! no lock (the claim, the index entry, the rescan for rivals and the
//! commit). The design and the orderings are described in
//! [`crate::implementation`] ("Publishing").

use crate::hash::BlockHash;
use crate::id::BlockId;
use crate::pool::free_list::Give;
use crate::pool::refs::{Dropped, BUSY, CACHED, KILLED};
use crate::pool::BlockPool;
use crate::sync::Ordering;

use super::keys::{Keys, Probe};
use super::state::{Defer, Kill};
use super::GroupTag;

/// What a publish did with a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Published {
    /// The block got the key.
    Now,
    /// The block was cached already, under any key.
    Already,
    /// The block stays uncached: another block holds the key (or a
    /// rival's claim won), the index had no room, or another holder of
    /// the block was publishing it.
    Not,
}

impl BlockPool {
    /// Makes `key` the key of block `id`, which the caller holds, unless
    /// the block is cached already, or another block holds `key` (first
    /// wins), or the index has no room. Returns which.
    ///
    /// A key that a committed block holds when the publish begins loses at
    /// once: nothing is claimed and no index entry is made (the lookup of
    /// a match, without its reference). Otherwise, two publishers of one
    /// key on two blocks race like this: each claims its block (`BUSY`) and
    /// writes its key (a sequence that holds its block alone writes the key
    /// first and claims with a store; see `Refs::sole_unclaimed`), inserts
    /// an index entry, makes a read-modify-write on
    /// one word that every publisher of the key touches, and then rescans
    /// the key's buckets, so the later of the two sees the earlier. One
    /// that sees a committed rival loses; one that sees a claimed rival on
    /// a lower id defers to it (marks it `DEFERRED`) and loses; one that
    /// sees a claimed rival on a higher id kills it (its commit then
    /// fails), or loses if the rival committed first. Whoever sees whom, at
    /// most one of them commits.
    ///
    /// Nobody gives up on trust alone: a claim that was deferred to, or
    /// killed, looks again before it gives up (a killed one may then
    /// commit, if its killer is gone). So a publish that returns `Not`
    /// either saw a block holding the key, during the publish or during a
    /// look that began after it gave up, or found the block claimed by
    /// another of its holders' publishes, or was refused: the key's two
    /// index buckets full when it inserted its entry or when a claim it
    /// deferred to put its own back to look again (that claim then gives
    /// up: a miss until the key is published again, never a wrong hit).
    /// Each new look is caused by a rival's mark or kill, that is by
    /// another publish's progress: the loop is lock-free.
    ///
    /// With KV events, a commit is recorded as a store of `key` (with
    /// `parent`, the key of the block before it in its sequence, and
    /// `group`, which the claim also writes beside the key for the
    /// removal's record to find): the
    /// record's place is taken after the rescan that found no rival and
    /// before the commit, and becomes a void if the commit fails (see
    /// `events.rs`).
    ///
    /// A claim needs the holder's reference counted: a claim that finds
    /// the block's word bare (a fresh block) calls `count`, which counts
    /// it (and says so) or not, and claims again if it did.
    ///
    /// `straight` says that the publishing sequence called this pool
    /// itself, not an allocator that forwards to it: only then does the
    /// pool's count of the block's references count every holder (a
    /// forwarder may count a fork's share itself), so that a count of 1
    /// means the publisher holds the block alone.
    pub(crate) fn publish_block(
        &self,
        id: BlockId,
        key: &BlockHash,
        parent: Option<&BlockHash>,
        group: GroupTag,
        straight: bool,
        count: &mut impl FnMut() -> bool,
    ) -> Published {
        let Some(cache) = self.prefix.as_deref() else {
            return Published::Not;
        };
        // Already cached (this key or another), or the key held by another
        // block? (A key that another block commits after this lookup is
        // found by the rescan below.)
        if self.refs.is_cached(id) {
            return Published::Already;
        }
        let keys = &cache.keys;
        let probe = keys.probe(key);
        // loom's `early_stored_record` control: the place taken before the
        // claim.
        let mut early = match &cache.events {
            Some(events) if events.early_stored() => cache.ticket(probe),
            _ => None,
        };
        let Some(order) = keys.look_before_insert(probe, |rival| {
            !keys.skip_held_key_check() && self.is_holder(keys, rival, key)
        }) else {
            return Published::Not;
        };
        if let Some(events) = cache.events.as_ref().filter(|e| e.early_group_tag()) {
            // loom's `early_group_tag` control: the tag written unclaimed.
            events.set_group(id, group);
        }
        // A fresh block's reference is counted before any claim.
        if self.refs.is_bare(id) && !count() {
            return Published::Not;
        }
        // The block held alone by the sequence that called this pool
        // itself: its key words and tag are written first, and it is
        // claimed and armed with one store. Else a CAS claims it, and the
        // arm follows the key words.
        let sole = if straight {
            self.refs.sole_unclaimed(id)
        } else {
            None
        };
        if sole.is_none() && !self.refs.claim(id) {
            if self.refs.faults.claim_refused_as_cached() {
                // loom's `claim_refused_as_cached` control.
                return Published::Already;
            }
            return Published::Not;
        }
        let armed_early = self.refs.faults.armed_claim();
        if let (Some(seen), true) = (sole, armed_early) {
            // loom's `armed_claim` control: the claim a rival before its
            // key words are written.
            self.refs.claim_sole(id, seen);
        }
        keys.write(id, key);
        if let Some(events) = &cache.events {
            events.set_group(id, group);
        }
        match sole {
            Some(seen) if !armed_early => self.refs.claim_sole(id, seen),
            Some(_) => {}
            None => self.refs.arm(id),
        }
        let Some(mut slot) = keys.insert_into(probe, order, id) else {
            self.give_back_claim(id, self.refs.unclaim(id));
            return Published::Not;
        };
        loop {
            if !self.loses_to_a_rival(keys, id, key, probe, slot) {
                let ticket = early.take().or_else(|| cache.ticket(probe));
                match self.refs.commit(id) {
                    Ok(dropped) => {
                        if let Some(ticket) = ticket {
                            ticket.stored(key, parent, id, group);
                        }
                        self.give_back_claim(id, dropped);
                        return Published::Now;
                    }
                    // Killed by a rival on a lower id since the rescan. If
                    // that rival is still there, the next rescan defers to
                    // it; if it lost meanwhile, nobody else may be left to
                    // cache the key, so look again rather than give up.
                    Err(()) if self.refs.revoke_kill(id) => continue,
                    Err(()) => {}
                }
            }
            keys.remove(probe, id, Some(slot));
            if let Ok(dropped) = self.refs.unclaim_unless_deferred(id) {
                self.give_back_claim(id, dropped);
                return Published::Not;
            }
            // A rival deferred to this claim, perhaps after the holder we
            // lost to went: look again, with the entry back in the index.
            // (If the index has no room now, the publish is refused.)
            match keys.insert(probe, id) {
                Some(again) => slot = again,
                None => {
                    self.give_back_claim(id, self.refs.unclaim(id));
                    return Published::Not;
                }
            }
        }
    }

    /// A publisher's rescan for rivals of its claim on block `id` (index
    /// entry in `slot`): whether it loses to one (a committed block, or a
    /// claim on a lower id, which it marks `DEFERRED`). Kills the claims on
    /// higher ids that it meets.
    fn loses_to_a_rival(
        &self,
        keys: &Keys,
        id: BlockId,
        key: &BlockHash,
        probe: Probe,
        slot: usize,
    ) -> bool {
        for rival in keys.rivals(probe, slot) {
            if rival == id {
                continue;
            }
            // Acquire: the rival's claim or commit, with its key.
            let seen = self.refs.state(rival.index(), Ordering::Acquire);
            if seen & (CACHED | BUSY) == 0
                || seen & (CACHED | KILLED) == KILLED
                || !keys.holds(rival, key)
            {
                // A stale entry (being removed), a killed claim (it cannot
                // commit without looking again; a claim is also killed
                // until its key words are written, so an entry that an
                // earlier claim of the block left is not taken for this
                // one) or another key.
                continue;
            }
            let lost = if seen & CACHED != 0 {
                // A committed rival holds the key.
                true
            } else if rival < id {
                // Of two claims the lower id wins.
                self.refs.defer(rival, seen) != Defer::Gone
            } else {
                // A higher rival's claim is killed, unless it committed
                // first.
                self.refs.kill(rival, seen) == Kill::Committed
            };
            if lost {
                return true;
            }
        }
        false
    }

    /// Whether block `id` holds `key`, committed, now: a publish of the
    /// key loses to it without claiming anything (first wins).
    fn is_holder(&self, keys: &Keys, id: BlockId, key: &BlockHash) -> bool {
        // Acquire: as in `match_one`, the key words read next are the
        // publisher's.
        self.refs.state(id.index(), Ordering::Acquire) & CACHED != 0 && keys.holds(id, key)
    }

    /// Gives block `id` back to the pool if the drop of a claim's own
    /// reference (by the commit or the unclaim) was its last: its holders
    /// all let go while it was claimed, which only a double free through
    /// [`BlockPool::free`] of the publishing holder's reference makes
    /// possible. Through the same path as any last drop: to the free list,
    /// or evictable (stamped as the most recently released) if the commit
    /// cached it, with its capacity released.
    fn give_back_claim(&self, id: BlockId, dropped: Dropped) {
        if dropped != Dropped::Kept {
            let _ = self.drop_each(Give::new(), std::iter::once(id), &[id], true, |_| {
                Ok(dropped)
            });
        }
    }
}
