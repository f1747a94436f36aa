"""Lock-free, all-or-nothing KV-cache block allocation with a prefix cache,
for LLM inference schedulers.

`BlockPool` hands out block ids all or nothing; `Sequence` is one request's
block table over a pool (appends, forks, rollback, the slot mapping, prefix
matching and publishing); `HybridSequence` is one request of a hybrid model
(a table per `KvGroups` group: full attention or a sliding window);
`hash_blocks` computes the prefix cache's block keys, and
`try_append_each` makes a decode step's appends in one call. `BlockPool.stats()`
reports a `PoolStats` for metrics, and a pool built with `kv_events` reports
its cache's changes to a KV-aware router (`BlockPool.drain_events()`: vLLM's
event shapes; a hybrid sequence's blocks under their group's keys). Every
refusal raises (`ReserveError` and its subclasses `Full`, `NeverFits`,
`Closed`; `FreeError`; `CopyRequired`; `WindowError`) and changes nothing.
Every object may be shared between threads; calls that wait or walk many
blocks release the GIL.
"""

from types import TracebackType
from typing import Any, ClassVar, Iterable, Optional, Tuple, Type, Union, final

from typing_extensions import Buffer, Literal, Self, SupportsIndex

__version__: str

__all__ = [
    "__version__",
    "BlockPool",
    "Sequence",
    "BlockCopy",
    "KvGroups",
    "GroupKeys",
    "HybridSequence",
    "PoolStats",
    "KVEventBatch",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "EventsDropped",
    "hash_blocks",
    "hash_blocks_packed",
    "try_append_each",
    "ReserveError",
    "Full",
    "BehindWaiters",
    "NeverFits",
    "Closed",
    "SequenceBusy",
    "FreeError",
    "CopyRequired",
    "WindowError",
]

_Int = SupportsIndex
"""An int, or an object with `__index__` (a numpy integer); never a float."""

_Keys = Union[Iterable[Union[bytes, bytearray]], bytes, bytearray]
"""Block keys: 32-byte keys, as `hash_blocks` returns them, or one bytes
object of keys laid end to end, as `hash_blocks_packed` returns them (read
in one copy instead of one conversion per key). Keys are a chain, in
order: a set of them is refused with `TypeError`."""

_Bytes = Union[bytes, bytearray, str]
"""An extra key's bytes: `bytes`, `bytearray`, or `str` (taken as UTF-8)."""

class ReserveError(Exception):
    """An allocation was refused; nothing changed. Subclasses: `Full` (and
    its subclass `BehindWaiters`), `NeverFits`, `Closed`, `SequenceBusy`."""

class Full(ReserveError):
    """Not enough free blocks right now; retrying later may succeed."""

    requested: int
    """Blocks asked for (without the headroom)."""
    available: int
    """Blocks free when the request was refused."""
    headroom: int
    """Blocks the call asked to stay free besides (`reserve`, `try_reserve`;
    0 for every other call): it was refused because `available` was less
    than `requested + headroom`."""

class BehindWaiters(Full):
    """The blocks are free, but callers queued in `alloc`/`reserve` are owed
    them first: a new caller never passes a queued waiter. Retrying later (or
    waiting with `alloc`/`reserve`) may succeed."""

    owed: int
    """Blocks the queued waiters are owed (their headroom included)."""

class NeverFits(ReserveError):
    """The request (plus any headroom) is larger than all the caller could
    ever be given: it can never be admitted, so reject it instead of
    retrying. A sequence cannot be given the blocks it holds while it asks,
    so its appends, reservations and forks are measured against the pool's
    blocks less those."""

    requested: int
    """Blocks asked for (without the headroom)."""
    headroom: int
    """Blocks the call asked to stay free besides (`reserve`, `try_reserve`;
    0 for every other call): `requested + headroom` exceeds `capacity`."""
    capacity: int
    """The most the caller could ever be given: the pool's number of blocks,
    less those the sequence holds for a sequence's call."""

class Closed(ReserveError):
    """The pool was closed: it admits nothing more, while frees still work."""

class SequenceBusy(ReserveError, TimeoutError):
    """`Sequence.reserve` (or `HybridSequence.reserve`) refused: its
    `timeout` ran out while another thread's call held the sequence, before
    the reservation could start. Nothing changed; retrying later may
    succeed.

    A `ReserveError`, so that `except kvslots.ReserveError` catches every
    refusal of a reservation, and a `TimeoutError`, as a lock's timed
    acquire reports running out of time."""

class FreeError(ValueError):
    """`BlockPool.free` (or `BlockPool.add_refs`) refused.

    Every kind but `"raced"` changed nothing. `"raced"` is a double free
    caught racing another holder's free: that reference was refused and
    every other listed reference was dropped.
    """

    id: int
    """The offending id, as an int (`operator.index` of the item given: a
    numpy integer becomes an int; it may be negative or huge for
    `"out_of_range"`)."""
    kind: Literal[
        "out_of_range", "not_allocated", "held_by_sequence", "over_freed", "raced", "too_many_refs"
    ]
    """Why: not a block of the pool; a free block (a double free); a block
    that sequences hold (they give it back themselves: a double free);
    listed more times than it has references; a racing double free (or,
    for `BlockPool.add_refs`, a block freed during the call); a block at
    the most references it can have (`add_refs`)."""
    num_blocks: Optional[int]
    """The pool's size, for `"out_of_range"`; else None."""

class CopyRequired(RuntimeError):
    """`Sequence.try_append` (or `HybridSequence.try_append`) refused: the
    last block is partly filled and shared (with a fork or a matched
    sequence) or cached, so the append needs a copy-on-write. Use
    `append_cow` (of the same class), which returns the copies to make.
    Nothing changed."""

class WindowError(ValueError):
    """`HybridSequence.truncate` (or `truncate_fenced`) refused: the window
    of the token at the new length reaches blocks a sliding (or chunked
    local) group gave back. Nothing changed."""

    len: int
    """The length asked for."""
    min_len: int
    """The shortest length accepted besides 0."""

@final
class BlockCopy:
    """A device copy the caller must make: the first `tokens` token slots of
    block `src` into block `dst`, before the kernel writes into `dst`.

    Built by hand, `src` and `dst` must be block ids (ints in
    `0..2**32 - 1`) and `tokens` an int >= 0: `ValueError` otherwise
    (`TypeError` for a non-int)."""

    def __new__(cls, src: int, dst: int, tokens: int) -> Self: ...
    @property
    def src(self) -> int:
        """The block to copy from."""
    @property
    def dst(self) -> int:
        """The block to copy into."""
    @property
    def tokens(self) -> int:
        """How many leading token slots to copy."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class PoolStats:
    """A snapshot of a `BlockPool`'s gauges and counters (`BlockPool.stats()`).

    Each field is read on its own while other threads may change the pool:
    the fields of one snapshot agree with each other only when no call is
    running. Compares equal field by field.
    """

    __match_args__: ClassVar[Tuple[str, ...]]
    @property
    def num_blocks(self) -> int:
        """The pool's blocks."""
    @property
    def used_blocks(self) -> int:
        """Blocks in use."""
    @property
    def peak_used_blocks(self) -> int:
        """The high-water mark of `used_blocks`."""
    @property
    def free_blocks(self) -> int:
        """Free blocks, evictable ones included."""
    @property
    def cached_blocks(self) -> int:
        """Blocks holding a prefix-cache key."""
    @property
    def evictable_blocks(self) -> int:
        """Cached blocks that no one holds."""
    @property
    def pending_release_blocks(self) -> int:
        """Blocks whose release waits for a fence."""
    @property
    def queried_blocks(self) -> int:
        """Keys queried by prefix matches."""
    @property
    def hit_blocks(self) -> int:
        """Blocks those matches hit."""
    @property
    def evictions(self) -> int:
        """Cached blocks evicted."""
    @property
    def waiters(self) -> int:
        """Calls waiting in `alloc` / `Sequence.reserve`."""
    @property
    def events_dropped(self) -> Optional[int]:
        """KV events lost to full rings, or None for a pool without
        `kv_events`."""
    @property
    def usage(self) -> float:
        """`used_blocks / num_blocks` (0.0 for a pool of no blocks)."""
    def as_dict(self) -> dict[str, Any]:
        """The fields (and `usage`) as a dict."""
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class BlockStored:
    """Blocks became cached: vLLM's `BlockStored`, with the pool's block ids.

    `block_hashes` is a chain (each key's parent the key before it) and
    `parent_block_hash` the first one's parent (None for a prompt's first
    block). The pool never sees tokens: `token_count` is
    `len(block_hashes) * block_size` instead of vLLM's `token_ids`.
    `lora_id` and `medium` are always None, kept for code written against
    vLLM's class. `group_idx` is the index of the `HybridSequence` group
    whose blocks these are (in its `KvGroups`), None for a `Sequence`'s.
    """

    __match_args__: ClassVar[Tuple[str, ...]]
    @property
    def block_hashes(self) -> list[bytes]:
        """The blocks' keys (32 bytes each), in chain order."""
    @property
    def parent_block_hash(self) -> Optional[bytes]:
        """The key of the block before the first one, or None."""
    @property
    def block_ids(self) -> list[int]:
        """The blocks now holding `block_hashes`, one per key."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def token_count(self) -> int:
        """Tokens the stored blocks hold."""
    @property
    def lora_id(self) -> Optional[int]:
        """Always None."""
    @property
    def medium(self) -> Optional[str]:
        """Always None."""
    @property
    def group_idx(self) -> Optional[int]:
        """The group of layers (a `HybridSequence`'s group index), or
        None for a `Sequence`'s blocks."""
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class BlockRemoved:
    """Keys no block holds any more: vLLM's `BlockRemoved`. `group_idx`
    is the group of the publish that stored the keys (as in
    `BlockStored`), None for keys a `Sequence` published; one event never
    mixes groups."""

    __match_args__: ClassVar[Tuple[str, ...]]
    @property
    def block_hashes(self) -> list[bytes]:
        """The keys removed (32 bytes each)."""
    @property
    def medium(self) -> Optional[str]:
        """Always None."""
    @property
    def group_idx(self) -> Optional[int]:
        """The group of layers whose blocks held the keys, or None."""
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class AllBlocksCleared:
    """No block holds a key: the first event a pool reports (its cache
    starts empty), so that a router forgets what it knew of a restarted
    worker."""

    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class EventsDropped:
    """Events were lost here because the pool's event rings were full
    (drained too seldom): `count` blocks' stores and removals, one each (a
    drain reports a publish's run of stored blocks as one `BlockStored`). A
    router that must never believe a key is cached when it is not treats
    this as `AllBlocksCleared`."""

    __match_args__: ClassVar[Tuple[str, ...]]
    @property
    def count(self) -> int:
        """How many blocks' stores and removals were lost (one each)."""
    def __eq__(self, other: object, /) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

_KVEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared, EventsDropped]

