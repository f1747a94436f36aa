//! Loom models of the prefix cache's eviction ring: an evictor taking
//! its candidates while another evictor refills the ring, and a release
//! racing a refill of an overflowed ring, each in a ring of as many slots
//! as blocks and in one with a slot of stale room; a release racing a
//! refill's placing pass; and a release whose append reads the
//! overflowed bit clear while a refill publishes its buckets one at a
//! time. Each has a negative control that loom must catch.
//!
//! Run with `scripts/loom prefix_evict`.
//!
//! Every model but the first has long executions (several evictions, a
//! refill, and the steps before or after the race): they raise loom's
//! bound on an execution's branches to 20,000 (`check_long`).
//!
//! # The models
//!
//! | model | threads, blocks | control (caught by) |
//! |---|---|---|
//! | [`refill_vs_claimed_candidate`] | 2, 3 | `claim_before_read` (evicted out of order) |
//! | [`release_vs_refill_keeps_overflowed`] | 2, 3 | `unchecked_overflow_clear` (evicted out of order) |
//! | [`stale_room_refill_vs_claimed_candidate`] | 2, 4 | `claim_before_read` (evicted out of order) |
//! | [`stale_room_release_vs_refill_keeps_overflowed`] | 2, 4 | `unchecked_overflow_clear` (evicted out of order) |
//! | [`release_in_a_full_range`] | 2, 3 | `fill_counts_first_pass` (evicted out of order) |
//! | [`release_between_refill_buckets`] | 2, 3 | `no_rescan_after_raced_publish` (evicted out of order) |
//! | [`release_before_deferred_publish`] (3 keys) | 2, 4 | `no_rescan_after_raced_publish` (evicted out of order) |
//! | [`release_before_deferred_publish`] (4 keys) | 2, 5 | `no_rescan_after_raced_publish` (evicted out of order) |
//!
//! A pool of 3 blocks has a ring of 3 slots. Its candidates' positions
//! only grow, position `p` in slot `p % 3`, and a refill writes the
//! positions after the ring's length, up to a whole ring past the next
//! candidate to take: the slots of positions already taken. An evictor
//! copies its candidates and then claims their positions; a refill that
//! reads the claim (`Acquire`, the claim's CAS is `Release`) may rewrite
//! those slots, after the copy. The control claims first and copies
//! after: a refill that begins in between rewrites the slot with the
//! youngest block, which the evictor then takes.
//!
//! A pool of 4 blocks has a ring of 5 slots (a slot for each block and
//! one of stale room for every 4 blocks). The `stale_room_` models run
//! the same races in it, with the ring's fifth slot holding a revived
//! block's new candidate (so that a second revival overflows the ring),
//! and check the ring's capacity, fullness and overflow as they set it
//! up. There a refill reaches a claimed position's slot only with its
//! fourth entry, a whole ring past the claim: in
//! [`stale_room_refill_vs_claimed_candidate`] the candidate left after
//! the claim is stale and the claimed block is not evicted yet, so that
//! all four blocks are evictable without a current candidate.
//!
//! The model also checks that every block comes back: free and
//! admissible, once every sequence is gone.
use std::sync::Arc;

use crate::loom_tests::pool_world::{
    check, check_long, CLAIM_BEFORE_READ, FILL_COUNTS_FIRST_PASS, LOST,
    NO_RESCAN_AFTER_RACED_PUBLISH, SOUND, UNCHECKED_OVERFLOW_CLEAR,
};
use crate::sync::Faults;
use crate::{BlockHash, BlockPool, Sequence};
use loom::thread;

/// An eviction took a younger block while an older one stayed cached.
const OUT_OF_ORDER: &str = "evicted out of order";

/// Key number `n`.
fn key(n: u8) -> BlockHash {
    BlockHash([n; 32])
}

/// Keys `keys` published on blocks 0, 1 and 2 of `pool` (three free
/// one-token blocks) and let go, then each matched by a sequence of its
/// own, returned in the order of `keys`.
fn three_matched(pool: &Arc<BlockPool>, keys: [u8; 3]) -> [Sequence; 3] {
    let mut first = Sequence::new(Arc::clone(pool));
    first.try_append(3).expect("three blocks");
    let ids: Vec<usize> = first.blocks().iter().map(|id| id.index()).collect();
    assert_eq!(ids, [0, 1, 2], "keys {keys:?} on blocks 0, 1, 2");
    assert_eq!(first.publish(&keys.map(key)), 3);
    drop(first);
    keys.map(|n| {
        let mut seq = Sequence::new(Arc::clone(pool));
        assert_eq!(seq.try_match_prefix(&[key(n)]), 1);
        seq
    })
}

