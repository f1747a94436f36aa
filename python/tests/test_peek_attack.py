"""Attacks on BlockPool.peek_prefix / peek_hybrid_prefix across the FFI:
every key form answers alike around the packed copy's growth steps and
the DIRECT=32 cut, mutation from other threads during long peeks, huge
inputs, odd key objects, GroupKeys of other groups/pools."""

import random
import threading

import pytest

import kvslots
from conftest import pool_state


def _published(pool, tokens, salt=b""):
    keys = kvslots.hash_blocks(tokens, pool.block_size, salt=salt)
    seq = kvslots.Sequence(pool)
    seq.try_append(len(tokens))
    assert seq.publish(keys) == len(keys)
    return seq, keys


class BytesSub(bytes):
    def __len__(self):  # lies; the FFI must read the real buffer
        return 0


@pytest.mark.parametrize("seed", range(12))
def test_every_key_form_peeks_as_the_match_takes(seed):
    rng = random.Random(seed)
    bs = 2
    pool = kvslots.BlockPool(200, bs)
    n = 90
    tokens = list(range(n * bs))
    seq, keys = _published(pool, tokens[: rng.choice([0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 90]) * bs])
    allk = kvslots.hash_blocks(tokens, bs)
    if rng.random() < 0.5:
        seq.close()
    for _ in range(20):
        length = rng.randrange(0, 100)
        lst = allk[: min(length, n)]
        if rng.random() < 0.6 and lst:
            # a misuse repeat at a position around 16/32/64
            pos = min(len(lst), rng.choice([1, 15, 16, 17, 31, 32, 33, 63, 64, 65]))
            lst = lst[:pos] + [lst[rng.randrange(pos)]] + lst[pos:]
        packed = b"".join(lst)
        before = (pool_state(pool), pool.prefix_stats())
        forms = [
            pool.peek_prefix(lst),
            pool.peek_prefix(tuple(lst)),
            pool.peek_prefix(iter(lst)),
            pool.peek_prefix(packed),
            pool.peek_prefix(bytearray(packed)),
            pool.peek_prefix(BytesSub(packed)),
            pool.peek_prefix([bytearray(k) for k in lst]),
        ]
        assert (pool_state(pool), pool.prefix_stats()) == before
        assert len(set(forms)) == 1, forms
        m = kvslots.Sequence(pool)
        got = m.match_prefix(lst)
        assert got == forms[0], (got, forms)
        m.close()
    seq.close()


def beside_a_mutator(mutate, peek, peekers=2):
    """Runs `mutate(stop)` on one thread until `peekers` threads have each
    run `peek()`; returns the exceptions the peekers raised."""
    stop = threading.Event()
    errors = []

    def checked():
        try:
            peek()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    mutator = threading.Thread(target=mutate, args=(stop,))
    threads = [threading.Thread(target=checked) for _ in range(peekers)]
    mutator.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    mutator.join()
    return errors


def test_mutating_inputs_from_other_threads_during_long_peeks():
    pool = kvslots.BlockPool(256, 1)
    seq, keys = _published(pool, list(range(200)))
    packed = b"".join(keys)
    ba = bytearray(packed)
    lst = list(keys)

    def mutate(stop):
        r = random.Random(1)
        while not stop.is_set():
            i = r.randrange(len(lst))
            lst[i] = bytes(32) if r.random() < 0.5 else keys[i]
            if r.random() < 0.3:
                ba[:] = packed[: 32 * r.randrange(0, 200)]
            else:
                ba[:] = packed
            if r.random() < 0.1:
                lst.append(keys[0])
                lst.pop()

    def peek():
        for _ in range(3000):
            a = pool.peek_prefix(ba)
            b = pool.peek_prefix(lst)
            assert 0 <= a <= 200 and 0 <= b <= 200

    errors = beside_a_mutator(mutate, peek)
    assert errors == []
    seq.close()


