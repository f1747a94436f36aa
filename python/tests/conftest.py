"""Helpers shared by the tests: snapshots of everything observable, so that
every refused call can be checked to have changed nothing."""

import contextlib
import signal
import subprocess
import sys
import threading

import pytest

import kvslots


def pool_state(pool):
    """Every count the pool reports, and every block's reference count."""
    return (
        pool.free_blocks,
        pool.used_blocks,
        pool.cached_blocks,
        pool.evictable_blocks,
        pool.pending_release_blocks,
        pool.closed,
        tuple(pool.ref_count(i) for i in range(pool.num_blocks)),
    )


def seq_state(seq):
    """A sequence's length, table and capacity."""
    return (len(seq), tuple(seq.block_ids), seq.capacity)


class Interrupted(Exception):
    """What `alarm`'s signal handler raises (as Ctrl-C's raises
    `KeyboardInterrupt`)."""


@contextlib.contextmanager
def alarm(seconds):
    """A `SIGALRM` in `seconds` whose handler raises `Interrupted`; the timer
    and the old handler are restored on exit. Needs `signal.setitimer`."""

    def handler(signum, frame):
        raise Interrupted

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Busy:
    """Another thread's reserve holds `seq` while it waits for blocks."""

    def __init__(self, pool, seq):
        self.pool, self.seq = pool, seq
        self.held = pool.try_alloc(pool.free_blocks)
        self.outcome = []
        self.thread = threading.Thread(target=self.run)
        self.thread.start()
        while pool.waiters == 0:  # the reserve has queued
            assert self.thread.is_alive()

    def run(self):
        try:
            self.seq.reserve(self.seq.capacity - len(self.seq) + 1, timeout=30)  # hang guard
            self.outcome.append("reserved")
        except BaseException as e:  # noqa: BLE001
            self.outcome.append(repr(e))

    def finish(self):
        assert self.thread.is_alive() and self.outcome == []
        assert self.pool.waiters == 1
        self.pool.free(self.held)
        self.thread.join(30)
        assert not self.thread.is_alive()
        assert self.outcome == ["reserved"]


@pytest.fixture
def pool():
    return kvslots.BlockPool(16, 4)


def run_python(source, *args, timeout=120, **kwargs):
    """`source` run by a fresh interpreter (this one's executable) with
    `args`, its output captured as text; the timeout keeps a regression
    that hangs from hanging the suite."""
    return subprocess.run(
        [sys.executable, "-c", source, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )
