//! Loom models of [`Sequence`] over one shared [`BlockPool`]: fork vs drop
//! (with and without a third thread appending), and append vs truncate on
//! different sequences, each with its negative control.
//!
//! Run with `scripts/loom sequence`.
//!
//! # What every model checks
//!
//! The same three things as `pool.rs`, driven through sequences:
//!
//! * **No double hand-out.** A shadow holder count per block: every block a
//!   sequence gets from the pool (the new blocks of an append, a fork's
//!   private tail) must have had no holder ([`DOUBLE`] otherwise); a fork
//!   adds a holder to each block it shares; a sequence about to give
//!   references back (truncate, drop) subtracts its holders first. All
//!   shadow RMWs are `Relaxed`, so that they add no happens-before edge that
//!   could hide a missing one in the pool.
//! * **Whole or nothing.** Every append returns exactly the positions asked
//!   for with exactly the blocks they need, or is refused with `Full` and
//!   changes nothing; every fork shares exactly the full blocks and copies
//!   exactly the partly filled tail.
//! * **Conservation** once every sequence is dropped: `free_blocks() ==
//!   num_blocks()`, every `ref_count` 0, and `num_blocks` distinct ids to be
//!   had.
//! * **Happens-before.** Each block's payload is a
//!   `loom::cell::UnsafeCell<usize>`: a sequence writes the blocks its new
//!   tokens land in (and a fork's copy destination), reads the blocks it
//!   holds (and a fork's copy source) before giving references back, and
//!   loom reports a "Causality violation" when the previous holder's access
//!   does not happen-before the next owner's write. Accesses are tracked by
//!   `with`/`with_mut` themselves; the pointer is never dereferenced, so no
//!   `unsafe` is needed.
//!
//! # Models and negative controls
//!
//! | model | threads, blocks | `relaxed_free` |
//! |---|---|---|
//! | [`fork_vs_drop`] | 2, 4 | caught: causality |
//! | [`fork_vs_drop`] over two free-list shards | 2, 4 | caught: causality |
//! | [`fork_vs_drop_vs_append`] | 3, 5 | caught: causality |
//! | [`append_vs_truncate`] | 2, 4 | caught: causality |
//! | [`append_vs_truncate`], contended (both appends may be refused) | 2, 4 | `keep_refused` instead: caught, not conserved |
//!
//! Each model also runs on a pool built with `relaxed_free` (the reference
//! drops and the free list's give-back `Relaxed` instead of `Release`), which
//! loom must catch as a causality violation, next to its fault-free twin.
//! In each, the allocating thread can be admitted through a block that was
//! free already, so that the pool's `SlotCounter` orders nothing between
//! the two threads; it then takes the block the other thread has just given
//! back (a take starts at the lowest free id), and only the free list's
//! orderings can order the two owners' accesses. (The free list's own
//! control lives in `pool.rs`: a sequence reaches the free list
//! only through the pool's take and give-back.)
//!
//! [`DOUBLE`]: crate::loom_tests::pool_world::DOUBLE

use std::ops::Range;
use std::sync::Arc;

use crate::loom_tests::pool_world::{check, PoolWorld, KEEP_REFUSED, RELAXED_FREE, SOUND};
use crate::sync::Faults;
use crate::{BlockCopy, BlockId, ReserveError, Sequence};
use loom::thread;

/// Token slots per block in every model here.
const BS: usize = 2;

/// A model's pool of `num_blocks` blocks of [`BS`] slots, with its shadow
/// holder counts and block payloads.
fn new_world(num_blocks: usize, faults: Faults) -> Arc<PoolWorld> {
    PoolWorld::new(num_blocks, BS, faults, "sequence")
}

/// [`new_world`] with the free list cut into `shards` shards.
fn new_world_over(num_blocks: usize, shards: usize, faults: Faults) -> Arc<PoolWorld> {
    PoolWorld::with_shards(num_blocks, BS, shards, faults, "sequence")
}

/// The checked sequence operations of these models.
trait SeqOps {
    /// A new, empty sequence over the pool.
    fn sequence(&self) -> Sequence;

    /// A holder reads `id` one last time and records that it is about to
    /// give its reference back.
    fn let_go(&self, id: BlockId);

    /// `try_append(n)`, checked whole or nothing; the blocks the new tokens
    /// land in are written.
    fn append(&self, seq: &mut Sequence, n: usize) -> Result<Range<usize>, ReserveError>;

    /// `try_fork()`, checked: the child shares exactly the full blocks and
    /// gets a private copy of a partly filled tail, which is read from the
    /// source and written into the destination.
    fn fork(&self, parent: &Sequence) -> Result<Sequence, ReserveError>;

    /// `truncate(len)`, checked: gives back exactly the blocks past the new
    /// length, each read one last time.
    fn truncate(&self, seq: &mut Sequence, len: usize);

