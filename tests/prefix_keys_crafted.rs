//! Crafted key families against the keyed index (2.5 slots a
//! block, two buckets): a whole pool of such keys must publish, round
//! after round of evictions.

use std::sync::Arc;

use kvslots::{BlockHash, BlockPool, Sequence};

fn words(w: [u64; 4]) -> BlockHash {
    let mut b = [0u8; 32];
    for (i, x) in w.iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&x.to_le_bytes());
    }
    BlockHash(b)
}

/// Key `c` of family `style`.
fn key(style: usize, c: u64) -> BlockHash {
    match style {
        // Only the last byte(s) differ.
        0 => {
            let mut b = [0xAAu8; 32];
            b[31] = c as u8;
            b[30] = (c >> 8) as u8;
            b[29] = (c >> 16) as u8;
            BlockHash(b)
        }
        // Equal first three words; counter in word 3.
        1 => words([7, 7, 7, c]),
        // Counter in word 0 only; the rest zero (c == 0 is all-zero).
        2 => words([c, 0, 0, 0]),
        // The same counter in every word.
        3 => words([c; 4]),
        // Only the top bits of words 0 and 2 vary.
        4 => words([c << 48, 0, (c * 3) << 48, 0]),
        // Words 0 and 1 swapped pairs, words 2 and 3 equal.
        5 => words([c, !c, 5, 5]),
        // Powers of two, then sums of two.
        6 => {
            let (i, j) = ((c % 64) as u32, ((c / 64) % 64) as u32);
            words([1u64 << i, 1u64 << j, (c / 4096).wrapping_mul(0x100), 0])
        }
        // Multiples of a large power of two in words 1 and 3 (products with
        // many low zero bits).
        _ => words([0, c << 32, 0, c << 40]),
    }
}

const STYLES: usize = 8;

#[test]
fn crafted_key_families_publish_whole_pools() {
    for &n in &[8usize, 100, 4096] {
        for style in 0..STYLES {
            let pool = Arc::new(BlockPool::new(n, 1));
            for round in 0..6u64 {
                let mut seq = Sequence::new(Arc::clone(&pool));
                seq.try_append(n).unwrap();
                let keys: Vec<BlockHash> = (0..n as u64)
                    .map(|i| key(style, round * n as u64 + i))
                    .collect();
                let got = seq.publish(&keys);
                assert_eq!(got, n, "n {n} style {style} round {round}: refused");
                drop(seq);
                // Every key matches its block.
                let mut m = Sequence::new(Arc::clone(&pool));
                assert_eq!(m.try_match_prefix(&keys), n, "n {n} style {style}");
            }
        }
    }
}
