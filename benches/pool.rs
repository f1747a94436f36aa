//! Pool benchmark: [`BlockPool`] and [`Sequence`] against lock-based and
//! queue-based free lists.
//!
//! | group | one operation |
//! |---|---|
//! | `alloc2_free` | take 2 block ids, all or nothing, and free them |
//! | `prompt` | a sequence appends a 2,048-token prompt (128 blocks, all or nothing) and truncates to 0 (frees them); throughput counts blocks |
//! | `append_truncate` | a sequence of 8 tokens appends 24 (a 16-token block boundary is crossed: 1 or 2 new blocks) and truncates back to 8 |
//! | `alloc2_free_by_size` | `alloc2_free` on one thread in pools of 1,000 and 1,000,000 blocks |
//!
//! The peers, all behind the same small trait:
//!
//! | id | free list |
//! |---|---|
//! | `kvslots` | [`BlockPool::new`]: one CAS on the thread's home shard's admission count, then one CAS pops the chain from its home shard (16 shards here) |
//! | `kvslots_1_shard` | [`BlockPool::with_shards`] with one shard (one admission count, one stack), for what sharding changes |
//! | `std_mutex` | `std::sync::Mutex<Vec<u32>>`: lock, check, pop `n` |
//! | `parking_lot_mutex` | `parking_lot::Mutex<Vec<u32>>`, the same |
//! | `array_queue` | `crossbeam_queue::ArrayQueue<u32>`: pop `n` one by one, pushing back on a shortfall (lock-free, but not all-or-nothing: others can see a partial take) |
//!
//! The baselines keep no reference counts; `kvslots` does (they are needed
//! for forks), so the comparison is conservative.
//!
//! The contended groups run at 1, 2 and 8 threads;
//! `KVSLOTS_BENCH_THREADS=1,2,4,8,16` runs them at those counts instead
//! (`scripts/bench-threads`).
//!
//! # Timing
//!
//! As in `contention.rs`: threads are spawned untimed, meet the measuring
//! thread at a [`Barrier`], run their share of `iters` operations and meet
//! again; the time between the two barriers is what criterion sees, and
//! `Throughput::Elements(1)` turns it into aggregate operations per second.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use crossbeam_queue::ArrayQueue;
use kvslots::{BlockId, BlockPool, Sequence};

mod support;

use support::threads::bench_threads;
use support::{Lock, MutexFreeList, PlMutexFreeList, StdMutexFreeList};

/// Thread counts of the contended groups (unless `KVSLOTS_BENCH_THREADS`
/// says otherwise).
const THREADS: [usize; 3] = [1, 2, 8];
/// Blocks in the contended pools: plenty, so refusals are rare.
const BLOCKS: usize = 4096;
/// Tokens per block.
const BLOCK_SIZE: usize = 16;
/// Tokens of the `prompt` group's prompt: 128 blocks of 16 (the sim's
/// synthetic workload has a median prompt of about 1,100 tokens and a mean
/// of about 2,800).
const PROMPT: usize = 2048;

/// A free list of block ids: take `n` all or nothing, give them back.
trait FreeList: Send + Sync + 'static {
    type Id: Copy + Send;
    fn build(num_blocks: usize) -> Self;
    /// Appends `n` ids to `out`, or appends nothing and returns false.
    fn take(&self, n: usize, out: &mut Vec<Self::Id>) -> bool;
    fn give(&self, ids: &[Self::Id]);
}

/// [`BlockPool::new`], sharded as it chooses (16 shards at these sizes).
struct Kv(BlockPool);

impl FreeList for Kv {
    type Id = BlockId;

    fn build(num_blocks: usize) -> Self {
        Kv(BlockPool::new(num_blocks, BLOCK_SIZE))
    }

    fn take(&self, n: usize, out: &mut Vec<BlockId>) -> bool {
        self.0.try_alloc(n, out).is_ok()
    }

    fn give(&self, ids: &[BlockId]) {
        self.0.free(ids).expect("benchmark frees what it took");
    }
}

/// [`BlockPool::with_shards`] with one shard: what sharding changes.
struct Kv1(BlockPool);

impl FreeList for Kv1 {
    type Id = BlockId;

    fn build(num_blocks: usize) -> Self {
        Kv1(BlockPool::with_shards(num_blocks, BLOCK_SIZE, 1))
    }

    fn take(&self, n: usize, out: &mut Vec<BlockId>) -> bool {
        self.0.try_alloc(n, out).is_ok()
    }

    fn give(&self, ids: &[BlockId]) {
        self.0.free(ids).expect("benchmark frees what it took");
    }
}

