//! Attacks on the rule that a sequence that matched its prefix into a
//! reservation stays admitted (its appends and forks are growth). Every
//! test checks a promise of `implementation.rs` "Waiting" (new work never
//! passes a queued head, the head waits only for admitted work, all or
//! nothing, nothing changes on error, capacity stays, blocks conserved)
//! against the new rule. Deterministic (futures polled by hand), except
//! `threads_new_work_never_passes_the_head_beside_an_admitted_match`.

mod common;

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use kvslots::{
    hash_blocks, Alloc, BlockHash, BlockId, BlockPool, HybridSequence, KvGroup, KvGroups,
    ReserveError, Sequence,
};

use common::{assert_pool_whole, poll_once, waker, wakes, Counting};

const BS: usize = 4;

fn keys_of(n_blocks: usize) -> Vec<BlockHash> {
    let tokens: Vec<u32> = (0..(n_blocks * BS) as u32).collect();
    let mut keys = Vec::new();
    hash_blocks(b"attack", &tokens, BS, &mut keys);
    keys
}

/// A sequence holding `keys.len()` full published blocks.
fn owner(pool: &Arc<BlockPool>, keys: &[BlockHash]) -> Sequence {
    let mut s = Sequence::new(Arc::clone(pool));
    s.try_append(keys.len() * BS).unwrap();
    assert_eq!(s.publish(keys), keys.len());
    s
}

/// The free of `hog` grants the queued `head`: its waker runs once, and
/// its next poll is ready.
fn head_granted_at_free(
    pool: &BlockPool,
    hog: &[BlockId],
    head: Pin<&mut Alloc<'_>>,
    w: &Waker,
    head_wakes: &Counting,
) {
    pool.free(hog).unwrap();
    assert_eq!(wakes(head_wakes), 1);
    assert!(matches!(poll_once(head, w), Poll::Ready(Ok(()))));
}

fn behind(r: Result<std::ops::Range<usize>, ReserveError>) -> bool {
    matches!(r, Err(ReserveError::BehindWaiters { .. }))
}

fn snap(s: &Sequence) -> (usize, usize, Vec<BlockId>) {
    (s.len(), s.capacity(), s.blocks().to_vec())
}

/// `try_reserve(0, h)` takes nothing: it is no admission, and the match
/// after it is into an empty table: new work, refused behind the head.
#[test]
fn a_zero_token_reservation_then_a_match_is_still_new_work() {
    let pool = Arc::new(BlockPool::new(8, BS));
    let keys = keys_of(2);
    let own = owner(&pool, &keys); // 6 free
    let mut hog = Vec::new();
    pool.try_alloc(3, &mut hog).unwrap(); // 3 free
    let (w, head_wakes) = waker();
    let mut head_ids = Vec::new();
    let mut head = Box::pin(pool.alloc(4, &mut head_ids));
    assert!(poll_once(head.as_mut(), &w).is_pending());

    let mut s = Sequence::new(Arc::clone(&pool));
    s.try_reserve(0, 0).unwrap();
    s.try_reserve(0, 2).unwrap();
    assert!(s.blocks().is_empty());
    assert_eq!(s.try_match_prefix(&keys), 2);
    let before = snap(&s);
    assert!(
        behind(s.try_append(1)),
        "a 0-token reservation admitted the sequence"
    );
    assert_eq!(snap(&s), before, "a refused append changed the sequence");
    // Its fork on a block boundary is new work too.
    let (mut child, copy) = s.try_fork().unwrap();
    assert!(copy.is_none());
    assert!(behind(child.try_append(1)));
    // A real reservation is refused behind the head: it cannot be got now.
    let mut t = Sequence::new(Arc::clone(&pool));
    assert!(matches!(
        t.try_reserve(BS, 0),
        Err(ReserveError::BehindWaiters { .. })
    ));
    assert!(t.blocks().is_empty());
    assert_eq!(t.try_match_prefix(&keys), 2);
    assert!(behind(t.try_append(1)));
    assert_eq!(wakes(&head_wakes), 0);
    drop((s, t, child));
    head_granted_at_free(&pool, &hog, head.as_mut(), &w, &head_wakes);
    drop(head);
    pool.free(&head_ids).unwrap();
    drop(own);
    assert_pool_whole(&pool);
}

