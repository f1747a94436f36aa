//! What a [`Sequence`] pays to give its blocks back, on one thread. The
//! blocks a sequence takes from one word of the free list, 8 or more, are
//! fresh (uncounted references, marked in the free list's fresh bitmap):
//! they go back by runs, with no access to their state words. A smaller
//! take counts each block at once, and a block the sequence holds alone goes back with a
//! load and a plain store of its word; a shared one with a CAS.
//!
//! | id | one operation |
//! |---|---|
//! | `drop/128` | a 2,048-token sequence (128 blocks of 16) is built and dropped |
//! | `truncate/128` | the same sequence truncated to 0 tokens (all 128 blocks back), then dropped empty |
//! | `retire/128` | the same sequence retired under a fence (`Sequence::retire`), and the fence completed (`BlockPool::complete`): an asynchronous scheduler's finished request |
//! | `truncate/1` | a 17-token sequence (2 blocks) truncated to 16 (1 block back) and extended again |
//!
//! Each measures the append too, which is the same on both sides of a
//! change to the drop path; compare one id across builds (for example
//! `git stash`, or a worktree at an older commit), in one session.
//!
//! Run: `cargo bench --bench give_back`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvslots::{BlockPool, Sequence};

/// Tokens per block.
const BLOCK_SIZE: usize = 16;
/// A 2,048-token prompt: 128 blocks.
const PROMPT: usize = 2048;

fn give_back(c: &mut Criterion) {
    let pool = Arc::new(BlockPool::new(4096, BLOCK_SIZE));
    let mut group = c.benchmark_group("give_back");
    group.throughput(Throughput::Elements((PROMPT / BLOCK_SIZE) as u64));
    group.bench_function(BenchmarkId::new("drop", 128), |b| {
        b.iter(|| {
            let mut seq = Sequence::new(Arc::clone(&pool));
            seq.try_append(PROMPT).expect("the pool has room");
            drop(black_box(seq));
        })
    });
    group.bench_function(BenchmarkId::new("truncate", 128), |b| {
        let mut seq = Sequence::new(Arc::clone(&pool));
        b.iter(|| {
            seq.try_append(PROMPT).expect("the pool has room");
            black_box(seq.truncate(0));
        })
    });
    group.bench_function(BenchmarkId::new("retire", 128), |b| {
        let mut fence = 0;
        b.iter(|| {
            let mut seq = Sequence::new(Arc::clone(&pool));
            seq.try_append(PROMPT).expect("the pool has room");
            fence += 1;
            black_box(seq.retire(fence));
            black_box(pool.complete(fence));
        })
    });
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("truncate", 1), |b| {
        let mut seq = Sequence::new(Arc::clone(&pool));
        seq.try_append(BLOCK_SIZE).expect("the pool has room");
        b.iter(|| {
            seq.try_append(1).expect("the pool has room");
            black_box(seq.truncate(BLOCK_SIZE));
        })
    });
    group.finish();
}

criterion_group!(benches, give_back);
criterion_main!(benches);
