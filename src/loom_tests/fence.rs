//! Loom models of fenced release: a sequence giving its blocks up under a
//! fence ([`Sequence::retire`](crate::Sequence::retire),
//! [`Sequence::truncate_fenced`](crate::Sequence::truncate_fenced))
//! racing the device thread that declares the fence complete
//! ([`BlockPool::complete`](crate::BlockPool::complete)) racing an
//! allocation that wants the block. The block must never be handed out
//! before the fence is declared complete.
//!
//! Run with `scripts/loom fence`.
//!
//! In the first two models the main thread owns a sequence over a pool of
//! one-slot blocks and writes its blocks; then three things race:
//!
//! * the scheduler (a spawned thread) gives a block up under fence 1;
//! * the device (another spawned thread) reads the block (the step in
//!   flight), sets a `declared` flag, lowers the shadow, and calls
//!   `complete(1)`;
//! * the main thread allocates one block: if it gets the retired one, the
//!   fence must have been declared (`declared` is set, the shadow says no
//!   one holds it) and the device's read must happen-before its write.
//!
//! `complete(1)` may run before the retire; then the block stays retired
//! (a retirement waits for the first complete after it) and the
//! allocation is refused; the model completes the fence again once every
//! thread is done and checks conservation.
//!
//! In the others the retirements come first (two sequences' blocks, or one
//! block that a sequence and its fork share) and two device threads, each
//! reading its step's block before it declares its fence complete, race
//! each other and the allocating main thread.
//!
//! | model | threads, blocks | `early_release` |
//! |---|---|---|
//! | [`retire_vs_complete_vs_alloc`] | 3, 1 | caught: handed out before its fence |
//! | [`truncate_fenced_vs_complete_vs_alloc`] | 3, 2 | caught: handed out before its fence |
//! | [`two_fences_complete_in_either_order`] | 3, 2 | caught: handed out before its fence |
//! | [`shared_block_two_completers`] | 3, 1 | caught: handed out before its fence |
//!
//! [`shared_block_two_completers`] has a second
//! control, `relaxed_free`: the first completer's drop, `Relaxed`, does not
//! order its step's read before the new owner's write.

use std::sync::Arc;

use crate::loom_tests::pool_world::{check, Allocs, PoolWorld, EARLY_RELEASE, RELAXED_FREE, SOUND};
use crate::sync::{AtomicBool, Faults, Ordering};
use crate::{BlockId, Sequence};
use loom::thread;

/// The message of a block handed out before its fence was declared
/// complete.
const EARLY: &str = "handed out before its fence completed";

/// The shape of both models: the main thread's sequence takes `tokens`
/// one-slot blocks of a pool of `num_blocks`, writes them, and
/// `give_up` gives the sequence's last block up under fence 1 (returning
/// what of the sequence is left, to drop at the end).
fn fenced_vs_complete_vs_alloc(
    faults: Faults,
    num_blocks: usize,
    give_up: fn(Sequence) -> Option<Sequence>,
) {
    // Executions in which the allocation got the retired block: the model
    // must reach that case (a plain std counter, outside the model).
    let handed_out = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&handed_out);
    check(move || {
        let world = PoolWorld::new(num_blocks, 1, faults, "sequence");
        let mut seq = Sequence::new(Arc::clone(&world.pool));
        seq.try_append(num_blocks).expect("a fresh pool");
        for &id in seq.blocks() {
            world.take(id);
            world.write(id);
        }
        let last: BlockId = *seq.blocks().last().unwrap();
        let declared = Arc::new(AtomicBool::new(false));
        let scheduler = thread::spawn(move || give_up(seq));
        let device = {
            let (world, declared) = (Arc::clone(&world), Arc::clone(&declared));
            thread::spawn(move || {
                // The step in flight reads the block.
                world.read(last);
                // Relaxed: the flag is ordered before a new owner's check
                // by the pool itself (the complete's `Release` drop, the
                // allocation's `Acquire`), which is what is under test.
                // Release: the read above happens-before whoever sees the
                // flag, so a control is caught by the assertion below, not
                // (first) by the `UnsafeCell` race it would also cause.
                declared.store(true, Ordering::Release);
                world.drop_ref(last);
                world.pool.complete(1);
            })
        };
        let mut got = Vec::new();
        if world.pool.try_alloc(1, &mut got).is_ok() {
            // Relaxed: see the store.
            // Acquire: pairs with the device's Release (see there).
            assert!(declared.load(Ordering::Acquire), "{last} {EARLY}");
            world.take(got[0]);
            world.write(got[0]);
            // Relaxed: a std counter of loom's executions, run one at a time.
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let rest = scheduler.join().unwrap();
        device.join().unwrap();
        // A complete that ran before the retire released nothing: the
        // retirement waits for the next complete of its fence.
        world.pool.complete(1);
        world.give_back(&got);
        if let Some(seq) = rest {
            for &id in seq.blocks() {
                world.drop_ref(id);
            }
        }
        assert_eq!(world.pool.pending_release_blocks(), 0);
        world.assert_conserved();
    });
    // Relaxed: every execution is done.
    let handed_out = handed_out.load(std::sync::atomic::Ordering::Relaxed);
    assert!(handed_out > 0, "no execution handed the retired block out");
}

