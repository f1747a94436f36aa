"""Arguments whose default is not None refuse an explicit None (a
`TypeError`, nothing changed), the slot mappings' empty ranges, which
value classes hash, and a `with` on a closed sequence."""

import pytest

import kvslots


def hybrid(pool):
    return kvslots.HybridSequence(pool, kvslots.KvGroups(["full", 32]))


@pytest.mark.parametrize("make", [kvslots.Sequence, hybrid])
@pytest.mark.parametrize("method", ["try_reserve", "reserve"])
def test_headroom_none_is_no_int(make, method):
    pool = kvslots.BlockPool(8, 4)
    seq = make(pool)
    seq.try_append(5)
    before = (len(seq), seq.capacity, pool.used_blocks)
    with pytest.raises(TypeError, match="headroom must be an int, not NoneType"):
        getattr(seq, method)(8, None)
    with pytest.raises(TypeError, match="headroom must be an int, not NoneType"):
        getattr(seq, method)(8, headroom=None)
    assert (len(seq), seq.capacity, pool.used_blocks) == before
    # Left out, it is 0.
    getattr(seq, method)(8)
    assert pool.used_blocks > before[2]


def test_try_append_each_n_none_is_no_count():
    pool = kvslots.BlockPool(8, 4)
    seqs = [kvslots.Sequence(pool), hybrid(pool)]
    for n in (None,):
        with pytest.raises(TypeError):
            kvslots.try_append_each(seqs, n)
        with pytest.raises(TypeError):
            kvslots.try_append_each(seqs, n=n)
    assert [len(s) for s in seqs] == [0, 0]
    assert pool.used_blocks == 0
    # Left out, it is 1.
    assert kvslots.try_append_each(seqs) == 2
    assert [len(s) for s in seqs] == [1, 1]


def test_slot_mapping_empty_ranges_past_the_end_map_to_nothing():
    pool = kvslots.BlockPool(16, 4)
    seq = kvslots.Sequence(pool)
    seq.try_append(10)
    h = hybrid(pool)
    h.try_append(10)
    # Empty ranges, wherever they start.
    assert seq.slot_mapping(100) == []
    assert seq.slot_mapping(11, 11) == []
    assert seq.slot_mapping_buffer(2**63).tolist() == []
    assert h.slot_mapping(0, 100) == []
    assert h.slot_mapping(0, 11, 11) == []
    # Non-empty ranges that end past the end.
    with pytest.raises(IndexError):
        seq.slot_mapping(100, 200)
    with pytest.raises(IndexError):
        seq.slot_mapping(9, 11)
    with pytest.raises(IndexError):
        h.slot_mapping(0, 9, 11)
    assert seq.slot_mapping(8) == seq.slot_mapping(8, 10)
    assert len(h.slot_mapping(0)) == 10


def test_kv_groups_hash_as_they_compare():
    a = kvslots.KvGroups(["full", 32])
    b = kvslots.KvGroups(["full", 32])
    c = kvslots.KvGroups(["full"])
    assert a == b and hash(a) == hash(b)
    assert a != c
    layouts = {a: "gemma"}
    assert layouts[b] == "gemma"
    assert c not in layouts


def test_value_classes_that_compare_do_not_hash():
    pool = kvslots.BlockPool(4, 4, kv_events=16)
    seq = kvslots.Sequence(pool)
    seq.try_append(8)
    seq.publish(kvslots.hash_blocks(list(range(8)), 4))
    seq.close()
    pool.reset_prefix_cache()
    events = list(pool.drain_events().events)
    kinds = {type(e).__name__ for e in events}
    assert {"BlockStored", "BlockRemoved"} <= kinds
    for obj in [pool.stats(), *events]:
        assert type(obj).__hash__ is None
        with pytest.raises(TypeError, match="unhashable"):
            hash(obj)


@pytest.mark.parametrize(
    "make",
    [kvslots.Sequence, lambda pool: kvslots.HybridSequence(pool, kvslots.KvGroups(["full", 32]))],
)
def test_entering_a_closed_sequence_raises_as_a_closed_file_does(make):
    pool = kvslots.BlockPool(8, 4)
    seq = make(pool)
    with seq as entered:
        assert entered is seq
        seq.try_append(5)
    assert seq.closed and pool.used_blocks == 0
    with pytest.raises(ValueError, match="closed"):
        with seq:
            raise AssertionError("the body of a with on a closed sequence ran")
    assert seq.closed and pool.used_blocks == 0


def test_a_timeout_that_is_no_number_is_named():
    pool = kvslots.BlockPool(8, 4)
    seq = kvslots.Sequence(pool)
    h = hybrid(pool)
    calls = [
        lambda t: pool.alloc(1, timeout=t),
        lambda t: seq.reserve(4, 0, t),
        lambda t: h.reserve(4, timeout=t),
    ]
    for call in calls:
        for bad in ("1", b"1", [1], object()):
            with pytest.raises(TypeError, match="timeout must be None or a number of seconds, not"):
                call(bad)
    assert pool.used_blocks == 0 and seq.capacity == 0 and h.capacity == 0
    # Ints and floats are seconds.
    pool.free(pool.alloc(1, timeout=0))
    seq.reserve(4, 0, 1.5)
    assert seq.capacity == 4
