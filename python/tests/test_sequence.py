"""Sequence: appends, copy-on-write, reservation, rollback, forks, the slot
mapping in its three forms, closing, and every bad input, each refusal
checked for its exception and the unchanged state of sequence and pool."""

import gc
import signal
import sys
import threading
import weakref

import pytest

import kvslots
from conftest import Interrupted, alarm, pool_state, run_python, seq_state


def test_append_and_slot_mapping(pool):
    seq = kvslots.Sequence(pool)
    assert len(seq) == 0 and seq.block_ids == [] and seq.capacity == 0
    assert seq.try_append(6) == range(0, 6)
    assert seq.try_append(3) == range(6, 9)
    assert len(seq) == 9 and seq.capacity == 12 and len(seq.block_ids) == 3
    bs = pool.block_size
    want = [seq.block_ids[p // bs] * bs + p % bs for p in range(9)]
    assert seq.slot_mapping() == want
    assert seq.slot_mapping(6, 9) == want[6:]
    assert seq.slot_mapping(stop=2) == want[:2]
    assert [seq.slot(p) for p in range(9)] == want
    assert seq.slot(9) is None
    buf = seq.slot_mapping_buffer(2)
    assert (buf.format, buf.itemsize, buf.tolist()) == ("q", 8, want[2:])
    assert seq.slot_mapping(5, 5) == []
    assert repr(seq) == "Sequence(len=9, blocks=3, capacity=12)"
    assert seq.pool is pool


def test_slot_mapping_array_is_int64_over_the_buffer(pool):
    np = pytest.importorskip("numpy")
    seq = kvslots.Sequence(pool)
    seq.try_append(10)
    arr = seq.slot_mapping_array()
    assert arr.dtype == np.int64 and arr.tolist() == seq.slot_mapping()
    assert arr.flags.writeable
    # numpy views the buffer the binding wrote: no copy was made.
    assert arr.base is not None and not arr.flags.owndata


def test_slot_mapping_array_keeps_what_it_found(pool, monkeypatch):
    # Once a call found numpy, later calls import nothing: one where
    # `import numpy` would fail (a finalizer at exit) still works.
    pytest.importorskip("numpy")
    seq = kvslots.Sequence(pool)
    seq.try_append(10)
    seq.slot_mapping_array()
    monkeypatch.setitem(sys.modules, "numpy", None)
    assert seq.slot_mapping_array().tolist() == seq.slot_mapping()


# A fresh interpreter for each: the binding keeps numpy's `frombuffer` once a
# call has found it, so numpy must be missing before the first call.
WITHOUT_NUMPY = """
import sys
import kvslots

seq = kvslots.Sequence(kvslots.BlockPool(16, 4))
seq.try_append(10)
sys.modules.pop("numpy", None)
sys.modules["numpy"] = None  # `import numpy` fails
try:
    seq.slot_mapping_array()
except ImportError as err:
    print("ImportError", "needs numpy" in str(err), isinstance(err.__cause__, ImportError))
print(len(seq), len(seq.block_ids))
del sys.modules["numpy"]
try:
    import numpy
except ImportError:
    print("no numpy")
else:  # the failure was not kept: numpy found now, the call works
    print("found", seq.slot_mapping_array().tolist() == seq.slot_mapping())
"""


def test_slot_mapping_array_without_numpy_says_how_to_get_it():
    run = run_python(WITHOUT_NUMPY)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[:2] == ["ImportError True True", "10 3"], run.stdout
    assert lines[2:] in (["found True"], ["no numpy"]), run.stdout


INTERRUPTED_IMPORT = """
import sys
import kvslots


class Interrupted(BaseException):
    pass


class Interrupting:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            raise Interrupted
        return None


seq = kvslots.Sequence(kvslots.BlockPool(16, 4))
seq.try_append(10)
sys.modules.pop("numpy", None)
sys.meta_path.insert(0, Interrupting())
try:
    seq.slot_mapping_array()
except Interrupted:
    print("interrupted", len(seq))
"""


def test_slot_mapping_array_passes_on_what_else_numpys_import_raises():
    # Ctrl-C during numpy's first import must stay a KeyboardInterrupt, not
    # become the ImportError that says numpy is missing.
    run = run_python(INTERRUPTED_IMPORT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["interrupted", "10"], run.stdout + run.stderr


def test_slot_mapping_past_the_end_raises_index_error(pool):
    seq = kvslots.Sequence(pool)
    seq.try_append(5)
    for call in (seq.slot_mapping, seq.slot_mapping_buffer):
        with pytest.raises(IndexError):
            call(0, 6)
    with pytest.raises(ValueError):
        seq.slot_mapping(-1, 2)
    with pytest.raises(TypeError):
        seq.slot_mapping(0.0, 2)
    with pytest.raises(ValueError):
        seq.slot(-1)


def test_a_refused_reservation_names_its_headroom(pool):
    # `requested` counts the blocks asked for; `headroom` the blocks that
    # were to stay free besides (0 for every call without one).
    seq = kvslots.Sequence(pool)
    seq.try_append(8)  # 2 of the 16 blocks
    other = pool.try_alloc(4)  # 10 free
    before = (seq_state(seq), pool_state(pool))
    with pytest.raises(kvslots.NeverFits) as never:
        seq.try_reserve(4, headroom=14)  # 1 block + 14 > the 14 it could have
    assert (never.value.requested, never.value.headroom, never.value.capacity) == (1, 14, 14)
    assert str(never.value) == "requested 1 with a headroom of 14 can never fit in a capacity of 14"
    with pytest.raises(kvslots.NeverFits) as never:
        seq.reserve(4, headroom=14, timeout=0)
    assert (never.value.requested, never.value.headroom) == (1, 14)
    with pytest.raises(kvslots.Full) as full:
        seq.try_reserve(8, headroom=9)  # 2 blocks + 9 > 10 free
    assert (full.value.requested, full.value.headroom, full.value.available) == (2, 9, 10)
    assert str(full.value) == "requested 2 with a headroom of 9 but only 10 available"
    with pytest.raises(kvslots.Full) as full:
        seq.reserve(8, headroom=9, timeout=0)
    assert (full.value.requested, full.value.headroom) == (2, 9)
    with pytest.raises(kvslots.Full) as full:
        seq.try_append(4 * 11)  # no headroom: the core's message
    assert (full.value.requested, full.value.headroom) == (11, 0)
    assert str(full.value) == "requested 11 but only 10 available"
    with pytest.raises(kvslots.NeverFits) as never:
        pool.try_alloc(17)
    assert never.value.headroom == 0
    assert (seq_state(seq), pool_state(pool)) == before
    pool.free(other)
    seq.close()


def test_keys_and_groups_in_a_set_are_refused(pool):
    # Keys are a chain and groups are indexed by their order: a set of
    # either has no order to read, so it is refused before anything changes.
    seq = kvslots.Sequence(pool)
    seq.try_append(8)
    keys = kvslots.hash_blocks(list(range(8)), 4)
    before = (seq_state(seq), pool_state(pool), pool.prefix_stats())
    for call in (
        lambda: seq.publish(set(keys)),
        lambda: seq.publish(frozenset(keys)),
        lambda: seq.match_prefix(set(keys)),
        lambda: kvslots.Sequence(pool).match_prefix(frozenset(keys)),
        lambda: kvslots.KvGroups({"full"}),
        lambda: kvslots.KvGroups(["full", 8]).keys(set(keys)),
    ):
        with pytest.raises(TypeError, match="must be ordered"):
            call()
    assert (seq_state(seq), pool_state(pool), pool.prefix_stats()) == before
    group_keys = kvslots.KvGroups(["full"]).keys(keys[:1])
    with pytest.raises(TypeError, match="must be ordered"):
        group_keys.extend({keys[1]})
    assert len(group_keys) == 1
    assert seq.publish(keys) == 2  # the same keys in order
    seq.close()


def test_append_refusals_change_nothing(pool):
    seq = kvslots.Sequence(pool)
    seq.try_append(10)
    assert len(pool.try_alloc(2)) == 2  # held outside the sequence: 11 free
    before = (seq_state(seq), pool_state(pool))
    with pytest.raises(kvslots.Full) as err:
        seq.try_append(4 * 12)  # 12 more blocks, 11 free
    assert (err.value.requested, err.value.available) == (12, 11)
    with pytest.raises(kvslots.NeverFits) as never:
        seq.try_append(4 * 14)  # 14 more never fit beside its own 3 of 16
    assert (never.value.requested, never.value.capacity) == (14, 13)
    with pytest.raises(kvslots.NeverFits):
        seq.try_append(10**6)
    with pytest.raises(kvslots.Full):
        seq.append_cow(4 * 12)
    for bad, error in [(-1, ValueError), (2.0, TypeError), (2**64, OverflowError),
                       (2**100, OverflowError), (None, TypeError)]:
        for call in (seq.try_append, seq.append_cow, seq.try_reserve, seq.reserve,
                     seq.truncate):
            with pytest.raises(error):
                call(bad)
        assert (seq_state(seq), pool_state(pool)) == before
    assert seq.try_append(0) == range(10, 10)
    assert (seq_state(seq), pool_state(pool)) == before


def test_try_append_raises_copy_required_on_a_shared_tail(pool):
    parent = kvslots.Sequence(pool)
    parent.try_append(8)
    child, copy = parent.fork()
    assert copy is None and child.block_ids == parent.block_ids
    assert not parent.needs_copy
    assert parent.truncate(6) == 0  # back into the shared second block
    assert parent.needs_copy
    before = (seq_state(parent), seq_state(child), pool_state(pool))
    with pytest.raises(kvslots.CopyRequired):
        parent.try_append(1)
    assert isinstance(kvslots.CopyRequired("x"), RuntimeError)
    assert (seq_state(parent), seq_state(child), pool_state(pool)) == before
    assert parent.try_append(0) == range(6, 6)  # an empty append needs no copy
    r, copy = parent.append_cow(1)
    assert r == range(6, 7)
    assert copy == kvslots.BlockCopy(child.block_ids[1], parent.block_ids[1], 2)
    assert (copy.src, copy.tokens) == (child.block_ids[1], 2)
    assert copy.dst not in child.block_ids
    assert repr(copy).startswith("BlockCopy(src=")
    # The source is kept for the device copy until the next append.
    assert pool.ref_count(copy.src) == 2
    assert not parent.needs_copy
    assert parent.try_append(1) == range(7, 8)
    assert pool.ref_count(copy.src) == 1


def test_fork_copies_a_partial_tail_and_shares_full_blocks(pool):
    parent = kvslots.Sequence(pool)
    parent.try_append(6)
    child, copy = parent.fork()
    assert len(child) == 6 and child.block_ids[0] == parent.block_ids[0]
    assert copy == kvslots.BlockCopy(parent.block_ids[1], child.block_ids[1], 2)
    assert pool.ref_count(parent.block_ids[0]) == 2
    assert child.pool is pool
    child.close()
    parent.close()
    assert pool.free_blocks == 16


def test_fork_refusals_change_nothing(pool):
    seq = kvslots.Sequence(pool)
    seq.try_append(5)
    held = pool.try_alloc(pool.free_blocks)
    before = (seq_state(seq), pool_state(pool))
    with pytest.raises(kvslots.Full):
        seq.fork()  # no block for the private tail
    assert (seq_state(seq), pool_state(pool)) == before
    pool.free(held)
    # A block of the sequence freed behind its back (a double free) is
    # refused, and nothing changes: the sequence still holds it.
    before = (seq_state(seq), pool_state(pool))
    with pytest.raises(kvslots.FreeError) as err:
        pool.free(seq.block_ids[:1])
    assert err.value.kind == "held_by_sequence"
    assert (seq_state(seq), pool_state(pool)) == before


def test_reserve_then_chunked_prefill(pool):
    seq = kvslots.Sequence(pool)
    seq.try_reserve(40, headroom=2)
    assert (len(seq), seq.capacity, pool.used_blocks) == (0, 40, 10)
    other = pool.try_alloc(1)
    before = (seq_state(seq), pool_state(pool))
    with pytest.raises(kvslots.Full):
        seq.try_reserve(40 + 4 * 4, headroom=2)  # 4 more and 2 free: 6 > the 5 free
    with pytest.raises(kvslots.NeverFits):
        seq.try_reserve(40 + 4 * 5, headroom=2)  # 5 + 2 never fit beside its own 10 of 16
    with pytest.raises(kvslots.NeverFits):
        seq.try_reserve(44, headroom=16)  # 1 more block and 16 free: 17 > 16
    with pytest.raises(ValueError):
        seq.try_reserve(4, headroom=-1)
    assert (seq_state(seq), pool_state(pool)) == before
    pool.free(other)
    for _ in range(5):
        seq.try_append(8)
    assert pool.used_blocks == 10
    seq.truncate(20)
    seq.try_reserve(12)
    assert seq.shrink_to_fit() == 3
    assert seq.capacity == 20


def test_reserve_waits_and_times_out(pool):
    big = kvslots.Sequence(pool)
    big.reserve(4 * 14)
    seq = kvslots.Sequence(pool)
    before = (seq_state(seq), pool_state(pool))
    with pytest.raises(kvslots.Full) as err:
        seq.reserve(12, timeout=0.01)
    assert err.value.requested == 3
    assert (seq_state(seq), pool_state(pool)) == before
    assert pool.waiters == 0
    with pytest.raises(ValueError):
        seq.reserve(4, timeout=-1)
    done = threading.Event()

    def waiter():
        # (The timeout only keeps a bug from hanging the suite.)
        seq.reserve(12, timeout=60)
        done.set()

    t = threading.Thread(target=waiter)
    t.start()
    big.try_append(4 * 14)
    big.truncate(4 * 13)  # frees one block: 3 free, enough for the waiter
    t.join()
    assert done.is_set() and seq.capacity == 12


def test_truncate_fenced_and_retire(pool):
    seq = kvslots.Sequence(pool)
    seq.try_append(12)
    assert seq.truncate_fenced(4, 5) == 2
    assert (len(seq), pool.used_blocks, pool.pending_release_blocks) == (4, 3, 2)
    assert pool.complete(5) == 2
    assert seq.retire(6) == 1
    assert seq.closed
    with pytest.raises(ValueError):
        seq.retire(7)
    assert pool.complete(6) == 1
    assert pool.free_blocks == 16


def test_retire_copy_source(pool):
    seq = kvslots.Sequence(pool)
    seq.try_append(4)
    child, _ = seq.fork()
    seq.truncate(2)
    _, copy = seq.append_cow(1)
    assert seq.retire_copy_source(9) == 1
    child.close()
    assert pool.ref_count(copy.src) == 1
    pool.complete(9)
    assert pool.ref_count(copy.src) == 0
    assert seq.retire_copy_source(9) == 0


def test_match_and_publish(pool):
    tokens = list(range(100, 110))
    keys = kvslots.hash_blocks(tokens, pool.block_size)
    first = kvslots.Sequence(pool)
    assert first.match_prefix(keys) == 0
    first.try_append(len(tokens))
    assert first.publish(keys) == 2
    assert first.publish(keys) == 0
    second = kvslots.Sequence(pool)
    assert second.match_prefix(keys) == 2
    assert len(second) == 8 and second.block_ids == first.block_ids[:2]
    assert second.match_prefix(keys) == 0  # not empty any more
    # Bad keys raise before anything changes.
    third = kvslots.Sequence(pool)
    before = (seq_state(third), pool_state(pool), pool.prefix_stats())
    for bad, error in [([keys[0], b"short"], ValueError), ([keys[0], "x" * 32], TypeError),
                       ([keys[0], 7], TypeError), (7, TypeError), ([keys[0], bytes(33)], ValueError)]:
        with pytest.raises(error):
            third.match_prefix(bad)
        with pytest.raises(error):
            first.publish(bad)
        assert (seq_state(third), pool_state(pool), pool.prefix_stats()) == before
    with pytest.raises(ValueError):
        third.match_prefix(b"".join(keys) + b"x")  # packed keys: 32 bytes each
    assert (seq_state(third), pool_state(pool), pool.prefix_stats()) == before
    assert third.match_prefix([bytearray(k) for k in keys]) == 2
    assert third.match_prefix([]) == 0
    # Packed keys (hash_blocks_packed) match and publish the same.
    packed = kvslots.hash_blocks_packed(tokens, pool.block_size)
    assert packed == b"".join(keys)
    fourth = kvslots.Sequence(pool)
    assert fourth.match_prefix(packed) == 2
    assert fourth.match_prefix(bytearray(packed)) == 0  # not empty any more
    other = kvslots.hash_blocks_packed(list(range(200, 212)), pool.block_size)
    fifth = kvslots.Sequence(pool)
    fifth.try_append(12)
    assert fifth.publish(other) == 3
    sixth = kvslots.Sequence(pool)
    assert sixth.match_prefix(other[:64]) == 2


def test_close_context_manager_and_gc_give_blocks_back(pool):
    with kvslots.Sequence(pool) as seq:
        seq.try_append(9)
        assert pool.used_blocks == 3
    assert seq.closed and pool.free_blocks == 16
    assert repr(seq) == "Sequence(closed)"
    seq.close()  # twice: nothing
    for call, args in [(len, ()), (seq.try_append, (1,)), (seq.fork, ()),
                       (seq.slot_mapping, ()), (seq.match_prefix, ([],))]:
        with pytest.raises(ValueError):
            call(*args) if call is not len else len(seq)
    other = kvslots.Sequence(pool)
    other.try_append(5)
    ref = weakref.ref(other)
    del other
    gc.collect()
    assert ref() is None
    assert pool.free_blocks == 16


def test_a_pool_outlives_its_python_object(pool):
    seq = kvslots.Sequence(kvslots.BlockPool(4, 4))
    seq.try_append(8)
    gc.collect()
    assert len(seq.pool.try_alloc(2)) == 2


def test_sequence_needs_a_pool():
    with pytest.raises(TypeError):
        kvslots.Sequence(None)
    with pytest.raises(TypeError):
        kvslots.Sequence("pool")


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
@pytest.mark.parametrize("hybrid", [False, True], ids=["Sequence", "HybridSequence"])
def test_a_signal_handler_interrupts_a_call_waiting_for_a_busy_sequence(pool, hybrid):
    # Another thread's `reserve` holds the sequence while it waits for
    # blocks; a call on the same sequence waits for it, and a signal handler's
    # exception (Ctrl-C's KeyboardInterrupt) ends that wait, not the reserve.
    if hybrid:
        seq = kvslots.HybridSequence(pool, kvslots.KvGroups(["full"]))
    else:
        seq = kvslots.Sequence(pool)
    held = pool.try_alloc(16)
    outcome = []

    def reserver():
        try:
            # (The timeout only keeps a bug from hanging the suite.)
            seq.reserve(4, timeout=30)
            outcome.append("reserved")
        except kvslots.Full:
            outcome.append("timed out")

    thread = threading.Thread(target=reserver)
    thread.start()
    while pool.waiters == 0:  # the reserve has queued (a condition, not a sleep)
        assert thread.is_alive()

    with pytest.raises(Interrupted), alarm(0.05):
        len(seq)  # waits for the reserve's hold on the sequence
    # Interrupted while the reserve still waits: it was the call's own wait
    # that ended, not the reserve's (which would have let `len` return).
    assert pool.waiters == 1 and outcome == []
    pool.free(held)
    thread.join()
    assert outcome == ["reserved"]
    assert len(seq) == 0 and seq.capacity == 4 and not seq.closed
    seq.close()
    assert pool.free_blocks == 16


def test_block_ids_from_lists_the_tables_tail():
    pool = kvslots.BlockPool(32, 4)
    with kvslots.Sequence(pool) as seq:
        assert seq.block_ids_from(0) == []
        seq.try_append(10)  # 3 blocks
        before = seq.capacity // pool.block_size
        seq.try_append(7)  # 2 new blocks
        table = seq.block_ids
        assert seq.block_ids_from(before) == table[before:] and len(table[before:]) == 2
        for start in (0, 1, 4, 5, 6, 2**40):
            assert seq.block_ids_from(start) == table[start:]
        state = seq_state(seq)
        for bad, error in ((-1, ValueError), (1.0, TypeError), (2**64, OverflowError)):
            with pytest.raises(error):
                seq.block_ids_from(bad)
        assert seq_state(seq) == state
    with pytest.raises(ValueError):
        seq.block_ids_from(0)  # closed
