//! `kvslots.Sequence` and `kvslots.BlockCopy`.
//!
//! The core crate's `Sequence` takes `&mut self`: here it sits behind a
//! mutex, so that one Python object can be used from many threads (calls
//! on one sequence take turns; calls on different sequences do not). The
//! mutex is taken without blocking while attached to the interpreter (a
//! contended lock is waited for detached, and Ctrl-C interrupts that wait:
//! `lock.rs`), and nothing that can run Python code (allocating Python
//! objects, raising) happens while it is held, so a finalizer that touches
//! the same sequence cannot deadlock, with one exception: `reserve` runs
//! the signal handlers while it waits, holding the mutex. A handler (or a
//! finalizer that a handler's allocations run) that calls the same
//! sequence gets `RuntimeError` from the mutex, which knows its holding
//! thread, rather than waiting for itself.

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};

use kvslots::{BlockCopy, BlockId, ReserveError};
use pyo3::exceptions::{PyImportError, PyOverflowError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyList, PyMemoryView, PyRange, PyTuple};

use crate::convert;
use crate::detached;
use crate::errors;
use crate::lock::{SeqLock, ThreadToken};
use crate::pool::{id_list, PyBlockPool};
use crate::wait;

/// A device copy the caller must make: the first `tokens` token slots of
/// block `src` into block `dst` (a fork's private tail, or a
/// copy-on-write), before the kernel writes into `dst`.
#[pyclass(name = "BlockCopy", module = "kvslots", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PyBlockCopy {
    /// The block to copy from.
    #[pyo3(get)]
    src: usize,
    /// The block to copy into.
    #[pyo3(get)]
    dst: usize,
    /// How many leading token slots to copy.
    #[pyo3(get)]
    tokens: usize,
}

impl From<BlockCopy> for PyBlockCopy {
    fn from(copy: BlockCopy) -> Self {
        PyBlockCopy {
            src: copy.src.index(),
            dst: copy.dst.index(),
            tokens: copy.tokens,
        }
    }
}

#[pymethods]
impl PyBlockCopy {
    /// Raises `ValueError` for a `src` or `dst` that is no block id (not
    /// in `0..2**32 - 1`) or a negative `tokens`, `TypeError` for a
    /// non-int, `OverflowError` for a `tokens` past `2**64`.
    #[new]
    fn new(
        src: &Bound<'_, PyAny>,
        dst: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let id = |obj: &Bound<'_, PyAny>, what: &str| -> PyResult<usize> {
            match convert::block_id(obj)? {
                Some(id) if !id.is_null() => Ok(id.index()),
                _ => Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "{what} must be a block id (an int in 0..2**32 - 1), got {obj}"
                ))),
            }
        };
        Ok(PyBlockCopy {
            src: id(src, "src")?,
            dst: id(dst, "dst")?,
            tokens: convert::uint(tokens, "tokens")?,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockCopy(src={}, dst={}, tokens={})",
            self.src, self.dst, self.tokens
        )
    }
}

/// One sequence's block table over a `BlockPool`: its length in tokens
/// and the blocks that hold them, in order.
///
/// Appends take all the blocks they need or none; `fork()` shares full
/// blocks; `truncate` rolls back; `match_prefix` / `publish` use the
/// pool's prefix cache. `close()` (or leaving a `with` block, or garbage
/// collection) gives every block back.
///
/// Thread safety: a `Sequence` may be used from many threads. The core
/// sequence is a single-owner value, so it is kept behind a mutex: calls on
/// one sequence take turns, calls on different sequences run in parallel,
/// and a call that waits (`reserve`) or walks many blocks releases the GIL
/// (and holds the sequence's mutex meanwhile; a call waiting for the mutex
/// runs the signal handlers, so Ctrl-C interrupts it).
#[pyclass(name = "Sequence", module = "kvslots", frozen, weakref)]
pub(crate) struct PySequence {
    pool: Py<PyBlockPool>,
    /// `None` once closed or retired.
    inner: SeqLock<Option<kvslots::Sequence>>,
}

/// Why `fork` failed.
enum ForkError {
    Reserve(ReserveError),
    /// A block to share was freed with `BlockPool.free` (a double free).
    Freed(BlockId),
    /// The core panicked (a racing double free, or a reference count at
    /// its limit); the child gave back what it took.
    Panicked,
}

