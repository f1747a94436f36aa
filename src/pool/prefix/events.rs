//! KV events: the prefix cache's stores and removals of keys, reported to a
//! consumer (a KV-aware router) as [`KvEvent`]s, an opt-in part of the
//! prefix cache ([`BlockPoolBuilder::kv_events`](crate::BlockPoolBuilder::kv_events)).
//!
//! # The rings
//!
//! The producers are the cache's transitions of a key: a publish's commit
//! (a store), an eviction, a reset's drop and a truncate's drop of a key (a
//! removal). Each writes one fixed-size record into a bounded ring: one
//! ring per free-list shard, and a key's records always go to the same
//! ring (picked by the key's fingerprint under the index's keyed hash).
//! A ring is an array of slots, each a position word and nine payload
//! words (the record's kind and block id, its key, its parent key), on a
//! cache line of its own, and a `tail` word: a producer takes the next
//! position with a CAS on `tail` (when the slot's position word says that
//! the consumer is done with the slot's previous record), writes the
//! payload and stores the position word (`Release`). No lock, no heap
//! allocation, a bounded number of steps apart from the CAS's retries
//! against other producers of the same ring. A producer that finds its
//! ring full does not wait: if its transition succeeds, the event is lost
//! and counted (`lost`, together with the position it would have had,
//! `lost_at`), and the consumer reports the count in place of the lost
//! events.
//!
//! # Order
//!
//! A transition *reserves* its position after it has observed what makes
//! it possible (the key's previous transition) and before it acts (its
//! CAS on the block's state word); if the CAS fails, it fills the position
//! with a void record that the consumer skips. The reservation is an
//! `AcqRel` CAS on the ring's `tail`, so of two reservations the earlier
//! in `tail`'s modification order happens-before everything the later one's
//! thread does after it. Suppose a key's transition `B` follows its
//! transition `A` (`B` observed `A`'s act) but took an earlier position:
//! then `B`'s observation happens-before `A`'s act, and (coherence) could
//! not have seen it. So a key's records lie in its ring in the order of
//! its transitions: the store before the removal, the removal from one
//! block before the store on the next. Each successful transition writes
//! one record, each failed one a void: nothing is reported twice. What
//! each transition observes is in `crate::implementation` ("KV events").
//!
//! The consumer ([`BlockPool::drain_events`]) reads each ring from its
//! head up to the first position not yet written, so it never reports a
//! record before an earlier one of the same ring. It then merges the
//! rings' records, keeping each ring's order (and so each key's), putting
//! a store before the stores whose parent it is when both are in the
//! batch, and runs consecutive stores of a chain into one
//! [`KvEvent::BlockStored`] and consecutive removals into one
//! [`KvEvent::BlockRemoved`].

use std::collections::{HashMap, TryReserveError};
use std::fmt;

use crate::array::{bytes_of, Room};
use crate::hash::BlockHash;
use crate::id::BlockId;
use crate::sync::{AtomicU16, AtomicU64, CachePadded, Faults, Mutex, Ordering};

use super::keys::Probe;
use super::BlockPool;

/// A change to the prefix cache of a [`BlockPool`], as a KV-aware router
/// (NVIDIA Dynamo, llm-d, SGLang's router) consumes them: the shapes of
/// vLLM's KV events (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`),
/// with block ids and a count of lost events.
///
/// A pool built with [`kv_events`](crate::BlockPoolBuilder::kv_events)
/// records them; [`BlockPool::drain_events`] hands them over in batches.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use kvslots::{hash_blocks, BlockPool, KvEvent, Sequence};
///
/// let pool = Arc::new(BlockPool::builder(8, 4).prefix_cache(true).kv_events(64).build()?);
/// let mut keys = Vec::new();
/// hash_blocks(b"", &[1, 2, 3, 4, 5, 6, 7, 8], 4, &mut keys);
/// let mut seq = Sequence::new(Arc::clone(&pool));
/// seq.try_append(8)?;
/// assert_eq!(seq.publish(&keys), 2);
/// let blocks = seq.blocks().to_vec();
///
/// let mut events = Vec::new();
/// assert_eq!(pool.drain_events(&mut events), 0); // the first batch
/// assert_eq!(
///     events,
///     [
///         KvEvent::AllBlocksCleared, // the stream starts from an empty cache
///         KvEvent::BlockStored {
///             keys: keys.clone(),
///             parent: None,
///             block_ids: blocks,
///             block_size: 4,
///             token_count: 8,
///             group: None, // a `Sequence`'s blocks: no group of layers
///         },
///     ]
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A [`HybridSequence`](crate::HybridSequence) publishes each group's
/// blocks under that group's keys ([`GroupKeys`](crate::GroupKeys)), and
/// its events name the group (vLLM's `group_idx`), in stores and in
/// removals alike:
///
/// ```
/// use std::sync::Arc;
/// use kvslots::{hash_blocks, BlockPool, HybridSequence, KvEvent, KvGroup, KvGroups};
///
/// let pool = Arc::new(BlockPool::builder(8, 4).prefix_cache(true).kv_events(64).build()?);
/// let groups = KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 4 }])?;
/// let mut base = Vec::new();
/// hash_blocks(b"", &[1, 2, 3, 4], 4, &mut base);
/// let keys = groups.keys(&base);
/// let mut seq = HybridSequence::new(Arc::clone(&pool), groups);
/// seq.try_append(4)?;
/// assert_eq!(seq.publish(&keys)?, 2);
/// drop(seq);
/// assert_eq!(pool.reset_prefix_cache(), 2);
///
/// let mut events = Vec::new();
/// pool.drain_events(&mut events);
/// let mut stored: Vec<_> = events
///     .iter()
///     .filter_map(|e| match e {
///         KvEvent::BlockStored { keys, group, .. } => Some((*group, keys[0])),
///         _ => None,
///     })
///     .collect();
/// stored.sort();
/// assert_eq!(stored, [(Some(0), keys.group(0).unwrap()[0]), (Some(1), keys.group(1).unwrap()[0])]);
/// let mut removed: Vec<_> = events
///     .iter()
///     .filter_map(|e| match e {
///         KvEvent::BlockRemoved { group, .. } => *group,
///         _ => None,
///     })
///     .collect();
/// removed.sort();
/// assert_eq!(removed, [0, 1]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KvEvent {
    /// Blocks became cached under `keys`: a chain, each key's parent the
    /// key before it, the first's `parent` (`None` for the first block of
    /// a prompt). A router adds them to what it knows this pool caches.
    BlockStored {
        /// The blocks' keys, in chain order.
        keys: Vec<BlockHash>,
        /// The key of the block before the first one in its sequence
        /// (cached or not), `None` for a prompt's first block.
        parent: Option<BlockHash>,
        /// The blocks now holding `keys`, one per key.
        block_ids: Vec<BlockId>,
        /// The pool's block size: tokens per block.
        block_size: usize,
        /// The tokens the stored blocks hold: `keys.len() * block_size`
        /// (only full blocks are cached). It always fits: a run of stores
        /// whose tokens would pass `usize::MAX` (keys are any bytes, so a
        /// chain can name more blocks than a pool has) goes on in a next
        /// event whose `parent` is this one's last key.
        token_count: usize,
        /// The group of layers the blocks belong to: the index of the
        /// [`HybridSequence`](crate::HybridSequence)'s group that
        /// published them (vLLM's `group_idx`), `None` for a
        /// [`Sequence`](crate::Sequence)'s blocks. A chain never spans
        /// two groups.
        group: Option<usize>,
    },
    /// Keys that no block holds any more (evicted, dropped by
    /// [`BlockPool::reset_prefix_cache`], or by a truncate into a block
    /// that a sequence held alone).
    BlockRemoved {
        /// The keys removed.
        keys: Vec<BlockHash>,
        /// The group of layers whose blocks held the keys (as in
        /// [`BlockStored`](Self::BlockStored): the group of the publish
        /// that stored them), `None` for keys a
        /// [`Sequence`](crate::Sequence) published. One event never mixes
        /// groups.
        group: Option<usize>,
    },
    /// No block holds a key: the first event a pool reports (its cache
    /// starts empty), so that a router forgets what it knew of a worker
    /// that came back with a new pool.
    AllBlocksCleared,
    /// `count` events were lost here because their ring was full (the
    /// consumer lagged). What the events said is gone: a router that must
    /// not hold a key the pool no longer caches treats this as
    /// [`AllBlocksCleared`](Self::AllBlocksCleared) (every event of the
    /// ring that lost them comes before this one or describes a later
    /// transition of its key, so the view it rebuilds from here on never
    /// holds a key the pool has removed; it may miss keys stored before).
    Dropped {
        /// How many events were lost.
        count: u64,
    },
}

