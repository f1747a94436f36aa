"""The continuous-batching example (python/examples/continuous_batching.py):
a scheduler over the pool that serves every request to completion with the
outputs the true tokens give, preempts and recomputes on a tight pool, keeps
a router's view from the KV events equal to the pool's cache, and gives
every block back."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "continuous_batching.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("continuous_batching", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_a_roomy_pool_serves_every_request_from_the_cache(example):
    requests = example.workload(60, seed=1)
    stats = example.run(requests, num_blocks=1024, token_budget=256, headroom=4)
    assert stats.finished == 60
    assert stats.outputs_correct
    assert stats.router_in_sync
    assert stats.preemptions == 0
    # Requests admitted after the first of their system prompt was
    # published match it.
    assert 0 < stats.hit_tokens < stats.prompt_tokens
    assert stats.used_blocks_after == 0
    assert stats.cached_blocks_after > 0


@pytest.mark.parametrize("num_blocks, token_budget", [(40, 256), (48, 64), (64, 256)])
def test_a_tight_pool_preempts_and_recomputes_the_same_outputs(example, num_blocks, token_budget):
    requests = example.workload(120, seed=2)
    stats = example.run(
        requests, num_blocks=num_blocks, token_budget=token_budget, headroom=0, max_running=32
    )
    assert stats.finished == 120
    assert stats.preemptions > 0
    assert stats.outputs_correct
    assert stats.router_in_sync
    assert stats.used_blocks_after == 0


@pytest.mark.parametrize("num_blocks, headroom", [(1024, 4), (48, 0), (40, 0)])
def test_speculative_decoding_rolls_back_the_rejected_drafts(example, num_blocks, headroom):
    requests = example.workload(120, seed=4)
    plain = example.run(requests, num_blocks=num_blocks, headroom=headroom)
    spec = example.run(requests, num_blocks=num_blocks, headroom=headroom, spec_tokens=3)
    # Some drafts rejected (rolled back with truncate), most accepted.
    assert 0 < spec.accepted < spec.drafted
    assert spec.outputs_correct and plain.outputs_correct
    assert spec.router_in_sync
    assert spec.finished == 120
    assert spec.used_blocks_after == 0
    # The accepted drafts save steps.
    assert spec.steps < plain.steps


def test_the_check_catches_a_verifier_that_accepts_wrong_drafts(example, monkeypatch):
    """The negative control of the speculative runs: a verifier that accepts
    every draft, the wrong ones too, keeps them (and their KV) and changes
    the outputs."""
    execute = example.Model.execute

    def accept_all(self, batch):
        sampled = execute(self, batch)
        for s in batch.scheduled:
            if s.req.rid in sampled and s.drafts:
                sampled[s.req.rid] = s.drafts + sampled[s.req.rid][-1:]
        return sampled

    monkeypatch.setattr(example.Model, "execute", accept_all)
    stats = example.run(example.workload(20, seed=5), num_blocks=256, spec_tokens=3)
    assert not stats.outputs_correct


def test_the_oracle_catches_a_kernel_writing_the_wrong_slots(example, monkeypatch):
    """The negative control: writes that land one block off read back a
    wrong context, and the outputs differ from the true tokens'."""
    schedule = example.Scheduler.schedule

    def off_by_a_block(self):
        batch = schedule(self)
        size = self.pool.num_blocks * self.block_size
        batch.slot_mapping = [(s + self.block_size) % size for s in batch.slot_mapping]
        return batch

    monkeypatch.setattr(example.Scheduler, "schedule", off_by_a_block)
    stats = example.run(example.workload(20, seed=3), num_blocks=256)
    assert not stats.outputs_correct


def test_a_prompt_longer_than_the_pool_is_refused_and_the_rest_served(example):
    # 100 tokens need 7 blocks of 16: a pool of 3 refuses it at admission.
    requests = [(list(range(20)), 3), (list(range(100)), 3), (list(range(30)), 2)]
    stats = example.run(requests, num_blocks=3, headroom=0)
    assert (stats.finished, stats.rejected) == (2, 1)
    assert stats.outputs_correct
    assert stats.used_blocks_after == 0


def test_a_cached_whole_prompt_still_computes_its_last_token(example):
    # The second request finds all 4 of its prompt's blocks cached, but
    # matches 3: the last token's KV is computed again, to sample from.
    prompt = list(range(64))
    stats = example.run([(prompt, 2), (prompt, 2)], num_blocks=16, max_running=1)
    assert stats.finished == 2 and stats.outputs_correct
    assert stats.hit_tokens == 48


def test_a_step_that_preempts_admits_nobody(example, monkeypatch):
    schedule = example.Scheduler.schedule
    seen = {"preempting_steps": 0}

    def checked(self):
        running, preemptions = {id(r) for r in self.running}, self.preemptions
        batch = schedule(self)
        if self.preemptions > preemptions:
            seen["preempting_steps"] += 1
            assert all(id(s.req) in running for s in batch.scheduled)
        return batch

    monkeypatch.setattr(example.Scheduler, "schedule", checked)
    stats = example.run(example.workload(120, seed=2), num_blocks=40, headroom=0)
    assert stats.outputs_correct and seen["preempting_steps"] > 0


