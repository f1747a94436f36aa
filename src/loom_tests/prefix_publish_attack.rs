//! Loom models that attack the prefix cache's publish protocol: rivals
//! that are reclaimed, killed or deferred to while a publisher rescans.
//!
//! Run with `scripts/loom prefix_publish_attack`.

use crate::loom_tests::pool_world::{holder_gone_then_publish, ARMED_CLAIM, SOUND};
use crate::sync::Faults;
use crate::BlockHash;

/// Three one-token blocks: holder `c`, rival `r` and publisher `p`, with
/// `r < p`. The holder publishes key `K` while the rival does; the rival's
/// publish of `K` loses to the holder (or wins), and the rival then
/// publishes another key `K2` on the same block (its tokens were
/// rewritten: a legitimate second publish of an uncached block). The
/// holder goes (its key reset), and only then does `p` publish `K`. `p`
/// must not lose to the rival's claim of `K2`: the key ends on a block.
fn rival_reclaimed_for_another_key(faults: Faults) {
    holder_gone_then_publish(faults, Some(BlockHash([2; 32])));
}

#[test]
fn a_rival_reclaimed_for_another_key_is_no_reason_to_lose() {
    rival_reclaimed_for_another_key(SOUND);
}

/// A claim that is a rival before its key words are written: the rescan
/// of `p` finds the entry the rival's claim of `K` left, reads the state
/// of its claim of `K2` with the key words of `K`, and defers to it (or
/// loses to its commit).
#[test]
#[should_panic(expected = "nobody holds the key")]
fn a_rival_reclaimed_for_another_key_armed_claim_is_caught() {
    rival_reclaimed_for_another_key(ARMED_CLAIM);
}