@final
class KVEventBatch:
    """One batch of `BlockPool.drain_events()`: vLLM's `KVEventBatch`, with
    its sequence number.

    `seq` numbers the non-empty batches 0, 1, 2, ... in drain order; an
    empty batch carries the number the next non-empty one will.
    """

    __match_args__: ClassVar[Tuple[str, ...]]
    @property
    def seq(self) -> int:
        """The batch's sequence number."""
    @property
    def ts(self) -> float:
        """When it was drained (`time.time()`)."""
    @property
    def events(self) -> list[_KVEvent]:
        """The events, oldest first."""
    def __len__(self) -> int:
        """The number of events."""

@final
class BlockPool:
    """A lock-free pool of `num_blocks` KV-cache blocks of `block_size` token
    slots each, with a prefix cache.

    `try_alloc(n)` takes exactly `n` distinct block ids or none; `free(ids)`
    drops one reference per listed id, all or nothing. Cached blocks that no
    one holds count as free and are evicted least recently released first.

    `shards` cuts the free list into that many shards (default: one per 64
    blocks, at most 16). `kv_events` (records in all, 128 bytes each,
    shared among the shards' rings: `kv_events / shards` each, rounded up,
    at least 2) turns on KV events (`drain_events`). `prefix_cache=False` builds the core pool
    alone (8 bytes and two bits a block instead of 78): `Sequence.publish`
    and `match_prefix` then return 0 and change nothing. Raises
    `ValueError` for `block_size == 0`, `num_blocks > MAX_BLOCKS`, a
    `num_blocks * block_size` too large, `shards` outside `1..=MAX_SHARDS`, `kv_events == 0`,
    `kv_events` without the prefix cache, or any size of `2**64` or more;
    `MemoryError` when the pool's bookkeeping (78 bytes a block, 80 with
    `kv_events`, and the event rings) cannot be allocated; `TypeError` for
    a non-int.
    """

    MAX_BLOCKS: ClassVar[int]
    """The largest number of blocks a pool can have (2**32 - 1)."""
    MAX_SHARDS: ClassVar[int]
    """The most free-list shards a pool can have."""

    def __new__(
        cls,
        num_blocks: _Int,
        block_size: _Int,
        shards: Optional[_Int] = None,
        kv_events: Optional[_Int] = None,
        prefix_cache: bool = True,
    ) -> Self: ...
    @property
    def num_blocks(self) -> int:
        """The total number of blocks."""
    @property
    def block_size(self) -> int:
        """Token slots per block."""
    @property
    def shards(self) -> int:
        """How many shards the free list is cut into."""
    @property
    def free_blocks(self) -> int:
        """Free blocks now (uncached free blocks and evictable cached ones): a
        snapshot, exact when no call is running."""
    @property
    def used_blocks(self) -> int:
        """Blocks in use now (`num_blocks - free_blocks`)."""
    @property
    def peak_used_blocks(self) -> int:
        """The high-water mark of `used_blocks` (exact with one thread)."""
    @property
    def cached_blocks(self) -> int:
        """Blocks holding a prefix-cache key, referenced or not (a scan of
        every block)."""
    @property
    def evictable_blocks(self) -> int:
        """Cached blocks that no one holds: evictable, and counted as free."""
    @property
    def pending_release_blocks(self) -> int:
        """Block references retired under fences not completed yet."""
    @property
    def peak_pending_release_blocks(self) -> int:
        """The high-water mark of `pending_release_blocks`."""
    @property
    def waiters(self) -> int:
        """Calls waiting in the pool's queue (`alloc`, `reserve`) now; a
        `reserve` waiting for another thread's call on its sequence is not
        in the queue yet."""
    @property
    def closed(self) -> bool:
        """Whether `close()` has been called."""
    @property
    def has_prefix_cache(self) -> bool:
        """Whether the pool has a prefix cache (built without
        `prefix_cache=False`)."""
    @property
    def has_kv_events(self) -> bool:
        """Whether the pool records KV events (built with `kv_events`)."""
    def stats(self) -> PoolStats:
        """The pool's gauges and counters in one snapshot, for metrics (a scan
        of every block, GIL released for large pools)."""
    def drain_events(self) -> KVEventBatch:
        """The KV events recorded since the last call, oldest first: per key
        in the order of the key's changes (its store before its removal),
        nothing twice, losses to full rings as an `EventsDropped` in their
        place; a block's store after its parent's when both are in the
        batch (unless a removal of the parent's key, or lost events, come
        before the parent's store). A pool without `kv_events` returns an
        empty batch."""
    def try_alloc(self, n: _Int) -> list[int]:
        """Takes exactly `n` free blocks, all or none, and returns their
        distinct ids, each with one reference.

        Raises `Full`, `NeverFits` (`n > num_blocks`) or `Closed`; nothing is
        taken then. `n == 0` returns `[]` (and raises `Closed` on a closed
        pool, as any `n`).
        """
    def alloc(self, n: _Int, timeout: Optional[float] = None) -> list[int]:
        """Takes exactly `n` blocks, all or none, waiting in arrival order
        (GIL released) for at most `timeout` seconds (None: no limit).

        Raises `NeverFits` at once, `Closed`, or `Full` when the timeout runs
        out; Ctrl-C (`KeyboardInterrupt`) ends the wait. Nothing is taken when
        it raises. `ValueError` for a negative or non-finite timeout (a
        float too large for a deadline waits without limit, as None; an int
        beyond a float's range raises `OverflowError`, as `time.sleep`).
        """
    def free(self, ids: Iterable[_Int]) -> None:
        """Drops one reference per listed id, all or nothing; a block whose
        last reference goes is free again (or evictable, if cached).

        Raises `FreeError` (see its `kind`) or `TypeError` for a non-int id
        (or ids given as `bytes`, `bytearray`, a `memoryview` of either, or
        `str`); nothing changes then (except for `kind == "raced"`).
        """
    def add_refs(self, ids: Iterable[_Int]) -> None:
        """Adds one reference per listed id (a block listed twice gets two),
        to share raw blocks; each holder gives its reference back with
        `free`. All or nothing.

        Raises `FreeError` (`kind` `"out_of_range"`, `"not_allocated"`,
        `"held_by_sequence"`: sequences share with `fork`; `"raced"`,
        `"too_many_refs"`) or `TypeError` for a non-int id (or ids given as
        `bytes`, `bytearray`, a `memoryview` of either, or `str`); nothing
        changes then.
        """
    def ref_count(self, id: _Int) -> Optional[int]:
        """References block `id` has now (0 when free), or None if `id` is
        not a block of this pool."""
    def close(self) -> None:
        """Every later allocation raises `Closed` (waiters too); frees keep
        working so that workers can drain."""
    def complete(self, fence: _Int) -> int:
        """Declares device step `fence` done: drops every reference retired
        under it and returns how many. Fences complete in any order."""
    def complete_all(self) -> int:
        """Declares every fence done; returns the references dropped."""
    def reset_prefix_cache(self) -> int:
        """Drops the key of every evictable cached block and returns how
        many; blocks someone holds keep theirs."""
    def prefix_stats(self) -> dict[str, int]:
        """`queried_blocks`, `hit_blocks` (by `Sequence.match_prefix`) and
        `evictions` so far."""
    def peek_prefix(self, keys: _Keys) -> int:
        """How many blocks of the longest cached prefix of `keys` a
        `Sequence.match_prefix` would take, found without taking any: no
        reference, no admission, no change to the eviction order or
        `prefix_stats`. May be out of date by the time it returns. Raises
        as `Sequence.match_prefix` does: `TypeError` for keys that are no
        list of `bytes` (a set included) or packed `bytes`, `ValueError`
        for a key that is not 32 bytes."""
    def peek_hybrid_prefix(self, keys: GroupKeys) -> int:
        """`peek_prefix` for a hybrid model: how many blocks of tokens a
        `HybridSequence.match_prefix` with `keys` would match, found without
        taking any block."""

