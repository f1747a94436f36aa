//! Loom model of the ordering of a sequence's sole drop (a load and a
//! plain store of its block's state word): a fork's child reads the block
//! and drops its reference (a `Release` CAS) on one thread while its
//! parent drops on this one, which then allocates; if it gets the block
//! back, it writes it. The child's read must happen-before that write:
//! either the parent's sole drop read the child's drop with `Acquire`, or
//! the child gave the block back itself through the free list (a
//! `Release` the allocation acquires).
//!
//! Run with `scripts/loom sole_drop_order`.
//!
//! | model | threads, blocks | negative control, caught |
//! |---|---|---|
//! | [`co_holder_read_vs_next_owner`] | 2, 1 | `relaxed_sole_drop`: the sole drop's load `Relaxed` (a causality violation on the block's payload) |

use std::sync::Arc;

use crate::loom_tests::pool_world::{check, PoolWorld, RELAXED_SOLE_DROP, SOUND};
use crate::sync::Faults;
use crate::Sequence;
use loom::thread;

/// The model: a one-block pool, a one-token sequence and its fork.
fn co_holder_read_vs_next_owner(faults: Faults) {
    check(move || {
        let world = PoolWorld::new(1, 1, faults, "sequence");
        let mut seq = Sequence::new(Arc::clone(&world.pool));
        seq.try_append(1).expect("room");
        let id = seq.blocks()[0];
        world.take(id);
        world.write(id);
        let (child, copy) = seq.try_fork().expect("a full block is shared");
        assert!(copy.is_none());
        world.share(id);
        let w = Arc::clone(&world);
        let t = thread::spawn(move || {
            w.read(id);
            w.drop_ref(id);
            drop(child);
        });
        world.drop_ref(id);
        drop(seq);
        // The next owner, if the block is back already.
        let mut ids = Vec::new();
        if world.pool.try_alloc(1, &mut ids).is_ok() {
            world.take(ids[0]);
            world.write(ids[0]);
            world.drop_ref(ids[0]);
            world.pool.free(&ids).expect("just taken");
        }
        t.join().expect("the child's drop does not panic");
        world.assert_conserved();
    });
}

#[test]
fn co_holder_read_vs_next_owner_sound() {
    co_holder_read_vs_next_owner(SOUND);
}

#[test]
#[should_panic(expected = "Causality violation")]
fn co_holder_read_vs_next_owner_relaxed_sole_drop_is_caught() {
    co_holder_read_vs_next_owner(RELAXED_SOLE_DROP);
}