/// The relay: while nobody waits, one free block admits any number of
/// requests in turn (each reserves it, matches a shared prefix that takes
/// its place, and gives it back): they hold no private block, yet stay
/// running. Once a head queues, a newcomer cannot get in; the admitted
/// ones grow ahead of the head (documented growth), and the head is
/// granted at the release that makes its room, once they finish.
#[test]
fn a_relay_of_reservations_admitted_before_the_head_delays_it_only_until_they_finish() {
    let pool = Arc::new(BlockPool::new(8, BS));
    let keys = keys_of(4);
    let own = owner(&pool, &keys); // 4 free
    let mut admitted = Vec::new();
    for _ in 0..5 {
        let mut s = Sequence::new(Arc::clone(&pool));
        s.try_reserve(BS, 0).unwrap();
        assert_eq!(pool.free_blocks(), 3);
        assert_eq!(s.try_match_prefix(&keys), 4);
        assert_eq!((s.len(), s.capacity(), pool.free_blocks()), (16, 16, 4));
        admitted.push(s);
    }
    let mut hog = Vec::new();
    pool.try_alloc(1, &mut hog).unwrap(); // 3 free
    let (w, head_wakes) = waker();
    let mut head_ids = Vec::new();
    let mut head = Box::pin(pool.alloc(4, &mut head_ids));
    assert!(poll_once(head.as_mut(), &w).is_pending());

    // Newcomers: no path to admission.
    let mut n1 = Sequence::new(Arc::clone(&pool));
    assert!(matches!(
        n1.try_reserve(BS, 0),
        Err(ReserveError::BehindWaiters { .. })
    ));
    assert_eq!(n1.try_match_prefix(&keys), 4);
    assert!(behind(n1.try_append(4)));
    drop(n1);

    // The admitted ones grow: growth, all or nothing.
    for s in admitted.iter_mut().take(3) {
        assert_eq!(s.try_append(4), Ok(16..20));
    }
    assert_eq!(pool.free_blocks(), 0);
    let before = snap(&admitted[3]);
    assert_eq!(
        admitted[3].try_append(4),
        Err(ReserveError::Full {
            requested: 1,
            available: 0
        })
    );
    assert_eq!(snap(&admitted[3]), before);
    pool.free(&hog).unwrap(); // 1 free
    drop(admitted.remove(0)); // 2 free
    assert_eq!(admitted[2].try_append(4), Ok(16..20)); // 1 free: growth ahead of the head
    assert_eq!(wakes(&head_wakes), 0);
    drop(admitted.remove(0)); // 2
    drop(admitted.remove(0)); // 3
    assert_eq!(wakes(&head_wakes), 0);
    drop(admitted.remove(0)); // 4: the head's room
    assert_eq!(
        wakes(&head_wakes),
        1,
        "the head was not granted at the release"
    );
    assert_eq!(pool.free_blocks(), 0);
    assert!(matches!(poll_once(head.as_mut(), &w), Poll::Ready(Ok(()))));
    drop(head);
    pool.free(&head_ids).unwrap();
    drop(admitted);
    drop(own);
    assert_pool_whole(&pool);
}

/// A fork of a sequence that matched into a reservation is running, as a
/// fork of a sequence that reserved and appended is; a fork of one that
/// matched into an empty table is new work. (Consistency of the rule.)
#[test]
fn forks_follow_their_parent_admission() {
    let pool = Arc::new(BlockPool::new(12, BS));
    let keys = keys_of(2);
    let own = owner(&pool, &keys); // 10 free
    let mut matched_in = Sequence::new(Arc::clone(&pool));
    matched_in.try_reserve(BS, 0).unwrap();
    let mut appended = Sequence::new(Arc::clone(&pool));
    appended.try_reserve(8, 0).unwrap();
    appended.try_append(8).unwrap();
    let mut hog = Vec::new();
    pool.try_alloc(4, &mut hog).unwrap(); // 10 - 1 - 2 - 4 = 3 free
    let (w, head_wakes) = waker();
    let mut head_ids = Vec::new();
    let mut head = Box::pin(pool.alloc(5, &mut head_ids));
    assert!(poll_once(head.as_mut(), &w).is_pending());
    assert_eq!(matched_in.try_match_prefix(&keys), 2); // 4 free
    let mut fresh = Sequence::new(Arc::clone(&pool));
    assert_eq!(fresh.try_match_prefix(&keys), 2);

    let (mut c1, _) = matched_in.try_fork().unwrap();
    let (mut c2, _) = appended.try_fork().unwrap();
    let (mut c3, _) = fresh.try_fork().unwrap();
    assert_eq!(c1.try_append(1), Ok(8..9), "fork of the matched-in parent");
    assert_eq!(c2.try_append(1), Ok(8..9), "fork of the appended parent");
    assert!(behind(c3.try_append(1)), "fork of new work passed the head");
    // A partly filled tail's fork is growth too (a private block).
    let (c4, copy) = c1.try_fork().unwrap();
    assert!(copy.is_some());
    assert_eq!(wakes(&head_wakes), 0);
    drop((c1, c2, c3, c4, matched_in, appended, fresh));
    head_granted_at_free(&pool, &hog, head.as_mut(), &w, &head_wakes);
    drop(head);
    pool.free(&head_ids).unwrap();
    drop(own);
    assert_pool_whole(&pool);
}

