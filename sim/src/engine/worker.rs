//! One worker: its running groups, the step of each, admission and
//! preemption, and the sizing checks admission uses.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::Ordering;

use crossbeam_channel::{Receiver, RecvError};
use kvslots::ReserveError;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::config::{Admission, EngineConfig};
use super::stats::{OpKind, WorkerStats};
use super::{Queue, Shared, IDLE_PARK};
use crate::backend::KvBackend;
use crate::workload::Request;

/// Blocks needed by a group of `samples` sequences that share the full
/// blocks of a `prompt`-token prefix and each grow to `prompt + output`.
pub fn group_blocks(prompt: usize, output: usize, samples: usize, block_size: usize) -> usize {
    let total = prompt.saturating_add(output).div_ceil(block_size);
    let shared = prompt / block_size;
    total.saturating_add(samples.saturating_sub(1).saturating_mul(total - shared))
}

/// Whether a request can never be admitted and run to completion in a pool
/// of `num_blocks` (alone, with the watermark at admission).
pub fn never_fits(req: &Request, cfg: &EngineConfig, num_blocks: usize, block_size: usize) -> bool {
    let prompt_blocks = req.prompt.div_ceil(block_size);
    prompt_blocks.saturating_add(cfg.watermark_blocks) > num_blocks
        || group_blocks(req.prompt, req.output, cfg.samples, block_size) > num_blocks
}

/// Where a group is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Prefill,
    Fork,
    Decode,
}

/// One admitted request: its sequences (the parent first) and progress.
struct Group<B: KvBackend> {
    req: Request,
    phase: Phase,
    seqs: Vec<B::Seq>,
    /// Output tokens kept, per sample.
    generated: Vec<usize>,
    /// Prompt tokens appended.
    prefilled: usize,
    /// The next sample to step in this iteration (steps resume there after
    /// a refusal was resolved by preempting another group).
    cursor: usize,
    rng: SmallRng,
}

/// Why a step could not go on.
enum StepError {
    /// The pool refused: preempt and retry.
    Refused,
    /// Something that should never happen; the run is stopped.
    Fatal(String),
}

pub(super) struct Worker<'a, B: KvBackend> {
    pub(super) backend: &'a B,
    pub(super) cfg: &'a EngineConfig,
    pub(super) shared: &'a Shared,
    pub(super) stats: WorkerStats,
    /// Slot mapping scratch (what a real worker hands the kernel).
    pub(super) slots: Vec<usize>,
    /// An empty sequence whose admission was refused, and the tokens its
    /// table was sized for: reused by the next attempt for the same size
    /// (usually the same request), so that refused attempts neither build
    /// nor drop a sequence each time.
    pub(super) spare: Option<(usize, B::Seq)>,
}

