//! Loom models of the prefix cache under misuse and three-way races: a raw
//! `BlockPool::free` of a block (a double free, misuse) racing the
//! holder's `Sequence::publish` of it.
//!
//! Run with `scripts/loom prefix_misuse`.
//!
//! `BlockPool::free` promises that whatever races, the pool's own books
//! stay exact, and that a double free hands a block to two owners only
//! through the holder that lost its reference, never through the pool.
//! A raw free refuses a sequence's block (`HeldBySequence`), so in the
//! pool as shipped these frees change nothing. A publisher's claim also
//! holds a reference of its own, so that a free could not take a claimed
//! block's last reference even then: the claim controls below come with
//! `free_ignores_sequence`, a raw free that takes a sequence's reference
//! as it could before the flag. The negative control
//! (`UNREFERENCED_CLAIM`) claims without one: the free then takes the
//! publisher's only reference while the block is claimed (`BUSY`), the
//! last drop sees no `CACHED` bit and pushes the block to the free list,
//! and the commit sets `CACHED` on a block that sits in the free list
//! (evictable *and* free). A fresh `try_alloc` then hands out a block that
//! holds a key, and a matcher of that key shares the new owner's block.
//! The second control (`CLAIM_DROP_KEPT`) does not give back a block whose
//! last reference the commit or the unclaim dropped: a leak.
//!
//! | model | threads | controls |
//! |---|---|---|
//! | [`raw_free_racing_publish`] | 2 | `unreferenced_claim` |
//! | [`raw_free_racing_publish_then_two_allocations`] | 2, then 2 | `unreferenced_claim` |
//! | [`claim_attack`] (publish, raw free and match, reset and evicting allocation) | 3 | `unreferenced_claim`, `claim_drop_kept` |
//! | [`raw_free_racing_a_losing_publish`] | 2 | `claim_drop_kept` |
//! | [`truncate_sole_vs_match`] | 2 | `no_generation_check` |
//! | [`a_publish_after_the_holder_is_gone`] | 2 | `no_held_key_check` with `ignore_deferral` |
//! | [`a_publish_after_the_holder_is_gone_behind_a_rival`] | 3 | `ignore_deferral` |

use std::sync::Arc;

use crate::loom_tests::pool_world::{
    check, holder_gone_then_publish, holder_rival_publisher, PoolWorld, SOUND,
};
use crate::{BlockHash, Sequence};
use loom::thread;

/// Pool of 2 one-token blocks. Main: a sequence appends one block and
/// publishes it. Other thread: `pool.free(&[that block])` (a double free).
/// Afterwards (quiescent, the sequence dropped), every block is allocated
/// fresh: none may hold a key, and a match of the published key must not
/// return any of them.
fn raw_free_racing_publish(faults: Faults) {
    check(move || {
        let world = PoolWorld::new(2, 1, faults, "sequence");
        let pool = Arc::clone(&world.pool);
        let key = BlockHash([9; 32]);
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(1).unwrap();
        let id = seq.blocks()[0];
        let freer = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let _ = pool.free(&[id]); // misuse: the sequence holds it
            })
        };
        seq.publish(&[key]);
        freer.join().unwrap();
        drop(seq);
        // Quiescent: nobody holds anything.
        assert_eq!(pool.used_blocks(), 0, "used after everything dropped");
        let mut fresh = Vec::new();
        pool.try_alloc(2, &mut fresh).unwrap();
        let mut m = Sequence::new(Arc::clone(&pool));
        let k = m.try_match_prefix(&[key]);
        assert_eq!(
            (pool.cached_blocks(), k),
            (0, 0),
            "a freshly allocated block {fresh:?} holds a key that matches \
             (matched {:?})",
            m.blocks()
        );
        drop(m);
        pool.free(&fresh).unwrap();
    });
}

#[test]
fn raw_free_racing_publish_leaves_no_key_on_a_fresh_block() {
    raw_free_racing_publish(SOUND);
}

/// A claim without its own reference: the free pushes the claimed block,
/// and the commit leaves its key on a block in the free list.
#[test]
#[should_panic(expected = "holds a key")]
fn raw_free_racing_publish_unreferenced_claim_is_caught() {
    raw_free_racing_publish(UNREFERENCED_CLAIM);
}

use crate::loom_tests::pool_world::{
    CLAIM_DROP_KEPT, IGNORE_DEFERRAL, NO_GENERATION_CHECK, UNREFERENCED_CLAIM,
};
use crate::sync::{AtomicUsize, Faults, Ordering};
use crate::BlockPool;

/// A pool world with a content tag per block (as in `prefix.rs`).
struct Tagged {
    world: Arc<PoolWorld>,
    tags: Box<[AtomicUsize]>,
}

