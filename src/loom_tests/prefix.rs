//! Loom models of the prefix cache: `Sequence::try_match_prefix`,
//! `Sequence::publish` and `BlockPool::peek_prefix`'s check of a block
//! against evictions, releases, resets and each other, each with a
//! negative control that loom must catch.
//!
//! Run with `scripts/loom prefix`.
//!
//! # What every model checks
//!
//! * **No double hand-out.** The shadow holder counts of
//!   [`PoolWorld`](crate::loom_tests::pool_world::PoolWorld): a block an
//!   allocation gets (a free one, or an evicted one) must have had no
//!   holder ([`DOUBLE`] otherwise); a match adds a holder.
//! * **The right content.** Each block has a content tag (a loom atomic,
//!   `Relaxed`): a writer sets it to the key it publishes, and every
//!   matched block's tag must be the key asked for ("stale hit"
//!   otherwise).
//! * **Happens-before.** The payload witness (`UnsafeCell`): a writer
//!   writes its blocks, a matcher reads what it matched, everyone reads
//!   before letting go; loom reports a "Causality violation" when the
//!   publisher's write does not happen-before the matcher's read, or a
//!   holder's read before the next owner's write.
//! * **First wins.** Two publishers of one key: exactly one block caches it.
//! * **Conservation** once every sequence is dropped.
//!
//! # Models and negative controls
//!
//! | model | threads, blocks | control (caught by) |
//! |---|---|---|
//! | [`match_vs_evicting_append`] | 2, 2 | `evict_referenced` (causality: the new owner writes what the matcher reads) |
//! | [`two_matches_revive_one_block`] | 3, 2 | `evict_referenced` (causality, as above) |
//! | [`two_publishes_of_one_key`] | 2, 2 | `no_kill` (first wins) |
//! | [`match_vs_republish`] | 2, 1 | `no_generation_check` (stale hit) |
//! | [`release_vs_match`] | 3, 1 | `no_generation_check` (conservation: the revival missed the release, and took a block without its capacity) |
//! | [`reset_vs_match`] | 3, 2 | `evict_referenced` (conservation: the reset freed a block the matcher held) |
//! | [`publish_then_match`] | 2, 1 | `relaxed_publish` (causality) |
//! | [`match_ahead_vs_evicting_append`] | 2, 3 | `match_keeps_credits` (conservation: a revival admitted ahead and not used, kept) |
//! | [`match_into_a_reservation_vs_evicting_append`] | 2, 3 | `lend_releases` (conservation: a lent block's admission counted twice) |
//! | [`two_publishes_in_two_buckets`] | 2, 3 | `fence_own_bucket` (first wins), `first_bucket_only` (first wins) |
//! | [`publish_in_the_second_bucket_vs_match`] | 3, 3 | `relaxed_publish` (causality), `first_bucket_only` (not found) |
//! | [`match_vs_evicting_republish_in_two_buckets`] | 2, 3 | `no_generation_check` (stale hit), `evict_referenced` (causality) |
//! | [`two_holders_publish_one_block`] | 2, 1 | `shared_sole_claim` (first wins: both claims stored, both commit) |
//! | [`peek_vs_republish`] | 2, 1 | `relaxed_key_words` (stale hit: key 1's state, or a torn key), `peek_trusts_first_read` (stale hit) |
//! | [`peek_of_a_colliding_key`] | 2, 1 | `peek_skips_key` (stale hit: the other key's block counted) |
//!
//! Blocks hold one token each, so every block is full.
//!
//! # Keys in two buckets
//!
//! A key has two index buckets, always two different ones, picked by a
//! hash keyed by the pool's seed; under loom the seed is fixed, and pools
//! of 1 to 3 blocks have two buckets. The last three models use
//! [`X`] and [`Y`], which share their first bucket (`src/pool/prefix/keys.rs`
//! checks this, in `the_loom_models_keys_share_or_split_their_first_bucket`),
//! so that with `Y` cached first an entry of `X` goes into `X`'s second
//! bucket while the publishers of `X` make their read-modify-write in the
//! first: the cases that keys whose two buckets were one never reached.
//! Their controls break only what two buckets need (the rescan's word
//! shared by every publisher of a key wherever its entry went, and
//! lookups that read both buckets), and are harmless for a key whose
//! entries all sit in one bucket.
//!
//! [`DOUBLE`]: crate::loom_tests::pool_world::DOUBLE

