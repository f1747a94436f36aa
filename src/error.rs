//! Error types: every refusal is typed, and a refused call changes nothing
//! (the one exception is [`FreeError::Raced`]).

use std::fmt;

use crate::id::BlockId;

/// Why a reservation (or a block allocation) was refused.
///
/// A refused call changes nothing: no slot is taken and no output is
/// written. Counts are in the unit of the allocator that refused: token
/// slots for a [`SlotCounter`](crate::SlotCounter), blocks for a
/// [`BlockPool`](crate::BlockPool). `requested` never includes the
/// headroom a call asked to leave free besides (the `_with_headroom` and
/// `reserve` calls): the refusal compared `requested + headroom` with what
/// was free, or with the capacity, and the caller knows its headroom. The
/// messages say so where the numbers alone would not explain the refusal.
///
/// # Examples
///
/// ```
/// use kvslots::{ReserveError, SlotCounter};
///
/// let counter = SlotCounter::new(4);
/// let _held = counter.try_reserve(3).unwrap();
/// assert_eq!(
///     counter.try_reserve(2).unwrap_err(),
///     ReserveError::Full { requested: 2, available: 1 }
/// );
/// assert_eq!(
///     counter.try_reserve(5).unwrap_err(),
///     ReserveError::NeverFits { requested: 5, capacity: 4 }
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReserveError {
    /// Not enough free right now; it may fit once others release.
    ///
    /// `available` is a value the allocator really held at the moment it
    /// refused (the linearization point of the refusal), not a later guess,
    /// and it is less than `requested` plus the headroom the call asked to
    /// leave free (so `available >= requested` only when headroom was asked
    /// for).
    Full {
        /// What the caller asked for, without its headroom.
        requested: usize,
        /// What was free when the request was refused.
        available: usize,
    },
    /// Enough was free for the request (and its headroom), but not beside
    /// what the queued waiters are owed: a new `try_*` admission does not
    /// pass the wait queue ([`SlotCounter::reserve`](crate::SlotCounter::reserve),
    /// [`BlockPool::alloc`](crate::BlockPool::alloc) and their kin). It
    /// may fit once the waiters are served; retryable, like `Full`.
    ///
    /// At the moment of the refusal (its linearization point), `available`
    /// units were free, with `requested + headroom <= available <
    /// requested + headroom + owed`. `owed` is what the waiters then queued
    /// needed to be granted, each in arrival order with its own headroom
    /// free (see [Waiting](crate::implementation#waiting)). Only calls that
    /// admit something new get it; the growth of what a caller already
    /// holds (the `try_grow` of a guard that holds slots, an append to a
    /// [`Sequence`](crate::Sequence) that holds a block beyond the prefix
    /// it matched or that matched into a reservation and holds a block, a
    /// fork of one) does not wait behind the queue. A future never resolves to it; a blocking
    /// call whose timeout runs out returns its last attempt's refusal,
    /// which may be this one.
    BehindWaiters {
        /// What the caller asked for, without its headroom.
        requested: usize,
        /// What was free when the request was refused.
        available: usize,
        /// What the queued waiters were owed: the units a new admission
        /// had to leave free for them.
        owed: usize,
    },
    /// The request (plus any headroom asked for) is larger than all the
    /// caller could ever be given: it can never be admitted, so a
    /// scheduler must reject it outright instead of retrying or waiting.
    ///
    /// `capacity` is the allocator's whole capacity, except for a
    /// [`Sequence`](crate::Sequence)'s calls, which cannot be given the
    /// blocks the sequence itself holds while it asks: there it is the
    /// pool's blocks less those (a sequence that holds 1 block of a pool
    /// of 8 and asks for 8 more gets `NeverFits { requested: 8, capacity:
    /// 7 }`, from the `try_*`, blocking and async forms alike).
    NeverFits {
        /// What the caller asked for, without its headroom (so
        /// `requested <= capacity` only when headroom was asked for).
        requested: usize,
        /// The most the caller could ever be given.
        capacity: usize,
    },
    /// The allocator was closed ([`SlotCounter::close`](crate::SlotCounter::close),
    /// [`BlockPool::close`](crate::BlockPool::close)): it admits nothing more,
    /// while releases still work so workers can drain.
    Closed,
}