    /// Drops `seq`, each of its blocks read one last time.
    fn drop_seq(&self, seq: Sequence);
}

impl SeqOps for PoolWorld {
    fn sequence(&self) -> Sequence {
        Sequence::new(Arc::clone(&self.pool))
    }

    fn let_go(&self, id: BlockId) {
        self.read(id);
        self.drop_ref(id);
    }

    fn append(&self, seq: &mut Sequence, n: usize) -> Result<Range<usize>, ReserveError> {
        let old_len = seq.len();
        let old_blocks = seq.blocks().to_vec();
        let result = seq.try_append_cow(n).map(|(range, copy)| {
            assert_eq!(copy, None, "no copy-on-write here");
            range
        });
        match &result {
            Ok(range) => {
                assert_eq!(
                    *range,
                    old_len..old_len + n,
                    "append returned other positions"
                );
                assert_eq!(seq.len(), old_len + n);
                assert_eq!(
                    seq.blocks().len(),
                    seq.len().div_ceil(BS),
                    "append took other than the blocks the tokens need"
                );
                assert_eq!(&seq.blocks()[..old_blocks.len()], &old_blocks[..]);
                for &id in &seq.blocks()[old_blocks.len()..] {
                    self.take(id);
                }
                let first = old_len / BS;
                for &id in &seq.blocks()[first..] {
                    self.write(id);
                }
            }
            Err(e) => {
                assert!(matches!(e, ReserveError::Full { .. }), "unexpected {e:?}");
                assert_eq!(seq.len(), old_len, "a refused append changed the length");
                assert_eq!(
                    seq.blocks(),
                    &old_blocks[..],
                    "a refused append changed the table"
                );
            }
        }
        result
    }

    fn fork(&self, parent: &Sequence) -> Result<Sequence, ReserveError> {
        let len = parent.len();
        let (full, tail) = (len / BS, len % BS);
        let (child, copy) = match parent.try_fork() {
            Ok(forked) => forked,
            Err(e) => {
                assert!(matches!(e, ReserveError::Full { .. }), "unexpected {e:?}");
                return Err(e);
            }
        };
        assert_eq!(child.len(), len);
        assert_eq!(child.blocks().len(), parent.blocks().len());
        assert_eq!(
            &child.blocks()[..full],
            &parent.blocks()[..full],
            "the child must share every full block"
        );
        for &id in &child.blocks()[..full] {
            self.share(id);
        }
        if tail == 0 {
            assert_eq!(copy, None, "a fork on a block boundary copies nothing");
        } else {
            let dst = child.blocks()[full];
            assert_eq!(
                copy,
                Some(BlockCopy {
                    src: parent.blocks()[full],
                    dst,
                    tokens: tail
                }),
                "the fork must copy exactly the partly filled tail"
            );
            assert!(
                !parent.blocks().contains(&dst),
                "the copy target is the parent's"
            );
            self.take(dst);
            self.read(parent.blocks()[full]);
            self.write(dst);
        }
        Ok(child)
    }

    fn truncate(&self, seq: &mut Sequence, len: usize) {
        let old = seq.blocks().to_vec();
        let old_len = seq.len();
        let keep = len.min(old_len).div_ceil(BS);
        for &id in &old[keep..] {
            self.let_go(id);
        }
        let freed = seq.truncate(len);
        assert_eq!(freed, old.len() - keep, "truncate gave back other blocks");
        assert_eq!(seq.blocks(), &old[..keep]);
        assert_eq!(seq.len(), len.min(old_len));
    }

    fn drop_seq(&self, seq: Sequence) {
        for &id in seq.blocks() {
            self.let_go(id);
        }
        drop(seq);
    }
}

/// Fork vs drop over a pool of 4 blocks of 2 slots.
///
/// Before the threads: parent `p` holds 3 tokens (a full block `b0` and a
/// tail `b1` with one token); `q` is a fork of it (sharing `b0`, with a
/// private copy `b2` of the tail). One block is free.
///
/// * Thread 1 forks `c` from `p` (a private tail for it: admitted through
///   the free block, but popping `b2` whenever `q` gave it back first), then
///   drops `c` and `p`.
/// * Thread 2 appends one token to `q` (into its private tail `b2`), then
///   drops `q`.
///
/// `b0` has three holders at most, dropped from both threads; whichever
/// drops last pushes it, exactly once.
///
/// Over two free-list shards (`fork_vs_drop_two_shards_*`; shard 0 owns
/// blocks 0 and 1, shard 1 owns 2 and 3) the main thread's home is shard
/// 0: `p` takes both of its blocks, and every tail block the forks need is
/// stolen from shard 1, where `q`'s tail goes back when thread 2 drops it.
fn fork_vs_drop(faults: Faults) {
    fork_vs_drop_over(1, faults);
}

