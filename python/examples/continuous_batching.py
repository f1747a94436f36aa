#!/usr/bin/env python3
"""A continuous-batching scheduler on kvslots, in the shape of vLLM's v1
scheduler: one thread that, each step, grows the running requests, admits
waiting ones, and hands the model runner a batch and its slot mapping.

What it shows, call by call:

* **Admission with a watermark.** A waiting request gets a `Sequence`,
  takes its cached prefix with `match_prefix` (the keys of the full blocks
  before its last token: the last token is always computed), then its
  first prefill chunk with `try_reserve(chunk, headroom)` + `try_append`:
  all its blocks or none, and only if `headroom` blocks stay free for the
  running requests to grow. A refusal (`kvslots.Full`) leaves the pool
  unchanged; the request goes back to the head of the queue (FIFO: nobody
  passes it).
* **Refusal.** A request that the whole pool cannot hold raises
  `kvslots.NeverFits`: at its admission (a prompt chunk past the pool, with
  the headroom), or when a later chunk or a decode step needs more blocks
  than the pool has beside those the request holds. It is refused, its
  blocks given back.
* **Chunked prefill and decode** within a token budget a step: the
  running requests' appends in one `try_append_each(seqs, counts)` call,
  which stops at the first request that cannot append now; that one goes
  through `try_append`, whose exception says why. Each scheduled range
  gets its slots with `slot_mapping(start, stop)`.
* **Preemption by recompute.** When a running request cannot get the
  block its next tokens need, the most recently admitted running request is
  preempted: its sequence is closed (its blocks go back at once, and the
  blocks it published stay cached, so its recompute matches them again) and
  it goes back to the head of the queue.
* **Speculative decoding** (`spec_tokens`): a decode step appends the last
  token and a few draft tokens; after the model verifies them, `truncate`
  rolls back the rejected drafts (and gives back a block they alone used).
* **Prefix caching.** After a step, every request publishes the full
  blocks whose tokens the step computed, under keys extended a block at a
  time (`hash_blocks(..., parent=last_key)`).
* **KV events** for a KV-aware router: the pool is built with `kv_events`,
  and a `Router` replays `drain_events()` into the set of keys it believes
  cached.
* **Longest prefix first** (`--policy lpm`, SGLang's policy): before it
  admits, the scheduler ranks the waiting requests by their cached
  prefix, counted with `BlockPool.peek_prefix` (which takes nothing and
  leaves the eviction order alone), longest first, arrival order among
  equals. The default, `fcfs`, admits in arrival order.

The "model" is a stand-in that checks the KV cache. Its KV at a position
depends on every token up to it, as a transformer's does: the kernel
computes it from the KV of the position before, read back through the
block table, and the token, and writes it into a flat KV memory at the
token's slot; the next token is sampled from the KV of the last position,
read back the same way. A block handed to two requests, a prefix match
that returned the wrong blocks, a key that names a block's tokens but not
those before them, or a bad rollback, reads back a wrong KV and changes
the outputs, which `run` compares with outputs computed from the true
tokens.

Run it: `python python/examples/continuous_batching.py` (or `--help`;
`--spec-tokens 3` for speculative decoding, `--policy lpm` for the longest
cached prefix first).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Set, Tuple

import kvslots


def kv_step(prev: int, token: int) -> int:
    """The stand-in model's KV at a position: from the KV of the position
    before (0 before the first) and the position's token."""
    return (prev * 1_000_003 + token + 1) % 2_147_483_647


def sample(kv: int) -> int:
    """The stand-in model's next token, from the KV of the last position."""
    return kv % 50_000


def next_token(context: List[int]) -> int:
    """The token the stand-in model samples after `context`, computed from
    the true tokens."""
    kv = 0
    for token in context:
        kv = kv_step(kv, token)
    return sample(kv)


def draft(rid: int, tokens: List[int], k: int) -> List[int]:
    """The stand-in draft model: `k` guesses at the next tokens, right about
    three times in four."""
    context = list(tokens)
    for _ in range(k):
        guess = next_token(context)
        if (rid * 7919 + len(context)) % 4 == 0:
            guess = (guess + 1) % 50_000
        context.append(guess)
    return context[len(tokens) :]