impl PySequence {
    /// Runs `f` on the open sequence, under its mutex. `f` must not call
    /// into Python, except to detach.
    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&mut kvslots::Sequence) -> R) -> PyResult<R> {
        match self.inner.lock(py)?.as_mut() {
            Some(seq) => Ok(f(seq)),
            None => Err(errors::closed_sequence()),
        }
    }

    /// Appends `n` tokens if the sequence is free now (no other call holds
    /// it), open, needs no copy-on-write and its pool has the blocks;
    /// whether it did (else nothing changed). Never waits and never calls
    /// into Python: `try_append_each` runs it detached.
    pub(crate) fn try_append_now(&self, n: usize, me: ThreadToken) -> bool {
        let Some(mut guard) = self.inner.try_lock_as(me) else {
            return false;
        };
        match guard.as_mut() {
            Some(seq) if n == 0 || !seq.append_needs_copy() => seq.try_append(n).is_ok(),
            _ => false,
        }
    }

    /// The blocks an append of `n` tokens walks, for [`detached`].
    pub(crate) fn blocks_of(&self, n: usize) -> usize {
        n / self.pool.get().inner.block_size()
    }

    /// Takes the sequence out (closing this object), or `None` if closed.
    fn take(&self, py: Python<'_>) -> PyResult<Option<kvslots::Sequence>> {
        Ok(self.inner.lock(py)?.take())
    }

    /// A Python object for a core sequence over the same pool.
    fn wrap(&self, py: Python<'_>, seq: kvslots::Sequence) -> PyResult<Py<PySequence>> {
        Py::new(
            py,
            PySequence {
                pool: self.pool.clone_ref(py),
                inner: SeqLock::new(Some(seq)),
            },
        )
    }

    /// The flat slot indices of `start..stop` (`stop` defaulting to the
    /// length, read under the same lock).
    fn slots(
        &self,
        py: Python<'_>,
        start: Option<&Bound<'_, PyAny>>,
        stop: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<usize>> {
        let start: usize = match start {
            Some(s) => convert::uint(s, "start")?,
            None => 0,
        };
        let stop: Option<usize> = stop.map(|s| convert::uint(s, "stop")).transpose()?;
        let mut out = Vec::new();
        self.with(py, |seq| {
            let positions = start..stop.unwrap_or(seq.len());
            // Room for a range the sequence holds, taken here so that a
            // range too long for memory is a `MemoryError` (`extend_slots`
            // grows `out` as `Vec` does, which aborts); a range past the
            // length stays `extend_slots`' `IndexError`.
            if positions.end <= seq.len() && out.try_reserve_exact(positions.len()).is_err() {
                return Err(errors::out_of_memory("a slot mapping", positions.len()));
            }
            // About a nanosecond a token: release the GIL for long ranges.
            let blocks = positions.len() / seq.pool().block_size();
            // The closure holds the `&mut` (a sequence is `Send`, not
            // `Sync`): no other thread can call it meanwhile.
            let out = &mut out;
            detached(py, blocks, move || seq.extend_slots(positions, out))
                .map_err(errors::position_error)
        })??;
        Ok(out)
    }
}

/// A Python `range(start, stop)`, called with two arguments (its step
/// defaults to 1 without one to convert and check).
pub(crate) fn range<'py>(py: Python<'py>, r: Range<usize>) -> PyResult<Bound<'py, PyAny>> {
    py.get_type::<PyRange>().call1((r.start, r.end))
}

/// `(range, BlockCopy | None)`.
fn range_and_copy<'py>(
    py: Python<'py>,
    r: Range<usize>,
    copy: Option<BlockCopy>,
) -> PyResult<Bound<'py, PyTuple>> {
    let copy = copy.map(PyBlockCopy::from);
    PyTuple::new(py, [range(py, r)?, copy.into_pyobject(py)?.into_any()])
}

#[pymethods]
impl PySequence {
    #[new]
    fn new(pool: Bound<'_, PyBlockPool>) -> Self {
        let core = kvslots::Sequence::new(pool.get().inner.clone());
        PySequence {
            pool: pool.unbind(),
            inner: SeqLock::new(Some(core)),
        }
    }

    /// The pool the blocks come from.
    #[getter]
    fn pool(&self, py: Python<'_>) -> Py<PyBlockPool> {
        self.pool.clone_ref(py)
    }