impl Tagged {
    #[allow(clippy::arc_with_non_send_sync)]
    fn new(num_blocks: usize, block_size: usize, faults: Faults) -> Arc<Tagged> {
        Arc::new(Tagged {
            world: PoolWorld::new(num_blocks, block_size, faults, "sequence"),
            tags: (0..num_blocks).map(|_| AtomicUsize::new(0)).collect(),
        })
    }

    /// The owner writes block `id` and tags it `tag`.
    fn write(&self, id: crate::BlockId, tag: usize) {
        self.world.write(id);
        // Relaxed: checked against the pool's own ordering.
        self.tags[id.index()].store(tag, Ordering::Relaxed);
    }

    /// A new sequence matching key `n`; every matched block read and its
    /// tag checked; then let go.
    fn match_and_check(&self, n: u8) -> usize {
        let mut seq = Sequence::new(Arc::clone(&self.world.pool));
        let k = seq.try_match_prefix(&[BlockHash([n; 32])]);
        for &id in seq.blocks() {
            self.world.hold(id);
            self.world.read(id);
            // Relaxed: see `write`.
            let tag = self.tags[id.index()].load(Ordering::Relaxed);
            assert_eq!(tag, usize::from(n), "stale hit: {id} holds tag {tag}");
        }
        for &id in seq.blocks() {
            self.world.read(id);
            self.world.drop_ref(id);
        }
        k
    }
}

/// A sequence holds its published block alone (2 tokens, block size 2),
/// truncates into it and appends one other token: it drops the key and
/// writes in place, or copies if a matcher took the block first. A
/// matcher of the key on another thread must never see the rewrite (the
/// `UnsafeCell` witness reports a causality violation, the tag a stale
/// hit).
fn truncate_sole_vs_match(faults: Faults) {
    check(move || {
        let t = Tagged::new(2, 2, faults);
        let mut a = Sequence::new(Arc::clone(&t.world.pool));
        a.try_append(2).unwrap();
        let b = a.blocks()[0];
        t.world.take(b);
        t.write(b, 4);
        assert_eq!(a.publish(&[BlockHash([4; 32])]), 1);
        let matcher = {
            let t = Arc::clone(&t);
            thread::spawn(move || t.match_and_check(4))
        };
        a.truncate(1);
        let (_, copy) = a.try_append_cow(1).expect("a free block for a copy");
        let tail = a.blocks()[0];
        match copy {
            Some(c) => {
                t.world.take(c.dst);
                t.world.read(c.src);
                t.write(c.dst, 0);
            }
            None => t.write(tail, 0),
        }
        matcher.join().unwrap();
        // Let go of everything the sequence holds (its retired source too).
        let held: Vec<_> = a.blocks().to_vec();
        drop(a);
        for id in held {
            t.world.drop_ref(id);
        }
        if let Some(c) = copy {
            t.world.drop_ref(c.src);
        }
        t.world.assert_conserved();
    });
}

#[test]
fn truncate_sole_vs_match_sound() {
    truncate_sole_vs_match(SOUND);
}

/// Without the generation check the matcher's blind revival adds a
/// reference to the block whose key the truncate dropped: a leak.
#[test]
#[should_panic(expected = "blocks not conserved")]
fn truncate_sole_vs_match_no_generation_check_is_caught() {
    truncate_sole_vs_match(NO_GENERATION_CHECK);
}

// evictable block first), and the other controls touch paths the model
// orders by joins.

/// The same misuse, followed by two allocations at once. Were a raw free
/// racing a publish to leave block `b` in the free list with its key
/// (evictable as well as free, as under the control), one allocation
/// could pop `b` while the other, finding the free list empty, evicts `b`
/// too: the pool itself would hand one block to two owners (`DOUBLE`);
/// or one allocation pops `b` with its key still set. Either is caught.
fn raw_free_racing_publish_then_two_allocations(faults: Faults) {
    check(move || {
        let world = PoolWorld::new(3, 1, faults, "sequence");
        let pool = Arc::clone(&world.pool);
        // Block e: cached and evictable under another key.
        let mut e = Sequence::new(Arc::clone(&pool));
        e.try_append(1).unwrap();
        assert_eq!(e.publish(&[BlockHash([2; 32])]), 1);
        drop(e);
        // Block o: held throughout.
        let mut o = Vec::new();
        pool.try_alloc(1, &mut o).unwrap();
        // Block b: published by its sequence while a raw free takes it.
        let mut a = Sequence::new(Arc::clone(&pool));
        a.try_append(1).unwrap();
        let id = a.blocks()[0];
        let freer = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let _ = pool.free(&[id]); // misuse: the sequence holds it
            })
        };
        a.publish(&[BlockHash([1; 32])]);
        freer.join().unwrap();
        drop(a);
        // Two allocations of one block each, at once: one block is free
        // (or should be) and one evictable.
        let other = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                let mut ids = Vec::new();
                world.pool.try_alloc(1, &mut ids).unwrap();
                world.take(ids[0]);
                ids
            })
        };
        let mut mine = Vec::new();
        pool.try_alloc(1, &mut mine).unwrap();
        world.take(mine[0]);
        let theirs = other.join().unwrap();
        assert_ne!(mine, theirs, "{}", crate::loom_tests::pool_world::DOUBLE);
        // Every block is held now, o uncached and the two fresh ones
        // allocated: none may hold a key.
        assert_eq!(
            pool.cached_blocks(),
            0,
            "a freshly allocated block holds a key ({mine:?}, {theirs:?})"
        );
    });
}

