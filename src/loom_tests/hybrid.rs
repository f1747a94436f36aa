//! Loom models of two [`HybridSequence`]s over one pool racing admission,
//! the sliding windows' give-backs and eviction, each with its negative
//! control.
//!
//! Run with `scripts/loom hybrid`.
//!
//! # What every model checks
//!
//! The pool's shadow holder counts and block payloads of
//! `crate::loom_tests::pool_world` (see `sequence.rs`), driven through
//! hybrid sequences: every block a sequence gets from the pool must have
//! had no holder ([`DOUBLE`] otherwise), the blocks a window leaves behind
//! are read one last time and counted out before the call that gives them
//! back, the blocks new tokens land in are written, matched blocks are
//! read, and loom reports a "Causality violation" when two accesses to a
//! block are not ordered. Once every sequence is gone, the pool must be
//! whole ([`LOST`] otherwise).
//!
//! # Models and negative controls
//!
//! | model | threads, blocks | control | caught by |
//! |---|---|---|---|
//! | [`admission_across_groups`]: two sequences of two groups append a block a group, with room for one | 2, 2 | `per_group_admission` (each group admitted alone, the earlier ones given back when a later one is refused) | both refused although one fits |
//! | [`window_vs_match`]: a sequence's append moves its window past a published block while another sequence matches it | 2, 4 | `recycle_shared` (the window's block reused unchecked) | handed out twice |
//! | [`match_vs_evicting_append`]: a match across a sliding and a full group while another sequence's append evicts the sliding group's block | 2, 5 | `unreconciled_match` (each group settled once) | a table that disagrees with the length |
//! | [`match_into_a_reservation_vs_evicting_append`]: a match into a reservation whose sliding group serves a shorter prefix than its full group, while another sequence's append evicts | 2, 5 | `cut_releases` (the full group's block let go of gives its admission back and keeps its credit) | blocks not conserved (the admission counts) |
//! | [`window_give_back_vs_append`]: a window gives a block back while another sequence's append can take it only then | 2, 3 | `relaxed_free` (the pool's give-back `Relaxed`) | causality |
//! | [`window_vs_double_free`]: a window gives back, or reuses, a block it holds alone while a raw free lists it (a double free) and then takes a block | 2, 2 or 3 | `free_ignores_sequence` (the raw free takes the sequence's reference; the sequence's sole drop a plain store) | blocks not conserved |
//!
//! A hybrid sequence's blocks are a sequence's: they carry the pool's
//! sequence flag, so a raw `BlockPool::free` refuses them
//! (`HeldBySequence`), and a window gives back a block it holds alone
//! with its sole drop (one CAS), or reuses it, with nothing to race.
//!
//! [`DOUBLE`]: crate::loom_tests::pool_world::DOUBLE
//! [`LOST`]: crate::loom_tests::pool_world::LOST

use std::ops::Range;
use std::sync::Arc;

use crate::loom_tests::pool_world::{
    assert_double_free_answer, check, check_long, check_long_one_preemption, PoolWorld,
    CUT_RELEASES, FREE_IGNORES_SEQUENCE, LOST, PER_GROUP_ADMISSION, RECYCLE_SHARED, RELAXED_FREE,
    SOUND, UNRECONCILED_MATCH,
};
use crate::sync::Faults;
use crate::{
    hash_blocks, BlockHash, BlockId, GroupKeys, HybridSequence, KvGroup, KvGroups, ReserveError,
};
use loom::thread;

/// Token slots per block in every model here.
const BS: usize = 2;

/// Both appends were refused although the pool had room for one.
const BOTH_REFUSED: &str = "both appends refused although one fits";
/// A matched table that does not hold exactly what its length needs.
const DISAGREES: &str = "a table disagrees with the length";

/// A sliding window of `window_tokens`, then full attention.
fn sliding_then_full(window_tokens: usize) -> KvGroups {
    KvGroups::new([KvGroup::SlidingWindow { window_tokens }, KvGroup::Full]).unwrap()
}

/// The group keys of `blocks` full blocks of tokens `0..`.
fn keys(groups: &KvGroups, blocks: usize) -> GroupKeys {
    let tokens: Vec<u32> = (0..(blocks * BS) as u32).collect();
    let mut base: Vec<BlockHash> = Vec::new();
    hash_blocks(b"", &tokens, BS, &mut base);
    groups.keys(&base)
}