use std::sync::Arc;

use crate::loom_tests::pool_world::{
    check, PoolWorld, EVICT_REFERENCED, FENCE_OWN_BUCKET, FIRST_BUCKET_ONLY, LEND_RELEASES,
    MATCH_KEEPS_CREDITS, NO_GENERATION_CHECK, NO_KILL, PEEK_SKIPS_KEY, PEEK_TRUSTS_FIRST_READ,
    RELAXED_KEY_WORDS, RELAXED_PUBLISH, SHARED_SOLE_CLAIM, SOUND,
};
use crate::sync::{AtomicUsize, Faults, Ordering};
use crate::{BlockHash, BlockId, Sequence};
use loom::thread;

/// A matched block whose content is another key's.
const STALE: &str = "stale hit";
/// Two blocks cached one key.
const FIRST_WINS: &str = "first wins";
/// A match after every publish missed a key that a block holds.
const NOT_FOUND: &str = "a cached key is not found";

/// The key number whose entries the two-bucket models place: it shares
/// its first bucket with [`Y`].
const X: u8 = 1;
/// The key number cached first in the two-bucket models, filling [`X`]'s
/// first bucket.
const Y: u8 = 3;
/// A key number whose first bucket is the other one.
const Z: u8 = 2;

/// Key number `n` (the tag its blocks carry).
fn key(n: u8) -> BlockHash {
    BlockHash([n; 32])
}

/// A pool world with a content tag per block.
struct Cache {
    world: Arc<PoolWorld>,
    tags: Box<[AtomicUsize]>,
}

impl Cache {
    // Not `Send`/`Sync` (a `PoolWorld` is not), yet shared through an
    // `Arc`: loom runs a model's threads one at a time.
    #[allow(clippy::arc_with_non_send_sync)]
    fn new(num_blocks: usize, faults: Faults) -> Arc<Cache> {
        Arc::new(Cache {
            world: PoolWorld::new(num_blocks, 1, faults, "sequence"),
            tags: (0..num_blocks).map(|_| AtomicUsize::new(0)).collect(),
        })
    }

    /// `try_append(n)` on `seq`, checked whole or nothing: each new block
    /// is taken in the shadow, written, and tagged 0.
    fn append(&self, seq: &mut Sequence, n: usize) -> bool {
        let old = seq.blocks().len();
        let ok = seq.try_append(n).is_ok();
        assert_eq!(seq.blocks().len(), if ok { old + n } else { old });
        for &id in &seq.blocks()[old..] {
            self.world.take(id);
            self.world.write(id);
            // Relaxed: the tag is checked against the pool's own ordering.
            self.tags[id.index()].store(0, Ordering::Relaxed);
        }
        ok
    }

    /// A new sequence holding one block with key `n`'s content, published
    /// (`None` if the pool had no room); returns it and whether the publish
    /// cached it.
    fn filled(&self, n: u8) -> Option<(Sequence, usize)> {
        let mut seq = Sequence::new(Arc::clone(&self.world.pool));
        if !self.append(&mut seq, 1) {
            return None;
        }
        let published = self.publish(&mut seq, n);
        Some((seq, published))
    }

    /// Tags `seq`'s block with key `n` and publishes it.
    fn publish(&self, seq: &mut Sequence, n: u8) -> usize {
        let id = seq.blocks()[0];
        // Relaxed: see `append`.
        self.tags[id.index()].store(usize::from(n), Ordering::Relaxed);
        seq.publish(&[key(n)])
    }

    /// A new sequence matching key `n`: each matched block is held in the
    /// shadow, its tag checked and its payload read.
    fn matched(&self, n: u8) -> Sequence {
        let mut seq = Sequence::new(Arc::clone(&self.world.pool));
        let k = seq.try_match_prefix(&[key(n)]);
        assert_eq!(seq.blocks().len(), k);
        for &id in seq.blocks() {
            self.world.hold(id);
            self.world.read(id);
            // Relaxed: see `append`.
            let tag = self.tags[id.index()].load(Ordering::Relaxed);
            assert_eq!(tag, usize::from(n), "{STALE}: {id} holds key {tag}");
        }
        seq
    }

    /// Drops `seq`, each of its blocks read one last time.
    fn let_go(&self, seq: Sequence) {
        for &id in seq.blocks() {
            self.world.read(id);
            self.world.drop_ref(id);
        }
        drop(seq);
    }
}

