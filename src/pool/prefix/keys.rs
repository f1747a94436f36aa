//! The prefix cache's keys: each block's 32-byte key, and a fixed-size
//! index from keys to the blocks that may hold them.
//!
//! The index is only a hint. It is an array of `AtomicU64` slots, cut into
//! buckets of up to 8 slots (one cache line); a slot is empty or holds a
//! block id with 32 bits of its key's hash (a fingerprint). A key has two
//! candidate buckets, always two different ones; an insert goes into the
//! emptier one (two choices keep every bucket short), and a lookup reads
//! both. Whoever finds a block through the index checks the block's state
//! word and its whole key before trusting it.
//!
//! The buckets and the fingerprint come from a keyed hash of the key's
//! four words under a seed of the pool's own ([`Mix`]), not from the key's
//! bytes: a key is any 32 bytes (`BlockHash` is public), and keys with
//! structure (sequential, mostly constant, words that depend on each
//! other, or built to collide) would otherwise fall into a few buckets.
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
use crate::sync::{self, AtomicU64, Faults, Ordering};

/// An empty slot (no block has id `u32::MAX`).
const EMPTY: u64 = u64::MAX;
/// The most slots a bucket has.
const MAX_WIDTH: usize = 8;

/// Where a key's index entries can be: its two buckets (never the same
/// one) and fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    #[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
    pub(super) fn for_ring(ring: usize) -> Probe {
        Probe {
            first: 0,
            second: 1,
            fingerprint: ring as u32,
        }
    }
}

/// The keyed hash that places a key in the index: two 64-bit values from
/// the key's four words and eight seed words.
///
/// Each step is a *folded multiply*: the 128-bit product of two words,
/// its halves XORed. The key's words are XORed with seed words in pairs
/// and folded (`a` from words 0 and 1, `b` from words 2 and 3), and `a`
/// and `b` are XORed with two more pairs of seed words and folded again,
/// into `h1` and `h2`. Every bit of a product depends on every bit of both
/// factors below it, and the high half carries the top bits down, so each
/// output depends on all 256 bits of the key; the seed makes every
/// factor unknown to whoever chose the keys.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mix {
    seed: [u64; 8],
}

/// The 128-bit product of `a` and `b`, its two halves XORed.
#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

/// `h` scaled to `0..n` (its high bits pick the value): a multiply and a
/// shift instead of a division.
#[inline]
fn scale(h: u64, n: usize) -> usize {
    ((u128::from(h) * n as u128) >> 64) as usize
}

impl Mix {
    /// The hash keyed by `seed`.
    pub(super) fn new(seed: [u64; 8]) -> Mix {
        Mix { seed }
    }

    /// The two hashes of `key`.
    #[inline]
    fn hash(&self, key: &BlockHash) -> (u64, u64) {
        let s = &self.seed;
        let a = fold(key_word(key, 0) ^ s[0], key_word(key, 1) ^ s[1]);
        let b = fold(key_word(key, 2) ^ s[2], key_word(key, 3) ^ s[3]);
        (fold(a ^ s[4], b ^ s[5]), fold(a ^ s[6], b ^ s[7]))
    }
}

/// The keys of a pool's blocks and the index over them.
pub(super) struct Keys {
    /// Four words per block: its key, written by its publisher while the
    /// block is claimed, or just before a sole holder's claim.
    words: Box<[AtomicU64]>,
    /// `buckets * width` slots.
    slots: Box<[AtomicU64]>,
    /// Slots per bucket.
    width: usize,
    /// `slots.len() / width`, at least 2.
    buckets: usize,
    /// The keyed hash that places keys.
    mix: Mix,
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
    /// them ([`room`](Self::room)): 2.5 slots per block, in buckets of 8
    /// slots (fewer for pools under 8 blocks), and at least two buckets, so
    /// that a key's two buckets can differ. The index hash is keyed by a
    /// seed of this pool's own ([`sync::index_seed`]).
    ///
    /// With 2.5 slots per block a bucket holds 3.2 entries on average when
    /// every block is cached, and the emptier of a key's two buckets is
    /// practically never full (see `crate::implementation`, "Keys and the
    /// index").
    pub(super) fn new(room: KeysRoom, faults: Faults) -> Keys {
        Keys::with_mix(room, faults, Mix::new(sync::index_seed()))
    }

