//! The prefix cache's keys: each block's 32-byte key, and a fixed-size
//! index from keys to the blocks that may hold them.
//!
//! The index is only a hint. It is an array of `AtomicU64` slots, cut into
//! buckets of up to 8 slots (one cache line); a slot is empty or holds a
//! block id with 32 bits of its key (a fingerprint). A key has two
//! candidate buckets, picked by two other parts of the key; an insert goes
//! into the emptier one (two choices keep every bucket short), and a lookup
//! reads both. Whoever finds a block through the index checks the block's
//! state word and its whole key before trusting it.
//!
//! Every write to a slot is a read-modify-write, so each write heads a
//! release sequence that every later value of the slot continues; a
//! publisher's rescan starts with a read-modify-write on the first slot of
//! the key's first bucket, which orders it after every earlier publisher
//! of the same key (see [`Keys::rivals`]).

use std::collections::TryReserveError;

use crate::array::{bytes_of, Room};
use crate::hash::BlockHash;
use crate::id::BlockId;
use crate::sync::{AtomicU64, Faults, Ordering};

/// An empty slot (no block has id `u32::MAX`).
const EMPTY: u64 = u64::MAX;
/// The most slots a bucket has.
const MAX_WIDTH: usize = 8;

/// Where a key's index entries can be: its two buckets and fingerprint.
#[derive(Debug, Clone, Copy)]
pub(super) struct Probe {
    first: usize,
    second: usize,
    fingerprint: u32,
}

impl Probe {
    /// Which of `rings` KV event rings the key's records go to: picked by
    /// its fingerprint.
    pub(super) fn ring(self, rings: usize) -> usize {
        self.fingerprint as usize % rings
    }

    /// A probe whose key's records go to ring `ring`, for the rings' unit
    /// tests.
    #[cfg(test)]
    pub(super) fn for_ring(ring: usize) -> Probe {
        Probe {
            first: 0,
            second: 1,
            fingerprint: ring as u32,
        }
    }
}

/// The keys of a pool's blocks and the index over them.
pub(super) struct Keys {
    /// Four words per block: its key, written while the block is claimed.
    words: Box<[AtomicU64]>,
    /// `buckets * width` slots.
    slots: Box<[AtomicU64]>,
    /// Slots per bucket.
    width: usize,
    /// The faults of loom's negative controls (none outside them).
    faults: Faults,
}

/// The room of a [`Keys`]' arrays, reserved by [`Keys::room`].
pub(super) struct KeysRoom {
    words: Room<AtomicU64>,
    slots: Room<AtomicU64>,
    width: usize,
}

/// The `i`-th little-endian `u64` of a key.
fn key_word(key: &BlockHash, i: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&key.0[i * 8..i * 8 + 8]);
    u64::from_le_bytes(bytes)
}

impl Keys {
    /// Keys and an index for `num_blocks` blocks, in the room reserved for
    /// them: 1.75 slots per block (at least two buckets), in buckets of 8
    /// slots (fewer for pools under 8 blocks, whose one bucket then holds
    /// every key).
    pub(super) fn new(room: KeysRoom, faults: Faults) -> Keys {
        Keys {
            words: room.words.fill(|_| AtomicU64::new(0)),
            slots: room.slots.fill(|_| AtomicU64::new(EMPTY)),
            width: room.width,
            faults,
        }
    }

    /// Reserves the room of [`new`](Self::new)'s arrays for `num_blocks`
    /// blocks.
    pub(super) fn room(num_blocks: usize) -> Result<KeysRoom, TryReserveError> {
        let (width, slots) = Keys::shape(num_blocks);
        Ok(KeysRoom {
            words: Room::reserve(num_blocks * 4)?,
            slots: Room::reserve(slots)?,
            width,
        })
    }

    /// The bucket width and the number of index slots for `num_blocks`
    /// blocks (at most `u32::MAX`, so nothing here overflows).
    fn shape(num_blocks: usize) -> (usize, usize) {
        let width = num_blocks.clamp(1, MAX_WIDTH).next_power_of_two();
        let wanted = num_blocks + num_blocks / 2 + num_blocks / 4;
        let buckets = wanted.div_ceil(width).max(2);
        (width, buckets * width)
    }

    /// The heap bytes [`room`](Self::room) asks for.
    pub(super) fn heap_bytes(num_blocks: usize) -> usize {
        bytes_of::<AtomicU64>(num_blocks.saturating_mul(4))
            .saturating_add(bytes_of::<AtomicU64>(Keys::shape(num_blocks).1))
    }