/// A sequence of one block published under key `n` (one token a block).
fn published(pool: &Arc<BlockPool>, n: u8) -> Sequence {
    let mut seq = Sequence::new(Arc::clone(pool));
    seq.try_append(1).expect("a block for the key");
    assert_eq!(seq.publish(&[key(n)]), 1);
    seq
}

/// Whether key `n` is cached now (a match, let go at once).
fn cached(pool: &Arc<BlockPool>, n: u8) -> bool {
    Sequence::new(Arc::clone(pool)).try_match_prefix(&[key(n)]) == 1
}

/// The keys of `keys` cached now.
fn kept(pool: &Arc<BlockPool>, keys: impl IntoIterator<Item = u8>) -> Vec<u8> {
    keys.into_iter().filter(|&n| cached(pool, n)).collect()
}

/// Two threads each allocate one block (evicting, the pool being full);
/// returns their sequences once both are done.
fn two_evictors(pool: &Arc<BlockPool>) -> Vec<Sequence> {
    let evictors: Vec<_> = (0..2)
        .map(|_| {
            let pool = Arc::clone(pool);
            thread::spawn(move || {
                let mut seq = Sequence::new(pool);
                seq.try_append(1).expect("an evictable block");
                seq
            })
        })
        .collect();
    evictors.into_iter().map(|e| e.join().unwrap()).collect()
}

/// One thread allocates `k` blocks (evicting) while another lets `held`
/// go; both done, returns the sequence holding the allocated blocks.
fn evict_while_released(pool: &Arc<BlockPool>, k: usize, held: Sequence) -> Sequence {
    let evictor = {
        let pool = Arc::clone(pool);
        thread::spawn(move || {
            let mut seq = Sequence::new(pool);
            seq.try_append(k).expect("evictable blocks");
            seq
        })
    };
    let releaser = thread::spawn(move || drop(held));
    releaser.join().unwrap();
    evictor.join().unwrap()
}

/// On one thread, once the race is over: an allocation of `n` blocks
/// (`what`: free ones and evicted ones), given back; then of the keys
/// `keys` only `young` (the last released) is cached, and all `blocks` of
/// the pool are free.
fn only_the_youngest_kept(
    pool: &Arc<BlockPool>,
    n: usize,
    what: &str,
    keys: impl IntoIterator<Item = u8>,
    young: u8,
    blocks: usize,
) {
    let mut seq = Sequence::new(Arc::clone(pool));
    seq.try_append(n).expect(what);
    drop(seq);
    let kept = kept(pool, keys);
    assert_eq!(kept, [young], "{OUT_OF_ORDER}: keys {kept:?} cached");
    assert_eq!(pool.free_blocks(), blocks, "{LOST}");
}

/// Three cached blocks, all evictable: keys 4 and 5 (released in that
/// order), and key 3, released last, after a revival. The ring holds
/// key 3's first release (a stale candidate), then 4's and 5's, and is
/// overflowed (key 3's new release found it full). Two threads each
/// allocate a block: together they evict keys 4 and 5, the two least
/// recently released, and key 3 stays cached.
///
/// Each eviction that takes 4's or 5's candidate leaves at most one
/// candidate in the ring (a refill's threshold for a ring this small), so
/// either thread may refill it meanwhile: the refill puts
/// the evictable blocks that have no current candidate (key 3's, and
/// 4's or 5's if it is taken but not yet evicted) after the candidate
/// left, in the slots of the positions taken.
fn refill_vs_claimed_candidate(faults: Faults) {
    check(move || {
        let pool = Arc::new(BlockPool::with_faults(3, 1, 1, faults));
        // Keys 1, 2 and 3 cached and released in that order: the ring's
        // first three candidates.
        let first: Vec<Sequence> = [1, 2, 3].map(|n| published(&pool, n)).into();
        drop(first);
        // An allocation of two evicts keys 1 and 2; keys 4 and 5 go on
        // those blocks, and are released (the sequence's last block first).
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(2).expect("two evictable blocks");
        assert_eq!(seq.publish(&[key(5), key(4)]), 2);
        drop(seq);
        // Key 3 revived and released again: the youngest.
        assert!(cached(&pool, 3), "key 3 still cached");
        let held = two_evictors(&pool);
        let kept = kept(&pool, 3..=5);
        assert_eq!(kept, [3], "{OUT_OF_ORDER}: keys {kept:?} cached");
        drop(held);
        assert_eq!(pool.free_blocks(), 3, "{LOST}");
        assert_eq!(pool.admission_free_uncapped(), 3, "{LOST}");
    });
}