/// A thread that matches key `n`'s prefix and lets go of what it got.
fn spawn_matcher(cache: &Arc<Cache>, n: u8) -> thread::JoinHandle<()> {
    let cache = Arc::clone(cache);
    thread::spawn(move || {
        let m = cache.matched(n);
        cache.let_go(m);
    })
}

/// Two blocks cached and evictable: key 1's released first (the older),
/// then key 2's.
fn two_cached(cache: &Cache) {
    let (a, _) = cache.filled(1).expect("two free blocks");
    let (b, _) = cache.filled(2).expect("one free block");
    cache.let_go(a);
    cache.let_go(b);
}

/// A match against an allocation that evicts: key 1's block is the least
/// recently released, so the allocation evicts it unless the match revived
/// it first (then key 2's goes). Whoever gets the block holds it alone.
fn match_vs_evicting_append(faults: Faults) {
    check(move || {
        let cache = Cache::new(2, faults);
        two_cached(&cache);
        let matcher = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || {
                let m = cache.matched(1);
                let hit = !m.blocks().is_empty();
                cache.let_go(m);
                hit
            })
        };
        let mut s = Sequence::new(Arc::clone(&cache.world.pool));
        assert!(cache.append(&mut s, 1), "two blocks free");
        cache.let_go(s);
        matcher.join().unwrap();
        cache.world.assert_conserved();
    });
}

#[test]
fn match_vs_evicting_append_sound() {
    match_vs_evicting_append(SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn match_vs_evicting_append_evict_referenced_is_caught() {
    match_vs_evicting_append(EVICT_REFERENCED);
}

/// A match of keys 1 and 2, whose two evictable blocks it admits ahead
/// with one read-modify-write, against an allocation that evicts the least
/// recently released cached block: key 2's (released first, then key 1's
/// and key 3's). When the allocation evicts it between the match's
/// admission and its revival of key 2, the match ends after key 1 and
/// must give back the block it admitted for key 2. Whoever gets a block
/// holds it alone, every matched block holds the key asked for, and the
/// pool is whole afterwards.
fn match_ahead_vs_evicting_append(faults: Faults) {
    check(move || {
        let cache = Cache::new(3, faults);
        let (b2, _) = cache.filled(2).expect("three free blocks");
        let (b1, _) = cache.filled(1).expect("two free blocks");
        let (b3, _) = cache.filled(3).expect("one free block");
        cache.let_go(b2);
        cache.let_go(b1);
        cache.let_go(b3);
        let matcher = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || {
                let mut m = Sequence::new(Arc::clone(&cache.world.pool));
                let k = m.try_match_prefix(&[key(1), key(2)]);
                assert_eq!(m.blocks().len(), k);
                for (i, &id) in m.blocks().iter().enumerate() {
                    cache.world.hold(id);
                    cache.world.read(id);
                    // Relaxed: see `Cache::append`.
                    let tag = cache.tags[id.index()].load(Ordering::Relaxed);
                    assert_eq!(tag, i + 1, "{STALE}: {id} holds key {tag}");
                }
                cache.let_go(m);
            })
        };
        let mut s = Sequence::new(Arc::clone(&cache.world.pool));
        let _ = cache.append(&mut s, 1);
        cache.let_go(s);
        matcher.join().unwrap();
        cache.world.assert_conserved();
    });
}

#[test]
fn match_ahead_vs_evicting_append_sound() {
    match_ahead_vs_evicting_append(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn match_ahead_vs_evicting_append_match_keeps_credits_is_caught() {
    match_ahead_vs_evicting_append(MATCH_KEEPS_CREDITS);
}

/// A match of key 1 into a sequence that holds one reserved block, against
/// an allocation of two blocks in a pool of three (one free, key 1's block
/// evictable): the revival is paid by the reserved block, which goes to
/// the allocation, or the allocation evicts key 1's block first and the
/// reservation stays (also when the eviction comes between the lend and
/// the revival: the lent block's credit takes a block back). The match
/// ends holding one block either way, a hit or the reservation; whoever
/// gets a block holds it alone, and the pool is whole afterwards.
fn match_into_a_reservation_vs_evicting_append(faults: Faults) {
    check(move || {
        let cache = Cache::new(3, faults);
        let (b1, _) = cache.filled(1).expect("three free blocks");
        cache.let_go(b1);
        let matcher = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || {
                let mut m = Sequence::new(Arc::clone(&cache.world.pool));
                m.try_reserve(1, 0).expect("two free blocks");
                let k = m.try_match_prefix(&[key(1)]);
                assert_eq!((m.blocks().len(), m.len()), (1, k));
                let id = m.blocks()[0];
                if k == 1 {
                    cache.world.hold(id);
                    cache.world.read(id);
                    // Relaxed: see `Cache::append`.
                    let tag = cache.tags[id.index()].load(Ordering::Relaxed);
                    assert_eq!(tag, 1, "{STALE}: {id} holds key {tag}");
                } else {
                    // Still reserved: ours alone, and written now.
                    cache.world.take(id);
                    cache.world.write(id);
                }
                cache.let_go(m);
            })
        };
        let mut s = Sequence::new(Arc::clone(&cache.world.pool));
        let _ = cache.append(&mut s, 2);
        cache.let_go(s);
        matcher.join().unwrap();
        cache.world.assert_conserved();
    });
}

