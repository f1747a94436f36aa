"""BlockPool: construction, allocation, frees, waiting, fences and every bad
input, each refusal checked for its exception and the unchanged state."""

import pickle
import signal
import sys
import threading

import pytest

import kvslots
from conftest import Interrupted, alarm, pool_state, run_python, seq_state


def test_construction_and_properties():
    pool = kvslots.BlockPool(128, 16)
    assert (pool.num_blocks, pool.block_size) == (128, 16)
    assert (pool.free_blocks, pool.used_blocks, pool.cached_blocks) == (128, 0, 0)
    assert pool.shards == 2  # one per 64 blocks
    assert kvslots.BlockPool(128, 16, shards=5).shards == 5
    assert kvslots.BlockPool(0, 16).free_blocks == 0
    assert not pool.closed
    assert pool.waiters == 0
    assert kvslots.BlockPool.MAX_BLOCKS == 2**32 - 1
    assert repr(pool) == "BlockPool(num_blocks=128, block_size=16, free_blocks=128, closed=False)"


@pytest.mark.parametrize(
    "args, kwargs, error",
    [
        ((8, 0), {}, ValueError),
        ((-1, 16), {}, ValueError),
        ((8, -16), {}, ValueError),
        ((2**32, 16), {}, ValueError),
        ((2**31, 2**40), {}, ValueError),
        ((8, 16), {"shards": 0}, ValueError),
        ((8, 16), {"shards": 1025}, ValueError),
        ((8, 16), {"shards": -1}, ValueError),
        ((8.0, 16), {}, TypeError),
        ((8, "16"), {}, TypeError),
        ((2**80, 16), {}, ValueError),
    ],
)
def test_bad_construction_raises(args, kwargs, error):
    with pytest.raises(error):
        kvslots.BlockPool(*args, **kwargs)


def test_try_alloc_is_all_or_nothing(pool):
    ids = pool.try_alloc(10)
    assert len(set(ids)) == 10 and all(0 <= i < 16 for i in ids)
    assert pool.used_blocks == 10
    before = pool_state(pool)
    with pytest.raises(kvslots.Full) as err:
        pool.try_alloc(7)
    assert (err.value.requested, err.value.available) == (7, 6)
    assert isinstance(err.value, kvslots.ReserveError)
    assert pool_state(pool) == before
    with pytest.raises(kvslots.NeverFits) as err:
        pool.try_alloc(17)
    assert (err.value.requested, err.value.capacity) == (17, 16)
    assert pool_state(pool) == before
    assert pool.try_alloc(0) == []
    pool.free(ids)
    assert pool.free_blocks == 16
    assert pool.peak_used_blocks == 10


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (1.0, TypeError), (2**64, OverflowError),
                                        (10**30, OverflowError), (-(10**30), ValueError),
                                        ("3", TypeError), (None, TypeError), ([1], TypeError)])
def test_bad_counts_raise_and_change_nothing(pool, bad, error):
    held = pool.try_alloc(3)
    before = pool_state(pool)
    with pytest.raises(error):
        pool.try_alloc(bad)
    with pytest.raises(error):
        pool.alloc(bad, timeout=0)
    assert pool_state(pool) == before
    pool.free(held)


