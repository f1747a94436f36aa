//! Requests on chains of block keys whose blocks carry checked content,
//! for the real-thread tests of the prefix cache's eviction ring
//! (`refill_attack`, `stale_candidates`): a writer stores its key's tag in
//! each block it appends before publishing, and whoever matches a block
//! checks the tag, so a block handed out while cached, or a match of a
//! block that holds another key, shows up as a wrong tag.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kvslots::{BlockHash, BlockPool, Sequence};

/// The content a block holding key `n` of chain `c` carries (never 0).
pub fn tag(c: u64, n: u64) -> u64 {
    (c << 20) | (n + 1)
}

/// One request for chain `chain`, whose keys are `keys`: matches its
/// cached prefix and checks each matched block's tag, appends the rest
/// (panicking with the pool's counts if that fails: the callers stay
/// within their budgets, so an append must succeed), writes their tags
/// and publishes every key. Returns the sequence, how many blocks it
/// matched and how many its publish cached (all the others, unless a
/// rival's copy of the chain won a key). `what` names the request in the
/// panics.
pub fn request(
    pool: &Arc<BlockPool>,
    content: &[AtomicU64],
    chain: u64,
    keys: &[BlockHash],
    what: &str,
) -> (Sequence, usize, usize) {
    let len = keys.len();
    let mut s = Sequence::new(Arc::clone(pool));
    let matched = s.try_match_prefix(keys);
    assert!(matched <= len, "{what}: matched {matched} of {len}");
    for (i, &b) in s.blocks().iter().enumerate() {
        // Acquire: pairs with the Release store of the publisher
        // (published after, so the match sees it anyway).
        let got = content[b.index()].load(Ordering::Acquire);
        assert_eq!(
            got,
            tag(chain, i as u64),
            "{what}: matched block {b} (key {i} of chain {chain}) holds another key's content"
        );
    }
    if let Err(e) = s.try_append(len - matched) {
        panic!(
            "{what}: appending {} blocks failed ({e:?}) within budget: free {} used {} evictable {}",
            len - matched,
            pool.free_blocks(),
            pool.used_blocks(),
            pool.evictable_blocks()
        );
    }
    for (i, &b) in s.blocks().iter().enumerate().skip(matched) {
        // Release: the tag is visible to whoever matches the block after
        // the publish below.
        content[b.index()].store(tag(chain, i as u64), Ordering::Release);
    }
    let cached = s.publish(keys);
    (s, matched, cached)
}
