#!/usr/bin/env python3
"""kvslots from Python against Python block pools, on a scheduler's calls.

Four workloads, each run on every pool in turn (one thread):

* **trace**: the Mooncake conversation trace (traces/mooncake-conversation.jsonl)
  replayed request by request through the calls a scheduler makes: match
  the prompt's cached prefix, append the rest of the prompt (all its blocks),
  publish the full blocks, free the request. 4 scheduler calls a request
  (kvslots makes them through 6 calls into the package: `Sequence`,
  `match_prefix`, `len`, `try_append`, `publish`, `close`).
* **decode**: a decode step's appends, one token to each of `--decode-batch`
  running sequences, `--decode-steps` steps (a new block every
  `block_size` steps): kvslots through one `try_append_each` call a step
  and through one `try_append` call a sequence, against the Python pools'
  per-request bookkeeping (a token count, and a block from the pool when
  the count passes the last block). The same over two groups of layers
  (**hybrid decode**, gpt-oss's: a 128-token sliding window and full
  attention): `HybridSequence`s through `try_append_each`, against the
  Python pools' bookkeeping as vLLM's sliding-window manager keeps it (the
  blocks that leave the window freed, a block a group allocated).
* **peek**: every request's cached prefix counted again, without taking
  it, on the pool the trace's last replay left (kvslots'
  `BlockPool.peek_prefix`; the Python pools' lookups until the first miss,
  vLLM's `get_cached_block` as its `get_computed_blocks` makes them).
* **alloc/free**: allocate k blocks and free them, for k in 1, 16, 128;
  beside the pools, the floor of any pool whose `alloc(k)` returns a list
  of ints (`floor_alloc_free`: the list of k new ints and two calls, no
  pool work), which bounds the ratio any such pool can reach.

The pools:

* `kvslots`: this package (`Sequence.match_prefix`, `try_append`,
  `publish`, `close`; `BlockPool.try_alloc` / `free`).
* `python-lru`: a dict + doubly-linked free list of block objects, written
  here with vLLM's policy: uncached free blocks are reused first (LIFO),
  cached ones least recently freed first, a request's blocks freed tail
  first, the last prompt token never matched.
* `vllm`: vLLM's own `vllm.v1.core.block_pool.BlockPool` (get_cached_block,
  touch, get_new_blocks, cache_full_blocks, free_blocks), when it can be
  imported: from an installed vllm, or from the sources of a vllm wheel with
  `--vllm-src DIR` (the rest of `vllm.*` is stubbed, so no torch is needed):

      pip download vllm==0.34.0 --no-deps -d /tmp/vllm
      unzip -q /tmp/vllm/vllm-0.34.0-*.whl 'vllm/*' 'vllm-*.dist-info/*' -d /tmp/vllm/src
      python python/bench/bench.py --vllm-src /tmp/vllm/src

The trace names a prompt's content by one id per 512-token block (an id
names its block and every block before it). A prompt's tokens are made from
its ids (token j of a block with id h is h * 512 + j), so equal id prefixes
give equal tokens, and every pool gets the same 32-byte keys from
`kvslots.hash_blocks`, computed before the clock starts (as a list of
32-byte keys, or packed in one bytes object for `kvslots (packed keys)`). As in
`kvslots-sim`, only the prompt's full 512-token blocks get keys. The pool
holds `--num-blocks` blocks of `--block-size` tokens (default 8,192 of 16:
16 GiB of llama-3-8b KV cache), so most admissions evict. Every pool sees
the same requests in the same order; the hit counts are printed side by
side.

Figures are per request (4 scheduler calls) and per alloc+free pair, best of
`--repeats` runs; ratios are the peer's time over kvslots'. Run it on an
idle machine: a build beside it moves the figures.
"""

from __future__ import annotations

import argparse
import array
import gc
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import platform
import sys
import time
import types
from pathlib import Path

import kvslots

