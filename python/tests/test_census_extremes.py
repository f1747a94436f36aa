"""The census at the extremes, from Python: every call with ints at and past
the ends of its Rust type (`2**64 - 1`, `2**64`, `2**100`, negatives),
wrong types (floats, strings, None), keys of the wrong length, and long
repetitive lists. Each refusal must be an ordinary exception (a panic would
surface as pyo3's `PanicException`, a `BaseException`, and fail the test)
of the documented type, and change nothing observable; each accepted
extreme must give the documented result.

Tests marked `skip(reason="reproduces: ...")` reproduce a defect: they
assert what the docs promise, which the binding does not do yet."""

import array

import pytest

import kvslots
from conftest import pool_state, run_python, seq_state

BIG = [2**64, 2**100]
NEGATIVE = [-1, -(2**70)]
NOT_INTS = [1.0, 0.5, float("nan"), "1", None, b"1"]


def hybrid_state(h):
    groups = len(h.groups)
    return (
        len(h),
        h.capacity,
        h.held_blocks,
        tuple(tuple(h.block_ids(g)) for g in range(groups)),
        tuple(h.null_blocks(g) for g in range(groups)),
    )


def refused(call, exc, *states):
    """`call()` raises `exc` (an ordinary exception) and every state
    function returns what it did before."""
    before = [s() for s in states]
    with pytest.raises(exc):
        call()
    assert [s() for s in states] == before


@pytest.fixture
def world():
    pool = kvslots.BlockPool(16, 4, kv_events=64)
    seq = kvslots.Sequence(pool)
    seq.try_append(6)
    raw = pool.try_alloc(2)
    return pool, seq, raw


# ---------------------------------------------------------------------------
# Ints past the ends
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("v", BIG)
def test_ints_past_u64_raise_overflow_and_change_nothing(world, v):
    pool, seq, raw = world
    p = lambda: pool_state(pool)  # noqa: E731
    s = lambda: seq_state(seq)  # noqa: E731
    for call in [
        lambda: pool.try_alloc(v),
        lambda: pool.alloc(v, timeout=0),
        lambda: pool.complete(v),
        lambda: seq.try_append(v),
        lambda: seq.append_cow(v),
        lambda: seq.try_reserve(v),
        lambda: seq.try_reserve(1, v),
        lambda: seq.reserve(1, v, timeout=0),
        lambda: seq.truncate(v),
        lambda: seq.truncate_fenced(1, v),
        lambda: seq.retire_copy_source(v),
        lambda: seq.slot(v),
        lambda: seq.slot_mapping(v),
        lambda: seq.slot_mapping(0, v),
        lambda: seq.slot_mapping_buffer(0, v),
    ]:
        refused(call, OverflowError, p, s)
    # A free or add_refs of an id past u64 names no block of the pool.
    for call in [lambda: pool.free([raw[0], v]), lambda: pool.add_refs([raw[0], v])]:
        before = (p(), s())
        with pytest.raises(kvslots.FreeError) as e:
            call()
        assert (e.value.kind, e.value.id, e.value.num_blocks) == ("out_of_range", v, 16)
        assert (p(), s()) == before
    assert pool.ref_count(v) is None


@pytest.mark.parametrize("v", NEGATIVE)
def test_negative_ints_raise_value_error_and_change_nothing(world, v):
    pool, seq, raw = world
    p = lambda: pool_state(pool)  # noqa: E731
    s = lambda: seq_state(seq)  # noqa: E731
    for call in [
        lambda: pool.try_alloc(v),
        lambda: pool.complete(v),
        lambda: seq.try_append(v),
        lambda: seq.try_reserve(1, v),
        lambda: seq.truncate(v),
        lambda: seq.truncate_fenced(1, v),
        lambda: seq.slot(v),
        lambda: seq.slot_mapping(v),
        lambda: kvslots.BlockPool(v, 4),
        lambda: kvslots.BlockPool(4, v),
        lambda: kvslots.BlockPool(4, 4, shards=v),
        lambda: kvslots.BlockPool(4, 4, kv_events=v),
        lambda: kvslots.KvGroups([v]),
        lambda: kvslots.hash_blocks([1, 2], v),
    ]:
        refused(call, ValueError, p, s)
    before = (p(), s())
    with pytest.raises(kvslots.FreeError) as e:
        pool.free([raw[0], v])
    assert (e.value.kind, e.value.id) == ("out_of_range", v)
    assert (p(), s()) == before
    assert pool.ref_count(v) is None