#[test]
fn match_into_a_reservation_vs_evicting_append_sound() {
    match_into_a_reservation_vs_evicting_append(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn match_into_a_reservation_vs_evicting_append_lend_releases_is_caught() {
    match_into_a_reservation_vs_evicting_append(LEND_RELEASES);
}

/// Two matches revive the same evictable block while a third thread
/// allocates one block (evicting the older cached block unless it is
/// held).
fn two_matches_revive_one_block(faults: Faults) {
    check(move || {
        let cache = Cache::new(2, faults);
        two_cached(&cache);
        let matchers: Vec<_> = (0..2)
            .map(|_| {
                let cache = Arc::clone(&cache);
                thread::spawn(move || {
                    let m = cache.matched(1);
                    let hit = m.blocks().len();
                    cache.let_go(m);
                    hit
                })
            })
            .collect();
        let mut s = Sequence::new(Arc::clone(&cache.world.pool));
        assert!(cache.append(&mut s, 1), "two blocks free");
        cache.let_go(s);
        for m in matchers {
            m.join().unwrap();
        }
        cache.world.assert_conserved();
    });
}

#[test]
fn two_matches_revive_one_block_sound() {
    two_matches_revive_one_block(SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn two_matches_revive_one_block_evict_referenced_is_caught() {
    two_matches_revive_one_block(EVICT_REFERENCED);
}

/// Two sequences publish the same key on their own blocks at once:
/// exactly one block caches it, and a match finds that block.
fn two_publishes_of_one_key(faults: Faults) {
    check(move || {
        let cache = Cache::new(2, faults);
        let publishers: Vec<_> = (0..2)
            .map(|_| {
                let cache = Arc::clone(&cache);
                thread::spawn(move || cache.filled(7).expect("a block each"))
            })
            .collect();
        let done: Vec<(Sequence, usize)> =
            publishers.into_iter().map(|p| p.join().unwrap()).collect();
        let cached: usize = done.iter().map(|(_, n)| n).sum();
        assert_eq!(cached, 1, "{FIRST_WINS}: {cached} blocks cached one key");
        assert_eq!(cache.world.pool.cached_blocks(), 1);
        let winner = done.iter().find(|(_, n)| *n == 1).unwrap().0.blocks()[0];
        let m = cache.matched(7);
        assert_eq!(m.blocks(), [winner]);
        cache.let_go(m);
        for (seq, _) in done {
            cache.let_go(seq);
        }
        cache.world.assert_conserved();
    });
}

#[test]
fn two_publishes_of_one_key_sound() {
    two_publishes_of_one_key(SOUND);
}

#[test]
#[should_panic(expected = "first wins")]
fn two_publishes_of_one_key_no_kill_is_caught() {
    two_publishes_of_one_key(NO_KILL);
}

/// A match of key 1 against an allocation that evicts key 1's block and
/// publishes key 2 on it: the match gets key 1's content or misses.
fn match_vs_republish(faults: Faults) {
    check(move || {
        let cache = Cache::new(1, faults);
        let (a, _) = cache.filled(1).expect("one free block");
        cache.let_go(a);
        let matcher = spawn_matcher(&cache, 1);
        if let Some((b, _)) = cache.filled(2) {
            cache.let_go(b);
        }
        matcher.join().unwrap();
        cache.world.assert_conserved();
    });
}

#[test]
fn match_vs_republish_sound() {
    match_vs_republish(SOUND);
}

#[test]
#[should_panic(expected = "stale hit")]
fn match_vs_republish_no_generation_check_is_caught() {
    match_vs_republish(NO_GENERATION_CHECK);
}

/// The holder of key 1's block releases it while a match takes it (a
/// share, or a revival after the release) and an allocation waits to
/// evict it and publish key 2 there.
fn release_vs_match(faults: Faults) {
    check(move || {
        let cache = Cache::new(1, faults);
        let (a, _) = cache.filled(1).expect("one free block");
        let releaser = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || cache.let_go(a))
        };
        let matcher = spawn_matcher(&cache, 1);
        if let Some((b, _)) = cache.filled(2) {
            cache.let_go(b);
        }
        releaser.join().unwrap();
        matcher.join().unwrap();
        cache.world.assert_conserved();
    });
}

#[test]
fn release_vs_match_sound() {
    release_vs_match(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn release_vs_match_no_generation_check_is_caught() {
    release_vs_match(NO_GENERATION_CHECK);
}

/// Dropping every key against a match of one of them, with a third thread
/// allocating: a block the match holds keeps its key and is never freed.
fn reset_vs_match(faults: Faults) {
    check(move || {
        let cache = Cache::new(2, faults);
        let (a, _) = cache.filled(1).expect("two free blocks");
        cache.let_go(a);
        let resetter = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || cache.world.pool.reset_prefix_cache())
        };
        let matcher = spawn_matcher(&cache, 1);
        let mut s = Sequence::new(Arc::clone(&cache.world.pool));
        assert!(cache.append(&mut s, 1), "a free block and an evictable one");
        cache.let_go(s);
        resetter.join().unwrap();
        matcher.join().unwrap();
        cache.world.assert_conserved();
    });
}

#[test]
fn reset_vs_match_sound() {
    reset_vs_match(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn reset_vs_match_evict_referenced_is_caught() {
    reset_vs_match(EVICT_REFERENCED);
}

/// The `UnsafeCell` witness: one thread fills a block, publishes it and
/// keeps it; another matches it and reads it. The publisher's write must
/// happen-before the matcher's read through the publish alone (the
/// matcher shares a held block, so no admission orders anything).
fn publish_then_match(faults: Faults) {
    check(move || {
        let cache = Cache::new(1, faults);
        let publisher = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || cache.filled(3).expect("one free block").0)
        };
        let matcher = spawn_matcher(&cache, 3);
        matcher.join().unwrap();
        let a = publisher.join().unwrap();
        cache.let_go(a);
        cache.world.assert_conserved();
    });
}

#[test]
fn publish_then_match_sound() {
    publish_then_match(SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn publish_then_match_relaxed_publish_is_caught() {
    publish_then_match(RELAXED_PUBLISH);
}

/// Two publishers of key [`X`] (on their own blocks) while one of them
/// first publishes [`Y`], which fills `X`'s first bucket: whichever of
/// `Y`'s entry and the rival's each publisher saw, their entries may go
/// into different buckets of `X`. Exactly one block caches `X`, and a
/// match finds it.
fn two_publishes_in_two_buckets(faults: Faults) {
    check(move || {
        let cache = Cache::new(3, faults);
        let rival = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || cache.filled(X).expect("a block each"))
        };
        let (y, _) = cache.filled(Y).expect("a block each");
        let (x, mine) = cache.filled(X).expect("a block each");
        let (r, theirs) = rival.join().unwrap();
        assert_eq!(
            mine + theirs,
            1,
            "{FIRST_WINS}: {} blocks cached one key",
            mine + theirs
        );
        let winner = if mine == 1 {
            x.blocks()[0]
        } else {
            r.blocks()[0]
        };
        let m = cache.matched(X);
        assert_eq!(m.blocks(), [winner], "{NOT_FOUND}");
        for seq in [m, y, x, r] {
            cache.let_go(seq);
        }
        cache.world.assert_conserved();
    });
}

#[test]
fn two_publishes_in_two_buckets_sound() {
    two_publishes_in_two_buckets(SOUND);
}

#[test]
#[should_panic(expected = "first wins")]
fn two_publishes_in_two_buckets_fence_own_bucket_is_caught() {
    two_publishes_in_two_buckets(FENCE_OWN_BUCKET);
}

#[test]
#[should_panic(expected = "first wins")]
fn two_publishes_in_two_buckets_first_bucket_only_is_caught() {
    two_publishes_in_two_buckets(FIRST_BUCKET_ONLY);
}

/// With [`Y`] cached, a publish of [`X`] puts its entry in `X`'s second
/// bucket while a match of `X` runs: the match gets `X`'s content (whose
/// write happens-before its read, through the publish alone) or misses,
/// and a match once both are done finds the block.
fn publish_in_the_second_bucket_vs_match(faults: Faults) {
    check(move || {
        let cache = Cache::new(3, faults);
        let (y, _) = cache.filled(Y).expect("three free blocks");
        let publisher = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || cache.filled(X).expect("two free blocks").0)
        };
        let matcher = spawn_matcher(&cache, X);
        matcher.join().unwrap();
        let x = publisher.join().unwrap();
        let m = cache.matched(X);
        assert_eq!(m.blocks(), x.blocks(), "{NOT_FOUND}");
        for seq in [m, y, x] {
            cache.let_go(seq);
        }
        cache.world.assert_conserved();
    });
}