@final
class Sequence:
    """One request's block table over a `BlockPool`: its length in tokens and
    the blocks that hold them, in order.

    Appends take all the blocks they need or none; `fork()` shares full
    blocks; `truncate` rolls back; `match_prefix` / `publish` use the pool's
    prefix cache. `close()`, leaving a `with` block, or garbage collection
    gives every block back.

    Usable from many threads: the sequence sits behind a mutex inside the
    binding, so calls on one sequence take turns while calls on different
    sequences run in parallel. A call waiting for its turn (behind another
    thread's `reserve`) runs the signal handlers: Ctrl-C interrupts it. A
    call from a thread that holds the sequence already (a signal handler run
    during its own `reserve`) raises `RuntimeError` instead of waiting for
    itself. A closed sequence raises `ValueError`.
    """

    def __new__(cls, pool: BlockPool) -> Self: ...
    @property
    def pool(self) -> BlockPool:
        """The pool the blocks come from."""
    @property
    def closed(self) -> bool:
        """Whether `close()` or `retire()` has been called."""
    def __len__(self) -> int:
        """The number of tokens."""
    @property
    def block_ids(self) -> list[int]:
        """The ids of the blocks holding positions `0..len(seq)`, in order,
        then any reserved ahead."""
    def block_ids_from(self, start: _Int) -> list[int]:
        """`block_ids[start:]` without building the rest (`[]` from the end
        of the table on). After an append, `block_ids_from(n)`, where `n`
        was `capacity // block_size` before it, lists the blocks it took.
        Raises `ValueError` for a negative `start`."""
    @property
    def capacity(self) -> int:
        """Tokens the blocks in the table can hold (at least `len(seq)`)."""
    @property
    def needs_copy(self) -> bool:
        """Whether a non-empty append now needs a copy-on-write: then
        `try_append` raises `CopyRequired` and `append_cow` returns the
        copy."""
    def try_append(self, n: _Int) -> range:
        """Appends `n` tokens, taking the new blocks they need all or none;
        returns their positions.

        Raises `Full`, `NeverFits`, `Closed` (in blocks) or `CopyRequired`;
        nothing changes then.
        """
    def append_cow(self, n: _Int) -> Tuple[range, Optional[BlockCopy]]:
        """Appends `n` tokens and returns `(positions, copy)`: the
        copy-on-write the append needed, if any, which must be made before
        the kernel writes the new tokens."""
    def try_reserve(self, tokens: _Int, headroom: _Int = 0) -> None:
        """Takes the blocks `tokens` more tokens need, all or none, only if
        `headroom` blocks stay free; `len(seq)` is unchanged. When the
        blocks held already cover them, nothing is taken and nothing is
        checked (neither `headroom` nor whether the pool is closed).

        Raises `Full`, `NeverFits` or `Closed`; nothing changes then.
        """
    def reserve(
        self, tokens: _Int, headroom: _Int = 0, timeout: Optional[float] = None
    ) -> None:
        """`try_reserve`, waiting in the pool's queue (GIL released) for at
        most `timeout` seconds. Raises `NeverFits` at once, `Closed`, or
        `Full` on timeout; `SequenceBusy` if the timeout ran out while
        another thread's call held this sequence; Ctrl-C ends the wait;
        nothing changes when it raises. Other calls on this sequence wait
        for it; a call on it from a signal handler (or a finalizer) that
        runs in this thread during the wait raises `RuntimeError` at once
        and changes nothing."""
    def truncate(self, len: _Int) -> int:
        """Rolls back to `len` tokens and gives back the blocks no longer
        needed; returns how many left the table."""
    def truncate_fenced(self, len: _Int, fence: _Int) -> int:
        """`truncate`, with the references given back only at
        `pool.complete(fence)`."""
    def retire(self, fence: _Int) -> int:
        """Gives the sequence up while step `fence` may still read it: its
        references go at `pool.complete(fence)`. Returns how many; closes the
        sequence."""
    def retire_copy_source(self, fence: _Int) -> int:
        """Hands the last copy-on-write's source to `fence`; returns 1 if
        there was one, else 0."""
    def shrink_to_fit(self) -> int:
        """Gives back reserved blocks that hold no token; returns how many."""
    def fork(self) -> Tuple["Sequence", Optional[BlockCopy]]:
        """A child sharing every full block, with a private copy of a partly
        filled last one: `(child, copy)`.

        Raises `Full`, `BehindWaiters` or `Closed` when no block is free for
        the private tail, `NeverFits` when every block of the pool is this
        sequence's own, and `RuntimeError` if a block to share already has
        the most references a block can have; nothing changes then.
        """
    def match_prefix(self, keys: _Keys) -> int:
        """Takes the cached blocks of the longest prefix of `keys` into this
        sequence and returns how many (`len(seq)` becomes that times
        `block_size`). Into a sequence that holds only reserved blocks
        (`try_reserve` or `reserve`, `len(seq) == 0`) the matched blocks
        take the first reserved blocks' places, each paying for a cached
        block revived (also while free blocks are owed to waiters), so
        `capacity` stays, and the sequence stays admitted while it holds a
        block: its appends are growth, which does not wait behind queued
        waiters. A sequence that holds tokens matches nothing and returns
        0."""
    def publish(self, keys: _Keys) -> int:
        """Caches the full blocks under `keys` (`keys[i]` for block `i`) and
        returns how many became cached. Publish only committed tokens."""
    def slot(self, position: _Int) -> Optional[int]:
        """The flat KV-cache slot of token `position`, or None past the
        end."""
    def slot_mapping(
        self, start: Optional[_Int] = None, stop: Optional[_Int] = None
    ) -> list[int]:
        """The flat slots of positions `start..stop` (`stop` defaults to
        `len(seq)`). Raises `IndexError` for a non-empty range that ends past
        the end (an empty one, `start >= stop`, maps to `[]`), `MemoryError`
        for a range too long to hold (nothing changes)."""
    def slot_mapping_buffer(
        self, start: Optional[_Int] = None, stop: Optional[_Int] = None
    ) -> memoryview:
        """`slot_mapping` as a writable `memoryview` of native int64s (format
        "q"): `numpy.frombuffer` / `torch.frombuffer` view it without a
        copy."""
    def slot_mapping_array(
        self, start: Optional[_Int] = None, stop: Optional[_Int] = None
    ) -> Any:
        """`slot_mapping` as a numpy int64 array over a buffer written once.
        Raises `ImportError` without numpy; once a call has found numpy, later
        calls import nothing."""
    def close(self) -> None:
        """Gives every block back now. Closing twice does nothing."""
    def __enter__(self) -> Self:
        """Returns the sequence; raises `ValueError` if it is closed."""
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