@pytest.mark.parametrize("v", NOT_INTS)
def test_non_ints_raise_type_error_and_change_nothing(world, v):
    pool, seq, raw = world
    p = lambda: pool_state(pool)  # noqa: E731
    s = lambda: seq_state(seq)  # noqa: E731
    for call in [
        lambda: pool.try_alloc(v),
        lambda: pool.free([raw[0], v]),
        lambda: pool.add_refs([raw[0], v]),
        lambda: seq.try_append(v),
        lambda: seq.try_reserve(v),
        lambda: seq.truncate(v),
        lambda: seq.slot(v),
        lambda: kvslots.hash_blocks([1, v], 1),
    ]:
        refused(call, TypeError, p, s)


def test_u64_max_is_accepted_where_it_means_nothing_or_never(world):
    pool, seq, raw = world
    m = 2**64 - 1
    before = (pool_state(pool), seq_state(seq))
    for call in [
        lambda: pool.try_alloc(m),
        lambda: pool.alloc(m, timeout=0),
        lambda: seq.try_append(m),
        lambda: seq.append_cow(m),
        lambda: seq.try_reserve(m, m),
        lambda: seq.reserve(m, timeout=0),
    ]:
        with pytest.raises(kvslots.NeverFits):
            call()
    assert (pool_state(pool), seq_state(seq)) == before
    assert seq.truncate(m) == 0
    assert seq.truncate_fenced(m, m) == 0
    assert seq.slot(m) is None
    assert seq.slot_mapping(m, m) == []
    assert pool.complete(m) == 0
    assert pool.ref_count(m) is None
    with pytest.raises(IndexError):
        seq.slot_mapping(0, m)
    assert (pool_state(pool), seq_state(seq)) == before


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), -1.0, -1e300])
def test_a_timeout_that_is_not_finite_seconds_is_refused(world, timeout):
    pool, seq, raw = world
    refused(lambda: pool.alloc(1, timeout=timeout), ValueError, lambda: pool_state(pool))
    refused(lambda: seq.reserve(100, timeout=timeout), ValueError, lambda: pool_state(pool),
            lambda: seq_state(seq))


@pytest.mark.parametrize("timeout", [1e20, 1e300, 2**1000])
def test_a_finite_timeout_past_any_deadline_is_no_limit(world, timeout):
    # Finite seconds are accepted, however many: past what a deadline can
    # hold, the wait has no limit, as with None. Free blocks come at once.
    pool, seq, raw = world
    assert len(pool.alloc(2, timeout=timeout)) == 2
    seq.reserve(10, timeout=timeout)
    assert seq.capacity >= len(seq) + 10
    h = kvslots.HybridSequence(pool, kvslots.KvGroups(["full"]))
    h.reserve(4, timeout=timeout)
    assert h.capacity == 4


def test_pool_sizes_at_and_past_their_maxima():
    m = kvslots.BlockPool.MAX_BLOCKS
    with pytest.raises(ValueError):
        kvslots.BlockPool(m + 1, 4)
    with pytest.raises(ValueError):
        kvslots.BlockPool(2, 2**64 - 1)
    with pytest.raises(ValueError):
        kvslots.BlockPool(4, 4, shards=kvslots.BlockPool.MAX_SHARDS + 1)
    with pytest.raises(MemoryError):
        kvslots.BlockPool(8, 4, kv_events=2**64 - 1)
    for blocks in [0, 3]:
        p = kvslots.BlockPool(blocks, 4, shards=kvslots.BlockPool.MAX_SHARDS, kv_events=1)
        assert p.shards == kvslots.BlockPool.MAX_SHARDS
        assert len(p.try_alloc(blocks)) == blocks
        assert p.free_blocks == 0


@pytest.mark.parametrize(
    "args,kw",
    [((2**64, 4), {}), ((4, 2**64), {}), ((4, 4), {"shards": 2**64}), ((4, 4), {"kv_events": 2**64})],
)
def test_pool_arguments_past_u64_raise_value_error_as_documented(args, kw):
    with pytest.raises(ValueError):
        kvslots.BlockPool(*args, **kw)


# ---------------------------------------------------------------------------
# Keys of the wrong length or type
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "keys,exc",
    [
        (b"x" * 31, ValueError),
        (b"x" * 33, ValueError),
        ([b"x" * 31], ValueError),
        ([b"x" * 33], ValueError),
        ([b"x" * 32, b""], ValueError),
        ([1], TypeError),
        ("a" * 32, TypeError),
        (None, TypeError),
    ],
)
def test_keys_of_the_wrong_length_or_type_are_refused(keys, exc):
    pool = kvslots.BlockPool(16, 4)
    good = kvslots.hash_blocks(list(range(16)), 4)
    seq = kvslots.Sequence(pool)
    seq.try_append(16)
    empty = kvslots.Sequence(pool)
    groups = kvslots.KvGroups(["full", 4])
    gk = groups.keys(good)
    states = (lambda: pool_state(pool), lambda: seq_state(seq), lambda: seq_state(empty),
              lambda: (len(gk), [gk.group(g) for g in range(2)]))
    for call in [
        lambda: seq.publish(keys),
        lambda: empty.match_prefix(keys),
        lambda: groups.keys(keys),
        lambda: gk.extend(keys),
    ]:
        refused(call, exc, *states)