/// The checked hybrid operations of these models.
trait HybridOps {
    /// A new, empty sequence over the pool, carrying `faults`.
    fn hybrid(&self, groups: &KvGroups, faults: Faults) -> HybridSequence;

    /// `try_append_cow(n)`, checked: the blocks each window leaves behind
    /// are read and counted out first; then the append is whole (every
    /// group holds the blocks the new length needs, the window's null
    /// entries in place) and its new blocks are taken and written, or it
    /// is refused with `Full` and changes nothing (the blocks counted out
    /// are counted in again).
    fn append(&self, seq: &mut HybridSequence, n: usize) -> Result<Range<usize>, ReserveError>;

    /// `try_match_prefix(keys)` on an empty sequence, checked: every group
    /// holds exactly the blocks the hit needs (a full group all of them, a
    /// sliding group its window), each one the publisher's block for that
    /// key (`published[g][i]`), and reads them.
    fn matched(&self, seq: &mut HybridSequence, keys: &GroupKeys, published: &[Vec<BlockId>]);

    /// Drops `seq`, each block it holds read one last time.
    fn drop_seq(&self, seq: HybridSequence);
}

impl HybridOps for PoolWorld {
    fn hybrid(&self, groups: &KvGroups, faults: Faults) -> HybridSequence {
        HybridSequence::with_faults(Arc::clone(&self.pool), groups.clone(), 0, faults)
    }

    fn append(&self, seq: &mut HybridSequence, n: usize) -> Result<Range<usize>, ReserveError> {
        let groups = seq.groups().clone();
        let old_len = seq.len();
        let before: Vec<Vec<BlockId>> = (0..groups.len())
            .map(|g| seq.blocks(g).unwrap().to_vec())
            .collect();
        // The blocks the windows leave behind: counted out before the call.
        let leaving = |g: usize| {
            let kind = groups.get(g).unwrap();
            let upto = kind.first_needed_block(old_len, BS);
            let from = seq.null_blocks(g).unwrap().min(upto);
            before[g][from..upto].to_vec()
        };
        let leaving: Vec<Vec<BlockId>> = (0..groups.len()).map(leaving).collect();
        for &id in leaving.iter().flatten() {
            self.read(id);
            self.drop_ref(id);
        }
        let mut copies = Vec::new();
        let result = seq.try_append_cow(n, &mut copies);
        match &result {
            Ok(range) => {
                assert_eq!(
                    *range,
                    old_len..old_len + n,
                    "append returned other positions"
                );
                assert!(copies.is_empty(), "no copy-on-write here");
                for (g, old) in before.iter().enumerate() {
                    let table = seq.blocks(g).unwrap();
                    assert_eq!(table.len(), (old_len + n).div_ceil(BS), "{DISAGREES}");
                    let upto = groups.get(g).unwrap().first_needed_block(old_len, BS);
                    assert!(table[..upto].iter().all(|id| id.is_null()), "{DISAGREES}");
                    assert_eq!(&table[upto..old.len()], &old[upto..], "{DISAGREES}");
                    for &id in &table[old.len()..] {
                        self.take(id);
                    }
                    for &id in &table[old_len / BS..] {
                        self.write(id);
                    }
                }
            }
            Err(e) => {
                assert!(matches!(e, ReserveError::Full { .. }), "unexpected {e:?}");
                assert_eq!(seq.len(), old_len, "a refused append changed the length");
                for (g, old) in before.iter().enumerate() {
                    assert_eq!(
                        seq.blocks(g).unwrap(),
                        &old[..],
                        "a refused append changed a table"
                    );
                }
                for &id in leaving.iter().flatten() {
                    self.hold(id);
                }
            }
        }
        result
    }

    fn matched(&self, seq: &mut HybridSequence, keys: &GroupKeys, published: &[Vec<BlockId>]) {
        let groups = seq.groups().clone();
        let k = seq.try_match_prefix(keys).unwrap();
        assert_eq!(seq.len(), k * BS, "{DISAGREES}");
        for (g, blocks) in published.iter().enumerate() {
            let table = seq.blocks(g).unwrap();
            assert_eq!(
                table.len(),
                k,
                "{DISAGREES}: group {g} holds {table:?} for {k} blocks"
            );
            let from = groups.get(g).unwrap().first_needed_block(k * BS, BS);
            for (i, &id) in table.iter().enumerate() {
                if i < from {
                    assert!(id.is_null(), "{DISAGREES}: group {g} entry {i}");
                } else {
                    assert_eq!(id, blocks[i], "{DISAGREES}: group {g} entry {i}");
                    self.hold(id);
                    self.read(id);
                }
            }
        }
    }

