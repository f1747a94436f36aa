//! One worker: its running groups, the step of each, admission and
//! preemption, with every allocator call checked by the oracle; and the
//! sizing checks admission uses.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvError};
use kvslots::{BlockHash, KvGroup, ReserveError};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::config::{Admission, EngineConfig, IdleWait, Profile};
use super::device::Device;
use super::shared::Shared;
use super::stats::{OpKind, WorkerStats};
use super::POLL_TICK;
use crate::backend::{BlockCopy, Copies, KvBackend, KvSeq};
use crate::oracle::{Tracked, Writer};
use crate::prefix;
use crate::workload::Request;

/// Blocks needed by a group of `samples` sequences that share the full
/// blocks of a `prompt`-token prefix and each grow to `prompt + output`.
pub fn group_blocks(prompt: usize, output: usize, samples: usize, block_size: usize) -> usize {
    let total = prompt.saturating_add(output).div_ceil(block_size);
    let shared = prompt / block_size;
    total.saturating_add(samples.saturating_sub(1).saturating_mul(total - shared))
}

/// Whether a request run as `profile` can never be admitted and run to
/// completion in a pool of `num_blocks` (alone, with the watermark's
/// headroom at admission), its sequences holding a table per group of
/// `cfg.groups`: the admission's blocks (a reservation's in every group,
/// or the check's), or the most its samples can hold at once, is more
/// than the pool has.
///
/// A full group can hold all its blocks; a sliding group, after an append
/// of `a` tokens, at most the blocks of its window and the append's
/// (`(a + w - 1) / block_size + 2`), and while an append is admitted also
/// the new blocks, a copy's and a copy's kept source: the bound counts
/// `(2a + w) / block_size + 5` a sample, `a` the longest append (a chunk,
/// the drafts, or a token).
pub fn never_fits(
    req: &Request,
    profile: &Profile,
    cfg: &super::config::EngineConfig,
    num_blocks: usize,
    block_size: usize,
) -> bool {
    let admission = match profile.admission {
        Admission::Reserve => cfg.reserve_blocks(req.prompt, block_size),
        Admission::Check => cfg.prefill_blocks(req.prompt, block_size),
    };
    let all = group_blocks(req.prompt, req.output, profile.samples, block_size);
    let append = cfg.chunk.max(profile.spec).max(1);
    let run = cfg
        .groups
        .as_slice()
        .iter()
        .map(|g| match *g {
            kvslots::KvGroup::SlidingWindow {
                window_tokens: window,
            }
            | kvslots::KvGroup::ChunkedLocal {
                chunk_tokens: window,
            } => all.min(
                append
                    .saturating_mul(2)
                    .saturating_add(window)
                    .div_ceil(block_size)
                    .saturating_add(5)
                    .saturating_mul(profile.samples),
            ),
            _ => all,
        })
        .fold(0, usize::saturating_add);
    admission.saturating_add(cfg.watermark_blocks) > num_blocks || run > num_blocks
}

/// Where a group is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Prefill,
    Fork,
    Decode,
}

/// A waiting request and how many times it was preempted.
pub(super) type Waiting = (Request, u32);

/// A live sequence and the oracle's record of each of its tables (one
/// per group of layers).
struct Live<B: KvBackend> {
    seq: B::Seq,
    t: Vec<Tracked<B::Id>>,
}

/// A fork's copy of a partly filled tail, as the parent's and child's
/// tables say it must be: the source, and the destination if the child
/// has one.
type ExpectedCopy<Id> = Option<(Id, Option<Id>)>;

/// The key type of a backend's sequences.
type Keys<B> = <<B as KvBackend>::Seq as KvSeq>::Keys;

/// One admitted request: its sequences (the parent first) and progress.
struct Group<B: KvBackend> {
    req: Request,
    attempt: u32,
    profile: Profile,
    phase: Phase,
    seqs: Vec<Live<B>>,
    /// Output tokens kept, per sample.
    generated: Vec<usize>,
    /// Prompt tokens appended.
    prefilled: usize,
    /// The tokens the parent's table holds room for ahead of its length
    /// until the prompt is in: the whole prompt when reserved, up to the
    /// block a check-only admission kept (past its prefix, or granted
    /// after waiting).
    reserved: usize,
    /// The next sample to step in this iteration (steps resume there after
    /// a refusal was resolved by preempting another group).
    cursor: usize,
    rng: SmallRng,
    /// The prompt's block keys, published once it is prefilled (none
    /// without prefix caching).
    keys: Option<Keys<B>>,
}

/// Why a step could not go on.
enum StepError {
    /// The pool refused: preempt and retry.
    Refused,
    /// The oracle found the allocator wrong; the run is stopped.
    Kv(String),
    /// Something else that should never happen; the run is stopped.
    Fatal(String),
}

impl From<String> for StepError {
    fn from(msg: String) -> Self {
        StepError::Kv(msg)
    }
}

/// Which steps in flight [`Worker::complete_steps`] completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drain {
    /// Those the scheduler is `async_depth` steps past.
    Due,
    /// The oldest one, whatever its step (the scheduler waits for it).
    Oldest,
    /// Every one (the device drains).
    All,
}

/// A worker's view of the queue: the shared channel and its own waiting
/// list (preempted requests first).
struct Queue<'a> {
    rx: &'a Receiver<Request>,
    waiting: VecDeque<Waiting>,
    source_done: bool,
}

/// The longest one wait of an idle worker lasts: a blocking admission in
/// the allocator ([`IdleWait::Queue`]; a grant wakes it at once, and the
/// timeout is a safety net), or a series of attempts every
/// [`POLL_TICK`] ([`IdleWait::Poll`]). Then the worker re-checks the stop
/// flag (an abort wakes no waiter) and the stall guard counts the wait.
const IDLE_WAIT: std::time::Duration = std::time::Duration::from_micros(500);

