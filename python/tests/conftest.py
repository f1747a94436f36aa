"""Helpers shared by the tests: snapshots of everything observable, so that
every refused call can be checked to have changed nothing."""

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


@pytest.fixture
def pool():
    return kvslots.BlockPool(16, 4)