    fn drop_seq(&self, seq: HybridSequence) {
        for g in 0..seq.groups().len() {
            for &id in seq.blocks(g).unwrap() {
                if !id.is_null() {
                    self.read(id);
                    self.drop_ref(id);
                }
            }
        }
        drop(seq);
    }
}

/// Two sequences of a sliding and a full group, each appending a block's
/// worth of tokens (a block in each group: 2) to a pool of 2 blocks: one
/// of them fits, whichever comes first, and the other is refused whole.
///
/// Under `per_group_admission` each group's block is admitted on its own:
/// both sequences take their first group's block, both are refused the
/// second, and both give the first back: loom finds that interleaving
/// within two preemptions.
fn admission_across_groups(faults: Faults) {
    check(move || {
        let world = PoolWorld::new(2, BS, SOUND, "sequence");
        let groups = sliding_then_full(BS);
        let other = {
            let world = Arc::clone(&world);
            let groups = groups.clone();
            thread::spawn(move || {
                let mut seq = world.hybrid(&groups, faults);
                let fitted = world.append(&mut seq, BS).is_ok();
                (seq, fitted)
            })
        };
        let mut mine = world.hybrid(&groups, faults);
        let fitted = world.append(&mut mine, BS).is_ok();
        let (theirs, they_fitted) = other.join().unwrap();
        assert!(fitted || they_fitted, "{BOTH_REFUSED}");
        assert!(!(fitted && they_fitted), "both appends fitted in one pool");
        world.drop_seq(mine);
        world.drop_seq(theirs);
        world.assert_conserved();
    });
}

#[test]
fn admission_across_groups_sound() {
    admission_across_groups(SOUND);
}

#[test]
#[should_panic(expected = "both appends refused although one fits")]
fn admission_across_groups_per_group_admission_is_caught() {
    admission_across_groups(PER_GROUP_ADMISSION);
}

/// A sequence's window moves past a block it published while another
/// sequence matches that block, over a pool of 4 blocks of 2 slots.
///
/// Before the threads: `a` (one sliding group, window 2) holds 4 tokens in
/// blocks `a0` and `a1` and has published both.
///
/// * Thread 1 appends 2 tokens to `a`: position 4 reads 3..=4, so `a0`
///   leaves the window. It is cached, so it goes back to the pool
///   (evictable, its key kept) and `a` takes a free block.
/// * Thread 2 matches 1 block's keys into a new sequence `b`: a hit at 1
///   block needs the window of position 2, block 0: `a0`, shared with `a`
///   or revived once `a` let it go.
///
/// Under `recycle_shared`, `a` reuses `a0` for its new tokens without
/// checking it while `b` holds it: taken twice in the shadow (had `b`
/// matched after the reuse, `a`'s write would be unordered with `b`'s
/// read, a causality violation; loom reaches the first interleaving
/// first).
fn window_vs_match(faults: Faults) {
    check(move || {
        let world = PoolWorld::new(4, BS, SOUND, "sequence");
        let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: BS }]).unwrap();
        let mut a = world.hybrid(&groups, faults);
        world.append(&mut a, 2 * BS).expect("2 of 4 blocks");
        let published = vec![a.blocks(0).unwrap().to_vec()];
        assert_eq!(a.publish(&keys(&groups, 2)), Ok(2));
        let mover = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                world.append(&mut a, BS).expect("a free block is left");
                a
            })
        };
        let mut b = world.hybrid(&groups, faults);
        world.matched(&mut b, &keys(&groups, 1), &published);
        let a = mover.join().unwrap();
        world.drop_seq(a);
        world.drop_seq(b);
        world.assert_conserved();
    });
}

#[test]
fn window_vs_match_sound() {
    window_vs_match(SOUND);
}

#[test]
#[should_panic(expected = "handed out twice")]
fn window_vs_match_recycle_shared_is_caught() {
    window_vs_match(RECYCLE_SHARED);
}