#[test]
fn refill_vs_claimed_candidate_sound() {
    refill_vs_claimed_candidate(SOUND);
}

#[test]
#[should_panic(expected = "evicted out of order")]
fn refill_vs_claimed_candidate_claim_before_read_is_caught() {
    refill_vs_claimed_candidate(CLAIM_BEFORE_READ);
}

/// A release that a refill's scan misses, while the ring is overflowed:
/// its append is skipped (the ring is overflowed) and the scan passed its
/// block while it was held (or read its old stamp, or placed blocks
/// after it became evictable); or a release whose append read the ring
/// not overflowed and wrote into the slots that the refill was filling,
/// so that the refill published the release's word in place of one of its
/// own, and the append's CAS then failed. Each is a miss, which the
/// refill's clearing CAS must not pass over; the control clears the
/// overflow whatever missed, so the block left out is outside the ring
/// while the ring says none is: blocks released later are appended and
/// evicted before it, even by one thread once the race is over.
///
/// Keys 1, 2 and 3 on the pool's three blocks, released 3, 2, 1; key 1
/// revived and released again (the ring is full: overflowed); key 2
/// revived and held by the releaser. The evictor allocates two blocks
/// (keys 3 and 1, the least recently released evictable ones; it
/// refills the ring once the candidate of key 3 is taken) while the
/// releaser lets key 2 go. Then, on one thread: a block published under
/// key 4 and released; an allocation of two blocks (one free, one
/// evicted) must evict key 2, released before key 4.
fn release_vs_refill_keeps_overflowed(faults: Faults) {
    check_long(20_000, move || {
        let pool = Arc::new(BlockPool::with_faults(3, 1, 1, faults));
        let mut first = Sequence::new(Arc::clone(&pool));
        first.try_append(3).expect("three blocks");
        assert_eq!(first.publish(&[key(1), key(2), key(3)]), 3);
        drop(first);
        assert!(cached(&pool, 1), "key 1 cached");
        let mut two = Sequence::new(Arc::clone(&pool));
        assert_eq!(two.try_match_prefix(&[key(2)]), 1);
        drop(evict_while_released(&pool, 2, two));
        drop(published(&pool, 4));
        only_the_youngest_kept(&pool, 2, "a free block and an evictable one", [2, 4], 4, 3);
    });
}

#[test]
fn release_vs_refill_keeps_overflowed_sound() {
    release_vs_refill_keeps_overflowed(SOUND);
}

#[test]
#[should_panic(expected = "evicted out of order")]
fn release_vs_refill_keeps_overflowed_unchecked_overflow_clear_is_caught() {
    release_vs_refill_keeps_overflowed(UNCHECKED_OVERFLOW_CLEAR);
}

/// The ring's slots for a pool of 4 blocks: one for each block and one of
/// stale room.
const WIDE_RING: usize = 5;