/// The scheduler retires the whole one-block sequence (a completed or
/// preempted request).
fn retire_vs_complete_vs_alloc(faults: Faults) {
    fenced_vs_complete_vs_alloc(faults, 1, |seq| {
        seq.retire(1);
        None
    });
}

#[test]
fn retire_vs_complete_vs_alloc_sound() {
    retire_vs_complete_vs_alloc(SOUND);
}

#[test]
// Caught as a block handed out before its fence completed, or, when the
// device has read it but not yet let go, as a block handed out twice.
#[should_panic(expected = "handed out")]
fn retire_vs_complete_vs_alloc_early_release_is_caught() {
    retire_vs_complete_vs_alloc(EARLY_RELEASE);
}

/// The scheduler truncates the two-block sequence to one block under the
/// fence (rejected drafts that the step in flight verifies); the other
/// block stays with the sequence, so the allocation can only get the
/// retired one.
fn truncate_fenced_vs_complete_vs_alloc(faults: Faults) {
    fenced_vs_complete_vs_alloc(faults, 2, |mut seq| {
        assert_eq!(seq.truncate_fenced(1, 1), 1);
        Some(seq)
    });
}

#[test]
fn truncate_fenced_vs_complete_vs_alloc_sound() {
    truncate_fenced_vs_complete_vs_alloc(SOUND);
}

#[test]
// Caught as in `retire_vs_complete_vs_alloc_early_release_is_caught`.
#[should_panic(expected = "handed out")]
fn truncate_fenced_vs_complete_vs_alloc_early_release_is_caught() {
    truncate_fenced_vs_complete_vs_alloc(EARLY_RELEASE);
}

/// Two device threads: device `i` reads `blocks[i]` (its step in flight),
/// sets `declared[i]`, lowers the block's shadow and completes
/// `fences[i]`, returning what the complete gave back.
fn two_devices(
    world: &Arc<PoolWorld>,
    blocks: [BlockId; 2],
    fences: [u64; 2],
) -> (Arc<[AtomicBool; 2]>, [thread::JoinHandle<usize>; 2]) {
    let declared = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
    let devices = [0, 1].map(|i| {
        let (world, declared) = (Arc::clone(world), Arc::clone(&declared));
        thread::spawn(move || {
            world.read(blocks[i]);
            // Relaxed: as in `fenced_vs_complete_vs_alloc`.
            // Release / Acquire: as in `fenced_vs_complete_vs_alloc`.
            declared[i].store(true, Ordering::Release);
            world.drop_ref(blocks[i]);
            world.pool.complete(fences[i])
        })
    });
    (declared, devices)
}