@dataclass(eq=False)
class Request:
    """One request: its prompt, the tokens generated so far, and its
    sequence while it runs."""

    rid: int
    prompt: List[int]
    max_new_tokens: int
    output: List[int] = field(default_factory=list)
    seq: Optional[kvslots.Sequence] = None
    # Tokens whose KV is computed (the sequence's length after a step).
    computed: int = 0
    # Keys of the computed full blocks, the first `len(keys)` blocks.
    keys: List[bytes] = field(default_factory=list)
    preemptions: int = 0
    # Tokens taken from the cache at admissions (a recompute after a
    # preemption counts again).
    hit_tokens: int = 0

    @property
    def tokens(self) -> List[int]:
        return self.prompt + self.output

    @property
    def finished(self) -> bool:
        return len(self.output) >= self.max_new_tokens


@dataclass
class Scheduled:
    """A request's share of a step: positions `start..stop` of its tokens,
    followed by `drafts` (speculative tokens, decode only)."""

    req: Request
    start: int
    stop: int
    drafts: List[int] = field(default_factory=list)

    @property
    def tokens(self) -> List[int]:
        """The token ids the step writes at `start..stop`."""
        return (self.req.tokens + self.drafts)[self.start : self.stop]


@dataclass
class Batch:
    """What the model runner gets for one step."""

    scheduled: List[Scheduled]
    # The flat KV slot of every scheduled token, in batch order.
    slot_mapping: List[int]


class Router:
    """A KV-aware router's view of one worker: the keys it holds cached,
    replayed from the worker's KV events."""

    def __init__(self) -> None:
        self.cached: Set[bytes] = set()
        self.resyncs = 0

    def apply(self, batch: kvslots.KVEventBatch) -> None:
        for event in batch.events:
            if isinstance(event, kvslots.BlockStored):
                self.cached.update(event.block_hashes)
            elif isinstance(event, kvslots.BlockRemoved):
                self.cached.difference_update(event.block_hashes)
            else:
                # AllBlocksCleared (the stream's start) or EventsDropped
                # (lost events): start over from an empty view.
                self.cached.clear()
                self.resyncs += 1


# The admission orders: arrival order, or the longest cached prefix first.
POLICIES = ("fcfs", "lpm")