/// As [`refill_vs_claimed_candidate`], in a ring with more slots than
/// blocks (4 blocks, [`WIDE_RING`] slots), where the refill that races
/// the claim must write four candidates, a whole ring past the claimed
/// position, to reach its slot: it can only because the one candidate
/// left is stale (its block is evictable and unmarked, so the refill
/// writes it again) and the claimed block is not evicted yet.
///
/// Keys 1, 2, 3 and 4 on the pool's four blocks, released in that order
/// (positions 0 to 3); key 1 revived and released (position 4, the slot
/// of stale room: the ring is full); key 2 revived and released (its
/// append misses: the ring is overflowed). One allocation passes the
/// stale candidates of keys 1 and 2 and evicts key 3 (it leaves two
/// candidates: no refill); key 5 goes on that block and is released (a
/// miss), and key 1 is revived and released again (a miss: its candidate
/// at position 4 is now stale). The ring holds key 4's candidate and a
/// stale one, and is overflowed; the blocks were released in the order
/// 4, 2, 5, 1. Two threads each allocate a block: together they evict
/// keys 4 and 2, the two least recently released, and keys 5 and 1 stay
/// cached.
///
/// The evictor that claims key 4's candidate (position 3) leaves the stale
/// one: the other refills the ring. While key 4's block is claimed but
/// not yet evicted, the refill finds four evictable blocks with no
/// current candidate (keys 4, 2, 5 and 1) and four free slots, and writes
/// them oldest first at positions 5 to 8: key 1, the youngest, lands in
/// slot 3, key 4's. The control
/// copies key 4's candidate only after its claim, so it may copy key 1's
/// and evict key 1, keeping key 2.
fn stale_room_refill_vs_claimed_candidate(faults: Faults) {
    check_long(20_000, move || {
        let pool = Arc::new(BlockPool::with_faults(4, 1, 1, faults));
        let first: Vec<Sequence> = [1, 2, 3, 4].map(|n| published(&pool, n)).into();
        drop(first);
        assert!(cached(&pool, 1), "key 1 cached");
        assert_eq!(pool.eviction_ring(), (WIDE_RING, 5, false), "full");
        assert!(cached(&pool, 2), "key 2 cached");
        assert_eq!(pool.eviction_ring(), (WIDE_RING, 5, true), "overflowed");
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(1).expect("an evictable block");
        assert_eq!(seq.publish(&[key(5)]), 1);
        drop(seq);
        assert!(cached(&pool, 1), "key 1 cached");
        assert!(!cached(&pool, 3), "key 3 evicted");
        // Key 4's candidate and key 1's stale one.
        assert_eq!(pool.eviction_ring(), (WIDE_RING, 2, true));
        let held = two_evictors(&pool);
        let kept = kept(&pool, 1..=5);
        assert_eq!(kept, [1, 5], "{OUT_OF_ORDER}: keys {kept:?} cached");
        drop(held);
        assert_eq!(pool.free_blocks(), 4, "{LOST}");
        assert_eq!(pool.admission_free_uncapped(), 4, "{LOST}");
    });
}

#[test]
fn stale_room_refill_vs_claimed_candidate_sound() {
    stale_room_refill_vs_claimed_candidate(SOUND);
}

#[test]
#[should_panic(expected = "evicted out of order")]
fn stale_room_refill_vs_claimed_candidate_claim_before_read_is_caught() {
    stale_room_refill_vs_claimed_candidate(CLAIM_BEFORE_READ);
}

/// As [`release_vs_refill_keeps_overflowed`], in a ring with more slots
/// than blocks (4 blocks, [`WIDE_RING`] slots): the slot of stale room
/// holds a revived block's new candidate, so it is a second revival that
/// overflows the ring.
///
/// Keys 1, 2, 3 and 4 on the pool's four blocks, released 4, 3, 2, 1
/// (positions 0 to 3); key 1 revived and released (position 4: the ring
/// is full); key 4 revived and released (a miss: the ring is
/// overflowed); key 2 revived and held by the releaser. The evictor
/// allocates two blocks while the releaser lets key 2 go (its append is
/// skipped: a miss). The evictor passes key 4's stale candidate and
/// evicts key 3, passes key 2's (held, or released and so stale) and key
/// 1's stale one, refills the ring once only key 1's candidate is left
/// (key 4, and key 2 if its scan sees it released) and evicts key 1. Or,
/// racing the release, it takes key 2 at its old candidate (evictable
/// before its new stamp is written) and key 1 stays. Then, on one thread:
/// key 5 on a free block, released; an allocation of three blocks (one
/// free, two evicted) must evict the two cached keys left, both released
/// before key 5 (keys 4 and 2, or 4 and 1): only key 5 stays.
///
/// The control clears the overflow after a refill whose scan passed key
/// 2 while it was held, although key 2's release missed meanwhile: key 2
/// is outside the ring and the ring says none is, so key 5's release is
/// appended after key 4's candidate and the last allocation evicts keys 4
/// and 5, keeping key 2.
fn stale_room_release_vs_refill_keeps_overflowed(faults: Faults) {
    check_long(20_000, move || {
        let pool = Arc::new(BlockPool::with_faults(4, 1, 1, faults));
        let mut first = Sequence::new(Arc::clone(&pool));
        first.try_append(4).expect("four blocks");
        assert_eq!(first.publish(&[key(1), key(2), key(3), key(4)]), 4);
        drop(first);
        assert!(cached(&pool, 1), "key 1 cached");
        assert_eq!(pool.eviction_ring(), (WIDE_RING, 5, false), "full");
        assert!(cached(&pool, 4), "key 4 cached");
        assert_eq!(pool.eviction_ring(), (WIDE_RING, 5, true), "overflowed");
        let mut two = Sequence::new(Arc::clone(&pool));
        assert_eq!(two.try_match_prefix(&[key(2)]), 1);
        drop(evict_while_released(&pool, 2, two));
        drop(published(&pool, 5));
        only_the_youngest_kept(&pool, 3, "a free block and two evictable ones", 1..=5, 5, 4);
    });
}