/// After a match into a reservation: `truncate(0)` (and a match of 0 then
/// `shrink_to_fit`) leave an empty sequence, new work again; a truncate
/// into the matched prefix, or a `shrink_to_fit` of the reserved blocks
/// beyond it, keeps it admitted (it holds the same as new work that
/// matched into an empty table, which is refused). A second match
/// changes nothing.
#[test]
fn truncate_shrink_and_rematch_after_a_match_into_a_reservation() {
    let pool = Arc::new(BlockPool::new(16, BS));
    let keys = keys_of(2);
    let own = owner(&pool, &keys); // 14 free
    let mut a = Sequence::new(Arc::clone(&pool));
    a.try_reserve(16, 0).unwrap(); // 4 blocks
    let mut b = Sequence::new(Arc::clone(&pool));
    b.try_reserve(BS, 0).unwrap();
    let mut c = Sequence::new(Arc::clone(&pool));
    c.try_reserve(8, 0).unwrap(); // 2 blocks, matches nothing
    let mut d = Sequence::new(Arc::clone(&pool));
    d.try_reserve(BS, 0).unwrap();
    let mut hog = Vec::new();
    pool.try_alloc(4, &mut hog).unwrap(); // 14 - 8 - 4 = 2 free
    let (w, head_wakes) = waker();
    let mut head_ids = Vec::new();
    let mut head = Box::pin(pool.alloc(12, &mut head_ids));
    assert!(poll_once(head.as_mut(), &w).is_pending());

    // a: 2 matched replace 2 of 4 reserved; capacity stays.
    assert_eq!(a.try_match_prefix(&keys), 2);
    assert_eq!((a.len(), a.capacity(), a.blocks().len()), (8, 16, 4));
    assert_eq!(a.try_match_prefix(&keys), 0, "a second match");
    assert_eq!((a.len(), a.capacity()), (8, 16));
    assert_eq!(a.shrink_to_fit(), 2);
    assert_eq!((a.len(), a.capacity()), (8, 8));
    // Holds only the 2 matched blocks, as `fresh` below, but admitted.
    let mut fresh = Sequence::new(Arc::clone(&pool));
    assert_eq!(fresh.try_match_prefix(&keys), 2);
    assert_eq!(fresh.blocks(), a.blocks());
    assert!(behind(fresh.try_append(1)));
    assert_eq!(a.try_append(1), Ok(8..9), "shrunk after a match: growth");
    // Truncate into the matched prefix: still admitted.
    a.truncate(4);
    assert_eq!(a.blocks().len(), 1);
    let (r, copy) = a.try_append_cow(1).unwrap();
    assert_eq!((r, copy), (4..5, None)); // growth: a new block past the full one
    a.truncate(0);
    assert!(a.blocks().is_empty());
    let before = snap(&a);
    assert!(behind(a.try_append(1)), "emptied: new work again");
    assert_eq!(snap(&a), before);
    // b: matched into its reservation, then emptied by truncate(0).
    assert_eq!(b.try_match_prefix(&keys), 2);
    assert_eq!(b.truncate(0), 2);
    assert!(behind(b.try_append(1)));
    assert_eq!(
        b.try_match_prefix(&keys),
        2,
        "matched again, into an empty table"
    );
    assert!(
        behind(b.try_append(1)),
        "a rematch after truncate(0) is new work"
    );
    // c: a miss keeps the reservation; a second match (still len 0) too.
    let miss = keys_of(3)[2..].to_vec(); // a key nobody published
    assert_eq!(c.try_match_prefix(&miss), 0);
    assert_eq!((c.len(), c.blocks().len()), (0, 2));
    assert_eq!(c.try_match_prefix(&keys), 2);
    assert_eq!((c.len(), c.capacity()), (8, 8));
    assert_eq!(c.shrink_to_fit(), 0);
    // d: a miss, then shrink: empty, new work.
    assert_eq!(d.try_match_prefix(&miss), 0);
    assert_eq!(d.shrink_to_fit(), 1);
    assert!(behind(d.try_append(1)));
    assert_eq!(wakes(&head_wakes), 0);
    drop((a, b, c, d, fresh));
    head_granted_at_free(&pool, &hog, head.as_mut(), &w, &head_wakes);
    drop(head);
    pool.free(&head_ids).unwrap();
    drop(own);
    assert_pool_whole(&pool);
}

