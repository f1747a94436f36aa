//! `KvGroup::first_needed_block` and `KvGroup::first_len_from` at the
//! extremes (lengths, block sizes, windows and chunks near `usize::MAX`,
//! chunks and windows of 1, sizes that are no multiple of the block
//! size), against references computed in `u128`.

use super::KvGroup;
use proptest::prelude::*;

const M: u128 = usize::MAX as u128;

/// Reference: the block of the first position the token at `len` reads.
fn need_ref(kind: KvGroup, len: usize, bs: usize) -> u128 {
    let (len, bs) = (len as u128, bs as u128);
    match kind {
        KvGroup::Full => 0,
        KvGroup::SlidingWindow { window_tokens } => {
            (len + 1).saturating_sub(window_tokens as u128) / bs
        }
        KvGroup::ChunkedLocal { chunk_tokens } => {
            let c = chunk_tokens.max(1) as u128;
            (len / c * c) / bs
        }
    }
}

/// Reference: the shortest len with need(len) >= block, saturating at MAX.
fn first_len_ref(kind: KvGroup, block: usize, bs: usize) -> u128 {
    if block == 0 {
        return 0;
    }
    let start = block as u128 * bs as u128;
    let l = match kind {
        KvGroup::Full => 0,
        KvGroup::SlidingWindow { window_tokens } => start + window_tokens as u128 - 1,
        KvGroup::ChunkedLocal { chunk_tokens } => {
            let c = chunk_tokens.max(1) as u128;
            start.div_ceil(c) * c
        }
    };
    l.min(M)
}

fn interesting() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..40,
        Just(usize::MAX),
        Just(usize::MAX - 1),
        Just(usize::MAX / 2),
        Just(usize::MAX / 2 + 1),
        Just(usize::MAX / 3),
        (usize::MAX - 64..=usize::MAX),
        (usize::MAX / 2 - 64..usize::MAX / 2 + 64),
        any::<usize>(),
        (1usize..1 << 20),
    ]
}

fn kind() -> impl Strategy<Value = KvGroup> {
    prop_oneof![
        interesting().prop_map(|c| KvGroup::ChunkedLocal {
            chunk_tokens: c.max(1)
        }),
        interesting().prop_map(|w| KvGroup::SlidingWindow {
            window_tokens: w.max(1)
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 20000, ..ProptestConfig::default() })]

    #[test]
    fn first_needed_block_matches_reference_and_is_monotone(
        kind in kind(), len in interesting(), bs in interesting(),
    ) {
        let bs = bs.max(1);
        let got = kind.first_needed_block(len, bs);
        prop_assert_eq!(got as u128, need_ref(kind, len, bs));
        if len < usize::MAX {
            prop_assert!(kind.first_needed_block(len + 1, bs) >= got);
        }
        // Never past the block of position len itself.
        prop_assert!(got <= len / bs);
    }

    #[test]
    fn first_len_from_is_the_shortest(
        kind in kind(), block in interesting(), bs in interesting(),
    ) {
        let bs = bs.max(1);
        let got = kind.first_len_from(block, bs);
        prop_assert_eq!(got as u128, first_len_ref(kind, block, bs), "{:?} block {} bs {}", kind, block, bs);
        // Direct check of "shortest": need(got) >= block unless saturated
        // with no length at all reaching `block`.
        if kind.first_needed_block(usize::MAX, bs) >= block {
            prop_assert!(kind.first_needed_block(got, bs) >= block);
            if got > 0 {
                prop_assert!(kind.first_needed_block(got - 1, bs) < block);
            }
        } else {
            prop_assert_eq!(got, usize::MAX);
        }
    }
}

#[test]
fn chunk_of_one_and_block_of_one() {
    let c = KvGroup::ChunkedLocal { chunk_tokens: 1 };
    for len in [0usize, 1, 7, usize::MAX - 1, usize::MAX] {
        assert_eq!(c.first_needed_block(len, 1), len);
        assert_eq!(c.first_len_from(len, 1), len);
    }
    let big = KvGroup::ChunkedLocal {
        chunk_tokens: usize::MAX,
    };
    assert_eq!(big.first_needed_block(usize::MAX - 1, 1), 0);
    assert_eq!(big.first_needed_block(usize::MAX, 1), usize::MAX);
    assert_eq!(big.first_len_from(1, 1), usize::MAX);
    let half = KvGroup::ChunkedLocal {
        chunk_tokens: usize::MAX / 2 + 1,
    };
    // 2^62, the block of position 2^63 in blocks of 2.
    let quarter = 1usize << (usize::BITS - 2);
    assert_eq!(half.first_needed_block(usize::MAX, 2), quarter);
    assert_eq!(half.first_len_from(1, 2), usize::MAX / 2 + 1);
    assert_eq!(half.first_len_from(quarter + 1, 2), usize::MAX);
}

#[test]
#[should_panic]
fn chunked_block_size_zero_panics() {
    let _ = std::hint::black_box(KvGroup::ChunkedLocal { chunk_tokens: 8 })
        .first_needed_block(5, std::hint::black_box(0));
}

/// A sliding window whose start (`block * block_size`) or end passes
/// `usize::MAX`: no length reaches the block, and the answer saturates.
#[test]
fn sliding_first_len_from_saturates_at_max() {
    let w = KvGroup::SlidingWindow { window_tokens: 1 };
    assert_eq!(w.first_len_from(2, 1 << 63), usize::MAX);
    // And a window whose end passes usize::MAX: the answer is usize::MAX
    // (need(MAX - 1) == 0), the function says MAX - 1.
    let w = KvGroup::SlidingWindow {
        window_tokens: usize::MAX,
    };
    assert_eq!(w.first_needed_block(usize::MAX - 1, 1), 0);
    assert_eq!(w.first_len_from(1, 1), usize::MAX);
}