#[test]
fn stale_room_release_vs_refill_keeps_overflowed_sound() {
    stale_room_release_vs_refill_keeps_overflowed(SOUND);
}

#[test]
#[should_panic(expected = "evicted out of order")]
fn stale_room_release_vs_refill_keeps_overflowed_unchecked_overflow_clear_is_caught() {
    stale_room_release_vs_refill_keeps_overflowed(UNCHECKED_OVERFLOW_CLEAR);
}

/// A release that a refill's scan sees at the wrong moment: between the
/// pass that counts the blocks in each range of ranks and the pass that
/// places them, its block evictable but its new stamp not yet written. The
/// scan ranks it by its old stamp, which shares a range with an older
/// block's, places it there, and so has no room left in that range for
/// the older block, which it counted. That block stays out of the ring:
/// the refill must leave the ring overflowed. The control compares the
/// blocks its first pass saw with the room, finds that they fit and
/// clears the overflow, so the block left out stays out while appends
/// resume: blocks released later are evicted before it, even by one
/// thread once the race is over.
///
/// Keys 1, 2 and 3 on blocks 0, 1 and 2 (the scan's order), released and
/// revived; then key 2 released (the ring is full: a miss, the ring
/// overflows) and key 1; key 1 revived again and held by
/// the releaser (its stamp stays the one just after key 2's); 2,048
/// stamps later, key 3 released. So keys 2 and 3 are evictable, without
/// a current candidate, with stamps 2,050 apart: a range of ranks 4,096
/// wide, ranges of 4 ranks each, key 1's old stamp in key 2's range. The
/// evictor allocates one block (it passes the stale candidates and
/// refills the ring, with room for two) while the releaser lets key 1 go.
/// Then, on one thread: key 4 on the evictor's block, released; an
/// allocation of two blocks (both evicted) must keep key 4, released last.
fn release_in_a_full_range(faults: Faults) {
    check_long(20_000, move || {
        let pool = Arc::new(BlockPool::with_faults(3, 1, 1, faults));
        let [one, two, three] = three_matched(&pool, [1, 2, 3]);
        drop(two);
        assert_eq!(pool.eviction_ring(), (3, 3, true), "overflowed");
        drop(one);
        let mut one = Sequence::new(Arc::clone(&pool));
        assert_eq!(one.try_match_prefix(&[key(1)]), 1);
        pool.skip_release_stamps(2048);
        drop(three);
        let mut seq = evict_while_released(&pool, 1, one);
        assert_eq!(seq.publish(&[key(4)]), 1);
        drop(seq);
        only_the_youngest_kept(&pool, 2, "two evictable blocks", 1..=4, 4, 3);
    });
}

#[test]
fn release_in_a_full_range_sound() {
    release_in_a_full_range(SOUND);
}

#[test]
#[should_panic(expected = "evicted out of order")]
fn release_in_a_full_range_fill_counts_first_pass_is_caught() {
    release_in_a_full_range(FILL_COUNTS_FIRST_PASS);
}

/// The end of a race between a release and a refill, on a pool whose
/// evictor took one block into `seq` while the held key's block (`held`)
/// was let go: if the ring (of `ring` slots) is empty and not overflowed,
/// the release's append reached the empty ring first and the evictor took
/// the held key's block from it with no refill, the state the model starts
/// from (which a later refill finds), not a race's outcome: only the
/// blocks' return is checked. Else, on one thread: key `young` on the
/// evictor's block, released; an allocation of every other block (all
/// evicted) must keep it, released last.
fn after_the_refill_race(
    pool: &Arc<BlockPool>,
    mut seq: Sequence,
    ring: usize,
    held: usize,
    young: u8,
) {
    let blocks = pool.num_blocks();
    if pool.eviction_ring() == (ring, 0, false) {
        let taken = seq.blocks()[0].index();
        assert_eq!(
            taken, held,
            "{OUT_OF_ORDER}: block {taken}, ring left empty"
        );
        drop(seq);
        assert_eq!(pool.free_blocks(), blocks, "{LOST}");
    } else {
        assert_eq!(seq.publish(&[key(young)]), 1);
        drop(seq);
        only_the_youngest_kept(
            pool,
            blocks - 1,
            "evictable blocks",
            1..=young,
            young,
            blocks,
        );
    }
}

