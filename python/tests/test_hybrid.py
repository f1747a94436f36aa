"""HybridSequence, KvGroups and GroupKeys: one admission across groups,
sliding windows giving blocks back (`None` entries), truncate, fork, the
slot mapping per group, prefix matching across groups, and every bad
input, each refusal checked for its exception and the unchanged state."""

import threading

import pytest

import kvslots
from conftest import pool_state


def hybrid_state(seq):
    """A hybrid sequence's length, every table and its held blocks."""
    return (
        len(seq),
        tuple(tuple(seq.block_ids(g)) for g in range(len(seq.groups))),
        seq.held_blocks,
    )


def test_groups_and_their_errors():
    groups = kvslots.KvGroups(["full", 1024, 1024])
    assert len(groups) == 3 and groups.kinds == ["full", 1024, 1024]
    assert groups == kvslots.KvGroups(["full", 1024, 1024])
    assert groups != kvslots.KvGroups(["full", 512])
    assert repr(groups) == "KvGroups(['full', 1024, 1024])"
    # Position 3000 reads 1977..=3000: blocks of 16 from 123 on.
    assert groups.first_needed_block(1, 3000, 16) == 123
    assert groups.first_needed_block(0, 3000, 16) == 0
    for bad in ([], ["full", 0], ["global"]):
        with pytest.raises(ValueError):
            kvslots.KvGroups(bad)
    for bad in ([1.5], [None], 3):
        with pytest.raises(TypeError):
            kvslots.KvGroups(bad)
    with pytest.raises(ValueError):
        kvslots.KvGroups(["full"] * (kvslots.KvGroups.MAX_GROUPS + 1))
    with pytest.raises(ValueError):
        kvslots.KvGroups([-4])
    with pytest.raises(IndexError):
        groups.first_needed_block(3, 0, 16)
    with pytest.raises(ValueError):
        groups.first_needed_block(0, 0, 0)


def test_group_keys_differ_by_group():
    groups = kvslots.KvGroups(["full", 8])
    base = kvslots.hash_blocks(list(range(40)), 4)
    keys = groups.keys(base)
    assert len(keys) == 10 and keys.groups == groups
    g0, g1 = keys.group(0), keys.group(1)
    assert len(g0) == 10 and all(len(k) == 32 for k in g0)
    assert not set(g0) & set(g1) and not set(g0) & set(base)
    packed = groups.keys(kvslots.hash_blocks_packed(list(range(40)), 4))
    assert packed.group(1) == g1
    step = groups.keys([])
    step.extend(base[:4])
    step.extend(base[4:])
    assert step.group(0) == g0
    step.truncate(3)
    assert len(step) == 3
    with pytest.raises(IndexError):
        keys.group(2)
    with pytest.raises(ValueError):
        groups.keys([b"short"])


def test_one_admission_across_groups():
    pool = kvslots.BlockPool(9, 4)
    seq = kvslots.HybridSequence(pool, kvslots.KvGroups(["full", 64, "full"]))
    assert seq.try_append(6) == range(0, 6)  # 2 blocks a group
    hog = pool.try_alloc(2)  # 1 free
    before, state = hybrid_state(seq), pool_state(pool)
    with pytest.raises(kvslots.Full) as refused:
        seq.try_append(3)  # a block a group: 3, with 1 free
    assert (refused.value.requested, refused.value.available) == (3, 1)
    with pytest.raises(kvslots.NeverFits):
        seq.try_append(20)
    assert hybrid_state(seq) == before and pool_state(pool) == state
    pool.free(hog)
    assert seq.try_append(3) == range(6, 9)
    assert seq.held_blocks == 9
    seq.close()
    assert pool.used_blocks == 0 and seq.closed
    with pytest.raises(ValueError):
        len(seq)