impl ReserveError {
    /// Whether retrying the same request later can succeed (only
    /// [`ReserveError::Full`] and [`ReserveError::BehindWaiters`] are
    /// transient).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvslots::ReserveError;
    ///
    /// assert!(ReserveError::Full { requested: 2, available: 1 }.is_retryable());
    /// assert!(ReserveError::BehindWaiters { requested: 2, available: 3, owed: 2 }.is_retryable());
    /// assert!(!ReserveError::NeverFits { requested: 9, capacity: 8 }.is_retryable());
    /// assert!(!ReserveError::Closed.is_retryable());
    /// ```
    pub const fn is_retryable(&self) -> bool {
        matches!(
            self,
            ReserveError::Full { .. } | ReserveError::BehindWaiters { .. }
        )
    }
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ReserveError::Full {
                requested,
                available,
            } if requested <= available => write!(
                f,
                "requested {requested} (plus the headroom asked for) but only {available} available"
            ),
            ReserveError::Full {
                requested,
                available,
            } => write!(f, "requested {requested} but only {available} available"),
            ReserveError::BehindWaiters {
                requested,
                available,
                owed,
            } => write!(
                f,
                "requested {requested} with {available} available, but {owed} are owed to queued waiters"
            ),
            ReserveError::NeverFits {
                requested,
                capacity,
            } if requested <= capacity => write!(
                f,
                "requested {requested} (plus the headroom asked for) can never fit in a capacity \
                 of {capacity}"
            ),
            ReserveError::NeverFits {
                requested,
                capacity,
            } => write!(
                f,
                "requested {requested} can never fit in a capacity of {capacity}"
            ),
            ReserveError::Closed => f.write_str("allocator is closed"),
        }
    }
}

impl std::error::Error for ReserveError {}

/// Why [`SlotCounter::release`](crate::SlotCounter::release) refused to give
/// slots back. A refused release changes nothing.
///
/// # Examples
///
/// ```
/// use kvslots::{ReleaseError, SlotCounter};
///
/// let counter = SlotCounter::new(8);
/// assert_eq!(counter.admit(2), 2);
/// assert_eq!(
///     counter.release(3),
///     Err(ReleaseError::ExceedsUsed { released: 3, used: 2 })
/// );
/// assert_eq!(counter.used(), 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReleaseError {
    /// More was released than is in use (an over-release or a double free).
    ExceedsUsed {
        /// What the caller tried to release.
        released: usize,
        /// What was in use when the release was refused.
        used: usize,
    },
}

impl fmt::Display for ReleaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ReleaseError::ExceedsUsed { released, used } => write!(
                f,
                "cannot release {released}: only {used} in use (over-release or double free)"
            ),
        }
    }
}

impl std::error::Error for ReleaseError {}

/// Why [`BlockPool::free`](crate::BlockPool::free) (or
/// [`BlockPool::add_refs`](crate::BlockPool::add_refs), which refuses
/// every error with nothing changed) refused. A free refused
/// with `OutOfRange`, `NotAllocated`, `HeldBySequence` or `OverFreed`
/// changes nothing at all,
/// for any of the listed ids; the error names an offending one (see
/// [`BlockPool::free`](crate::BlockPool::free) for the order of the checks).
/// `Raced` is the one exception, a double free caught in the act.
///
/// # Examples
///
/// ```
/// use kvslots::{BlockId, BlockPool, FreeError};
///
/// let pool = BlockPool::new(2, 16);
/// assert_eq!(
///     pool.free(&[BlockId::new(5)]),
///     Err(FreeError::OutOfRange { id: BlockId::new(5), num_blocks: 2 })
/// );
/// assert_eq!(
///     pool.free(&[BlockId::new(1)]),
///     Err(FreeError::NotAllocated { id: BlockId::new(1) })
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FreeError {
    /// The id is not a block of this pool.
    OutOfRange {
        /// The offending id.
        id: BlockId,
        /// The pool's number of blocks.
        num_blocks: usize,
    },
    /// The block is free: it was never allocated, or already freed (a double
    /// free).
    NotAllocated {
        /// The offending id.
        id: BlockId,
    },
    /// The block is held by [`Sequence`](crate::Sequence)s (its table, a
    /// fork's, a prefix match's, or a fence's retirement): a sequence gives
    /// its blocks back itself, when it is truncated or dropped, so freeing
    /// one here is a double free.
    HeldBySequence {
        /// The offending id.
        id: BlockId,
    },
    /// The id is listed more times than the block has references.
    OverFreed {
        /// The offending id.
        id: BlockId,
    },
    /// Another thread dropped the block's last reference while this call
    /// was dropping its own (after the checks had passed), or the block was
    /// freed and taken for a [`Sequence`](crate::Sequence) meanwhile: the
    /// caller listed a reference it did not hold, a double free racing
    /// another holder's free (or a sequence giving the block back). That
    /// one reference is refused; **every other listed reference
    /// was dropped**, as by a successful free, because taking them back
    /// could hand a reference to a block that has been freed and
    /// reallocated to someone else meanwhile. (From
    /// [`BlockPool::add_refs`](crate::BlockPool::add_refs), whose block was
    /// freed since its checks, nothing changed: see there.)
    Raced {
        /// The offending id (the first one, if several raced).
        id: BlockId,
    },
    /// [`BlockPool::add_refs`](crate::BlockPool::add_refs) only: the block
    /// has as many references as a block can have (`2^29 - 1`); nothing
    /// changed.
    TooManyRefs {
        /// The offending id.
        id: BlockId,
    },
}