    /// [`new`](Self::new) with the index hash `mix`.
    pub(super) fn with_mix(room: KeysRoom, faults: Faults, mix: Mix) -> Keys {
        let slots = room.slots.fill(|_| AtomicU64::new(EMPTY));
        Keys {
            words: room.words.fill(|_| AtomicU64::new(0)),
            buckets: slots.len() / room.width,
            slots,
            width: room.width,
            mix,
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
        let wanted = 2 * num_blocks + num_blocks / 2;
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

    /// The buckets and fingerprint of `key`, from its two hashes under
    /// the pool's seed ([`Mix`]): `h1`'s high bits pick the first bucket,
    /// `h2`'s the second among the other buckets, and `h1`'s low 32 bits
    /// are the fingerprint.
    pub(super) fn probe(&self, key: &BlockHash) -> Probe {
        let (h1, h2) = self.mix.hash(key);
        let first = scale(h1, self.buckets);
        let second = scale(h2, self.buckets - 1);
        Probe {
            first,
            second: if second >= first { second + 1 } else { second },
            fingerprint: h1 as u32,
        }
    }

    /// The slots of a probe's buckets, first bucket first. With
    /// `lookup`, the slots that a lookup reads: the same, except that
    /// loom's `first_bucket_only` control leaves out the second bucket.
    fn slots_of(&self, probe: Probe, lookup: bool) -> impl Iterator<Item = usize> {
        let width = self.width;
        let second = if lookup && self.faults.first_bucket_only() {
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
    /// or, a sequence, holds it alone and unclaimed, so no one else writes
    /// these words now.
    pub(super) fn write(&self, id: BlockId, key: &BlockHash) {
        // Release: a peek that reads one of these words (`Acquire`, see
        // `holds_acquired`) and then the block's state again sees the
        // state that this writer read or wrote before them (its claim, or
        // the sole holder's state): not cached, or a later generation than
        // any state of the block's earlier keys. Matchers and publishers
        // need less: the key is also published by the claim's arm (or a
        // sole holder's claim), the index insert and the commit, all
        // Release. (Relaxed under loom's `relaxed_key_words` control.)
        let order = self.faults.key_word_ordering(Ordering::Release);
        for i in 0..4 {
            self.words[id.index() * 4 + i].store(key_word(key, i), order);
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

    /// Whether block `id`'s key words read `key`, each word loaded with
    /// `Acquire`: for a peek, which takes no reference and checks the
    /// block's state again after these loads (see `BlockPool::peek_block`).
    pub(super) fn holds_acquired(&self, id: BlockId, key: &BlockHash) -> bool {
        if self.faults.peek_skips_key() {
            // loom's control: any key passes.
            return true;
        }
        // Acquire: a word written for a later key (a Release store, after
        // its writer saw the block lose the key of the state the caller
        // read first) makes the caller's next read of the state see that
        // loss, or later.
        (0..4).all(|i| self.words[id.index() * 4 + i].load(Ordering::Acquire) == key_word(key, i))
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
        self.slots_of(probe, true).filter_map(move |slot| {
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
            for slot in bucket * self.width..(bucket + 1) * self.width {
                // Acquire: synchronises with the publisher's insert
                // (Release), so its key words are visible to `holds`.
                let word = self.slots[slot].load(Ordering::Acquire);
                if word == EMPTY {
                    continue;
                }
                used[n] += 1;
                let looked_up = n == 0 || !self.faults.first_bucket_only();
                if looked_up && Self::block_of(probe, word).is_some_and(&holds) {
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
    /// the key's first bucket, wherever the publisher's own entry went:
    /// every publisher of the key makes one on that same word after its
    /// insert, so of two publishers the later one reads from the earlier
    /// one's (or from a later read-modify-write, which continues its
    /// release sequence) and synchronises with it. The later one's loads
    /// then see the earlier one's entry, in either bucket (unless that one
    /// has already removed it, having lost).
    pub(super) fn rivals(&self, probe: Probe, mine: usize) -> impl Iterator<Item = BlockId> + '_ {
        let fence = if self.faults.fence_own_bucket() {
            mine - mine % self.width
        } else {
            probe.first * self.width
        };
        // AcqRel: see above; every write to a slot is a read-modify-write,
        // so the release sequences are never broken.
        self.slots[fence].fetch_add(0, Ordering::AcqRel);
        self.slots_of(probe, true)
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
            None => self.slots_of(probe, false).any(remove),
        }
    }
}

#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
mod tests {
    use super::*;

    /// Keys and an index for `num_blocks` blocks, hashed under `seed`.
    fn keys_with(num_blocks: usize, seed: [u64; 8]) -> Keys {
        Keys::with_mix(
            Keys::room(num_blocks).unwrap(),
            Faults::default(),
            Mix::new(seed),
        )
    }

    /// A key of four little-endian words.
    fn key_of_words(words: [u64; 4]) -> BlockHash {
        let mut key = [0u8; 32];
        for (i, word) in words.iter().enumerate() {
            key[i * 8..i * 8 + 8].copy_from_slice(&word.to_le_bytes());
        }
        BlockHash(key)
    }

    /// Seeds for the deterministic tests: the model checkers' and three
    /// more.
    fn seeds() -> [[u64; 8]; 4] {
        let mut seeds = [sync::MODEL_SEED; 4];
        for (n, seed) in seeds.iter_mut().enumerate().skip(1) {
            for (i, word) in seed.iter_mut().enumerate() {
                *word = word.rotate_left((8 * n + i) as u32) ^ (n as u64);
            }
        }
        seeds
    }

    /// Families of `n` distinct keys with structure: sequential integers,
    /// zero-padded decimal text, a word and its complement, and keys whose
    /// words 0 and 1 are 0 and 1 modulo `buckets` with word 2 fixed (the
    /// index's bucket choice and fingerprint, had it taken them from the
    /// key's bytes, would put every one of them in buckets 0 and 1).
    fn families(n: u64, buckets: u64) -> Vec<(&'static str, Vec<BlockHash>)> {
        vec![
            (
                "sequential",
                (0..n).map(|i| key_of_words([i, 0, 0, 0])).collect(),
            ),
            (
                "decimal text",
                (0..n)
                    .map(|i| BlockHash(format!("{i:032}").into_bytes().try_into().unwrap()))
                    .collect(),
            ),
            (
                "complement",
                (0..n).map(|i| key_of_words([i, !i, 0, 0])).collect(),
            ),
            (
                "crafted",
                (0..n)
                    .map(|i| key_of_words([i * buckets, i * buckets + 1, 7, i]))
                    .collect(),
            ),
        ]
    }

    #[test]
    fn a_keys_two_buckets_always_differ() {
        for num_blocks in (1..=40).chain([100, 1000, 4093]) {
            let keys = keys_with(num_blocks, sync::MODEL_SEED);
            assert!(keys.buckets >= 2);
            for (_, family) in families(500, keys.buckets as u64) {
                for key in family
                    .iter()
                    .chain(&[BlockHash([0; 32]), BlockHash([0xff; 32])])
                {
                    let probe = keys.probe(key);
                    assert!(probe.first < keys.buckets && probe.second < keys.buckets);
                    assert_ne!(probe.first, probe.second, "{num_blocks} blocks: {key:?}");
                }
            }
        }
    }

    #[test]
    fn every_bit_of_a_key_moves_both_hashes() {
        let mix = Mix::new(sync::MODEL_SEED);
        for base in [
            BlockHash([0; 32]),
            BlockHash([0x5a; 32]),
            key_of_words([1, 2, 3, 4]),
        ] {
            let (h1, h2) = mix.hash(&base);
            for bit in 0..256 {
                let mut flipped = base;
                flipped.0[bit / 8] ^= 1 << (bit % 8);
                let (g1, g2) = mix.hash(&flipped);
                // About half of each hash's bits change; a word the hash
                // ignored would change none.
                for (name, change) in [
                    ("h1", (h1 ^ g1).count_ones()),
                    ("h2", (h2 ^ g2).count_ones()),
                ] {
                    assert!(
                        (8..=56).contains(&change),
                        "bit {bit}: {name} moved {change} bits"
                    );
                }
            }
        }
    }

    #[test]
    fn keys_with_structure_spread_over_the_buckets() {
        for num_blocks in [64, 1000, 4096] {
            for seed in seeds() {
                let keys = keys_with(num_blocks, seed);
                let buckets = keys.buckets;
                for (name, family) in families(4 * buckets as u64, buckets as u64) {
                    let mut first = vec![0usize; buckets];
                    let mut either = vec![0usize; buckets];
                    let mut pairs = std::collections::HashSet::new();
                    for key in &family {
                        let probe = keys.probe(key);
                        first[probe.first] += 1;
                        either[probe.first] += 1;
                        either[probe.second] += 1;
                        pairs.insert((probe.first, probe.second));
                    }
                    // The second choice does not follow from the first:
                    // 4 keys a bucket over `buckets * (buckets - 1)`
                    // pairs are nearly all different pairs (a second
                    // bucket that a function of the first picked would
                    // give at most `buckets`).
                    assert!(
                        pairs.len() >= 2 * buckets,
                        "{name}, {num_blocks} blocks: {} bucket pairs",
                        pairs.len()
                    );
                    // 4 keys a bucket on average (8 counting both choices):
                    // uniform choices stay well under these bounds, the
                    // key's raw bytes would put whole families in one
                    // bucket.
                    let (max_first, max_either) =
                        (*first.iter().max().unwrap(), *either.iter().max().unwrap());
                    assert!(
                        max_first <= 18 && max_either <= 28,
                        "{name}, {num_blocks} blocks: {max_first} first choices, \
                         {max_either} choices in one bucket"
                    );
                }
            }
        }
    }

    #[test]
    fn an_index_takes_one_entry_per_block_for_keys_with_structure() {
        // Every block cached, each key inserted into the emptier of its
        // buckets: never both full.
        for num_blocks in [7, 64, 1000, 4096] {
            for seed in seeds() {
                let buckets = keys_with(num_blocks, seed).buckets as u64;
                for (name, family) in families(num_blocks as u64, buckets) {
                    let keys = keys_with(num_blocks, seed);
                    for (id, key) in family.iter().enumerate() {
                        let probe = keys.probe(key);
                        assert!(
                            keys.insert(probe, BlockId::new(id as u32)).is_some(),
                            "{name}, {num_blocks} blocks: both buckets of key {id} full"
                        );
                    }
                    for (id, key) in family.iter().enumerate() {
                        let probe = keys.probe(key);
                        let listed: Vec<BlockId> = keys.candidates(probe).collect();
                        assert!(
                            listed.contains(&BlockId::new(id as u32)),
                            "{name}: key {id} not found"
                        );
                    }
                }
            }
        }
    }

    /// A full index under churn: `num_blocks` random keys listed, then
    /// `steps` times one of them leaves (an eviction) and a new one is
    /// inserted (a publish). Which key leaves is independent of where keys
    /// sit, as with the least recently released order. Returns how many
    /// inserts found the emptier of their two buckets holding 0 to 8
    /// entries (8: both full, the insert refused).
    fn churn(num_blocks: usize, seed: [u64; 8], steps: usize) -> [u64; 9] {
        let keys = keys_with(num_blocks, seed);
        let mut state = seed[0] | 1;
        let mut random = move || {
            // splitmix64.
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let used = |bucket: usize| {
            (bucket * keys.width..(bucket + 1) * keys.width)
                .filter(|&s| keys.slots[s].load(Ordering::Relaxed) != EMPTY)
                .count()
        };
        let mut histogram = [0u64; 9];
        // Each block's listed probe, `None` if its insert was refused.
        let mut listed: Vec<Option<Probe>> = vec![None; num_blocks];
        for step in 0..num_blocks + steps {
            let id = if step < num_blocks {
                step
            } else {
                (random() % num_blocks as u64) as usize
            };
            if let Some(old) = listed[id] {
                assert!(keys.remove(old, BlockId::new(id as u32), None));
            }
            let key = key_of_words([random(), random(), random(), random()]);
            let probe = keys.probe(&key);
            histogram[used(probe.first).min(used(probe.second))] += 1;
            listed[id] = keys.insert(probe, BlockId::new(id as u32)).map(|_| probe);
        }
        histogram
    }

    #[test]
    fn a_full_index_under_churn_keeps_room_in_the_emptier_bucket() {
        // 2 million inserts into full indexes: the emptier bucket never
        // holds more than 6 of its 8 entries, so no insert comes near a
        // refusal.
        for num_blocks in [1000, 4096] {
            for seed in seeds() {
                let histogram = churn(num_blocks, seed, 250_000);
                assert_eq!(histogram[7..], [0, 0], "{num_blocks} blocks: {histogram:?}");
            }
        }
    }

    /// The distribution behind `BENCHMARKS.md`'s index figures:
    /// `cargo test --release --lib pool::prefix::keys -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, to run in release"]
    fn churn_histogram() {
        for num_blocks in [1000, 64_000] {
            let mut total = [0u64; 9];
            for n in 0..100u64 {
                let seed: [u64; 8] = std::array::from_fn(|i| {
                    sync::MODEL_SEED[i] ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                });
                let histogram = churn(num_blocks, seed, 1_000_000);
                for (t, h) in total.iter_mut().zip(histogram) {
                    *t += h;
                }
            }
            println!("{num_blocks} blocks, 100 seeds: inserts by the emptier bucket's entries 0..=8: {total:?}");
        }
    }

    #[test]
    fn each_pool_has_a_seed_of_its_own() {
        let (a, b) = (
            Keys::new(Keys::room(64).unwrap(), Faults::default()),
            Keys::new(Keys::room(64).unwrap(), Faults::default()),
        );
        assert_ne!(a.mix.seed, b.mix.seed);
        // And a pool keeps its placement: the same key, the same probe.
        let key = key_of_words([1, 2, 3, 4]);
        assert_eq!(a.probe(&key), a.probe(&key));
    }

    #[test]
    fn the_loom_models_colliding_keys_collide() {
        // `src/loom_tests/prefix.rs`'s `peek_of_a_colliding_key` runs a pool
        // of 1 block (2 buckets) under the model checkers' seed, and relies
        // on these two keys having the same probe: the same buckets and
        // fingerprint, so that a lookup of either finds the other's entry.
        let keys = keys_with(1, sync::MODEL_SEED);
        assert_eq!(keys.buckets, 2);
        let (a, b) = (
            key_of_words([40_952, 0, 0, 0]),
            key_of_words([87_864, 0, 0, 0]),
        );
        assert_eq!(keys.probe(&a), keys.probe(&b));
    }

    #[test]
    fn the_loom_models_keys_share_or_split_their_first_bucket() {
        // The two-bucket models of `src/loom_tests/prefix.rs` run pools of 3 blocks (2
        // buckets) under the model checkers' seed, and relies on keys
        // `[1; 32]` and `[3; 32]` sharing their first bucket, and on
        // `[2; 32]` having the other one first.
        let keys = keys_with(3, sync::MODEL_SEED);
        assert_eq!(keys.buckets, 2);
        let first = |n: u8| keys.probe(&BlockHash([n; 32])).first;
        assert_eq!(first(1), first(3));
        assert_ne!(first(1), first(2));
    }
}
