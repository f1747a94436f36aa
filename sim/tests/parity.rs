//! The mutex baseline keeps the kvslots contract: the same random sequence
//! of operations on both backends gives the same results (successes, error
//! kinds and their numbers, lengths, capacities, pool usage, and which
//! blocks the sequences' tables share, up to renaming the block ids), so
//! the comparison runs one workload on two implementations of one
//! interface.

use std::collections::HashMap;

use kvslots::ReserveError;
use kvslots_sim::backend::{KvBackend, KvSeq, KvslotsBackend, MutexBackend};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// What one operation returned, without block ids (the two free lists hand
/// out ids in different orders).
#[derive(Debug, PartialEq)]
enum Outcome {
    Reserve(Result<usize, ReserveError>),
    /// `try_reserve` into a sequence; `Ok` holds its capacity after.
    ReserveSeq(Result<usize, ReserveError>),
    Append(Result<std::ops::Range<usize>, ReserveError>),
    Truncate(usize),
    Fork(Result<Option<usize>, ReserveError>),
    /// Fork, truncate the parent into the shared prefix, reserve, append.
    Rewind(
        Result<Option<usize>, ReserveError>,
        usize,
        Result<usize, ReserveError>,
        Result<std::ops::Range<usize>, ReserveError>,
    ),
    Dropped,
    Freed,
}

/// A sequence's shape: length, capacity, and its table with every block id
/// renamed to the order of its first appearance across all the tables (so
/// sharing between sequences, and where each block sits, are compared, but
/// not the ids the two free lists happen to hand out).
type Shape = (usize, usize, Vec<usize>);

fn shapes<B: KvBackend>(seqs: &[B::Seq]) -> Vec<Shape> {
    let mut names: HashMap<B::Id, usize> = HashMap::new();
    seqs.iter()
        .map(|s| {
            let table = s
                .table(0)
                .iter()
                .map(|&id| {
                    let next = names.len();
                    *names.entry(id).or_insert(next)
                })
                .collect();
            (s.len(), s.capacity(), table)
        })
        .collect()
}

/// Whether an append to `seqs[i]` starts in a partly filled block that is
/// shared with another sequence and is not the table's last (blocks are
/// reserved after it): the copy-on-write that must pick the tail by index.
fn cow_before_reserved<B: KvBackend>(seqs: &[B::Seq], i: usize, bs: usize) -> bool {
    let (len, table) = (seqs[i].len(), seqs[i].table(0));
    let tail = len / bs;
    len % bs != 0
        && tail + 1 < table.len()
        && seqs
            .iter()
            .enumerate()
            .any(|(j, s)| j != i && s.table(0).contains(&table[tail]))
}

/// What a script did: every outcome with (used blocks, shapes) after it,
/// and how many appends were a copy-on-write before reserved blocks.
type Log = (Vec<(Outcome, usize, Vec<Shape>)>, usize);

/// Runs `steps` seeded random operations.
/// An append's positions (the copy it may ask for is compared through the
/// tables).
fn append<B: KvBackend>(
    seq: &mut B::Seq,
    n: usize,
) -> Result<std::ops::Range<usize>, ReserveError> {
    seq.try_append(n, None, &mut Vec::new())
}

/// What a beam search does: fork `seqs[i]`, then roll it back into the
/// prefix it now shares (mid-block), reserve, and append, so that the append
/// copies the shared tail with reserved blocks after it. Also returns
/// whether the append was such a copy-on-write.
fn rewind<B: KvBackend>(
    seqs: &mut Vec<B::Seq>,
    i: usize,
    bs: usize,
    rng: &mut SmallRng,
) -> (Outcome, bool) {
    let mut copies = Vec::new();
    let fork = seqs[i].try_fork(&mut copies).map(|child| {
        seqs.push(child);
        copies.first().map(|(_, c)| c.tokens)
    });
    let len = seqs[i].len();
    let cut = if len > 1 { rng.random_range(1..len) } else { 0 };
    let gone = seqs[i].truncate(cut);
    let reserve = seqs[i]
        .try_reserve(rng.random_range(1..12), 0)
        .map(|()| seqs[i].capacity());
    let n = rng.random_range(1..8);
    let cow = cow_before_reserved::<B>(seqs, i, bs);
    (
        Outcome::Rewind(fork, gone, reserve, append::<B>(&mut seqs[i], n)),
        cow,
    )
}