@final
class KvGroups:
    """A hybrid model's groups of layers, in order: each `"full"` (full
    attention), an int (or an object with `__index__`, such as a numpy
    integer), a sliding window of that many tokens (a token
    attends to itself and the tokens before it, that many in all), or
    `("chunked", chunk_tokens)`, chunked local attention (Llama 4's
    `attention_chunk_size`: a token attends to the tokens of its own chunk
    of `chunk_tokens` positions, itself included).
    `HybridSequence` keeps one block table per group over one pool.

    Raises `ValueError` for no group, more than `MAX_GROUPS`, a window or
    chunk of 0, another string or another tuple; `TypeError` for an item
    that is none of these, or for kinds given as one `str`, `bytes` or
    `bytearray`, or as a set (the groups' order is their indices).
    """

    MAX_GROUPS: ClassVar[int]
    def __new__(cls, kinds: Iterable[Union[str, _Int, tuple[str, _Int]]]) -> Self: ...
    def __len__(self) -> int:
        """How many groups."""
    @property
    def kinds(self) -> list[Union[str, int, tuple[str, int]]]:
        """The groups, in order: `"full"`, a sliding window's tokens, or
        `("chunked", chunk_tokens)`."""
    def first_needed_block(self, group: _Int, len: _Int, block_size: _Int) -> int:
        """The first block group `group` still needs after `len` tokens (0
        for a full group). Raises `IndexError` past the last group."""
    def keys(self, keys: _Keys) -> GroupKeys:
        """Each group's prefix-cache keys of the blocks whose content keys
        are `keys` (from `hash_blocks`). Raises `MemoryError` when the keys
        of every group (32 bytes a block and a group) do not fit."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class GroupKeys:
    """Each group's prefix-cache keys of a prompt's full blocks (made by
    `KvGroups.keys`): what `HybridSequence.match_prefix` and `publish` take.
    A block never matches in another group."""

    def __len__(self) -> int:
        """How many blocks have keys."""
    def extend(self, keys: _Keys) -> None:
        """Adds the next blocks' keys, from their content keys (GIL released
        for 32 compressions or more). Raises `MemoryError` (adding none)
        when they do not fit."""
    def truncate(self, blocks: _Int) -> None:
        """Keeps the first `blocks` blocks' keys."""
    def group(self, group: _Int) -> list[bytes]:
        """Group `group`'s keys. Raises `IndexError` past the last group."""
    @property
    def groups(self) -> KvGroups:
        """The groups the keys are for."""