class IndexOnly:
    """An int-like with `__index__` and nothing else (no `<`, no `__int__`)."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


@pytest.mark.parametrize("value, error, message", [(-1, ValueError, "must be >= 0, got -1"),
                                                   (-(2**70), ValueError, f"got {-(2**70)}"),
                                                   (2**70, OverflowError, f"{2**70} is too large")])
def test_bad_int_likes_raise_the_int_error_and_change_nothing(pool, value, error, message):
    held = pool.try_alloc(3)
    before = pool_state(pool)
    with pytest.raises(error, match=message):
        pool.try_alloc(IndexOnly(value))
    with pytest.raises(error, match=message):
        pool.alloc(IndexOnly(value), timeout=0)
    assert pool_state(pool) == before
    pool.free(held)


def test_numpy_style_ints_are_accepted(pool):
    class Index:
        def __index__(self):
            return 2

    assert len(pool.try_alloc(Index())) == 2
    assert len(pool.try_alloc(True)) == 1


def test_free_errors_name_the_id_and_change_nothing(pool):
    ids = pool.try_alloc(4)
    before = pool_state(pool)
    cases = [
        ([ids[0], 16], 16, "out_of_range"),
        ([ids[0], -3], -3, "out_of_range"),
        ([2**40], 2**40, "out_of_range"),
        ([ids[1], 15], 15, "not_allocated"),
        ([ids[2], ids[2]], ids[2], "over_freed"),
    ]
    for bad, bad_id, kind in cases:
        with pytest.raises(kvslots.FreeError) as err:
            pool.free(bad)
        assert isinstance(err.value, ValueError)
        assert (err.value.id, err.value.kind) == (bad_id, kind), bad
        assert err.value.num_blocks == (16 if kind == "out_of_range" else None)
        assert pool_state(pool) == before, bad
    for bad in ([ids[0], 1.5], [ids[0], "1"], [ids[0], None], 5, None):
        with pytest.raises(TypeError):
            pool.free(bad)
        assert pool_state(pool) == before, bad
    pool.free(ids)
    with pytest.raises(kvslots.FreeError) as err:
        pool.free(ids[:1])  # a double free
    assert err.value.kind == "not_allocated"
    assert pool.free_blocks == 16


def test_free_error_ids_are_ints_for_every_kind(pool):
    class Index:
        def __init__(self, value):
            self.value = value

        def __index__(self):
            return self.value

    ids = pool.try_alloc(2)
    free_id = next(i for i in range(16) if pool.ref_count(i) == 0)
    before = pool_state(pool)
    for bad_id, kind in ((free_id, "not_allocated"), (99, "out_of_range"), (-2, "out_of_range"),
                         (2**70, "out_of_range")):
        for call in (pool.free, pool.add_refs):
            with pytest.raises(kvslots.FreeError) as err:
                call([ids[0], Index(bad_id)])
            assert err.value.kind == kind
            assert type(err.value.id) is int and err.value.id == bad_id
            assert pool_state(pool) == before
    pool.free(ids)
    assert pool.free_blocks == 16


def test_add_refs_shares_raw_blocks(pool):
    ids = pool.try_alloc(2)
    pool.add_refs([ids[0], ids[0], ids[1]])
    assert [pool.ref_count(i) for i in ids] == [3, 2]
    pool.free(ids)
    assert [pool.ref_count(i) for i in ids] == [2, 1]
    pool.free([ids[0], ids[0], ids[1]])
    assert pool.free_blocks == 16
    pool.add_refs([])
    assert pool.free_blocks == 16


def test_add_refs_errors_name_the_id_and_change_nothing(pool):
    ids = pool.try_alloc(3)
    seq = kvslots.Sequence(pool)
    seq.try_append(16)
    held = seq.block_ids[0]
    free_id = next(i for i in range(16) if pool.ref_count(i) == 0)
    before = pool_state(pool)
    cases = [
        ([ids[0], 16], 16, "out_of_range"),
        ([ids[0], -1], -1, "out_of_range"),
        ([ids[1], free_id], free_id, "not_allocated"),
        ([ids[2], held], held, "held_by_sequence"),
    ]
    for bad, bad_id, kind in cases:
        with pytest.raises(kvslots.FreeError) as err:
            pool.add_refs(bad)
        assert (err.value.id, err.value.kind) == (bad_id, kind), bad
        assert pool_state(pool) == before, bad
    for bad in ([ids[0], 1.5], [ids[0], "1"], 5, None):
        with pytest.raises(TypeError):
            pool.add_refs(bad)
        assert pool_state(pool) == before, bad
    seq.close()
    pool.free(ids)
    assert pool.free_blocks == 16


def test_free_accepts_any_iterable(pool):
    ids = pool.try_alloc(5)
    pool.free(tuple(ids[:2]))
    pool.free(i for i in ids[2:4])
    pool.free(range(ids[4], ids[4] + 1))
    pool.free([])
    assert pool.free_blocks == 16


@pytest.mark.parametrize("n", [31, 32, 33, 100])
@pytest.mark.parametrize("method", ["free", "add_refs"])
def test_long_id_lists_are_read_as_short_ones(n, method):
    """Lists and tuples of 32 ids or more are read in one C call; every
    result and error is the same as item by item."""
    pool = kvslots.BlockPool(256, 16)
    ids = pool.try_alloc(n)
    call = getattr(pool, method)
    before = pool_state(pool)
    np = pytest.importorskip("numpy")
    for where in (0, n // 2, n - 1):
        for bad, check in [
            (256, lambda e: (e.id, e.kind, e.num_blocks) == (256, "out_of_range", 256)),
            (-5, lambda e: (e.id, e.kind) == (-5, "out_of_range")),
            (2**32, lambda e: (e.id, e.kind) == (2**32, "out_of_range")),
            (2**70, lambda e: (e.id, e.kind) == (2**70, "out_of_range")),
        ]:
            listed = list(ids)
            listed[where] = bad
            for form in (listed, tuple(listed)):
                with pytest.raises(kvslots.FreeError) as err:
                    call(form)
                assert check(err.value), (where, bad)
                assert pool_state(pool) == before
        for bad in (1.5, "1", None, b"x"):
            listed = list(ids)
            listed[where] = bad
            with pytest.raises(TypeError, match="block id must be an int"):
                call(listed)
            assert pool_state(pool) == before
    # The first bad item in list order is the one reported.
    listed = list(ids)
    listed[3], listed[n - 2] = 300, 1.5
    with pytest.raises(kvslots.FreeError) as err:
        call(listed)
    assert err.value.id == 300
    # A list subclass, a tuple, and numpy ints among plain ones.
    class Ids(list):
        pass

    forms = (Ids, tuple, lambda xs: [np.uint32(x) if k % 2 else x for k, x in enumerate(xs)])
    for form in forms:
        call(form(ids))
        if method == "add_refs":
            assert [pool.ref_count(i) for i in ids] == [2] * n
            pool.free(ids)
        else:
            assert pool.used_blocks == 0
            ids = pool.try_alloc(n)
    pool.free(ids)
    assert pool.used_blocks == 0


def test_errors_pickle_with_their_fields(pool):
    held = pool.try_alloc(15)
    with pytest.raises(kvslots.Full) as err:
        pool.try_alloc(2)
    pool.free(held)
    copy = pickle.loads(pickle.dumps(err.value))
    assert (type(copy), copy.requested, copy.available) == (kvslots.Full, err.value.requested,
                                                            err.value.available)


def test_ref_count(pool):
    [i] = pool.try_alloc(1)
    assert pool.ref_count(i) == 1
    assert pool.ref_count(15 if i != 15 else 14) == 0
    assert pool.ref_count(16) is None
    assert pool.ref_count(-1) is None
    assert pool.ref_count(2**70) is None
    with pytest.raises(TypeError):
        pool.ref_count(1.0)


def test_close_refuses_allocations_but_frees_work(pool):
    ids = pool.try_alloc(2)
    pool.close()
    assert pool.closed
    before = pool_state(pool)
    with pytest.raises(kvslots.Closed):
        pool.try_alloc(1)
    with pytest.raises(kvslots.Closed):
        pool.alloc(1, timeout=1.0)
    assert pool_state(pool) == before
    pool.free(ids)
    assert pool.free_blocks == 16


def test_alloc_times_out_with_full_and_leaves_the_queue(pool):
    held = pool.try_alloc(16)
    before = pool_state(pool)
    with pytest.raises(kvslots.Full) as err:
        pool.alloc(2, timeout=0.01)
    assert (err.value.requested, err.value.available) == (2, 0)
    assert pool.waiters == 0
    assert pool_state(pool) == before
    with pytest.raises(kvslots.NeverFits):
        pool.alloc(17)  # at once, with no timeout
    for bad in (-1.0, float("nan"), float("inf"), -1e300):
        with pytest.raises(ValueError):
            pool.alloc(1, timeout=bad)
    assert pool_state(pool) == before
    pool.free(held)


def test_alloc_waits_for_a_free_in_another_thread(pool):
    held = pool.try_alloc(16)
    got = []
    queued = threading.Event()

    def waiter():
        queued.set()
        # (The timeout only keeps a bug from hanging the suite.)
        got.append(pool.alloc(3, timeout=60))

    t = threading.Thread(target=waiter)
    t.start()
    queued.wait()
    # Whether the waiter queued yet or not, this free hands it its blocks.
    pool.free(held[:3])
    t.join()
    assert len(got[0]) == 3 and set(got[0]) == set(held[:3])
    assert pool.used_blocks == 16
    pool.free(held[3:] + got[0])


def test_close_wakes_a_waiter_with_closed(pool):
    held = pool.try_alloc(16)
    errors = []

    def waiter():
        try:
            pool.alloc(1, timeout=60)  # (the timeout only keeps a bug from hanging)
        except kvslots.Closed as e:
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    # The waiter either queued (and close wakes it) or had not yet tried
    # (and its first try sees the pool closed): Closed either way.
    pool.close()
    t.join()
    assert len(errors) == 1
    pool.free(held)


def test_fences_complete_in_any_order(pool):
    seqs = [kvslots.Sequence(pool) for _ in range(2)]
    for s in seqs:
        s.try_append(8)
    assert seqs[0].retire(7) == 2
    assert seqs[1].retire(3) == 2
    assert (pool.used_blocks, pool.pending_release_blocks) == (4, 4)
    assert pool.complete(99) == 0
    assert pool.complete(7) == 2
    assert pool.complete(3) == 2
    assert (pool.free_blocks, pool.pending_release_blocks) == (16, 0)
    assert pool.peak_pending_release_blocks == 4
    with pytest.raises(ValueError):
        pool.complete(-1)
    with pytest.raises(OverflowError):
        pool.complete(2**64)
    s = kvslots.Sequence(pool)
    s.try_append(4)
    s.retire(2**64 - 1)
    assert pool.complete_all() == 1
    assert pool.free_blocks == 16


def test_prefix_stats_and_reset(pool):
    keys = kvslots.hash_blocks(list(range(8)), 4)
    with kvslots.Sequence(pool) as s:
        s.try_append(8)
        assert s.publish(keys) == 2
    assert (pool.cached_blocks, pool.evictable_blocks, pool.free_blocks) == (2, 2, 16)
    with kvslots.Sequence(pool) as s:
        assert s.match_prefix(keys + [bytes(32)]) == 2
    assert pool.prefix_stats() == {"queried_blocks": 3, "hit_blocks": 2, "evictions": 0}
    assert pool.reset_prefix_cache() == 2
    assert pool.cached_blocks == 0


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
def test_a_signal_handler_interrupts_a_wait(pool):
    held = pool.try_alloc(16)
    before = pool_state(pool)

    with pytest.raises(Interrupted), alarm(0.05):
        pool.alloc(1, timeout=60)  # (the timeout only keeps a bug from hanging)
    # The wait was cancelled: out of the queue, nothing taken.
    assert pool.waiters == 0
    assert pool_state(pool) == before
    pool.free(held)


def test_a_new_caller_never_passes_a_queued_waiter():
    pool = kvslots.BlockPool(4, 16)
    held = pool.try_alloc(4)
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.alloc(3, timeout=60.0)))
    waiter.start()
    while pool.waiters == 0:  # the waiter has queued (a condition, not a sleep)
        assert waiter.is_alive()
    pool.free(held[:2])
    before = pool_state(pool)
    with pytest.raises(kvslots.BehindWaiters) as err:
        pool.try_alloc(1)  # 2 are free, but the queued head is owed 3
    assert isinstance(err.value, kvslots.Full)
    assert (err.value.requested, err.value.available, err.value.owed) == (1, 2, 3)
    assert err.value.headroom == 0
    assert pool_state(pool) == before
    # A reservation with headroom: the exception carries it, and says so.
    seq = kvslots.Sequence(pool)
    with pytest.raises(kvslots.BehindWaiters) as err:
        seq.try_reserve(16, headroom=1)  # 1 block and 1 free besides: 2 free, 3 owed
    assert (err.value.requested, err.value.headroom, err.value.available, err.value.owed) == (
        1, 1, 2, 3)
    assert "headroom of 1" in str(err.value)
    assert pool_state(pool) == before and seq_state(seq) == (0, (), 0)
    seq.close()
    pool.free(held[2:])
    waiter.join()
    assert len(got[0]) == 3 and pool.used_blocks == 3
    pool.free(got[0])
    assert pool.free_blocks == 4


def test_a_pool_without_the_prefix_cache_caches_nothing():
    pool = kvslots.BlockPool(8, 4, prefix_cache=False)
    assert not pool.has_prefix_cache and kvslots.BlockPool(8, 4).has_prefix_cache
    seq = kvslots.Sequence(pool)
    seq.try_append(8)
    keys = kvslots.hash_blocks(list(range(8)), 4)
    before = pool_state(pool)
    assert seq.publish(keys) == 0  # nothing to cache into: changes nothing
    assert pool_state(pool) == before
    seq.close()
    other = kvslots.Sequence(pool)
    assert other.match_prefix(keys) == 0 and len(other) == 0
    assert (pool.free_blocks, pool.cached_blocks) == (8, 0)
    with pytest.raises(ValueError):
        kvslots.BlockPool(8, 4, prefix_cache=False, kv_events=16)


ALLOC_OUT_OF_MEMORY = """
import resource
import kvslots