impl fmt::Display for FreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FreeError::OutOfRange { id, num_blocks } => {
                write!(f, "{id} is out of range for a pool of {num_blocks} blocks")
            }
            FreeError::NotAllocated { id } => {
                write!(
                    f,
                    "{id} is not allocated (never allocated, or a double free)"
                )
            }
            FreeError::HeldBySequence { id } => write!(
                f,
                "{id} is held by a sequence, which gives it back itself (a double free)"
            ),
            FreeError::OverFreed { id } => {
                write!(f, "{id} is listed more times than it has references")
            }
            FreeError::TooManyRefs { id } => {
                write!(f, "{id} has as many references as a block can have")
            }
            FreeError::Raced { id } => write!(
                f,
                "{id} was freed by another thread during this call (a racing \
                 double free): a free dropped the other listed references, an \
                 add_refs changed nothing"
            ),
        }
    }
}

impl std::error::Error for FreeError {}

/// A token position (or range end) at or past a
/// [`Sequence`](crate::Sequence)'s length.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use kvslots::{BlockPool, PositionError, Sequence};
///
/// let seq = Sequence::new(Arc::new(BlockPool::new(4, 16)));
/// assert_eq!(
///     seq.extend_slots(0..1, &mut Vec::new()),
///     Err(PositionError { position: 0, len: 0 })
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PositionError {
    /// The offending position (for a range, its last one: `end - 1`).
    pub position: usize,
    /// The sequence's length.
    pub len: usize,
}

impl fmt::Display for PositionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "position {} is past the sequence length {}",
            self.position, self.len
        )
    }
}

impl std::error::Error for PositionError {}