TRACE_BLOCK = 512
# The alloc/free loops' sizes, in blocks.
ALLOC_FREE = (1, 16, 128)
REPO = Path(__file__).resolve().parents[2]
DEFAULT_TRACE = REPO / "traces" / "mooncake-conversation.jsonl"


# ---------------------------------------------------------------------------
# The workload
# ---------------------------------------------------------------------------


def load_trace(path: Path, limit: int | None) -> list[tuple[int, list[int]]]:
    """(input_length, ids of the full 512-token blocks) per request."""
    requests = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            n = r["input_length"]
            requests.append((n, r["hash_ids"][: n // TRACE_BLOCK]))
            if limit is not None and len(requests) >= limit:
                break
    return requests if limit is None or limit > 0 else []


def request_keys(ids: list[int], block_size: int) -> bytes:
    """The block keys of a prompt's full trace blocks, packed (32 bytes a
    key)."""
    tokens = array.array("I")
    for h in ids:
        tokens.extend(range(h * TRACE_BLOCK, (h + 1) * TRACE_BLOCK))
    if sys.byteorder != "little":
        tokens.byteswap()
    return kvslots.hash_blocks_packed(tokens.tobytes(), block_size)


def chunks(requests, block_size: int, size: int = 500):
    """The requests with their packed keys, `size` at a time."""
    for start in range(0, len(requests), size):
        yield [(n, request_keys(ids, block_size)) for n, ids in requests[start : start + size]]


def unpack(packed: bytes) -> list[bytes]:
    """Packed keys as a list of 32-byte keys (as `hash_blocks` returns)."""
    return [packed[i : i + 32] for i in range(0, len(packed), 32)]


# ---------------------------------------------------------------------------
# The pools: each serves one request (match, append, publish, free)
# ---------------------------------------------------------------------------


class KvslotsPool:
    """The keys as a list of 32-byte keys, as `hash_blocks` returns them."""

    name = "kvslots"
    packed = False

    def __init__(self, num_blocks: int, block_size: int):
        self.pool = kvslots.BlockPool(num_blocks, block_size)
        self.block_size = block_size

    def request(self, n_tokens: int, keys, max_hit: int) -> int:
        seq = kvslots.Sequence(self.pool)
        hit = seq.match_prefix(keys[: max_hit * 32] if self.packed else keys[:max_hit])
        seq.try_append(n_tokens - len(seq))
        seq.publish(keys)
        seq.close()
        return hit

    def peek(self, keys, max_hit: int) -> int:
        return self.pool.peek_prefix(keys[: max_hit * 32] if self.packed else keys[:max_hit])

    def alloc_free(self, k: int, rounds: int) -> None:
        alloc, free = self.pool.try_alloc, self.pool.free
        for _ in range(rounds):
            free(alloc(k))

    def evictions(self) -> int:
        return self.pool.prefix_stats()["evictions"]


class KvslotsPackedPool(KvslotsPool):
    """The keys packed in one bytes object, as `hash_blocks_packed` returns
    them: read in one copy instead of one conversion per key."""

    name = "kvslots (packed keys)"
    packed = True


class _Block:
    __slots__ = ("block_id", "ref_cnt", "key", "prev", "next")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.key = None
        self.prev = None
        self.next = None


class PythonLruPool:
    """A dict + doubly-linked LRU block pool with vLLM's policy."""

    name = "python-lru"

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.blocks = [_Block(i) for i in range(num_blocks)]
        self.cache: dict[bytes, _Block] = {}
        self.head = _Block(-1)  # sentinels: head.next is evicted first
        self.tail = _Block(-1)
        prev = self.head
        for b in self.blocks:
            prev.next, b.prev = b, prev
            prev = b
        prev.next, self.tail.prev = self.tail, prev
        self.num_free = num_blocks
        self.evicted = 0

    def _remove(self, b: _Block) -> None:
        b.prev.next, b.next.prev = b.next, b.prev
        b.prev = b.next = None
        self.num_free -= 1

    def match(self, keys: list[bytes]) -> list[_Block]:
        hit = []
        get = self.cache.get
        for key in keys:
            b = get(key)
            if b is None:
                break
            hit.append(b)
        for b in hit:  # touch
            if b.ref_cnt == 0:
                self._remove(b)
            b.ref_cnt += 1
        return hit

    def allocate(self, n: int) -> list[_Block]:
        if n > self.num_free:
            raise MemoryError(f"cannot allocate {n} blocks")
        out = []
        for _ in range(n):
            b = self.head.next
            self._remove(b)
            if b.key is not None:  # evict
                del self.cache[b.key]
                b.key = None
                self.evicted += 1
            b.ref_cnt = 1
            out.append(b)
        return out

    def publish(self, blocks: list[_Block], keys: list[bytes], start: int) -> None:
        cache = self.cache
        for i in range(start, min(len(blocks), len(keys))):
            b, key = blocks[i], keys[i]
            if b.key is None and key not in cache:
                cache[key] = b
                b.key = key

    def free(self, blocks: list[_Block]) -> None:
        front, back = [], []
        for b in reversed(blocks):  # the tail is evicted first
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                (front if b.key is None else back).append(b)
        # Uncached blocks are reused first, most recently freed first.
        for b in front:
            first = self.head.next
            self.head.next, b.prev, b.next, first.prev = b, self.head, first, b
        # Cached blocks are evicted least recently freed first.
        for b in back:
            last = self.tail.prev
            last.next, b.prev, b.next, self.tail.prev = b, last, self.tail, b
        self.num_free += len(front) + len(back)

    def peek(self, keys: list[bytes], max_hit: int) -> int:
        cache, hit = self.cache, 0
        for key in keys[:max_hit]:
            if key not in cache:
                break
            hit += 1
        return hit

    def request(self, n_tokens: int, keys: list[bytes], max_hit: int) -> int:
        blocks = self.match(keys[:max_hit])
        hit = len(blocks)
        need = -(-n_tokens // self.block_size) - hit
        blocks += self.allocate(need)
        self.publish(blocks, keys, hit)
        self.free(blocks)
        return hit

    def alloc_free(self, k: int, rounds: int) -> None:
        for _ in range(rounds):
            self.free(self.allocate(k))

    def evictions(self) -> int:
        return self.evicted


class VllmPool:
    """vLLM's BlockPool, driven as its single-type KV cache manager does."""

    name = "vllm"

    def __init__(self, num_blocks: int, block_size: int, block_pool_cls):
        # vLLM keeps block 0 as its null block: one more for the same room.
        self.pool = block_pool_cls(num_blocks + 1, True, block_size)
        self.block_size = block_size

    def peek(self, keys: list[bytes], max_hit: int) -> int:
        # The lookup of vLLM's `get_computed_blocks` (`find_longest_cache_hit`
        # for one full-attention group): cached blocks until the first miss.
        pool, hit = self.pool, 0
        for key in keys[:max_hit]:
            if pool.get_cached_block(key, [0]) is None:
                break
            hit += 1
        return hit

    def request(self, n_tokens: int, keys: list[bytes], max_hit: int) -> int:
        pool = self.pool
        hit = []
        for key in keys[:max_hit]:
            cached = pool.get_cached_block(key, [0])
            if cached is None:
                break
            hit.append(cached[0])
        pool.touch(hit)
        need = -(-n_tokens // self.block_size) - len(hit)
        if need > pool.get_num_free_blocks():
            raise MemoryError(f"cannot allocate {need} blocks")
        blocks = hit + pool.get_new_blocks(need)
        request = types.SimpleNamespace(block_hashes=keys)
        full = min(len(keys), n_tokens // self.block_size)
        pool.cache_full_blocks(request, blocks, len(hit), full, self.block_size, 0)
        pool.free_blocks(reversed(blocks))
        return len(hit)

    def alloc_free(self, k: int, rounds: int) -> None:
        pool = self.pool
        for _ in range(rounds):
            pool.free_blocks(pool.get_new_blocks(k))

    def evictions(self) -> int | None:
        return None


class _Running:
    """A Python pool's running request in the decode workload."""

    __slots__ = ("n", "blocks")

    def __init__(self):
        self.n = 0
        self.blocks = []


def decode_each(pool, seqs, steps: int):
    """Seconds for `steps` decode steps of `seqs` (sequences of `pool`),
    one `try_append_each` call a step; and the blocks the pool has in use
    at the end."""
    each = kvslots.try_append_each
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(steps):
        if each(seqs) != len(seqs):
            raise MemoryError("the pool ran out")
    elapsed = time.perf_counter() - t0
    return elapsed, pool.used_blocks


def decode_kvslots_each(num_blocks: int, block_size: int, batch: int, steps: int):
    """`decode_each` over `batch` new sequences."""
    pool = kvslots.BlockPool(num_blocks, block_size)
    return decode_each(pool, [kvslots.Sequence(pool) for _ in range(batch)], steps)


def decode_kvslots_loop(num_blocks: int, block_size: int, batch: int, steps: int):
    """As `decode_kvslots_each`, one `try_append(1)` call a sequence."""
    pool = kvslots.BlockPool(num_blocks, block_size)
    seqs = [kvslots.Sequence(pool) for _ in range(batch)]
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(steps):
        for seq in seqs:
            seq.try_append(1)
    elapsed = time.perf_counter() - t0
    return elapsed, pool.used_blocks


def decode_python(alloc, block_size: int, batch: int, steps: int):
    """A Python pool's decode steps: each request's token count, and a
    block from `alloc(1)` when it passes the last block."""
    running = [_Running() for _ in range(batch)]
    bs = block_size
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(steps):
        for r in running:
            n = r.n + 1
            if n > len(r.blocks) * bs:
                r.blocks += alloc(1)
            r.n = n
    elapsed = time.perf_counter() - t0
    return elapsed, sum(len(r.blocks) for r in running)


def decode_python_lru(num_blocks: int, block_size: int, batch: int, steps: int):
    """The Python LRU pool's `allocate(1)` in `decode_python`."""
    pool = PythonLruPool(num_blocks, block_size)
    return decode_python(pool.allocate, block_size, batch, steps)


def decode_vllm(block_pool_cls, num_blocks: int, block_size: int, batch: int, steps: int):
    """vLLM's BlockPool's `get_new_blocks(1)` in `decode_python`."""
    pool = block_pool_cls(num_blocks + 1, True, block_size)
    return decode_python(pool.get_new_blocks, block_size, batch, steps)


# gpt-oss's sliding window, in tokens.
WINDOW = 128


def decode_kvslots_hybrid(num_blocks: int, block_size: int, batch: int, steps: int):
    """`decode_each` over `batch` new `HybridSequence`s of two groups: a
    sliding window of `WINDOW` tokens and full attention."""
    pool = kvslots.BlockPool(num_blocks, block_size)
    groups = kvslots.KvGroups([WINDOW, "full"])
    return decode_each(pool, [kvslots.HybridSequence(pool, groups) for _ in range(batch)], steps)


class _RunningHybrid:
    """A Python pool's running request of two groups in the hybrid decode
    workload: the sliding group's table, its entries before `null` given
    back (None), and the full group's."""

    __slots__ = ("n", "window", "null", "full")

    def __init__(self):
        self.n = 0
        self.window = []
        self.null = 0
        self.full = []


def decode_python_hybrid(alloc, free, block_size: int, batch: int, steps: int):
    """A Python pool's hybrid decode steps, as vLLM's sliding-window
    manager keeps them: the sliding group's blocks wholly before the window
    of the new token go back to the pool (`free`), then a block for each
    group from `alloc(2)` when the count passes the last block."""
    running = [_RunningHybrid() for _ in range(batch)]
    bs = block_size
    # `(old + 1 - WINDOW) // bs` is negative while the window reaches back
    # to token 0: below `null`, as 0 would be.
    reach = 1 - WINDOW
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(steps):
        for r in running:
            old = r.n
            upto = (old + reach) // bs
            if upto > r.null:
                free(r.window[r.null : upto])
                r.window[r.null : upto] = [None] * (upto - r.null)
                r.null = upto
            if old + 1 > len(r.full) * bs:
                window, full = alloc(2)
                r.window.append(window)
                r.full.append(full)
            r.n = old + 1
    elapsed = time.perf_counter() - t0
    return elapsed, sum(len(r.full) + len(r.window) - r.null for r in running)


def decode_python_lru_hybrid(num_blocks: int, block_size: int, batch: int, steps: int):
    """The Python LRU pool's `allocate(2)` and `free` in
    `decode_python_hybrid`."""
    pool = PythonLruPool(num_blocks, block_size)
    return decode_python_hybrid(pool.allocate, pool.free, block_size, batch, steps)


def decode_vllm_hybrid(block_pool_cls, num_blocks: int, block_size: int, batch: int, steps: int):
    """vLLM's BlockPool's `get_new_blocks(2)` and `free_blocks` in
    `decode_python_hybrid`."""
    pool = block_pool_cls(num_blocks + 1, True, block_size)
    return decode_python_hybrid(pool.get_new_blocks, pool.free_blocks, block_size, batch, steps)


def floor_alloc_free(k: int, rounds: int) -> None:
    """The Python-side work of any pool whose `alloc(k)` returns a new list
    of `k` ints and whose `free(ids)` takes it, with no pool work at all:
    one C call that builds a list of `k` new int objects (ids above 256,
    which CPython does not cache) and one C call that takes the list. A
    lower bound of an alloc+free pair through such an API: `free` also
    reads each id, which this does not."""
    make, ids, take = list, range(1 << 20, (1 << 20) + k), len
    for _ in range(rounds):
        take(make(ids))


# ---------------------------------------------------------------------------
# vLLM from a wheel's sources, with the rest of vllm.* stubbed
# ---------------------------------------------------------------------------

# The modules taken from the wheel as they are; every other vllm.* module is
# a stub.
REAL = {"vllm.v1.core.block_pool", "vllm.v1.core.kv_cache_utils", "vllm.v1.core.kv_cache_metrics"}


def _stub_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so that submodules import

    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        # Types used in annotations, isinstance checks and as base classes.
        return type(attr, (), {})

    module.__getattr__ = __getattr__
    # What block_pool and kv_cache_utils call on their paths.
    if name == "vllm.logger":
        module.init_logger = logging.getLogger
    if name == "vllm.utils.gc_utils":
        module.gc_untrack = lambda obj: obj
    if name == "vllm.utils.math_utils":
        module.cdiv = lambda a, b: -(-a // b)
    if name == "vllm.distributed.kv_events":
        module.MEDIUM_GPU = "GPU"
    return module


class _VllmFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, src: Path):
        self.src = src

    def find_spec(self, name, path, target=None):
        if name != "vllm" and not name.startswith("vllm."):
            return None
        if name in REAL:
            file = self.src / (name.replace(".", "/") + ".py")
            return importlib.util.spec_from_file_location(name, file)
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return _stub_module(spec.name)

    def exec_module(self, module):
        pass


def vllm_block_pool(src: str | None):
    """vLLM's BlockPool class, or None (with the reason) if unavailable."""
    if src is None:
        try:
            from vllm.v1.core.block_pool import BlockPool

            return BlockPool, "installed vllm"
        except Exception as e:  # not installed, or no torch
            return None, f"vllm not importable ({type(e).__name__}); see --vllm-src"
    src_path = Path(src)
    if not (src_path / "vllm" / "v1" / "core" / "block_pool.py").exists():
        return None, f"no vllm/v1/core/block_pool.py under {src}"
    sys.meta_path.insert(0, _VllmFinder(src_path))
    from vllm.v1.core.block_pool import BlockPool

    version = "?"
    for dist in src_path.glob("vllm-*.dist-info"):
        version = dist.name.removesuffix(".dist-info").split("-")[1]
    return BlockPool, f"vllm {version} from {src} (vllm.v1.core sources, the rest stubbed)"


# ---------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------


def replay(pool, batches, block_size: int) -> tuple[float, int, int, int]:
    """Seconds spent in the pool, requests served, blocks hit, blocks
    queried (the keys offered to matching)."""
    elapsed, served, hits, queried = 0.0, 0, 0, 0
    packed = getattr(pool, "packed", False)
    for batch in batches:
        # Each pool gets its keys in its own form, made before the clock
        # starts.
        work = [
            (n, keys if packed else unpack(keys), min(len(keys) // 32, (n - 1) // block_size))
            for n, keys in batch
        ]
        gc.collect()
        t0 = time.perf_counter()
        for n_tokens, keys, max_hit in work:
            hits += pool.request(n_tokens, keys, max_hit)
        elapsed += time.perf_counter() - t0
        served += len(work)
        queried += sum(w[2] for w in work)
    return elapsed, served, hits, queried


def peek_all(pool, batches, block_size: int) -> tuple[float, int, int]:
    """Seconds spent peeking at every request's cached prefix on a pool
    that has replayed the trace (nothing is admitted, so nothing changes),
    peeks made, blocks counted."""
    elapsed, peeks, hits = 0.0, 0, 0
    packed = getattr(pool, "packed", False)
    for batch in batches:
        work = [
            (keys if packed else unpack(keys), min(len(keys) // 32, (n - 1) // block_size))
            for n, keys in batch
        ]
        gc.collect()
        t0 = time.perf_counter()
        for keys, max_hit in work:
            hits += pool.peek(keys, max_hit)
        elapsed += time.perf_counter() - t0
        peeks += len(work)
    return elapsed, peeks, hits


def positive(text: str) -> int:
    """An option's value: an int of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="a Mooncake JSONL trace")
    ap.add_argument("--requests", type=positive, default=None, help="replay only the first N")
    ap.add_argument("--num-blocks", type=positive, default=8192, help="the pools' blocks")
    ap.add_argument("--block-size", type=positive, default=16, help="tokens a block")
    ap.add_argument("--repeats", type=positive, default=3, help="runs of each workload (best kept)")
    ap.add_argument("--rounds", type=positive, default=20000, help="alloc/free pairs per run")
    ap.add_argument("--decode-batch", type=positive, default=256, help="running sequences")
    ap.add_argument("--decode-steps", type=positive, default=256, help="decode steps per run")
    ap.add_argument("--vllm-src", default=None, help="a directory holding a vllm wheel's vllm/")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    # The hybrid decoders' sequences hold the most: every block of their
    # tokens in the full group, and the window's (two more at most, the
    # block it starts in and the one being filled) in the sliding one.
    full = -(-args.decode_steps // args.block_size)
    need = args.decode_batch * (full + min(full, -(-WINDOW // args.block_size) + 2))
    if need > args.num_blocks:
        ap.error(
            f"--decode-batch {args.decode_batch} sequences of --decode-steps "
            f"{args.decode_steps} tokens need up to {need} blocks of {args.block_size} tokens "
            f"(two groups of layers): more than --num-blocks {args.num_blocks}"
        )

    block_pool_cls, vllm_note = vllm_block_pool(args.vllm_src)
    makers = [
        lambda: KvslotsPool(args.num_blocks, args.block_size),
        lambda: KvslotsPackedPool(args.num_blocks, args.block_size),
        lambda: PythonLruPool(args.num_blocks, args.block_size),
    ]
    if block_pool_cls is not None:
        makers.append(lambda: VllmPool(args.num_blocks, args.block_size, block_pool_cls))

    try:
        requests = load_trace(args.trace, args.requests)
    except (OSError, ValueError, KeyError, TypeError) as err:
        ap.error(f"--trace {args.trace}: {err!r}")
    largest = max((-(-n // args.block_size) for n, _ in requests), default=0)
    if largest > args.num_blocks:
        ap.error(
            f"--num-blocks {args.num_blocks} holds no request of {largest} blocks of "
            f"{args.block_size} tokens (the trace's longest prompt)"
        )
    if args.num_blocks < max(ALLOC_FREE):
        ap.error(f"--num-blocks {args.num_blocks} is under the alloc/free loops' {max(ALLOC_FREE)} blocks")
    t0 = time.perf_counter()
    batches = list(chunks(requests, args.block_size))
    keying = time.perf_counter() - t0

    results: dict[str, dict] = {}
    for make in makers:
        name = make().name
        best = None
        for _ in range(args.repeats):
            pool = make()
            elapsed, served, hits, queried = replay(pool, batches, args.block_size)
            if best is None or elapsed < best[0]:
                best = (elapsed, served, hits, queried, pool.evictions())
        elapsed, served, hits, queried, evictions = best
        # Peeks at the pool the last replay left: every request's cached
        # prefix counted, nothing taken.
        peek_runs = [peek_all(pool, batches, args.block_size) for _ in range(args.repeats)]
        peek_hits = {h for _, _, h in peek_runs}
        peek_elapsed, peeks, _ = min(peek_runs)
        alloc_free = {}
        for k in () if name.endswith("(packed keys)") else ALLOC_FREE:
            runs = []
            for _ in range(args.repeats):
                pool = make()
                gc.collect()
                t = time.perf_counter()
                pool.alloc_free(k, args.rounds)
                runs.append(time.perf_counter() - t)
            alloc_free[k] = min(runs) / args.rounds * 1e9
        results[name] = {
            "us_per_request": elapsed / served * 1e6,
            "us_per_call": elapsed / served / 4 * 1e6,
            "requests": served,
            "hit_blocks": hits,
            "queried_blocks": queried,
            "evictions": evictions,
            "alloc_free_ns": alloc_free,
            "us_per_peek": peek_elapsed / peeks * 1e6,
            "peek_blocks": peek_hits.pop() if len(peek_hits) == 1 else None,
        }

    floor = {}
    for k in ALLOC_FREE:
        runs = []
        for _ in range(args.repeats):
            gc.collect()
            t = time.perf_counter()
            floor_alloc_free(k, args.rounds)
            runs.append(time.perf_counter() - t)
        floor[k] = min(runs) / args.rounds * 1e9

    decoders = [
        ("kvslots: try_append_each", decode_kvslots_each),
        ("kvslots: try_append a sequence", decode_kvslots_loop),
        ("python-lru", decode_python_lru),
    ]
    if block_pool_cls is not None:
        decoders.append(
            ("vllm", lambda *a: decode_vllm(block_pool_cls, *a)),
        )
    hybrid_decoders = [
        ("kvslots: try_append_each", decode_kvslots_hybrid),
        ("python-lru", decode_python_lru_hybrid),
    ]
    if block_pool_cls is not None:
        hybrid_decoders.append(
            ("vllm", lambda *a: decode_vllm_hybrid(block_pool_cls, *a)),
        )

    def time_decode(decoders) -> dict[str, dict]:
        out = {}
        for name, run in decoders:
            runs = [
                run(args.num_blocks, args.block_size, args.decode_batch, args.decode_steps)
                for _ in range(args.repeats)
            ]
            blocks = {b for _, b in runs}
            out[name] = {
                "ns_per_sequence_step": min(t for t, _ in runs)
                / (args.decode_batch * args.decode_steps)
                * 1e9,
                "blocks": blocks.pop() if len(blocks) == 1 else None,
            }
        return out

    decode = time_decode(decoders)
    decode_hybrid = time_decode(hybrid_decoders)

    base = results["kvslots"]
    if args.json:
        print(
            json.dumps(
                {
                    "vllm": vllm_note,
                    "results": results,
                    "floor_alloc_free_ns": floor,
                    "decode": decode,
                    "decode_hybrid": decode_hybrid,
                },
                indent=2,
            )
        )
        return 0
    print(f"python {platform.python_version()}, kvslots {kvslots.__version__}, {os.cpu_count()} CPUs")
    print(f"peer: {vllm_note}")
    print(
        f"trace: {len(requests)} requests, {args.num_blocks} blocks of {args.block_size} tokens; "
        f"keys computed in {keying:.1f} s (outside the timing)"
    )
    print()
    print(
        "| pool | us / request (4 scheduler calls) | peer / kvslots | hit blocks | queried | hit rate "
        "| evictions |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        ratio = r["us_per_request"] / base["us_per_request"]
        ev = "-" if r["evictions"] is None else f"{r['evictions']:,}"
        print(
            f"| {name} | {r['us_per_request']:.1f} | {ratio:.1f}x | {r['hit_blocks']:,} | "
            f"{r['queried_blocks']:,} | {r['hit_blocks'] / max(1, r['queried_blocks']):.1%} | {ev} |"
        )
    print()
    print("| pool | alloc+free 1 (ns) | ratio | alloc+free 16 (ns) | ratio | alloc+free 128 (ns) | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        if not r["alloc_free_ns"]:
            continue
        cells = []
        for k in ALLOC_FREE:
            ns = r["alloc_free_ns"][k]
            cells.append(f"{ns:,.0f} | {ns / base['alloc_free_ns'][k]:.1f}x")
        print(f"| {name} | " + " | ".join(cells) + " |")
    cells = [f"{floor[k]:,.0f} | {floor[k] / base['alloc_free_ns'][k]:.2f}x" for k in ALLOC_FREE]
    print("| floor: a list of k new ints, two calls, no pool | " + " | ".join(cells) + " |")
    lru = results["python-lru"]["alloc_free_ns"]
    print()
    print(
        "python-lru over the floor (the most any pool whose alloc returns a list can gain on it): "
        + ", ".join(f"{lru[k] / floor[k]:.1f}x (k = {k})" for k in ALLOC_FREE)
    )
    print()
    print("peek: every request's cached prefix counted on the pool the replay left, nothing taken")
    print()
    print("| pool | us / peek | peer / kvslots | blocks counted |")
    print("|---|---:|---:|---:|")
    for name, r in results.items():
        ratio = r["us_per_peek"] / base["us_per_peek"]
        print(f"| {name} | {r['us_per_peek']:.2f} | {ratio:.1f}x | {r['peek_blocks']} |")
    peeked = {r["peek_blocks"] for r in results.values()}
    print("peek counts equal" if len(peeked) == 1 else "peek counts DIFFER")
    for title, table in (
        ("decode", decode),
        (f"hybrid decode (a sliding window of {WINDOW} tokens and full attention)", decode_hybrid),
    ):
        each = table["kvslots: try_append_each"]["ns_per_sequence_step"]
        print()
        print(
            f"{title}: {args.decode_batch} sequences, {args.decode_steps} steps of one token each"
        )
        print()
        print("| pool | ns a sequence and step | peer / try_append_each | blocks at the end |")
        print("|---|---:|---:|---:|")
        for name, r in table.items():
            ns = r["ns_per_sequence_step"]
            print(f"| {name} | {ns:.1f} | {ns / each:.1f}x | {r['blocks']} |")
        blocks = {r["blocks"] for r in table.values()}
        print(f"{title.split(' (')[0]} blocks equal" if len(blocks) == 1 else "decode blocks DIFFER")
    hits = {r["hit_blocks"] for r in results.values()}
    print()
    print("hit counts equal" if len(hits) == 1 else "hit counts DIFFER")
    return 0


if __name__ == "__main__":
    sys.exit(main())
