"""`kvslots.try_append_each`: a decode step's appends in one call. Each
sequence appends all or nothing, in order, and the call stops at the first
that cannot append now (its pool lacks the blocks, it needs a copy, it is
closed, another call holds it), leaving it and every later one unchanged;
bad arguments raise before any append."""

import threading

import pytest

import kvslots
from conftest import Busy, pool_state, seq_state

BS = 4


def hybrid_state(seq):
    groups = len(seq.groups)
    return (len(seq), seq.capacity, tuple(tuple(seq.block_ids(g)) for g in range(groups)))


def test_appends_each_sequence_in_turn_and_returns_how_many():
    pool = kvslots.BlockPool(64, BS)
    seqs = [kvslots.Sequence(pool) for _ in range(5)]
    for i, seq in enumerate(seqs):
        seq.try_append(i)
    assert kvslots.try_append_each(seqs) == 5
    assert [len(s) for s in seqs] == [1, 2, 3, 4, 5]
    assert kvslots.try_append_each(seqs, 3) == 5
    assert [len(s) for s in seqs] == [4, 5, 6, 7, 8]
    # One count a sequence: a list, a tuple, any iterable of ints.
    assert kvslots.try_append_each(seqs, [0, 1, 2, 3, 4]) == 5
    assert kvslots.try_append_each(seqs, (x for x in [5, 0, 0, 0, 0])) == 5
    assert [len(s) for s in seqs] == [9, 6, 8, 10, 12]
    # The blocks each holds are those its length needs, as try_append takes.
    assert [len(s.block_ids) for s in seqs] == [3, 2, 2, 3, 3]
    assert pool.used_blocks == 13
    assert kvslots.try_append_each([]) == 0
    assert kvslots.try_append_each([], [3, 4][:0]) == 0


def test_a_sequence_listed_twice_appends_twice():
    pool = kvslots.BlockPool(8, BS)
    seq = kvslots.Sequence(pool)
    assert kvslots.try_append_each([seq, seq, seq], [3, 2, 4]) == 3
    assert len(seq) == 9 and len(seq.block_ids) == 3


def test_plain_and_hybrid_sequences_in_one_call():
    pool = kvslots.BlockPool(64, BS)
    groups = kvslots.KvGroups(["full", 8])
    hybrid = kvslots.HybridSequence(pool, groups)
    plain = kvslots.Sequence(pool)
    assert kvslots.try_append_each([plain, hybrid], [5, 13]) == 2
    assert len(plain) == 5 and len(hybrid) == 13
    # The hybrid sequence took a block a group as its own try_append does.
    twin = kvslots.HybridSequence(pool, groups)
    twin.try_append(13)
    assert [len(hybrid.block_ids(g)) for g in range(2)] == [
        len(twin.block_ids(g)) for g in range(2)
    ]


def test_stops_at_the_first_sequence_whose_pool_lacks_the_blocks():
    pool = kvslots.BlockPool(4, BS)
    a, b, c = (kvslots.Sequence(pool) for _ in range(3))
    a.try_append(1)  # room for 3 more tokens in its block
    b.try_append(8)  # 2 blocks, full
    c.try_append(1)
    assert pool.free_blocks == 0
    before_b, before_c = seq_state(b), seq_state(c)
    assert kvslots.try_append_each([a, b, c], 2) == 1
    assert len(a) == 3
    assert seq_state(b) == before_b and seq_state(c) == before_c
    assert pool.free_blocks == 0
    # Its own try_append says why.
    with pytest.raises(kvslots.Full):
        b.try_append(2)
    # With a block back, the call goes on from there.
    a.close()
    assert kvslots.try_append_each([b, c], 2) == 2
    assert (len(b), len(c)) == (10, 3)


def test_stops_at_a_sequence_whose_append_needs_never_fit():
    pool = kvslots.BlockPool(4, BS)
    a, b = kvslots.Sequence(pool), kvslots.Sequence(pool)
    state = pool_state(pool)
    assert kvslots.try_append_each([a, b], [100, 1]) == 0
    assert pool_state(pool) == state
    assert len(a) == 0 and len(b) == 0
    with pytest.raises(kvslots.NeverFits):
        a.try_append(100)