fn script<B: KvBackend>(b: &B, seed: u64, steps: usize) -> Log {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut seqs: Vec<B::Seq> = Vec::new();
    let mut reserved: Vec<Vec<B::Id>> = Vec::new();
    let mut log = Vec::new();
    let mut cows = 0;
    let bs = b.block_size();
    for _ in 0..steps {
        let op = rng.random_range(0..120);
        let outcome = if seqs.is_empty() || op < 10 {
            seqs.push(b.new_seq(rng.random_range(0..64)));
            Outcome::Append(append::<B>(
                seqs.last_mut().unwrap(),
                rng.random_range(0..24),
            ))
        } else if op < 45 {
            let i = rng.random_range(0..seqs.len());
            let n = match rng.random_range(0..10) {
                0 => 0,
                1 => 1000,
                2 => usize::MAX,
                _ => rng.random_range(1..8),
            };
            if cow_before_reserved::<B>(&seqs, i, bs) && n > 0 && n < 1000 {
                cows += 1;
            }
            Outcome::Append(append::<B>(&mut seqs[i], n))
        } else if op < 60 {
            let i = rng.random_range(0..seqs.len());
            let len = seqs[i].len();
            Outcome::Truncate(seqs[i].truncate(rng.random_range(0..=len + 2)))
        } else if op < 72 {
            let i = rng.random_range(0..seqs.len());
            let mut copies = Vec::new();
            let r = seqs[i].try_fork(&mut copies).map(|child| {
                seqs.push(child);
                copies.first().map(|(_, c)| c.tokens)
            });
            Outcome::Fork(r)
        } else if op < 82 {
            let i = rng.random_range(0..seqs.len());
            drop(seqs.swap_remove(i));
            Outcome::Dropped
        } else if op < 94 {
            let mut ids = Vec::new();
            let n = rng.random_range(0..6);
            let h = rng.random_range(0..6);
            let r = b
                .try_alloc_with_headroom(n, h, &mut ids)
                .map(|()| ids.len());
            if r.is_ok() {
                reserved.push(ids);
            }
            Outcome::Reserve(r)
        } else if op < 100 {
            if let Some(ids) = reserved.pop() {
                b.free(&ids).unwrap();
            }
            Outcome::Freed
        } else if op >= 112 {
            let i = rng.random_range(0..seqs.len());
            let (outcome, cow) = rewind::<B>(&mut seqs, i, bs, &mut rng);
            cows += usize::from(cow);
            outcome
        } else {
            let i = rng.random_range(0..seqs.len());
            let tokens = match rng.random_range(0..10) {
                0 => 0,
                1 => 1000,
                2 => usize::MAX,
                _ => rng.random_range(1..12),
            };
            let headroom = match rng.random_range(0..10) {
                0 => usize::MAX,
                1..=4 => 0,
                _ => rng.random_range(1..6),
            };
            let seq = &mut seqs[i];
            let r = seq.try_reserve(tokens, headroom).map(|()| seq.capacity());
            Outcome::ReserveSeq(r)
        };
        for s in &seqs {
            assert_eq!(s.capacity(), s.table(0).len() * bs);
            assert!(s.capacity() >= s.len());
        }
        log.push((outcome, b.used_blocks(), shapes::<B>(&seqs)));
    }
    drop(seqs);
    for ids in reserved {
        b.free(&ids).unwrap();
    }
    assert_eq!(b.used_blocks(), 0, "{}: not full again", b.name());
    (log, cows)
}