def test_a_window_gives_blocks_back_as_none_entries():
    pool = kvslots.BlockPool(16, 4)
    with kvslots.HybridSequence(pool, kvslots.KvGroups([4, "full"])) as seq:
        seq.try_append(12)
        seq.try_append(1)  # position 12 reads 9..=12: blocks 0 and 1 go
        table = seq.block_ids(0)
        assert table[:2] == [None, None] and None not in table[2:]
        assert seq.null_blocks(0) == 2 and seq.null_blocks(1) == 0
        assert None not in seq.block_ids(1)
        assert seq.held_blocks == 2 + 4 == pool.used_blocks
        bs = pool.block_size
        assert seq.slot_mapping(0, 8, 13) == [
            table[p // bs] * bs + p % bs for p in range(8, 13)
        ]
        assert seq.slot(0, 7) is None and seq.slot(1, 7) is not None
        for call in (lambda: seq.slot_mapping(0, 0, 13), lambda: seq.slot_mapping(2)):
            with pytest.raises(IndexError):
                call()
        with pytest.raises(IndexError):
            seq.block_ids(2)
        assert repr(seq) == "HybridSequence(len=13, groups=2, held_blocks=6)"
    assert pool.used_blocks == 0


def test_a_raw_free_of_a_hybrid_sequences_block_is_refused():
    pool = kvslots.BlockPool(16, 4)
    seq = kvslots.HybridSequence(pool, kvslots.KvGroups([4, "full"]))
    seq.try_append(8)
    reused = seq.block_ids(0)[0]
    seq.try_append(4)  # position 8 reads 5..=8: block 0 is reused
    child, _ = seq.fork()
    held = [b for g in range(2) for b in seq.block_ids(g) if b is not None]
    assert reused in held
    # Each block is the sequences' to give back: a raw free is a double
    # free, refused, and nothing changes.
    before, state = hybrid_state(seq), pool_state(pool)
    for block in held:
        with pytest.raises(kvslots.FreeError) as err:
            pool.free([block])
        assert err.value.kind == "held_by_sequence"
        assert hybrid_state(seq) == before and pool_state(pool) == state
    child.close()
    seq.close()
    assert pool.used_blocks == 0


def test_truncate_outside_the_window_raises_window_error():
    pool = kvslots.BlockPool(32, 4)
    seq = kvslots.HybridSequence(pool, kvslots.KvGroups([4, "full"]))
    seq.try_append(12)
    drafts = seq.try_append(5)  # blocks 0 and 1 leave the window
    before, state = hybrid_state(seq), pool_state(pool)
    with pytest.raises(kvslots.WindowError) as refused:
        seq.truncate(4)
    assert (refused.value.len, refused.value.min_len) == (4, 11)
    with pytest.raises(kvslots.WindowError):
        seq.truncate_fenced(4, 1)
    assert hybrid_state(seq) == before and pool_state(pool) == state
    assert seq.truncate(drafts.start + 2) == 2
    assert seq.truncate(0) == 2 + 4
    assert pool.used_blocks == 0


def test_fork_copy_on_write_and_fences():
    pool = kvslots.BlockPool(32, 4)
    seq = kvslots.HybridSequence(pool, kvslots.KvGroups(["full", 8]))
    seq.try_append(6)
    child, copies = seq.fork()
    assert len(child) == 6 and len(copies) == 2
    assert all(c.tokens == 2 for c in copies)
    assert child.block_ids(0)[0] == seq.block_ids(0)[0]
    child.close()
    seq.try_append(2)
    child, copies = seq.fork()
    assert copies == []
    seq.truncate(6)
    assert seq.needs_copy
    with pytest.raises(kvslots.CopyRequired):
        seq.try_append(1)
    positions, copies = seq.append_cow(1)
    assert positions == range(6, 7) and len(copies) == 2
    assert seq.retire_copy_source(5) == 2
    child.close()
    assert pool.complete(5) == 2
    positions, copies = seq.append_fenced(1, 6)
    assert positions == range(7, 8) and copies == []
    held = seq.held_blocks
    assert seq.retire(7) == held
    assert seq.closed
    pool.complete_all()
    assert pool.used_blocks == 0


def test_reservations_and_waiting():
    pool = kvslots.BlockPool(8, 16)
    groups = kvslots.KvGroups(["full", "full"])
    seq = kvslots.HybridSequence(pool, groups)
    seq.try_reserve(40, headroom=2)  # 3 blocks a group
    assert (len(seq), seq.capacity, pool.used_blocks) == (0, 48, 6)
    state = pool_state(pool)
    with pytest.raises(kvslots.NeverFits):
        seq.try_reserve(80)  # 2 more a group, beside its own 6 of 8
    other = kvslots.HybridSequence(pool, groups)
    hog = pool.try_alloc(1)
    with pytest.raises(kvslots.Full):
        other.try_reserve(16)  # a block a group, 1 free
    with pytest.raises(kvslots.NeverFits) as never:
        other.try_reserve(16, headroom=7)  # 2 blocks and 7 besides: 9 > 8
    assert (never.value.requested, never.value.headroom, never.value.capacity) == (2, 7, 8)
    assert "headroom of 7" in str(never.value)
    with pytest.raises(kvslots.NeverFits) as never:
        other.reserve(16, headroom=7, timeout=0)
    assert (never.value.requested, never.value.headroom) == (2, 7)
    pool.free(hog)
    with pytest.raises(kvslots.Full) as full:
        other.try_reserve(16, headroom=1)  # 2 blocks and 1 besides, 2 free
    assert (full.value.requested, full.value.headroom, full.value.available) == (2, 1, 2)
    assert pool_state(pool) == state and other.held_blocks == 0
    assert seq.shrink_to_fit() == 6
    first = kvslots.HybridSequence(pool, groups)
    first.try_append(64)  # all 8
    waiter = kvslots.HybridSequence(pool, groups)
    with pytest.raises(kvslots.Full):
        waiter.reserve(16, timeout=0.001)
    done = []
    thread = threading.Thread(target=lambda: done.append(waiter.reserve(16)))
    thread.start()
    first.close()
    thread.join()
    assert done == [None] and waiter.held_blocks == 2


def test_prefix_match_across_groups():
    pool = kvslots.BlockPool(64, 4)
    groups = kvslots.KvGroups([5, "full"])
    prompt = list(range(22))
    keys = groups.keys(kvslots.hash_blocks(prompt, 4))
    with kvslots.HybridSequence(pool, groups) as first:
        first.try_append(len(prompt))
        assert first.publish(keys) == 10
    second = kvslots.HybridSequence(pool, groups)
    assert second.match_prefix(keys) == 5
    assert len(second) == 20
    # Position 20 reads 16..=20: the sliding group holds block 4 only.
    assert second.block_ids(0)[:4] == [None] * 4 and second.held_blocks == 1 + 5
    assert second.match_prefix(keys) == 0  # not empty
    other = kvslots.KvGroups(["full", 5])
    with pytest.raises(ValueError):
        kvslots.HybridSequence(pool, other).match_prefix(keys)
    with pytest.raises(ValueError):
        second.publish(other.keys(kvslots.hash_blocks(prompt, 4)))
    with pytest.raises(TypeError):
        second.match_prefix(kvslots.hash_blocks(prompt, 4))
    second.close()
    assert pool.used_blocks == 0


def test_kv_events_name_each_groups_keys():
    pool = kvslots.BlockPool(16, 4, shards=1, kv_events=64)
    groups = kvslots.KvGroups(["full", 4])
    content = kvslots.hash_blocks(list(range(20)), 4)
    keys = groups.keys(content)
    full, sliding = keys.group(0), keys.group(1)
    seq = kvslots.HybridSequence(pool, groups)
    seq.try_append(12)
    seq.try_append(4)  # token 12's window leaves the sliding blocks 0, 1
    assert seq.null_blocks(1) == 2
    assert seq.publish(keys) == 4 + 2
    cleared, a, b = pool.drain_events().events
    assert isinstance(cleared, kvslots.AllBlocksCleared)
    assert isinstance(a, kvslots.BlockStored) and isinstance(b, kvslots.BlockStored)
    assert (a.block_hashes, a.parent_block_hash) == (full[:4], None)
    assert a.block_ids == seq.block_ids(0)
    # The sliding group's chain goes on from its key of a given-back block.
    assert (b.block_hashes, b.parent_block_hash) == (sliding[2:4], sliding[1])
    assert b.block_ids == seq.block_ids(1)[2:4]
    assert not set(a.block_hashes + b.block_hashes) & set(content)


def test_bad_arguments_raise_and_change_nothing():
    pool = kvslots.BlockPool(8, 4)
    seq = kvslots.HybridSequence(pool, kvslots.KvGroups(["full", 8]))
    seq.try_append(5)
    before, state = hybrid_state(seq), pool_state(pool)
    for call in (
        lambda: seq.try_append(-1),
        lambda: seq.truncate(-1),
        lambda: seq.try_reserve(-1),
        lambda: seq.block_ids(-1),
        lambda: seq.slot(0, -1),
    ):
        with pytest.raises((ValueError, OverflowError)):
            call()
    for call in (lambda: seq.try_append(1.0), lambda: seq.slot_mapping("0")):
        with pytest.raises(TypeError):
            call()
    assert hybrid_state(seq) == before and pool_state(pool) == state


def test_threads_share_a_pool():
    pool = kvslots.BlockPool(256, 4)
    groups = kvslots.KvGroups(["full", 8, 8])
    errors = []

    def worker():
        try:
            for _ in range(200):
                with kvslots.HybridSequence(pool, groups) as seq:
                    try:
                        seq.try_append(13)
                        for _ in range(10):
                            seq.try_append(1)
                    except kvslots.Full:
                        pass
        except Exception as e:  # pragma: no cover - a failure to report
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and pool.used_blocks == 0


def test_capacity_is_what_every_group_can_hold():
    # After a truncate into a tail the full group shares (with a matcher)
    # and the sliding group holds alone, a reservation keeps a block for
    # the full group's copy only: the capacity is what both tables hold.
    pool = kvslots.BlockPool(16, 4)
    groups = kvslots.KvGroups(["full", 4])
    keys = groups.keys(kvslots.hash_blocks([1] * 8, 4))
    a = kvslots.HybridSequence(pool, groups)
    a.try_append(8)
    assert a.publish(keys) == 4
    b = kvslots.HybridSequence(pool, groups)
    assert b.match_prefix(keys) == 2
    a.truncate(2)
    a.try_reserve(1)
    assert (len(a.block_ids(0)), len(a.block_ids(1))) == (2, 1)
    assert a.capacity == 4
    used = pool.used_blocks
    positions, copies = a.append_cow(2)  # up to the capacity: no new block
    assert positions == range(2, 4) and len(copies) == 1
    assert pool.used_blocks == used and a.capacity == 4
    a.close()
    b.close()


def test_match_prefix_into_a_hybrid_reservation_keeps_its_capacity():
    # A hybrid sequence of length 0 holding reserved blocks matches into
    # them, as a `Sequence` does (see test_match_reserved.py): the matched
    # blocks take reserved blocks' places, and each group keeps what it
    # reserved beyond the hit.
    pool = kvslots.BlockPool(32, 4)
    groups = kvslots.KvGroups([4, "full"])
    keys = groups.keys(kvslots.hash_blocks(list(range(12)), 4))
    with kvslots.HybridSequence(pool, groups) as a:
        a.try_append(12)
        assert a.publish(keys) == 6
    b = kvslots.HybridSequence(pool, groups)
    b.try_reserve(20)
    assert (len(b), b.capacity, pool.used_blocks) == (0, 20, 10)
    assert b.match_prefix(keys) == 3
    assert (len(b), b.capacity) == (12, 20)
    # Position 12 reads 9..=12: the sliding group holds block 2, then 2
    # reserved blocks; the full group its 3, then 2.
    assert b.block_ids(0)[:2] == [None, None]
    assert (len(b.block_ids(0)), len(b.block_ids(1))) == (5, 5)
    assert pool.used_blocks == 1 + 3 + 2 * 2
    assert b.match_prefix(keys) == 0  # it holds tokens now
    b.try_append(8)  # within what was reserved: no block taken
    # Token 12 (the append's first) reads 9..=12: the sliding group keeps
    # blocks 2 to 4, the full group 5.
    assert pool.used_blocks == 3 + 5
    b.close()
    assert pool.used_blocks == 0


def test_match_prefix_into_a_hybrid_reservation_with_other_groups_keys_changes_nothing():
    pool = kvslots.BlockPool(32, 4)
    groups = kvslots.KvGroups([4, "full"])
    other = kvslots.KvGroups(["full", "full"])
    keys = other.keys(kvslots.hash_blocks(list(range(12)), 4))
    b = kvslots.HybridSequence(pool, groups)
    b.try_reserve(20)
    before = ([b.block_ids(g) for g in range(2)], pool.used_blocks, pool.prefix_stats())
    with pytest.raises(ValueError):
        b.match_prefix(keys)
    assert ([b.block_ids(g) for g in range(2)], pool.used_blocks, pool.prefix_stats()) == before
    b.close()


def test_block_ids_from_lists_a_groups_tail():
    pool = kvslots.BlockPool(16, 4)
    with kvslots.HybridSequence(pool, kvslots.KvGroups([4, "full"])) as seq:
        seq.try_append(12)
        seq.try_append(1)  # the window's table starts with 2 None entries
        for g in range(2):
            table = seq.block_ids(g)
            for start in (0, 1, 2, 3, 4, 5, 2**40):
                assert seq.block_ids_from(g, start) == table[start:]
        assert seq.block_ids_from(0, 0)[:2] == [None, None]
        state = hybrid_state(seq)
        with pytest.raises(IndexError):
            seq.block_ids_from(2, 0)
        for bad, error in ((-1, ValueError), (1.0, TypeError), (2**64, OverflowError)):
            with pytest.raises(error):
                seq.block_ids_from(0, bad)
        assert hybrid_state(seq) == state


def test_chunked_local_groups():
    # Llama 4's layout in small: chunked local attention in chunks of 8
    # tokens beside full attention, blocks of 4.
    groups = kvslots.KvGroups([("chunked", 8), "full"])
    assert groups.kinds == [("chunked", 8), "full"]
    assert kvslots.KvGroups(groups.kinds) == groups
    assert repr(groups) == "KvGroups([('chunked', 8), 'full'])"
    assert groups != kvslots.KvGroups([8, "full"])
    # Position 13 reads its chunk, 8..=13: blocks of 4 from 2 on.
    assert groups.first_needed_block(0, 13, 4) == 2
    assert groups.first_needed_block(0, 7, 4) == 0
    for bad in ([("chunked", 0)], [("sliding", 8)], [("chunked",)], [("chunked", 8, 1)],
                [("chunked", -1)]):
        with pytest.raises(ValueError):
            kvslots.KvGroups(bad)
    for bad in ([("chunked", "8")], [("chunked", 1.5)], [(8, "chunked")]):
        with pytest.raises((TypeError, ValueError)):
            kvslots.KvGroups(bad)

    pool = kvslots.BlockPool(32, 4)
    seq = kvslots.HybridSequence(pool, groups)
    seq.try_append(11)
    seq.try_append(6)  # token 11 is in chunk 1: blocks 0 and 1 go back
    assert seq.block_ids(0)[:2] == [None, None] and seq.held_blocks == 3 + 5
    before = (hybrid_state(seq), pool_state(pool))
    with pytest.raises(kvslots.WindowError) as e:
        seq.truncate(7)
    assert (e.value.len, e.value.min_len) == (7, 8)
    assert (hybrid_state(seq), pool_state(pool)) == before
    seq.truncate(8)
    assert len(seq) == 8
    seq.close()
    assert pool.used_blocks == 0

    # A prefix hit needs the blocks of the chunk it ends in.
    prompt = list(range(24))
    keys = groups.keys(kvslots.hash_blocks(prompt, 4))
    with kvslots.HybridSequence(pool, groups) as first:
        first.try_append(len(prompt))
        assert first.publish(keys) == 12
    other = groups.keys(kvslots.hash_blocks(prompt[:20] + [99] * 4, 4))
    assert pool.peek_hybrid_prefix(other) == 5
    second = kvslots.HybridSequence(pool, groups)
    assert second.match_prefix(other) == 5
    # Position 20 is in chunk 2 (16..24): the chunked group holds block 4.
    assert second.block_ids(0)[:4] == [None] * 4 and second.held_blocks == 1 + 5
    second.close()