/// Why [`BlockPoolBuilder::build`](crate::BlockPoolBuilder::build) refused to
/// build a pool. Nothing is left allocated after a refusal.
///
/// The checks run in the order of the variants: the configuration first
/// (before any memory is asked for), then the allocation.
/// [`BlockPool::new`](crate::BlockPool::new) and
/// [`BlockPool::with_shards`](crate::BlockPool::with_shards) panic with
/// this error's message where `build` returns it.
///
/// # Examples
///
/// ```
/// use kvslots::{BlockPool, ConfigError};
///
/// assert_eq!(
///     BlockPool::builder(8, 0).build().unwrap_err(),
///     ConfigError::ZeroBlockSize
/// );
/// assert_eq!(
///     BlockPool::builder(8, 16).shards(0).build().unwrap_err(),
///     ConfigError::BadShardCount { shards: 0, max: BlockPool::MAX_SHARDS }
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigError {
    /// The block size is 0: no pool has empty blocks.
    ZeroBlockSize,
    /// More blocks than a [`BlockId`] can name
    /// ([`BlockPool::MAX_BLOCKS`](crate::BlockPool::MAX_BLOCKS)).
    TooManyBlocks {
        /// The number of blocks asked for.
        num_blocks: usize,
        /// The largest number accepted.
        max: usize,
    },
    /// `num_blocks * block_size`, the number of flat slot indices
    /// ([`Sequence::slot`](crate::Sequence::slot)), overflows `usize`.
    SlotCountOverflow {
        /// The number of blocks asked for.
        num_blocks: usize,
        /// The block size asked for.
        block_size: usize,
    },
    /// A shard count outside `1..=max`
    /// ([`BlockPool::MAX_SHARDS`](crate::BlockPool::MAX_SHARDS)).
    BadShardCount {
        /// The shard count asked for.
        shards: usize,
        /// The largest shard count accepted.
        max: usize,
    },
    /// [`kv_events`](crate::BlockPoolBuilder::kv_events) was asked for a
    /// pool without a prefix cache, which has no events to record.
    KvEventsWithoutPrefixCache,
    /// [`kv_events`](crate::BlockPoolBuilder::kv_events) was given a
    /// capacity of 0 records.
    ZeroEventCapacity,
    /// The allocator refused the pool's arrays (the heap memory of its
    /// bookkeeping, 8 bytes and two bits a block for the core pool and 78 with
    /// the prefix cache, and the KV event rings if chosen; not the KV cache
    /// itself, which lives on the device). What had been allocated is
    /// freed.
    OutOfMemory {
        /// The bytes the pool asked for in all
        /// ([`BlockPoolBuilder::memory_bytes`](crate::BlockPoolBuilder::memory_bytes)).
        bytes: usize,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ConfigError::ZeroBlockSize => f.write_str("block_size must be non-zero"),
            ConfigError::TooManyBlocks { num_blocks, max } => write!(
                f,
                "num_blocks {num_blocks} does not fit the block id type (max {max})"
            ),
            ConfigError::SlotCountOverflow {
                num_blocks,
                block_size,
            } => write!(
                f,
                "num_blocks * block_size overflows usize ({num_blocks} * {block_size})"
            ),
            ConfigError::BadShardCount { shards, max } => {
                write!(f, "shards must be in 1..={max}, got {shards}")
            }
            ConfigError::KvEventsWithoutPrefixCache => {
                f.write_str("kv_events needs a pool with a prefix cache")
            }
            ConfigError::ZeroEventCapacity => f.write_str("kv_events capacity must be non-zero"),
            ConfigError::OutOfMemory { bytes } => write!(
                f,
                "out of memory: the pool's bookkeeping needs {bytes} bytes of heap"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Why [`hash_blocks_with`](crate::hash_blocks_with),
/// [`BlockHash::first_with`](crate::BlockHash::first_with) or
/// [`BlockHash::next_with`](crate::BlockHash::next_with) refused its
/// extra keys. Nothing was computed and nothing was written.
///
/// # Examples
///
/// ```
/// use kvslots::{hash_blocks_with, ExtraKey, ExtraKeyError};
///
/// let mut keys = Vec::new();
/// let image = ExtraKey::Multimodal { hash: b"img-0", positions: 4..4 };
/// assert_eq!(
///     hash_blocks_with(b"", &[7; 32], 16, &[image], &mut keys),
///     Err(ExtraKeyError::EmptyPositions { index: 0, positions: 4..4 })
/// );
/// assert!(keys.is_empty());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ExtraKeyError {
    /// Extra key number `index` (a multimodal input or a custom extra)
    /// covers no token position: its range is empty, so it would enter no
    /// block's key, and prompts that differ only in it would share keys.
    EmptyPositions {
        /// The extra key's index in the list given.
        index: usize,
        /// Its (empty) range of token positions.
        positions: std::ops::Range<usize>,
    },
    /// [`BlockHash::next_with`](crate::BlockHash::next_with) was given a
    /// block start that is not a positive multiple of the block's length:
    /// block 0 starts at 0 and is keyed by
    /// [`first_with`](crate::BlockHash::first_with), and block `i` starts at
    /// `i * block_size`.
    BlockStart {
        /// The start given.
        start: usize,
        /// The block's length (its tokens).
        block_size: usize,
    },
}

impl fmt::Display for ExtraKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtraKeyError::EmptyPositions { index, positions } => write!(
                f,
                "extra key {index} covers no token position ({}..{})",
                positions.start, positions.end
            ),
            ExtraKeyError::BlockStart { start, block_size } => write!(
                f,
                "block start {start} is not a positive multiple of the block size {block_size}"
            ),
        }
    }
}

impl std::error::Error for ExtraKeyError {}