@final
class HybridSequence:
    """One request of a hybrid model: a block table per group of layers
    over one `BlockPool`, with one length.

    Appends, reservations and forks take every group's blocks with one
    allocation, all or none. A sliding group gives back, in the append that
    moves past them, the blocks wholly before its window: they become `None`
    entries of its table. `match_prefix` takes the longest prefix every
    group can serve; `publish` caches every group's full blocks (publish
    each step's before the next append). Every refusal raises and changes
    nothing; a closed sequence raises `ValueError`.
    """

    def __new__(cls, pool: BlockPool, groups: KvGroups) -> Self: ...
    @property
    def pool(self) -> BlockPool:
        """The pool the blocks come from."""
    @property
    def groups(self) -> KvGroups:
        """The groups of layers."""
    @property
    def closed(self) -> bool:
        """Whether `close()` or `retire()` has been called."""
    def __len__(self) -> int:
        """The number of tokens (the same in every group)."""
    @property
    def capacity(self) -> int:
        """Tokens every group's table can hold (the least over the groups:
        a block kept for one group's copy-on-write holds no token)."""
    @property
    def held_blocks(self) -> int:
        """Blocks held in all the tables (the `None` entries excluded)."""
    @property
    def needs_copy(self) -> bool:
        """Whether a non-empty append now needs a copy-on-write in some
        group."""
    def block_ids(self, group: _Int) -> list[Optional[int]]:
        """Group `group`'s table: block ids, `None` where its window gave a
        block back. Raises `IndexError` past the last group."""
    def block_ids_from(self, group: _Int, start: _Int) -> list[Optional[int]]:
        """`block_ids(group)[start:]` without building the rest (`[]` from
        the end of the table on). Raises `IndexError` past the last group,
        `ValueError` for a negative `start`."""
    def null_blocks(self, group: _Int) -> int:
        """How many leading entries of group `group`'s table are `None`."""
    def try_append(self, n: _Int) -> range:
        """Appends `n` tokens to every group with one allocation, all or
        none; returns their positions. Raises `Full`, `BehindWaiters`,
        `NeverFits`, `Closed` or `CopyRequired`; nothing changes then."""
    def append_cow(self, n: _Int) -> Tuple[range, list[BlockCopy]]:
        """`try_append`, returning `(positions, copies)`: each group's
        copy-on-write, to make before the kernel writes."""
    def append_fenced(self, n: _Int, fence: _Int) -> Tuple[range, list[BlockCopy]]:
        """`append_cow`, with the blocks the windows leave behind retired
        under `fence` (given back at `pool.complete(fence)`)."""
    def try_reserve(self, tokens: _Int, headroom: _Int = 0) -> None:
        """Takes every group's blocks for `tokens` more tokens with one
        allocation, all or none, only if `headroom` blocks stay free. When
        the blocks held already cover them, nothing is taken and nothing is
        checked (neither `headroom` nor whether the pool is closed)."""
    def reserve(
        self, tokens: _Int, headroom: _Int = 0, timeout: Optional[float] = None
    ) -> None:
        """`try_reserve`, waiting in the pool's queue (GIL released) for at
        most `timeout` seconds. Raises `NeverFits` at once, `Closed`, or
        `Full` on timeout; `SequenceBusy` if the timeout ran out while
        another thread's call held this sequence; Ctrl-C ends the wait;
        nothing changes when it raises. Other calls on this sequence wait
        for it; a call on it from a signal handler (or a finalizer) that
        runs in this thread during the wait raises `RuntimeError` at once
        and changes nothing."""
    def truncate(self, len: _Int) -> int:
        """Rolls every group back to `len` tokens; returns how many blocks
        left the tables. Raises `WindowError` (nothing changed) if the
        window of the token at `len` reaches a given-back block."""
    def truncate_fenced(self, len: _Int, fence: _Int) -> int:
        """`truncate`, with the references given back at
        `pool.complete(fence)`; raises `WindowError` as `truncate` does."""
    def retire(self, fence: _Int) -> int:
        """Gives the sequence up while step `fence` may still read it;
        returns how many references; closes the sequence."""
    def retire_copy_source(self, fence: _Int) -> int:
        """Hands every group's kept copy-on-write source to `fence`."""
    def shrink_to_fit(self) -> int:
        """Gives back every group's reserved blocks that hold no token."""
    def fork(self) -> Tuple["HybridSequence", list[BlockCopy]]:
        """A child sharing every group's full blocks, with a private copy of
        each partly filled last one: `(child, copies)`."""
    def match_prefix(self, keys: GroupKeys) -> int:
        """Takes the longest prefix every group can serve into this new
        sequence; returns its blocks. Into reserved blocks (length 0) the
        match takes their places, each can pay for a cached block revived,
        and every group keeps as many blocks as it reserved beyond the hit
        (`capacity` does not shrink, unless another thread's match takes a
        block this one let go of while the pool is full: a caller that needs
        the whole reservation checks `capacity` and reserves the rest); the
        sequence stays admitted while it holds a block: its appends are
        growth, which does not wait behind queued waiters. A sequence that
        holds tokens matches nothing and returns 0. Raises `ValueError` for
        another `KvGroups`' keys."""
    def publish(self, keys: GroupKeys) -> int:
        """Caches every group's full blocks; returns how many became
        cached. With `kv_events`, each group's stores are reported under
        that group's keys (`keys.group(g)`, as the cache holds them), a
        chain per group whose parent is the group's key of the block before
        (also one a window gave back)."""
    def slot(self, group: _Int, position: _Int) -> Optional[int]:
        """Group `group`'s flat slot of token `position`, or None past the
        end or in a given-back block."""
    def slot_mapping(
        self, group: _Int, start: Optional[_Int] = None, stop: Optional[_Int] = None
    ) -> list[int]:
        """Group `group`'s flat slots of positions `start..stop`. Raises
        `IndexError` past the last group, for a non-empty range that ends
        past the end (an empty one maps to `[]`), or in a given-back block;
        `MemoryError` for a range too long to hold."""
    def close(self) -> None:
        """Gives every block back now. Closing twice does nothing."""
    def __enter__(self) -> Self:
        """Returns the sequence; raises `ValueError` if it is closed."""
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

