"""Helpers shared by the tests: snapshots of everything observable, so that
every refused call can be checked to have changed nothing."""

import contextlib
import signal

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


@pytest.fixture
def pool():
    return kvslots.BlockPool(16, 4)
