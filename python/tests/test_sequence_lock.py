"""Calls on a `Sequence` or `HybridSequence` that wait for another thread's
hold on it (its `reserve` waiting for blocks): a signal handler's exception
(Ctrl-C's `KeyboardInterrupt`) ends such a wait and changes nothing, the
holder's `reserve` goes on, a handler that does not raise lets the wait go
on, and every block comes back in the end. Adapted from a helper's attack
on the sequences' mutex (`python/src/lock.rs`)."""

import gc
import os
import signal
import sys
import textwrap
import threading
import weakref

import pytest

import kvslots
from conftest import Busy, Interrupted, alarm, pool_state, run_python

try:  # imported here, so that no alarm lands in numpy's first import
    import numpy
except ImportError:
    numpy = None

pytestmark = pytest.mark.skipif(
    not hasattr(signal, "setitimer"), reason="needs signal.setitimer"
)

BS = 4
TOKENS = list(range(8))  # two full blocks


def make(pool, hybrid):
    if hybrid:
        groups = kvslots.KvGroups(["full"])
        return kvslots.HybridSequence(pool, groups), groups
    return kvslots.Sequence(pool), None


def sstate(seq, hybrid):
    ids = tuple(seq.block_ids(0)) if hybrid else tuple(seq.block_ids)
    return (len(seq), ids, seq.capacity, seq.closed)


def keys_for(groups):
    keys = kvslots.hash_blocks(TOKENS, BS)
    return groups.keys(keys) if groups is not None else keys


def prepared(pool, hybrid):
    seq, groups = make(pool, hybrid)
    seq.try_append(len(TOKENS) + 1)  # 3 blocks, last partly filled
    seq.publish(keys_for(groups))
    return seq, groups


SEQ_OPS = {
    "len": lambda s, g: len(s),
    "block_ids": lambda s, g: s.block_ids(0) if g else s.block_ids,
    "capacity": lambda s, g: s.capacity,
    "closed": lambda s, g: s.closed,
    "needs_copy": lambda s, g: s.needs_copy,
    "repr": lambda s, g: repr(s),
    "close": lambda s, g: s.close(),
    "retire": lambda s, g: s.retire(0),
    "fork": lambda s, g: s.fork(),
    "truncate": lambda s, g: s.truncate(1),
    "try_append": lambda s, g: s.try_append(1),
    "append_cow": lambda s, g: s.append_cow(1),
    "try_reserve": lambda s, g: s.try_reserve(1),
    "reserve": lambda s, g: s.reserve(100, timeout=None),
    "shrink_to_fit": lambda s, g: s.shrink_to_fit(),
    "publish": lambda s, g: s.publish(keys_for(g)),
    "match_prefix": lambda s, g: s.match_prefix(keys_for(g)),
    "slot": lambda s, g: s.slot(0, 0) if g else s.slot(0),
    "slot_mapping": lambda s, g: s.slot_mapping(0) if g else s.slot_mapping(),
    "with_exit": None,  # special-cased
    "truncate_fenced": lambda s, g: s.truncate_fenced(1, 0),
    "retire_copy_source": lambda s, g: s.retire_copy_source(0),
    "slot_mapping_buffer/append_fenced": lambda s, g: (
        s.append_fenced(1, 0) if g else s.slot_mapping_buffer()
    ),
    "slot_mapping_array/null_blocks": lambda s, g: (
        s.null_blocks(0)
        if g
        else s.slot_mapping_array() if numpy is not None else s.slot_mapping(0)
    ),
    "held_blocks": lambda s, g: s.held_blocks if g else len(s.block_ids),
}


def finish_and_check(pool, seq, hybrid, busy, before_seq, before_pool):
    # Still waiting: nothing the interrupted call could change did change.
    assert pool_state(pool) == before_pool
    busy.finish()
    after = sstate(seq, hybrid)
    assert after[0] == before_seq[0]  # len
    assert after[1][: len(before_seq[1])] == before_seq[1]  # table prefix
    assert after[2] == before_seq[2] + BS  # the reserve's block arrived
    assert after[3] is False
    seq.close()
    assert pool.reset_prefix_cache() >= 0
    assert pool.free_blocks == pool.num_blocks
    assert all(pool.ref_count(i) == 0 for i in range(pool.num_blocks))