def hash_blocks(
    tokens: Union[Iterable[_Int], Buffer],
    block_size: _Int,
    salt: bytes = b"",
    parent: Optional[bytes] = None,
    *,
    start: Optional[_Int] = None,
    lora: Optional[_Bytes] = None,
    cache_salt: Optional[_Bytes] = None,
    multimodal: Iterable[Tuple[_Bytes, _Int, _Int]] = (),
    custom: Iterable[Tuple[_Bytes, _Bytes, _Int, _Int]] = (),
) -> list[bytes]:
    """The 32-byte keys of the full blocks of `tokens`, identical to Rust's
    `kvslots::hash_blocks` (with extras, `kvslots::hash_blocks_with`).

    `tokens`: ints in `0..2**32`, `bytes` of little-endian uint32s (or a
    one-dimensional `memoryview` of them, read as the same bytes whatever
    its format), or a one-dimensional buffer of integers (numpy
    array of any byte order, `array.array`; one token an item, one-byte
    items included; `ValueError` for another number of dimensions;
    `TypeError` for a set, whose order is arbitrary). With
    `parent` (the key of the block before `tokens[0]`) the keys continue
    that chain; `salt` must then be empty.

    Extras enter the keys of the blocks they apply to, so that the same
    tokens under another adapter, salt or image never share cached blocks
    (`bytes`, `bytearray` or `str`, taken as UTF-8): `lora` (an adapter's
    name, for good) and `cache_salt` (vLLM's per-request `cache_salt`)
    every block's; each `multimodal` item `(hash, offset, length)` (an
    input's content hash and the prompt positions `offset..offset +
    length` of its placeholder tokens, vLLM's `PlaceholderRange`) and
    each `custom` item `(tag, bytes, offset, length)` the blocks that
    overlap its positions. A block no extra applies to keeps its plain
    key. With `parent` and extras, `start` is the prompt position of
    `tokens[0]` (a positive multiple of `block_size`): the keys then equal
    those of the whole prompt's call.

    Raises `ValueError` for `block_size == 0`, a token outside `0..2**32`,
    a `parent` that is not 32 bytes, a `salt` with a `parent`, a `start`
    without a `parent` or not a positive multiple of `block_size`, a
    `parent` with extras but no `start`, an extra of `length` 0, or an
    item tuple of the wrong length; `TypeError` for tokens that are not
    ints, an extra that is not bytes or str, or an item that is not a
    tuple; `OverflowError` for a range past `2**64`.
    """