n = 1 << 22
pool = kvslots.BlockPool(n, 1, prefix_cache=False)
# The address space now, plus 120 MiB: about half of what a list of 4
# million ids takes with its buffers (about 112 MiB) and its ints (128
# MiB), whichever of them it runs out in.
ROOM = 120 << 20
with open("/proc/self/statm") as f:
    pages = int(f.read().split()[0])
now = pages * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (now + ROOM, resource.RLIM_INFINITY))
for call in (pool.try_alloc, lambda n: pool.alloc(n, timeout=0)):
    try:
        pool.free(call(n))
        print("allocated")
    except MemoryError:
        print("MemoryError", pool.used_blocks, pool.free_blocks == n)
# A sequence of every block: its slot mapping and block table, 4 million
# ints each, do not fit either.
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
seq = kvslots.Sequence(pool)
seq.try_append(n)
with open("/proc/self/statm") as f:
    pages = int(f.read().split()[0])
now = pages * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (now + ROOM, resource.RLIM_INFINITY))
for call in (seq.slot_mapping, lambda: seq.block_ids):
    try:
        call()
        print("built")
    except MemoryError:
        print("MemoryError", len(seq) // n, pool.used_blocks // n)
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc, limits RLIMIT_AS"
)
def test_int_lists_that_do_not_fit_are_memory_errors_that_keep_no_block():
    # The blocks are taken before the list of their ids is built: a list
    # that does not fit gives them back, and each of its ints is made by a
    # call that can fail (PyO3's conversion of an int cannot report a
    # failure: it panics).
    r = run_python(ALLOC_OUT_OF_MEMORY)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert r.stdout.splitlines() == ["MemoryError 0 True"] * 2 + ["MemoryError 1 1"] * 2, out
