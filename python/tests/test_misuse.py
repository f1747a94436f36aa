"""Random calls with random arguments, good and bad: every refusal is an
ordinary exception (a panic would surface as pyo3's PanicException, a
BaseException that `except Exception` does not catch, and fail the test),
and the pool's books balance throughout and at the end. (Raw frees only
name blocks no one holds, or no block at all: a double free of a held
block breaks its holder's claim, by design, and the final count with it.)"""

import random

import kvslots
from conftest import run_python

VALUES = [0, 1, 2, 3, 5, 7, 16, 40, 63, 64, 65, 1000, -1, -(2**70), 2**32, 2**64, 2**64 - 1,
          2**100, 1.0, 0.5, float("nan"), None, "1", b"1", [1], True]


def unheld(pool, rng):
    """A value that names no held block: a free block, an id out of range,
    or not an int."""
    v = rng.choice(VALUES)
    if isinstance(v, int) and pool.ref_count(v):
        return -1
    return v


def test_random_misuse_never_panics_and_balances():
    rng = random.Random(7)
    pool = kvslots.BlockPool(64, 4)
    seqs = [kvslots.Sequence(pool)]
    held = []
    keys = kvslots.hash_blocks(list(range(64)), 4)
    bad_keys = [keys[:3], keys[:2] + [b"x"], [1, 2], b"".join(keys[:4]), b"abc", keys[::-1], []]
    for _ in range(4000):
        seq = rng.choice(seqs)
        v = rng.choice(VALUES)
        w = rng.choice(VALUES)
        op = rng.randrange(14)
        try:
            if op == 0:
                held.append(pool.try_alloc(v))
            elif op == 1 and held:
                i = rng.randrange(len(held))
                extra = [unheld(pool, rng)] if rng.random() < 0.2 else []
                pool.free(held[i] + extra)  # a refusal frees none of them
                held.pop(i)
            elif op == 2:
                seq.try_append(v)
            elif op == 3:
                seq.append_cow(v)
            elif op == 4:
                seq.truncate(v)
            elif op == 5:
                seq.try_reserve(v, w)
            elif op == 6 and len(seqs) < 12:
                child, _ = seq.fork()
                seqs.append(child)
            elif op == 7:
                seq.match_prefix(rng.choice(bad_keys))
            elif op == 8:
                seq.publish(rng.choice(bad_keys))
            elif op == 9:
                seq.slot_mapping(v, w)
            elif op == 10:
                pool.free([unheld(pool, rng)])
            elif op == 11:
                seq.truncate_fenced(v, w)
                pool.complete(w)
            elif op == 12 and len(seqs) > 1:
                seqs.remove(seq)
                seq.close()
            else:
                pool.ref_count(v)
                seq.slot(v)
        except Exception:
            pass
        assert pool.used_blocks + pool.free_blocks == pool.num_blocks
    pool.complete_all()
    for ids in held:
        pool.free(ids)
    for s in seqs:
        s.close()
    pool.complete_all()
    assert pool.free_blocks == pool.num_blocks
    assert pool.pending_release_blocks == 0


def test_ids_given_as_bytes_or_str_are_refused_and_change_nothing():
    pool = kvslots.BlockPool(4, 4)
    held = pool.try_alloc(2)
    raw = (bytes(held), bytearray(held), memoryview(bytes(held)), memoryview(bytearray(held)))
    for ids in (*raw, "01"):
        for call in (pool.free, pool.add_refs):
            try:
                call(ids)
            except TypeError as e:
                assert "iterable of ints" in str(e)
            else:
                raise AssertionError(f"{call.__name__}({ids!r}) was accepted")
            assert [pool.ref_count(i) for i in held] == [1, 1]
            assert pool.used_blocks == 2
    pool.free(held)
    assert pool.free_blocks == 4


def test_a_block_copy_built_by_hand_takes_block_ids_only():
    assert kvslots.BlockCopy(0, 2**32 - 2, 0).dst == 2**32 - 2
    for args in [(2**32 - 1, 0, 1), (0, 2**32, 1), (-1, 0, 1), (0, 0, -1)]:
        try:
            kvslots.BlockCopy(*args)
        except ValueError:
            pass
        else:
            raise AssertionError(f"BlockCopy{args} was accepted")
    for args in [(0.0, 0, 1), (0, "1", 1), (0, 0, None)]:
        try:
            kvslots.BlockCopy(*args)
        except TypeError:
            pass
        else:
            raise AssertionError(f"BlockCopy{args} was accepted")


FINALIZER_MISUSE = """
import os
import kvslots

pool = kvslots.BlockPool(8, 4)
seq = kvslots.Sequence(pool)
groups = kvslots.KvGroups(["full", 4])
hybrid = kvslots.HybridSequence(pool, groups)


class Cleanup:
    # Collected in the interpreter's finalization, where nothing can be
    # imported any more.
    def __del__(self, pool=pool, seq=seq, hybrid=hybrid, write=os.write):
        for call in (lambda: pool.free([2**70]),
                     lambda: pool.free(list(range(40)) + [-1]),
                     lambda: pool.try_alloc(2**70),
                     lambda: seq.try_append(-1),
                     lambda: seq.slot_mapping(0, 2**80),
                     lambda: hybrid.try_append(-1),
                     lambda: kvslots.hash_blocks([1, 2], -4)):
            try:
                call()
            except BaseException as e:
                write(1, (type(e).__name__ + "\\n").encode())


c = Cleanup()
c.cycle = c
"""


def test_bad_arguments_in_a_finalizer_at_exit_raise_their_own_errors():
    # From a check of the conversions at exit: they imported `operator` (and
    # `array`) on first use, and an import during finalization fails, so a
    # bad argument raised ImportError instead of its ValueError.
    run = run_python(FINALIZER_MISUSE)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [
        "FreeError",
        "FreeError",
        "OverflowError",
        "ValueError",
        "OverflowError",
        "ValueError",
        "ValueError",
    ], run.stdout + run.stderr