#[test]
fn raw_free_racing_publish_then_two_allocations_never_share_a_block() {
    raw_free_racing_publish_then_two_allocations(SOUND);
}

/// A claim without its own reference: the block left in the free list
/// with its key is handed out with it.
#[test]
#[should_panic(expected = "holds a key")]
fn raw_free_racing_publish_then_two_allocations_unreferenced_claim_is_caught() {
    raw_free_racing_publish_then_two_allocations(UNREFERENCED_CLAIM);
}

/// A publish that starts after every holder of its key is gone must not
/// lose to a rival publisher of the same key on a lower block id that
/// began while the old holder held the key. Two defences keep the key
/// here, each enough alone: the rival finds the holder in its first
/// lookup and loses without claiming, so the later publish sees no claim
/// that is bound to lose; and a claim that the later publish deferred to
/// looks again before it gives up. The control switches both off
/// (`no_held_key_check` and `ignore_deferral`): the rival claims, loses
/// in its rescan to the old holder, and meanwhile beats the later publish
/// ("of two claims the lower id wins"); no block keeps the key. (The
/// three-thread model below needs the second defence alone.)
fn a_publish_after_the_holder_is_gone(faults: Faults) {
    check(move || {
        let pool = Arc::new(BlockPool::with_faults(3, 1, 1, faults));
        let key = [BlockHash([1; 32])];
        // The old holder c, and two more blocks; the rival gets the lower
        // id.
        let (mut c, mut r, mut p) = holder_rival_publisher(&pool);
        assert_eq!(c.publish(&key), 1);
        let rival = thread::spawn(move || {
            let n = r.publish(&[BlockHash([1; 32])]);
            (r, n)
        });
        // The old holder goes, and its key with it; only then publish.
        drop(c);
        assert_eq!(pool.reset_prefix_cache(), 1);
        let mine = p.publish(&key);
        let (r, theirs) = rival.join().unwrap();
        assert_eq!(
            mine + theirs,
            1,
            "nobody holds the key: the publish that began after the holder \
             was gone lost (rival {:?}, mine {:?})",
            r.blocks(),
            p.blocks()
        );
    });
}

#[test]
fn a_publish_after_the_holder_is_gone_is_not_lost_to_a_doomed_rival() {
    a_publish_after_the_holder_is_gone(SOUND);
}

#[test]
#[should_panic(expected = "nobody holds the key")]
fn a_publish_after_the_holder_is_gone_without_either_defence_is_caught() {
    a_publish_after_the_holder_is_gone(Faults {
        no_held_key_check: true,
        ..IGNORE_DEFERRAL
    });
}

/// Three publishes of one key: the holder's and the rival's race, then
/// the holder goes (its key reset), and only then does a third publish on
/// a higher block id than the rival's begin. The rival's first lookup can
/// run before the holder commits, so it claims and then loses to the
/// holder in its rescan; while its claim stands, the third publish finds
/// it and defers to it (the lower id wins). The key must end on a block:
/// the rival, deferred to, looks again before it gives up, finds the
/// holder gone and commits (or the third publish commits).
fn a_publish_after_the_holder_is_gone_behind_a_rival(faults: Faults) {
    holder_gone_then_publish(faults, None, false);
}

#[test]
fn a_publish_after_the_holder_is_gone_is_not_lost_to_a_rival_of_a_concurrent_holder() {
    a_publish_after_the_holder_is_gone_behind_a_rival(SOUND);
}

/// A claim that was deferred to gives up without looking again: the key
/// ends on no block.
#[test]
#[should_panic(expected = "nobody holds the key")]
fn a_publish_after_the_holder_is_gone_behind_a_rival_ignore_deferral_is_caught() {
    a_publish_after_the_holder_is_gone_behind_a_rival(IGNORE_DEFERRAL);
}