/// Revivals behind a head: the reserved blocks pay for as many evictable
/// blocks as they number, no more (the rest is a new admission, refused
/// for the head), capacity stays, and the sequence is then running.
#[test]
fn a_match_into_a_reservation_revives_only_what_it_pays_for() {
    let pool = Arc::new(BlockPool::new(8, BS));
    let keys = keys_of(4);
    drop(owner(&pool, &keys)); // 4 cached, evictable: 8 free
    let mut s = Sequence::new(Arc::clone(&pool));
    s.try_reserve(8, 0).unwrap(); // 2 blocks, 6 free
    let mut hog = Vec::new();
    pool.try_alloc(2, &mut hog).unwrap(); // 4 free (the 4 cached)
    let (w, head_wakes) = waker();
    let mut head_ids = Vec::new();
    let mut head = Box::pin(pool.alloc(5, &mut head_ids));
    assert!(poll_once(head.as_mut(), &w).is_pending());
    assert_eq!(
        s.try_match_prefix(&keys),
        2,
        "revived more than it paid for"
    );
    assert_eq!((s.len(), s.capacity(), pool.free_blocks()), (8, 8, 4));
    assert_eq!(s.try_append(4), Ok(8..12)); // growth: an evictable block
    assert_eq!(pool.free_blocks(), 3);
    assert_eq!(wakes(&head_wakes), 0);
    drop(s); // 2 matched go back cached, 1 private: 6 free
    assert_eq!(wakes(&head_wakes), 1);
    assert!(matches!(poll_once(head.as_mut(), &w), Poll::Ready(Ok(()))));
    drop(head);
    pool.free(&head_ids).unwrap();
    pool.free(&hog).unwrap();
    assert_pool_whole(&pool);
}