class Scheduler:
    """Continuous batching over one `BlockPool`, from one thread."""

    def __init__(
        self,
        pool: kvslots.BlockPool,
        token_budget: int = 512,
        max_running: int = 64,
        headroom: int = 4,
        spec_tokens: int = 0,
        policy: str = "fcfs",
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, not {policy!r}")
        self.pool = pool
        self.policy = policy
        self.spec_tokens = spec_tokens
        self.drafted = 0
        self.accepted = 0
        self.block_size = pool.block_size
        self.token_budget = token_budget
        self.max_running = max_running
        self.headroom = headroom
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []
        self.rejected: List[Request] = []
        self.preemptions = 0
        # Every key published, for checking a router's view.
        self.published: Set[bytes] = set()

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def matchable_keys(self, req: Request) -> List[bytes]:
        """The keys of `req`'s full blocks before its last token: at least
        that token is computed, to sample from."""
        tokens = req.tokens
        matchable = (len(tokens) - 1) // self.block_size
        return kvslots.hash_blocks(tokens[: matchable * self.block_size], self.block_size)

    def rank_waiting(self) -> None:
        """Under `lpm`, orders the waiting requests by their cached prefix,
        longest first (a stable sort: arrival order among equals). A peek
        takes no block, so ranking every waiting request each step leaves
        the cache and its eviction order as they were."""
        if self.policy != "lpm" or len(self.waiting) < 2:
            return
        peek = self.pool.peek_prefix
        ranked = sorted(self.waiting, key=lambda req: -peek(self.matchable_keys(req)))
        self.waiting = deque(ranked)

    def _preempt(self, victim: Request) -> None:
        """Gives the victim's blocks back now; it recomputes from its cached
        prefix when admitted again."""
        assert victim.seq is not None
        victim.seq.close()
        victim.seq = None
        victim.computed = 0
        victim.keys = []
        victim.preemptions += 1
        self.preemptions += 1
        self.running.remove(victim)
        self.waiting.appendleft(victim)

    def _abort(self, req: Request) -> None:
        """Refuses a running request for good, giving its blocks back."""
        assert req.seq is not None
        req.seq.close()
        req.seq = None
        self.running.remove(req)
        self.rejected.append(req)

    def _step_tokens(self, req: Request, budget: int) -> Tuple[int, List[int]]:
        """The tokens a running request appends this step, within `budget`:
        the rest of its prefill, or its last token and, with speculative
        decoding, up to `spec_tokens` drafts never past the tokens still to
        generate; and the drafts."""
        n = min(len(req.tokens) - req.computed, budget)
        drafts: List[int] = []
        if n == 1 and self.spec_tokens:
            k = min(self.spec_tokens, budget - 1, req.max_new_tokens - len(req.output) - 1)
            drafts = draft(req.rid, req.tokens, k)
            n += len(drafts)
        return n, drafts

    def _append_or_preempt(self, req: Request, n: int) -> Optional[range]:
        """Appends `n` tokens to a running request that could not append
        them at once: preempts the newest running request until they fit,
        and returns their positions; None if the request itself was
        preempted, or aborted because it can never fit."""
        assert req.seq is not None
        while True:
            try:
                # (No `CopyRequired` here: this scheduler never forks, and
                # its matches and rollbacks leave no shared tail.)
                return req.seq.try_append(n)
            except kvslots.NeverFits:
                # It needs more blocks than the pool has beside those it
                # holds: it can never finish here, so it is aborted.
                self._abort(req)
                return None
            except kvslots.Full:
                # Preempt the newest running request; if that is this one,
                # it waits for the blocks it needs.
                victim = self.running[-1]
                self._preempt(victim)
                if victim is req:
                    return None

    def schedule(self) -> Batch:
        budget = self.token_budget
        scheduled: List[Scheduled] = []
        preempted = self.preemptions

        # The running requests first, oldest first: the rest of a prefill,
        # or one decode token. Their appends go in one `try_append_each`
        # call, which stops at the first that cannot append now; that one
        # goes through `try_append`, whose exception says why, and the
        # rest in another call.
        running = list(self.running)
        start = 0
        while start < len(running) and budget > 0:
            plan: List[Tuple[Request, int, List[int]]] = []
            seqs: List[kvslots.Sequence] = []
            left = budget
            for req in running[start:]:
                if left == 0:
                    break
                if req not in self.running:  # preempted for an older one
                    continue
                assert req.seq is not None
                n, drafts = self._step_tokens(req, left)
                plan.append((req, n, drafts))
                seqs.append(req.seq)
                left -= n
            if not plan:
                break
            appended = kvslots.try_append_each(seqs, [n for _, n, _ in plan])
            for req, n, drafts in plan[:appended]:
                assert req.seq is not None
                stop = len(req.seq)
                scheduled.append(Scheduled(req, stop - n, stop, drafts))
                self.drafted += len(drafts)
                budget -= n
            if appended == len(plan):
                break
            req, n, drafts = plan[appended]
            positions = self._append_or_preempt(req, n)
            if positions is not None:
                scheduled.append(Scheduled(req, positions.start, positions.stop, drafts))
                self.drafted += len(drafts)
                budget -= n
            start = running.index(req) + 1

        # Then the waiting ones, first come first served (or, under `lpm`,
        # longest cached prefix first), unless this step preempted (the
        # blocks it freed are for the running requests).
        if self.preemptions == preempted:
            self.rank_waiting()
        while (
            self.waiting
            and budget > 0
            and len(self.running) < self.max_running
            and self.preemptions == preempted
        ):
            req = self.waiting[0]
            tokens = req.tokens
            seq = kvslots.Sequence(self.pool)
            keys = self.matchable_keys(req)
            hit = seq.match_prefix(keys)
            n = min(len(tokens) - len(seq), budget)
            assert n >= 1
            try:
                seq.try_reserve(n, headroom=self.headroom)
            except kvslots.Full:
                seq.close()  # gives the matched blocks back; nothing else changed
                break
            except kvslots.NeverFits:
                # Longer than the whole pool with the headroom: refused, as
                # vLLM's v0 block manager refused a prompt that left less
                # than its watermark of the whole pool free.
                seq.close()
                self.rejected.append(self.waiting.popleft())
                continue
            positions = seq.try_append(n)  # within the reservation
            self.waiting.popleft()
            req.seq = seq
            req.keys = keys[:hit]
            req.computed = hit * self.block_size
            req.hit_tokens += req.computed
            self.running.append(req)
            scheduled.append(Scheduled(req, positions.start, positions.stop))
            budget -= n

        slot_mapping: List[int] = []
        for s in scheduled:
            assert s.req.seq is not None
            slot_mapping += s.req.seq.slot_mapping(s.start, s.stop)
        return Batch(scheduled, slot_mapping)

    def update(self, batch: Batch, sampled: Dict[int, List[int]]) -> List[Request]:
        """After the model ran `batch`: records the sampled tokens (the
        accepted drafts and one more), rolls back the rejected drafts,
        publishes the full blocks the step computed, and closes finished
        requests. Returns them."""
        done = []
        for s in batch.scheduled:
            req = s.req
            assert req.seq is not None
            req.computed = s.stop
            if req.rid in sampled:
                new = sampled[req.rid]
                accepted = len(new) - 1
                self.accepted += accepted
                req.output += new
                # The rejected drafts' KV is wrong: roll it back (their
                # blocks, if any, go back to the pool).
                req.computed = s.stop - (len(s.drafts) - accepted)
                if len(req.seq) > req.computed:
                    req.seq.truncate(req.computed)
            # Publish the computed full blocks (committed tokens only).
            full = req.computed // self.block_size
            if full > len(req.keys):
                start, stop = len(req.keys) * self.block_size, full * self.block_size
                parent = req.keys[-1] if req.keys else None
                new_keys = kvslots.hash_blocks(
                    req.tokens[start:stop], self.block_size, parent=parent
                )
                req.keys += new_keys
                self.published.update(new_keys)
                # The whole chain: the sequence skips the blocks it knows
                # are cached.
                req.seq.publish(req.keys)
            if req.finished:
                req.seq.close()
                req.seq = None
                self.running.remove(req)
                done.append(req)
        return done


class Model:
    """The stand-in model runner over a flat KV memory."""

    def __init__(self, pool: kvslots.BlockPool) -> None:
        self.kv: List[int] = [-1] * (pool.num_blocks * pool.block_size)

    def execute(self, batch: Batch) -> Dict[int, List[int]]:
        # The kernel computes each scheduled token's KV from the KV before
        # it (read back through the block table) and writes it at its slot.
        slots = iter(batch.slot_mapping)
        for s in batch.scheduled:
            assert s.req.seq is not None and s.stop > s.start
            slot = s.req.seq.slot(s.start - 1) if s.start > 0 else None
            kv = 0 if slot is None else self.kv[slot]
            for token in s.tokens:
                kv = kv_step(kv, token)
                self.kv[next(slots)] = kv
        # A request whose scheduled range reaches its last token (and its
        # drafts) samples from the KV of its last positions, read back
        # through its block table: each draft that matches the model's own
        # token is accepted, and the first that does not is replaced
        # (greedy verification).
        sampled = {}
        for s in batch.scheduled:
            end = len(s.req.tokens)
            if s.stop != end + len(s.drafts):
                continue
            assert s.req.seq is not None
            new = []
            for j in range(len(s.drafts) + 1):
                slot = s.req.seq.slot(end - 1 + j)
                assert slot is not None
                token = sample(self.kv[slot])
                new.append(token)
                if j == len(s.drafts) or token != s.drafts[j]:
                    break
            sampled[s.req.rid] = new
        return sampled


def reference_output(prompt: List[int], max_new_tokens: int) -> List[int]:
    """The outputs computed from the true tokens."""
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


def workload(
    n: int, seed: int = 0, shared_prefixes: int = 3, block_size: int = 16
) -> List[Tuple[List[int], int]]:
    """`n` requests: a system prompt among `shared_prefixes` (one in four
    after another one, so that a system prompt's blocks also come at other
    offsets, after other tokens), then a user turn of its own; each with
    its number of tokens to generate."""
    rng = random.Random(seed)
    systems = [
        [rng.randrange(50_000) for _ in range(rng.randrange(2, 9) * block_size)]
        for _ in range(shared_prefixes)
    ]
    requests = []
    for _ in range(n):
        system = rng.choice(systems)
        if rng.randrange(4) == 0:
            system = rng.choice(systems) + system
        user = [rng.randrange(50_000) for _ in range(rng.randrange(1, 120))]
        requests.append((system + user, rng.randrange(1, 24)))
    return requests


@dataclass
class RunStats:
    """What a run did."""

    steps: int
    finished: int
    rejected: int
    preemptions: int
    # Speculative decoding: draft tokens scheduled, and accepted.
    drafted: int
    accepted: int
    prompt_tokens: int
    hit_tokens: int
    outputs_correct: bool
    # After every step: the router's view held as many keys as the pool had
    # cached blocks, all of them keys the scheduler published.
    router_in_sync: bool
    used_blocks_after: int
    cached_blocks_after: int


def run(
    requests: List[Tuple[List[int], int]],
    num_blocks: int = 256,
    block_size: int = 16,
    token_budget: int = 256,
    max_running: int = 32,
    headroom: int = 4,
    spec_tokens: int = 0,
    max_steps: int = 100_000,
    policy: str = "fcfs",
) -> RunStats:
    """Serves `requests` (prompt, tokens to generate) to completion."""
    pool = kvslots.BlockPool(num_blocks, block_size, kv_events=1 << 16)
    scheduler = Scheduler(pool, token_budget, max_running, headroom, spec_tokens, policy)
    model = Model(pool)
    router = Router()
    reqs = [Request(rid, prompt, max_new) for rid, (prompt, max_new) in enumerate(requests)]
    for req in reqs:
        scheduler.add(req)
    steps, finished, in_sync = 0, 0, True
    while scheduler.has_work():
        if steps == max_steps:
            raise RuntimeError(f"no progress after {steps} steps")
        batch = scheduler.schedule()
        if not batch.scheduled:
            if not scheduler.has_work():
                break  # the last requests were refused
            raise RuntimeError("nothing scheduled: the pool cannot hold one request")
        finished += len(scheduler.update(batch, model.execute(batch)))
        router.apply(pool.drain_events())
        in_sync = (
            in_sync
            and len(router.cached) == pool.cached_blocks
            and router.cached <= scheduler.published
        )
        steps += 1
    served = [req for req in reqs if req not in scheduler.rejected]
    correct = all(req.output == reference_output(req.prompt, req.max_new_tokens) for req in served)
    return RunStats(
        steps=steps,
        finished=finished,
        rejected=len(scheduler.rejected),
        preemptions=scheduler.preemptions,
        drafted=scheduler.drafted,
        accepted=scheduler.accepted,
        prompt_tokens=sum(len(req.prompt) for req in served),
        hit_tokens=sum(req.hit_tokens for req in reqs),
        outputs_correct=correct,
        router_in_sync=in_sync,
        used_blocks_after=pool.used_blocks,
        cached_blocks_after=pool.cached_blocks,
    )


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an integer of at least 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a non-negative integer, got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {value}")
    return value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--requests",
        type=positive_int,
        default=200,
        help="requests in the generated workload (default: %(default)s)",
    )
    ap.add_argument(
        "--num-blocks",
        type=positive_int,
        default=128,
        help="KV-cache blocks in the pool (default: %(default)s)",
    )
    ap.add_argument(
        "--block-size",
        type=positive_int,
        default=16,
        help="token slots a block; the workload's system prompts are 2 to 8 blocks long"
        " (default: %(default)s)",
    )
    ap.add_argument(
        "--token-budget",
        type=positive_int,
        default=256,
        help="tokens scheduled a step, prefill and decode together (default: %(default)s)",
    )
    ap.add_argument(
        "--max-running",
        type=positive_int,
        default=32,
        help="requests running at once (default: %(default)s)",
    )
    ap.add_argument(
        "--headroom",
        type=non_negative_int,
        default=4,
        help="blocks an admission leaves free for the running requests to grow"
        " (default: %(default)s)",
    )
    ap.add_argument(
        "--spec-tokens",
        type=non_negative_int,
        default=0,
        help="draft tokens a decode step, for speculative decoding; 0 turns it off"
        " (default: %(default)s)",
    )
    ap.add_argument(
        "--policy",
        choices=POLICIES,
        default="fcfs",
        help="admission order: arrival (fcfs) or the longest cached prefix first (lpm)"
        " (default: %(default)s)",
    )
    ap.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the generated workload (default: %(default)s)",
    )
    args = ap.parse_args()
    if args.num_blocks > kvslots.BlockPool.MAX_BLOCKS:
        ap.error(
            f"argument --num-blocks: at most {kvslots.BlockPool.MAX_BLOCKS}, got {args.num_blocks}"
        )
    stats = run(
        workload(args.requests, args.seed, block_size=args.block_size),
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        token_budget=args.token_budget,
        max_running=args.max_running,
        headroom=args.headroom,
        spec_tokens=args.spec_tokens,
        policy=args.policy,
    )
    if stats.finished == 0:
        # Every request was refused: nothing was served, so nothing was
        # checked, and "outputs_correct: True" would claim a pass.
        print(
            f"error: no request finished: all {stats.rejected} were refused, the pool"
            f" ({args.num_blocks} blocks of {args.block_size} tokens, {args.headroom} kept"
            " free at admission) cannot hold any of them; nothing was checked"
            " (try a larger --num-blocks or a smaller --headroom)",
            file=sys.stderr,
        )
        return 1
    for name, value in vars(stats).items():
        print(f"{name:>20}: {value}")
    ok = stats.outputs_correct and stats.router_in_sync and stats.used_blocks_after == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
