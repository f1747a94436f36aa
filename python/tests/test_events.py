"""KV events (`BlockPool(..., kv_events=N)`, `drain_events()`), the
`stats()` snapshot, and the constructor's errors: bad sizes raise
`ValueError`, a pool too large for memory `MemoryError`, and nothing is
built either way."""

import textwrap
import threading

import pytest

import kvslots
from conftest import run_python
from kvslots import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventsDropped,
    KVEventBatch,
    PoolStats,
)


def keys_of(tokens, block_size):
    return kvslots.hash_blocks(tokens, block_size)


def test_a_pool_reports_stores_and_removals_in_vllm_shapes():
    pool = kvslots.BlockPool(4, 2, shards=1, kv_events=64)
    assert pool.has_kv_events
    keys = keys_of(range(6), 2)
    seq = kvslots.Sequence(pool)
    seq.try_append(6)
    blocks = seq.block_ids
    assert seq.publish(keys) == 3

    batch = pool.drain_events()
    assert isinstance(batch, KVEventBatch)
    assert batch.seq == 0 and len(batch) == 2 and batch.ts > 1.5e9
    cleared, stored = batch.events
    assert isinstance(cleared, AllBlocksCleared) and repr(cleared) == "AllBlocksCleared()"
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == keys
    assert stored.parent_block_hash is None
    assert stored.block_ids == blocks
    assert (stored.block_size, stored.token_count) == (2, 6)
    assert (stored.lora_id, stored.medium, stored.group_idx) == (None, None, None)
    assert BlockStored.__match_args__ == ("block_hashes", "parent_block_hash", "block_ids", "block_size")

    # The batch does not change: each read of `events` is a new list.
    batch.events.clear()
    assert len(batch) == 2 and batch.events == [cleared, stored]
    assert batch.events is not batch.events

    # A truncate into the last block, which the sequence holds alone,
    # drops its key.
    seq.truncate(5)
    batch = pool.drain_events()
    assert batch.seq == 1
    (removed,) = batch.events
    assert isinstance(removed, BlockRemoved)
    assert removed.block_hashes == [keys[2]] and removed.medium is None
    assert removed.group_idx is None

    # Nothing new: an empty batch carries the next number.
    empty = pool.drain_events()
    assert (empty.seq, empty.events) == (2, [])
    seq.close()


def test_a_hybrid_sequence_names_the_group_of_each_store_and_removal():
    pool = kvslots.BlockPool(8, 2, shards=1, kv_events=64)
    groups = kvslots.KvGroups(["full", 2])  # a full group, a 2-token window
    content = keys_of(range(4), 2)
    keys = groups.keys(content)
    seq = kvslots.HybridSequence(pool, groups)
    seq.try_append(4)
    # Each group caches its two blocks under its own keys.
    assert seq.publish(keys) == 4
    stored = {e.group_idx: e for e in pool.drain_events().events if isinstance(e, BlockStored)}
    assert sorted(stored) == [0, 1]
    assert stored[0].block_hashes == keys.group(0)
    assert stored[1].block_hashes == keys.group(1)
    assert stored[1].block_ids == seq.block_ids(1)
    assert "group_idx=1" in repr(stored[1])
    seq.close()

    # The reset removes every key, each event naming its group.
    assert pool.reset_prefix_cache() == 4
    removed = {}
    for event in pool.drain_events().events:
        assert isinstance(event, BlockRemoved)
        assert f"group_idx={event.group_idx}" in repr(event)
        removed.setdefault(event.group_idx, []).extend(event.block_hashes)
    assert set(removed) == {0, 1}
    assert sorted(removed[0]) == sorted(keys.group(0))
    assert sorted(removed[1]) == sorted(keys.group(1))

    # A plain sequence on the same blocks: no group.
    plain = kvslots.Sequence(pool)
    plain.try_append(4)
    assert plain.publish(content) == 2
    (event,) = pool.drain_events().events
    assert event.group_idx is None
    plain.close()