/// A record's kind, in the low bits of its meta word.
const VOID: u64 = 0;
/// A store of a key whose block has no parent.
const STORED_ROOT: u64 = 1;
/// A store of a key with a parent key.
const STORED: u64 = 2;
/// A removal.
const REMOVED: u64 = 3;
/// The kind's bits.
const KIND: u64 = 0b11;
/// Where a record's group tag sits in its meta word (see [`GroupTag`]).
const GROUP_SHIFT: u32 = 8;

/// A block's group of layers as the rings record it: 0 for none, `g + 1`
/// for group `g` (groups are fewer than
/// [`KvGroups::MAX_GROUPS`](crate::KvGroups::MAX_GROUPS), so they fit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct GroupTag(u16);

impl GroupTag {
    /// No group: a [`Sequence`](crate::Sequence)'s blocks.
    pub(crate) const NONE: GroupTag = GroupTag(0);

    /// The tag of group `group`; `NONE` for a group that has no tag (past
    /// `u16::MAX - 1`, which no [`KvGroups`](crate::KvGroups) reaches).
    pub(crate) fn of(group: usize) -> GroupTag {
        u16::try_from(group)
            .ok()
            .and_then(|g| g.checked_add(1))
            .map_or(GroupTag::NONE, GroupTag)
    }

    /// The group the tag names.
    fn group(self) -> Option<usize> {
        self.0.checked_sub(1).map(usize::from)
    }
}

/// One record: a position word and the payload.
struct Slot {
    /// `p` while the slot is free for position `p`; `p + 1` once the
    /// record at position `p` is written; `p + capacity` once the consumer
    /// has read it (free for the next lap).
    seq: AtomicU64,
    /// The kind (bits 0..2), the group tag (bits 8..24) and the block id
    /// (bits 32..64).
    meta: AtomicU64,
    /// The key's four little-endian words.
    key: [AtomicU64; 4],
    /// The parent key's words (`STORED` only).
    parent: [AtomicU64; 4],
}

/// A ring's producer side.
struct Ring {
    /// The next position to reserve.
    tail: AtomicU64,
    /// Events lost to a full ring since the pool was built.
    lost: AtomicU64,
    /// The largest position at which one was lost (the tail it found).
    lost_at: AtomicU64,
}

/// A ring's consumer side (under the consumer lock).
#[derive(Default)]
struct Cursor {
    /// The next position to read.
    head: u64,
    /// `Ring::lost` as last read.
    seen_lost: u64,
    /// Lost events not reported yet, and the position before which the
    /// report goes.
    pending: u64,
    pending_at: u64,
}

/// The consumer's state: its cursors, the batch numbers, scratch lists.
struct Consumer {
    /// The sequence number of the next non-empty batch.
    next_batch: u64,
    /// Whether the first batch (with `AllBlocksCleared`) went out.
    started: bool,
    cursors: Vec<Cursor>,
    /// Per ring, the records read in this drain.
    scratch: Vec<Vec<Record>>,
    /// The merge's count of stores still to come, by key (kept between
    /// drains for its room).
    to_come: HashMap<BlockHash, u32>,
}

/// A record as the consumer reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    Stored {
        key: BlockHash,
        parent: Option<BlockHash>,
        id: BlockId,
        group: GroupTag,
    },
    Removed {
        key: BlockHash,
        group: GroupTag,
    },
    Dropped {
        count: u64,
    },
}

/// The KV event rings of a prefix cache.
pub(super) struct Events {
    rings: Box<[CachePadded<Ring>]>,
    /// `rings.len() * capacity` slots, ring after ring.
    slots: Box<[CachePadded<Slot>]>,
    /// Slots per ring (at least 2).
    capacity: usize,
    /// Per block, the [`GroupTag`] of the publish that stored its key: a
    /// removal reports the group with the key.
    groups: Box<[AtomicU16]>,
    consumer: Mutex<Consumer>,
    faults: Faults,
}

/// The room of [`Events`]' slots and group tags, reserved by
/// [`Events::room`].
pub(super) struct EventsRoom {
    slots: Room<CachePadded<Slot>>,
    groups: Room<AtomicU16>,
    rings: usize,
    capacity: usize,
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Events")
            .field("rings", &self.rings.len())
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// The `i`-th little-endian `u64` of a key.
fn key_word(key: &BlockHash, i: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&key.0[i * 8..i * 8 + 8]);
    u64::from_le_bytes(bytes)
}

/// Writes a key's words (`Relaxed`: published by the record's position
/// word, `Release`).
fn store_key(words: &[AtomicU64; 4], key: &BlockHash) {
    for (i, word) in words.iter().enumerate() {
        // Relaxed: see above.
        word.store(key_word(key, i), Ordering::Relaxed);
    }
}

/// Reads a key's words (`Relaxed`: after the `Acquire` load of the
/// record's position word).
fn load_key(words: &[AtomicU64; 4]) -> BlockHash {
    let mut key = [0u8; 32];
    for (i, word) in words.iter().enumerate() {
        // Relaxed: see above.
        key[i * 8..i * 8 + 8].copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
    }
    BlockHash(key)
}

impl Events {
    /// The slots per ring for `capacity` records over `rings` rings: an
    /// even share, at least 2.
    fn per_ring(capacity: usize, rings: usize) -> usize {
        capacity.div_ceil(rings.max(1)).max(2)
    }

    /// Reserves the room of `rings` rings sharing `capacity` records, and
    /// of the group tags of `num_blocks` blocks.
    pub(super) fn room(
        capacity: usize,
        rings: usize,
        num_blocks: usize,
    ) -> Result<EventsRoom, TryReserveError> {
        let per_ring = Events::per_ring(capacity, rings);
        Ok(EventsRoom {
            slots: Room::reserve(per_ring.saturating_mul(rings))?,
            groups: Room::reserve(num_blocks)?,
            rings,
            capacity: per_ring,
        })
    }

    /// The heap bytes [`room`](Self::room) and [`new`](Self::new) ask for.
    pub(super) fn heap_bytes(capacity: usize, rings: usize, num_blocks: usize) -> usize {
        let per_ring = Events::per_ring(capacity, rings);
        bytes_of::<CachePadded<Slot>>(per_ring.saturating_mul(rings))
            .saturating_add(bytes_of::<AtomicU16>(num_blocks))
            .saturating_add(bytes_of::<CachePadded<Ring>>(rings))
            .saturating_add(
                rings.saturating_mul(
                    std::mem::size_of::<Cursor>() + std::mem::size_of::<Vec<Record>>(),
                ),
            )
    }

    /// The rings, in the room reserved for them, every slot free.
    pub(super) fn new(room: EventsRoom, faults: Faults) -> Events {
        let capacity = room.capacity;
        let slots = room.slots.fill(|i| {
            CachePadded::new(Slot {
                seq: AtomicU64::new((i % capacity) as u64),
                meta: AtomicU64::new(0),
                key: std::array::from_fn(|_| AtomicU64::new(0)),
                parent: std::array::from_fn(|_| AtomicU64::new(0)),
            })
        });
        Events {
            rings: (0..room.rings)
                .map(|_| {
                    CachePadded::new(Ring {
                        tail: AtomicU64::new(0),
                        lost: AtomicU64::new(0),
                        lost_at: AtomicU64::new(0),
                    })
                })
                .collect(),
            slots,
            capacity,
            groups: room.groups.fill(|_| AtomicU16::new(0)),
            consumer: Mutex::new(Consumer {
                next_batch: 0,
                started: false,
                cursors: (0..room.rings).map(|_| Cursor::default()).collect(),
                scratch: (0..room.rings).map(|_| Vec::new()).collect(),
                to_come: HashMap::new(),
            }),
            faults,
        }
    }

