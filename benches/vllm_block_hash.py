#!/usr/bin/env python3
"""Times the block-key chain vLLM computes in Python, per 16-token block.

vLLM's automatic prefix caching keys block i by

    hashlib.sha256(pickle.dumps((parent, tuple(tokens), extra),
                                protocol=pickle.HIGHEST_PROTOCOL)).digest()

where `parent` is block i-1's key (a fixed 32-byte value for block 0),
`tokens` the block's token ids and `extra` the extra keys (None for a plain
text prompt). This script runs that chain over the prompt `benches/hash.rs`
uses (2,048 tokens, blocks of 16, so 128 blocks) and prints the best time per
block over several repeats, as `timeit` does. Standard library only.

Usage: python3 benches/vllm_block_hash.py [--repeats N] [--number N]
"""

import argparse
import hashlib
import pickle
import time

PROMPT = 2048
BLOCK = 16
# vLLM seeds block 0's parent with a fixed 32-byte value.
NONE_HASH = hashlib.sha256(b"kvslots-bench-none-hash").digest()


def prompt():
    """The benchmark prompt: the same token ids as benches/hash.rs."""
    return [(i * 2654435761 % 2**32) % 151936 for i in range(PROMPT)]


def hash_block_tokens(parent, block_tokens, extra_keys):
    """One block's key, as vLLM's `hash_block_tokens` with `sha256`."""
    if not parent:
        parent = NONE_HASH
    data = pickle.dumps(
        (parent, tuple(block_tokens), extra_keys), protocol=pickle.HIGHEST_PROTOCOL
    )
    return hashlib.sha256(data).digest()


def hash_request_tokens(tokens, block_size):
    """The keys of a prompt's full blocks, as vLLM's `hash_request_tokens`."""
    keys = []
    parent = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, tokens[start : start + block_size], None)
        keys.append(parent)
    return keys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed runs; the best is reported")
    parser.add_argument("--number", type=int, default=200, help="prompts hashed per run")
    args = parser.parse_args()

    tokens = prompt()
    blocks = PROMPT // BLOCK
    keys = hash_request_tokens(tokens, BLOCK)
    assert len(keys) == blocks and len(set(keys)) == blocks

    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.number):
            hash_request_tokens(tokens, BLOCK)
        elapsed = time.perf_counter() - start
        best = min(best, elapsed / (args.number * blocks))
    print(
        f"vllm sha256(pickle) chain: {best * 1e6:.3f} us per {BLOCK}-token block "
        f"(best of {args.repeats} runs of {args.number} x {PROMPT}-token prompts)"
    )


if __name__ == "__main__":
    main()
