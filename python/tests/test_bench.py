"""The Python benchmark's pools (python/bench/bench.py), run short: kvslots
and the Python LRU pool written with vLLM's policy make the same hits and
evictions on a slice of the Mooncake trace, request by request, so the
benchmark compares equal work; every alloc/free loop, the floor's
included, leaves its pool as it found it."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("kvslots_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


# The full run's pool (16 GiB of llama-3-8b KV cache): most admissions evict.
NUM_BLOCKS, BLOCK_SIZE, REQUESTS = 8192, 16, 300


@pytest.fixture(scope="module")
def batches(bench):
    requests = bench.load_trace(bench.DEFAULT_TRACE, REQUESTS)
    assert len(requests) == REQUESTS
    return list(bench.chunks(requests, BLOCK_SIZE, size=100))


def per_request(bench, pool, batches):
    """Each request's hit blocks, and the pool's evictions after all."""
    hits = []
    for batch in batches:
        for n, keys in batch:
            max_hit = min(len(keys) // 32, (n - 1) // BLOCK_SIZE)
            given = keys if getattr(pool, "packed", False) else bench.unpack(keys)
            hits.append(pool.request(n, given, max_hit))
    return hits, pool.evictions()


def test_kvslots_and_the_python_lru_pool_hit_alike_request_by_request(bench, batches):
    lru_hits, lru_evictions = per_request(bench, bench.PythonLruPool(NUM_BLOCKS, BLOCK_SIZE), batches)
    for cls in (bench.KvslotsPool, bench.KvslotsPackedPool):
        pool = cls(NUM_BLOCKS, BLOCK_SIZE)
        hits, evictions = per_request(bench, pool, batches)
        assert hits == lru_hits, cls.name
        assert evictions == lru_evictions, cls.name
        # Every request's blocks went back: only cached ones are held.
        assert pool.pool.used_blocks == 0
    # The slice exercises both: hits, and evictions.
    assert sum(lru_hits) > 0
    assert lru_evictions > 0


def test_the_replay_counts_what_it_served(bench, batches):
    elapsed, served, hits, queried = bench.replay(
        bench.KvslotsPool(NUM_BLOCKS, BLOCK_SIZE), batches, BLOCK_SIZE
    )
    expected, _ = per_request(bench, bench.PythonLruPool(NUM_BLOCKS, BLOCK_SIZE), batches)
    assert (served, hits) == (REQUESTS, sum(expected))
    assert hits <= queried
    assert elapsed > 0


@pytest.mark.parametrize("k", [1, 16, 128])
def test_alloc_free_loops_leave_their_pools_as_found(bench, k):
    pool = bench.KvslotsPool(NUM_BLOCKS, BLOCK_SIZE)
    pool.alloc_free(k, 10)
    assert pool.pool.free_blocks == NUM_BLOCKS
    lru = bench.PythonLruPool(NUM_BLOCKS, BLOCK_SIZE)
    lru.alloc_free(k, 10)
    assert lru.num_free == NUM_BLOCKS
    assert all(b.ref_cnt == 0 for b in lru.blocks)
    # The floor builds and drops its list without a pool.
    bench.floor_alloc_free(k, 10)


@pytest.mark.parametrize(("batch", "steps"), [(3, 1), (5, 17), (64, 40)])
def test_decode_loops_take_the_same_blocks(bench, batch, steps):
    # Each decoder appends one token a sequence and step: every pool ends
    # holding ceil(steps / block_size) blocks a sequence.
    want = batch * -(-steps // BLOCK_SIZE)
    for run in (bench.decode_kvslots_each, bench.decode_kvslots_loop, bench.decode_python_lru):
        elapsed, blocks = run(NUM_BLOCKS, BLOCK_SIZE, batch, steps)
        assert blocks == want, run.__name__
        assert elapsed > 0


def test_the_batched_decoder_refuses_a_pool_that_runs_out(bench):
    with pytest.raises(MemoryError):
        bench.decode_kvslots_each(4, BLOCK_SIZE, 5, 1)


@pytest.mark.parametrize(("batch", "steps"), [(3, 1), (5, 129), (7, 145), (16, 300)])
def test_hybrid_decode_loops_hold_the_same_blocks(bench, batch, steps):
    # Each sequence holds ceil(steps / block_size) blocks in its full
    # group, and in its sliding group those from the block of the window's
    # first token (of the last token appended, steps - 1) on.
    full = -(-steps // BLOCK_SIZE)
    before_window = max(0, steps - bench.WINDOW) // BLOCK_SIZE
    want = batch * (2 * full - before_window)
    for run in (bench.decode_kvslots_hybrid, bench.decode_python_lru_hybrid):
        elapsed, blocks = run(NUM_BLOCKS, BLOCK_SIZE, batch, steps)
        assert blocks == want, run.__name__
        assert elapsed > 0


def test_a_trace_limit_below_one_loads_nothing(bench):
    # From a helper's attack: a limit of 0 (or below) loaded the whole trace.
    assert bench.load_trace(bench.DEFAULT_TRACE, 0) == []
    assert bench.load_trace(bench.DEFAULT_TRACE, -3) == []
    assert len(bench.load_trace(bench.DEFAULT_TRACE, 2)) == 2


@pytest.mark.parametrize(
    "option",
    [
        ["--repeats", "0"],
        ["--decode-batch", "0"],
        ["--decode-steps", "0"],
        ["--rounds", "0"],
        ["--requests", "-1"],
        ["--requests", "0"],
        ["--block-size", "0"],
        ["--num-blocks", "x"],
        ["--num-blocks", "10"],  # under the trace's longest prompt
        ["--decode-batch", "100000"],  # more blocks than the pool's
        ["--trace", "/nonexistent/trace.jsonl"],
    ],
)
def test_the_benchmark_refuses_a_bad_option(option):
    # From a helper's attack: bad values ended in tracebacks (or, for
    # --requests 0, replayed the whole trace).
    done = subprocess.run(
        [sys.executable, str(BENCH), "--requests", "5", "--repeats", "1", "--rounds", "10",
         "--decode-batch", "2", "--decode-steps", "2", *option],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2, done.stderr[-500:]
    assert option[0] in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_peeks_count_alike_and_change_nothing(bench, batches):
    # After the same replay, every pool's peeks count the same blocks
    # request by request, and kvslots' pool is unchanged by them.
    lru = bench.PythonLruPool(NUM_BLOCKS, BLOCK_SIZE)
    kv = bench.KvslotsPool(NUM_BLOCKS, BLOCK_SIZE)
    packed = bench.KvslotsPackedPool(NUM_BLOCKS, BLOCK_SIZE)
    for pool in (lru, kv, packed):
        per_request(bench, pool, batches)
    before = (kv.pool.evictable_blocks, kv.pool.prefix_stats())
    counts = {}
    for pool in (lru, kv, packed):
        got = []
        for batch in batches:
            for n, keys in batch:
                max_hit = min(len(keys) // 32, (n - 1) // BLOCK_SIZE)
                given = keys if getattr(pool, "packed", False) else bench.unpack(keys)
                got.append(pool.peek(given, max_hit))
        counts[pool.name] = got
    assert counts["kvslots"] == counts["python-lru"] == counts["kvslots (packed keys)"]
    assert sum(counts["kvslots"]) > 0
    assert (kv.pool.evictable_blocks, kv.pool.prefix_stats()) == before
    _, peeks, hits = bench.peek_all(kv, batches, BLOCK_SIZE)
    assert (peeks, hits) == (REQUESTS, sum(counts["kvslots"]))