    /// The records lost to full rings so far.
    pub(super) fn lost(&self) -> u64 {
        self.rings
            .iter()
            // Relaxed: a statistic.
            .map(|ring| ring.lost.load(Ordering::Relaxed))
            .sum()
    }

    /// Sets the group tag of block `id`, which the caller has claimed to
    /// publish and not committed yet, or holds alone and is about to claim
    /// (see `Refs::sole_unclaimed`).
    pub(super) fn set_group(&self, id: BlockId, group: GroupTag) {
        // Relaxed: published with the key words by the claim's commit
        // (Release; a sole holder's claim, written after it, is a Release
        // store too); a remover reads it after it has seen that commit
        // (Acquire) and before any later claim can rewrite it (a removal
        // takes the block first, see `Ticket::removed`).
        self.groups[id.index()].store(group.0, Ordering::Relaxed);
    }

    /// Whether a publish writes its group tag before its claim: `false`,
    /// or `true` under loom's `early_group_tag` control.
    pub(super) fn early_group_tag(&self) -> bool {
        self.faults.early_group_tag()
    }

    /// Whether an eviction takes its place after its CAS: `false`, or
    /// `true` under loom's `late_removal_record` control.
    pub(super) fn late_removal(&self) -> bool {
        self.faults.late_removal_record()
    }

    /// Whether a publish takes its place before its claim: `false`, or
    /// `true` under loom's `early_stored_record` control.
    pub(super) fn early_stored(&self) -> bool {
        self.faults.early_stored_record()
    }

    /// The ring of the key that `probe` places.
    fn ring_of(&self, probe: Probe) -> usize {
        probe.ring(self.rings.len())
    }

    /// Takes the next position of the ring of the key `probe` places, for
    /// a transition that has observed what makes it possible and has not
    /// acted yet. If the transition succeeds, the ticket is filled with its
    /// record (or, if the ring was full, the event is counted as lost);
    /// dropped unfilled, it leaves a void.
    pub(super) fn reserve(&self, probe: Probe) -> Ticket<'_> {
        let r = self.ring_of(probe);
        let place = self.place(r);
        Ticket {
            events: self,
            ring: r,
            place,
            filled: false,
        }
    }

    /// The next position of ring `r`, or the position at which the ring
    /// was found full.
    fn place(&self, r: usize) -> Place<'_> {
        let ring = &self.rings[r];
        let cap = self.capacity as u64;
        // Relaxed: only a guess; the CAS below decides.
        let mut pos = ring.tail.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[r * self.capacity + (pos % cap) as usize];
            // Acquire: synchronises with the consumer's release of the slot
            // (its `Release` store of `pos`), so its reads of the previous
            // record happen-before our writes.
            let seq = slot.seq.load(Ordering::Acquire);
            if seq == pos {
                // AcqRel on success: the reservations of a ring are ordered
                // with each other as they are in `tail`'s modification
                // order, so that an earlier position's thread happens-before
                // everything a later one's does after its reservation (the
                // ordering argument, in the module doc). Relaxed on
                // failure: we retry with the fresh value.
                match ring.tail.compare_exchange_weak(
                    pos,
                    pos + 1,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return Place::Slot { slot, pos },
                    Err(actual) => pos = actual,
                }
            } else if seq < pos {
                // The record of position `pos - capacity` is still there:
                // full.
                return Place::Full { at: pos };
            } else {
                // Another producer took `pos` meanwhile.
                // Relaxed: as above.
                pos = ring.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Counts an event of ring `r` lost at position `at` (the tail that
    /// found the ring full), once its transition has succeeded.
    fn lose(&self, r: usize, at: u64) {
        if self.faults.uncounted_loss() {
            return;
        }
        let ring = &self.rings[r];
        // Relaxed: published by the Release add below.
        ring.lost_at.fetch_max(at, Ordering::Relaxed);
        // Release: a consumer that reads this count (Acquire) reads
        // `lost_at` at least `at`.
        ring.lost.fetch_add(1, Ordering::Release);
    }

    /// Hands over the records written since the last drain, in batches of
    /// [`KvEvent`]s appended to `out` (see [`BlockPool::drain_events`]).
    pub(super) fn drain(&self, block_size: usize, out: &mut Vec<KvEvent>) -> u64 {
        let mut consumer = self
            .consumer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let consumer = &mut *consumer;
        let before = out.len();
        if !consumer.started {
            out.push(KvEvent::AllBlocksCleared);
            consumer.started = true;
        }
        for (r, (cursor, records)) in consumer
            .cursors
            .iter_mut()
            .zip(consumer.scratch.iter_mut())
            .enumerate()
        {
            records.clear();
            self.read_ring(r, cursor, records);
        }
        merge(&consumer.scratch, &mut consumer.to_come, block_size, out);
        let batch = consumer.next_batch;
        if out.len() > before {
            consumer.next_batch += 1;
        }
        batch
    }

    /// Reads ring `r` from its cursor up to the first position not written
    /// yet, into `records`, with a [`Record::Dropped`] where lost events
    /// would have been.
    fn read_ring(&self, r: usize, cursor: &mut Cursor, records: &mut Vec<Record>) {
        let ring = &self.rings[r];
        let cap = self.capacity as u64;
        // Acquire: pairs with the producer's Release add, so `lost_at` below
        // covers every loss counted here.
        let lost = ring.lost.load(Ordering::Acquire);
        if lost != cursor.seen_lost {
            cursor.pending += lost - cursor.seen_lost;
            cursor.seen_lost = lost;
            // Relaxed: ordered by the Acquire load above.
            cursor.pending_at = cursor.pending_at.max(ring.lost_at.load(Ordering::Relaxed));
        }
        loop {
            if cursor.pending > 0 && cursor.head >= cursor.pending_at {
                records.push(Record::Dropped {
                    count: cursor.pending,
                });
                cursor.pending = 0;
            }
            let pos = cursor.head;
            let slot = &self.slots[r * self.capacity + (pos % cap) as usize];
            // Acquire: synchronises with the producer's Release store of
            // `pos + 1`, so the payload read below is its record.
            if slot.seq.load(Ordering::Acquire) != pos + 1 {
                return;
            }
            // Relaxed (all): ordered by the Acquire load above.
            let meta = slot.meta.load(Ordering::Relaxed);
            let group = GroupTag((meta >> GROUP_SHIFT) as u16);
            let record = match meta & KIND {
                STORED_ROOT | STORED => Some(Record::Stored {
                    key: load_key(&slot.key),
                    parent: (meta & KIND == STORED).then(|| load_key(&slot.parent)),
                    id: BlockId::new((meta >> 32) as u32),
                    group,
                }),
                REMOVED => Some(Record::Removed {
                    key: load_key(&slot.key),
                    group,
                }),
                _ => None,
            };
            // Release: our reads of the record happen-before the writes of
            // the producer that takes the slot next (its Acquire load).
            slot.seq.store(pos + cap, Ordering::Release);
            cursor.head = pos + 1;
            records.extend(record);
        }
    }
}

/// Where a reservation landed.
enum Place<'a> {
    /// Position `pos`, in `slot`.
    Slot { slot: &'a Slot, pos: u64 },
    /// Nowhere: the ring was full when its tail was `at`.
    Full { at: u64 },
}

/// A transition's reservation: filled by [`stored`](Self::stored) or
/// [`removed`](Self::removed) once the transition succeeded (its record
/// written, or its loss counted if the ring was full), or dropped unfilled
/// if it failed (a void written in its position, if it has one).
pub(super) struct Ticket<'a> {
    events: &'a Events,
    ring: usize,
    place: Place<'a>,
    filled: bool,
}

