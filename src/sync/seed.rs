//! The words that key a pool's index hash.

/// The seed under the model checkers: SHA-512's initial state (FIPS 180-4,
/// section 5.3.5), eight words with no structure chosen here.
#[cfg_attr(not(any(kvslots_shuttle, test)), allow(dead_code))]
pub(crate) const MODEL_SEED: [u64; 8] = [
    0x6a09_e667_f3bc_c908,
    0xbb67_ae85_84ca_a73b,
    0x3c6e_f372_fe94_f82b,
    0xa54f_f53a_5f1d_36f1,
    0x510e_527f_ade6_82d1,
    0x9b05_688c_2b3e_6c1f,
    0x1f83_d9ab_fb41_bd6b,
    0x5be0_cd19_137e_2179,
];

/// Eight words that key one pool's index hash (see `crate::pool`'s
/// `keys`).
///
/// In a normal build they are random and differ from pool to pool: the
/// hashes of the integers 0 to 7 under a fresh `RandomState` of `std`
/// (SipHash-1-3 keys drawn from the operating system once per thread and
/// advanced for every new state). Under loom and shuttle they are
/// [`MODEL_SEED`], so that every execution of a model puts every key in the
/// same buckets and a failing schedule replays.
pub(crate) fn index_seed() -> [u64; 8] {
    #[cfg(any(all(test, kvslots_loom), kvslots_shuttle))]
    {
        MODEL_SEED
    }
    #[cfg(not(any(all(test, kvslots_loom), kvslots_shuttle)))]
    {
        use std::collections::hash_map::RandomState;
        use std::hash::BuildHasher;
        let state = RandomState::new();
        std::array::from_fn(|i| state.hash_one(i as u64))
    }
}