    /// Whether a publish skips its lookup of the key before it claims:
    /// `false`, or `true` under loom's `no_held_key_check` control.
    pub(super) fn skip_held_key_check(&self) -> bool {
        self.faults.no_held_key_check()
    }

    /// The buckets and fingerprint of `key`. The key is a cryptographic
    /// hash, so its bytes are already uniform: bytes 0..8 and 8..16 pick
    /// the buckets, 16..20 are the fingerprint.
    pub(super) fn probe(&self, key: &BlockHash) -> Probe {
        let buckets = (self.slots.len() / self.width) as u64;
        Probe {
            first: (key_word(key, 0) % buckets) as usize,
            second: (key_word(key, 1) % buckets) as usize,
            fingerprint: key_word(key, 2) as u32,
        }
    }

    /// The slots of a probe's buckets (the second only if it differs).
    fn slots_of(&self, probe: Probe) -> impl Iterator<Item = usize> {
        let width = self.width;
        let second = if probe.second == probe.first {
            0..0
        } else {
            probe.second * width..(probe.second + 1) * width
        };
        (probe.first * width..(probe.first + 1) * width).chain(second)
    }

    /// The slot word of block `id` under `probe`'s fingerprint.
    fn entry(probe: Probe, id: BlockId) -> u64 {
        (u64::from(probe.fingerprint) << 32) | id.index() as u64
    }

    /// The block a slot word names, if its fingerprint is `probe`'s.
    fn block_of(probe: Probe, word: u64) -> Option<BlockId> {
        if word == EMPTY || (word >> 32) as u32 != probe.fingerprint {
            return None;
        }
        Some(BlockId::new(word as u32))
    }

    /// Writes `key` as block `id`'s key. The caller has claimed the block
    /// (or holds it alone), so no one else writes these words now.
    pub(super) fn write(&self, id: BlockId, key: &BlockHash) {
        for i in 0..4 {
            // Relaxed: published by the index insert and the commit, both
            // Release.
            self.words[id.index() * 4 + i].store(key_word(key, i), Ordering::Relaxed);
        }
    }

    /// Whether block `id`'s key words read `key`.
    pub(super) fn holds(&self, id: BlockId, key: &BlockHash) -> bool {
        // Relaxed: the caller acquired the block's state (or an index slot)
        // first, which orders these loads after the key's writes; a key
        // rewritten since implies a new generation, which the caller's CAS
        // on the exact state catches.
        (0..4).all(|i| self.words[id.index() * 4 + i].load(Ordering::Relaxed) == key_word(key, i))
    }

    /// Block `id`'s key words, as a key. Only for a block the caller holds
    /// alone (an eviction's, a reset's), or one whose state it read as
    /// cached and will take with a CAS from that state (a KV event's
    /// record of the eviction: a key rewritten since makes the CAS fail).
    pub(super) fn read(&self, id: BlockId) -> BlockHash {
        let mut key = [0u8; 32];
        for i in 0..4 {
            // Relaxed: its key was written before the Release commit that
            // our Acquire eviction (or our Acquire load of the state)
            // synchronised with.
            let word = self.words[id.index() * 4 + i].load(Ordering::Relaxed);
            key[i * 8..i * 8 + 8].copy_from_slice(&word.to_le_bytes());
        }
        BlockHash(key)
    }

