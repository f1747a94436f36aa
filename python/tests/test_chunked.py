"""("chunked", n) groups from Python: round trips of `KvGroups.kinds` and
`repr`, every bad kind refused with its exception, `first_needed_block` at
the extremes, and `WindowError`'s fields on a refused truncate."""

import sys

import pytest

import kvslots


def test_round_trips():
    for kinds in ([("chunked", 8192), "full"], [("chunked", 1)], [4, ("chunked", 3), "full", 4],
                  [("chunked", sys.maxsize)], [("chunked", 2**64 - 1)]):
        g = kvslots.KvGroups(kinds)
        assert g.kinds == kinds
        assert kvslots.KvGroups(g.kinds) == g
        assert eval(repr(g), {"KvGroups": kvslots.KvGroups}) == g
        assert hash(kvslots.KvGroups(g.kinds)) == hash(g)


def test_int_likes_and_subclasses():
    np = pytest.importorskip("numpy")
    g = kvslots.KvGroups([("chunked", np.int64(16))])
    assert g.kinds == [("chunked", 16)]


def test_tuple_subclass_and_str_subclass():
    import collections
    P = collections.namedtuple("P", "tag n")
    assert kvslots.KvGroups([P("chunked", 8)]).kinds == [("chunked", 8)]

    class S(str):
        pass
    assert kvslots.KvGroups([(S("chunked"), 8)]).kinds == [("chunked", 8)]


@pytest.mark.parametrize("bad,err", [
    ([("chunked", 0)], ValueError),
    ([("chunked", -1)], ValueError),
    ([("chunked", 2**64)], (ValueError, OverflowError)),
    ([("Chunked", 8)], ValueError),
    ([("chunked",)], ValueError),
    ([()], ValueError),
    ([("chunked", 8, 9)], ValueError),
    ([("chunked", None)], TypeError),
    ([("chunked", "8")], TypeError),
    ([("chunked", 1.0)], TypeError),
    ([["chunked", 8]], TypeError),
    ([(b"chunked", 8)], ValueError),
    ([("full",)], ValueError),
    ([("sliding", 8)], ValueError),
    (("chunked", 8), None),  # a tuple of kinds: "chunked" is a str item -> ValueError
])
def test_errors(bad, err):
    if err is None:
        with pytest.raises((ValueError, TypeError)):
            kvslots.KvGroups(bad)
        return
    with pytest.raises(err):
        kvslots.KvGroups(bad)


def test_zero_chunk_message_names_group():
    with pytest.raises(ValueError) as e:
        kvslots.KvGroups(["full", ("chunked", 0)])
    assert "1" in str(e.value)


def test_first_needed_block_extremes():
    g = kvslots.KvGroups([("chunked", 3), ("chunked", 2**64 - 1)])
    M = 2**64 - 1
    assert g.first_needed_block(0, M, 1) == M - M % 3 == M
    assert g.first_needed_block(0, M - 1, 2) == (M - 1 - (M - 1) % 3) // 2
    assert g.first_needed_block(1, M - 1, 1) == 0
    assert g.first_needed_block(1, M, 1) == M
    with pytest.raises((ValueError, ZeroDivisionError)):
        g.first_needed_block(0, 5, 0)
    with pytest.raises(IndexError):
        g.first_needed_block(2, 5, 1)


def test_window_error_and_state():
    groups = kvslots.KvGroups([("chunked", 6), 3])
    pool = kvslots.BlockPool(64, 4)
    seq = kvslots.HybridSequence(pool, groups)
    seq.try_append(13)
    seq.try_append(1)  # chunk of 13 is 12..: blocks 0..3 back in group 0; window: (14-3)/4=2
    assert seq.block_ids(0)[:3] == [None] * 3
    for x in range(1, 12):
        with pytest.raises(kvslots.WindowError) as e:
            seq.truncate(x)
        assert (e.value.len, e.value.min_len) == (x, 12)
    seq.truncate(12)
    seq.close()
    assert pool.used_blocks == 0