def test_a_parent_chain_continues_across_publishes():
    pool = kvslots.BlockPool(8, 2, shards=1, kv_events=64)
    keys = keys_of(range(8), 2)
    seq = kvslots.Sequence(pool)
    seq.try_append(8)
    assert seq.publish(keys[:2]) == 2
    pool.drain_events()
    assert seq.publish(keys) == 2
    (stored,) = pool.drain_events().events
    assert stored.block_hashes == keys[2:]
    assert stored.parent_block_hash == keys[1]
    seq.close()


@pytest.mark.parametrize("shards", [None, 1, 4])
def test_a_parent_stored_after_its_child_comes_first_in_the_batch(shards):
    # From a helper's attack: with one ring (a small pool, or shards=1) the
    # batch kept the ring's order, the child's store before its parent's.
    pool = kvslots.BlockPool(64, 4, kv_events=256, shards=shards)
    pool.drain_events()
    groups = kvslots.KvGroups(["full", 4])
    keys = groups.keys(kvslots.hash_blocks(list(range(12)), 4))
    a = kvslots.HybridSequence(pool, groups)
    a.try_append(8)
    a.try_append(4)  # the 4-token window gives group 1's first block back
    assert a.block_ids(1)[0] is None
    a.publish(keys)  # group 1 stores blocks 1 and 2, parent block 0's key
    b = kvslots.HybridSequence(pool, groups)
    b.try_append(4)
    b.publish(keys)  # group 1 stores block 0's key
    stores = [
        (e.parent_block_hash, e.block_hashes)
        for e in pool.drain_events().events
        if isinstance(e, BlockStored) and e.group_idx == 1
    ]
    order = [k for _, hashes in stores for k in hashes]
    k0, k1, k2 = keys.group(1)[:3]
    assert sorted(order) == sorted([k0, k1, k2])
    assert order.index(k0) < order.index(k1) < order.index(k2)
    # Every store's parent is known by the time it comes.
    seen = set()
    for parent, hashes in stores:
        assert parent is None or parent in seen
        seen.update(hashes)
    a.close()
    b.close()


def test_a_full_ring_reports_how_many_events_it_lost():
    pool = kvslots.BlockPool(8, 2, shards=1, kv_events=2)
    pool.drain_events()
    seq = kvslots.Sequence(pool)
    seq.try_append(10)
    assert seq.publish(keys_of(range(10), 2)) == 5
    stats = pool.stats()
    assert stats.events_dropped == 3
    events = pool.drain_events().events
    assert isinstance(events[0], BlockStored) and len(events[0].block_hashes) == 2
    assert isinstance(events[1], EventsDropped) and events[1].count == 3
    assert repr(events[1]) == "EventsDropped(count=3)"
    seq.close()


def test_a_pool_without_events_drains_nothing():
    pool = kvslots.BlockPool(8, 2)
    assert not pool.has_kv_events
    seq = kvslots.Sequence(pool)
    seq.try_append(4)
    seq.publish(keys_of(range(4), 2))
    for _ in range(2):
        batch = pool.drain_events()
        assert (batch.seq, batch.events) == (0, [])
    assert pool.stats().events_dropped is None
    seq.close()