@pytest.mark.parametrize("parent", [b"", b"x" * 31, b"x" * 33, bytes(64)])
def test_a_parent_key_of_the_wrong_length_is_refused(parent):
    with pytest.raises(ValueError):
        kvslots.hash_blocks([1], 1, parent=parent)


# ---------------------------------------------------------------------------
# Hybrid sequences at the extremes
# ---------------------------------------------------------------------------


def test_the_first_needed_block_at_the_last_position():
    # Position 2**64 - 1 reads `2**64 - window ..= 2**64 - 1`.
    groups = kvslots.KvGroups([1, 2, 2**64 - 1])
    last = 2**64 - 1
    assert groups.first_needed_block(0, last, 1) == last
    assert groups.first_needed_block(1, last, 1) == last - 1
    assert groups.first_needed_block(2, last, 1) == 1
    assert groups.first_needed_block(0, last, 2) == last // 2


def test_a_hybrid_length_past_u64_is_never_fits_and_changes_nothing():
    # A window gives its blocks back, so one block of 2**63 tokens holds a
    # one-token window's every position: only the length bounds it.
    pool = kvslots.BlockPool(1, 2**63)
    h = kvslots.HybridSequence(pool, kvslots.KvGroups([1]))
    assert h.try_append(2**63) == range(0, 2**63)

    def state():
        # Not `len(h)`: Python's `len` stops at 2**63 - 1 (OverflowError).
        return (h.capacity, h.held_blocks, h.block_ids(0), h.null_blocks(0), pool_state(pool))

    for call in (
        lambda: h.try_append(2**63),
        lambda: h.append_cow(2**64 - 1),
        lambda: h.append_fenced(2**63, 1),
    ):
        before = state()
        with pytest.raises(kvslots.NeverFits) as e:
            call()
        # The capacity: the pool's one block, which the window would give
        # back.
        assert (e.value.requested, e.value.capacity) == (2**64 - 1, 1)
        assert state() == before
    # Up to the last position it appends; the capacity saturates.
    assert h.try_append(2**63 - 1) == range(2**63, 2**64 - 1)
    assert (h.capacity, h.held_blocks) == (2**64 - 1, 1)
    assert h.block_ids(0) == [None, 0]
    assert h.slot(0, 2**64 - 2) == 2**63 - 2
    h.close()
    assert pool.free_blocks == 1


def run_limited(code):
    """`code` in a fresh interpreter whose address space is 4 GiB, so that
    an allocation too large fails there instead of growing this machine's
    memory: the process's exit code and output (an abort is -6)."""
    import resource
    import textwrap

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))

    return run_python(textwrap.dedent(code), preexec_fn=limit)


@pytest.mark.parametrize("form", ["slot_mapping", "slot_mapping_buffer", "hybrid"])
def test_a_slot_mapping_too_long_for_memory_is_a_memory_error(form):
    # 2**41 positions of 8 bytes: 16 TiB.
    p = run_limited(
        f"""
        import kvslots
        pool = kvslots.BlockPool(4, 2**40)
        if {form!r} == "hybrid":
            seq = kvslots.HybridSequence(pool, kvslots.KvGroups(["full"]))
            call = lambda: seq.slot_mapping(0, 0, 2**41)
        else:
            seq = kvslots.Sequence(pool)
            call = lambda: seq.{form}(0, 2**41)
        seq.try_append(2**41)
        try:
            call()
        except MemoryError as e:
            print("MemoryError:", e)
        assert (len(seq), pool.free_blocks) == (2**41, 2)
        """
    )
    assert p.returncode == 0, (p.returncode, p.stderr[-800:])
    assert "MemoryError: a slot mapping of 2199023255552 items" in p.stdout