def test_stops_at_a_sequence_that_needs_a_copy_first():
    pool = kvslots.BlockPool(16, BS)
    parent = kvslots.Sequence(pool)
    parent.try_append(8)
    twin, copy = parent.fork()  # both hold the two full blocks
    assert copy is None
    child = parent
    child.truncate(6)  # back into the shared second block
    other = kvslots.Sequence(pool)
    assert child.needs_copy
    state = pool_state(pool)
    before = seq_state(child), seq_state(other)
    assert kvslots.try_append_each([child, other]) == 0
    assert pool_state(pool) == state
    assert (seq_state(child), seq_state(other)) == before
    with pytest.raises(kvslots.CopyRequired):
        child.try_append(1)
    # An empty append needs no copy.
    assert kvslots.try_append_each([child, other], [0, 1]) == 2
    assert len(other) == 1


def test_stops_at_a_closed_sequence():
    pool = kvslots.BlockPool(16, BS)
    a, b, c = (kvslots.Sequence(pool) for _ in range(3))
    b.close()
    assert kvslots.try_append_each([a, b, c]) == 1
    assert (len(a), len(c)) == (1, 0)
    groups = kvslots.KvGroups(["full"])
    h = kvslots.HybridSequence(pool, groups)
    h.close()
    assert kvslots.try_append_each([a, h, c]) == 1
    assert (len(a), len(c)) == (2, 0)


def test_stops_at_a_sequence_of_a_closed_pool():
    pool = kvslots.BlockPool(16, BS)
    other = kvslots.BlockPool(16, BS)
    a, b = kvslots.Sequence(other), kvslots.Sequence(pool)
    pool.close()
    assert kvslots.try_append_each([a, b]) == 1
    assert (len(a), len(b)) == (1, 0)
    with pytest.raises(kvslots.Closed):
        b.try_append(1)


@pytest.mark.parametrize("hybrid", [False, True], ids=["plain", "hybrid"])
def test_stops_at_a_sequence_another_thread_holds_without_waiting(hybrid):
    pool = kvslots.BlockPool(8, BS)
    first = kvslots.Sequence(pool)
    first.try_append(1)  # room in its block: appends with no block free
    if hybrid:
        held = kvslots.HybridSequence(pool, kvslots.KvGroups(["full"]))
    else:
        held = kvslots.Sequence(pool)
    held.try_append(4)
    last = kvslots.Sequence(pool)
    last.try_append(1)
    busy = Busy(pool, held)  # its reserve holds `held`, waiting for a block
    try:
        assert kvslots.try_append_each([first, held, last]) == 1
        assert len(first) == 2 and len(last) == 1
    finally:
        busy.finish()
    assert len(held) == 4 and held.capacity == 8
    assert kvslots.try_append_each([held, last]) == 2


def bad_calls(seqs):
    return {
        "an item that is no sequence": (TypeError, lambda: kvslots.try_append_each(seqs + [3])),
        "a pool as an item": (
            TypeError,
            lambda: kvslots.try_append_each(seqs + [seqs[0].pool]),
        ),
        "no iterable": (TypeError, lambda: kvslots.try_append_each(5)),
        "a negative count": (ValueError, lambda: kvslots.try_append_each(seqs, -1)),
        "a float count": (TypeError, lambda: kvslots.try_append_each(seqs, 1.0)),
        "a count past 2**64": (OverflowError, lambda: kvslots.try_append_each(seqs, 2**70)),
        "a string count": (TypeError, lambda: kvslots.try_append_each(seqs, "1")),
        "too few counts": (ValueError, lambda: kvslots.try_append_each(seqs, [1])),
        "too many counts": (ValueError, lambda: kvslots.try_append_each(seqs, [1] * 5)),
        "a negative count in the list": (
            ValueError,
            lambda: kvslots.try_append_each(seqs, [1, 1, -1]),
        ),
        "a float in the list": (TypeError, lambda: kvslots.try_append_each(seqs, [1, 1, 1.5])),
        "None in the list": (TypeError, lambda: kvslots.try_append_each(seqs, [1, None, 1])),
        "a set of sequences": (TypeError, lambda: kvslots.try_append_each(set(seqs))),
        "a frozenset of sequences": (
            TypeError,
            lambda: kvslots.try_append_each(frozenset(seqs), 1),
        ),
        "a set of counts": (TypeError, lambda: kvslots.try_append_each(seqs, {1, 2, 3})),
        # A dict iterates its keys: `{seq: n}` would append 1 to each.
        "a dict of sequences to counts": (
            TypeError,
            lambda: kvslots.try_append_each({s: 2 for s in seqs}),
        ),
        "a dict as counts": (
            TypeError,
            lambda: kvslots.try_append_each(seqs, {1: "a", 2: "b", 3: "c"}),
        ),
        # Three bytes would be three counts of one byte each.
        "bytes as counts": (TypeError, lambda: kvslots.try_append_each(seqs, b"\x01\x01\x01")),
        "a bytearray as counts": (
            TypeError,
            lambda: kvslots.try_append_each(seqs, bytearray(b"\x01\x01\x01")),
        ),
    }