def test_threads_and_a_consumer_agree_with_the_pool():
    pool = kvslots.BlockPool(24, 2, shards=4, kv_events=1 << 16)
    prompts = [keys_of([f // 4 * 100 + t if t < 2 else f * 100 + t for t in range(8)], 2)
               for f in range(12)]
    stop = threading.Event()
    batches = []

    def consume():
        while not stop.is_set():
            batches.append(pool.drain_events())

    def work(seed):
        cached = 0
        for i in range(300):
            keys = prompts[(seed * 7 + i * 5) % len(prompts)]
            with kvslots.Sequence(pool) as seq:
                k = seq.match_prefix(keys)
                try:
                    seq.try_append(8 - 2 * k)
                except kvslots.Full:
                    continue
                cached += seq.publish(keys)
                if i % 5 == 0:
                    seq.truncate(7)
        return cached

    consumer = threading.Thread(target=consume)
    consumer.start()
    results = []
    workers = [threading.Thread(target=lambda s=s: results.append(work(s))) for s in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    stop.set()
    consumer.join()
    batches.append(pool.drain_events())

    numbered = [b for b in batches if len(b)]
    assert [b.seq for b in numbered] == list(range(len(numbered)))
    events = [e for b in numbered for e in b.events]
    assert isinstance(events[0], AllBlocksCleared)
    view, stores = {}, 0
    for e in events[1:]:
        if isinstance(e, BlockStored):
            for key, block in zip(e.block_hashes, e.block_ids):
                assert view.get(key) is None, "stored twice"
                view[key] = block
                stores += 1
        elif isinstance(e, BlockRemoved):
            for key in e.block_hashes:
                assert view.get(key) is not None, "removed while not stored"
                view[key] = None
        else:
            pytest.fail(f"unexpected {e!r}")
    assert stores == sum(results)
    for key in {k for p in prompts for k in p}:
        with kvslots.Sequence(pool) as probe:
            now = probe.block_ids[0] if probe.match_prefix([key]) else None
        assert view.get(key) == now


def test_stats_is_every_method_in_one_frozen_snapshot():
    pool = kvslots.BlockPool(8, 2, kv_events=16)
    seq = kvslots.Sequence(pool)
    seq.try_append(6)
    seq.publish(keys_of(range(6), 2))
    stats = pool.stats()
    assert isinstance(stats, PoolStats)
    assert stats.num_blocks == pool.num_blocks
    assert (stats.used_blocks, stats.free_blocks, stats.peak_used_blocks) == (3, 5, 3)
    assert (stats.cached_blocks, stats.evictable_blocks) == (3, 0)
    assert (stats.pending_release_blocks, stats.waiters) == (0, 0)
    assert stats.usage == 3 / 8
    assert stats.events_dropped == 0
    prefix = pool.prefix_stats()
    assert (stats.queried_blocks, stats.hit_blocks, stats.evictions) == (
        prefix["queried_blocks"],
        prefix["hit_blocks"],
        prefix["evictions"],
    )
    d = stats.as_dict()
    assert d["used_blocks"] == 3 and d["usage"] == 3 / 8 and d["events_dropped"] == 0
    assert stats == pool.stats()
    with pytest.raises(AttributeError):
        stats.used_blocks = 0
    seq.close()
    assert pool.stats() != stats
    assert "PoolStats(num_blocks=8" in repr(stats)


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((8, 0), {}),
        ((2**32, 16), {}),
        ((2**31, 2**40), {}),
        ((8, 16), {"shards": 0}),
        ((8, 16), {"kv_events": 0}),
        ((8, 16), {"kv_events": -1}),
    ],
)
def test_bad_sizes_raise_value_error(args, kwargs):
    with pytest.raises(ValueError):
        kvslots.BlockPool(*args, **kwargs)


def test_kv_events_must_be_an_int():
    with pytest.raises(TypeError):
        kvslots.BlockPool(8, 16, kv_events=1.5)


def run_limited(code):
    """Runs `code` in a fresh interpreter whose address space is limited to
    4 GiB, so that a large pool is refused by the allocator whatever the
    machine's memory and overcommit."""
    script = textwrap.dedent(
        """
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        import kvslots
        """
    ) + textwrap.dedent(code)
    return run_python(script)


def test_a_pool_too_large_for_memory_raises_memory_error():
    run = run_limited(
        """
        try:
            kvslots.BlockPool(200_000_000, 16)  # 14 GB of bookkeeping
        except MemoryError as e:
            assert "out of memory" in str(e), e
        else:
            raise SystemExit("built")
        # Nothing was left allocated: a small pool still fits.
        assert kvslots.BlockPool(1024, 16).free_blocks == 1024
        try:
            kvslots.BlockPool(1024, 16, kv_events=1 << 26)  # 8 GB of event rings
        except MemoryError:
            pass
        else:
            raise SystemExit("built the rings")
        print("ok")
        """
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