@pytest.mark.parametrize("form", ["slot_mapping", "slot_mapping_buffer", "slot_mapping_array", "hybrid"])
def test_a_slot_mapping_past_any_vector_is_a_memory_error(form):
    # 2**62 positions: more bytes than a vector can hold (past isize).
    if form == "slot_mapping_array":
        pytest.importorskip("numpy")
    pool = kvslots.BlockPool(4, 2**61)
    if form == "hybrid":
        seq = kvslots.HybridSequence(pool, kvslots.KvGroups(["full"]))
        call = lambda: seq.slot_mapping(0, 0, 2**62)  # noqa: E731
        state = lambda: hybrid_state(seq)  # noqa: E731
    else:
        seq = kvslots.Sequence(pool)
        call = lambda: getattr(seq, form)(0, 2**62)  # noqa: E731
        state = lambda: seq_state(seq)  # noqa: E731
    seq.try_append(2**62)
    refused(call, MemoryError, state, lambda: pool_state(pool))
    # A range past the length stays an IndexError, however long.
    if form == "hybrid":
        refused(lambda: seq.slot_mapping(0, 0, 2**62 + 1), IndexError, state)
    else:
        refused(lambda: getattr(seq, form)(0, 2**62 + 1), IndexError, state)


def test_group_keys_too_large_for_memory_are_a_memory_error():
    # MAX_GROUPS groups of 2**18 keys of 32 bytes: 8 GiB from 8 MiB.
    p = run_limited(
        """
        import kvslots
        g = kvslots.KvGroups(["full"] * kvslots.KvGroups.MAX_GROUPS)
        base = bytes(32 * 2**18)
        try:
            g.keys(base)
        except MemoryError as e:
            print("keys: MemoryError:", e)
        keys = g.keys(base[:64])
        try:
            keys.extend(base)
        except MemoryError:
            print("extend: MemoryError")
        assert len(keys) == 2
        """
    )
    assert p.returncode == 0, (p.returncode, p.stderr[-800:])
    assert "keys: MemoryError: group keys of" in p.stdout
    assert "extend: MemoryError" in p.stdout


@pytest.mark.parametrize("kinds", ["full", b"ab", bytearray(b"\x08"), memoryview(b"ab")])
def test_groups_given_as_one_string_are_refused(kinds):
    with pytest.raises(TypeError, match="iterable of groups"):
        kvslots.KvGroups(kinds)


def test_a_window_of_u64_max_tokens_never_gives_a_block_back():
    groups = kvslots.KvGroups(["full", 2**64 - 1])
    assert groups.kinds == ["full", 2**64 - 1]
    # Position 2**64 - 2 reads from 0; the last, from 1.
    assert groups.first_needed_block(1, 2**64 - 2, 1) == 0
    assert groups.first_needed_block(1, 2**64 - 1, 1) == 1
    pool = kvslots.BlockPool(64, 4)
    h = kvslots.HybridSequence(pool, groups)
    assert h.try_append(41) == range(0, 41)
    assert h.null_blocks(1) == 0
    assert h.held_blocks == 22
    assert h.truncate(1) == 20
    h.close()
    assert pool.used_blocks == 0


@pytest.mark.parametrize("v", BIG)
def test_hybrid_ints_past_u64_raise_and_change_nothing(v):
    pool = kvslots.BlockPool(16, 4)
    groups = kvslots.KvGroups(["full", 2**64 - 1, 1])
    h = kvslots.HybridSequence(pool, groups)
    h.try_append(10)
    states = (lambda: pool_state(pool), lambda: hybrid_state(h))
    for call in [
        lambda: kvslots.KvGroups(["full", v]),
        lambda: groups.first_needed_block(v, 1, 1),
        lambda: groups.first_needed_block(0, v, 1),
        lambda: h.try_append(v),
        lambda: h.append_fenced(1, v),
        lambda: h.truncate(v),
        lambda: h.block_ids(v),
        lambda: h.slot(0, v),
        lambda: h.slot_mapping(v),
    ]:
        refused(call, OverflowError, *states)
    for call in [
        lambda: h.block_ids(2**64 - 1),
        lambda: h.null_blocks(2**64 - 1),
        lambda: h.slot(2**64 - 1, 0),
        lambda: h.slot_mapping(3),
        lambda: h.slot_mapping(0, 0, 2**64 - 1),
        lambda: groups.first_needed_block(2**64 - 1, 1, 1),
    ]:
        refused(call, IndexError, *states)
    for call in [lambda: h.try_append(2**64 - 1), lambda: h.try_reserve(2**64 - 1, 2**64 - 1)]:
        refused(call, kvslots.NeverFits, *states)
    refused(lambda: groups.first_needed_block(0, 1, 0), ValueError, *states)
    assert h.truncate(2**64 - 1) == 0
    assert h.slot(0, 2**64 - 1) is None