@pytest.mark.parametrize("case", list(bad_calls([None, None, None])))
def test_bad_arguments_raise_before_any_append(case):
    pool = kvslots.BlockPool(16, BS)
    seqs = [kvslots.Sequence(pool) for _ in range(3)]
    for seq in seqs:
        seq.try_append(3)
    error, call = bad_calls(seqs)[case]
    state = pool_state(pool)
    before = [seq_state(s) for s in seqs]
    with pytest.raises(error):
        call()
    assert pool_state(pool) == state
    assert [seq_state(s) for s in seqs] == before


def test_an_endless_iterator_of_counts_is_refused_not_drained():
    # From a helper's attack: the counts were read to the end before their
    # number was checked, so an endless iterator grew without bound.
    pool = kvslots.BlockPool(8, BS)
    seqs = [kvslots.Sequence(pool), kvslots.Sequence(pool)]
    pulled = []

    def endless():
        while True:
            pulled.append(1)
            if len(pulled) > 1000:  # stands in for "forever"
                raise RuntimeError("read 1000 counts for 2 sequences")
            yield 1

    state = pool_state(pool)
    with pytest.raises(ValueError, match="more counts than the 2 sequences"):
        kvslots.try_append_each(seqs, endless())
    assert len(pulled) == 3  # one past the sequences
    assert pool_state(pool) == state
    assert [len(s) for s in seqs] == [0, 0]


def test_the_docstrings_decode_step_preempts_until_the_rest_append():
    # The decode loop of `try_append_each`'s docstring, run: a pool of 2
    # blocks of 4 tokens and two sequences that outgrow it.
    pool = kvslots.BlockPool(2, BS)
    first, second = kvslots.Sequence(pool), kvslots.Sequence(pool)
    running = [first, second]
    ended = []
    for _ in range(9):
        done = kvslots.try_append_each(running)
        while done < len(running):
            try:
                running[done].try_append(1)  # the reason (or a late success)
                done += 1
            except kvslots.Full:
                ended.append(running.pop())  # preempted
                ended[-1].close()
            except kvslots.NeverFits:
                ended.append(running.pop(done))  # the pool is too small
                ended[-1].close()
            done += kvslots.try_append_each(running[done:])
        assert done == len(running)
    # Step 5: `first` needs a block, the pool is full: `second` (4 tokens)
    # is preempted. Step 9: `first` (8 tokens) needs a third block, which
    # the pool can never give: it ends.
    assert ended == [second, first] and running == []
    assert pool.used_blocks == 0


def test_many_sequences_append_as_each_would_alone():
    # 64 sequences: the call runs with the GIL released.
    pool = kvslots.BlockPool(1024, BS)
    seqs = [kvslots.Sequence(pool) for _ in range(64)]
    twins = [kvslots.Sequence(pool) for _ in range(64)]
    counts = [i % 7 for i in range(64)]
    for _ in range(5):
        assert kvslots.try_append_each(seqs, counts) == 64
        for twin, k in zip(twins, counts):
            twin.try_append(k)
    assert [len(s) for s in seqs] == [len(t) for t in twins]
    assert [len(s.block_ids) for s in seqs] == [len(t.block_ids) for t in twins]


def test_threads_appending_to_shared_sequences_conserve_blocks():
    pool = kvslots.BlockPool(512, BS)
    seqs = [kvslots.Sequence(pool) for _ in range(16)]
    appended = [0] * 4
    errors = []

    def worker(t):
        try:
            for round in range(300):
                order = seqs[t:] + seqs[:t]
                done = kvslots.try_append_each(order, 1)
                appended[t] += done
                if round % 50 == 49:
                    # Shrink one sequence back (a preemption's rollback).
                    order[0].truncate(0)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert errors == []
    assert sum(appended) > 0
    # Every block a sequence holds is counted once, and no other is used.
    held = [i for s in seqs for i in s.block_ids]
    assert len(held) == len(set(held)) == pool.used_blocks
    assert all(len(s.block_ids) == -(-len(s) // BS) for s in seqs)
    for s in seqs:
        s.close()
    assert pool.used_blocks == 0 and pool.free_blocks == pool.num_blocks
