"""The waiters benchmark (python/bench/waiters.py), run short: it parks its
threads in the pool's queue, measures, closes the pool and reports, and it
refuses bad options."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

WAITERS = Path(__file__).resolve().parents[1] / "bench" / "waiters.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(WAITERS), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_waiters_benchmark_runs_its_waiters_and_reports():
    done = run("--waiters", "8", "--iterations", "1000", "--repeats", "2", "--json")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["waiters"] == 8
    assert figures["iterations"] == 1000
    assert figures["alone_ms"] > 0 and figures["beside_waiters_ms"] > 0
    assert figures["ratio"] == pytest.approx(figures["beside_waiters_ms"] / figures["alone_ms"])


def test_the_waiters_benchmark_runs_with_no_waiter():
    done = run("--waiters", "0", "--iterations", "1000", "--repeats", "1", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["waiters"] == 0


@pytest.mark.parametrize(
    "option, value",
    [("--waiters", "-1"), ("--iterations", "0"), ("--repeats", "0"), ("--waiters", "x")],
)
def test_the_waiters_benchmark_refuses_a_bad_option(option, value):
    done = run(option, value)
    assert done.returncode == 2
    assert option in done.stderr
    assert done.stdout == ""