impl Ticket<'_> {
    /// The transition stored `key` on block `id` for group `group`, whose
    /// parent key is `parent`.
    pub(super) fn stored(
        mut self,
        key: &BlockHash,
        parent: Option<&BlockHash>,
        id: BlockId,
        group: GroupTag,
    ) {
        let mut kind = STORED_ROOT;
        if let Place::Slot { slot, .. } = self.place {
            store_key(&slot.key, key);
            if let Some(parent) = parent {
                store_key(&slot.parent, parent);
                kind = STORED;
            }
        }
        self.publish(meta(id, group, kind));
    }

    /// The transition removed `key` from block `id`, which the caller has
    /// taken (an eviction's CAS succeeded, or it holds the block alone and
    /// dropped the key): no claim can rewrite the block's group tag until
    /// the caller lets it go, so the tag read here is the one its key's
    /// publish wrote.
    pub(super) fn removed(mut self, key: &BlockHash, id: BlockId) {
        if let Place::Slot { slot, .. } = self.place {
            store_key(&slot.key, key);
        }
        // Relaxed: see `Events::set_group`.
        let group = GroupTag(self.events.groups[id.index()].load(Ordering::Relaxed));
        self.publish(meta(id, group, REMOVED));
    }

    /// Writes the meta word and publishes the record; or counts the loss.
    fn publish(&mut self, meta: u64) {
        self.filled = true;
        match self.place {
            Place::Slot { slot, pos } => {
                // Relaxed: published by the Release store below.
                slot.meta.store(meta, Ordering::Relaxed);
                // Release: the consumer that reads `pos + 1` (Acquire)
                // reads the payload written before. (Relaxed under loom's
                // `relaxed_record` control.)
                slot.seq.store(
                    pos + 1,
                    self.events.faults.record_ordering(Ordering::Release),
                );
            }
            Place::Full { at } => {
                if meta != VOID {
                    self.events.lose(self.ring, at);
                }
            }
        }
    }
}

/// A record's meta word.
fn meta(id: BlockId, group: GroupTag, kind: u64) -> u64 {
    (u64::from(id.index() as u32) << 32) | (u64::from(group.0) << GROUP_SHIFT) | kind
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.filled {
            self.publish(VOID);
        }
    }
}

/// Merges the rings' records of one drain into `out`, each ring's order
/// kept but for one move: next comes a store whose parent is the key just
/// stored (it joins that key's event, unless the event's `token_count`
/// would pass `usize::MAX`), else the first ring's next record
/// that does not wait (a store waits while a store of its parent key is
/// still to come in this drain), else, every ring's next record waiting,
/// the parents' stores a next record waits for, up its chain as far as
/// they may be moved ([`Merge::climb`]), moved ahead of their rings'
/// records before them, the topmost first; else (a cycle) the first
/// ring's next record. A removal joins the removals just before it.
///
/// `to_come` counts the stores still to come by key. Returns the number
/// of parent lookups the climbs made (one hash lookup each): every lookup of a climb but its last moves a store,
/// and a climb that moves nothing is not made again until a record it
/// depends on is merged, so they stay within a few times the records and
/// rings however the chains lie.
fn merge(
    lists: &[Vec<Record>],
    to_come: &mut HashMap<BlockHash, u32>,
    block_size: usize,
    out: &mut Vec<KvEvent>,
) -> usize {
    let start = out.len();
    to_come.clear();
    for record in lists.iter().flatten() {
        if let Record::Stored { key, .. } = record {
            *to_come.entry(*key).or_default() += 1;
        }
    }
    let mut merge = Merge::new(lists);
    let mut live: Vec<usize> = (0..lists.len()).filter(|&r| !lists[r].is_empty()).collect();
    let mut last_stored: Option<BlockHash> = None;
    let mut path = Vec::new();
    while !live.is_empty() {
        let waits = |record: &Record| match record {
            Record::Stored {
                parent: Some(parent),
                ..
            } => to_come.get(parent).is_some_and(|&n| n > 0),
            _ => false,
        };
        let picked = {
            let head = |i: usize| -> (usize, usize) { (live[i], merge.next[live[i]]) };
            let continues = |i: usize| {
                let (r, j) = head(i);
                matches!(&lists[r][j], Record::Stored { parent: Some(parent), .. }
                    if last_stored.as_ref() == Some(parent))
            };
            (0..live.len())
                .find(|&i| continues(i))
                .or_else(|| {
                    (0..live.len()).find(|&i| {
                        let (r, j) = head(i);
                        !waits(&lists[r][j])
                    })
                })
                .map(head)
        };
        if picked.is_none() {
            path.clear();
            for &r in &live {
                merge.climb(r, &waits, &mut path);
                if !path.is_empty() {
                    break;
                }
            }
            if path.is_empty() {
                path.push((live[0], merge.next[live[0]]));
            }
        }
        let mut merging = Merging {
            merge: &mut merge,
            live: &mut live,
            to_come,
            last_stored: &mut last_stored,
            block_size,
            start,
            out,
        };
        // One call site, so that the common case (one record) inlines.
        let one;
        let records = match picked {
            Some(at) => {
                one = [at];
                &one[..]
            }
            None => &path[..],
        };
        // The topmost first: each next one's parent is the key before.
        for &(r, j) in records.iter().rev() {
            merging.merge_one(r, j);
        }
    }
    merge.lookups
}

/// Where [`merge`] stands: what it merges a record with.
struct Merging<'m, 'a> {
    merge: &'m mut Merge<'a>,
    live: &'m mut Vec<usize>,
    to_come: &'m mut HashMap<BlockHash, u32>,
    last_stored: &'m mut Option<BlockHash>,
    block_size: usize,
    /// Where this drain's events begin in `out`.
    start: usize,
    out: &'m mut Vec<KvEvent>,
}

impl Merging<'_, '_> {
    /// Merges record `j` of ring `r` into `out`.
    fn merge_one(&mut self, r: usize, j: usize) {
        let lists = self.merge.lists;
        self.merge.take(r, j);
        if self.merge.next[r] == lists[r].len() {
            self.live.retain(|&l| l != r);
        }
        let record = lists[r][j];
        *self.last_stored = None;
        if let Record::Stored { key, .. } = record {
            if let Some(n) = self.to_come.get_mut(&key) {
                *n -= 1;
            }
            *self.last_stored = Some(key);
        }
        let joinable = self.out.len() > self.start;
        emit(record, self.block_size, joinable, self.out);
    }
}

/// What [`merge`] knows of the records besides their lists: which are
/// merged and, once a store must be moved ([`Merge::climb`]), an index to
/// find a parent's store in one lookup.
struct Merge<'a> {
    lists: &'a [Vec<Record>],
    /// Per ring, the first record not merged yet.
    next: Vec<usize>,
    /// Built at the first climb: most drains never move a store.
    index: Option<Index>,
    /// The parent lookups the climbs made.
    lookups: usize,
}

/// The records not merged yet, by key and ring.
struct Index {
    /// Per ring, whether each record is merged (before the index, a ring's
    /// records are merged in order: those before `next`).
    taken: Vec<Vec<bool>>,
    /// Per key, the ring that holds that key's records (a key's records
    /// all go to one ring) and the first of them (a store or a removal)
    /// not merged yet, [`NONE`] once all are. A key met in two rings (which
    /// the rings' keyed hash rules out) would have the ring [`NONE`]: it is
    /// never looked up as a parent's.
    first: HashMap<BlockHash, (usize, usize)>,
    /// Per ring, per record of a key, the next record of that key in the
    /// ring ([`NONE`] for the last).
    next_of_key: Vec<Vec<usize>>,
    /// Per ring, where its lost-events markers not merged when the index
    /// was built lie, and how many of them are merged since (they are
    /// merged in order, never moved).
    losses: Vec<Vec<usize>>,
    losses_merged: Vec<usize>,
    /// Per ring, the climb from its next record that found no store to
    /// move, kept until something it depends on is merged.
    blocked: Vec<Option<Blocked>>,
    /// Per key, the rings whose climb is blocked at that key.
    blocked_on: HashMap<BlockHash, Vec<usize>>,
    /// Per ring, per record, the climb that last put it on its path (a
    /// record met twice in one climb is a cycle).
    on_path: Vec<Vec<usize>>,
    /// The climbs so far.
    climbs: usize,
}