/// The shared mutex-guarded free list (`support`), as a peer here.
impl<L: Lock<Vec<u32>> + 'static> FreeList for MutexFreeList<L> {
    type Id = u32;

    fn build(num_blocks: usize) -> Self {
        MutexFreeList::new(num_blocks)
    }

    fn take(&self, n: usize, out: &mut Vec<u32>) -> bool {
        MutexFreeList::take(self, n, out)
    }

    fn give(&self, ids: &[u32]) {
        MutexFreeList::give(self, ids)
    }
}

struct Queue(ArrayQueue<u32>);

impl FreeList for Queue {
    type Id = u32;

    fn build(num_blocks: usize) -> Self {
        let q = ArrayQueue::new(num_blocks.max(1));
        for i in 0..num_blocks as u32 {
            q.push(i).expect("queue sized for every id");
        }
        Queue(q)
    }

    fn take(&self, n: usize, out: &mut Vec<u32>) -> bool {
        let base = out.len();
        for _ in 0..n {
            match self.0.pop() {
                Some(id) => out.push(id),
                None => {
                    // Short: put back what was taken (others saw it gone).
                    for id in out.drain(base..) {
                        self.0.push(id).expect("room for what was popped");
                    }
                    return false;
                }
            }
        }
        true
    }

    fn give(&self, ids: &[u32]) {
        for &id in ids {
            self.0.push(id).expect("room for a freed id");
        }
    }
}

/// Runs `op` `iters` times split over `threads` threads, timed between
/// barriers.
fn timed<S: Sync + Send + 'static>(
    shared: &Arc<S>,
    threads: usize,
    iters: u64,
    op: fn(&Arc<S>, u64),
) -> Duration {
    let start = Arc::new(Barrier::new(threads + 1));
    let end = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads as u64)
        .map(|t| {
            let (shared, start, end) = (Arc::clone(shared), Arc::clone(&start), Arc::clone(&end));
            let share = iters / threads as u64 + u64::from(t < iters % threads as u64);
            thread::spawn(move || {
                start.wait();
                op(&shared, share);
                end.wait();
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    end.wait();
    let took = began.elapsed();
    for h in handles {
        h.join().expect("bench worker panicked");
    }
    took
}

/// `iters` times: take 2 ids and give them back, into a reused buffer.
fn alloc2_free<F: FreeList>(list: &Arc<F>, iters: u64) {
    let mut ids = Vec::with_capacity(2);
    for _ in 0..iters {
        if list.take(2, &mut ids) {
            list.give(black_box(&ids));
        }
        ids.clear();
    }
}

/// A sequence's block table over a shared free list.
trait Table: Sized {
    type Shared: Send + Sync + 'static;
    fn build(num_blocks: usize) -> Self::Shared;
    fn new(shared: &Arc<Self::Shared>) -> Self;
    fn append(&mut self, n: usize) -> bool;
    fn truncate(&mut self, len: usize);
}

impl Table for Sequence {
    type Shared = BlockPool;

    fn build(num_blocks: usize) -> BlockPool {
        BlockPool::new(num_blocks, BLOCK_SIZE)
    }

    fn new(pool: &Arc<BlockPool>) -> Self {
        Sequence::with_capacity(Arc::clone(pool), PROMPT)
    }

    fn append(&mut self, n: usize) -> bool {
        self.try_append(n).is_ok()
    }

    fn truncate(&mut self, len: usize) {
        Sequence::truncate(self, len);
    }
}

/// A [`Sequence`] over a one-shard pool, for what sharding changes.
struct Seq1(Sequence);

impl Table for Seq1 {
    type Shared = BlockPool;

    fn build(num_blocks: usize) -> BlockPool {
        BlockPool::with_shards(num_blocks, BLOCK_SIZE, 1)
    }

    fn new(pool: &Arc<BlockPool>) -> Self {
        Seq1(Sequence::with_capacity(Arc::clone(pool), PROMPT))
    }

    fn append(&mut self, n: usize) -> bool {
        self.0.try_append(n).is_ok()
    }

    fn truncate(&mut self, len: usize) {
        self.0.truncate(len);
    }
}

/// The same block-table arithmetic as [`Sequence`] over a baseline list.
struct BaselineSeq<F: FreeList> {
    list: Arc<F>,
    blocks: Vec<F::Id>,
    len: usize,
}

impl<F: FreeList> Table for BaselineSeq<F> {
    type Shared = F;

    fn build(num_blocks: usize) -> F {
        F::build(num_blocks)
    }

    fn new(list: &Arc<F>) -> Self {
        BaselineSeq {
            list: Arc::clone(list),
            blocks: Vec::with_capacity(PROMPT.div_ceil(BLOCK_SIZE)),
            len: 0,
        }
    }

    fn append(&mut self, n: usize) -> bool {
        let needed = (self.len + n).div_ceil(BLOCK_SIZE) - self.blocks.len();
        if needed > 0 && !self.list.take(needed, &mut self.blocks) {
            return false;
        }
        self.len += n;
        true
    }

    fn truncate(&mut self, len: usize) {
        let keep = len.div_ceil(BLOCK_SIZE);
        self.list.give(&self.blocks[keep..]);
        self.blocks.truncate(keep);
        self.len = len;
    }
}

impl<F: FreeList> Drop for BaselineSeq<F> {
    fn drop(&mut self) {
        self.truncate(0);
    }
}

/// `iters` times: a sequence of 8 tokens appends 24 and truncates back.
fn append_truncate<T: Table>(shared: &Arc<T::Shared>, iters: u64) {
    let mut seq = T::new(shared);
    assert!(seq.append(8), "room for the first block");
    for _ in 0..iters {
        if black_box(seq.append(24)) {
            seq.truncate(8);
        }
    }
}

/// `iters` times: an empty sequence appends a whole prompt and truncates
/// back to empty.
fn prompt<T: Table>(shared: &Arc<T::Shared>, iters: u64) {
    let mut seq = T::new(shared);
    for _ in 0..iters {
        if black_box(seq.append(PROMPT)) {
            seq.truncate(0);
        }
    }
}

fn bench_prompt(c: &mut Criterion) {
    let mut group = c.benchmark_group("prompt");
    // One element per block taken and given back.
    group.throughput(Throughput::Elements(PROMPT.div_ceil(BLOCK_SIZE) as u64));
    for threads in bench_threads(&THREADS) {
        run_table::<Sequence>(&mut group, "kvslots", threads, prompt::<Sequence>);
        run_table::<Seq1>(&mut group, "kvslots_1_shard", threads, prompt::<Seq1>);
        run_table::<BaselineSeq<StdMutexFreeList>>(
            &mut group,
            "std_mutex",
            threads,
            prompt::<BaselineSeq<StdMutexFreeList>>,
        );
        run_table::<BaselineSeq<PlMutexFreeList>>(
            &mut group,
            "parking_lot_mutex",
            threads,
            prompt::<BaselineSeq<PlMutexFreeList>>,
        );
        run_table::<BaselineSeq<Queue>>(
            &mut group,
            "array_queue",
            threads,
            prompt::<BaselineSeq<Queue>>,
        );
    }
    group.finish();
}

fn bench_append_truncate(c: &mut Criterion) {
    let mut group = c.benchmark_group("append_truncate");
    group.throughput(Throughput::Elements(1));
    for threads in bench_threads(&THREADS) {
        run_seq::<Sequence>(&mut group, "kvslots", threads);
        run_seq::<BaselineSeq<StdMutexFreeList>>(&mut group, "std_mutex", threads);
        run_seq::<BaselineSeq<PlMutexFreeList>>(&mut group, "parking_lot_mutex", threads);
        run_seq::<BaselineSeq<Queue>>(&mut group, "array_queue", threads);
    }
    group.finish();
}

fn run_seq<T: Table>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    threads: usize,
) {
    run_table::<T>(group, name, threads, append_truncate::<T>);
}

fn run_table<T: Table>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    threads: usize,
    op: fn(&Arc<T::Shared>, u64),
) {
    let shared = Arc::new(T::build(BLOCKS));
    group.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &t| {
        b.iter_custom(|iters| timed(&shared, t, iters, op))
    });
}