/// Why [`KvGroups::new`](crate::KvGroups::new) refused a list of groups.
///
/// # Examples
///
/// ```
/// use kvslots::{KvGroup, KvGroups, KvGroupsError};
///
/// assert_eq!(KvGroups::new([]).unwrap_err(), KvGroupsError::Empty);
/// assert_eq!(
///     KvGroups::new([KvGroup::SlidingWindow { window_tokens: 0 }]).unwrap_err(),
///     KvGroupsError::ZeroWindow { group: 0 }
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KvGroupsError {
    /// No group: a model has at least one group of layers.
    Empty,
    /// More groups than [`KvGroups::MAX_GROUPS`](crate::KvGroups::MAX_GROUPS).
    TooManyGroups {
        /// The most groups accepted.
        max: usize,
    },
    /// A sliding window of 0 tokens: a token attends at least to itself.
    ZeroWindow {
        /// The group's number.
        group: usize,
    },
    /// A chunk of 0 tokens for chunked local attention: a chunk holds at
    /// least one token.
    ZeroChunk {
        /// The group's number.
        group: usize,
    },
}

impl fmt::Display for KvGroupsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            KvGroupsError::Empty => f.write_str("a model has at least one group of layers"),
            KvGroupsError::TooManyGroups { max } => {
                write!(f, "more than {max} groups of layers")
            }
            KvGroupsError::ZeroWindow { group } => write!(
                f,
                "group {group}: a sliding window of 0 tokens (a token attends at least to itself)"
            ),
            KvGroupsError::ZeroChunk { group } => write!(
                f,
                "group {group}: chunked local attention in chunks of 0 tokens (a chunk holds at \
                 least one token)"
            ),
        }
    }
}

impl std::error::Error for KvGroupsError {}

/// Why a [`HybridSequence`](crate::HybridSequence) call that is not an
/// allocation refused its arguments (allocations refuse with
/// [`ReserveError`]). A refused call changes nothing.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use kvslots::{BlockPool, HybridError, HybridSequence, KvGroup, KvGroups};
///
/// let groups = KvGroups::new([KvGroup::Full]).unwrap();
/// let seq = HybridSequence::new(Arc::new(BlockPool::new(4, 16)), groups);
/// assert_eq!(
///     seq.extend_slots(1, 0..1, &mut Vec::new()),
///     Err(HybridError::NoSuchGroup { group: 1, groups: 1 })
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HybridError {
    /// A group number past the last group.
    NoSuchGroup {
        /// The group asked for.
        group: usize,
        /// How many groups the sequence has.
        groups: usize,
    },
    /// A position (or a range's end) at or past the sequence's length.
    Position(PositionError),
    /// A position whose block a sliding window (or a chunked group) gave
    /// back: the group's table holds a null entry there.
    OutsideWindow {
        /// The group.
        group: usize,
        /// The offending position (for a range, its start).
        position: usize,
        /// The first position whose block the group still holds.
        first_held: usize,
    },
    /// A truncate to `len` tokens would need blocks that a sliding window
    /// (or a chunked group) gave back (the window, or chunk, of the token
    /// at position `len` reaches before them): the shortest length it
    /// accepts, besides 0, is `min_len`.
    TruncateOutsideWindow {
        /// The length asked for.
        len: usize,
        /// The shortest length accepted besides 0.
        min_len: usize,
    },
    /// The [`GroupKeys`](crate::GroupKeys) were made for other
    /// [`KvGroups`](crate::KvGroups) than the sequence's.
    OtherGroups,
}

impl fmt::Display for HybridError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            HybridError::NoSuchGroup { group, groups } => {
                write!(f, "no group {group}: the sequence has {groups}")
            }
            HybridError::Position(e) => e.fmt(f),
            HybridError::OutsideWindow {
                group,
                position,
                first_held,
            } => write!(
                f,
                "group {group}: position {position} is outside the window (its blocks from \
                 position {first_held} on are held)"
            ),
            HybridError::TruncateOutsideWindow { len, min_len } => write!(
                f,
                "cannot truncate to {len} tokens: a window gave back blocks that length needs \
                 (the shortest length accepted besides 0 is {min_len})"
            ),
            HybridError::OtherGroups => {
                f.write_str("the keys were made for other groups than the sequence's")
            }
        }
    }
}

impl std::error::Error for HybridError {}

impl From<PositionError> for HybridError {
    fn from(e: PositionError) -> Self {
        HybridError::Position(e)
    }
}