    /// The blocks that the index lists under `probe`'s fingerprint: the
    /// candidates a lookup checks.
    pub(super) fn candidates(&self, probe: Probe) -> impl Iterator<Item = BlockId> + '_ {
        self.slots_of(probe).filter_map(move |slot| {
            // Acquire: synchronises with the publisher's insert (Release),
            // so its key words are visible when the candidate is checked.
            Self::block_of(probe, self.slots[slot].load(Ordering::Acquire))
        })
    }

    /// One pass over `probe`'s buckets before a publish claims its block:
    /// `None` if `holds` accepts a block listed under the fingerprint (a
    /// block that holds the key: the publish loses at once), else the two
    /// buckets emptier first, for [`insert_into`](Self::insert_into).
    pub(super) fn look_before_insert(
        &self,
        probe: Probe,
        holds: impl Fn(BlockId) -> bool,
    ) -> Option<[usize; 2]> {
        let mut used = [0usize; 2];
        for (n, bucket) in [probe.first, probe.second].into_iter().enumerate() {
            if n == 1 && bucket == probe.first {
                used[1] = used[0];
                break;
            }
            for slot in bucket * self.width..(bucket + 1) * self.width {
                // Acquire: synchronises with the publisher's insert
                // (Release), so its key words are visible to `holds`.
                let word = self.slots[slot].load(Ordering::Acquire);
                if word == EMPTY {
                    continue;
                }
                used[n] += 1;
                if Self::block_of(probe, word).is_some_and(&holds) {
                    return None;
                }
            }
        }
        Some(if used[1] < used[0] {
            [probe.second, probe.first]
        } else {
            [probe.first, probe.second]
        })
    }

    /// Inserts block `id` into the emptier of `probe`'s buckets; returns
    /// the slot, or `None` if both buckets are full.
    pub(super) fn insert(&self, probe: Probe, id: BlockId) -> Option<usize> {
        let used = |bucket: usize| {
            (bucket * self.width..(bucket + 1) * self.width)
                // Relaxed: only chooses a bucket; the CAS below decides.
                .filter(|&s| self.slots[s].load(Ordering::Relaxed) != EMPTY)
                .count()
        };
        let order = if used(probe.second) < used(probe.first) {
            [probe.second, probe.first]
        } else {
            [probe.first, probe.second]
        };
        self.insert_into(probe, order, id)
    }

    /// Inserts block `id` into the first empty slot of `order`'s buckets;
    /// returns the slot, or `None` if both are full.
    pub(super) fn insert_into(
        &self,
        probe: Probe,
        order: [usize; 2],
        id: BlockId,
    ) -> Option<usize> {
        let entry = Self::entry(probe, id);
        for bucket in order {
            for slot in bucket * self.width..(bucket + 1) * self.width {
                // Relaxed: only skips taken slots without a locked
                // instruction; the CAS below decides.
                if self.slots[slot].load(Ordering::Relaxed) != EMPTY {
                    continue;
                }
                // AcqRel on success: Release publishes the block's key words
                // to whoever reads this slot; Acquire continues the release
                // sequences of earlier writes (the rescan's argument, see
                // the module doc). Relaxed on failure: the slot is taken.
                if self.slots[slot]
                    .compare_exchange(
                        EMPTY,
                        entry,
                        self.faults.publish_ordering(Ordering::AcqRel),
                        Ordering::Relaxed,
                    )
                    .is_ok()
                {
                    return Some(slot);
                }
            }
        }
        None
    }

    /// The other blocks that the index lists under `probe`'s fingerprint,
    /// for a publisher's rescan after its insert, with the slot `mine`
    /// skipped.
    ///
    /// First a read-modify-write that changes nothing on the first slot of
    /// the key's first bucket: every publisher of the key makes one on that
    /// same word after its insert, so of two publishers the later one reads
    /// from the earlier one's (or from a later read-modify-write, which
    /// continues its release sequence) and synchronises with it. The later
    /// one's loads then see the earlier one's entry (unless that one has
    /// already removed it, having lost).
    pub(super) fn rivals(&self, probe: Probe, mine: usize) -> impl Iterator<Item = BlockId> + '_ {
        // AcqRel: see above; every write to a slot is a read-modify-write,
        // so the release sequences are never broken.
        self.slots[probe.first * self.width].fetch_add(0, Ordering::AcqRel);
        self.slots_of(probe)
            .filter(move |&slot| slot != mine)
            .filter_map(move |slot| {
                // Acquire: sees the rival's key words (published by its
                // insert).
                Self::block_of(probe, self.slots[slot].load(Ordering::Acquire))
            })
    }

    /// Removes block `id`'s entry under `probe` (the one in `slot`, if
    /// given). `false` if there was none.
    pub(super) fn remove(&self, probe: Probe, id: BlockId, slot: Option<usize>) -> bool {
        let entry = Self::entry(probe, id);
        let remove = |s: usize| {
            // Relaxed: only skips other entries without a locked
            // instruction; the CAS below decides.
            self.slots[s].load(Ordering::Relaxed) == entry
                // AcqRel on success: continues the slot's release sequence
                // (see the module doc). Relaxed on failure: another entry.
                && self.slots[s]
                    .compare_exchange(entry, EMPTY, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
        };
        match slot {
            Some(s) => remove(s),
            None => self.slots_of(probe).any(remove),
        }
    }
}