def hash_blocks_packed(
    tokens: Union[Iterable[_Int], Buffer],
    block_size: _Int,
    salt: bytes = b"",
    parent: Optional[bytes] = None,
    *,
    start: Optional[_Int] = None,
    lora: Optional[_Bytes] = None,
    cache_salt: Optional[_Bytes] = None,
    multimodal: Iterable[Tuple[_Bytes, _Int, _Int]] = (),
    custom: Iterable[Tuple[_Bytes, _Bytes, _Int, _Int]] = (),
) -> bytes:
    """`hash_blocks`'s keys laid end to end (key `i` is
    `packed[32 * i : 32 * i + 32]`), which `Sequence.match_prefix` and
    `Sequence.publish` read in one copy. Same arguments and errors."""

def try_append_each(
    seqs: Iterable[Union[Sequence, HybridSequence]],
    n: Union[_Int, Iterable[_Int]] = 1,
) -> int:
    """Appends `n` tokens to each sequence of `seqs` in turn (`n` one int
    for all, or one int a sequence), each append all or nothing as in
    `try_append`, and stops at the first sequence that cannot append now.
    Returns how many appended: the first `k` did, the rest are unchanged.

    A sequence cannot append now if its pool lacks the blocks, its last
    block needs a copy first, it is closed, or another call (of any thread)
    holds it: this call never waits. `seqs[k].try_append(n)` raises the
    reason (waiting for a held sequence). A decode step that preempts the
    last-admitted sequences when the pool runs out:

        done = kvslots.try_append_each(running)
        while done < len(running):
            try:
                running[done].try_append(1)  # the reason (or a late success)
                done += 1
            except kvslots.Full:
                running.pop().close()  # preempted: its blocks come back
            except kvslots.NeverFits:
                running.pop(done).close()  # the pool is too small for it
            done += kvslots.try_append_each(running[done:])

    Raises `TypeError` for an item that is no sequence, a count that is no
    int, a set as `seqs` or `n` (its order is arbitrary), a dict as `seqs`
    or `n` (it iterates its keys: pass the sequences and their counts as
    two lists), or `bytes` or `bytearray` as `n` (a byte is no count);
    `ValueError` for a negative count or counts of another length than
    `seqs`, `OverflowError` past `2**64`: before any append. The GIL
    is released for 32 sequences or more.
    """