/// A match across a sliding group (window 2) and a full group against
/// another sequence's append that evicts, over a pool of 5 blocks of 2
/// slots.
///
/// Before the threads: a sequence of 4 tokens published blocks `s0`, `s1`
/// (sliding group) and `f0`, `f1` (full group), and was dropped: the four
/// are cached and evictable, `s1` least recently released; one block is
/// free.
///
/// * Thread 1 appends 2 tokens to a new sequence `c` (one block a group):
///   the free block, and one evicted, `s1` unless the matcher holds it.
/// * Thread 2 matches the 2 blocks' keys into `b`: the full group takes
///   `f0` and `f1`; a hit at 2 blocks needs the sliding group's `s1`, and
///   without it the hit is 1 (`s0`), `f1` going back.
///
/// Under `unreconciled_match` the full group keeps `f1` when the sliding
/// group settles at 1: a table that disagrees with the length.
fn match_vs_evicting_append(faults: Faults) {
    check_long(10_000, move || {
        let world = PoolWorld::new(5, BS, SOUND, "sequence");
        let groups = sliding_then_full(BS);
        let keys = keys(&groups, 2);
        let mut p = world.hybrid(&groups, SOUND);
        world.append(&mut p, 2 * BS).expect("4 of 5 blocks");
        assert_eq!(p.publish(&keys), Ok(4));
        let published: Vec<Vec<BlockId>> = (0..2).map(|g| p.blocks(g).unwrap().to_vec()).collect();
        world.drop_seq(p);
        let evictor = {
            let world = Arc::clone(&world);
            let groups = groups.clone();
            thread::spawn(move || {
                let mut c = world.hybrid(&groups, SOUND);
                let _ = world.append(&mut c, BS);
                c
            })
        };
        let mut b = world.hybrid(&groups, faults);
        world.matched(&mut b, &keys, &published);
        let c = evictor.join().unwrap();
        world.drop_seq(b);
        world.drop_seq(c);
        world.assert_conserved();
    });
}

#[test]
fn match_vs_evicting_append_sound() {
    match_vs_evicting_append(SOUND);
}

#[test]
#[should_panic(expected = "a table disagrees with the length")]
fn match_vs_evicting_append_unreconciled_match_is_caught() {
    match_vs_evicting_append(UNRECONCILED_MATCH);
}

/// A match into a reservation across a sliding and a full group whose
/// sliding group serves a shorter prefix than the full group, while
/// another sequence's append evicts, over a pool of 5 blocks of 2 slots.
///
/// Before the threads: the two blocks of each group (`s0`, `s1`, `f0`,
/// `f1`) are published and let go of, and `s1` loses its key (free); the
/// matcher `m` reserves a block a group, the two free ones (`s1` and the
/// fifth), and the pool's other 3 are cached, no holder.
///
/// * Thread 1 appends 2 tokens to a new sequence `c` (one block a group):
///   a block the matcher lent, if free then, or cached ones, evicted
///   unless the matcher holds them.
/// * Thread 2 matches the 2 blocks' keys into `m`: it plans a hit of 1
///   (`s1` is not cached), the full group revives `f0` paid by a reserved
///   block (lent; the other is set aside for the sliding group's window)
///   and the sliding group `s0` paid by the other (lent). Where thread 1
///   evicts a block the plan counted on before the match takes it, the
///   group that misses it serves nothing, the hit is 0, and a block
///   revived already (`f0`) goes back with its place in the capacity
///   kept. Each group then holds its match entry, or, with no hit, a
///   fresh block again: the capacity of the reservation. What is left
///   over goes back.
///
/// Under `cut_releases` the match gives the admission of a block it lets
/// go of back and keeps its credit too: the credit, given back once more
/// at the end, counts the block free twice.
///
/// Searched at preemption bound 1 (the longest of these models: both
/// threads walk two groups through the eviction ring), which holds the
/// eviction of a block between the match's lookup and its revival;
/// `KVSLOTS_LOOM_FULL=1` searches at the environment's bound.
fn match_into_a_reservation_vs_evicting_append(faults: Faults) {
    check_long_one_preemption(10_000, move || {
        let world = PoolWorld::new(5, BS, SOUND, "sequence");
        let groups = sliding_then_full(BS);
        let keys = keys(&groups, 2);
        let mut p = world.hybrid(&groups, SOUND);
        world.append(&mut p, 2 * BS).expect("4 of 5 blocks");
        assert_eq!(p.publish(&keys), Ok(4));
        let published: Vec<Vec<BlockId>> = (0..2).map(|g| p.blocks(g).unwrap().to_vec()).collect();
        world.drop_seq(p);
        // `s1` loses its key: matched alone and truncated into (not seen
        // by the shadow, which counts no holder of it before or after).
        let mut u = crate::Sequence::new(Arc::clone(&world.pool));
        assert_eq!(u.try_match_prefix(&keys.group(0).unwrap()[1..2]), 1);
        // A truncate into the block drops its key.
        u.truncate(1);
        drop(u);
        let mut m = world.hybrid(&groups, faults);
        m.try_reserve(BS, 0).expect("the 2 free blocks");
        for g in 0..2 {
            let id = m.blocks(g).unwrap()[0];
            world.take(id);
            // Lendable: the shadow's reference goes before the match.
            world.drop_ref(id);
        }
        let evictor = {
            let world = Arc::clone(&world);
            let groups = groups.clone();
            thread::spawn(move || {
                let mut c = world.hybrid(&groups, SOUND);
                let _ = world.append(&mut c, BS);
                c
            })
        };
        let k = m.try_match_prefix(&keys).unwrap();
        assert!(k <= 1, "the sliding group serves no window ending at 2");
        assert_eq!((m.len(), m.capacity()), (k * BS, BS), "{DISAGREES}");
        for (g, blocks) in published.iter().enumerate() {
            let table = m.blocks(g).unwrap();
            assert_eq!(table.len(), 1, "{DISAGREES}: group {g} holds {table:?}");
            let id = table[0];
            if k == 1 {
                assert_eq!(id, blocks[0], "{DISAGREES}: group {g}");
                world.hold(id);
                world.read(id);
            } else {
                // Reserved again: ours alone, and written now.
                world.take(id);
                world.write(id);
            }
        }
        let c = evictor.join().unwrap();
        world.drop_seq(m);
        world.drop_seq(c);
        world.assert_conserved();
    });
}