def test_the_headroom_refuses_a_prompt_that_would_leave_less_free(example):
    # 100 tokens need 7 blocks of 16; a pool of 10 keeps 4 free for the
    # running requests only without it.
    requests = [(list(range(100)), 3)]
    assert example.run(requests, num_blocks=10, headroom=4).rejected == 1
    served = example.run(requests, num_blocks=10, headroom=3)
    assert (served.finished, served.rejected) == (1, 0)
    assert served.outputs_correct


def test_a_request_that_outgrows_the_pool_is_refused_when_it_does(example):
    # Its first two chunks fit (64 tokens a step, 8 blocks in all); the
    # third needs blocks beyond the pool: NeverFits, and it is refused.
    requests = [(list(range(200)), 4), (list(range(40)), 2)]
    stats = example.run(requests, num_blocks=8, token_budget=64, headroom=0)
    assert (stats.finished, stats.rejected) == (1, 1)
    assert stats.outputs_correct
    assert stats.used_blocks_after == 0


def test_the_script_runs_and_exits_zero():
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--requests", "40", "--num-blocks", "48"]
        + ["--headroom", "0"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "outputs_correct: True" in done.stdout


def run_script(*args: str) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize(
    "option, value",
    [
        ("--block-size", "0"),
        ("--num-blocks", "0"),
        ("--num-blocks", "-1"),
        ("--requests", "-5"),
        ("--requests", "0"),
        ("--token-budget", "0"),
        ("--max-running", "0"),
        ("--headroom", "-1"),
        ("--spec-tokens", "-2"),
        ("--block-size", "x"),
        ("--num-blocks", str(2**32)),
    ],
)
def test_the_script_refuses_a_bad_option_value(option, value):
    done = run_script(option, value)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"argument {option}:" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_the_script_help_describes_every_option():
    done = run_script("--help")
    assert done.returncode == 0, done.stderr
    for option in [
        "--requests",
        "--num-blocks",
        "--block-size",
        "--token-budget",
        "--max-running",
        "--headroom",
        "--spec-tokens",
        "--policy",
        "--seed",
    ]:
        assert option in done.stdout
    # A help string for each (argparse prints none without one).
    assert done.stdout.count("(default: ") == 9


@pytest.mark.parametrize(
    "args", [["--num-blocks", "8"], ["--headroom", "200"], ["--num-blocks", "1", "--headroom", "0"]]
)
def test_the_script_fails_when_the_pool_holds_no_request(args):
    # Every request refused: nothing served, nothing checked, no pass.
    done = run_script("--requests", "20", *args)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no request finished" in done.stderr
    assert "all 20 were refused" in done.stderr
    assert "outputs_correct" not in done.stdout
    assert "Traceback" not in done.stderr


def test_the_example_type_checks_against_the_stubs(tmp_path):
    pytest.importorskip("mypy")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(tmp_path),
            str(EXAMPLE),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("num_blocks, headroom", [(1024, 4), (48, 0), (40, 0)])
def test_longest_prefix_first_serves_every_request_correctly(example, num_blocks, headroom):
    requests = example.workload(120, seed=5)
    stats = example.run(
        requests, num_blocks=num_blocks, headroom=headroom, max_running=32, policy="lpm"
    )
    assert stats.finished == 120
    assert stats.outputs_correct
    assert stats.router_in_sync
    assert stats.used_blocks_after == 0
    assert 0 < stats.hit_tokens < stats.prompt_tokens


def test_longest_prefix_first_ranks_by_peek_and_changes_nothing(example):
    import kvslots

    pool = kvslots.BlockPool(64, 4)
    scheduler = example.Scheduler(pool, policy="lpm")
    short, none, long = (
        example.Request(0, list(range(100, 113)), 1),
        example.Request(1, list(range(500, 513)), 1),
        example.Request(2, list(range(200, 213)), 1),
    )
    # Cache 1 block of `short`'s prompt and 3 of `long`'s.
    for req, blocks in ((short, 1), (long, 3)):
        seq = kvslots.Sequence(pool)
        seq.try_append(blocks * 4)
        assert seq.publish(scheduler.matchable_keys(req)[:blocks]) == blocks
        seq.close()
    for req in (short, none, long):
        scheduler.add(req)
    before = (pool.evictable_blocks, pool.prefix_stats())
    scheduler.rank_waiting()
    assert [req.rid for req in scheduler.waiting] == [2, 0, 1]
    assert (pool.evictable_blocks, pool.prefix_stats()) == before
    fcfs = example.Scheduler(pool)
    for req in (short, none, long):
        fcfs.add(req)
    fcfs.rank_waiting()
    assert [req.rid for req in fcfs.waiting] == [0, 1, 2]
    with pytest.raises(ValueError):
        example.Scheduler(pool, policy="random")
