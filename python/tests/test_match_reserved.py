"""`Sequence.match_prefix` into a sequence that holds only reserved blocks:
the matched blocks take the first reserved blocks' places, a reserved
block pays for each cached block revived, and `capacity` stays."""

import threading

import kvslots


def _published(pool, tokens):
    """A sequence holding `tokens`, its full blocks published; and the keys."""
    keys = kvslots.hash_blocks(tokens, pool.block_size)
    seq = kvslots.Sequence(pool)
    seq.try_append(len(tokens))
    assert seq.publish(keys) == len(tokens) // pool.block_size
    return seq, keys


def test_shared_blocks_replace_reserved_ones():
    pool = kvslots.BlockPool(12, 4)
    owner, keys = _published(pool, list(range(12)))
    seq = kvslots.Sequence(pool)
    seq.try_reserve(20)
    reserved = seq.block_ids
    assert pool.used_blocks == 3 + 5
    assert seq.match_prefix(keys) == 3
    assert seq.block_ids == owner.block_ids + reserved[:2]
    assert (len(seq), seq.capacity) == (12, 20)
    assert pool.used_blocks == 3 + 2
    seq.try_append(8)  # the prompt's rest: no allocation
    assert pool.used_blocks == 3 + 2
    seq.close()
    owner.close()
    assert pool.used_blocks == 0


def test_a_miss_changes_nothing_but_the_statistics():
    pool = kvslots.BlockPool(8, 4)
    seq = kvslots.Sequence(pool)
    seq.try_reserve(8)
    before = (seq.block_ids, pool.used_blocks, pool.free_blocks)
    assert seq.match_prefix(kvslots.hash_blocks(list(range(8)), 4)) == 0
    assert (seq.block_ids, pool.used_blocks, pool.free_blocks) == before
    assert len(seq) == 0


def test_a_reservation_pays_for_revivals_behind_a_queued_waiter():
    pool = kvslots.BlockPool(8, 4)
    owner, keys = _published(pool, list(range(12)))
    owner.close()  # 3 evictable blocks
    seq = kvslots.Sequence(pool)
    seq.try_reserve(16)  # 4 reserved, 4 free (3 of them cached)
    got = []
    big = kvslots.Sequence(pool)
    waiter = threading.Thread(target=lambda: got.append(big.reserve(32, timeout=30)))
    waiter.start()
    while pool.waiters == 0:
        assert waiter.is_alive(), "the waiter did not queue"
    try:
        # An empty sequence's revival is a new admission: behind the waiter.
        assert kvslots.Sequence(pool).match_prefix(keys) == 0
        assert seq.match_prefix(keys) == 3
        assert (len(seq), seq.capacity) == (12, 16)
        assert (pool.used_blocks, pool.evictable_blocks) == (4, 0)
    finally:
        seq.close()
        waiter.join()
    assert got == [None] and len(big.block_ids) == 8
    big.close()
    assert pool.used_blocks == 0


def test_a_sequence_that_matched_into_a_reservation_stays_admitted():
    """The reservation was the admission: after a match that took every
    reserved block's place, the appends are growth, not refused behind a
    waiter queued since; the same match with no reservation is new work."""
    pool = kvslots.BlockPool(8, 4)
    owner, keys = _published(pool, list(range(8)))
    seq = kvslots.Sequence(pool)
    seq.try_reserve(4)  # admitted: one block
    hog = pool.try_alloc(3)  # 2 free
    got = []
    big = kvslots.Sequence(pool)
    waiter = threading.Thread(target=lambda: got.append(big.reserve(16, timeout=30)))
    waiter.start()
    while pool.waiters == 0:
        assert waiter.is_alive(), "the waiter did not queue"
    try:
        assert seq.match_prefix(keys) == 2
        assert (len(seq), seq.capacity, pool.free_blocks) == (8, 8, 3)
        seq.try_append(4)  # growth
        assert (len(seq), pool.free_blocks) == (12, 2)
        newcomer = kvslots.Sequence(pool)
        assert newcomer.match_prefix(keys) == 2
        try:
            newcomer.try_append(4)
        except kvslots.BehindWaiters:
            pass
        else:
            raise AssertionError("a new request's append passed the queued waiter")
        assert (len(newcomer), len(newcomer.block_ids)) == (8, 2)
        newcomer.close()
    finally:
        seq.close()
        owner.close()
        pool.free(hog)
        waiter.join()
    assert got == [None] and len(big.block_ids) == 4
    big.close()
    assert pool.used_blocks == 0