fn fork_vs_drop_over(shards: usize, faults: Faults) {
    check(move || {
        let world = new_world_over(4, shards, faults);
        let mut p = world.sequence();
        world.append(&mut p, 3).expect("two of four blocks");
        let q = world.fork(&p).expect("a private tail from the two left");
        let dropper = {
            let world = Arc::clone(&world);
            let mut q = q;
            thread::spawn(move || {
                world
                    .append(&mut q, 1)
                    .expect("room left in the tail block");
                world.drop_seq(q);
            })
        };
        let c = world
            .fork(&p)
            .expect("a block is free for the tail whatever q does");
        world.drop_seq(c);
        world.drop_seq(p);
        dropper.join().unwrap();
        world.assert_conserved();
    });
}

#[test]
fn fork_vs_drop_sound() {
    fork_vs_drop(SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn fork_vs_drop_relaxed_free_is_caught() {
    fork_vs_drop(RELAXED_FREE);
}

#[test]
fn fork_vs_drop_two_shards_sound() {
    fork_vs_drop_over(2, SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn fork_vs_drop_two_shards_relaxed_free_is_caught() {
    fork_vs_drop_over(2, RELAXED_FREE);
}

/// Append vs truncate on two sequences over a pool of 4 blocks of 2 slots.
///
/// Before the threads: `s1` holds 4 tokens (`a0`, `a1`, both full), `s2`
/// holds 1 (`c0`). One block is free.
///
/// * Thread 1 rolls `s1` back to 2 tokens (giving `a1` back), then appends
///   `again` tokens.
/// * Thread 2 appends `grow` tokens to `s2`, then rolls it back to 1.
///
/// With `grow = 3` thread 2 needs one new block and is admitted through the
/// free one, popping `a1` whenever thread 1 gave it back first. With
/// `grow = 5` it needs two, so it is refused unless `a1` is back.
fn append_vs_truncate(grow: usize, again: usize, faults: Faults) {
    check(move || {
        let world = new_world(4, faults);
        let mut s1 = world.sequence();
        let mut s2 = world.sequence();
        world.append(&mut s1, 2 * BS).expect("two of four blocks");
        world.append(&mut s2, 1).expect("one of the two left");
        let grower = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                let grew = world.append(&mut s2, grow);
                if grew.is_err() {
                    assert!(grow > BS + 1, "refused {grow} tokens with a block free");
                }
                world.truncate(&mut s2, 1);
                s2
            })
        };
        world.truncate(&mut s1, BS);
        if again > 0 {
            // Refused only when thread 2 holds every other block.
            let _ = world.append(&mut s1, again);
        }
        let s2 = grower.join().unwrap();
        world.drop_seq(s1);
        world.drop_seq(s2);
        world.assert_conserved();
    });
}

#[test]
fn append_vs_truncate_sound() {
    append_vs_truncate(3, 0, SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn append_vs_truncate_relaxed_free_is_caught() {
    append_vs_truncate(3, 0, RELAXED_FREE);
}

/// Both sequences grow past the pool at once: thread 2 needs two blocks,
/// thread 1 one after its roll-back; each append is whole or refused.
#[test]
fn append_vs_truncate_contended_sound() {
    append_vs_truncate(5, BS + 1, SOUND);
}

/// The contended shape's refusals go through the admission's gathers: a
/// refused gather that keeps the counts it took loses them.
#[test]
#[should_panic(expected = "blocks not conserved")]
fn append_vs_truncate_contended_keep_refused_is_caught() {
    append_vs_truncate(5, BS + 1, KEEP_REFUSED);
}

/// Fork vs drop vs append, three threads over a pool of 5 blocks of 2
/// slots: the fork-vs-drop setup (3 blocks held, 2 free), with a third
/// thread that starts a sequence of its own, appends 3 tokens (two blocks,
/// whole or refused) and drops it.
fn fork_vs_drop_vs_append(faults: Faults) {
    check(move || {
        let world = new_world(5, faults);
        let mut p = world.sequence();
        world.append(&mut p, 3).expect("two of five blocks");
        let q = world.fork(&p).expect("a private tail from the three left");
        let dropper = {
            let world = Arc::clone(&world);
            let mut q = q;
            thread::spawn(move || {
                world
                    .append(&mut q, 1)
                    .expect("room left in the tail block");
                world.drop_seq(q);
            })
        };
        let appender = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                let mut r = world.sequence();
                let _ = world.append(&mut r, BS + 1);
                world.drop_seq(r);
            })
        };
        if let Ok(c) = world.fork(&p) {
            world.drop_seq(c);
        }
        world.drop_seq(p);
        dropper.join().unwrap();
        appender.join().unwrap();
        world.assert_conserved();
    });
}

#[test]
fn fork_vs_drop_vs_append_sound() {
    fork_vs_drop_vs_append(SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn fork_vs_drop_vs_append_relaxed_free_is_caught() {
    fork_vs_drop_vs_append(RELAXED_FREE);
}
