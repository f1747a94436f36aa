#!/usr/bin/env python3
"""What threads waiting in kvslots cost the thread that runs Python.

A thread waiting in `BlockPool.alloc` (or `Sequence.reserve`, or behind
another thread's call on the same sequence) waits with the interpreter
detached, so other Python threads run meanwhile. It re-attaches now and
then so that Python's signal handlers can run, and each re-attach takes
the GIL from whoever runs Python. This measures that cost: the main thread
runs a fixed pure-Python loop while `--waiters` threads wait in
`alloc` on a pool with no free block (so none of them is ever granted),
against the same loop with no thread waiting, both in the same run.

Figures are the best of `--repeats` runs of the loop; the ratio is the
loop's time with the waiters over its time without them (1.00: no cost).
Run it on an idle machine: a build beside it moves the figures.

    python python/bench/waiters.py --waiters 1000
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time

import kvslots


def work(iterations: int) -> int:
    """A fixed pure-Python loop, which holds the GIL while it runs."""
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


def best_time(iterations: int, repeats: int) -> float:
    """The best of `repeats` timings of `work(iterations)`, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work(iterations)
        best = min(best, time.perf_counter() - start)
    return best


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {value}")
    return value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--waiters", type=non_negative, default=1000, help="threads waiting in alloc")
    ap.add_argument("--iterations", type=positive, default=2_000_000, help="loop iterations a run")
    ap.add_argument("--repeats", type=positive, default=5, help="runs of the loop (best kept)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()

    pool = kvslots.BlockPool(1, 16)
    held = pool.try_alloc(1)  # the pool is now empty: every alloc(1) waits
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            pool.alloc(1)
        except kvslots.Closed:
            pass
        except BaseException as exc:  # reported below
            errors.append(exc)

    alone = best_time(args.iterations, args.repeats)
    threads = [threading.Thread(target=wait) for _ in range(args.waiters)]
    for t in threads:
        t.start()
    # Every waiter queued (or about to: one still on its way in finds the
    # pool empty and queues too), then the loop again.
    while pool.waiters < args.waiters:
        time.sleep(0.01)
    beside = best_time(args.iterations, args.repeats)
    pool.close()
    for t in threads:
        t.join()
    pool.free(held)
    if errors:
        print(f"a waiter raised: {errors[0]!r}", file=sys.stderr)
        return 1

    figures = {
        "python": platform.python_version(),
        "waiters": args.waiters,
        "iterations": args.iterations,
        "alone_ms": alone * 1e3,
        "beside_waiters_ms": beside * 1e3,
        "ratio": beside / alone,
    }
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"loop alone:                {figures['alone_ms']:.2f} ms")
        print(f"loop beside {args.waiters} waiters: {figures['beside_waiters_ms']:.2f} ms")
        print(f"ratio (1.00: no cost):     {figures['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