    /// Whether `close()` or `retire()` has been called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.inner.lock(py)?.is_none())
    }

    /// The number of tokens in the sequence.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        convert::py_len(self.with(py, |seq| seq.len())?)
    }

    /// The block table: the ids of the blocks holding positions
    /// `0..len(seq)`, in order, then any reserved ahead (`reserve`).
    #[getter]
    fn block_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let ids = self.with(py, |seq| seq.blocks().to_vec())?;
        id_list(py, &ids)
    }

    /// The ids of the table's entries `start` and after: `block_ids[start:]`
    /// without building the rest (`[]` from the end of the table on). After
    /// an append, `block_ids_from(n)`, where `n` was `capacity //
    /// block_size` before it, lists the blocks it took: what a scheduler
    /// sends its workers each step.
    fn block_ids_from<'py>(
        &self,
        py: Python<'py>,
        start: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let start: usize = convert::uint(start, "start")?;
        let ids = self.with(py, |seq| seq.blocks().get(start..).unwrap_or(&[]).to_vec())?;
        id_list(py, &ids)
    }

    /// How many tokens the blocks in the table can hold
    /// (`len(block_ids) * block_size`, at least `len(seq)`).
    #[getter]
    fn capacity(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |seq| seq.capacity())
    }

    /// Whether a non-empty append now needs a copy-on-write (the last block
    /// is partly filled and shared or cached): `try_append` then raises
    /// `CopyRequired`, and `append_cow` returns the copy to make.
    #[getter]
    fn needs_copy(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, |seq| seq.append_needs_copy())
    }

    /// Appends `n` tokens, taking exactly the new blocks they need, all or
    /// none, and returns their positions `range(old_len, old_len + n)`.
    ///
    /// Raises `Full`, `NeverFits` or `Closed` (counted in blocks), or
    /// `CopyRequired` when the last block needs a copy-on-write first (use
    /// `append_cow`); nothing changes then. `n == 0` takes nothing.
    fn try_append<'py>(
        &self,
        py: Python<'py>,
        n: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n: usize = convert::uint(n, "n")?;
        let blocks = n / self.pool.get().inner.block_size();
        let appended = self.with(py, |seq| {
            if n > 0 && seq.append_needs_copy() {
                return None;
            }
            Some(detached(py, blocks, || seq.try_append(n)))
        })?;
        match appended {
            None => Err(errors::CopyRequired::new_err(
                "the last block is shared or cached and must be copied before it is \
                 written: append with Sequence.append_cow, which returns the BlockCopy to make",
            )),
            Some(Ok(r)) => range(py, r),
            Some(Err(e)) => Err(errors::reserve_error(py, e)),
        }
    }

    /// Appends `n` tokens as `try_append` does, and returns
    /// `(positions, copy)`: `copy` is the `BlockCopy` the append needed
    /// (the last block was partly filled and shared or cached), else None.
    /// Make the copy before the kernel writes the new tokens; the sequence
    /// keeps its reference to `copy.src` until its next non-empty append,
    /// shortening truncate or close.
    fn append_cow<'py>(
        &self,
        py: Python<'py>,
        n: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let n: usize = convert::uint(n, "n")?;
        let blocks = n / self.pool.get().inner.block_size();
        let appended = self.with(py, |seq| detached(py, blocks, || seq.try_append_cow(n)))?;
        match appended {
            Ok((r, copy)) => range_and_copy(py, r, copy),
            Err(e) => Err(errors::reserve_error(py, e)),
        }
    }

    /// Makes sure the table holds blocks for `tokens` more tokens, taking
    /// the missing ones all or none, only if `headroom` blocks stay free
    /// afterwards; `len(seq)` is unchanged, and the appends of those tokens
    /// allocate nothing (whole-prompt admission, then chunked prefill).
    /// When the blocks held already cover them, nothing is taken and
    /// nothing is checked (neither `headroom` nor whether the pool is
    /// closed).
    ///
    /// Raises `Full`, `NeverFits` or `Closed`; nothing changes then.
    #[pyo3(signature = (tokens, headroom = convert::Arg::Default), text_signature = "(self, tokens, headroom=0)")]
    fn try_reserve(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        headroom: convert::Arg<'_>,
    ) -> PyResult<()> {
        let (tokens, headroom) = convert::reservation(tokens, &headroom)?;
        let blocks = tokens / self.pool.get().inner.block_size();
        self.with(py, |seq| {
            detached(py, blocks, || seq.try_reserve(tokens, headroom))
        })?
        .map_err(|e| errors::reserve_error_with_headroom(py, e, headroom))
    }

    /// `try_reserve`, waiting in the pool's queue (GIL released) until the
    /// missing blocks, with `headroom` free besides, are granted, for at
    /// most `timeout` seconds (`None`: no limit).
    ///
    /// Raises `NeverFits` at once, `Closed`, or `Full` when the timeout
    /// runs out (`SequenceBusy` if it ran out while another thread's call
    /// held this sequence); a signal handler's exception (Ctrl-C) ends the
    /// wait.
    /// Nothing changes when it raises. Other calls on this sequence wait
    /// for it to return; a call on it from a signal handler (or a
    /// finalizer) that runs in this thread during the wait raises
    /// `RuntimeError` at once and changes nothing.
    #[pyo3(
        signature = (tokens, headroom = convert::Arg::Default, timeout = None),
        text_signature = "(self, tokens, headroom=0, timeout=None)"
    )]
    fn reserve(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        headroom: convert::Arg<'_>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let (tokens, headroom) = convert::reservation(tokens, &headroom)?;
        let deadline = wait::deadline(convert::timeout(timeout)?);
        let Some(mut guard) = self.inner.lock_until(py, deadline)? else {
            return Err(errors::busy_sequence(py, "Sequence"));
        };
        let seq = guard.as_mut().ok_or_else(errors::closed_sequence)?;
        // The deadline passed: one last try, whose refusal is the `Full` to
        // report.
        match wait::block_on(py, seq.reserve(tokens, headroom), deadline)? {
            Some(done) => done,
            None => seq.try_reserve(tokens, headroom),
        }
        .map_err(|e| errors::reserve_error_with_headroom(py, e, headroom))
    }

    /// Rolls the sequence back to `len` tokens (rejected draft tokens,
    /// preemption) and gives back the blocks no longer needed; returns how
    /// many blocks left the table. A `len` at or past `len(seq)` does
    /// nothing.
    fn truncate(&self, py: Python<'_>, len: &Bound<'_, PyAny>) -> PyResult<usize> {
        let len: usize = convert::uint(len, "len")?;
        self.with(py, |seq| {
            let blocks = seq.blocks().len();
            detached(py, blocks, || seq.truncate(len))
        })
    }

    /// `truncate` for a device step that may still read the blocks given
    /// back: their references are dropped only at `pool.complete(fence)`.
    /// Returns how many blocks left the table.
    fn truncate_fenced(
        &self,
        py: Python<'_>,
        len: &Bound<'_, PyAny>,
        fence: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let len: usize = convert::uint(len, "len")?;
        let fence: u64 = convert::uint(fence, "fence")?;
        self.with(py, |seq| {
            let blocks = seq.blocks().len();
            detached(py, blocks, || seq.truncate_fenced(len, fence))
        })
    }

    /// Gives the sequence up while device step `fence` may still read its
    /// blocks: every reference it holds is dropped at
    /// `pool.complete(fence)`. Returns how many references; the sequence is
    /// closed afterwards.
    fn retire(&self, py: Python<'_>, fence: &Bound<'_, PyAny>) -> PyResult<usize> {
        let fence: u64 = convert::uint(fence, "fence")?;
        let seq = self.take(py)?.ok_or_else(errors::closed_sequence)?;
        let blocks = seq.blocks().len();
        Ok(detached(py, blocks, || seq.retire(fence)))
    }

    /// Hands the source of the last copy-on-write (kept for the device
    /// copy) to `fence`: its reference is dropped at `pool.complete(fence)`
    /// instead of at the next append. Returns 1 if there was one, else 0.
    fn retire_copy_source(&self, py: Python<'_>, fence: &Bound<'_, PyAny>) -> PyResult<usize> {
        let fence: u64 = convert::uint(fence, "fence")?;
        self.with(py, |seq| seq.retire_copy_source(fence))
    }

    /// Gives back the reserved blocks that hold no token and returns how
    /// many; the tokens and `len(seq)` are unchanged.
    fn shrink_to_fit(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |seq| {
            let blocks = seq.blocks().len();
            detached(py, blocks, || seq.shrink_to_fit())
        })
    }

    /// Forks a child (parallel sampling, beam search): it shares every
    /// full block and gets a private block for a partly filled last one.
    /// Returns `(child, copy)`: `copy` is the `BlockCopy` that fills the
    /// child's private block, or None on a block boundary.
    ///
    /// Raises `Full`, `BehindWaiters` or `Closed` when no block is free for
    /// the private tail, `NeverFits` when every block of the pool is this
    /// sequence's own, and `RuntimeError` if a block to share already has
    /// the most references a block can have; nothing changes then.
    /// (`BlockPool.free` refuses a sequence's blocks,
    /// `kind == "held_by_sequence"`, so a fork never finds one gone; it
    /// would raise `FreeError`, `kind == "not_allocated"`.)
    fn fork<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let forked = self.with(py, |seq| {
            let pool = seq.pool();
            let full = seq.len() / pool.block_size();
            if let Some(&id) = seq.blocks()[..full]
                .iter()
                .find(|&&id| pool.ref_count(id) == Some(0))
            {
                return Err(ForkError::Freed(id));
            }
            // Moved in as `&mut` (a sequence is `Send`, not `Sync`).
            detached(py, full, move || {
                catch_unwind(AssertUnwindSafe(|| seq.try_fork()))
                    .map_err(|_| ForkError::Panicked)?
                    .map_err(ForkError::Reserve)
            })
        })?;
        match forked {
            Ok((child, copy)) => {
                let child = self.wrap(py, child)?;
                let copy = copy.map(PyBlockCopy::from);
                PyTuple::new(
                    py,
                    [
                        child.into_any(),
                        copy.into_pyobject(py)?.into_any().unbind(),
                    ],
                )
            }
            Err(ForkError::Reserve(e)) => Err(errors::reserve_error(py, e)),
            Err(ForkError::Freed(id)) => Err(errors::from_free_error(
                py,
                kvslots::FreeError::NotAllocated { id },
            )),
            Err(ForkError::Panicked) => Err(PyRuntimeError::new_err(
                "fork failed: a block of this sequence lost its reference to a racing \
                 BlockPool.free (a double free), or has the most references a block can \
                 have; nothing was taken",
            )),
        }
    }

    /// Takes the longest prefix of `keys` (from `hash_blocks` with the
    /// pool's block size) whose blocks are cached into this sequence, one
    /// reference each; sets `len(seq)` to `k * block_size` and returns
    /// `k`. On a sequence that holds only reserved blocks (`try_reserve`
    /// or `reserve` with `len(seq) == 0`) the matched blocks take the
    /// first reserved blocks' places (those go back to the pool, and each
    /// pays for a cached block revived, also while free blocks are owed to
    /// waiters), so `capacity` stays, and the sequence stays admitted while
    /// it holds a block: its appends are growth, which does not wait
    /// behind queued waiters. A sequence that holds tokens matches nothing
    /// and returns 0. Raises `TypeError` / `ValueError` for a key that is
    /// not 32 bytes (nothing changes then).
    fn match_prefix(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        let keys = convert::keys(keys)?;
        self.with(py, |seq| {
            detached(py, keys.len(), || seq.try_match_prefix(&keys))
        })
    }

    /// Caches this sequence's full blocks under `keys` (`keys[i]` for block
    /// `i`) and returns how many became cached: a key another block holds
    /// stays with it, a block already cached keeps its key, extra keys are
    /// ignored. Publish only committed tokens.
    fn publish(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        let keys = convert::keys(keys)?;
        self.with(py, |seq| detached(py, keys.len(), || seq.publish(&keys)))
    }

    /// The flat KV-cache slot of token `position`
    /// (`block_ids[position // block_size] * block_size + position %
    /// block_size`), or None at or past `len(seq)`.
    fn slot(&self, py: Python<'_>, position: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        let position: usize = convert::uint(position, "position")?;
        self.with(py, |seq| seq.slot(position))
    }

    /// The slot mapping of positions `start..stop` (`stop` defaults to
    /// `len(seq)`): the flat slot of each token, as attention kernels take
    /// it. Raises `IndexError` for a non-empty range that ends past
    /// `len(seq)`; an empty range (`start >= stop`) maps to `[]`.
    #[pyo3(signature = (start = None, stop = None))]
    fn slot_mapping<'py>(
        &self,
        py: Python<'py>,
        start: Option<&Bound<'py, PyAny>>,
        stop: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let slots = self.slots(py, start, stop)?;
        convert::int_list(py, slots.iter().map(|&slot| slot as u64))
    }

    /// The slot mapping of `start..stop` as native-endian `int64`s in a
    /// new writable `memoryview` (format `"q"`) over a `bytearray`: hand it
    /// to `numpy.frombuffer(buf, numpy.int64)` or
    /// `torch.frombuffer(buf, dtype=torch.int64)` without a copy. Needs no
    /// numpy.
    #[pyo3(signature = (start = None, stop = None))]
    fn slot_mapping_buffer<'py>(
        &self,
        py: Python<'py>,
        start: Option<&Bound<'py, PyAny>>,
        stop: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let slots = self.slots(py, start, stop)?;
        int64_view(py, &slots)
    }

    /// The slot mapping of `start..stop` as a numpy `int64` array that
    /// owns a buffer written once (no copy into numpy). Raises
    /// `ImportError` if numpy is not installed (it is not a dependency).
    #[pyo3(signature = (start = None, stop = None))]
    fn slot_mapping_array<'py>(
        &self,
        py: Python<'py>,
        start: Option<&Bound<'py, PyAny>>,
        stop: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (frombuffer, int64) = numpy_frombuffer(py)?;
        let slots = self.slots(py, start, stop)?;
        let view = int64_view(py, &slots)?;
        frombuffer.call1((view, int64))
    }

    /// Gives every block back now (the device must be done with them; see
    /// `retire` otherwise). Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(seq) = self.take(py)? {
            let blocks = seq.blocks().len();
            detached(py, blocks, || drop(seq));
        }
        Ok(())
    }

    /// Returns the sequence; raises `ValueError` if it is closed, as a
    /// closed file does. Never waits: a sequence that another call holds
    /// now is entered as it is.
    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        if slf.get().inner.closed_now() {
            return Err(errors::closed_sequence());
        }
        Ok(slf)
    }

    /// Closes the sequence; does not swallow the exception.
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: &Bound<'_, PyAny>,
        exc: &Bound<'_, PyAny>,
        tb: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let _ = (exc_type, exc, tb);
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(match self.inner.lock(py)?.as_ref() {
            Some(seq) => format!(
                "Sequence(len={}, blocks={}, capacity={})",
                seq.len(),
                seq.blocks().len(),
                seq.capacity()
            ),
            None => "Sequence(closed)".to_owned(),
        })
    }
}