#[test]
fn publish_in_the_second_bucket_vs_match_sound() {
    publish_in_the_second_bucket_vs_match(SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn publish_in_the_second_bucket_vs_match_relaxed_publish_is_caught() {
    publish_in_the_second_bucket_vs_match(RELAXED_PUBLISH);
}

#[test]
#[should_panic(expected = "a cached key is not found")]
fn publish_in_the_second_bucket_vs_match_first_bucket_only_is_caught() {
    publish_in_the_second_bucket_vs_match(FIRST_BUCKET_ONLY);
}

/// A pool of 3 blocks: one held throughout, [`Y`] and then [`X`] cached
/// (`X`'s entry in its second bucket) and released, `X` first, so `X`'s
/// block is the least recently released. A match of `X` runs while an
/// allocation evicts `X`'s block (or `Y`'s, if the match revived `X`'s
/// first) and publishes [`Z`] on it: the match gets `X`'s content or
/// misses.
fn match_vs_evicting_republish_in_two_buckets(faults: Faults) {
    check(move || {
        let cache = Cache::new(3, faults);
        let mut held = Sequence::new(Arc::clone(&cache.world.pool));
        assert!(cache.append(&mut held, 1), "three free blocks");
        let (y, _) = cache.filled(Y).expect("two free blocks");
        let (x, _) = cache.filled(X).expect("one free block");
        cache.let_go(x);
        cache.let_go(y);
        let matcher = spawn_matcher(&cache, X);
        if let Some((z, _)) = cache.filled(Z) {
            cache.let_go(z);
        }
        matcher.join().unwrap();
        cache.let_go(held);
        cache.world.assert_conserved();
    });
}

#[test]
fn match_vs_evicting_republish_in_two_buckets_sound() {
    match_vs_evicting_republish_in_two_buckets(SOUND);
}

#[test]
#[should_panic(expected = "stale hit")]
fn match_vs_evicting_republish_in_two_buckets_no_generation_check_is_caught() {
    match_vs_evicting_republish_in_two_buckets(NO_GENERATION_CHECK);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn match_vs_evicting_republish_in_two_buckets_evict_referenced_is_caught() {
    match_vs_evicting_republish_in_two_buckets(EVICT_REFERENCED);
}

/// A sequence and its fork publish their shared block under one key at
/// once: each claim is a CAS (the block is not held alone), so one of them
/// caches it and the other finds it claimed or cached; once both let go
/// the block is evictable and the pool whole.
fn two_holders_publish_one_block(faults: Faults) {
    check(move || {
        let cache = Cache::new(1, faults);
        let mut a = Sequence::new(Arc::clone(&cache.world.pool));
        assert!(cache.append(&mut a, 1), "one free block");
        let (mut b, copy) = a.try_fork().expect("a full block is shared");
        assert_eq!(copy, None, "a fork on a block boundary copies nothing");
        cache.world.hold(b.blocks()[0]);
        let other = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || {
                let n = cache.publish(&mut b, 7);
                (b, n)
            })
        };
        let mine = cache.publish(&mut a, 7);
        let (b, theirs) = other.join().unwrap();
        let cached = mine + theirs;
        assert_eq!(
            cached, 1,
            "{FIRST_WINS}: {cached} publishes cached one block"
        );
        cache.let_go(a);
        cache.let_go(b);
        assert_eq!(cache.world.pool.cached_blocks(), 1);
        cache.world.assert_conserved();
    });
}

#[test]
fn two_holders_publish_one_block_sound() {
    two_holders_publish_one_block(SOUND);
}

#[test]
#[should_panic(expected = "first wins")]
fn two_holders_publish_one_block_shared_sole_claim_is_caught() {
    two_holders_publish_one_block(SHARED_SOLE_CLAIM);
}

/// Peeks at block 0, which holds key 1, against an allocation that evicts
/// key 1's block and publishes key 2 on it (as a lookup reaches a block
/// through an index entry it read while key 1, or another key with the
/// same fingerprint, sat there): a peek that finds key 2 there read the
/// state of key 2's commit, never one of key 1's; a key made of key 1's
/// first two words and key 2's last two (a torn read) is never found; and
/// a peek that finds key 1 read key 1's own state.
fn peek_vs_republish(faults: Faults) {
    check(move || {
        let cache = Cache::new(1, faults);
        let (a, _) = cache.filled(1).expect("one free block");
        cache.let_go(a);
        let block = BlockId::new(0);
        let pool = &cache.world.pool;
        let first = pool
            .peek_block_of_model(block, &key(1))
            .expect("key 1 is cached");
        let mut torn = [1u8; 32];
        torn[16..].fill(2);
        let torn = BlockHash(torn);
        let peeker = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || {
                let pool = &cache.world.pool;
                (
                    pool.peek_block_of_model(block, &key(2)),
                    pool.peek_block_of_model(block, &torn),
                    pool.peek_block_of_model(block, &key(1)),
                )
            })
        };
        if let Some((b, _)) = cache.filled(2) {
            cache.let_go(b);
        }
        let (two, torn, one) = peeker.join().unwrap();
        if let Some(seen) = two {
            assert_ne!(seen, first, "{STALE}: key 1's state passed for key 2's");
        }
        assert!(torn.is_none(), "{STALE}: a torn key peeked");
        if let Some(seen) = one {
            assert_eq!(seen, first, "{STALE}: key 1 under another state");
        }
        cache.world.assert_conserved();
    });
}