/// An attack on the claim's reference, three threads on a pool of 2
/// one-token blocks. A sequence holds block `b` and publishes it; a raw
/// free of `b` (a double free) races it, followed on the same thread by a
/// match of the key; the main thread resets the prefix cache and then
/// allocates a block (evicting if it must) and frees it. Once everything
/// is back the books must be exact: nothing used, every block free, every
/// cached block evictable, and allocating the whole pool hands out
/// distinct blocks none of which holds a key. (No shadow holders: through
/// the double free the sequence may name, and publish, a block that the
/// main thread's allocation holds, which is the misuse's own consequence,
/// not the pool's.)
fn claim_attack(faults: Faults) {
    check(move || {
        let world = PoolWorld::new(2, 1, faults, "sequence");
        let pool = Arc::clone(&world.pool);
        let key = BlockHash([3; 32]);
        let mut a = Sequence::new(Arc::clone(&pool));
        a.try_append(1).unwrap();
        let id = a.blocks()[0];
        let publisher = thread::spawn(move || {
            a.publish(&[key]);
            drop(a);
        });
        let freer = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let _ = pool.free(&[id]); // misuse: the sequence holds it
                let mut m = Sequence::new(Arc::clone(&pool));
                m.try_match_prefix(&[key]);
            })
        };
        pool.reset_prefix_cache();
        let mut mine = Vec::new();
        if pool.try_alloc(1, &mut mine).is_ok() {
            let _ = pool.free(&mine);
        }
        publisher.join().unwrap();
        freer.join().unwrap();
        assert_eq!(pool.used_blocks(), 0, "used after everything dropped");
        assert_eq!(
            pool.free_blocks(),
            2,
            "free blocks after everything dropped"
        );
        assert_eq!(pool.cached_blocks(), pool.evictable_blocks());
        let mut all = Vec::new();
        pool.try_alloc(2, &mut all).unwrap();
        assert_ne!(all[0], all[1], "{}", crate::loom_tests::pool_world::DOUBLE);
        assert_eq!(
            pool.cached_blocks(),
            0,
            "a freshly allocated block holds a key"
        );
        pool.free(&all).unwrap();
        assert_eq!(pool.free_blocks(), 2);
    });
}

#[test]
fn claim_attack_sound() {
    claim_attack(SOUND);
}

/// A claim without its own reference: the raw free pushes the claimed
/// block, the commit keys it in the free list, and the books break.
#[test]
#[should_panic(expected = "holds a key")]
fn claim_attack_unreferenced_claim_is_caught() {
    claim_attack(UNREFERENCED_CLAIM);
}

/// A claim whose last drop is not given back leaks the block when the
/// raw free takes the sequence's reference before the commit.
#[test]
#[should_panic(expected = "used after everything dropped")]
fn claim_attack_claim_drop_kept_is_caught() {
    claim_attack(CLAIM_DROP_KEPT);
}

/// A publish that loses (another block holds its key) racing a raw free
/// of its block (a double free): the unclaim may drop the block's last
/// reference, and must then give it back to the free list. Afterwards the
/// books are exact, the holder's block alone is cached, and allocating
/// the whole pool hands out distinct blocks without keys. The publish
/// skips its first lookup of the key (`no_held_key_check`, in the sound
/// run too), so that it claims and loses in its rescan, as it does when
/// the holder commits between the two.
fn raw_free_racing_a_losing_publish(faults: Faults) {
    let faults = Faults {
        no_held_key_check: true,
        ..faults
    };
    check(move || {
        let world = PoolWorld::new(2, 1, faults, "sequence");
        let pool = Arc::clone(&world.pool);
        let key = [BlockHash([4; 32])];
        let mut holder = Sequence::new(Arc::clone(&pool));
        holder.try_append(1).unwrap();
        assert_eq!(holder.publish(&key), 1);
        let mut a = Sequence::new(Arc::clone(&pool));
        a.try_append(1).unwrap();
        let id = a.blocks()[0];
        let freer = {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let _ = pool.free(&[id]); // misuse: the sequence holds it
            })
        };
        assert_eq!(a.publish(&key), 0, "the holder's block keeps the key");
        freer.join().unwrap();
        drop(a);
        drop(holder);
        assert_eq!(pool.used_blocks(), 0, "used after everything dropped");
        assert_eq!(
            pool.free_blocks(),
            2,
            "free blocks after everything dropped"
        );
        assert_eq!((pool.cached_blocks(), pool.evictable_blocks()), (1, 1));
        let mut all = Vec::new();
        pool.try_alloc(2, &mut all).unwrap();
        assert_ne!(all[0], all[1], "{}", crate::loom_tests::pool_world::DOUBLE);
        assert_eq!(
            pool.cached_blocks(),
            0,
            "a freshly allocated block holds a key"
        );
        pool.free(&all).unwrap();
    });
}

#[test]
fn raw_free_racing_a_losing_publish_sound() {
    raw_free_racing_a_losing_publish(SOUND);
}

/// The unclaim that drops the last reference keeps the block: a leak.
#[test]
#[should_panic(expected = "used after everything dropped")]
fn raw_free_racing_a_losing_publish_claim_drop_kept_is_caught() {
    raw_free_racing_a_losing_publish(CLAIM_DROP_KEPT);
}