/// `numpy.frombuffer` and `numpy.int64`, looked up at the first
/// `slot_mapping_array` that finds numpy and kept (numpy is optional, so
/// it is not imported with the module; a call after the first one skips
/// the import's lookups). `ImportError` if numpy is not installed.
fn numpy_frombuffer(py: Python<'_>) -> PyResult<(&Bound<'_, PyAny>, &Bound<'_, PyAny>)> {
    static FROMBUFFER: PyOnceLock<(Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();
    let (frombuffer, int64) = FROMBUFFER.get_or_try_init(py, || {
        let numpy = py.import("numpy").map_err(|e| {
            // Only a missing numpy is this `ImportError`; anything else
            // raised by its import (Ctrl-C's `KeyboardInterrupt`) goes as is.
            if !e.is_instance_of::<PyImportError>(py) {
                return e;
            }
            let err = PyImportError::new_err(
                "Sequence.slot_mapping_array needs numpy (pip install numpy); \
                 slot_mapping_buffer gives the same int64s without it",
            );
            err.set_cause(py, Some(e));
            err
        })?;
        PyResult::Ok((
            numpy.getattr("frombuffer")?.unbind(),
            numpy.getattr("int64")?.unbind(),
        ))
    })?;
    Ok((frombuffer.bind(py), int64.bind(py)))
}

/// `slots` as a writable `memoryview` of native-endian `int64`s over a new
/// `bytearray`.
fn int64_view<'py>(py: Python<'py>, slots: &[usize]) -> PyResult<Bound<'py, PyAny>> {
    // Python's allocation failing is its `MemoryError`.
    let len = slots
        .len()
        .checked_mul(8)
        .ok_or_else(|| errors::out_of_memory("a slot mapping", slots.len()))?;
    let bytes = PyByteArray::new_with(py, len, |buf| {
        for (dst, &s) in buf.chunks_exact_mut(8).zip(slots) {
            let v = i64::try_from(s)
                .map_err(|_| PyOverflowError::new_err(format!("slot {s} does not fit an int64")))?;
            dst.copy_from_slice(&v.to_ne_bytes());
        }
        Ok(())
    })?;
    PyMemoryView::from(bytes.as_any())?.call_method1("cast", ("q",))
}