#[test]
fn peek_vs_republish_sound() {
    peek_vs_republish(SOUND);
}

#[test]
#[should_panic(expected = "stale hit")]
fn peek_vs_republish_relaxed_key_words_is_caught() {
    peek_vs_republish(RELAXED_KEY_WORDS);
}

#[test]
#[should_panic(expected = "stale hit")]
fn peek_vs_republish_peek_trusts_first_read_is_caught() {
    peek_vs_republish(PEEK_TRUSTS_FIRST_READ);
}

/// Two keys with one probe under the model checkers' seed (the same
/// buckets and fingerprint in a pool of 1 block; `keys.rs` checks it): a
/// lookup of either finds the other's index entry. With `P` cached, a
/// peek of `Q` (while another thread matches `P` and lets it go) counts
/// nothing, and a peek of `P` counts it.
fn peek_of_a_colliding_key(faults: Faults) {
    check(move || {
        let word = |n: u64| {
            let mut key = [0u8; 32];
            key[..8].copy_from_slice(&n.to_le_bytes());
            BlockHash(key)
        };
        let (p, q) = (word(40_952), word(87_864));
        let cache = Cache::new(1, faults);
        let mut a = Sequence::new(Arc::clone(&cache.world.pool));
        assert!(cache.append(&mut a, 1));
        assert_eq!(a.publish(&[p]), 1);
        cache.let_go(a);
        let peeker = {
            let cache = Arc::clone(&cache);
            thread::spawn(move || {
                let pool = &cache.world.pool;
                (pool.peek_prefix(&[q]), pool.peek_prefix(&[p]))
            })
        };
        let mut m = Sequence::new(Arc::clone(&cache.world.pool));
        assert_eq!(m.try_match_prefix(&[p]), 1);
        for &id in m.blocks() {
            cache.world.hold(id);
        }
        cache.let_go(m);
        let (of_q, of_p) = peeker.join().unwrap();
        assert_eq!(of_q, 0, "{STALE}: the other key's block");
        assert_eq!(of_p, 1);
        cache.world.assert_conserved();
    });
}

#[test]
fn peek_of_a_colliding_key_sound() {
    peek_of_a_colliding_key(SOUND);
}

#[test]
#[should_panic(expected = "stale hit")]
fn peek_of_a_colliding_key_peek_skips_key_is_caught() {
    peek_of_a_colliding_key(PEEK_SKIPS_KEY);
}