#[test]
fn match_into_a_reservation_vs_evicting_append_sound() {
    match_into_a_reservation_vs_evicting_append(SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn match_into_a_reservation_vs_evicting_append_cut_releases_is_caught() {
    match_into_a_reservation_vs_evicting_append(CUT_RELEASES);
}

/// A window gives a block back while another sequence's append needs it,
/// over a pool of 3 blocks of 2 slots.
///
/// Before the threads: `a` (one sliding group, window 2) holds 3 tokens
/// in `a0` and `a1`; one block is free.
///
/// * Thread 1 appends 1 token to `a`: position 3 reads 2..=3, so `a0`
///   leaves the window; the token fits in `a1`, so nothing reuses `a0`,
///   which goes back to the pool.
/// * Thread 2 appends 2 tokens to a new sequence `b` of one full group:
///   one block, admitted through the block that was free already (so the
///   admission count orders nothing between the threads); the free list
///   hands out its lowest free block, so `b` takes `a0` (block 0)
///   whenever `a` gave it back first.
///
/// `a`'s last read of `a0` must happen-before `b`'s write into it: `a`
/// holds `a0` alone, so the window's give-back drops its count with one
/// CAS (`Acquire`, no `Release`), published by the free list's `Release`
/// `fetch_or`. Under the pool's `relaxed_free` control loom reports a
/// causality violation.
fn window_give_back_vs_append(pool_faults: Faults) {
    check(move || {
        let world = PoolWorld::new(3, BS, pool_faults, "sequence");
        let window = KvGroups::new([KvGroup::SlidingWindow { window_tokens: BS }]).unwrap();
        let mut a = world.hybrid(&window, SOUND);
        world.append(&mut a, BS + 1).expect("2 of 3 blocks");
        let mover = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                world.append(&mut a, 1).expect("room in the last block");
                assert_eq!(a.null_blocks(0), Some(1));
                a
            })
        };
        let full = KvGroups::new([KvGroup::Full]).unwrap();
        let mut b = world.hybrid(&full, SOUND);
        world.append(&mut b, BS).expect("a block was free");
        let a = mover.join().unwrap();
        world.drop_seq(a);
        world.drop_seq(b);
        world.assert_conserved();
    });
}