/// Two fences that share a map (1 and 9; there are 8 maps), each holding
/// one retired block, completed by two device threads in either order
/// while the main thread allocates one block: whichever block it gets, that
/// block's fence must have been declared complete. Each complete gives back exactly its own
/// retirement; conservation once both fences are done.
fn two_fences_complete_in_either_order(faults: Faults) {
    check(move || {
        let world = PoolWorld::new(2, 1, faults, "sequence");
        let fences = [1u64, 9];
        let seqs: Vec<Sequence> = fences
            .iter()
            .map(|_| {
                let mut seq = Sequence::new(Arc::clone(&world.pool));
                seq.try_append(1).expect("a fresh pool of 2");
                world.take(seq.blocks()[0]);
                world.write(seq.blocks()[0]);
                seq
            })
            .collect();
        let blocks: [BlockId; 2] = [seqs[0].blocks()[0], seqs[1].blocks()[0]];
        for (seq, fence) in seqs.into_iter().zip(fences) {
            seq.retire(fence);
        }
        let (declared, devices) = two_devices(&world, blocks, fences);
        let mut got = Vec::new();
        if world.pool.try_alloc(1, &mut got).is_ok() {
            let i = blocks
                .iter()
                .position(|&b| b == got[0])
                .expect("a retired block");
            // Relaxed: see the store.
            assert!(declared[i].load(Ordering::Acquire), "{} {EARLY}", got[0]);
            world.take(got[0]);
            world.write(got[0]);
        }
        for d in devices {
            assert_eq!(d.join().unwrap(), 1, "each complete gives back its own");
        }
        world.give_back(&got);
        assert_eq!(world.pool.pending_release_blocks(), 0);
        world.assert_conserved();
    });
}

#[test]
fn two_fences_complete_in_either_order_sound() {
    two_fences_complete_in_either_order(SOUND);
}

#[test]
#[should_panic(expected = "handed out before its fence completed")]
fn two_fences_complete_in_either_order_early_release_is_caught() {
    two_fences_complete_in_either_order(EARLY_RELEASE);
}

/// One block that a sequence and its fork share, retired under two fences
/// (1 by the parent, 2 by the fork; a request and its beam, or a
/// request and the prefix it shares, each in its own step), completed by
/// two device threads at once while the main thread allocates one block.
/// The two completes drop the block's two references on the lock-free
/// path; whichever drops the last gives the block back, exactly once, and
/// only after both steps have read it: a new owner must see both fences
/// declared, and both reads must happen-before its write.
fn shared_block_two_completers(faults: Faults) {
    let handed_out = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&handed_out);
    check(move || {
        let world = PoolWorld::new(1, 1, faults, "sequence");
        let mut seq = Sequence::new(Arc::clone(&world.pool));
        seq.try_append(1).expect("a fresh pool of 1");
        let id = seq.blocks()[0];
        world.take(id);
        world.write(id);
        let (child, copy) = seq.try_fork().expect("a full block needs no copy");
        assert!(copy.is_none(), "a full block needs no copy");
        assert_eq!(child.blocks(), [id]);
        world.share(id);
        let fences = [1u64, 2];
        seq.retire(fences[0]);
        child.retire(fences[1]);
        let (declared, devices) = two_devices(&world, [id, id], fences);
        let mut got = Vec::new();
        if world.pool.try_alloc(1, &mut got).is_ok() {
            assert_eq!(got, [id]);
            for flag in declared.iter() {
                // Relaxed: see the store.
                assert!(flag.load(Ordering::Acquire), "{id} {EARLY}");
            }
            world.take(id);
            world.write(id);
            // Relaxed: a std counter of loom's executions, run one at a time.
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let released: usize = devices.into_iter().map(|d| d.join().unwrap()).sum();
        assert_eq!(released, 2, "each retired reference given back once");
        world.give_back(&got);
        assert_eq!(world.pool.pending_release_blocks(), 0);
        world.assert_conserved();
    });
    // Relaxed: every execution is done.
    let handed_out = handed_out.load(std::sync::atomic::Ordering::Relaxed);
    assert!(handed_out > 0, "no execution handed the shared block out");
}

#[test]
fn shared_block_two_completers_sound() {
    shared_block_two_completers(SOUND);
}

#[test]
#[should_panic(expected = "handed out")]
fn shared_block_two_completers_early_release_is_caught() {
    shared_block_two_completers(EARLY_RELEASE);
}

#[test]
// The first drop's `Relaxed` decrement starts no release sequence that the
// last drop's give-back continues: the allocation sees the last
// completer's flag but not necessarily the first's.
#[should_panic(expected = "handed out before its fence completed")]
fn shared_block_two_completers_relaxed_free_is_caught() {
    shared_block_two_completers(RELAXED_FREE);
}