def test_huge_inputs():
    pool = kvslots.BlockPool(64, 4)
    seq, keys = _published(pool, list(range(64)))
    big = b"".join(keys) + bytes(32) * (1 << 20)  # 32 MiB of keys
    before = (pool_state(pool), pool.prefix_stats())
    assert pool.peek_prefix(big) == 16
    assert pool.peek_prefix(bytearray(big[: 32 * (1 << 16)])) == 16
    assert pool.peek_prefix(keys + [bytes(32)] * (1 << 18)) == 16
    # A huge list of the cached keys repeated: cut at the first repeat.
    assert pool.peek_prefix(keys * 10_000) == 16
    assert pool.peek_prefix(b"".join(keys) * 10_000) == 16
    assert (pool_state(pool), pool.prefix_stats()) == before
    with pytest.raises(ValueError):
        pool.peek_prefix(big + b"\0")
    seq.close()


def test_odd_key_objects_raise_alike_in_peek_and_match():
    pool = kvslots.BlockPool(8, 4)
    seq, keys = _published(pool, list(range(8)))
    before = (pool_state(pool), pool.prefix_stats())
    m = kvslots.Sequence(pool)
    for bad in [memoryview(b"".join(keys)), [memoryview(keys[0])], None, [None], {"a": 1},
                frozenset(keys), "x" * 64, [keys[0], 2 ** 300], 3.0, [b""], b"\0" * 31,
                bytearray(b"\0" * 33)]:
        kinds = []
        for f in (pool.peek_prefix, m.match_prefix):
            try:
                f(bad)
                kinds.append(None)
            except (TypeError, ValueError) as e:
                kinds.append(type(e))
        assert kinds[0] == kinds[1], (bad, kinds)
        assert kinds[0] is not None, bad
        assert (pool_state(pool), pool.prefix_stats()) == before
    m.close()
    seq.close()


def test_group_keys_of_other_groups_and_pools():
    pool = kvslots.BlockPool(64, 4)
    other = kvslots.BlockPool(64, 8)
    nocache = kvslots.BlockPool(64, 4, prefix_cache=False)
    g1 = kvslots.KvGroups([5, "full"])
    g2 = kvslots.KvGroups(["full", 5])
    prompt = list(range(24))
    k1 = g1.keys(kvslots.hash_blocks(prompt, 4))
    with kvslots.HybridSequence(pool, g1) as s:
        s.try_append(24)
        s.publish(k1)
    assert pool.peek_hybrid_prefix(k1) == 6 - 0 or pool.peek_hybrid_prefix(k1) <= 6
    k2 = g2.keys(kvslots.hash_blocks(prompt, 4))
    assert pool.peek_hybrid_prefix(k2) == 0
    assert other.peek_hybrid_prefix(k1) == 0
    assert nocache.peek_hybrid_prefix(k1) == 0
    assert nocache.peek_prefix(kvslots.hash_blocks(prompt, 4)) == 0
    with pytest.raises(ValueError):
        nocache.peek_prefix([b"short"])
    with pytest.raises(TypeError):
        pool.peek_hybrid_prefix(kvslots.hash_blocks(prompt, 4))
    pool.close()
    assert pool.peek_hybrid_prefix(k1) == 6


def test_peek_hybrid_while_another_thread_extends_and_truncates_the_keys():
    pool = kvslots.BlockPool(512, 1)
    groups = kvslots.KvGroups([3, "full", 1])
    base = kvslots.hash_blocks(list(range(120)), 1)
    keys = groups.keys(base)
    with kvslots.HybridSequence(pool, groups) as s:
        s.try_append(120)
        s.publish(keys)

    def mutate(stop):
        r = random.Random(3)
        while not stop.is_set():
            keys.truncate(r.randrange(0, 120))
            keys.extend(base[len(keys):])

    def peek():
        for _ in range(3000):
            assert 0 <= pool.peek_hybrid_prefix(keys) <= 120

    errors = beside_a_mutator(mutate, peek)
    assert errors == []
    assert pool.peek_hybrid_prefix(keys) == len(keys)
