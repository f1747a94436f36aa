//! `BlockPool::stats`: each field is the value of the method it names, on
//! pools with and without the prefix cache and KV events, through a
//! script that moves every one of them (allocations, cached and evictable
//! blocks, matches, evictions, a retirement under a fence, a waiter, lost
//! events).

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use kvslots::{hash_blocks, BlockPool, PoolStats, PrefixStats, Sequence};

/// A waker that does nothing.
struct Noop;

impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// The stats as the individual methods give them.
fn by_method(
    pool: &BlockPool,
) -> (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    PrefixStats,
    usize,
) {
    (
        pool.num_blocks(),
        pool.used_blocks(),
        pool.peak_used_blocks(),
        pool.free_blocks(),
        pool.cached_blocks(),
        pool.evictable_blocks(),
        pool.pending_release_blocks(),
        pool.prefix_stats(),
        pool.waiters(),
    )
}

fn of_stats(
    s: &PoolStats,
) -> (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    PrefixStats,
    usize,
) {
    (
        s.num_blocks,
        s.used_blocks,
        s.peak_used_blocks,
        s.free_blocks,
        s.cached_blocks,
        s.evictable_blocks,
        s.pending_release_blocks,
        PrefixStats {
            queried_blocks: s.queried_blocks,
            hit_blocks: s.hit_blocks,
            evictions: s.evictions,
        },
        s.waiters,
    )
}

fn agree(pool: &BlockPool) -> PoolStats {
    let stats = pool.stats();
    assert_eq!(of_stats(&stats), by_method(pool));
    assert_eq!(stats.events_dropped.is_some(), pool.has_kv_events());
    stats
}

#[test]
fn stats_are_the_methods_values_through_a_script() {
    let pools = [
        BlockPool::new(4, 2),
        BlockPool::builder(4, 2).build().unwrap(),
        BlockPool::builder(4, 2)
            .prefix_cache(true)
            .kv_events(2)
            .build()
            .unwrap(),
    ];
    for pool in pools {
        let pool = Arc::new(pool);
        let cache = pool.has_prefix_cache();
        let empty = agree(&pool);
        assert_eq!((empty.used_blocks, empty.free_blocks), (0, 4));
        assert_eq!((empty.usage(), empty.hit_rate()), (0.0, 0.0));

        // Three blocks, published (with events: two records fit, the
        // third is lost), released: cached and evictable.
        let mut keys = Vec::new();
        hash_blocks(b"", &[1, 2, 3, 4, 5, 6], 2, &mut keys);
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(6).unwrap();
        assert_eq!(seq.publish(&keys), if cache { 3 } else { 0 });
        let held = agree(&pool);
        assert_eq!((held.used_blocks, held.usage()), (3, 0.75));
        drop(seq);
        let released = agree(&pool);
        assert_eq!(released.evictable_blocks, if cache { 3 } else { 0 });
        if pool.has_kv_events() {
            assert_eq!(released.events_dropped, Some(1));
        }

        // A match of the first two keys, and a fenced retirement.
        let mut matched = Sequence::new(Arc::clone(&pool));
        assert_eq!(
            matched.try_match_prefix(&keys[..2]),
            if cache { 2 } else { 0 }
        );
        let hit = agree(&pool);
        if cache {
            assert_eq!(
                (hit.queried_blocks, hit.hit_blocks, hit.hit_rate()),
                (2, 2, 1.0)
            );
        }
        matched.try_append(if cache { 0 } else { 4 }).unwrap();
        assert_eq!(matched.retire(7), 2);
        assert_eq!(agree(&pool).pending_release_blocks, 2);

        // Two blocks to allocate: with the cache, the third block's key
        // is evicted; then a waiter for three more.
        let mut ids = Vec::new();
        pool.try_alloc(2, &mut ids).unwrap();
        let full = agree(&pool);
        assert_eq!((full.used_blocks, full.peak_used_blocks), (4, 4));
        assert_eq!(full.evictions, if cache { 1 } else { 0 });
        let mut out = Vec::new();
        let mut wait = Box::pin(pool.alloc(3, &mut out));
        let waker = Waker::from(Arc::new(Noop));
        assert!(matches!(
            wait.as_mut().poll(&mut Context::from_waker(&waker)),
            Poll::Pending
        ));
        assert_eq!(agree(&pool).waiters, 1);
        drop(wait);
        assert_eq!(agree(&pool).waiters, 0);
        pool.free(&ids).unwrap();
        pool.complete(7);
        let end = agree(&pool);
        assert_eq!((end.used_blocks, end.pending_release_blocks), (0, 0));
    }
}