/// Real threads: a head waits for every block not the owner's; newcomers
/// hammer every path to admission (reservation, 0-token reservation then
/// match, match then append, fork of new work, reservation after a
/// match) while an admitted sequence matches into its reservation and
/// grows. No newcomer gets a block until the head is granted and
/// done; the head is granted; the pool is whole after.
#[test]
fn threads_new_work_never_passes_the_head_beside_an_admitted_match() {
    for _round in 0..20 {
        let pool = Arc::new(BlockPool::new(8, BS));
        let keys = Arc::new(keys_of(4));
        let own = owner(&pool, &keys); // 4 free
        let mut a = Sequence::new(Arc::clone(&pool));
        a.try_reserve(BS, 0).unwrap(); // 3 free
        let mut hog = Vec::new();
        pool.try_alloc(1, &mut hog).unwrap(); // 2 free
        let head = std::thread::spawn({
            let pool = Arc::clone(&pool);
            move || {
                let mut ids = Vec::new();
                // A hang guard only: the head must be granted long before.
                pool.alloc_blocking(4, &mut ids, Some(Duration::from_secs(20)))
                    .map(|()| ids)
            }
        });
        while pool.waiters() == 0 {
            std::thread::yield_now();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let passed = Arc::new(AtomicUsize::new(0));
        let tries = Arc::new(AtomicUsize::new(0));
        let newcomers: Vec<_> = (0..2)
            .map(|t| {
                let (pool, keys, stop, passed, tries) = (
                    Arc::clone(&pool),
                    Arc::clone(&keys),
                    Arc::clone(&stop),
                    Arc::clone(&passed),
                    Arc::clone(&tries),
                );
                std::thread::spawn(move || {
                    let mut i = t;
                    while !stop.load(Ordering::SeqCst) || tries.load(Ordering::SeqCst) < 50 {
                        tries.fetch_add(1, Ordering::SeqCst);
                        let mut s = Sequence::new(Arc::clone(&pool));
                        let ok = match i % 5 {
                            0 => s.try_reserve(BS, 0).is_ok(),
                            1 => {
                                s.try_reserve(0, 0).unwrap();
                                s.try_match_prefix(&keys);
                                s.try_append(4).is_ok()
                            }
                            2 => {
                                s.try_match_prefix(&keys);
                                s.try_append(1).is_ok()
                            }
                            3 => {
                                s.try_match_prefix(&keys);
                                match s.try_fork() {
                                    Ok((mut c, _)) => c.try_append(4).is_ok(),
                                    Err(_) => false,
                                }
                            }
                            _ => {
                                s.try_match_prefix(&keys);
                                s.try_reserve(s.len() + 4, 0).is_ok()
                            }
                        };
                        if ok {
                            passed.fetch_add(1, Ordering::SeqCst);
                        }
                        i += 1;
                    }
                })
            })
            .collect();
        // The admitted sequence: its match gives its reserved block back
        // (3 free, the head still waits for 4), then it grows.
        assert_eq!(a.try_match_prefix(&keys), 4);
        assert_eq!(a.capacity(), 16);
        assert!(a.try_append(4).is_ok(), "an admitted sequence's growth");
        // Growth: 1 block left free.
        assert_eq!(a.try_append(4), Ok(20..24));
        assert_eq!(pool.free_blocks(), 1);
        // Let the newcomers try while the head waits with blocks free.
        let seen = tries.load(Ordering::SeqCst);
        common::wait_until(|| tries.load(Ordering::SeqCst) >= seen + 200);
        assert_eq!(pool.waiters(), 1, "the head left the queue early");
        drop(a);
        pool.free(&hog).unwrap();
        let head_ids = head.join().unwrap().expect("the head was not granted");
        stop.store(true, Ordering::SeqCst);
        for n in newcomers {
            n.join().unwrap();
        }
        assert_eq!(
            passed.load(Ordering::SeqCst),
            0,
            "new work got blocks while the head waited or held every free block"
        );
        pool.free(&head_ids).unwrap();
        drop(own);
        assert_pool_whole(&pool);
    }
}

// ---------------------------------------------------------------------------
// Hybrid
// ---------------------------------------------------------------------------

fn hgroups() -> KvGroups {
    KvGroups::new([KvGroup::Full, KvGroup::SlidingWindow { window_tokens: 4 }]).unwrap()
}

fn htables(s: &HybridSequence) -> Vec<Vec<BlockId>> {
    (0..s.groups().len())
        .map(|g| s.blocks(g).unwrap().to_vec())
        .collect()
}

/// A hybrid sequence with a sliding window: after a match into its
/// reservation it grows (appends, a fork's) behind a head; a newcomer, and
/// a 0-token reservation then match, are refused; `truncate(0)` makes it
/// new work again; capacity stays; blocks are conserved.
#[test]
fn hybrid_sliding_match_into_a_reservation() {
    let pool = Arc::new(BlockPool::new(24, BS));
    let g = hgroups();
    let base = keys_of(4);
    let keys = g.keys(&base);
    let mut running = HybridSequence::new(Arc::clone(&pool), g.clone());
    running.try_append(16).unwrap();
    assert!(running.publish(&keys).unwrap() >= 5);
    let mut a = HybridSequence::new(Arc::clone(&pool), g.clone());
    a.try_reserve(20, 0).unwrap(); // 5 blocks a group
    let held_a = a.held_blocks();
    let free = pool.free_blocks();
    let mut hog = Vec::new();
    pool.try_alloc(free - 2, &mut hog).unwrap(); // 2 free
    let (w, head_wakes) = waker();
    let mut head_ids = Vec::new();
    let mut head = Box::pin(pool.alloc(pool.num_blocks(), &mut head_ids));
    // The whole pool: a raw alloc waits for it (granted once all is free).
    assert!(poll_once(head.as_mut(), &w).is_pending());
    assert_eq!(a.try_match_prefix(&keys), Ok(4));
    assert_eq!(a.len(), 16);
    assert!(a.capacity() >= 20, "capacity shrank: {}", a.capacity());
    assert!(a.held_blocks() <= held_a);
    let free_after = pool.free_blocks();
    // Growth: within the reservation first, then beyond it.
    assert_eq!(a.try_append(4), Ok(16..20));
    let mut grew = 0;
    while a.try_append(4).is_ok() {
        grew += 1;
        assert!(grew < 100);
    }
    assert!(
        grew > 0 || free_after == 0,
        "no growth with {free_after} free"
    );
    let before = htables(&a);
    let len = a.len();
    assert!(matches!(a.try_append(4), Err(ReserveError::Full { .. })));
    assert_eq!(
        (a.len(), htables(&a)),
        (len, before),
        "a refused append changed it"
    );

    let mut n1 = HybridSequence::new(Arc::clone(&pool), g.clone());
    n1.try_reserve(0, 0).unwrap();
    assert_eq!(n1.try_match_prefix(&keys), Ok(4));
    let before = htables(&n1);
    assert!(matches!(
        n1.try_append(4),
        Err(ReserveError::BehindWaiters { .. }) | Err(ReserveError::Full { .. })
    ));
    assert_eq!(htables(&n1), before);
    let mut n2 = HybridSequence::new(Arc::clone(&pool), g.clone());
    assert!(n2.try_reserve(4, 0).is_err());
    assert_eq!(n2.held_blocks(), 0);

    // Free four blocks (head still pending): the admitted one's fork
    // grows (a block a group), the newcomer's append is refused behind the
    // head with blocks free.
    pool.free(&hog[..4]).unwrap();
    assert_eq!(wakes(&head_wakes), 0);
    let mut copies = Vec::new();
    let mut child = a.try_fork(&mut copies).unwrap();
    assert!(
        child.try_append(1).is_ok(),
        "a fork of an admitted sequence"
    );
    assert!(matches!(
        n1.try_append(1),
        Err(ReserveError::BehindWaiters { .. })
    ));
    drop(child);
    // truncate(0): new work again.
    a.truncate(0).unwrap();
    assert_eq!(a.held_blocks(), 0);
    assert!(matches!(
        a.try_append(1),
        Err(ReserveError::BehindWaiters { .. })
    ));
    assert_eq!(a.held_blocks(), 0);
    assert_eq!(wakes(&head_wakes), 0);
    drop((a, n1, n2, running));
    pool.free(&hog[4..]).unwrap();
    assert_eq!(wakes(&head_wakes), 1);
    assert!(matches!(poll_once(head.as_mut(), &w), Poll::Ready(Ok(()))));
    drop(head);
    pool.free(&head_ids).unwrap();
    assert_pool_whole(&pool);
}

/// A hybrid match into a reservation that the cache pays whole (every
/// matched block shared): after `shrink_to_fit` gives each group's
/// reservation back, the sequence holds only shared blocks and stays
/// running; a second match returns 0 and changes nothing.
#[test]
fn hybrid_rematch_and_shrink_after_a_match_into_a_reservation() {
    let pool = Arc::new(BlockPool::new(16, BS));
    let g = KvGroups::new([KvGroup::Full, KvGroup::Full]).unwrap();
    let base = keys_of(2);
    let keys = g.keys(&base);
    let mut running = HybridSequence::new(Arc::clone(&pool), g.clone());
    running.try_append(8).unwrap();
    assert_eq!(running.publish(&keys), Ok(4));
    let mut a = HybridSequence::new(Arc::clone(&pool), g.clone());
    a.try_reserve(12, 0).unwrap(); // 3 a group: 6
    let mut hog = Vec::new();
    pool.try_alloc(4, &mut hog).unwrap(); // 16 - 4 - 6 - 4 = 2 free
    let (w, head_wakes) = waker();
    let mut head_ids = Vec::new();
    let mut head = Box::pin(pool.alloc(12, &mut head_ids));
    assert!(poll_once(head.as_mut(), &w).is_pending());
    assert_eq!(a.try_match_prefix(&keys), Ok(2));
    assert_eq!((a.len(), a.capacity(), a.held_blocks()), (8, 12, 6));
    let before = htables(&a);
    assert_eq!(a.try_match_prefix(&keys), Ok(0));
    assert_eq!(htables(&a), before);
    assert_eq!(a.shrink_to_fit(), 2);
    assert_eq!(a.try_append(1), Ok(8..9), "shrunk: still admitted");
    let mut fresh = HybridSequence::new(Arc::clone(&pool), g);
    assert_eq!(fresh.try_match_prefix(&keys), Ok(2));
    assert!(matches!(
        fresh.try_append(1),
        Err(ReserveError::BehindWaiters { .. })
    ));
    drop((a, fresh, running));
    head_granted_at_free(&pool, &hog, head.as_mut(), &w, &head_wakes);
    drop(head);
    pool.free(&head_ids).unwrap();
    assert_pool_whole(&pool);
}