@pytest.mark.parametrize("hybrid", [False, True], ids=["Sequence", "Hybrid"])
@pytest.mark.parametrize("op", sorted(SEQ_OPS))
def test_interrupted_waiting_call_changes_nothing(op, hybrid):
    pool = kvslots.BlockPool(16, BS)
    seq, groups = prepared(pool, hybrid)
    before_seq = sstate(seq, hybrid)
    busy = Busy(pool, seq)
    before_pool = pool_state(pool)
    if op == "with_exit":
        with pytest.raises(Interrupted) as info, alarm(0.05):
            with seq:
                raise ValueError("body")
        # The body's exception is kept as the context; the sequence stays
        # open (it was not closed): see the report.
        assert isinstance(info.value.__context__, ValueError)
    else:
        with pytest.raises(Interrupted), alarm(0.05):
            SEQ_OPS[op](seq, groups)
    finish_and_check(pool, seq, hybrid, busy, before_seq, before_pool)


def test_a_real_sigint_raises_keyboard_interrupt_in_the_waiting_call():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    pool = kvslots.BlockPool(16, BS)
    seq, _ = prepared(pool, False)
    before_seq = sstate(seq, False)
    busy = Busy(pool, seq)
    before_pool = pool_state(pool)
    old = signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(KeyboardInterrupt):
            seq.fork()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    finish_and_check(pool, seq, False, busy, before_seq, before_pool)


def test_handler_that_does_not_raise_lets_the_wait_go_on():
    pool = kvslots.BlockPool(16, BS)
    seq, groups = prepared(pool, False)
    before = sstate(seq, False)
    busy = Busy(pool, seq)
    ran = threading.Event()
    count = []

    def handler(signum, frame):
        count.append(1)
        ran.set()

    def releaser():
        assert ran.wait(30)
        busy.pool.free(busy.held)

    old = signal.signal(signal.SIGALRM, handler)
    t = threading.Thread(target=releaser)
    t.start()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02)
        n = len(seq)  # waits behind the reserve, handlers run meanwhile
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    t.join()
    busy.thread.join(30)
    assert busy.outcome == ["reserved"]
    assert n == before[0] and count
    assert seq.capacity == before[2] + BS
    seq.close()
    pool.reset_prefix_cache()
    assert pool.free_blocks == pool.num_blocks


@pytest.mark.parametrize("hybrid", [False, True], ids=["Sequence", "Hybrid"])
def test_many_threads_contend_with_signals_flying(hybrid):
    pool = kvslots.BlockPool(32, BS)
    seq, groups = make(pool, hybrid)
    stop = threading.Event()
    errors = []

    def worker(k):
        try:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    seq.try_append(1 + (i + k) % 5)
                except (kvslots.ReserveError, kvslots.CopyRequired):
                    pass
                if i % 3 == 0:
                    seq.truncate(i % 7)
                if i % 5 == 0:
                    try:
                        seq.reserve(8, timeout=0.01)
                    except kvslots.ReserveError:
                        # SequenceBusy among them: another worker's call
                        # held `seq` for the whole timeout.
                        pass
                if i % 11 == 0:
                    seq.shrink_to_fit()
                ids = seq.block_ids(0) if hybrid else seq.block_ids
                assert len(ids) * BS >= 0
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    interrupted = 0
    completed = 0
    armed = [False]

    def handler(signum, frame):
        if armed[0]:
            armed[0] = False  # one raise per armed stretch
            raise Interrupted

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.003, 0.003)
        # At least 3,000 rounds, and on until a signal landed while armed
        # (the timer fires every 3 ms, so a slow machine only takes longer).
        while completed + interrupted < 3000 or interrupted == 0:
            try:
                armed[0] = True
                try:
                    seq.try_append(1)
                except (kvslots.ReserveError, kvslots.CopyRequired):
                    pass
                _ = len(seq), seq.capacity, repr(seq), seq.closed
                armed[0] = False
                completed += 1
            except Interrupted:
                interrupted += 1
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert interrupted > 0
    n = len(seq)
    assert seq.capacity >= n
    held = seq.held_blocks if hybrid else len(seq.block_ids)
    assert pool.used_blocks == held
    seq.close()
    assert seq.closed
    assert pool.free_blocks == pool.num_blocks


def test_gc_of_a_sequence_while_others_wait():
    pool = kvslots.BlockPool(16, BS)
    seq, _ = prepared(pool, False)
    busy = Busy(pool, seq)
    waiter_out = []

    def waiter():
        waiter_out.append(len(busy.seq))

    w = threading.Thread(target=waiter)
    w.start()
    ref = weakref.ref(seq)
    del seq
    gc.collect()
    assert ref() is not None  # the threads keep it
    busy.pool.free(busy.held)
    busy.thread.join(30)
    w.join(30)
    assert busy.outcome == ["reserved"] and waiter_out == [len(TOKENS) + 1]
    busy.seq = None
    gc.collect()
    assert ref() is None
    pool.reset_prefix_cache()
    assert pool.free_blocks == pool.num_blocks


def test_interrupted_exit_leaves_sequence_open_until_dropped():
    pool = kvslots.BlockPool(16, BS)
    seq, _ = prepared(pool, False)
    busy = Busy(pool, seq)
    with pytest.raises(Interrupted), alarm(0.05):
        with seq:
            pass
    busy.finish()
    assert not seq.closed  # __exit__ did not close it
    assert pool.used_blocks == 4
    busy.seq = None
    del seq
    gc.collect()
    pool.reset_prefix_cache()
    assert pool.free_blocks == pool.num_blocks  # dropped: no leak


REENTRANT = textwrap.dedent(
    """
    import signal, sys, threading, kvslots
    mode, kind = sys.argv[1], sys.argv[2]
    pool = kvslots.BlockPool(8, 4)
    if kind == "hybrid":
        seq = kvslots.HybridSequence(pool, kvslots.KvGroups(["full"]))
    else:
        seq = kvslots.Sequence(pool)
    held = pool.try_alloc(8)
    calls = []
    class Interrupted(Exception): pass
    def handler(signum, frame):
        calls.append(1)
        if len(calls) == 1:
            # The main thread's reserve holds seq: a call that waited for
            # it would wait for itself.
            print("handler-enter", flush=True)
            if mode == "finalizer":
                # A finalizer that closes the sequence, run by the handler.
                class Owner:
                    def __del__(self):
                        try:
                            seq.close()
                            print("handler-len-returned", flush=True)
                        except RuntimeError as e:
                            print("handler-raised", "reentrant" in str(e), flush=True)
                owner = Owner()
                del owner
                return
            try:
                len(seq)
                print("handler-len-returned", flush=True)
            except RuntimeError as e:
                print("handler-raised", "reentrant" in str(e), flush=True)
                if mode == "propagate":
                    raise
        else:
            # Only a regression gets here (the first call stuck): unwind.
            raise Interrupted
    signal.signal(signal.SIGALRM, handler)
    def releaser():
        while not calls:
            pass
        pool.free(held)
    if mode != "propagate":
        threading.Thread(target=releaser, daemon=True).start()
    signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
    try:
        seq.reserve(4, timeout=None)
        signal.setitimer(signal.ITIMER_REAL, 0)
        print("reserved", len(seq), seq.capacity, pool.waiters, seq.closed,
              flush=True)
    except RuntimeError:
        signal.setitimer(signal.ITIMER_REAL, 0)
        print("raised", len(seq), seq.capacity, pool.waiters,
              pool.free_blocks, seq.closed, flush=True)
    except Interrupted:
        print("interrupted", flush=True)
    """
)


@pytest.mark.parametrize("kind", ["plain", "hybrid"])
@pytest.mark.parametrize("mode", ["catch", "propagate", "finalizer"])
def test_a_handler_calling_the_sequence_its_thread_reserves_raises(mode, kind):
    # The main thread's reserve holds the sequence while it waits and runs
    # the signal handlers (check_signals in wait::block_on); a handler that
    # calls the same sequence gets RuntimeError at once instead of waiting
    # for its own thread. Caught, the reserve goes on and completes; let
    # through, it ends the reserve, which changed nothing. A finalizer that
    # the handler runs (closing the sequence it owned) gets the same error,
    # and the sequence stays open. (A subprocess
    # and its timeout only keep a regression from hanging the suite.)
    r = run_python(REENTRANT, mode, kind, timeout=60)
    out = r.stdout + r.stderr
    assert "handler-enter" in r.stdout, out
    assert "handler-len-returned" not in r.stdout, out
    assert "interrupted" not in r.stdout, out
    assert "handler-raised True" in r.stdout, out
    if mode != "propagate":
        assert "reserved 0 4 0 False" in r.stdout, out
    else:
        # Nothing changed: empty, no capacity, no waiter left, every block
        # still held by the raw allocation, the sequence open.
        assert "raised 0 0 0 0 False" in r.stdout, out


