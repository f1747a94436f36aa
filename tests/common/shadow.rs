//! A shadow of a pool's blocks for the attacks that race matches,
//! reservations, appends and waiters on real threads: who holds which
//! block, and what each contains (a key's tag once written for
//! publishing, an owner's stamp while written privately).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering::SeqCst};

use kvslots::{BlockHash, BlockId, BlockPool, KvEvent, ReserveError};

/// The high bit of a private owner's stamp (no tag a test writes has it).
pub const STAMP: u64 = 1 << 63;

/// The tag of a key: its first 8 bytes, little-endian (what a block
/// holding the key contains once written for publishing).
pub fn tag_of(k: &BlockHash) -> u64 {
    u64::from_le_bytes(k.0[..8].try_into().unwrap())
}

/// Holders and contents of every block of a pool.
pub struct Shadow {
    /// Holders per block (an exclusive holder checks 0 before it adds 1).
    pub held: Vec<AtomicI32>,
    /// What each block contains.
    pub content: Vec<AtomicU64>,
    stamp: AtomicU64,
}

impl Shadow {
    /// The shadow of a pool of `n` blocks: nothing held, nothing written.
    pub fn new(n: usize) -> Shadow {
        Shadow {
            held: (0..n).map(|_| AtomicI32::new(0)).collect(),
            content: (0..n).map(|_| AtomicU64::new(0)).collect(),
            stamp: AtomicU64::new(STAMP),
        }
    }

    /// Takes `ids`, which no one else may hold, and writes a fresh stamp
    /// into them; returns the stamp.
    pub fn take_fresh(&self, ids: &[BlockId], what: &str) -> u64 {
        let stamp = self.stamp.fetch_add(1, SeqCst);
        for id in ids {
            let prev = self.held[id.index()].fetch_add(1, SeqCst);
            assert_eq!(prev, 0, "{what}: {id} handed out while another holds it");
            self.content[id.index()].store(stamp, SeqCst);
        }
        stamp
    }

    /// Takes `ids`, which others may hold too (matched blocks).
    pub fn take_shared(&self, ids: &[BlockId]) {
        for id in ids {
            let prev = self.held[id.index()].fetch_add(1, SeqCst);
            assert!(prev >= 0);
        }
    }

    /// Gives `ids` back.
    pub fn give(&self, ids: &[BlockId]) {
        for id in ids {
            let prev = self.held[id.index()].fetch_sub(1, SeqCst);
            assert!(prev >= 1, "{id} given back by one that did not hold it");
        }
    }

    /// Checks that `ids` still hold `stamp`: no other holder wrote them.
    pub fn check_stamp(&self, ids: &[BlockId], stamp: u64, what: &str) {
        for id in ids {
            let c = self.content[id.index()].load(SeqCst);
            assert_eq!(c, stamp, "{what}: {id} written by another holder");
        }
    }

    /// The end of a raw waiter's allocation of `want` blocks into `ids`,
    /// which returned `got`: blocks granted are taken alone (no one else
    /// holds one), checked, given back and freed; a refusal handed out
    /// nothing.
    pub fn end_raw_alloc(
        &self,
        pool: &BlockPool,
        got: Result<(), ReserveError>,
        want: usize,
        ids: &[BlockId],
    ) {
        if got.is_ok() {
            assert_eq!(ids.len(), want);
            let stamp = self.take_fresh(ids, "waiter");
            self.check_stamp(ids, stamp, "waiter");
            self.give(ids);
            pool.free(ids).unwrap();
        } else {
            assert!(ids.is_empty(), "a refusal handed out blocks");
        }
    }

    /// Writes the tags `ts` into `ids` (held alone) before a publish.
    pub fn write_tags(&self, ids: &[BlockId], ts: &[u64]) {
        for (id, t) in ids.iter().zip(ts) {
            self.content[id.index()].store(*t, SeqCst);
        }
    }

    /// Checks that each of `ids` (matched for `ks`) holds its key's tag.
    pub fn check_tags(&self, ids: &[BlockId], ks: &[BlockHash], what: &str) {
        assert!(ids.len() <= ks.len(), "{what}: more blocks than keys");
        for (id, k) in ids.iter().zip(ks) {
            let c = self.content[id.index()].load(SeqCst);
            assert_eq!(
                c,
                tag_of(k),
                "{what}: matched {id} holds {c:#x}, not the key's tag"
            );
        }
    }
}

/// Replays KV events into `view` (key to block): each key stored once at
/// a time, removals only of keys stored; a clear empties it. Returns
/// false at events the ring dropped (the view is lost then, emptied, and
/// the rest is not replayed).
#[must_use]
pub fn replay(view: &mut HashMap<BlockHash, BlockId>, events: &[KvEvent]) -> bool {
    for e in events {
        match e {
            KvEvent::BlockStored {
                keys, block_ids, ..
            } => {
                for (k, id) in keys.iter().zip(block_ids) {
                    let prev = view.insert(*k, *id);
                    assert!(
                        prev.is_none(),
                        "key {:#x} stored twice (on {id} and {prev:?})",
                        tag_of(k)
                    );
                }
            }
            KvEvent::BlockRemoved { keys, .. } => {
                for k in keys {
                    assert!(
                        view.remove(k).is_some(),
                        "key {:#x} removed, never stored",
                        tag_of(k)
                    );
                }
            }
            KvEvent::Dropped { .. } => {
                view.clear();
                return false;
            }
            _ => view.clear(),
        }
    }
    true
}

/// Counts a worker done when dropped (also by a panic's unwinding).
pub struct Done<'a>(pub &'a AtomicUsize);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}