#[test]
fn window_give_back_vs_append_sound() {
    window_give_back_vs_append(SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn window_give_back_vs_append_relaxed_free_is_caught() {
    window_give_back_vs_append(RELAXED_FREE);
}

/// The pool while `seq` is the only holder: each block in its tables has
/// exactly one reference, the used count is what it holds, and so are
/// the admission counts (a block given back twice shows there).
fn assert_only_holder(world: &PoolWorld, seq: &HybridSequence, what: &str) {
    let pool = &world.pool;
    let held: Vec<BlockId> = (0..seq.groups().len())
        .flat_map(|g| seq.blocks(g).unwrap().iter().copied())
        .filter(|id| !id.is_null())
        .collect();
    assert_eq!(pool.used_blocks(), held.len(), "{LOST}: used ({what})");
    assert_eq!(
        pool.admission_free_uncapped(),
        pool.num_blocks() - held.len(),
        "{LOST}: the admission counts ({what})"
    );
    for &id in &held {
        assert_eq!(pool.ref_count(id), Some(1), "{LOST}: {id}'s count ({what})");
    }
}

/// A sliding window gives back, or reuses, a block that its sequence
/// holds alone while a raw `BlockPool::free` lists that block (a double
/// free, which is misuse: the block is the sequence's), over a pool of 2
/// or 3 blocks of 2 slots, all of them `a`'s.
///
/// Before the threads: `a` (one sliding group, window 2) holds 3 tokens
/// in `a0` and `a1` (`reuse` false), or 6 in `a0`, `a1` and `a2` (`reuse`
/// true).
///
/// * Thread 1 appends 1 token to `a`. With 3 tokens its window (2..=3)
///   leaves `a0` behind and the token fits in `a1`: `a0` goes back to the
///   pool with a plain store of its word (`a` is its only holder). With
///   6 the window (5..=6) leaves `a0` and `a1` behind and the token needs
///   a block: `a0`, held alone and uncached, is reused for it (no pool
///   call) and `a1` goes back.
/// * Thread 2 frees `a0` through the pool: refused, `HeldBySequence`
///   while `a` holds it and `NotAllocated` once it is back, changing
///   nothing; then it takes a block if one is free (the one `a` gave
///   back) and frees it.
///
/// Afterwards `a` is the only holder of what its table lists, and once it
/// is dropped the pool is whole. Under `free_ignores_sequence` the raw
/// free takes `a`'s reference to `a0`, and `a`'s sole drop is a load and
/// a plain store: racing it,
/// both give `a0` back (the admission counts show it); before the reuse,
/// `a` finds no other holder and reuses a block that is free.
fn window_vs_double_free(reuse: bool, pool_faults: Faults) {
    check(move || {
        let blocks = if reuse { 3 } else { 2 };
        let world = PoolWorld::new(blocks, BS, pool_faults, "sequence");
        let window = KvGroups::new([KvGroup::SlidingWindow { window_tokens: BS }]).unwrap();
        let mut a = world.hybrid(&window, SOUND);
        let len = if reuse { 3 * BS } else { BS + 1 };
        world.append(&mut a, len).expect("every block of the pool");
        let a0 = a.blocks(0).unwrap()[0];
        let mover = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                world
                    .append(&mut a, 1)
                    .expect("room in the last block, or the window's block");
                assert_eq!(a.null_blocks(0), Some(blocks - 1));
                a
            })
        };
        let r = world.pool.free(&[a0]);
        let mut got = Vec::new();
        if world.pool.try_alloc(1, &mut got).is_ok() {
            world.pool.free(&got).expect("just taken");
        }
        let a = mover.join().unwrap();
        assert_double_free_answer(r, a0);
        assert_only_holder(&world, &a, &format!("free said {r:?}"));
        world.drop_seq(a);
        world.assert_conserved();
    });
}

#[test]
fn window_give_back_vs_double_free_sound() {
    window_vs_double_free(false, SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn window_give_back_vs_double_free_free_ignores_sequence_is_caught() {
    window_vs_double_free(false, FREE_IGNORES_SEQUENCE);
}

#[test]
fn window_reuse_vs_double_free_sound() {
    window_vs_double_free(true, SOUND);
}

#[test]
#[should_panic(expected = "blocks not conserved")]
fn window_reuse_vs_double_free_free_ignores_sequence_is_caught() {
    window_vs_double_free(true, FREE_IGNORES_SEQUENCE);
}