def test_handler_of_a_waiting_call_closes_the_same_sequence():
    # The main thread waits (not holding); its handler calls close() on the
    # same sequence, which waits in turn; the outer call then sees it closed.
    pool = kvslots.BlockPool(16, BS)
    seq, _ = prepared(pool, False)
    busy = Busy(pool, seq)
    log = []

    def handler(signum, frame):
        if not log:
            log.append("handler")
            pool.free(busy.held)  # lets the reserve finish, from the handler
            seq.close()  # waits for the reserve's hold, then closes
            log.append("closed")

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(ValueError):
            len(seq)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    busy.thread.join(30)
    assert log == ["handler", "closed"] and busy.outcome == ["reserved"]
    assert seq.closed
    pool.reset_prefix_cache()
    assert pool.free_blocks == pool.num_blocks


def test_waiters_behind_a_closing_holder_see_closed():
    pool = kvslots.BlockPool(16, BS)
    seq, _ = prepared(pool, False)
    busy = Busy(pool, seq)
    results = []
    lock = threading.Lock()

    def waiter(op):
        try:
            op()
            r = "ok"
        except ValueError:
            r = "closed"
        with lock:
            results.append(r)

    ops = [lambda: len(seq), lambda: seq.try_append(1), seq.close,
           lambda: seq.fork(), lambda: seq.truncate(0)] * 4
    ws = [threading.Thread(target=waiter, args=(op,)) for op in ops]
    for w in ws:
        w.start()
    pool.free(busy.held)
    busy.thread.join(30)
    for w in ws:
        w.join(30)
        assert not w.is_alive()
    assert busy.outcome == ["reserved"]
    assert seq.closed and len(results) == len(ops)
    gc.collect()
    pool.reset_prefix_cache()
    # forks that ran before the close hold children; they are unreferenced
    assert pool.free_blocks == pool.num_blocks


def test_main_thread_holder_interrupted_lets_a_worker_in():
    pool = kvslots.BlockPool(16, BS)
    seq, _ = prepared(pool, False)
    held = pool.try_alloc(pool.free_blocks)
    before = sstate(seq, False)
    out = []
    started = threading.Event()

    def worker():
        started.set()
        out.append(len(seq))  # waits for the main thread's reserve

    w = threading.Thread(target=worker)
    with pytest.raises(Interrupted), alarm(0.2):
        w.start()
        seq.reserve(seq.capacity - len(seq) + 1, timeout=None)
    w.join(30)
    assert out == [before[0]] and sstate(seq, False) == before
    assert pool.waiters == 0
    pool.free(held)
    seq.close()
    pool.reset_prefix_cache()
    assert pool.free_blocks == pool.num_blocks


@pytest.mark.parametrize("hybrid", [False, True], ids=["Sequence", "Hybrid"])
@pytest.mark.parametrize("timeout", [0, 0.05])
def test_reserve_timeout_bounds_the_wait_for_a_held_sequence(hybrid, timeout):
    # From a helper's attack: the timeout covered only the pool's queue, so
    # a reserve behind another thread's reserve waited as long as that one.
    pool = kvslots.BlockPool(16, BS)
    seq, _ = prepared(pool, hybrid)
    before_seq = sstate(seq, hybrid)
    busy = Busy(pool, seq)  # holds `seq` until finish(), with a 30 s guard
    before_pool = pool_state(pool)
    with pytest.raises(kvslots.SequenceBusy, match="another thread's call held this") as err:
        seq.reserve(1, timeout=timeout)
    # Caught by `except ReserveError` with every refusal of a reservation,
    # and by `except TimeoutError` as a lock's timed acquire is.
    assert isinstance(err.value, kvslots.ReserveError)
    assert isinstance(err.value, TimeoutError)
    assert not isinstance(err.value, kvslots.Full)
    # The holder is still waiting: the timeout ended the call, not the hold.
    assert busy.thread.is_alive() and busy.outcome == []
    finish_and_check(pool, seq, hybrid, busy, before_seq, before_pool)