pub(super) struct Worker<B: KvBackend> {
    pub(super) index: usize,
    pub(super) backend: B,
    pub(super) cfg: Arc<EngineConfig>,
    pub(super) shared: Arc<Shared>,
    pub(super) stats: WorkerStats,
    /// Slot mapping scratch (what a real worker hands the kernel).
    pub(super) slots: Vec<usize>,
    /// An empty sequence whose admission was refused, and the tokens its
    /// table was sized for: reused by the next attempt for the same size
    /// (usually the same request), so that refused attempts neither build
    /// nor drop a sequence each time.
    pub(super) spare: Option<(usize, B::Seq)>,
    /// The block keys of the request `keys.0` (the waiting head's, usually),
    /// kept across refused admissions so that they are hashed once.
    pub(super) keys: (Option<usize>, Option<Keys<B>>),
    /// The content keys the request's keys are made from, for reuse.
    pub(super) base_keys: Vec<BlockHash>,
    /// Emptied key buffers of completed groups, for reuse.
    pub(super) key_bufs: Vec<Keys<B>>,
    /// The copies a call asks for, for reuse.
    pub(super) copies: Copies<B::Id>,
    /// The steps in flight (`--async-depth`).
    pub(super) device: Device,
    /// Waits of the priority group refused while nothing else ran
    /// anywhere (see [`step_all`](Self::step_all)): the stall guard counts
    /// them with the blocking waits.
    pub(super) lone_waits: u64,
}

/// Stops the run if dropped by a panic's unwinding.
struct StopOnPanic(Arc<Shared>, usize);

impl Drop for StopOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail(format!("worker {} panicked", self.1));
        }
    }
}