/// A release whose append reads the ring's overflowed bit clear (before
/// a refill sets it, or a stale value) while the refill publishes its
/// entries in steps (the first bucket at once): after that bucket is
/// published, the append reads the new length and writes its block into
/// the slot where the refill placed its next bucket, and publishes it.
/// The refill's sort of that bucket may then rewrite the entry the append
/// published (with the bucket's older block); either way one of the two
/// blocks is outside the ring, the refill's publishing CAS fails (the
/// append moved the length), and the refill scans again and finds that
/// block. The control takes what it published for the whole refill and
/// clears the overflow: the displaced block stays outside the ring while
/// appends resume, so blocks released later are evicted before it, even
/// by one thread once the race is over.
///
/// The refill runs with the bit clear because the ring ran dry: keys 1,
/// 3 and 2 on blocks 0, 1 and 2 (the scan's order), released and revived;
/// the ring's head moved past every candidate
/// (`BlockPool::pass_eviction_candidates`); key 1 released, then 2,048
/// stamps later key 2, then key 3 (appended to the emptied ring, which
/// they fill); key 3 revived and held by the releaser, and the head moved
/// past every candidate again. So keys 1 and 2 are evictable outside an
/// empty ring that is not overflowed. The refill's range of ranks is then
/// over 2,048 wide: ranges of 4 ranks, key 1's in the first, key 2 and
/// key 3 (if the scan sees it released, by its old stamp or its new one)
/// together in another, so that the
/// refill publishes key 1 alone, and then key 2, or keys 2 and 3 sorted
/// (key 3 placed first, on the lower block, and moved after key 2).
///
/// The evictor allocates one block while the releaser lets key 3 go.
/// Then, on one thread: key 4 on the evictor's block, released; an
/// allocation of two blocks (both evicted) must keep key 4, released
/// last. The evictor may take key 1 (the refill's first entry), key 3
/// (appended before the refill's entries), or key 2 (when an append that
/// read the length from before the refill's publishes wrote over key 1's
/// published entry: its CAS fails, a miss, and the ring stays overflowed
/// until a refill finds key 1). Unless the ring is empty and not
/// overflowed after the race: then the release's append reached the
/// empty ring first, the evictor took key 3 from it and ran no refill,
/// and keys 1 and 2 are still outside the ring, the state the model
/// starts from (which a later refill finds), not a race's outcome; only
/// the blocks' return is checked.
fn release_between_refill_buckets(faults: Faults) {
    check_long(20_000, move || {
        let pool = Arc::new(BlockPool::with_faults(3, 1, 1, faults));
        let [one, three, two] = three_matched(&pool, [1, 3, 2]);
        pool.pass_eviction_candidates();
        drop(one);
        pool.skip_release_stamps(2048);
        drop(two);
        drop(three);
        assert_eq!(pool.eviction_ring(), (3, 3, false), "full, not overflowed");
        let mut three = Sequence::new(Arc::clone(&pool));
        assert_eq!(three.try_match_prefix(&[key(3)]), 1);
        pool.pass_eviction_candidates();
        assert_eq!(pool.eviction_ring(), (3, 0, false), "empty");
        let seq = evict_while_released(&pool, 1, three);
        after_the_refill_race(&pool, seq, 3, 1, 4);
    });
}

#[test]
fn release_between_refill_buckets_sound() {
    release_between_refill_buckets(SOUND);
}

#[test]
#[should_panic(expected = "evicted out of order")]
fn release_between_refill_buckets_no_rescan_after_raced_publish_is_caught() {
    release_between_refill_buckets(NO_RESCAN_AFTER_RACED_PUBLISH);
}

