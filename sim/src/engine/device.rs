//! The device of asynchronous scheduling (`--async-depth K`): one worker's
//! steps in flight. The scheduler's step `s` on worker `w` of `n` has the
//! fence `s * n + w` (unique over the run); the blocks the step gives back
//! are retired under it, and the step completes when the scheduler starts
//! step `s + K` (or sooner, when the scheduler waits for the device: a
//! refused allocation, or nothing left to run).

use std::collections::VecDeque;

use crate::oracle::FencedRef;

/// One worker's steps in flight and the blocks retired under each.
#[derive(Debug)]
pub(super) struct Device {
    /// How many steps the device runs behind the scheduler (0: none, and
    /// nothing is ever retired).
    depth: u64,
    worker: u64,
    workers: u64,
    /// The scheduler's current step.
    step: u64,
    /// The fences in flight, oldest first, with each reference retired
    /// under it.
    in_flight: VecDeque<(u64, Vec<FencedRef>)>,
    /// Emptied lists, for reuse.
    spare: Vec<Vec<FencedRef>>,
}

impl Device {
    pub(super) fn new(worker: usize, workers: usize, depth: usize) -> Device {
        Device {
            depth: depth as u64,
            worker: worker as u64,
            workers: workers as u64,
            step: 0,
            in_flight: VecDeque::new(),
            spare: Vec::new(),
        }
    }

    /// Whether give-backs are fenced.
    pub(super) fn fenced(&self) -> bool {
        self.depth > 0
    }

    /// The scheduler starts its next step.
    pub(super) fn next_step(&mut self) {
        self.step += 1;
    }

    /// The current step's fence, without making it a step in flight.
    pub(super) fn fence(&self) -> u64 {
        self.step * self.workers + self.worker
    }

    /// The current step's fence, and the list of what is retired under it
    /// (which makes the step one in flight).
    pub(super) fn current(&mut self) -> (u64, &mut Vec<FencedRef>) {
        let fence = self.fence();
        if self.in_flight.back().map(|&(f, _)| f) != Some(fence) {
            let list = self.spare.pop().unwrap_or_default();
            self.in_flight.push_back((fence, list));
        }
        let (fence, list) = self.in_flight.back_mut().expect("just pushed");
        (*fence, list)
    }

    /// The oldest step in flight, taken out if the scheduler is `depth`
    /// steps past it (or whatever its step, without `due_only`).
    pub(super) fn take_oldest(&mut self, due_only: bool) -> Option<(u64, Vec<FencedRef>)> {
        let &(fence, _) = self.in_flight.front()?;
        let step = fence / self.workers;
        if !due_only || step + self.depth <= self.step {
            self.in_flight.pop_front()
        } else {
            None
        }
    }

    /// Keeps a completed step's list for reuse.
    pub(super) fn recycle(&mut self, mut list: Vec<FencedRef>) {
        list.clear();
        self.spare.push(list);
    }
}
