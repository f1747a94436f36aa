"""How arguments are read, at their edges: what an int-like's `__index__`
raises reaches the caller unchanged (a `KeyboardInterrupt` included) with
nothing changed; a `memoryview` of `bytes` reads as the bytes do whatever
its format; a list subclass is read through its own `__iter__`; a
sequence's length past `sys.maxsize` is an `OverflowError` that says so;
a reservation the blocks held already cover checks nothing."""

import struct
import sys

import pytest

import kvslots
from conftest import pool_state, seq_state


class Boom(Exception):
    """What the int-likes below raise."""


class Raising:
    """An int-like whose `__index__` raises `error`."""

    def __init__(self, error):
        self.error = error

    def __index__(self):
        raise self.error


class NotAnInt:
    """An int-like whose `__index__` returns a str."""

    def __index__(self):
        return "3"


@pytest.mark.parametrize("error", [Boom("from __index__"), KeyboardInterrupt()])
def test_what_index_raises_reaches_the_caller_and_changes_nothing(error):
    pool = kvslots.BlockPool(64, 4)
    held = pool.try_alloc(40)
    seq = kvslots.Sequence(pool)
    seq.try_append(5)
    before, seq_before = pool_state(pool), seq_state(seq)
    bad = Raising(error)
    calls = [
        lambda: pool.try_alloc(bad),
        lambda: pool.alloc(bad, timeout=0),
        lambda: pool.ref_count(bad),
        lambda: pool.free([held[0], bad]),
        # 32 ids or more: the list is read in one C call first.
        lambda: pool.free(held[:39] + [bad]),
        lambda: pool.add_refs(held[:39] + [bad]),
        lambda: seq.try_append(bad),
        lambda: seq.truncate(bad),
        lambda: seq.slot(bad),
        lambda: kvslots.hash_blocks([1, 2, bad, 4], 2),
        lambda: kvslots.hash_blocks([1, 2, 3, 4], bad),
        lambda: kvslots.KvGroups(["full", bad]),
    ]
    for i, call in enumerate(calls):
        with pytest.raises(type(error)) as raised:
            call()
        assert raised.value is error, i
        assert pool_state(pool) == before, i
        assert seq_state(seq) == seq_before, i
    pool.free(held)


def test_an_index_that_returns_no_int_is_cpythons_type_error():
    pool = kvslots.BlockPool(8, 4)
    before = pool_state(pool)
    for call in (lambda: pool.try_alloc(NotAnInt()), lambda: pool.free([NotAnInt()])):
        with pytest.raises(TypeError, match="__index__ returned non-int"):
            call()
        assert pool_state(pool) == before


def test_objects_without_index_still_name_what_was_expected():
    pool = kvslots.BlockPool(8, 4)
    with pytest.raises(TypeError, match="n must be an int, not float"):
        pool.try_alloc(1.0)
    with pytest.raises(TypeError, match="a block id must be an int, not str"):
        pool.free(["1"])
    with pytest.raises(TypeError, match="a token id must be an int, not float"):
        kvslots.hash_blocks([1.0], 1)


@pytest.mark.parametrize("fmt", ["B", "b", "c", "H", "h", "I", "i", "Q", "f"])
def test_a_memoryview_of_bytes_reads_as_the_bytes_whatever_its_format(fmt):
    raw = struct.pack("<8I", *range(8))
    want = kvslots.hash_blocks(raw, 4)
    assert len(want) == 2
    view = memoryview(raw).cast(fmt)
    assert kvslots.hash_blocks(view, 4) == want
    assert kvslots.hash_blocks(memoryview(bytearray(raw)).cast(fmt), 4) == want


def test_kv_groups_take_int_likes_as_windows():
    class Window:
        def __index__(self):
            return 128

    assert kvslots.KvGroups([Window(), "full"]).kinds == [128, "full"]
    np = pytest.importorskip("numpy")
    assert kvslots.KvGroups([np.int64(128), "full"]).kinds == [128, "full"]
    with pytest.raises(TypeError):
        kvslots.KvGroups([128.0, "full"])
    with pytest.raises(ValueError, match="must be >= 0"):
        kvslots.KvGroups([np.int64(-1), "full"])


def test_a_length_past_maxsize_is_an_overflow_error_that_says_so():
    pool = kvslots.BlockPool(1, 2**64 - 1)
    seq = kvslots.Sequence(pool)
    seq.try_append(2**64 - 1)
    with pytest.raises(OverflowError, match="more than len"):
        len(seq)
    assert seq.capacity == 2**64 - 1
    seq.truncate(sys.maxsize)
    assert len(seq) == sys.maxsize
    seq.close()
    hybrid = kvslots.HybridSequence(pool, kvslots.KvGroups(["full"]))
    hybrid.try_append(2**64 - 1)
    with pytest.raises(OverflowError, match="more than len"):
        len(hybrid)
    hybrid.truncate(5)
    assert len(hybrid) == 5


def test_a_list_subclass_is_read_through_its_own_iter():
    class Reversed(list):
        def __iter__(self):
            return iter(list(list.__iter__(self))[::-1])

    tokens = list(range(8))
    assert kvslots.hash_blocks(Reversed(tokens), 4) == kvslots.hash_blocks(tokens[::-1], 4)
    pool = kvslots.BlockPool(8, 4)
    ids = pool.try_alloc(3)
    # Freed through the subclass's order: the refusal names the first bad
    # id in that order.
    free = [i for i in range(8) if i not in ids][:2]
    with pytest.raises(kvslots.FreeError) as err:
        pool.free(Reversed([ids[0]] + free))
    assert (err.value.id, err.value.kind) == (free[1], "not_allocated")
    assert pool.used_blocks == 3
    pool.free(Reversed(ids))
    assert pool.used_blocks == 0


def test_a_reservation_already_covered_checks_nothing():
    pool = kvslots.BlockPool(4, 4)
    seq = kvslots.Sequence(pool)
    seq.try_append(3)
    pool.close()
    before, seq_before = pool_state(pool), seq_state(seq)
    # One more token fits the block held: no headroom or closed check.
    assert seq.try_reserve(1, headroom=1000) is None
    assert (pool_state(pool), seq_state(seq)) == (before, seq_before)
    with pytest.raises(kvslots.Closed):
        seq.try_reserve(2)
    with pytest.raises(kvslots.Closed):
        pool.try_alloc(0)
    assert (pool_state(pool), seq_state(seq)) == (before, seq_before)