/// A climb from a ring's next record that found no store to move: its
/// parent's first record not merged yet is a removal, or lies past lost
/// events in its ring. Nothing changes that but the merge of one of that
/// key's records, of those lost events, or of the ring's next record.
#[derive(Clone, Copy)]
struct Blocked {
    /// The ring's next record then.
    next: usize,
    /// The parent key.
    on: BlockHash,
    /// The ring whose lost events were in the way, if they were.
    losses_in: Option<usize>,
}

/// No record.
const NONE: usize = usize::MAX;

impl<'a> Merge<'a> {
    fn new(lists: &'a [Vec<Record>]) -> Merge<'a> {
        Merge {
            lists,
            next: vec![0; lists.len()],
            index: None,
            lookups: 0,
        }
    }

    /// The index of the records not merged yet: those from each ring's
    /// next record on, none of them merged (no store was moved before).
    fn build_index(&self) -> Index {
        let mut first: HashMap<BlockHash, (usize, usize)> = HashMap::new();
        let mut in_ring = HashMap::new();
        let mut next_of_key = Vec::with_capacity(self.lists.len());
        let mut losses = Vec::with_capacity(self.lists.len());
        for (r, list) in self.lists.iter().enumerate() {
            let mut links = vec![NONE; list.len()];
            let mut lost = Vec::new();
            in_ring.clear();
            // Backwards: each record links to the later one met before it.
            for j in (self.next[r]..list.len()).rev() {
                match record_key(&list[j]) {
                    Some(key) => {
                        let later = in_ring.insert(*key, j);
                        links[j] = later.unwrap_or(NONE);
                    }
                    None => lost.push(j),
                }
            }
            for (&key, &j) in &in_ring {
                first
                    .entry(key)
                    .and_modify(|at| at.0 = NONE)
                    .or_insert((r, j));
            }
            lost.reverse();
            next_of_key.push(links);
            losses.push(lost);
        }
        Index {
            taken: self
                .lists
                .iter()
                .zip(&self.next)
                .map(|(list, &next)| (0..list.len()).map(|j| j < next).collect())
                .collect(),
            first,
            next_of_key,
            losses,
            losses_merged: vec![0; self.lists.len()],
            blocked: vec![None; self.lists.len()],
            blocked_on: HashMap::new(),
            on_path: self.lists.iter().map(|list| vec![0; list.len()]).collect(),
            climbs: 0,
        }
    }

    /// Marks record `j` of ring `r` merged: the first of its key in its
    /// ring not merged yet (its ring's next record, or a store moved
    /// ahead).
    fn take(&mut self, r: usize, j: usize) {
        let Some(index) = &mut self.index else {
            debug_assert_eq!(j, self.next[r], "before a move, records merge in order");
            self.next[r] += 1;
            return;
        };
        index.taken[r][j] = true;
        match record_key(&self.lists[r][j]) {
            Some(key) => {
                let key = *key;
                if let Some(at) = index.first.get_mut(&key) {
                    if at.0 == r {
                        debug_assert_eq!(at.1, j, "a key's records merge in order");
                        at.1 = index.next_of_key[r][j];
                    }
                }
                // The climbs blocked at this key may move a store now.
                for q in index.blocked_on.remove(&key).unwrap_or_default() {
                    if index.blocked[q].is_some_and(|b| b.on == key) {
                        index.blocked[q] = None;
                    }
                }
            }
            None => {
                index.losses_merged[r] += 1;
                for blocked in &mut index.blocked {
                    if blocked.is_some_and(|b| b.losses_in == Some(r)) {
                        *blocked = None;
                    }
                }
            }
        }
        let list = &self.lists[r];
        while self.next[r] < list.len() && index.taken[r][self.next[r]] {
            self.next[r] += 1;
        }
    }

    /// Fills `path` (empty) with the stores that ring `r`'s next record
    /// (waiting for its parent's store) waits for, up its chain: its
    /// parent's store, if it may be moved ahead of the records before it
    /// in its ring, then that store's parent's if it waits in turn, and so
    /// on while the next may be moved. A store moves ahead of other keys'
    /// records only: not past a removal of its key, nor past lost events
    /// (which may have held one), so each key's records keep their order,
    /// as [`crate::BlockPool::drain_events`] documents. Left empty when the
    /// first is not found (a removal or lost events in the way), which is
    /// remembered until one of the records it depends on is merged.
    fn climb(&mut self, r: usize, waits: &dyn Fn(&Record) -> bool, path: &mut Vec<(usize, usize)>) {
        let lists = self.lists;
        if self.index.is_none() {
            self.index = Some(self.build_index());
        }
        let Some(index) = &mut self.index else {
            return;
        };
        let head = self.next[r];
        if index.blocked[r].is_some_and(|b| b.next == head) {
            return;
        }
        index.climbs += 1;
        let mut record = &lists[r][head];
        while let Record::Stored {
            parent: Some(parent),
            ..
        } = record
        {
            // The first record of `parent` not merged yet, if it is a
            // store of that very key before any lost events not merged
            // yet in its ring.
            self.lookups += 1;
            let key = *parent;
            let mut losses_in = None;
            let found = index.first.get(&key).and_then(|&(q, j)| {
                let record = lists.get(q)?.get(j)?;
                if !matches!(record, Record::Stored { key, .. } if key == parent) {
                    return None;
                }
                match index.losses[q].get(index.losses_merged[q]) {
                    Some(&lost) if lost < j => {
                        losses_in = Some(q);
                        None
                    }
                    _ => Some((q, j)),
                }
            });
            let Some(at) = found else {
                if path.is_empty() {
                    index.blocked[r] = Some(Blocked {
                        next: head,
                        on: key,
                        losses_in,
                    });
                    index.blocked_on.entry(key).or_default().push(r);
                }
                break;
            };
            // A record met again is a cycle (a chain of keys that repeats
            // one, which only keys a caller made up can form).
            if index.on_path[at.0][at.1] == index.climbs {
                break;
            }
            index.on_path[at.0][at.1] = index.climbs;
            path.push(at);
            record = &lists[at.0][at.1];
            if !waits(record) {
                break;
            }
        }
    }
}

/// The key a record stores or removes (`None` for lost events).
fn record_key(record: &Record) -> Option<&BlockHash> {
    match record {
        Record::Stored { key, .. } | Record::Removed { key, .. } => Some(key),
        Record::Dropped { .. } => None,
    }
}

/// Appends `record` to `out`, joining the last event if it is one this
/// drain appended (`joinable`) and of the same run: a store of the same
/// group whose parent is the last key stored, a removal of the same group
/// after removals.
fn emit(record: Record, block_size: usize, joinable: bool, out: &mut Vec<KvEvent>) {
    match record {
        Record::Stored {
            key,
            parent,
            id,
            group,
        } => {
            let group = group.group();
            if let (
                true,
                Some(KvEvent::BlockStored {
                    keys,
                    block_ids,
                    token_count,
                    group: last_group,
                    ..
                }),
            ) = (joinable, out.last_mut())
            {
                // Keys are any 32 bytes, so a run can name more blocks than
                // the pool holds: it is cut where its token count would
                // pass `usize::MAX` (the next event's parent is this one's
                // last key).
                let joined = token_count.checked_add(block_size);
                if let (true, Some(tokens)) = (
                    parent.is_some() && keys.last() == parent.as_ref() && *last_group == group,
                    joined,
                ) {
                    keys.push(key);
                    block_ids.push(id);
                    *token_count = tokens;
                    return;
                }
            }
            out.push(KvEvent::BlockStored {
                keys: vec![key],
                parent,
                block_ids: vec![id],
                block_size,
                token_count: block_size,
                group,
            });
        }
        Record::Removed { key, group } => {
            let group = group.group();
            if let (
                true,
                Some(KvEvent::BlockRemoved {
                    keys,
                    group: last_group,
                }),
            ) = (joinable, out.last_mut())
            {
                if *last_group == group {
                    keys.push(key);
                    return;
                }
            }
            out.push(KvEvent::BlockRemoved {
                keys: vec![key],
                group,
            });
        }
        Record::Dropped { count } => out.push(KvEvent::Dropped { count }),
    }
}

impl BlockPool {
    /// Appends the KV events recorded since the last call to `out`, as one
    /// batch, and returns the batch's sequence number; for a pool built
    /// with [`kv_events`](crate::BlockPoolBuilder::kv_events).
    ///
    /// Batches that append at least one event are numbered 0, 1, 2, ... in
    /// the order of the calls that drain them; a call that appends nothing
    /// returns the number that the next non-empty batch will carry, and
    /// uses nothing up. So a gap in the numbers a consumer forwards means
    /// a batch it lost in transit, never one the pool skipped. The first
    /// batch starts with [`KvEvent::AllBlocksCleared`]. A pool without KV
    /// events appends nothing and returns 0.
    ///
    /// # What a batch holds
    ///
    /// Every store and removal of a key whose record is written, minus the
    /// events lost to a full ring, which are reported as
    /// [`KvEvent::Dropped`] in their place. Nothing is reported twice.
    ///
    /// * **Per key**: in the order of the key's transitions, across
    ///   batches too: a key's store comes before its removal, and its
    ///   removal from one block before its store on another. So applying
    ///   the events in order to a set of keys gives the keys the pool
    ///   caches, as of the latest transition reported for each.
    /// * **Across keys**: a key's events all go to one ring (one per
    ///   free-list shard, picked by a hash of the key). Within a ring, the
    ///   order is that of the reservations, which agrees with
    ///   happens-before; across rings there is no order. One rule holds
    ///   across rings and within one: a store comes after the store of its
    ///   parent key when both are in the same batch, unless a removal of
    ///   the parent's key, or lost events, come before the parent's store
    ///   in its ring. (A parent's store recorded after its child's, as
    ///   when a [`HybridSequence`](crate::HybridSequence)'s sliding group
    ///   publishes blocks past one its window gave back and another
    ///   request then publishes that one, is moved ahead of the child's.)
    ///   A batch holds what was written when the call
    ///   read each ring: a record whose producer is still writing it (for
    ///   the length of one CAS) waits for the next call, with the records
    ///   of its ring behind it.
    /// * **Coalescing**: consecutive stores of a chain (each key's parent
    ///   the key before it) form one [`KvEvent::BlockStored`], with the
    ///   first one's parent; consecutive removals one
    ///   [`KvEvent::BlockRemoved`].
    ///
    /// Producers never wait for the consumer: a ring that is full when a
    /// key is stored or removed loses that event (counted, in
    /// [`stats`](Self::stats)`().events_dropped` too). Calls to this method
    /// are serialised with each other by a lock that no producer takes;
    /// the consumer's own work (the merge) allocates.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kvslots::{hash_blocks, BlockPool, KvEvent, Sequence};
    ///
    /// let pool = Arc::new(BlockPool::builder(2, 4).prefix_cache(true).kv_events(16).build()?);
    /// let mut keys = Vec::new();
    /// hash_blocks(b"", &[1, 2, 3, 4, 5, 6, 7, 8], 4, &mut keys);
    /// let mut seq = Sequence::new(Arc::clone(&pool));
    /// seq.try_append(8)?;
    /// seq.publish(&keys);
    /// drop(seq); // both blocks stay cached, evictable
    ///
    /// let mut events = Vec::new();
    /// assert_eq!(pool.drain_events(&mut events), 0);
    /// assert_eq!(events.len(), 2); // AllBlocksCleared, BlockStored
    ///
    /// // An allocation that needs both blocks evicts both keys.
    /// let mut ids = Vec::new();
    /// pool.try_alloc(2, &mut ids)?;
    /// events.clear();
    /// assert_eq!(pool.drain_events(&mut events), 1);
    /// assert!(matches!(&events[..], [KvEvent::BlockRemoved { keys, group: None }] if keys.len() == 2));
    ///
    /// events.clear();
    /// assert_eq!(pool.drain_events(&mut events), 2); // nothing new: the next number
    /// assert!(events.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn drain_events(&self, out: &mut Vec<KvEvent>) -> u64 {
        match self
            .prefix
            .as_deref()
            .and_then(|cache| cache.events.as_ref())
        {
            Some(events) => events.drain(self.block_size, out),
            None => 0,
        }
    }

