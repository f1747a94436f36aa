//! The heap a pool takes, per block, with and without the prefix cache,
//! measured with a counting global allocator: the figures the builder's
//! docs give (`BlockPoolBuilder::memory_bytes`: 8 bytes and two bits a
//! block for the core pool, 70 more for the prefix cache) must hold,
//! `memory_bytes` must be what `build` allocates, and a layer not chosen
//! must take nothing.
//!
//! The count is of bytes live on this thread: every allocation adds its
//! size, every deallocation subtracts it. Each test runs on its own thread
//! (the harness's), and builds and drops its pool there.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use kvslots::{BlockPool, BlockPoolBuilder};

/// `System`, counting each thread's live heap bytes.
struct Counting;

thread_local! {
    // A `const` initialiser without a destructor: reading it never
    // allocates or registers anything, so the allocator can use it.
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn add(bytes: isize) {
    // `try_with`: a thread being torn down may still free memory.
    let _ = LIVE.try_with(|c| c.set(c.get() + bytes));
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are ours; the counting touches only a
// thread-local `Cell` and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        // SAFETY: forwarded as is (see the impl).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as isize - layout.size() as isize);
        // SAFETY: forwarded as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn live() -> isize {
    LIVE.with(Cell::get)
}

/// The heap bytes a pool of `num_blocks` blocks takes while it lives, and
/// what is left once it is dropped (must be 0).
fn footprint(num_blocks: usize, prefix_cache: bool) -> (usize, isize) {
    let before = live();
    let pool = BlockPool::builder(num_blocks, 16)
        .prefix_cache(prefix_cache)
        .build()
        .unwrap();
    let taken = live() - before;
    drop(pool);
    (taken as usize, live() - before)
}

/// The heap bytes `builder`'s pool takes while it lives, and what
/// `memory_bytes` says it takes; a dropped pool leaves nothing behind.
fn built(builder: BlockPoolBuilder) -> (usize, usize) {
    let predicted = builder.memory_bytes();
    let before = live();
    let pool = builder.build().unwrap();
    let taken = (live() - before) as usize;
    drop(pool);
    assert_eq!(live(), before, "a dropped pool left heap behind");
    (taken, predicted)
}

/// Blocks in the measured pools: large enough that the per-pool parts
/// (shards' cache lines, the fences' maps, the statistics' cells: a few
/// KiB) are under 0.1 byte a block.
const BLOCKS: usize = 1 << 16;

#[test]
fn the_core_pool_takes_8_bytes_and_a_bit_a_block() {
    let (bytes, left) = footprint(BLOCKS, false);
    assert_eq!(left, 0, "a dropped pool left heap behind");
    // A state word (8 bytes) and a bit of each of the free list's two
    // bitmaps (the free and the fresh) a block.
    let per_block = bytes as f64 / BLOCKS as f64;
    assert!(
        (8.25..8.375).contains(&per_block),
        "core pool: {per_block:.3} bytes a block ({bytes} bytes)"
    );
}

#[test]
fn the_prefix_cache_adds_70_bytes_a_block() {
    let (core, _) = footprint(BLOCKS, false);
    let (bytes, left) = footprint(BLOCKS, true);
    assert_eq!(left, 0, "a dropped pool left heap behind");
    // A key (32 bytes), 2.5 index slots of 8 (20), an eviction stamp (8),
    // 1.25 8-byte slots of the eviction ring (10) and a bit of the
    // refill's map.
    let layer = (bytes - core) as f64 / BLOCKS as f64;
    assert!(
        (70.125..70.25).contains(&layer),
        "prefix cache: {layer:.3} bytes a block ({} bytes)",
        bytes - core
    );
    let per_block = bytes as f64 / BLOCKS as f64;
    assert!((78.375..78.575).contains(&per_block), "{per_block:.3}");
}

/// `new` builds every layer: it takes what the builder takes with the
/// prefix cache.
#[test]
fn new_takes_what_a_pool_with_every_layer_takes() {
    let before = live();
    let pool = BlockPool::new(BLOCKS, 16);
    let bytes = (live() - before) as usize;
    drop(pool);
    assert_eq!(bytes, footprint(BLOCKS, true).0);
}

/// KV events take their rings (128 bytes a record, shared among the
/// shards' rings) and a 2-byte group tag a block, and nothing else:
/// exactly what `memory_bytes` says, and nothing when not chosen.
#[test]
fn kv_events_take_their_rings_and_nothing_when_off() {
    let with = |events: Option<usize>| {
        let builder = BlockPool::builder(BLOCKS, 16).shards(16).prefix_cache(true);
        built(match events {
            Some(capacity) => builder.kv_events(capacity),
            None => builder,
        })
    };
    let (off, off_predicted) = with(None);
    assert_eq!(off, footprint(BLOCKS, true).0);
    let (on, on_predicted) = with(Some(4096));
    // 16 rings of 256 records of 128 bytes, a cache line pair per ring
    // head, and the consumer's cursors; the blocks' group tags.
    let rings = on - off - 2 * BLOCKS;
    assert!(
        (4096 * 128..4096 * 128 + 16 * 256).contains(&rings),
        "{rings} bytes of rings"
    );
    assert_eq!(on - off, on_predicted - off_predicted);
}

/// `memory_bytes` is what `build` allocates, to the byte: the core pool,
/// the prefix cache and KV events, with few and many shards, down to a
/// pool of one block (where the per-pool parts are most of it).
#[test]
fn memory_bytes_is_what_build_takes() {
    for num_blocks in [1, 7, 64, 1000, BLOCKS] {
        for shards in [1, 4, 64] {
            for (prefix, events) in [(false, None), (true, None), (true, Some(256))] {
                let mut builder = BlockPool::builder(num_blocks, 16)
                    .shards(shards)
                    .prefix_cache(prefix);
                if let Some(capacity) = events {
                    builder = builder.kv_events(capacity);
                }
                let (taken, predicted) = built(builder);
                assert_eq!(
                    taken, predicted,
                    "{num_blocks} blocks, {shards} shards, prefix {prefix}, events {events:?}"
                );
            }
        }
    }
}