#[test]
fn both_backends_agree_on_random_operation_sequences() {
    let (mut cows, mut seeds_ahead) = (0, 0);
    for seed in 0..40 {
        let (nb, bs) = (12 + seed as usize % 5, 1 + seed as usize % 4);
        let a = KvslotsBackend::new(nb, bs);
        let b = MutexBackend::new(nb, bs);
        let (la, cows_a) = script(&a, seed, 400);
        let (lb, cows_b) = script(&b, seed, 400);
        for (step, (x, y)) in la.iter().zip(&lb).enumerate() {
            assert_eq!(x, y, "seed {seed}, step {step}");
        }
        assert_eq!(la.len(), lb.len());
        assert_eq!(cows_a, cows_b, "seed {seed}");
        cows += cows_a;
        assert_eq!(a.peak_used_blocks(), b.peak_used_blocks(), "seed {seed}");
        // The scripts really exercised refusals, forks and copies.
        let count = |f: &dyn Fn(&Outcome) -> bool| la.iter().filter(|(o, _, _)| f(o)).count();
        assert!(count(&|o| matches!(o, Outcome::Append(Err(ReserveError::Full { .. })))) > 0);
        assert!(count(&|o| matches!(o, Outcome::Append(Err(ReserveError::NeverFits { .. })))) > 0);
        assert!(count(&|o| matches!(o, Outcome::Fork(Ok(_)))) > 0);
        assert!(count(&|o| matches!(o, Outcome::Reserve(Err(_)))) > 0);
        assert!(count(&|o| matches!(o, Outcome::ReserveSeq(Ok(_)))) > 0);
        assert!(count(&|o| matches!(o, Outcome::ReserveSeq(Err(ReserveError::Full { .. })))) > 0);
        assert!(
            count(&|o| matches!(o, Outcome::ReserveSeq(Err(ReserveError::NeverFits { .. })))) > 0
        );
        // A whole empty block in a table (only a reservation makes one).
        let ahead = la
            .iter()
            .filter(|(_, _, shape)| shape.iter().any(|(len, cap, _)| *cap >= len + bs))
            .count();
        if ahead > 0 {
            seeds_ahead += 1;
        }
    }
    // Most scripts held blocks in reserve ahead of the length (a few fill
    // their small pool with forks of one long sequence early on).
    assert!(
        seeds_ahead >= 30,
        "only {seeds_ahead} scripts reserved ahead"
    ); // Appends that copied a shared tail with reserved blocks after it.
    assert!(
        cows >= 20,
        "only {cows} copies-on-write before reserved blocks"
    );
}

#[test]
fn both_backends_refuse_bad_frees_and_change_nothing() {
    fn check<B: KvBackend>(b: &B, bogus: B::Id) {
        let mut ids = Vec::new();
        b.try_alloc_with_headroom(2, 0, &mut ids).unwrap();
        assert!(
            b.free(&[ids[0], ids[0]]).is_err(),
            "{}: over-free",
            b.name()
        );
        assert!(
            b.free(&[ids[0], bogus]).is_err(),
            "{}: out of range",
            b.name()
        );
        // A sequence's block is the sequence's to give back.
        let mut seq = b.new_seq(16);
        seq.try_append(16, None, &mut Vec::new()).unwrap();
        let held = seq.table(0)[0];
        assert!(
            b.free(&[ids[1], held]).is_err(),
            "{}: a sequence's block",
            b.name()
        );
        assert_eq!(b.ref_count(B::Seq::index(held)), Some(1), "{}", b.name());
        drop(seq);
        assert_eq!(b.used_blocks(), 2);
        b.free(&ids).unwrap();
        assert!(b.free(&ids).is_err(), "{}: double free", b.name());
        assert_eq!(b.used_blocks(), 0);
    }
    check(&KvslotsBackend::new(4, 16), kvslots::BlockId::new(9));
    check(&MutexBackend::new(4, 16), kvslots::BlockId::new(9));
}
