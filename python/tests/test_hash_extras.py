"""hash_blocks with extras (LoRA, cache salt, multimodal, custom): the same
keys as Rust's `kvslots::hash_blocks_with` (the known answers of
`src/hash.rs`'s `extras_known_answer_matches_an_independent_implementation`),
continued block by block after a parent as the whole prompt's, and every bad
extra refused with the right error."""

import pytest

import kvslots

# `src/hash.rs`'s `kat_tokens`: `i.wrapping_mul(2_654_435_761) % 151_936`.
TOKENS = [((i * 2654435761) % 2**32) % 151936 for i in range(48)]

KAT_A = [
    "94e7509a9db52b019057590a88e771065042d58f5291b259d381380aa702089f",
    "2ee537a755baa103471efbea0fcc29c325dfbad1adb41ff263a9d6c1bf4e58f2",
    "91e622a80a8a8f893223a78a67340b673c4eabab04d7ee7eb1daece554d65004",
]
KAT_B = [
    "33782e56e8ed590402efdce51ad19933021adc98d603edad876b26bb10dd2548",
    "e5258e4af6b44fe51193f13fe448dc89c7cba419ee8ba349523d43c337038adc",
]


def test_extras_match_rusts_known_answers():
    a = kvslots.hash_blocks(
        TOKENS,
        16,
        b"tenant",
        lora=b"adapter-1",
        cache_salt=b"user-7",
        multimodal=[(b"img-0", 20, 20)],
    )
    assert [k.hex() for k in a] == KAT_A
    # str is taken as UTF-8, bytearray as bytes; a tuple of items as a list.
    again = kvslots.hash_blocks(
        TOKENS,
        16,
        b"tenant",
        lora="adapter-1",
        cache_salt=bytearray(b"user-7"),
        multimodal=((b"img-0", 20, 20),),
    )
    assert again == a
    b = kvslots.hash_blocks(
        TOKENS,
        20,
        b"tenant",
        custom=[(b"prompt_embeds", bytes([1, 2, 3]), 0, 20)],
        multimodal=[(b"x" * 40, 25, 35)],
    )
    assert [k.hex() for k in b] == KAT_B
    packed = kvslots.hash_blocks_packed(
        TOKENS,
        16,
        b"tenant",
        lora=b"adapter-1",
        cache_salt=b"user-7",
        multimodal=[(b"img-0", 20, 20)],
    )
    assert packed == b"".join(a)


def test_extras_apply_where_they_say():
    plain = kvslots.hash_blocks(TOKENS, 16)
    # No extras, and empty lists of them: the plain keys.
    assert kvslots.hash_blocks(TOKENS, 16, multimodal=[], custom=()) == plain
    # An image on block 1 only: block 0 shared; block 1 and, through the
    # chain, block 2 differ.
    image = kvslots.hash_blocks(TOKENS, 16, multimodal=[(b"img", 16, 10)])
    assert image[0] == plain[0] and image[1] != plain[1] and image[2] != plain[2]
    # Whole-prompt extras change every key, each kind differently.
    kinds = [
        kvslots.hash_blocks(TOKENS, 16, lora=b"x"),
        kvslots.hash_blocks(TOKENS, 16, cache_salt=b"x"),
        kvslots.hash_blocks(TOKENS, 16, multimodal=[(b"x", 0, 48)]),
        kvslots.hash_blocks(TOKENS, 16, custom=[(b"t", b"x", 0, 48)]),
    ]
    for keys in kinds:
        assert all(k != p for k, p in zip(keys, plain))
    assert len({keys[0] for keys in kinds}) == 4
    # An image past the full blocks enters no key.
    assert kvslots.hash_blocks(TOKENS, 16, multimodal=[(b"x", 48, 5)]) == plain


def test_a_parent_with_a_start_continues_the_whole_prompts_keys():
    extras = dict(lora=b"a", multimodal=[(b"img", 20, 20)], custom=[(b"t", b"v", 40, 1)])
    whole = kvslots.hash_blocks(TOKENS, 16, b"s", **extras)
    for cut in (1, 2):
        rest = kvslots.hash_blocks(
            TOKENS[16 * cut :], 16, parent=whole[cut - 1], start=16 * cut, **extras
        )
        assert rest == whole[cut:]
        packed = kvslots.hash_blocks_packed(
            TOKENS[16 * cut :], 16, parent=whole[cut - 1], start=16 * cut, **extras
        )
        assert packed == b"".join(whole[cut:])
    # Without extras, a start with a parent changes nothing.
    plain = kvslots.hash_blocks(TOKENS, 16, b"s")
    assert kvslots.hash_blocks(TOKENS[16:], 16, parent=plain[0], start=16) == plain[1:]


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"lora": 5}, TypeError, "lora must be bytes"),
        ({"cache_salt": [1]}, TypeError, "cache_salt must be bytes"),
        ({"multimodal": [b"img"]}, TypeError, "must be a tuple"),
        ({"multimodal": [[b"img", 0, 4]]}, TypeError, "must be a tuple"),
        ({"multimodal": [(b"img", 0)]}, ValueError, "got 2 fields"),
        ({"multimodal": [(b"img", 4, 0)]}, ValueError, "multimodal length must be at least 1"),
        ({"multimodal": [(b"img", -1, 4)]}, ValueError, ">= 0"),
        ({"multimodal": [(b"img", 1.0, 4)]}, TypeError, "offset must be an int"),
        ({"multimodal": [(5, 0, 4)]}, TypeError, "multimodal hash must be bytes"),
        ({"multimodal": [(b"img", 2**63, 2**63)]}, OverflowError, "past the largest"),
        ({"multimodal": [(b"img", 2**64, 1)]}, OverflowError, "too large"),
        ({"multimodal": {(b"img", 0, 4)}}, TypeError, "ordered"),
        ({"custom": [(b"t", b"v", 0)]}, ValueError, "got 3 fields"),
        ({"custom": [(b"t", None, 0, 4)]}, TypeError, "custom extra's bytes"),
        ({"custom": [(b"t", b"v", 3, 0)]}, ValueError, "custom length must be at least 1"),
        ({"start": 16}, ValueError, "with parent"),
        ({"parent": bytes(32), "start": 0}, ValueError, "positive multiple"),
        ({"parent": bytes(32), "start": 8}, ValueError, "positive multiple"),
        ({"parent": bytes(32), "lora": b"a"}, ValueError, "pass start"),
        ({"parent": bytes(32), "start": -16}, ValueError, ">= 0"),
    ],
)
def test_bad_extras_raise(kwargs, error, words):
    for f in (kvslots.hash_blocks, kvslots.hash_blocks_packed):
        with pytest.raises(error) as e:
            f(TOKENS, 16, **kwargs)
        assert words in str(e.value)