impl<B: KvBackend> Worker<'_, B> {
    fn block_size(&self) -> usize {
        self.backend.block_size()
    }

    fn finish_one(&mut self, id: usize) {
        self.stats.finished_ids.push(id);
        // Relaxed: a progress count; it orders nothing.
        self.shared.finished.fetch_add(1, Ordering::Relaxed);
    }

    /// Maps an append's new positions, as a worker building the kernel's
    /// slot mapping would (not timed: it touches no shared state).
    fn map_slots(&mut self, seq: &B::Seq, positions: Range<usize>) {
        self.slots.clear();
        B::extend_slots(seq, positions, &mut self.slots);
        debug_assert!(self
            .slots
            .iter()
            .all(|&s| s < self.backend.num_blocks() * self.block_size()));
    }

    fn refused(&self, e: ReserveError, what: &str) -> StepError {
        match e {
            ReserveError::Full { .. } => StepError::Refused,
            other => StepError::Fatal(format!("{what}: unexpected {other:?}")),
        }
    }

    /// One step of `g`; `Ok(true)` when the group has completed.
    fn step(&mut self, g: &mut Group<B>) -> Result<bool, StepError> {
        let bs = self.block_size();
        match g.phase {
            Phase::Prefill => {
                let chunk = self.cfg.chunk.min(g.req.prompt - g.prefilled);
                let held = B::seq_blocks(&g.seqs[0]);
                let range = self
                    .stats
                    .append::<B>(&mut g.seqs[0], chunk)
                    .map_err(|e| self.refused(e, "prefill"))?;
                // A reserved prompt is filled without taking a block.
                if self.cfg.admission == Admission::Reserve && B::seq_blocks(&g.seqs[0]) != held {
                    return Err(StepError::Fatal(format!(
                        "prefill of a reserved prompt took blocks ({held} held, {} after)",
                        B::seq_blocks(&g.seqs[0])
                    )));
                }
                self.map_slots(&g.seqs[0], range);
                g.prefilled += chunk;
                self.stats.prefilled += chunk as u64;
                if g.prefilled == g.req.prompt {
                    debug_assert_eq!(B::seq_blocks(&g.seqs[0]), g.req.prompt.div_ceil(bs));
                    g.phase = if self.cfg.samples > 1 {
                        Phase::Fork
                    } else {
                        Phase::Decode
                    };
                    return Ok(g.req.output == 0 && self.cfg.samples == 1);
                }
                Ok(false)
            }
            Phase::Fork => {
                while g.seqs.len() < self.cfg.samples {
                    let (child, copy) = self
                        .stats
                        .call(OpKind::Fork, || B::try_fork(&g.seqs[0]))
                        .map_err(|e| self.refused(e, "fork"))?;
                    g.seqs.push(child);
                    self.stats.forks += 1;
                    self.stats.copies += u64::from(copy.is_some());
                }
                g.phase = Phase::Decode;
                Ok(g.req.output == 0)
            }
            Phase::Decode => {
                let output = g.req.output;
                while g.cursor < g.seqs.len() {
                    let s = g.cursor;
                    let remaining = output - g.generated[s];
                    if remaining > 0 {
                        let kept = self.decode(g, s, remaining)?;
                        g.generated[s] += kept;
                        self.stats.decoded += kept as u64;
                    }
                    g.cursor += 1;
                }
                g.cursor = 0;
                Ok(g.generated.iter().all(|&n| n == output))
            }
        }
    }

    /// One decode step of sample `s`; returns the tokens it kept.
    fn decode(&mut self, g: &mut Group<B>, s: usize, remaining: usize) -> Result<usize, StepError> {
        if self.cfg.spec == 0 {
            let range = self
                .stats
                .append::<B>(&mut g.seqs[s], 1)
                .map_err(|e| self.refused(e, "decode"))?;
            self.map_slots(&g.seqs[s], range);
            return Ok(1);
        }
        // Speculative: K drafts in one append, then keep the accepted
        // prefix plus the target's correction token, truncate the rest.
        let k = self.cfg.spec.min(remaining);
        let range = self
            .stats
            .append::<B>(&mut g.seqs[s], k)
            .map_err(|e| self.refused(e, "speculative append"))?;
        let start = range.start;
        let mut accepted = 0;
        while accepted < k && g.rng.random_bool(self.cfg.accept) {
            accepted += 1;
        }
        let kept = (accepted + 1).min(k);
        if kept < k {
            let seq = &mut g.seqs[s];
            self.stats
                .call(OpKind::Truncate, || B::truncate(seq, start + kept));
            self.stats.rolled_back += (k - kept) as u64;
        }
        self.map_slots(&g.seqs[s], start..start + kept);
        Ok(kept)
    }

    /// Drops a group's sequences, with any reserved blocks they still hold
    /// (each drop is an allocator call).
    fn release(&mut self, g: Group<B>) {
        for seq in g.seqs {
            self.stats.call(OpKind::Drop, || drop(seq));
        }
    }

    fn complete(&mut self, g: Group<B>) {
        let want = g.req.prompt + g.req.output;
        let exact = g.seqs.len() == self.cfg.samples
            && g.generated.iter().all(|&n| n == g.req.output)
            && g.seqs.iter().all(|s| B::seq_len(s) == want);
        if !exact {
            self.stats.mismatches += 1;
        }
        self.stats.completed += 1;
        let id = g.req.id;
        self.release(g);
        self.finish_one(id);
    }

    /// Admits `req` if its whole prompt fits with the watermark; `Ok(None)`
    /// if it does not fit now.
    fn admit(&mut self, req: Request) -> Result<Option<Group<B>>, String> {
        let backend = self.backend;
        let wm = self.cfg.watermark_blocks;
        // The sequence's table is sized for the whole run (prompt plus
        // output), so that no append reallocates it.
        let tokens = req.prompt + req.output;
        let mut seq = match self.spare.take() {
            Some((sized, seq)) if sized == tokens => seq,
            // An empty sequence of another size: dropping it touches no
            // block (it holds none), so it is not an allocator call.
            _ => backend.new_seq(tokens),
        };
        debug_assert_eq!(B::seq_blocks(&seq), 0, "a spare sequence holds blocks");
        let admitted = match self.cfg.admission {
            Admission::Reserve => self
                .stats
                .call(OpKind::Admit, || B::try_reserve(&mut seq, req.prompt, wm)),
            Admission::Check => {
                let prompt_blocks = req.prompt.div_ceil(self.block_size());
                // A zero-block allocation pushes nothing: `none` stays empty
                // and never allocates.
                let mut none = Vec::new();
                self.stats.call(OpKind::Admit, || {
                    backend.try_alloc_with_headroom(0, prompt_blocks + wm, &mut none)
                })
            }
        };
        match admitted {
            Ok(()) => {}
            Err(ReserveError::Full { .. }) => {
                // Refused: nothing changed, the sequence is still empty.
                self.spare = Some((tokens, seq));
                return Ok(None);
            }
            Err(e) => return Err(format!("admission: unexpected {e:?}")),
        }
        let mut seqs = Vec::with_capacity(self.cfg.samples);
        seqs.push(seq);
        Ok(Some(Group {
            req,
            phase: Phase::Prefill,
            seqs,
            generated: vec![0; self.cfg.samples],
            prefilled: 0,
            cursor: 0,
            rng: SmallRng::seed_from_u64(
                self.cfg.seed ^ (req.id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            ),
        }))
    }

    /// Admits waiting requests, first come first served, while this worker
    /// runs fewer than `max_running` groups and the head fits.
    fn admit_waiting(
        &mut self,
        q: &mut Queue<'_>,
        running: &mut Vec<Group<B>>,
    ) -> Result<(), String> {
        let (nb, bs) = (self.backend.num_blocks(), self.block_size());
        while running.len() < self.cfg.max_running {
            let req = match q.waiting.front() {
                Some(&r) => r,
                None if q.source_done => break,
                // Closed-loop: every request has arrived, so a worker waits
                // for the producer rather than treating a momentarily empty
                // queue as "no work" (which would also make one-worker runs
                // depend on thread timing).
                None => match q.rx.recv() {
                    Ok(r) => {
                        q.waiting.push_back(r);
                        r
                    }
                    Err(RecvError) => {
                        q.source_done = true;
                        break;
                    }
                },
            };
            if never_fits(&req, self.cfg, nb, bs) {
                q.waiting.pop_front();
                self.stats.rejected += 1;
                self.finish_one(req.id);
                continue;
            }
            match self.admit(req)? {
                Some(g) => {
                    q.waiting.pop_front();
                    running.push(g);
                }
                None => break,
            }
        }
        Ok(())
    }

    pub(super) fn run(mut self, rx: &Receiver<Request>) -> WorkerStats {
        let mut running: Vec<Group<B>> = Vec::new();
        let mut q = Queue {
            rx,
            waiting: VecDeque::new(),
            source_done: false,
        };
        // Relaxed: progress snapshots for stall detection.
        let mut last_finished = self.shared.finished.load(Ordering::Relaxed);
        let (mut busy_idle, mut parked_idle) = (0u64, 0u64);
        let park_limit = self.cfg.stall_limit / 1000;
        'run: loop {
            // Relaxed: a stop request, polled once an iteration.
            if self.shared.abort.load(Ordering::Relaxed) {
                break;
            }
            // 1. Admission.
            if let Err(e) = self.admit_waiting(&mut q, &mut running) {
                self.shared.fail(e);
                break;
            }
            // 2. Nothing running: done, or wait until another worker frees
            // blocks. Register as idle first and try once more, so that a
            // free that came before the registration is not missed; then
            // park until a completion or preemption anywhere wakes us (the
            // timeout is only a safety net).
            if running.is_empty() {
                if q.waiting.is_empty() && q.source_done {
                    break;
                }
                self.shared.idle.register();
                let again = self.admit_waiting(&mut q, &mut running);
                if again.is_ok() && running.is_empty() && !(q.waiting.is_empty() && q.source_done) {
                    self.stats.idle_waits += 1;
                    std::thread::park_timeout(IDLE_PARK);
                }
                self.shared.idle.unregister();
                if let Err(e) = again {
                    self.shared.fail(e);
                    break;
                }
                // Stall guard for waits: parks without any request
                // finishing anywhere.
                let now = self.shared.finished.load(Ordering::Relaxed);
                if now != last_finished {
                    (last_finished, busy_idle, parked_idle) = (now, 0, 0);
                } else if running.is_empty() {
                    parked_idle += 1;
                    if parked_idle > park_limit {
                        self.stall();
                        break;
                    }
                }
                continue;
            }
            // 3. One step of every running group, oldest first.
            let mut i = 0;
            while i < running.len() {
                match self.step(&mut running[i]) {
                    Ok(true) => {
                        let g = running.remove(i);
                        self.complete(g);
                        self.shared.idle.wake_all();
                    }
                    Ok(false) => i += 1,
                    Err(StepError::Refused) => {
                        // Preempt the most recently admitted group (maybe
                        // this one), then retry this one if it is still here.
                        let victim = running.pop().expect("running is not empty");
                        q.waiting.push_front(victim.req);
                        self.stats.preemptions += 1;
                        self.release(victim);
                        self.shared.idle.wake_all();
                    }
                    Err(StepError::Fatal(e)) => {
                        self.shared.fail(e);
                        break 'run;
                    }
                }
            }
            // 4. Stall guard, by count. Relaxed: a progress snapshot.
            let now = self.shared.finished.load(Ordering::Relaxed);
            if now != last_finished {
                (last_finished, busy_idle, parked_idle) = (now, 0, 0);
            } else {
                busy_idle += 1;
                if busy_idle > self.cfg.stall_limit {
                    self.stall();
                    break;
                }
            }
        }
        for g in running.drain(..).rev() {
            self.release(g);
        }
        self.shared.idle.wake_all();
        self.stats
    }

    fn stall(&mut self) {
        self.stats.stalled = true;
        self.shared.fail(format!(
            "stalled: no request finished in {} iterations ({} waits)",
            self.cfg.stall_limit,
            self.cfg.stall_limit / 1000
        ));
    }
}