def test_a_window_of_one_token_over_a_long_decode():
    pool = kvslots.BlockPool(4, 1)
    h = kvslots.HybridSequence(pool, kvslots.KvGroups([1]))
    for step in range(20_000):
        assert h.try_append(1) == range(step, step + 1)
    assert (h.held_blocks, pool.used_blocks, h.null_blocks(0)) == (1, 1, 19_999)
    before = (pool_state(pool), hybrid_state(h))
    with pytest.raises(kvslots.WindowError) as e:
        h.truncate(1)
    assert (e.value.len, e.value.min_len) == (1, 19_999)
    assert (pool_state(pool), hybrid_state(h)) == before
    assert h.truncate(0) == 1
    assert pool.used_blocks == 0


# ---------------------------------------------------------------------------
# Long and repetitive lists
# ---------------------------------------------------------------------------


def test_a_block_listed_a_million_times():
    pool = kvslots.BlockPool(4, 4)
    (b,) = pool.try_alloc(1)
    pool.add_refs([b] * 10**6)
    assert pool.ref_count(b) == 10**6 + 1
    before = pool_state(pool)
    with pytest.raises(kvslots.FreeError) as e:
        pool.free([b] * (10**6 + 2))
    assert (e.value.kind, e.value.id) == ("over_freed", b)
    assert pool_state(pool) == before
    pool.free([b] * (10**6 + 1))
    assert pool.used_blocks == 0


def test_a_list_that_raises_midway_changes_nothing():
    pool = kvslots.BlockPool(4, 4)
    ids = pool.try_alloc(2)

    def ids_then_error():
        yield ids[0]
        raise ZeroDivisionError

    before = pool_state(pool)
    for call in [pool.free, pool.add_refs]:
        with pytest.raises(ZeroDivisionError):
            call(ids_then_error())
        assert pool_state(pool) == before


def test_hash_blocks_at_the_extremes():
    assert kvslots.hash_blocks([1, 2, 3], 2**64 - 1) == []
    assert kvslots.hash_blocks_packed(range(10), 2**64 - 1) == b""
    for bad in [[2**32], [-1], [2**64]]:
        with pytest.raises(ValueError):
            kvslots.hash_blocks(bad, 1)
    with pytest.raises(ValueError):
        kvslots.hash_blocks(array.array("q", [-1]), 1)
    with pytest.raises(ValueError):
        kvslots.hash_blocks(array.array("Q", [2**40]), 1)
    with pytest.raises(TypeError):
        kvslots.hash_blocks(array.array("d", [1.0]), 1)
    with pytest.raises(ValueError):
        kvslots.hash_blocks(b"abc", 1)
    with pytest.raises(ValueError):
        kvslots.hash_blocks([1], 1, salt=b"s", parent=b"x" * 32)
    assert len(kvslots.hash_blocks_packed(array.array("I", range(10**5)), 1)) == 32 * 10**5
    for code in "hHiIlLqQ":
        assert kvslots.hash_blocks(array.array(code, [1, 2, 3, 4]), 1) == kvslots.hash_blocks(
            [1, 2, 3, 4], 1
        ), code


@pytest.mark.parametrize("code", ["b", "B"])
def test_hash_blocks_of_a_one_byte_integer_buffer_is_one_token_per_item(code):
    assert kvslots.hash_blocks(array.array(code, [1, 2, 3, 4]), 1) == kvslots.hash_blocks(
        [1, 2, 3, 4], 1
    )
    assert kvslots.hash_blocks_packed(array.array(code, [1, 2, 3]), 1) == b"".join(
        kvslots.hash_blocks([1, 2, 3], 1)
    )


def test_a_negative_one_byte_token_is_refused():
    with pytest.raises(ValueError, match="0..2"):
        kvslots.hash_blocks(array.array("b", [1, -1, 3, 4]), 1)


def test_bytes_and_a_memoryview_of_them_stay_little_endian_uint32s():
    raw = (7).to_bytes(4, "little") + (9).to_bytes(4, "little")
    want = kvslots.hash_blocks([7, 9], 1)
    for form in (raw, bytearray(raw), memoryview(raw), memoryview(bytearray(raw))):
        assert kvslots.hash_blocks(form, 1) == want, type(form)
    with pytest.raises(ValueError, match="multiple of 4"):
        kvslots.hash_blocks(memoryview(raw[:5]), 1)


def test_numpy_one_byte_arrays_are_one_token_per_item():
    np = pytest.importorskip("numpy")
    want = kvslots.hash_blocks([1, 2, 3, 4], 1)
    for dtype in (np.uint8, np.int8):
        assert kvslots.hash_blocks(np.array([1, 2, 3, 4], dtype=dtype), 1) == want
    with pytest.raises(ValueError):
        kvslots.hash_blocks(np.array([1, -2], dtype=np.int8), 1)