fn bench_alloc2_free(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc2_free");
    group.throughput(Throughput::Elements(1));
    for threads in bench_threads(&THREADS) {
        run::<Kv>(&mut group, "kvslots", threads, alloc2_free::<Kv>);
        run::<Kv1>(&mut group, "kvslots_1_shard", threads, alloc2_free::<Kv1>);
        run::<StdMutexFreeList>(
            &mut group,
            "std_mutex",
            threads,
            alloc2_free::<StdMutexFreeList>,
        );
        run::<PlMutexFreeList>(
            &mut group,
            "parking_lot_mutex",
            threads,
            alloc2_free::<PlMutexFreeList>,
        );
        run::<Queue>(&mut group, "array_queue", threads, alloc2_free::<Queue>);
    }
    group.finish();
}

fn bench_by_size(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc2_free_by_size");
    group.throughput(Throughput::Elements(1));
    for blocks in [1_000, 1_000_000] {
        let pool = Arc::new(Kv::build(blocks));
        group.bench_with_input(BenchmarkId::new("kvslots", blocks), &blocks, |b, _| {
            b.iter_custom(|iters| timed(&pool, 1, iters, alloc2_free::<Kv>))
        });
    }
    group.finish();
}

fn run<F: FreeList>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    threads: usize,
    op: fn(&Arc<F>, u64),
) {
    let list = Arc::new(F::build(BLOCKS));
    group.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &t| {
        b.iter_custom(|iters| timed(&list, t, iters, op))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = bench_alloc2_free, bench_prompt, bench_append_truncate, bench_by_size
}
criterion_main!(benches);