    /// Whether the pool records KV events (see
    /// [`BlockPoolBuilder::kv_events`](crate::BlockPoolBuilder::kv_events)).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::BlockPool;
    ///
    /// assert!(!BlockPool::new(64, 16).has_kv_events());
    /// let pool = BlockPool::builder(64, 16).prefix_cache(true).kv_events(256).build().unwrap();
    /// assert!(pool.has_kv_events());
    /// ```
    pub fn has_kv_events(&self) -> bool {
        self.prefix
            .as_deref()
            .is_some_and(|cache| cache.events.is_some())
    }
}

#[cfg(all(test, not(any(kvslots_loom, kvslots_shuttle))))]
mod tests {
    use super::*;

    fn key(n: u8) -> BlockHash {
        BlockHash([n; 32])
    }

    /// One ring of `capacity` slots.
    fn ring(capacity: usize) -> Events {
        Events::new(Events::room(capacity, 1, 16).unwrap(), Faults::default())
    }

    /// A probe for the one ring.
    fn probe() -> Probe {
        Probe::for_ring(0)
    }

    fn drain(events: &Events) -> Vec<KvEvent> {
        let mut out = Vec::new();
        events.drain(4, &mut out);
        out
    }

    #[test]
    fn a_lost_event_is_reported_where_it_would_have_been() {
        let events = ring(2);
        drain(&events); // the first batch's AllBlocksCleared
        let first = events.reserve(probe());
        events.reserve(probe()).removed(&key(2), BlockId::new(1));
        // Full: a failed transition's reservation leaves nothing, a
        // successful one's is lost at position 2.
        drop(events.reserve(probe()));
        assert_eq!(events.lost(), 0);
        events.reserve(probe()).removed(&key(3), BlockId::new(2));
        assert_eq!(events.lost(), 1);
        // The consumer stops at the unwritten position 0: nothing yet, and
        // the loss waits behind it.
        assert!(drain(&events).is_empty());
        first.stored(&key(1), None, BlockId::new(0), GroupTag::NONE);
        assert_eq!(
            drain(&events),
            [
                KvEvent::BlockStored {
                    keys: vec![key(1)],
                    parent: None,
                    block_ids: vec![BlockId::new(0)],
                    block_size: 4,
                    token_count: 4,
                    group: None,
                },
                KvEvent::BlockRemoved {
                    keys: vec![key(2)],
                    group: None
                },
                KvEvent::Dropped { count: 1 },
            ]
        );
        // The ring has room again.
        events.reserve(probe()).removed(&key(1), BlockId::new(0));
        assert_eq!(
            drain(&events),
            [KvEvent::BlockRemoved {
                keys: vec![key(1)],
                group: None
            }]
        );
    }

    #[test]
    fn a_failed_transition_leaves_a_void() {
        let events = ring(4);
        drain(&events);
        drop(events.reserve(probe()));
        events.reserve(probe()).removed(&key(3), BlockId::new(0));
        assert_eq!(
            drain(&events),
            [KvEvent::BlockRemoved {
                keys: vec![key(3)],
                group: None
            }]
        );
    }

