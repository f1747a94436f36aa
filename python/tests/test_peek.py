"""BlockPool.peek_prefix and peek_hybrid_prefix: the cached prefix a match
would take, found without taking it; bad keys raise and change nothing."""

import threading

import pytest

import kvslots
from conftest import pool_state


def published(pool, tokens, salt=None):
    """A sequence holding `tokens` with its full blocks published."""
    keys = kvslots.hash_blocks(tokens, pool.block_size)
    seq = kvslots.Sequence(pool)
    seq.try_append(len(tokens))
    assert seq.publish(keys) == len(keys)
    return seq, keys


def test_a_peek_counts_what_a_match_takes_and_changes_nothing():
    pool = kvslots.BlockPool(8, 4)
    seq, keys = published(pool, list(range(8)))
    seq.close()  # cached and evictable
    longer = kvslots.hash_blocks(list(range(16)), 4)
    before = (pool_state(pool), pool.prefix_stats())
    assert pool.peek_prefix(longer) == 2
    assert pool.peek_prefix(b"".join(longer)) == 2  # packed keys
    assert pool.peek_prefix(bytearray(b"".join(longer[:1]))) == 1
    assert pool.peek_prefix([]) == 0
    assert pool.peek_prefix(longer[2:]) == 0
    assert (pool_state(pool), pool.prefix_stats()) == before
    second = kvslots.Sequence(pool)
    assert second.match_prefix(longer) == 2
    second.close()


def test_a_peek_leaves_the_eviction_order_alone():
    pool = kvslots.BlockPool(2, 4)
    a, ka = published(pool, [1, 2, 3, 4])
    b, kb = published(pool, [5, 6, 7, 8])
    a.close()
    b.close()  # a's block is the older: the next allocation evicts it
    assert pool.peek_prefix(ka) == 1
    ids = pool.try_alloc(1)
    assert (pool.peek_prefix(ka), pool.peek_prefix(kb)) == (0, 1)
    pool.free(ids)


def test_bad_keys_raise_and_change_nothing():
    pool = kvslots.BlockPool(8, 4)
    seq, keys = published(pool, list(range(8)))
    before = (pool_state(pool), pool.prefix_stats())
    for bad, error in [([keys[0], b"short"], ValueError), ([keys[0], "x" * 32], TypeError),
                       ([keys[0], 7], TypeError), (7, TypeError), (set(keys), TypeError),
                       (b"x" * 33, ValueError), ([keys[0], bytes(33)], ValueError)]:
        with pytest.raises(error):
            pool.peek_prefix(bad)
        assert (pool_state(pool), pool.prefix_stats()) == before
    with pytest.raises(TypeError):
        pool.peek_hybrid_prefix(keys)
    assert (pool_state(pool), pool.prefix_stats()) == before
    seq.close()


def test_a_pool_without_a_prefix_cache_peeks_nothing():
    pool = kvslots.BlockPool(8, 4, prefix_cache=False)
    seq = kvslots.Sequence(pool)
    seq.try_append(8)
    keys = kvslots.hash_blocks(list(range(8)), 4)
    assert seq.publish(keys) == 0
    assert pool.peek_prefix(keys) == 0
    seq.close()


def test_a_hybrid_peek_finds_what_a_hybrid_match_takes():
    pool = kvslots.BlockPool(64, 4)
    groups = kvslots.KvGroups([5, "full"])
    prompt = list(range(22))
    keys = groups.keys(kvslots.hash_blocks(prompt, 4))
    with kvslots.HybridSequence(pool, groups) as first:
        first.try_append(len(prompt))
        assert first.publish(keys) == 10
    before = (pool_state(pool), pool.prefix_stats())
    assert pool.peek_hybrid_prefix(keys) == 5
    # Another prompt sharing 3 blocks: the full group has 3, and position
    # 12 reads 8..=12, the sliding group's block 2.
    other = groups.keys(kvslots.hash_blocks(prompt[:12] + [99] * 12, 4))
    assert pool.peek_hybrid_prefix(other) == 3
    assert pool.peek_hybrid_prefix(groups.keys([])) == 0
    assert (pool_state(pool), pool.prefix_stats()) == before
    second = kvslots.HybridSequence(pool, groups)
    assert second.match_prefix(keys) == 5
    third = kvslots.HybridSequence(pool, groups)
    assert third.match_prefix(other) == 3
    second.close()
    third.close()


def test_threads_peek_a_held_prefix_while_others_churn():
    pool = kvslots.BlockPool(16, 4)
    held, keys = published(pool, list(range(1000, 1012)))
    ghost = kvslots.hash_blocks(list(range(1000, 1012)), 4, salt=b"never published")
    errors = []

    def churn(seed):
        for i in range(300):
            tokens = [seed * 100_000 + i % 7 * 10 + t for t in range(8)]
            seq = kvslots.Sequence(pool)
            k = kvslots.hash_blocks(tokens, 4)
            seq.match_prefix(k)
            if seq.try_append(8 - len(seq)) is not None:
                seq.publish(k)
            seq.close()

    def peek():
        try:
            for _ in range(2000):
                assert pool.peek_prefix(keys) == 3
                assert pool.peek_prefix(keys + ghost) == 3
                assert pool.peek_prefix(ghost) == 0
        except AssertionError as e:
            errors.append(e)

    threads = [threading.Thread(target=churn, args=(s,)) for s in range(2)]
    threads += [threading.Thread(target=peek) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pool.prefix_stats()["evictions"] > 0
    held.close()
    assert pool.used_blocks == 0


@pytest.mark.parametrize("cached", [0, 1, 15, 16, 17, 32, 33, 50])
def test_packed_keys_peek_as_a_list_does(cached):
    # Packed keys are copied a growing prefix at a time (16, 32, 64...):
    # every length around those steps counts as the list form does.
    pool = kvslots.BlockPool(128, 4)
    tokens = list(range(50 * 4))
    seq = kvslots.Sequence(pool)
    seq.try_append(cached * 4)
    keys = kvslots.hash_blocks(tokens, 4)
    assert seq.publish(keys[:cached]) == cached
    packed = kvslots.hash_blocks_packed(tokens, 4)
    for n in (cached, cached + 1, 50):
        assert pool.peek_prefix(packed[: n * 32]) == pool.peek_prefix(keys[:n]) == min(cached, n)
    assert pool.peek_prefix(packed + packed) == cached  # the repeat ends it
    with pytest.raises(ValueError, match="multiple of 32"):
        pool.peek_prefix(packed + b"x")
    seq.close()