/// As [`release_between_refill_buckets`], with refills whose publishes
/// follow the doubling schedule past a bucket published with no CAS of its
/// own: keys `1..=outside` each alone in a bucket of the refill's
/// histogram. With three, the refill publishes one entry (the first
/// bucket, at once), then two (the count doubled), and sorts the third
/// bucket without publishing it (three is less than twice two): the third
/// entry goes out with the publish at the end. With four, it skips the
/// third bucket's publish and publishes all four with the fourth (the
/// count doubled again). The release of key `outside + 1` (its append
/// reading the overflowed bit clear) may land after the second publish,
/// writing its block into the slot where the refill placed key 3 and
/// publishing it; the refill's next CAS (the one at the end, or the
/// fourth bucket's) then fails and it must scan again, or key 3 (and key
/// 4) stay outside the ring. The control takes what it published for the
/// whole refill and clears the overflow: the keys left out stay outside
/// the ring while key `outside + 2`, released later, is appended and
/// evicted before them. (No other model here makes a CAS fail after a
/// bucket whose publish was deferred.)
///
/// Keys `1..=outside + 1` on blocks `0..=outside` (the scan's order),
/// released and revived; the ring's head moved past every candidate; key
/// 1 released, then each key `2..=outside` 2,048 stamps after the one
/// before, then key `outside + 1` (all appended to the emptied ring); key
/// `outside + 1` revived and held by the releaser, and the head moved past
/// every candidate again. So keys `1..=outside` are evictable outside an
/// empty ring that is not overflowed, over a range of ranks over 4,096
/// wide: ranges of 8 ranks, one key in each (the held key, if the scan
/// sees it released, by its old stamp or its new one, shares the last
/// key's). The evictor allocates one block while the releaser lets the
/// held key go. Then, on one thread: key `outside + 2` on the evictor's
/// block, released; an allocation of `outside` blocks (all evicted) must
/// keep key `outside + 2`, released last. Unless the ring is empty and
/// not overflowed after the race: the release's append reached the empty
/// ring first and the evictor took the held key from it with no refill
/// (the start state stands; only the blocks' return is checked).
fn release_before_deferred_publish(faults: Faults, outside: u8) {
    check_long(20_000, move || {
        let blocks = usize::from(outside) + 1;
        let ring = blocks + blocks / 4;
        let (held, young) = (outside + 1, outside + 2);
        let pool = Arc::new(BlockPool::with_faults(blocks, 1, 1, faults));
        let mut first = Sequence::new(Arc::clone(&pool));
        first.try_append(blocks).expect("a block for each key");
        let ids: Vec<usize> = first.blocks().iter().map(|id| id.index()).collect();
        assert_eq!(ids, (0..blocks).collect::<Vec<_>>(), "key n on block n - 1");
        let keys: Vec<BlockHash> = (1..=held).map(key).collect();
        assert_eq!(first.publish(&keys), blocks);
        drop(first);
        let mut matched: Vec<Sequence> = (1..=held)
            .map(|n| {
                let mut seq = Sequence::new(Arc::clone(&pool));
                assert_eq!(seq.try_match_prefix(&[key(n)]), 1);
                seq
            })
            .collect();
        pool.pass_eviction_candidates();
        let last = matched.pop().expect("the held key");
        for (i, seq) in matched.into_iter().enumerate() {
            if i > 0 {
                pool.skip_release_stamps(2048);
            }
            drop(seq);
        }
        drop(last);
        assert_eq!(
            pool.eviction_ring(),
            (ring, blocks, false),
            "not overflowed"
        );
        let mut last = Sequence::new(Arc::clone(&pool));
        assert_eq!(last.try_match_prefix(&[key(held)]), 1);
        pool.pass_eviction_candidates();
        assert_eq!(pool.eviction_ring(), (ring, 0, false), "empty");
        let seq = evict_while_released(&pool, 1, last);
        after_the_refill_race(&pool, seq, ring, blocks - 1, young);
    });
}

#[test]
fn release_before_deferred_publish_sound() {
    release_before_deferred_publish(SOUND, 3);
}

#[test]
#[should_panic(expected = "evicted out of order")]
fn release_before_deferred_publish_no_rescan_after_raced_publish_is_caught() {
    release_before_deferred_publish(NO_RESCAN_AFTER_RACED_PUBLISH, 3);
}

#[test]
fn release_after_skipped_publish_sound() {
    release_before_deferred_publish(SOUND, 4);
}

#[test]
#[should_panic(expected = "evicted out of order")]
fn release_after_skipped_publish_no_rescan_after_raced_publish_is_caught() {
    release_before_deferred_publish(NO_RESCAN_AFTER_RACED_PUBLISH, 4);
}