    #[test]
    fn batches_are_numbered_when_not_empty() {
        let events = ring(4);
        let mut out = Vec::new();
        assert_eq!(events.drain(4, &mut out), 0);
        assert_eq!(out, [KvEvent::AllBlocksCleared]);
        assert_eq!(events.drain(4, &mut out), 1);
        assert_eq!(events.drain(4, &mut out), 1);
        events.reserve(probe()).removed(&key(3), BlockId::new(0));
        assert_eq!(events.drain(4, &mut out), 1);
        assert_eq!(events.drain(4, &mut out), 2);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn merge_puts_parents_first_and_joins_chains() {
        let stored = |k: u8, p: Option<u8>, id: u32| Record::Stored {
            key: key(k),
            parent: p.map(key),
            id: BlockId::new(id),
            group: GroupTag::NONE,
        };
        // Ring 0 has the chain's second and fourth keys, ring 1 the first
        // and third, and a removal of another key first.
        let lists = vec![
            vec![stored(2, Some(1), 1), stored(4, Some(3), 3)],
            vec![
                Record::Removed {
                    key: key(9),
                    group: GroupTag::NONE,
                },
                stored(1, None, 0),
                stored(3, Some(2), 2),
            ],
        ];
        let mut out = Vec::new();
        merge(&lists, &mut HashMap::new(), 4, &mut out);
        assert_eq!(
            out,
            [
                KvEvent::BlockRemoved {
                    keys: vec![key(9)],
                    group: None
                },
                KvEvent::BlockStored {
                    keys: vec![key(1), key(2), key(3), key(4)],
                    parent: None,
                    block_ids: (0..4).map(BlockId::new).collect(),
                    block_size: 4,
                    token_count: 16,
                    group: None,
                },
            ]
        );
    }

    /// The keys of `lists` merged, in the order of their records: `(true,
    /// k)` a store of `key(k)`, `(false, k)` a removal, `(false, 255)` lost
    /// events.
    fn merged_keys(lists: &[Vec<Record>]) -> Vec<(bool, u8)> {
        let mut out = Vec::new();
        merge(lists, &mut HashMap::new(), 4, &mut out);
        let name = |k: &BlockHash| (0..u8::MAX).find(|&i| key(i) == *k).unwrap();
        out.iter()
            .flat_map(|e| match e {
                KvEvent::BlockStored { keys, .. } => keys.iter().map(|k| (true, name(k))).collect(),
                KvEvent::BlockRemoved { keys, .. } => {
                    keys.iter().map(|k| (false, name(k))).collect()
                }
                KvEvent::Dropped { .. } => vec![(false, u8::MAX)],
                _ => Vec::new(),
            })
            .collect()
    }

    fn stored(k: u8, p: Option<u8>) -> Record {
        Record::Stored {
            key: key(k),
            parent: p.map(key),
            id: BlockId::new(u32::from(k)),
            group: GroupTag::NONE,
        }
    }

    fn removed(k: u8) -> Record {
        Record::Removed {
            key: key(k),
            group: GroupTag::NONE,
        }
    }

    #[test]
    fn merge_moves_a_parent_ahead_when_every_head_waits() {
        // Each ring's head waits for a store behind the other's head.
        let lists = vec![
            vec![stored(1, Some(4)), stored(3, Some(9))],
            vec![stored(2, Some(3)), stored(4, Some(9))],
        ];
        let order = merged_keys(&lists);
        let pos = |k: u8| order.iter().position(|&x| x == (true, k)).unwrap();
        assert_eq!(order.len(), 4);
        assert!(pos(4) < pos(1) && pos(3) < pos(2));
    }

    #[test]
    fn merge_moves_no_store_while_a_head_does_not_wait() {
        // Ring 1's first and third stores wait for key 0 until ring 2
        // stores it; stored, it no longer holds them back, and the third
        // goes before key 4's store behind it, for which ring 0's head
        // waits: no store is moved, since a head did not wait.
        let lists = vec![
            vec![stored(3, Some(4))],
            vec![
                stored(2, Some(0)),
                removed(7),
                stored(1, Some(0)),
                stored(4, None),
            ],
            vec![stored(0, None)],
        ];
        assert_eq!(
            merged_keys(&lists),
            [
                (true, 0),
                (true, 2),
                (false, 7),
                (true, 1),
                (true, 4),
                (true, 3)
            ]
        );
    }

    #[test]
    fn merge_looks_past_a_moved_store_for_its_keys_next_record() {
        // Key 0's first store is moved ahead for key 1; then every head
        // waits again, ring 0's for key 0's second store, behind its
        // removal: a climb from there finds the removal, not the store
        // merged already, and the climb from ring 1 moves key 3's store.
        let lists = vec![
            vec![stored(1, Some(0)), stored(3, Some(0))],
            vec![
                stored(2, Some(1)),
                stored(0, None),
                stored(4, Some(3)),
                removed(0),
                stored(0, None),
            ],
        ];
        assert_eq!(
            merged_keys(&lists),
            [
                (true, 0),
                (true, 1),
                (true, 2),
                (true, 3),
                (true, 4),
                (false, 0),
                (true, 0)
            ]
        );
    }

    #[test]
    fn merge_climbs_again_once_what_blocked_a_climb_is_merged() {
        // Every head waits: ring 0's climb for key 0's store is blocked by
        // a removal of key 0 (or lost events) before it in ring 1, and
        // ring 1's climb moves key 9's store. Once the removal (or the
        // loss) is merged and every head waits again, ring 0 climbs again
        // and moves key 0's store ahead of its child; ring 1's climb, for
        // key 11 behind its removal, is blocked, and its head goes next.
        for (before, merged) in [
            (removed(0), (false, 0)),
            (Record::Dropped { count: 1 }, (false, u8::MAX)),
        ] {
            let lists = vec![
                vec![stored(1, Some(0))],
                vec![
                    stored(5, Some(9)),
                    before,
                    stored(6, Some(11)),
                    removed(11),
                    stored(11, None),
                    stored(0, None),
                ],
                vec![stored(12, Some(5)), stored(9, None)],
            ];
            assert_eq!(
                merged_keys(&lists),
                [
                    (true, 9),
                    (true, 5),
                    (true, 12),
                    merged,
                    (true, 0),
                    (true, 1),
                    (true, 6),
                    (false, 11),
                    (true, 11)
                ]
            );
        }
    }

    #[test]
    fn merge_moves_a_parent_ahead_within_one_ring() {
        // A sliding window's chain published before its first block, then
        // that block (its parent none): one ring, one chain.
        let lists = vec![vec![
            stored(1, Some(0)),
            stored(2, Some(1)),
            removed(7),
            stored(0, None),
        ]];
        assert_eq!(
            merged_keys(&lists),
            [(true, 0), (true, 1), (true, 2), (false, 7)]
        );
        // And up a chain: the parent's own parent is later still.
        let lists = vec![vec![
            stored(2, Some(1)),
            stored(1, Some(0)),
            stored(0, None),
        ]];
        assert_eq!(merged_keys(&lists), [(true, 0), (true, 1), (true, 2)]);
    }

    #[test]
    fn merge_moves_a_long_chain_in_lookups_linear_in_its_length() {
        // From a helper's attack: one ring holding a chain stored child
        // first (a sliding window's requests, each publishing its last
        // block, run from the end backwards) took a climb per record, each
        // rescanning the ring: 26 s for 4,096 records.
        let n = 1 << 12;
        let chain_key = |i: u32| {
            let mut k = [0u8; 32];
            k[..4].copy_from_slice(&i.to_le_bytes());
            k[4] = 1;
            BlockHash(k)
        };
        let lists = vec![(0..n)
            .rev()
            .map(|i| Record::Stored {
                key: chain_key(i),
                parent: i.checked_sub(1).map(chain_key),
                id: BlockId::new(i),
                group: GroupTag::NONE,
            })
            .collect::<Vec<_>>()];
        let mut out = Vec::new();
        let lookups = merge(&lists, &mut HashMap::new(), 4, &mut out);
        // A lookup for each of the `n - 1` stores moved, at least.
        assert!(
            (n as usize - 1..=2 * n as usize).contains(&lookups),
            "{lookups} lookups for {n} records"
        );
        // One chain, parent first.
        let [KvEvent::BlockStored { keys, parent, .. }] = &out[..] else {
            panic!("one event: {}", out.len());
        };
        assert_eq!(*parent, None);
        assert!(keys.iter().copied().eq((0..n).map(chain_key)));
    }

    #[test]
    fn merge_does_not_climb_again_from_a_blocked_record() {
        // From a second attack: every ring's next record waits for a parent
        // whose key is removed before it is stored again, so no store can
        // move; each ring's climb was made again after every record merged
        // (8,256 lookups for 384 records; at 1,024 rings, 87 s in debug).
        let key_of = |ring: usize, which: u8| {
            let mut k = [0u8; 32];
            k[..8].copy_from_slice(&(ring as u64).to_le_bytes());
            k[8] = which;
            BlockHash(k)
        };
        let rings = 128;
        let lists: Vec<Vec<Record>> = (0..rings)
            .map(|r| {
                vec![
                    Record::Stored {
                        key: key_of(r, 1),
                        parent: Some(key_of(r, 2)),
                        id: BlockId::new(0),
                        group: GroupTag::NONE,
                    },
                    Record::Removed {
                        key: key_of(r, 2),
                        group: GroupTag::NONE,
                    },
                    Record::Stored {
                        key: key_of(r, 2),
                        parent: None,
                        id: BlockId::new(1),
                        group: GroupTag::NONE,
                    },
                ]
            })
            .collect();
        let mut out = Vec::new();
        let lookups = merge(&lists, &mut HashMap::new(), 4, &mut out);
        assert!(
            lookups <= 2 * rings,
            "{lookups} lookups for {} records",
            3 * rings
        );
        // Each ring as it was: its child, the removal, the store again.
        let stored = out
            .iter()
            .filter(|e| matches!(e, KvEvent::BlockStored { .. }))
            .count();
        assert_eq!(stored, 2 * rings);
    }

    #[test]
    fn merge_moves_no_store_past_its_keys_removal_or_a_loss() {
        // The parent's key is removed before its store: its records keep
        // their order, so the child goes first, as its ring had it.
        let lists = vec![vec![stored(1, Some(0)), removed(0), stored(0, None)]];
        assert_eq!(merged_keys(&lists), [(true, 1), (false, 0), (true, 0)]);
        // Lost events may have held such a removal.
        let lists = vec![vec![
            stored(1, Some(0)),
            Record::Dropped { count: 1 },
            stored(0, None),
        ]];
        assert_eq!(
            merged_keys(&lists),
            [(true, 1), (false, u8::MAX), (true, 0)]
        );
    }

    proptest::proptest! {
        /// Random drains (keys 0..24, each key's records in one ring, lost
        /// events in any ring, a key's parent a smaller key, so no cycle):
        /// every record merged once, each key's records keep their ring's
        /// order, and a store comes after its parent's store in the batch
        /// unless, in the parent's ring, a removal of the parent's key or
        /// lost events come before that store. (Widened by a second
        /// attack: keys placed in rings at random.)
        #[test]
        fn merge_keeps_each_keys_order_and_puts_parents_first(
            rings in 1usize..9,
            place in proptest::collection::vec(0usize..8, 24),
            ops in proptest::collection::vec((0u8..24, 0u8..25, 0u8..12), 0..80),
        ) {
            let ring_of = |k: u8| place[usize::from(k)] % rings;
            let mut lists = vec![Vec::new(); rings];
            for (k, p, kind) in ops {
                let (record, ring) = match kind {
                    0 => (Record::Dropped { count: 1 }, usize::from(p) % rings),
                    1..=3 => (removed(k), ring_of(k)),
                    _ => (stored(k, (p < k).then_some(p)), ring_of(k)),
                };
                lists[ring].push(record);
            }
            let order = merged_keys(&lists);
            // Dropped records make one event each; the rest one a key.
            let records = lists.iter().flatten().count();
            proptest::prop_assert_eq!(order.len(), records);
            let losses = lists.iter().flatten().filter(|r| matches!(r, Record::Dropped { .. })).count();
            proptest::prop_assert_eq!(order.iter().filter(|e| *e == &(false, u8::MAX)).count(), losses);
            for k in 0..24u8 {
                let want: Vec<(bool, u8)> = lists[ring_of(k)]
                    .iter()
                    .filter_map(|r| match r {
                        Record::Stored { key: x, .. } if *x == key(k) => Some((true, k)),
                        Record::Removed { key: x, .. } if *x == key(k) => Some((false, k)),
                        _ => None,
                    })
                    .collect();
                let got: Vec<(bool, u8)> = order.iter().copied().filter(|e| e.1 == k).collect();
                proptest::prop_assert_eq!(got, want);
            }
            for list in &lists {
                for (i, record) in list.iter().enumerate() {
                    let Record::Stored { key: child, parent: Some(parent), .. } = record else {
                        continue;
                    };
                    // This is the child key's `nth` store (of its ring, so
                    // of the batch: its records keep their order).
                    let nth = list[..i]
                        .iter()
                        .filter(|r| matches!(r, Record::Stored { key, .. } if key == child))
                        .count();
                    let p = parent.0[0];
                    // The parent's first store in its ring, and whether a
                    // removal of its key or lost events come before it.
                    let ring = &lists[ring_of(p)];
                    let Some(first) = ring.iter().position(
                        |r| matches!(r, Record::Stored { key, .. } if key == parent),
                    ) else {
                        continue;
                    };
                    let blocked = ring[..first].iter().any(|r| match r {
                        Record::Removed { key, .. } => key == parent,
                        Record::Dropped { .. } => true,
                        Record::Stored { .. } => false,
                    });
                    if blocked {
                        continue;
                    }
                    let c = child.0[0];
                    let parent_at = order.iter().position(|&e| e == (true, p)).unwrap();
                    let child_at = order
                        .iter()
                        .enumerate()
                        .filter(|(_, &e)| e == (true, c))
                        .nth(nth)
                        .unwrap()
                        .0;
                    proptest::prop_assert!(
                        parent_at < child_at,
                        "{c}'s store before its parent {p}'s: {order:?} from {lists:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn group_tags_round_trip_and_keep_groups_apart() {
        assert_eq!(GroupTag::NONE.group(), None);
        for g in [0, 1, 1023, usize::from(u16::MAX) - 1] {
            assert_eq!(GroupTag::of(g).group(), Some(g));
        }
        assert_eq!(GroupTag::of(usize::from(u16::MAX)), GroupTag::NONE);
        let events = ring(8);
        drain(&events);
        // A chain whose second key is stored for another group, and
        // removals of two groups: nothing joins across groups.
        let tags = [GroupTag::of(0), GroupTag::of(1), GroupTag::of(1)];
        for (i, tag) in tags.into_iter().enumerate() {
            let id = BlockId::new(i as u32);
            events.set_group(id, tag);
            let parent = i.checked_sub(1).map(|p| key(p as u8));
            events
                .reserve(probe())
                .stored(&key(i as u8), parent.as_ref(), id, tag);
        }
        for i in 0..3 {
            events
                .reserve(probe())
                .removed(&key(i), BlockId::new(u32::from(i)));
        }
        let stored = |keys: &[u8], parent: Option<u8>, group| KvEvent::BlockStored {
            keys: keys.iter().map(|&k| key(k)).collect(),
            parent: parent.map(key),
            block_ids: keys.iter().map(|&k| BlockId::new(u32::from(k))).collect(),
            block_size: 4,
            token_count: 4 * keys.len(),
            group,
        };
        assert_eq!(
            drain(&events),
            [
                stored(&[0], None, Some(0)),
                stored(&[1, 2], Some(0), Some(1)),
                KvEvent::BlockRemoved {
                    keys: vec![key(0)],
                    group: Some(0)
                },
                KvEvent::BlockRemoved {
                    keys: vec![key(1), key(2)],
                    group: Some(1)
                },
            ]
        );
    }
}