SHUTDOWN_WAIT = """
import os, sys
import kvslots

pool = kvslots.BlockPool(8, 4)
held = pool.try_alloc(8)
seq = kvslots.Sequence(pool)


class Cleanup:
    # Collected in the interpreter's finalization: the process's first
    # timed wait runs there.
    def __del__(self, pool=pool, seq=seq, write=os.write):
        for call in (lambda: pool.alloc(1, timeout=0.06),
                     lambda: seq.reserve(4, timeout=0.06),
                     lambda: pool.try_alloc(1),
                     lambda: pool.free([8])):
            try:
                call()
                write(1, b"returned\\n")
            except BaseException as e:
                write(1, type(e).__name__.encode() + b"\\n")


c = Cleanup()
c.me = c
del c
"""


def test_refusals_during_finalization_raise_their_errors():
    # From a helper's attack: during the interpreter's finalization a timed
    # wait, and every refusal whose exception carries attributes, panicked
    # (`PanicException`): the wait attached to the interpreter from a
    # detached closure, and the exception was read back from a lazy error,
    # which detaches and re-attaches.
    r = run_python(SHUTDOWN_WAIT, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert r.stdout.split() == ["Full", "Full", "Full", "FreeError"], out
    assert "panicked" not in r.stderr, out


OUT_OF_MEMORY = """
import array, itertools, resource, sys
import kvslots

tokens = array.array("b", bytes(1 << 28))  # 256 MiB of 1-byte tokens
# The address space now, plus 1 GiB: room for the buffer's one copy
# (256 MiB), not for the 1 GiB of uint32 tokens.
with open("/proc/self/statm") as f:
    pages = int(f.read().split()[0])
now = pages * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (now + (1 << 30), resource.RLIM_INFINITY))
try:
    kvslots.hash_blocks(tokens, 16)
    print("hashed")
except MemoryError as e:
    print("MemoryError", e)
# An endless iterable of keys: a billion would take 32 GiB.
pool = kvslots.BlockPool(4, 4)
seq = kvslots.Sequence(pool)
for call in (lambda keys: kvslots.KvGroups(["full"]).keys(keys), seq.match_prefix):
    try:
        call(itertools.repeat(bytes(32), 10**9))
        print("matched")
    except MemoryError as e:
        print("MemoryError", e)
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc, limits RLIMIT_AS"
)
def test_tokens_that_do_not_fit_raise_memory_error_not_abort():
    # From a helper's attack: the tokens were collected into vectors whose
    # allocation failure aborts the process.
    r = run_python(OUT_OF_MEMORY)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    lines = r.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["MemoryError"] * 3, out
    assert "tokens of 268435456 items" in lines[0], out
    assert all("block keys of" in line for line in lines[1:]), out


def test_a_refusal_in_an_except_block_keeps_its_context():
    # From a helper's attack: exceptions with attributes were raised
    # without `__context__`, so a traceback lost the exception being
    # handled.
    pool = kvslots.BlockPool(4, BS)
    held = pool.try_alloc(4)
    for call, error in (
        (lambda: pool.try_alloc(10**6), kvslots.NeverFits),
        (lambda: pool.try_alloc(1), kvslots.Full),
        (lambda: pool.free([99]), kvslots.FreeError),
    ):
        with pytest.raises(error) as info:
            try:
                raise KeyError("being handled")
            except KeyError:
                call()
        assert isinstance(info.value.__context__, KeyError)
    pool.free(held)
    assert pool.free_blocks == 4


def test_sequence_busy_is_a_reserve_error_and_a_timeout_error_that_pickles():
    import pickle

    cls = kvslots.SequenceBusy
    assert cls.__module__ == "kvslots" and cls.__name__ == "SequenceBusy"
    assert issubclass(cls, kvslots.ReserveError) and issubclass(cls, TimeoutError)
    assert "SequenceBusy" in kvslots.__all__
    err = cls("the timeout ran out")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and back.args == err.args
