//! The mutex baseline keeps the kvslots contract: the same random sequence
//! of operations on both backends gives the same results (successes, error
//! kinds and their numbers, lengths, block counts, pool usage), so the
//! comparison runs one workload on two implementations of one interface.

use kvslots::ReserveError;
use kvslots_sim::backend::{KvBackend, KvslotsBackend, MutexBackend};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// What one operation returned, without block ids (the two free lists hand
/// out ids in different orders).
#[derive(Debug, PartialEq)]
enum Outcome {
    Reserve(Result<usize, ReserveError>),
    Append(Result<std::ops::Range<usize>, ReserveError>),
    Truncate(usize),
    Fork(Result<Option<usize>, ReserveError>),
    Dropped,
    Freed,
}

/// Runs `steps` seeded random operations; returns every outcome and, after
/// each, (used blocks, per-sequence (len, blocks)).
#[allow(clippy::type_complexity)]
fn script<B: KvBackend>(
    b: &B,
    seed: u64,
    steps: usize,
) -> Vec<(Outcome, usize, Vec<(usize, usize)>)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut seqs: Vec<B::Seq> = Vec::new();
    let mut reserved: Vec<Vec<B::Id>> = Vec::new();
    let mut log = Vec::new();
    for _ in 0..steps {
        let op = rng.random_range(0..100);
        let outcome = if seqs.is_empty() || op < 10 {
            seqs.push(b.new_seq(rng.random_range(0..64)));
            Outcome::Append(B::try_append(
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
            Outcome::Append(B::try_append(&mut seqs[i], n))
        } else if op < 60 {
            let i = rng.random_range(0..seqs.len());
            let len = B::seq_len(&seqs[i]);
            Outcome::Truncate(B::truncate(&mut seqs[i], rng.random_range(0..=len + 2)))
        } else if op < 72 {
            let i = rng.random_range(0..seqs.len());
            let r = B::try_fork(&seqs[i]).map(|(child, copy)| {
                seqs.push(child);
                copy
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
        } else {
            if let Some(ids) = reserved.pop() {
                b.free(&ids).unwrap();
            }
            Outcome::Freed
        };
        let shape = seqs
            .iter()
            .map(|s| (B::seq_len(s), B::seq_blocks(s)))
            .collect();
        log.push((outcome, b.used_blocks(), shape));
    }
    drop(seqs);
    for ids in reserved {
        b.free(&ids).unwrap();
    }
    assert_eq!(b.used_blocks(), 0, "{}: not full again", b.name());
    log
}

#[test]
fn both_backends_agree_on_random_operation_sequences() {
    for seed in 0..40 {
        let (nb, bs) = (12 + seed as usize % 5, 1 + seed as usize % 4);
        let a = KvslotsBackend::new(nb, bs);
        let b = MutexBackend::new(nb, bs);
        let la = script(&a, seed, 400);
        let lb = script(&b, seed, 400);
        for (step, (x, y)) in la.iter().zip(&lb).enumerate() {
            assert_eq!(x, y, "seed {seed}, step {step}");
        }
        assert_eq!(a.peak_used_blocks(), b.peak_used_blocks(), "seed {seed}");
        // The scripts really exercised refusals, forks and copies.
        let count = |f: &dyn Fn(&Outcome) -> bool| la.iter().filter(|(o, _, _)| f(o)).count();
        assert!(count(&|o| matches!(o, Outcome::Append(Err(ReserveError::Full { .. })))) > 0);
        assert!(count(&|o| matches!(o, Outcome::Append(Err(ReserveError::NeverFits { .. })))) > 0);
        assert!(count(&|o| matches!(o, Outcome::Fork(Ok(_)))) > 0);
        assert!(count(&|o| matches!(o, Outcome::Reserve(Err(_)))) > 0);
    }
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
        assert_eq!(b.used_blocks(), 2);
        b.free(&ids).unwrap();
        assert!(b.free(&ids).is_err(), "{}: double free", b.name());
        assert_eq!(b.used_blocks(), 0);
    }
    check(&KvslotsBackend::new(4, 16), kvslots::BlockId::new(9));
    check(&MutexBackend::new(4, 16), 9);
}
