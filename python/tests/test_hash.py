"""hash_blocks: the same keys as Rust's `kvslots::hash_blocks` (the known
answers of the core crate's test, computed by an independent
implementation), from every accepted form of tokens, and bad input."""

import array
import sys

import pytest

import kvslots
from conftest import run_python

# The core crate's known-answer vectors (src/hash.rs,
# `known_answer_matches_an_independent_implementation`).
TOKENS = [(i * 2654435761) % 2**32 % 151936 for i in range(48)]
KEY0 = "f909d3b2c083902e4dd98290982cbf2361f2b2ebc810bbabc0acfd0d53ee3a77"
KEY2 = "c90dca8fad9e5d60e70b6fe76ebd247c6663218057fbe45039c62809fa25315d"
KEY1_BY20 = "4cbbfd963a2c398abcbd2e60897ca73a8109b0dba2beb3c5f5173a54bba4edc1"


def test_known_answers_match_rust():
    keys = kvslots.hash_blocks(TOKENS, 16, b"tenant")
    assert [len(k) for k in keys] == [32, 32, 32]
    assert (keys[0].hex(), keys[2].hex()) == (KEY0, KEY2)
    assert kvslots.hash_blocks(TOKENS, 20, salt=b"tenant")[1].hex() == KEY1_BY20


def test_every_token_form_gives_the_same_keys():
    want = kvslots.hash_blocks(TOKENS, 16, b"tenant")
    raw = b"".join(t.to_bytes(4, "little") for t in TOKENS)
    forms = [tuple(TOKENS), iter(TOKENS), raw, bytearray(raw), memoryview(raw),
             array.array("I", TOKENS), array.array("q", TOKENS), array.array("H", [0] * 0)]
    for form in forms[:-1]:
        assert kvslots.hash_blocks(form, 16, b"tenant") == want, type(form)
    assert kvslots.hash_blocks(forms[-1], 16) == []


def test_numpy_arrays():
    np = pytest.importorskip("numpy")
    want = kvslots.hash_blocks(TOKENS, 16, b"tenant")
    for dtype in (np.int32, np.uint32, np.int64, np.uint64, np.int16):
        if dtype is np.int16:
            small = [t % 30000 for t in TOKENS]
            assert kvslots.hash_blocks(np.array(small, dtype), 16) == kvslots.hash_blocks(small, 16)
        else:
            assert kvslots.hash_blocks(np.array(TOKENS, dtype), 16, b"tenant") == want
    with pytest.raises(ValueError):
        kvslots.hash_blocks(np.array([1, -2] * 8, np.int64), 16)
    with pytest.raises(ValueError):
        kvslots.hash_blocks(np.zeros((4, 4), np.int32), 4)
    with pytest.raises(TypeError):
        kvslots.hash_blocks(np.zeros(16, np.float32), 16)


def test_numpy_arrays_of_either_byte_order():
    np = pytest.importorskip("numpy")
    want = kvslots.hash_blocks(TOKENS, 16, b"tenant")
    for dtype in (">i4", "<i4", ">u4", "<u4", ">i8", "<u8", "=i4", ">u2", "<i2"):
        tokens = [t % 30000 for t in TOKENS] if dtype[-1] == "2" else TOKENS
        got = kvslots.hash_blocks(np.array(tokens, dtype), 16, b"tenant")
        assert got == kvslots.hash_blocks(tokens, 16, b"tenant"), dtype
    assert kvslots.hash_blocks(np.array(TOKENS, ">u4"), 16, b"tenant") == want
    # Signed items are sign-extended in their own byte order.
    for dtype in (">i2", "<i2", ">i4", ">i8", "i1"):
        with pytest.raises(ValueError, match="got -2"):
            kvslots.hash_blocks(np.array([1, -2] * 8, dtype), 16)


def test_a_zero_dimensional_buffer_is_refused():
    np = pytest.importorskip("numpy")
    for obj in (np.array(5, np.uint32), memoryview(b"abcd").cast("I", shape=[])):
        with pytest.raises(ValueError, match="one-dimensional, got 0"):
            kvslots.hash_blocks(obj, 1)
        with pytest.raises(ValueError, match="one-dimensional, got 0"):
            kvslots.hash_blocks_packed(obj, 1)


def test_chain_structure():
    keys = kvslots.hash_blocks(list(range(40)), 16)
    assert len(keys) == 2  # a partly filled block gets no key
    longer = kvslots.hash_blocks(list(range(32)) + [7] * 16, 16)
    assert longer[:2] == keys
    assert kvslots.hash_blocks(list(range(40)), 16, b"other")[0] != keys[0]
    # parent continues the chain: decode keys its blocks as they fill.
    assert kvslots.hash_blocks(list(range(16, 32)), 16, parent=keys[0]) == keys[1:]
    assert kvslots.hash_blocks([], 16) == []


@pytest.mark.parametrize(
    "args, kwargs, error",
    [
        (([1, 2], 0), {}, ValueError),
        (([1, 2], -1), {}, ValueError),
        (([1, -2], 1), {}, ValueError),
        (([1, 2**32], 1), {}, ValueError),
        (([1, 2.0], 1), {}, TypeError),
        ((["a"], 1), {}, TypeError),
        (("abc", 1), {}, TypeError),
        ((b"abc", 1), {}, ValueError),  # not whole uint32s
        (([1], 1), {"parent": b"short"}, ValueError),
        (([1], 1), {"parent": bytes(32), "salt": b"s"}, ValueError),
        (([1], 1), {"salt": "s"}, TypeError),
        (([1], 1.0), {}, TypeError),
        (({1, 2}, 1), {}, TypeError),  # a set's order is arbitrary
        ((frozenset([1, 2]), 1), {}, TypeError),
    ],
)
def test_bad_input_raises(args, kwargs, error):
    with pytest.raises(error):
        kvslots.hash_blocks(*args, **kwargs)


def test_packed_keys_are_the_keys_end_to_end():
    keys = kvslots.hash_blocks(TOKENS, 16, b"tenant")
    packed = kvslots.hash_blocks_packed(TOKENS, 16, b"tenant")
    assert isinstance(packed, bytes) and packed == b"".join(keys)
    assert kvslots.hash_blocks_packed(TOKENS[16:], 16, parent=keys[0]) == b"".join(keys[1:])
    assert kvslots.hash_blocks_packed([], 16) == b""
    with pytest.raises(ValueError):
        kvslots.hash_blocks_packed([1], 0)


KEYS_OUT_OF_MEMORY = """
import array
import resource
import kvslots

n = 1 << 21
tokens = array.array("I", range(n)).tobytes()
# The address space now, plus 110 MiB: room for the tokens' copy and the
# keys on the Rust side (72 MiB), not for 2 million `bytes` objects of 32
# bytes each (about 144 MiB).
ROOM = 110 << 20
with open("/proc/self/statm") as f:
    pages = int(f.read().split()[0])
now = pages * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (now + ROOM, resource.RLIM_INFINITY))
try:
    keys = kvslots.hash_blocks(tokens, 1)
    print("built", len(keys))
except MemoryError:
    print("MemoryError")
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print(len(kvslots.hash_blocks(tokens[:4096 * 4], 1)))
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc, limits RLIMIT_AS"
)
def test_a_key_list_that_does_not_fit_is_a_memory_error():
    # PyO3's `bytes` constructor panics when Python cannot allocate; each
    # key is made by a call that reports it instead.
    r = run_python(KEYS_OUT_OF_MEMORY, timeout=30)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert r.stdout.splitlines() == ["MemoryError", "4096"], out