/// A position among `0..end` to read back at a step: spread over the
/// sequence by a multiplicative hash of `end`.
fn sampled(end: usize) -> usize {
    ((end as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize % end
}

impl<B: KvBackend> Worker<B> {
    fn block_size(&self) -> usize {
        self.backend.block_size()
    }

    fn finish_one(&mut self, id: usize) {
        self.stats.finished_ids.push(id);
        // Relaxed: a progress count; it orders nothing.
        self.shared.finished.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs one allocator call, timed and watched.
    fn call<R>(&mut self, kind: OpKind, f: impl FnOnce() -> R) -> R {
        let watch = (&self.shared.watch[self.index], self.shared.start);
        self.stats.call(watch, kind, f)
    }

    /// A refused step: preempt and retry when the refusal is retryable
    /// (`Full`; or `BehindWaiters`, which only a new admission meets: the
    /// first append of a group that holds no block beyond the prefix it
    /// matched with no reservation, i.e. the first decode of a prompt the
    /// cache held whole), a failed run otherwise.
    fn refused(e: ReserveError, what: &str) -> StepError {
        if e.is_retryable() {
            StepError::Refused
        } else {
            StepError::Fatal(format!("{what}: unexpected {e:?}"))
        }
    }

    /// Blocks a sequence of `len` tokens must hold, with `reserved` tokens
    /// of reservation (a reserved prompt not yet filled).
    fn blocks_for(&self, len: usize, reserved: usize) -> usize {
        len.max(reserved).div_ceil(self.block_size())
    }

    /// One append of `n` tokens to `live`, as a server makes it: the
    /// oracle counts out the blocks the sliding windows leave behind, the
    /// call, the device copies it asks for, the stamps of every new
    /// position written through each group's slot mapping, and one earlier
    /// position of each group read back. `reserved`: the tokens the tables
    /// hold blocks for ahead of the length.
    fn append(
        &mut self,
        live: &mut Live<B>,
        n: usize,
        reserved: usize,
        what: &str,
    ) -> Result<Range<usize>, StepError> {
        let bs = self.block_size();
        let old_len = live.seq.len();
        let (from, held) = (old_len / bs, live.seq.table(0).len());
        let fenced = self.device.fenced();
        let oracle = &self.shared.oracle;
        // The source of an earlier copy-on-write goes back in this call
        // (if it appends anything and is not refused), and so do the
        // blocks the windows leave behind (under the step's fence with
        // asynchronous scheduling).
        let mut retired = Vec::with_capacity(live.t.len());
        let mut counted_out = Ok(());
        let mut leaving = 0;
        if n > 0 {
            for (g, t) in live.t.iter_mut().enumerate() {
                retired.push(oracle.release_retired(&self.backend, t)?);
                let upto = live.seq.first_needed_block(g, old_len);
                let (left, checked) = oracle.before_window(&self.backend, t, upto);
                leaving += left;
                if counted_out.is_ok() {
                    counted_out = checked;
                }
            }
        }
        // Only a step that retires something is one in flight.
        let fence = (fenced && leaving > 0).then(|| self.device.fence());
        let mut copies = std::mem::take(&mut self.copies);
        copies.clear();
        let seq = &mut live.seq;
        let appended = self.call(OpKind::Append, || seq.try_append(n, fence, &mut copies));
        self.copies = copies;
        let oracle = &self.shared.oracle;
        let range = match appended {
            Ok(range) => range,
            Err(e) => {
                for (t, r) in live.t.iter_mut().zip(retired) {
                    oracle.keep_retired::<B::Seq>(t, r);
                    oracle.keep_window::<B::Seq>(t);
                }
                counted_out?;
                return Err(Self::refused(e, what));
            }
        };
        counted_out?;
        let want = self.blocks_for(range.end, reserved);
        for (g, t) in live.t.iter_mut().enumerate() {
            let list = fence.map(|_| self.device.current().1);
            oracle.window_gone(t, &live.seq, list)?;
            let copy = group_copy(&self.copies, g);
            oracle.after_call(&self.backend, t, &live.seq, from, copy)?;
            oracle.expect_blocks(t, want, what)?;
        }
        if want >= held + 2 {
            self.stats.counts.multi_block_appends += 1;
        }
        for &(_, c) in &self.copies {
            oracle.copy::<B::Seq>(c)?;
            self.stats.counts.block_copies += 1;
        }
        if fenced && !self.copies.is_empty() {
            // The step in flight makes the copies: their sources go back
            // when the step completes (every group's, in one call).
            let mut checked = Ok(());
            let mut fence = 0;
            for i in 0..self.copies.len() {
                let g = self.copies[i].0;
                let (f, list) = self.device.current();
                fence = f;
                let c = oracle.retire_copy_source(&self.backend, &mut live.t[g], list);
                if checked.is_ok() {
                    checked = c;
                }
            }
            let seq = &mut live.seq;
            self.call(OpKind::Append, || seq.retire_copy_source(fence));
            checked?;
        }
        for (g, t) in live.t.iter().enumerate() {
            let oracle = &self.shared.oracle;
            self.slots.clear();
            live.seq
                .extend_slots(g, range.clone(), &mut self.slots)
                .map_err(|e| StepError::Kv(format!("{what}: slot mapping refused: {e}")))?;
            oracle.write::<B::Seq>(t, range.clone(), &self.slots)?;
            self.stats.counts.stamps_written += range.len() as u64;
            // Attention reads an earlier position the group still holds.
            let first_held = t.null_entries(B::Seq::is_null) * bs;
            if range.start > first_held {
                let p = first_held + sampled(range.start - first_held);
                oracle.read::<B::Seq>(t, p..p + 1)?;
                self.stats.counts.stamps_read += 1;
            }
        }
        Ok(range)
    }

    /// One step of `g`; `Ok(true)` when the group has completed.
    fn step(&mut self, g: &mut Group<B>) -> Result<bool, StepError> {
        match g.phase {
            Phase::Prefill => self.prefill(g),
            Phase::Fork => {
                while g.seqs.len() < g.profile.samples {
                    self.fork(g)?;
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
                        self.stats.counts.tokens_decoded += kept as u64;
                    }
                    g.cursor += 1;
                }
                g.cursor = 0;
                Ok(g.generated.iter().all(|&n| n == output))
            }
        }
    }

    /// One prefill chunk; `Ok(true)` when the group has completed.
    fn prefill(&mut self, g: &mut Group<B>) -> Result<bool, StepError> {
        let chunk = self.cfg.chunk.min(g.req.prompt - g.prefilled);
        // A prompt the cache held whole has nothing left to prefill.
        if chunk > 0 {
            self.append(&mut g.seqs[0], chunk, g.reserved, "prefill")?;
        }
        g.prefilled += chunk;
        self.stats.counts.tokens_prefilled += chunk as u64;
        let done = g.prefilled == g.req.prompt;
        if let Some(keys) = g.keys.as_ref().filter(|k| B::Seq::key_blocks(k) > 0) {
            // The prompt's full trace blocks are in: publish them (before
            // any decode, so never a draft token). With `publish_chunks`,
            // each chunk's full blocks as it is prefilled, before a sliding
            // window moves past them.
            if done || (self.cfg.publish_chunks && chunk > 0) {
                let seq = &mut g.seqs[0].seq;
                self.call(OpKind::Publish, || seq.publish(keys));
                let published = B::Seq::key_blocks(keys).min(g.prefilled / self.block_size());
                for t in g.seqs[0].t.iter_mut() {
                    t.share(published);
                }
            }
        }
        if !done {
            return Ok(false);
        }
        g.phase = if g.profile.samples > 1 {
            Phase::Fork
        } else {
            Phase::Decode
        };
        Ok(g.req.output == 0 && g.profile.samples == 1)
    }

    /// Forks one more sample from the parent.
    fn fork(&mut self, g: &mut Group<B>) -> Result<(), StepError> {
        let bs = self.block_size();
        let parent = &g.seqs[0];
        let mut copies = std::mem::take(&mut self.copies);
        copies.clear();
        let seq = &parent.seq;
        let forked = self.call(OpKind::Fork, || seq.try_fork(&mut copies));
        self.copies = copies;
        let child = forked.map_err(|e| Self::refused(e, "fork"))?;
        let len = parent.seq.len();
        let writer = Writer {
            sample: g.seqs.len(),
            fork_len: len,
            ..parent.t[0].writer
        };
        let mut live = Live {
            seq: child,
            t: parent.t.iter().map(|t| t.forked(writer)).collect(),
        };
        let oracle = &self.shared.oracle;
        let mut checked = Ok(());
        for t in live.t.iter_mut() {
            let c = oracle
                .after_call(&self.backend, t, &live.seq, 0, None)
                .and_then(|()| oracle.expect_blocks(t, len.div_ceil(bs), "fork"));
            if checked.is_ok() {
                checked = c;
            }
        }
        // Per group, the copy the fork must ask for: the parent's partly
        // filled tail into the child's own block.
        let expected: Vec<ExpectedCopy<B::Id>> = (0..live.t.len())
            .map(|grp| {
                (!len.is_multiple_of(bs)).then(|| {
                    (
                        parent.t[grp].table()[len / bs],
                        live.t[grp].table().get(len / bs).copied(),
                    )
                })
            })
            .collect();
        // The child holds its blocks whatever the oracle found: keep it in
        // the group so that they are given back with it.
        g.seqs.push(live);
        checked?;
        self.stats.counts.forks += 1;
        for (grp, want) in expected.into_iter().enumerate() {
            match (group_copy(&self.copies, grp), want) {
                (None, None) => {}
                (Some(c), Some((src, Some(dst))))
                    if c.src == src && c.dst == dst && c.tokens == len % bs =>
                {
                    oracle.copy::<B::Seq>(c)?;
                    self.stats.counts.block_copies += 1;
                }
                (copy, _) => {
                    return Err(StepError::Kv(format!(
                        "request {}: a fork at length {len} returned the copy {copy:?} in \
                         group {grp}, not the partly filled tail into the child's own block",
                        g.req.id
                    )))
                }
            }
        }
        Ok(())
    }

    /// One decode step of sample `s`; returns the tokens it kept.
    fn decode(&mut self, g: &mut Group<B>, s: usize, remaining: usize) -> Result<usize, StepError> {
        if g.profile.spec == 0 {
            self.append(&mut g.seqs[s], 1, 0, "decode")?;
            return Ok(1);
        }
        // Speculative: K drafts in one append (their stamps written), read
        // back by the verification pass; keep the accepted prefix plus the
        // target's correction token, truncate the rest.
        let k = g.profile.spec.min(remaining);
        let range = self.append(&mut g.seqs[s], k, 0, "speculative append")?;
        for t in &g.seqs[s].t {
            self.shared.oracle.read::<B::Seq>(t, range.clone())?;
            self.stats.counts.stamps_read += k as u64;
        }
        let mut accepted = 0;
        while accepted < k && g.rng.random_bool(self.cfg.accept) {
            accepted += 1;
        }
        let kept = (accepted + 1).min(k);
        if kept < k {
            self.truncate(&mut g.seqs[s], range.start + kept)?;
            self.stats.counts.tokens_rolled_back += (k - kept) as u64;
        }
        Ok(kept)
    }

    /// Truncates `live` to `len` tokens: the shadow lets go of the blocks
    /// the truncate gives back first, and every table must then hold
    /// exactly the blocks `len` needs.
    fn truncate(&mut self, live: &mut Live<B>, len: usize) -> Result<(), StepError> {
        let keep = len.div_ceil(self.block_size());
        // The blocks go back whatever the check finds (it lowered the
        // shadow for them); fenced, when the step that read them completes.
        let oracle = &self.shared.oracle;
        let seq = &mut live.seq;
        let mut checked = Ok(());
        if self.device.fenced() {
            let (fence, list) = self.device.current();
            for t in live.t.iter_mut() {
                let c = oracle.give_back_fenced(&self.backend, t, keep, list);
                if checked.is_ok() {
                    checked = c;
                }
            }
            self.call(OpKind::Truncate, || seq.truncate_fenced(len, fence));
        } else {
            for t in live.t.iter_mut() {
                let c = oracle.before_release(&self.backend, t, keep);
                if checked.is_ok() {
                    checked = c;
                }
            }
            self.call(OpKind::Truncate, || seq.truncate(len));
        }
        checked?;
        for (g, t) in live.t.iter().enumerate() {
            let held = live.seq.table(g).len();
            self.shared
                .oracle
                .expect_blocks(t, held, "truncate")
                .map_err(|_| {
                    StepError::Kv(format!(
                        "request {} sample {} group {g}: truncate to {len} left {held} blocks, \
                         its length needs {keep}",
                        t.writer.request, t.writer.sample,
                    ))
                })?;
        }
        Ok(())
    }

    /// Reads every position of the group's sequences back (attention's last
    /// pass), then drops them, with any reserved blocks they still hold
    /// (each drop is an allocator call), each after the oracle's give-back
    /// check. The blocks go back whatever the reads and checks found.
    fn release(&mut self, mut g: Group<B>) -> Result<(), String> {
        self.shared.release_priority(g.req.id);
        if let Some(mut keys) = g.keys.take() {
            B::Seq::clear_keys(&mut keys);
            self.key_bufs.push(keys);
        }
        // Relaxed: a count of running requests, sampled for the report.
        self.shared.running.fetch_sub(1, Ordering::Relaxed);
        let bs = self.block_size();
        let oracle = &self.shared.oracle;
        let mut first = Ok(());
        for live in &g.seqs {
            let len = live.seq.len();
            for t in &live.t {
                // A sliding group's attention reads what it still holds.
                let held = (t.null_entries(B::Seq::is_null) * bs).min(len);
                if first.is_ok() {
                    first = oracle
                        .same_table(t, &live.seq)
                        .and_then(|()| oracle.read::<B::Seq>(t, held..len));
                    self.stats.counts.stamps_read += (len - held) as u64;
                }
            }
        }
        for mut live in g.seqs {
            let oracle = &self.shared.oracle;
            if self.device.fenced() {
                // A step in flight may still read them: retired under its
                // fence.
                let (fence, list) = self.device.current();
                for t in live.t.iter_mut() {
                    let checked = oracle.give_back_fenced(&self.backend, t, 0, list);
                    if first.is_ok() {
                        first = checked;
                    }
                }
                self.call(OpKind::Drop, || live.seq.retire(fence));
            } else {
                for t in live.t.iter_mut() {
                    let checked = oracle.before_release(&self.backend, t, 0);
                    if first.is_ok() {
                        first = checked;
                    }
                }
                self.call(OpKind::Drop, || drop(live.seq));
            }
        }
        first
    }

    /// Completes steps in flight, oldest first, as `drain` says, and
    /// returns how many: each after the oracle's check that the pool still
    /// counts what the step holds, and the complete must give back exactly
    /// what was retired under the fence (the allocator wakes whoever
    /// waits for what went back).
    fn complete_steps(&mut self, drain: Drain) -> Result<usize, StepError> {
        let mut steps = 0;
        let mut first = Ok(());
        while let Some((fence, list)) = self.device.take_oldest(drain == Drain::Due) {
            let checked = self
                .shared
                .oracle
                .before_complete(&self.backend, fence, &list);
            let (backend, watch) = (&self.backend, &self.shared.watch[self.index]);
            let n = self
                .stats
                .call((watch, self.shared.start), OpKind::Complete, || {
                    backend.complete(fence)
                });
            self.stats.counts.blocks_retired += list.len() as u64;
            let counted = if n == list.len() {
                Ok(())
            } else {
                Err(format!(
                    "fence {fence}: complete gave back {n} references, the step retired {}",
                    list.len()
                ))
            };
            if first.is_ok() {
                first = checked.and(counted);
            }
            self.device.recycle(list);
            steps += 1;
            if drain == Drain::Oldest {
                break;
            }
        }
        first.map(|()| steps).map_err(StepError::Kv)
    }

    fn complete(&mut self, g: Group<B>) -> Result<(), String> {
        let want = g.req.prompt + g.req.output;
        let blocks = want.div_ceil(self.block_size());
        let exact = g.seqs.len() == g.profile.samples
            && g.generated.iter().all(|&n| n == g.req.output)
            && g.seqs.iter().all(|l| {
                l.seq.len() == want && (0..l.t.len()).all(|grp| l.seq.table(grp).len() == blocks)
            });
        if !exact {
            self.stats.counts.output_mismatches += 1;
        }
        self.stats.counts.requests_completed += 1;
        let id = g.req.id;
        let read = self.release(g);
        self.finish_one(id);
        read
    }

    /// Admits `req` if its whole prompt fits with the watermark; `Ok(None)`
    /// if it does not fit now. With `wait` (the worker has nothing
    /// running), a refused admission then waits (see
    /// [`admit_blocking`](Self::admit_blocking)) for up to [`IDLE_WAIT`].
    fn admit(
        &mut self,
        (req, attempt): Waiting,
        profile: Profile,
        wait: bool,
    ) -> Result<Option<Group<B>>, StepError> {
        let wm = self.cfg.watermark_blocks;
        let bs = self.block_size();
        // The sequence's table is sized for the whole run (prompt plus
        // output), so that no append reallocates it.
        let tokens = req.prompt + req.output;
        let mut seq = match self.spare.take() {
            Some((sized, seq)) if sized == tokens => seq,
            // An empty sequence of another size: dropping it touches no
            // block (it holds none), so it is not an allocator call.
            _ => self.backend.new_seq(tokens),
        };
        // Prefix caching: the longest cached prefix of the prompt's full
        // trace blocks goes in first; the rest is admitted as usual.
        let caching = self.cfg.prefix_cache && req.hash_ids.is_some();
        let mut matched = if caching {
            self.match_prefix(&req, &mut seq)
        } else {
            0
        };
        let rest = req.prompt - matched * bs;
        let admitted = match profile.admission {
            Admission::Reserve => self.call(OpKind::Admit, || seq.try_reserve(rest, wm)),
            // The check keeps the block past the prefix (in every group),
            // so that the prefill chunks are growth: a check that kept
            // nothing would leave the first chunk a new admission, refused
            // behind any waiter queued in between (and its group preempted).
            Admission::Check => {
                let first = rest.min(bs);
                // What the rest of the prompt takes at once beside the
                // blocks the match put in the tables.
                let held = |g: usize| {
                    let t = seq.table(g);
                    t.iter().filter(|&&id| !B::Seq::is_null(id)).count()
                };
                let headroom = self
                    .cfg
                    .prefill_blocks_beside(rest, bs, held)
                    .saturating_sub(self.cfg.reserve_blocks(first, bs))
                    + wm;
                self.call(OpKind::Admit, || seq.try_reserve(first, headroom))
            }
        };
        // What the sequence holds ahead of its length once admitted: the
        // prompt's blocks when reserved, and the prompt's block past its
        // prefix when checked.
        let mut reserved = match profile.admission {
            Admission::Reserve => req.prompt,
            Admission::Check => (matched * bs + bs).min(req.prompt),
        };
        match admitted {
            Ok(()) => {}
            // Refused (short of blocks, or behind the allocator's waiters).
            Err(e) if e.is_retryable() && seq.table(0).len() == matched => {
                if matches!(e, ReserveError::BehindWaiters { .. }) {
                    self.stats.counts.refused_behind_waiters += 1;
                } else {
                    self.stats.counts.refused_full += 1;
                }
                // The sequence holds only what it matched; it gives that
                // back (as a server would) and is kept empty.
                if matched > 0 {
                    self.call(OpKind::Truncate, || seq.truncate(0));
                }
                if !wait || !self.admit_blocking(&req, profile, matched, &mut seq)? {
                    self.spare = Some((tokens, seq));
                    return Ok(None);
                }
                // Granted while waiting: the reservation, into which the
                // prefix cached now is matched (its blocks take reserved
                // blocks' places).
                self.stats.counts.waited_admissions += 1;
                if profile.admission == Admission::Check {
                    reserved = self.check_wait_tokens(&req, matched);
                }
                matched = if caching {
                    self.match_prefix(&req, &mut seq)
                } else {
                    0
                };
                // A match into a grant can leave it short (a block the
                // match revived and let go of, shared meanwhile by another
                // match, with the pool full: see
                // `HybridSequence::try_match_prefix`): topped up as an
                // admission, or else given back whole, as a refusal.
                let grant = reserved.max(matched * bs);
                if seq.capacity() < grant {
                    self.stats.counts.short_grants += 1;
                    let rest = grant - matched * bs;
                    if self
                        .call(OpKind::Admit, || seq.try_reserve(rest, 0))
                        .is_err()
                    {
                        self.stats.counts.refused_short_grants += 1;
                        self.call(OpKind::Truncate, move || drop(seq));
                        return Ok(None);
                    }
                }
                self.stats.counts.waited_hit_tokens += (matched * bs) as u64;
            }
            Err(e) => return Err(StepError::Fatal(format!("admission: unexpected {e:?}"))),
        }
        self.stats.counts.prompt_tokens += req.prompt as u64;
        self.stats.counts.prefix_hit_tokens += (matched * bs) as u64;
        let writer = Writer {
            request: req.id,
            sample: 0,
            attempt,
            fork_len: 0,
        };
        let (t, keys) = match (&req.hash_ids, caching) {
            (Some(ids), true) => {
                // The keys go with the group, to be published.
                self.keys.0 = None;
                let keys = self.keys.1.take();
                let content = prefix::content_ids(ids, req.prompt);
                (Tracked::with_content(writer, content.into()), keys)
            }
            _ => (Tracked::new(writer), None),
        };
        let mut live = Live {
            t: t.groups(seq.groups()),
            seq,
        };
        let oracle = &self.shared.oracle;
        let want = self.blocks_for(matched * bs, reserved);
        let mut checked = Ok(());
        for t in live.t.iter_mut() {
            t.share(matched);
            let c = oracle
                .after_call(&self.backend, t, &live.seq, 0, None)
                .and_then(|()| oracle.expect_blocks(t, want, "admission"));
            if checked.is_ok() {
                checked = c;
            }
        }
        // Relaxed: a count of running requests, sampled for the report.
        let running = self.shared.running.fetch_add(1, Ordering::Relaxed) + 1;
        self.shared
            .running_peak
            .fetch_max(running, Ordering::Relaxed);
        let mut seqs = Vec::with_capacity(profile.samples);
        seqs.push(live);
        let rng = SmallRng::seed_from_u64(
            self.cfg.seed ^ (req.id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        let g = Group {
            req,
            attempt,
            profile,
            phase: Phase::Prefill,
            seqs,
            generated: vec![0; profile.samples],
            prefilled: matched * bs,
            reserved,
            cursor: 0,
            rng,
            keys,
        };
        if let Err(e) = checked {
            // Give the blocks back before stopping.
            let _ = self.release(g);
            return Err(StepError::Kv(e));
        }
        Ok(Some(g))
    }

    /// The waiting form of a refused admission, for a worker with nothing
    /// running: waits for up to [`IDLE_WAIT`] for the admission itself (in
    /// the allocator, or retrying it: see [`IdleWait`]), and keeps what it
    /// is granted; `Ok(false)` when the wait timed out (`seq` is then
    /// empty).
    ///
    /// * Reserve: `reserve_blocking` of the whole prompt with the watermark
    ///   as headroom. The grant is the admission: the prompt's blocks, with
    ///   the watermark free besides.
    /// * Check-only: `reserve_blocking` of the prompt's blocks up to the
    ///   first one past the `matched` blocks its refused admission had
    ///   matched, with the rest of the prompt and the watermark as
    ///   headroom, granted exactly when the check passes. The blocks are
    ///   kept: the prefix matched into them after the grant takes their
    ///   first places, and the block past it stays (the sequence holds
    ///   it, so its prefill chunks take the rest as growth). Giving it
    ///   back and taking the blocks again with the first chunk would hand
    ///   them to the next waiter first: with workers queued behind it,
    ///   every check-only grant would go back, every first chunk be
    ///   refused and its group preempted, and no request finish.
    ///
    /// With [`IdleWait::Queue`], in kvslots the wait is a place in the
    /// pool's FIFO queue: while it is queued, new admissions leave it all
    /// it asks for (headroom included), and running groups' appends
    /// (growth of sequences that hold blocks) do not wait behind it. The
    /// grant is made at the give-back that lets it in, before the running
    /// groups' next steps can grow into those blocks. The baseline waits
    /// on its condition variable and retries when woken. With
    /// [`IdleWait::Poll`], the same admission is tried every
    /// [`POLL_TICK`] on both allocators, and counted as an admission call
    /// each time.
    ///
    /// The prefix is given back before waiting, not held: a worker holding
    /// matched blocks while it waits keeps them from the others, and when
    /// every idle worker does so the pool can be left with nobody able to
    /// go on. The caller matches the prefix into the grant, plain and
    /// hybrid sequences alike (over kvslots' pool a reserved block can pay
    /// for a cached block revived, so the match is not refused behind the
    /// waiters queued after it; the baseline admits its revivals).
    fn admit_blocking(
        &mut self,
        req: &Request,
        profile: Profile,
        matched: usize,
        seq: &mut B::Seq,
    ) -> Result<bool, StepError> {
        let (wm, bs) = (self.cfg.watermark_blocks, self.block_size());
        // A check-only admission waits for the prompt's blocks up to the
        // first past its prefix (in every group) with the rest of what it
        // needs as headroom.
        let (tokens, headroom) = match profile.admission {
            Admission::Reserve => (req.prompt, wm),
            Admission::Check => {
                let need = self.cfg.prefill_blocks(req.prompt, bs);
                let tokens = self.check_wait_tokens(req, matched);
                let first = self.cfg.reserve_blocks(tokens, bs);
                (tokens, need.saturating_sub(first) + wm)
            }
        };
        self.stats.counts.idle_waits += 1;
        let waited = match self.cfg.idle_wait {
            IdleWait::Queue => self.call(OpKind::Wait, || {
                seq.reserve_blocking(tokens, headroom, Some(IDLE_WAIT))
            }),
            IdleWait::Poll => {
                let start = Instant::now();
                loop {
                    let tried = self.call(OpKind::Admit, || seq.try_reserve(tokens, headroom));
                    match tried {
                        Err(e) if e.is_retryable() && start.elapsed() < IDLE_WAIT => {
                            std::thread::sleep(POLL_TICK);
                        }
                        done => break done,
                    }
                }
            }
        };
        match waited {
            Ok(()) => Ok(true),
            Err(ReserveError::Full { .. } | ReserveError::BehindWaiters { .. }) => Ok(false),
            Err(e) => Err(StepError::Fatal(format!(
                "blocking admission: unexpected {e:?}"
            ))),
        }
    }

    /// The tokens a check-only admission of `req` waits for, having
    /// matched `matched` blocks before its refusal: the prompt's blocks up
    /// to the first past that prefix, where the grant is matched into
    /// (every group full: a sliding group's reservation is not one block
    /// per block of tokens); else the first block only.
    fn check_wait_tokens(&self, req: &Request, matched: usize) -> usize {
        let full = self
            .cfg
            .groups
            .as_slice()
            .iter()
            .all(|g| *g == KvGroup::Full);
        let ahead = if full { matched } else { 0 };
        ((ahead + 1) * self.block_size()).min(req.prompt)
    }

    /// Matches the prompt of `req` against the prefix cache into the empty
    /// `seq` (one allocator call); returns the blocks matched. The keys
    /// are made once per request (in every group) and kept for its next
    /// attempts.
    fn match_prefix(&mut self, req: &Request, seq: &mut B::Seq) -> usize {
        let bs = self.block_size();
        let (for_id, keys) = &mut self.keys;
        if *for_id != Some(req.id) || keys.is_none() {
            let mut fresh = keys
                .take()
                .or_else(|| self.key_bufs.pop())
                .unwrap_or_else(|| self.backend.new_keys());
            B::Seq::clear_keys(&mut fresh);
            self.base_keys.clear();
            if let Some(ids) = &req.hash_ids {
                prefix::block_keys(ids, req.prompt, bs, &mut self.base_keys);
            }
            self.backend.extend_keys(&mut fresh, &self.base_keys);
            *keys = Some(fresh);
            *for_id = Some(req.id);
        }
        let Some(keys) = self.keys.1.take() else {
            return 0;
        };
        let k = if B::Seq::key_blocks(&keys) == 0 {
            0
        } else {
            self.call(OpKind::Match, || seq.try_match_prefix(&keys))
        };
        self.keys.1 = Some(keys);
        k
    }

    /// Admits waiting requests, first come first served, while this worker
    /// runs fewer than `max_running` groups and the head fits.
    fn admit_waiting(
        &mut self,
        q: &mut Queue<'_>,
        running: &mut Vec<Group<B>>,
    ) -> Result<(), StepError> {
        let (nb, bs) = (self.backend.num_blocks(), self.block_size());
        // While the priority group is refused, nothing new is admitted
        // (see `Shared::hold_priority`).
        while running.len() < self.cfg.max_running && !self.shared.blocked() {
            let head = match q.waiting.front() {
                Some(w) => w.clone(),
                None if q.source_done => break,
                // Closed-loop: every request has arrived, so a worker waits
                // for the producer rather than treating a momentarily empty
                // queue as "no work" (which would also make one-worker runs
                // depend on thread timing).
                None => match q.rx.recv() {
                    Ok(r) => {
                        q.waiting.push_back((r.clone(), 0));
                        (r, 0)
                    }
                    Err(RecvError) => {
                        q.source_done = true;
                        break;
                    }
                },
            };
            let req = &head.0;
            let profile = self.cfg.profile(req.id, bs);
            if never_fits(req, &profile, &self.cfg, nb, bs) {
                q.waiting.pop_front();
                self.stats.counts.requests_rejected += 1;
                self.finish_one(req.id);
                continue;
            }
            match self.admit(head, profile, false)? {
                Some(g) => {
                    q.waiting.pop_front();
                    running.push(g);
                }
                None => break,
            }
        }
        Ok(())
    }

    /// Records a failure that stops the run.
    fn fail(&mut self, e: StepError) {
        let msg = match e {
            StepError::Refused => return,
            StepError::Kv(m) => {
                self.stats.counts.kv_failures += 1;
                format!("kv memory: {m}")
            }
            StepError::Fatal(m) => m,
        };
        self.shared.fail(msg);
    }

    /// Admission when nothing runs: done (`false`), or the waiting head's
    /// waiting admission, which lasts until another worker's give-back
    /// lets it in or [`IDLE_WAIT`] runs out (`true` either way; the
    /// caller's loop re-checks the stop flag and the stall guard). With
    /// [`IdleWait::Queue`] the allocator wakes the waiter: the library's
    /// queue after every release, the baseline's condition variable after
    /// every free; with [`IdleWait::Poll`] the worker retries every
    /// [`POLL_TICK`].
    fn wait_for_blocks(
        &mut self,
        q: &mut Queue<'_>,
        running: &mut Vec<Group<B>>,
    ) -> Result<bool, StepError> {
        // Nothing runs: the device drains first, so that the worker does
        // not wait for blocks its own steps in flight keep retired.
        self.complete_steps(Drain::All)?;
        let Some(head) = q.waiting.front().cloned() else {
            // `admit_waiting` stops with nothing running only when the
            // source is done and nothing waits, when the head is refused,
            // or while the priority group is refused.
            return Ok(!q.source_done);
        };
        if self.shared.blocked() {
            // The priority group is refused: no new admission (and no wait
            // in the allocator, whose grant would be one) until it goes on.
            std::thread::yield_now();
            return Ok(true);
        }
        let profile = self.cfg.profile(head.0.id, self.block_size());
        if let Some(g) = self.admit(head, profile, true)? {
            q.waiting.pop_front();
            running.push(g);
        }
        Ok(true)
    }

    /// One step of every running group, oldest first, preempting the most
    /// recently admitted group when the pool refuses.
    fn step_all(
        &mut self,
        q: &mut Queue<'_>,
        running: &mut Vec<Group<B>>,
    ) -> Result<(), StepError> {
        self.device.next_step();
        self.complete_steps(Drain::Due)?;
        // Relaxed: a sampled count for the report.
        let at_once = self.shared.running.load(Ordering::Relaxed);
        self.stats.counts.occupancy_samples += 1;
        self.stats.counts.running_sum += at_once as u64;
        self.stats.counts.used_blocks_sum += self.backend.used_blocks() as u64;
        let mut i = 0;
        while i < running.len() {
            let stepped = self.step(&mut running[i]);
            if stepped.is_ok() && self.shared.is_priority(running[i].req.id) {
                // The priority group goes on: admissions may resume.
                self.shared.set_blocked(false);
            }
            match stepped {
                Ok(true) => {
                    let g = running.remove(i);
                    self.complete(g)?;
                }
                Ok(false) => i += 1,
                Err(StepError::Refused) if self.device.fenced() && self.sync_device()? => {
                    // The oldest step in flight completed: retry.
                }
                Err(StepError::Refused) => {
                    let id = running[i].req.id;
                    if running.len() == 1 && self.shared.hold_priority(id) {
                        // The priority group, refused with nothing else
                        // here to preempt: it keeps its blocks, no worker
                        // admits anything new until it goes on, and this
                        // worker tries it again at its next iteration.
                        self.shared.set_blocked(true);
                        // Relaxed: a sampled count, as everywhere.
                        if self.shared.running.load(Ordering::Relaxed) == 1 {
                            // Nothing else runs anywhere, so no give-back
                            // is coming but from a group being admitted
                            // or released this moment: the blocks it lacks
                            // are lost (a leak). It waits, and the stall
                            // guard counts the wait as a blocking one: a
                            // leak ends the run after `stall_limit / 1000`
                            // waits, however busy the machine (a spin
                            // would count once in `stall_limit`
                            // iterations, each as slow as the machine is
                            // busy).
                            self.lone_waits += 1;
                            std::thread::sleep(IDLE_WAIT);
                        } else {
                            std::thread::yield_now();
                        }
                        break;
                    }
                    // Preempt the most recently admitted group other than
                    // the priority group (maybe this one), then retry this
                    // one if it is still here.
                    let priority = self.shared.priority();
                    let v = running
                        .iter()
                        .rposition(|g| Some(g.req.id) != priority)
                        .expect("only one group is the priority group");
                    let victim = running.remove(v);
                    if v < i {
                        i -= 1;
                    }
                    q.waiting
                        .push_front((victim.req.clone(), victim.attempt.wrapping_add(1)));
                    self.stats.counts.preemptions += 1;
                    self.release(victim)?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Waits for the device to complete its oldest step in flight, if
    /// there is one (`Ok(false)` if not): what it retired goes back, and a
    /// refused allocation may fit now.
    fn sync_device(&mut self) -> Result<bool, StepError> {
        let synced = self.complete_steps(Drain::Oldest)? > 0;
        self.stats.counts.device_syncs += u64::from(synced);
        Ok(synced)
    }

    pub(super) fn run(mut self, rx: &Receiver<Request>) -> WorkerStats {
        let mut running: Vec<Group<B>> = Vec::new();
        // Declared after `running`, so dropped before it when a panic
        // unwinds: the run is stopped before the groups' blocks go back
        // (without the oracle counting them out), so that the panic, not
        // what other workers then find in those blocks, is the first
        // failure.
        let _stop_on_panic = StopOnPanic(Arc::clone(&self.shared), self.index);
        let mut q = Queue {
            rx,
            waiting: VecDeque::new(),
            source_done: false,
        };
        // Relaxed: progress snapshots for stall detection.
        let mut last_finished = self.shared.finished.load(Ordering::Relaxed);
        let (mut busy_idle, mut waiting_idle) = (0u64, 0u64);
        let mut calls_at_progress = 0u64;
        let wait_limit = self.cfg.stall_limit / 1000;
        while !self.shared.aborted() {
            let waits_before = (self.stats.counts.idle_waits, self.lone_waits);
            let stepped = match self.admit_waiting(&mut q, &mut running) {
                Ok(()) if running.is_empty() => match self.wait_for_blocks(&mut q, &mut running) {
                    Ok(true) => Ok(false),
                    Ok(false) => break,
                    Err(e) => Err(e),
                },
                Ok(()) => self.step_all(&mut q, &mut running).map(|()| true),
                Err(e) => Err(e),
            };
            let stepped = match stepped {
                Ok(s) => s,
                Err(e) => {
                    self.fail(e);
                    break;
                }
            };
            // The stall guard: iterations that stepped, and blocking waits
            // (granted or not), without any request finishing anywhere.
            // Relaxed: a progress snapshot.
            let now = self.shared.finished.load(Ordering::Relaxed);
            let calls = self.stats.counts.alloc_calls;
            if now != last_finished {
                (last_finished, busy_idle, waiting_idle) = (now, 0, 0);
                calls_at_progress = calls;
            } else {
                busy_idle += u64::from(stepped);
                waiting_idle +=
                    u64::from((self.stats.counts.idle_waits, self.lone_waits) != waits_before);
                let stretch = &mut self.stats.longest_calls_without_progress;
                *stretch = (*stretch).max(calls - calls_at_progress);
            }
            if busy_idle > self.cfg.stall_limit || waiting_idle > wait_limit {
                self.stall();
                break;
            }
        }
        for g in running.drain(..).rev() {
            // The run is ending early: what the reads find is moot.
            let _ = self.release(g);
        }
        // The device drains (after a failure, what its checks find is
        // moot too).
        if let Err(e) = self.complete_steps(Drain::All) {
            if !self.shared.aborted() {
                self.fail(e);
            }
        }
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

/// Group `group`'s copy among `copies`, if it has one.
fn group_copy<Id: Copy>(copies: &Copies<Id>, group: usize) -> Option<BlockCopy<Id>> {
    copies.iter().find(|&&(g, _)| g == group).map(|&(_, c)| c)
}
