//! A counting global allocator for the test binaries that prove "no heap
//! allocation" promises (`zero_alloc`, `hybrid_capacity`): `System`, with
//! each thread's allocations, deallocations and bytes asked for counted
//! (the test harness runs tests on parallel threads, so a global count
//! would mix them up). A binary that declares `mod counting;` installs it.

#![allow(dead_code)] // each binary uses some of it

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::thread::LocalKey;

/// `System`, counting each thread's heap operations.
struct Counting;

thread_local! {
    // `const` initialisers without a destructor: reading them never
    // allocates or registers anything, so the allocator can use them.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static FREES: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
}

/// Adds `n` to this thread's `counter`.
fn add(counter: &'static LocalKey<Cell<u64>>, n: u64) {
    // `try_with`: a thread being torn down may still free memory.
    let _ = counter.try_with(|c| c.set(c.get() + n));
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are ours; the counting touches only
// thread-local `Cell`s and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(&ALLOCS, 1);
        add(&BYTES, layout.size() as u64);
        // SAFETY: forwarded as is (see the impl).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(&ALLOCS, 1);
        add(&BYTES, layout.size() as u64);
        // SAFETY: forwarded as is.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(&ALLOCS, 1);
        add(&BYTES, new_size as u64);
        // SAFETY: forwarded as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(&FREES, 1);
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Heap operations made by this thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapOps {
    /// Allocations and reallocations.
    pub allocs: u64,
    /// Deallocations.
    pub frees: u64,
}

/// No heap operation.
pub const NONE: HeapOps = HeapOps {
    allocs: 0,
    frees: 0,
};

fn now() -> HeapOps {
    HeapOps {
        allocs: ALLOCS.with(Cell::get),
        frees: FREES.with(Cell::get),
    }
}

/// The heap operations this thread makes while running `f`.
pub fn heap_ops(f: impl FnOnce()) -> HeapOps {
    let before = now();
    f();
    let after = now();
    HeapOps {
        allocs: after.allocs - before.allocs,
        frees: after.frees - before.frees,
    }
}

/// What `f` returns, and the bytes this thread asks the allocator for
/// while running it.
pub fn heap_bytes<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = BYTES.with(Cell::get);
    let out = f();
    (out, BYTES.with(Cell::get) - before)
}
