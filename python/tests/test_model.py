"""kvslots against a pure-Python reference pool, step by step.

A hypothesis state machine drives one `BlockPool` (small, so that it runs
full and evicts; with or without the prefix cache; sometimes large enough
for frees of 32 ids or more) through raw allocations, frees, shared
references and sequences (appends, copy-on-write appends, truncates, forks,
prefix matches, publishes, closes), and every refused call (`Full`,
`NeverFits`, `CopyRequired`, `FreeError`, `TypeError`). `Model` below is
the reference: per-block reference counts and keys, a dict index (first
publish wins) and an exact LRU list of evictable blocks, in release order
(a sequence gives its blocks back last block first, so its tail is evicted
first, as vLLM frees a request's blocks). Block ids are kvslots' choice,
so the model takes them from kvslots and checks what it may: fresh blocks
were free, uncached free blocks go before any eviction, and the cached
ones among them are exactly the least recently released.

After every step the pool's counts, `stats()`, `prefix_stats()`, every
block's `ref_count`, and every sequence's length, table, capacity and
`needs_copy` must equal the model's; each match must return the model's
blocks, each publish the model's count, each copy-on-write the model's
`BlockCopy`, and each refusal its documented exception with nothing
changed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pytest

hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, event, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import kvslots  # noqa: E402


def _key(style: int, chain: int, i: int) -> bytes:
    """Key `i` of chain `chain`: spread keys, keys that differ only in
    their last bytes, and keys that differ only in their first byte."""
    if style == 0:
        return hashlib.sha256(b"%d/%d" % (chain, i)).digest()
    if style == 1:
        return b"\xab" * 29 + bytes([chain, i >> 8, i & 0xFF])
    return bytes([chain * 32 + i % 32]) + b"\x00" * 30 + bytes([i // 32])


PROMPTS = 4
"""Prompts 0 and 3 share their first keys; each prompt has a key style."""


def _prompt(p: int) -> list[bytes]:
    if p == 3:
        return _prompt(0)[:3] + [_key(0, 3, i) for i in range(3, 16)]
    return [_key(p, p, i) for i in range(16)]


@st.composite
def key_lists(draw: st.DrawFn) -> list[bytes]:
    """A prompt's first keys, which may switch to another prompt's part
    way, or end with a key repeated (misuse)."""
    first = _prompt(draw(st.integers(0, PROMPTS - 1)))
    length = draw(st.integers(0, 10))
    switch = draw(st.integers(0, length))
    second = _prompt(draw(st.integers(0, PROMPTS - 1)))
    keys = first[:switch] + second[switch:length]
    if keys and draw(st.integers(0, 9)) == 0:
        keys.append(keys[draw(st.integers(0, len(keys) - 1))])
    return keys


@dataclass
class SeqModel:
    """One sequence: its Python object, length, table and the copy-on-write
    source it keeps."""

    py: kvslots.Sequence
    len: int = 0
    blocks: list[int] = field(default_factory=list)
    retired: Optional[int] = None


class Model:
    """The reference pool: reference counts, keys, the key index and the
    evictable blocks in release order (`lru[0]` is evicted first)."""

    def __init__(self, num_blocks: int, block_size: int, prefix_cache: bool):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self.refs = [0] * num_blocks
        self.keys: list[Optional[bytes]] = [None] * num_blocks
        self.index: dict[bytes, int] = {}
        self.lru: list[int] = []
        self.queried = 0
        self.hit = 0
        self.evictions = 0
        self.peak = 0

    @property
    def free(self) -> int:
        return sum(1 for r in self.refs if r == 0)

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    def note_peak(self) -> None:
        self.peak = max(self.peak, self.used)

    def take_fresh(self, ids: list[int]) -> None:
        """Blocks an allocation returned: distinct, free, uncached ones
        first, and the cached ones among them the least recently released."""
        assert len(set(ids)) == len(ids), f"duplicate ids {ids}"
        for b in ids:
            assert 0 <= b < self.num_blocks and self.refs[b] == 0, f"block {b} was not free"
        uncached_free = sum(
            1 for b in range(self.num_blocks) if self.refs[b] == 0 and self.keys[b] is None
        )
        evicted = max(0, len(ids) - uncached_free)
        if evicted:
            event("an allocation evicted cached blocks")
        got = sorted(b for b in ids if self.keys[b] is not None)
        assert got == sorted(self.lru[:evicted]), (
            f"evicted {got}, want the LRU blocks {sorted(self.lru[:evicted])} of {self.lru}"
        )
        for b in ids:
            key = self.keys[b]
            if key is not None:
                del self.index[key]
                self.keys[b] = None
                self.lru.remove(b)
                self.evictions += 1
            self.refs[b] = 1
        self.note_peak()

    def drop_ref(self, b: int) -> None:
        self.refs[b] -= 1
        assert self.refs[b] >= 0
        if self.refs[b] == 0 and self.keys[b] is not None:
            self.lru.append(b)

    def release(self, ids: list[int]) -> None:
        """A sequence's give-back: last block first."""
        for b in reversed(ids):
            self.drop_ref(b)

    def needs_copy(self, s: SeqModel) -> bool:
        bs = self.block_size
        if s.len % bs == 0:
            return False
        tail = s.blocks[s.len // bs]
        return self.refs[tail] > 1 or self.keys[tail] is not None


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class PoolMachine(RuleBasedStateMachine):
    """One pool and its sequences, against `Model`."""

    def __init__(self) -> None:
        super().__init__()
        self.pool: kvslots.BlockPool
        self.m: Model
        self.raw: dict[int, int] = {}  # raw references the test holds, by block
        self.seqs: list[SeqModel] = []

    @initialize(
        size=st.one_of(st.integers(4, 12), st.integers(4, 24), st.integers(40, 80)),
        block_size=st.integers(1, 4),
        prefix_cache=st.sampled_from([True, True, True, False]),
    )
    def make_pool(self, size: int, block_size: int, prefix_cache: bool) -> None:
        self.pool = kvslots.BlockPool(size, block_size, prefix_cache=prefix_cache)
        self.m = Model(size, block_size, prefix_cache)
        assert self.pool.has_prefix_cache == prefix_cache

    def teardown(self) -> None:
        if not hasattr(self, "m"):
            return
        for s in self.seqs:
            s.py.close()
        if self.raw:
            self.pool.free([b for b, n in self.raw.items() for _ in range(n)])
        # Everything given back: no leak, and the whole pool allocatable.
        assert self.pool.used_blocks == 0 and self.pool.free_blocks == self.m.num_blocks
        ids = self.pool.try_alloc(self.m.num_blocks)
        assert sorted(ids) == list(range(self.m.num_blocks))
        assert self.pool.cached_blocks == 0

    # -- helpers ---------------------------------------------------------

    def snapshot(self) -> tuple[Any, ...]:
        p = self.pool
        return (
            p.stats(),
            tuple(p.ref_count(b) for b in range(self.m.num_blocks)),
            tuple((len(s.py), tuple(s.py.block_ids), s.py.capacity) for s in self.seqs),
        )

    def refused(self, exc: type[BaseException], call: Callable[[], object]) -> BaseException:
        """`call()` raises `exc` and changes nothing."""
        before = self.snapshot()
        with pytest.raises(exc) as info:
            call()
        event(f"refused: {type(info.value).__name__}")
        assert self.snapshot() == before, f"a refused call ({exc.__name__}) changed the pool"
        return info.value

    def raw_refs(self) -> list[int]:
        return [b for b, n in self.raw.items() for _ in range(n)]

    def seq_held(self) -> set[int]:
        held = set()
        for s in self.seqs:
            held.update(s.blocks)
            if s.retired is not None:
                held.add(s.retired)
        return held

    # -- raw blocks ------------------------------------------------------

    @rule(n=st.one_of(st.integers(0, 6), st.integers(0, 90)))
    def try_alloc(self, n: int) -> None:
        m = self.m
        if n > m.num_blocks:
            e = self.refused(kvslots.NeverFits, lambda: self.pool.try_alloc(n))
            assert (e.requested, e.capacity) == (n, m.num_blocks)  # type: ignore[attr-defined]
            return
        if n > m.free:
            e = self.refused(kvslots.Full, lambda: self.pool.try_alloc(n))
            assert (e.requested, e.available) == (n, m.free)  # type: ignore[attr-defined]
            return
        ids = self.pool.try_alloc(n)
        assert len(ids) == n
        m.take_fresh(ids)
        for b in ids:
            self.raw[b] = self.raw.get(b, 0) + 1

    @precondition(lambda self: self.raw)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        refs = self.raw_refs()
        ids = data.draw(st.lists(st.sampled_from(sorted(set(refs))), max_size=len(refs)))
        # A multiset of what the test holds: drop extra copies.
        kept: list[int] = []
        for b in ids:
            if kept.count(b) < self.raw[b]:
                kept.append(b)
        if data.draw(st.booleans()):
            kept = refs  # all of them at once (32 or more in a large pool)
        if len(kept) >= 32:
            event("a free of 32 ids or more")
        self.pool.free(kept)
        for b in kept:
            self.m.drop_ref(b)
            self.raw[b] -= 1
            if self.raw[b] == 0:
                del self.raw[b]

    @precondition(lambda self: self.raw)
    @rule(data=st.data())
    def add_refs(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.sampled_from(sorted(self.raw)), max_size=40))
        self.pool.add_refs(ids)
        for b in ids:
            self.m.refs[b] += 1
            self.raw[b] += 1

    @rule(data=st.data(), which=st.sampled_from(["free", "add_refs"]))
    def bad_ids(self, data: st.DataObject, which: str) -> None:
        """One bad id among good ones: the documented error, nothing changed."""
        m = self.m
        refs = self.raw_refs()
        good = data.draw(st.lists(st.sampled_from(refs), max_size=len(refs))) if refs else []
        if which == "free":
            good = [b for i, b in enumerate(good) if good[: i + 1].count(b) <= self.raw[b]]
        kinds = ["out_of_range", "negative", "type"]
        free_ids = [b for b in range(m.num_blocks) if m.refs[b] == 0]
        if free_ids:
            kinds.append("not_allocated")
        held = sorted(self.seq_held())
        if held:
            kinds.append("held_by_sequence")
        if which == "free" and self.raw:
            kinds.append("over_freed")
        kind = data.draw(st.sampled_from(kinds))
        bad: object
        if kind == "out_of_range":
            bad = m.num_blocks + data.draw(st.sampled_from([0, 1, 2**32, 2**70]))
        elif kind == "negative":
            bad = data.draw(st.sampled_from([-1, -(2**40)]))
        elif kind == "type":
            bad = data.draw(st.sampled_from([1.0, "1", None, b"\x01"]))
        elif kind == "not_allocated":
            bad = data.draw(st.sampled_from(free_ids))
        elif kind == "held_by_sequence":
            bad = data.draw(st.sampled_from(held))
        else:
            b = data.draw(st.sampled_from(sorted(self.raw)))
            good = [x for x in good if x != b] + [b] * self.raw[b]
            bad = b
        at = data.draw(st.integers(0, len(good)))
        ids: list[Any] = good[:at] + [bad] + good[at:]
        call = self.pool.free if which == "free" else self.pool.add_refs
        if kind == "type":
            self.refused(TypeError, lambda: call(ids))
            return
        e: Any = self.refused(kvslots.FreeError, lambda: call(ids))
        want = "out_of_range" if kind == "negative" else kind
        assert (e.kind, e.id) == (want, bad)
        assert e.num_blocks == (m.num_blocks if want == "out_of_range" else None)

    @rule(data=st.data())
    def bad_ids_container(self, data: st.DataObject) -> None:
        """Ids given as bytes or str are a TypeError, nothing changed."""
        ids = data.draw(st.sampled_from([b"\x00\x01", bytearray(b"\x00"), "01"]))
        call = data.draw(st.sampled_from([self.pool.free, self.pool.add_refs]))
        self.refused(TypeError, lambda: call(ids))  # type: ignore[arg-type]

    # -- sequences -------------------------------------------------------

    @precondition(lambda self: len(self.seqs) < 8)
    @rule()
    def new_sequence(self) -> None:
        self.seqs.append(SeqModel(kvslots.Sequence(self.pool)))

    def pick(self, data: st.DataObject) -> SeqModel:
        return self.seqs[data.draw(st.integers(0, len(self.seqs) - 1))]

    def grow_refusal(self, s: SeqModel, n: int, total: int, call: Callable[[], object]) -> bool:
        """Raises the documented refusal of an append taking `total` blocks,
        `n` of them for the new tokens, if it must be refused."""
        m = self.m
        room = m.num_blocks - len(s.blocks)
        if total > 0 and n > room:
            e: Any = self.refused(kvslots.NeverFits, call)
            assert (e.requested, e.capacity) == (total, room)
            return True
        if total > m.free:
            e = self.refused(kvslots.Full, call)
            assert (e.requested, e.available) == (total, m.free)
            assert not isinstance(e, kvslots.BehindWaiters)
            return True
        return False

    def big_n(self) -> st.SearchStrategy[int]:
        bs = self.m.block_size
        return st.one_of(st.integers(0, 3 * bs), st.integers(0, (self.m.num_blocks + 2) * bs))

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def try_append(self, data: st.DataObject) -> None:
        self.append_of(self.pick(data), data.draw(self.big_n()))

    def append_of(self, s: SeqModel, n: int) -> bool:
        """`s.py.try_append(n)`; whether it succeeded."""
        m, bs = self.m, self.m.block_size
        if n == 0:
            assert s.py.try_append(0) == range(s.len, s.len)
            return True
        if m.needs_copy(s):
            self.refused(kvslots.CopyRequired, lambda: s.py.try_append(n))
            return False
        new = max(0, _ceil_div(s.len + n, bs) - len(s.blocks))
        if self.grow_refusal(s, new, new, lambda: s.py.try_append(n)):
            return False
        old = list(s.blocks)
        assert s.py.try_append(n) == range(s.len, s.len + n)
        table = s.py.block_ids
        assert table[: len(old)] == old
        m.take_fresh(table[len(old) :])
        self.after_append(s, table, n)
        return True

    def after_append(self, s: SeqModel, table: list[int], n: int) -> None:
        # A non-empty append that succeeds gives back the kept copy source,
        # after taking its blocks.
        if s.retired is not None:
            self.m.release([s.retired])
            s.retired = None
        s.blocks = table
        s.len += n

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def append_cow(self, data: st.DataObject) -> None:
        self.append_cow_of(self.pick(data), data.draw(self.big_n()))

    def append_cow_of(self, s: SeqModel, n: int) -> None:
        m, bs = self.m, self.m.block_size
        if n == 0:
            assert s.py.append_cow(0) == (range(s.len, s.len), None)
            return
        cow = m.needs_copy(s)
        new = max(0, _ceil_div(s.len + n, bs) - len(s.blocks))
        if self.grow_refusal(s, new, new + cow, lambda: s.py.append_cow(n)):
            return
        old = list(s.blocks)
        positions, copy = s.py.append_cow(n)
        assert positions == range(s.len, s.len + n)
        table = s.py.block_ids
        if not cow:
            assert copy is None
            assert table[: len(old)] == old
            m.take_fresh(table[len(old) :])
            self.after_append(s, table, n)
            return
        t = s.len // bs
        assert copy == kvslots.BlockCopy(old[t], table[t], s.len % bs)
        event("a copy-on-write append")
        assert table[:t] == old[:t] and table[t + 1 : len(old)] == old[t + 1 :]
        m.take_fresh([table[t]] + table[len(old) :])
        self.after_append(s, table, n)
        s.retired = old[t]  # kept until the next append, truncate or close

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        s = self.pick(data)
        self.truncate_of(s, data.draw(st.integers(0, s.len + 2)))

    @precondition(lambda self: any(s.len for s in self.seqs))
    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        """Rejected drafts: back a few tokens (into a full block, maybe
        shared or cached), then the next tokens with `append_cow`."""
        s = data.draw(st.sampled_from([s for s in self.seqs if s.len]))
        bs = self.m.block_size
        self.truncate_of(s, s.len - data.draw(st.integers(1, min(s.len, 2 * bs))))
        self.append_cow_of(s, data.draw(st.integers(1, 2 * bs)))

    def truncate_of(self, s: SeqModel, length: int) -> None:
        m, bs = self.m, self.m.block_size
        if length >= s.len:
            assert s.py.truncate(length) == 0
            return
        keep = _ceil_div(length, bs)
        assert s.py.truncate(length) == len(s.blocks) - keep
        if s.retired is not None:
            m.release([s.retired])
            s.retired = None
        m.release(s.blocks[keep:])
        s.blocks = s.blocks[:keep]
        s.len = length
        if length % bs:
            # A cached tail held alone loses its key: it will be written.
            tail = s.blocks[length // bs]
            key = m.keys[tail]
            if key is not None and m.refs[tail] == 1:
                m.keys[tail] = None
                del m.index[key]
                event("a truncate dropped its cached tail's key")

    @precondition(lambda self: self.seqs and len(self.seqs) < 8)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        s = self.pick(data)
        m, bs = self.m, self.m.block_size
        full, tail = divmod(s.len, bs)
        if tail and self.grow_refusal(s, 1, 1, s.py.fork):
            return
        child_py, copy = s.py.fork()
        child = SeqModel(child_py, s.len)
        table = child_py.block_ids
        assert table[:full] == s.blocks[:full]
        if tail:
            assert len(table) == full + 1
            assert copy == kvslots.BlockCopy(s.blocks[full], table[full], tail)
            m.take_fresh([table[full]])
        else:
            assert len(table) == full and copy is None
        for b in s.blocks[:full]:
            m.refs[b] += 1
        child.blocks = table
        self.seqs.append(child)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        self.close_of(self.pick(data))

    def close_of(self, s: SeqModel) -> None:
        s.py.close()
        assert s.py.closed
        with pytest.raises(ValueError):
            len(s.py)
        s.py.close()  # twice: nothing
        if s.retired is not None:
            self.m.release([s.retired])
        self.m.release(s.blocks)
        self.seqs.remove(s)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), keys=key_lists(), packed=st.booleans())
    def match_prefix(self, data: st.DataObject, keys: list[bytes], packed: bool) -> None:
        self.match_prefix_of(self.pick(data), keys, packed)

    def match_prefix_of(self, s: SeqModel, keys: list[bytes], packed: bool = False) -> None:
        m = self.m
        got = s.py.match_prefix(b"".join(keys) if packed else keys)
        if not m.prefix_cache or s.len or s.blocks or s.retired is not None or not keys:
            assert got == 0
            return
        taken: list[int] = []
        for k in keys:
            b = m.index.get(k)
            if b is None or b in taken:
                break
            taken.append(b)
        assert got == len(taken), f"matched {got} blocks, want {len(taken)}"
        if taken:
            event("a prefix hit")
        assert s.py.block_ids == taken
        m.queried += len(keys)
        m.hit += len(taken)
        for b in taken:
            if m.refs[b] == 0:
                m.lru.remove(b)
            m.refs[b] += 1
        s.blocks = taken
        s.len = len(taken) * m.block_size
        m.note_peak()

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), keys=key_lists(), packed=st.booleans())
    def publish(self, data: st.DataObject, keys: list[bytes], packed: bool) -> None:
        self.publish_of(self.pick(data), keys, packed)

    def publish_of(self, s: SeqModel, keys: list[bytes], packed: bool = False) -> None:
        m = self.m
        got = s.py.publish(b"".join(keys) if packed else keys)
        want = 0
        if m.prefix_cache:
            for i in range(min(s.len // m.block_size, len(keys))):
                b, k = s.blocks[i], keys[i]
                if m.keys[b] is None and k not in m.index:
                    m.keys[b] = k
                    m.index[k] = b
                    want += 1
        assert got == want, f"published {got} blocks, want {want}"

    @precondition(lambda self: len(self.seqs) < 8)
    @rule(prompt=st.integers(0, PROMPTS - 1), tokens=st.integers(1, 40))
    def request(self, prompt: int, tokens: int) -> None:
        """A request as a scheduler runs it: a new sequence matches its
        prompt's cached prefix, appends the rest if it fits (and is closed
        if not) and publishes its full blocks."""
        self.new_sequence()
        s = self.seqs[-1]
        keys = _prompt(prompt)[: tokens // self.m.block_size]
        self.match_prefix_of(s, keys)
        rest = max(0, tokens - s.len)
        if self.append_of(s, rest):
            self.publish_of(s, keys)
        else:
            self.close_of(s)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def slot_mapping(self, data: st.DataObject) -> None:
        s = self.pick(data)
        bs = self.m.block_size
        start = data.draw(st.integers(0, s.len + 2))
        stop = data.draw(st.integers(0, s.len + 2))
        if start < stop and stop > s.len:
            self.refused(IndexError, lambda: s.py.slot_mapping(start, stop))
            return
        want = [s.blocks[p // bs] * bs + p % bs for p in range(start, stop)]
        assert s.py.slot_mapping(start, stop) == want
        assert s.py.slot_mapping() == [s.blocks[p // bs] * bs + p % bs for p in range(s.len)]

    @rule()
    def reset_prefix_cache(self) -> None:
        m = self.m
        assert self.pool.reset_prefix_cache() == len(m.lru)
        for b in m.lru:
            key = m.keys[b]
            assert key is not None
            del m.index[key]
            m.keys[b] = None
        m.lru = []

    # -- invariants ------------------------------------------------------

    @invariant()
    def pool_agrees(self) -> None:
        if not hasattr(self, "m"):
            return
        m, p = self.m, self.pool
        for b in range(m.num_blocks):
            assert p.ref_count(b) == m.refs[b], f"block {b}: {p.ref_count(b)} refs, want {m.refs[b]}"
        assert p.ref_count(m.num_blocks) is None
        cached = sum(1 for k in m.keys if k is not None)
        assert len(m.index) == cached
        assert sorted(m.lru) == [b for b in range(m.num_blocks) if m.refs[b] == 0 and m.keys[b] is not None]
        stats = p.stats()
        want = {
            "num_blocks": m.num_blocks,
            "used_blocks": m.used,
            "peak_used_blocks": m.peak,
            "free_blocks": m.free,
            "cached_blocks": cached,
            "evictable_blocks": len(m.lru),
            "pending_release_blocks": 0,
            "queried_blocks": m.queried,
            "hit_blocks": m.hit,
            "evictions": m.evictions,
            "waiters": 0,
            "events_dropped": None,
        }
        got = stats.as_dict()
        del got["usage"]
        assert got == want
        assert (p.free_blocks, p.used_blocks, p.cached_blocks, p.evictable_blocks) == (
            m.free,
            m.used,
            cached,
            len(m.lru),
        )
        assert p.free_blocks + p.used_blocks == m.num_blocks
        assert p.prefix_stats() == {
            "queried_blocks": m.queried,
            "hit_blocks": m.hit,
            "evictions": m.evictions,
        }

    @invariant()
    def sequences_agree(self) -> None:
        if not hasattr(self, "m"):
            return
        # Every reference is the test's or a sequence's: none leaked.
        held = [0] * self.m.num_blocks
        for b, n in self.raw.items():
            held[b] += n
        for s in self.seqs:
            assert (len(s.py), s.py.block_ids) == (s.len, s.blocks)
            assert s.py.capacity == len(s.blocks) * self.m.block_size
            assert s.py.needs_copy == self.m.needs_copy(s)
            assert len(s.blocks) == _ceil_div(s.len, self.m.block_size)
            for b in s.blocks:
                held[b] += 1
            if s.retired is not None:
                held[s.retired] += 1
        assert held == self.m.refs


PoolMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    # `too_slow`: each step checks every block's count through the binding.
    suppress_health_check=[HealthCheck.too_slow],
)

test_kvslots_agrees_with_a_python_block_pool_step_by_step = PoolMachine.TestCase
