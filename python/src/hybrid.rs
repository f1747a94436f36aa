//! `kvslots.KvGroups`, `kvslots.GroupKeys` and `kvslots.HybridSequence`:
//! hybrid models (sliding-window or chunked local attention layers beside
//! full-attention ones), a block table per group of layers over one pool.
//!
//! As `Sequence`, the core sequence sits behind a mutex (`lock.rs`), taken
//! without blocking while attached, and nothing that can run Python code
//! happens while it is held, except the signal handlers that `reserve`
//! runs while it waits (see `sequence.rs`).

use std::sync::{Mutex, PoisonError};

use kvslots::{BlockCopy, HybridError, KvGroup};
use pyo3::exceptions::{PyIndexError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::convert;
use crate::detached;
use crate::errors;
use crate::lock::{SeqLock, ThreadToken};
use crate::pool::PyBlockPool;
use crate::sequence::range;
use crate::sequence::PyBlockCopy;
use crate::wait;

/// A hybrid model's groups of layers, in order: each full attention
/// (`"full"`) or a sliding window of `window_tokens` tokens (an int: the
/// tokens a token attends to, itself included, as `sliding_window` counts
/// them in a Hugging Face config). `HybridSequence` keeps one block table
/// per group over one pool.
///
/// Raises `ValueError` for no group, more than `MAX_GROUPS`, a window of
/// 0 or an unknown kind; `TypeError` for an item that is neither, or for
/// kinds given as one `str`, `bytes` or `bytearray`.
#[pyclass(name = "KvGroups", module = "kvslots", frozen, eq, hash)]
#[derive(PartialEq, Eq, Hash)]
pub(crate) struct PyKvGroups {
    pub(crate) inner: kvslots::KvGroups,
}

#[pymethods]
impl PyKvGroups {
    /// The most groups a `KvGroups` may have.
    #[classattr]
    const MAX_GROUPS: usize = kvslots::KvGroups::MAX_GROUPS;

    #[new]
    fn new(kinds: &Bound<'_, PyAny>) -> PyResult<Self> {
        // A `str` iterates as one-letter strings and `bytes` as ints: a
        // group list in one is almost surely one group passed without its
        // list (`KvGroups("full")`, `KvGroups(b"...")`).
        if kinds.is_instance_of::<PyString>() || convert::is_byte_string(kinds)? {
            return Err(PyTypeError::new_err(format!(
                "kinds must be an iterable of groups (\"full\", an int or a (\"chunked\", n) pair), \
                 not {}",
                kinds.get_type().name()?
            )));
        }
        convert::ordered("kinds", kinds)?;
        let mut groups = Vec::new();
        for item in kinds.try_iter()? {
            let item = item?;
            let group = if item.is_instance_of::<PyString>() {
                let text: String = item.extract()?;
                match text.as_str() {
                    "full" => KvGroup::Full,
                    other => {
                        return Err(PyValueError::new_err(format!(
                            "a group is \"full\", a sliding window in tokens (an int) or \
                             (\"chunked\", chunk_tokens), not {other:?}"
                        )))
                    }
                }
            } else if let Ok(pair) = item.cast::<PyTuple>() {
                chunked(pair)?
            } else if item.hasattr(pyo3::intern!(item.py(), "__index__"))? {
                // An int, or an int-like (a numpy integer from a model's
                // config).
                KvGroup::SlidingWindow {
                    window_tokens: convert::uint(&item, "window_tokens")?,
                }
            } else {
                return Err(PyTypeError::new_err(format!(
                    "a group is \"full\", a sliding window in tokens (an int) or \
                     (\"chunked\", chunk_tokens), not {}",
                    item.get_type().name()?
                )));
            };
            if groups.len() == kvslots::KvGroups::MAX_GROUPS {
                let max = kvslots::KvGroups::MAX_GROUPS;
                let e = kvslots::KvGroupsError::TooManyGroups { max };
                return Err(PyValueError::new_err(e.to_string()));
            }
            groups.push(group);
        }
        kvslots::KvGroups::new(groups)
            .map(|inner| PyKvGroups { inner })
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// How many groups.
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// The groups, in order: `"full"`, a sliding window's tokens, or
    /// `("chunked", chunk_tokens)`; `KvGroups(groups.kinds)` is an equal
    /// `KvGroups`.
    #[getter]
    fn kinds<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut items = Vec::with_capacity(self.inner.len());
        for g in self.inner.as_slice() {
            items.push(match *g {
                KvGroup::SlidingWindow { window_tokens } => {
                    let Ok(window) = window_tokens.into_pyobject(py);
                    window.into_any()
                }
                KvGroup::ChunkedLocal { chunk_tokens } => {
                    let Ok(chunk) = chunk_tokens.into_pyobject(py);
                    PyTuple::new(
                        py,
                        [PyString::new(py, "chunked").into_any(), chunk.into_any()],
                    )?
                    .into_any()
                }
                _ => PyString::new(py, "full").into_any(),
            });
        }
        PyList::new(py, items)
    }

    /// The first block, of `block_size` tokens, that group `group` still
    /// needs after `len` tokens (the first the next token reads): 0 for a
    /// full group. Raises `IndexError` past the last group.
    fn first_needed_block(
        &self,
        group: &Bound<'_, PyAny>,
        len: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let group: usize = convert::uint(group, "group")?;
        let len: usize = convert::uint(len, "len")?;
        let block_size: usize = convert::uint(block_size, "block_size")?;
        if block_size == 0 {
            return Err(PyValueError::new_err("block_size must be at least 1"));
        }
        let kind = self
            .inner
            .get(group)
            .ok_or_else(|| no_group(group, &self.inner))?;
        Ok(kind.first_needed_block(len, block_size))
    }

    /// Each group's prefix-cache keys of the blocks whose content keys are
    /// `keys` (from `hash_blocks`, in one list or packed): a `GroupKeys`.
    fn keys(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<PyGroupKeys> {
        let base = convert::keys(keys)?;
        let mut inner = kvslots::GroupKeys::new(&self.inner);
        reserve_keys(&mut inner, base.len())?;
        detached(py, base.len(), || inner.extend(&base));
        Ok(PyGroupKeys {
            inner: Mutex::new(inner),
        })
    }

    fn __repr__(&self) -> String {
        let kinds: Vec<String> = self
            .inner
            .as_slice()
            .iter()
            .map(|g| match *g {
                KvGroup::SlidingWindow { window_tokens } => window_tokens.to_string(),
                KvGroup::ChunkedLocal { chunk_tokens } => format!("('chunked', {chunk_tokens})"),
                _ => "'full'".to_owned(),
            })
            .collect();
        format!("KvGroups([{}])", kinds.join(", "))
    }
}

/// A group given as a pair: `("chunked", chunk_tokens)`, chunked local
/// attention in chunks of `chunk_tokens` positions (Llama 4's
/// `attention_chunk_size`).
fn chunked(pair: &Bound<'_, PyTuple>) -> PyResult<KvGroup> {
    let refuse = || {
        PyValueError::new_err(format!(
            "a group given as a tuple is (\"chunked\", chunk_tokens), not {}",
            pair.repr()
                .map_or_else(|_| "that".to_owned(), |r| r.to_string())
        ))
    };
    if pair.len() != 2 {
        return Err(refuse());
    }
    let tag = pair.get_item(0)?;
    if !tag.is_instance_of::<PyString>() || tag.extract::<String>()? != "chunked" {
        return Err(refuse());
    }
    Ok(KvGroup::ChunkedLocal {
        chunk_tokens: convert::uint(&pair.get_item(1)?, "chunk_tokens")?,
    })
}

/// Room in `keys` for `blocks` more blocks' keys in every group, or
/// `MemoryError` (then `extend` takes no more memory: a group's keys are
/// `blocks` times the groups' count, which can pass memory for an input
/// that fits).
fn reserve_keys(keys: &mut kvslots::GroupKeys, blocks: usize) -> PyResult<()> {
    keys.try_reserve(blocks).map_err(|_| {
        let all = blocks.saturating_mul(keys.groups().len());
        errors::out_of_memory("group keys", all)
    })
}

/// `IndexError` for a group past the last.
fn no_group(group: usize, groups: &kvslots::KvGroups) -> PyErr {
    PyIndexError::new_err(format!("no group {group}: there are {}", groups.len()))
}

/// Each group's prefix-cache keys of a prompt's full blocks, made by
/// `KvGroups.keys`: what `HybridSequence.match_prefix` and `publish` take.
/// A group's key is one SHA-256 compression of a block's content key with
/// the group's number and kind, so a block never matches in another group.
#[pyclass(name = "GroupKeys", module = "kvslots", frozen)]
pub(crate) struct PyGroupKeys {
    inner: Mutex<kvslots::GroupKeys>,
}

#[pymethods]
impl PyGroupKeys {
    /// How many blocks have keys (the same in every group).
    fn __len__(&self, py: Python<'_>) -> usize {
        self.lock(py).blocks()
    }

    /// Adds the next blocks' keys, from their content keys (`hash_blocks`
    /// with `parent=`, as decode fills blocks): one SHA-256 compression a
    /// block and a group, with the GIL released for 32 compressions or
    /// more.
    fn extend(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<()> {
        let base = convert::keys(keys)?;
        let mut guard = self.lock(py);
        reserve_keys(&mut guard, base.len())?;
        let work = base.len().saturating_mul(guard.groups().len());
        // Detached with the mutex held: every other call takes it with
        // `lock_py_attached`, which waits detached, so none can hold the
        // GIL while it waits for this one.
        let inner: &mut kvslots::GroupKeys = &mut guard;
        detached(py, work, || inner.extend(&base));
        Ok(())
    }

    /// Keeps the first `blocks` blocks' keys.
    fn truncate(&self, py: Python<'_>, blocks: &Bound<'_, PyAny>) -> PyResult<()> {
        let blocks: usize = convert::uint(blocks, "blocks")?;
        self.lock(py).truncate(blocks);
        Ok(())
    }

    /// Group `group`'s keys, 32 bytes each, block 0 first. Raises
    /// `IndexError` past the last group.
    fn group<'py>(
        &self,
        py: Python<'py>,
        group: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let g: usize = convert::uint(group, "group")?;
        let keys = {
            let inner = self.lock(py);
            match inner.group(g) {
                Some(k) => k.to_vec(),
                None => return Err(no_group(g, inner.groups())),
            }
        };
        convert::key_list(py, &keys)
    }

    /// The groups the keys are for.
    #[getter]
    fn groups(&self, py: Python<'_>) -> PyKvGroups {
        PyKvGroups {
            inner: self.lock(py).groups().clone(),
        }
    }
}

impl PyGroupKeys {
    fn lock(&self, py: Python<'_>) -> std::sync::MutexGuard<'_, kvslots::GroupKeys> {
        self.inner
            .lock_py_attached(py)
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// `BlockPool.peek_hybrid_prefix`: the peek runs with the keys locked,
/// detached from the interpreter for long lists.
pub(crate) fn peek(py: Python<'_>, pool: &kvslots::BlockPool, keys: &PyGroupKeys) -> usize {
    let keys = keys.lock(py);
    let keys: &kvslots::GroupKeys = &keys;
    let blocks = keys.blocks().saturating_mul(keys.groups().len());
    detached(py, blocks, || pool.peek_hybrid_prefix(keys))
}

/// One sequence of a hybrid model: a block table per group of `groups`
/// over one `BlockPool`, with one length.
///
/// Appends, reservations and forks take every group's blocks with one
/// allocation, all or none. A sliding group gives back, in the append that
/// moves past them, the blocks wholly before the window of the append's
/// first token: they become `None` entries of its table (`block_ids`),
/// and those it held alone and uncached are reused for the new blocks.
/// `match_prefix` takes the longest prefix every group can serve (a full
/// group needs every block, a sliding group only the window ending at the
/// hit); `publish` caches every group's full blocks (publish each step's
/// before the next append: a window gives blocks back published or not).
/// Every refusal raises and changes nothing.
///
/// Thread safety: as `Sequence` (calls on one sequence take turns; calls
/// that wait or walk many blocks release the GIL).
#[pyclass(name = "HybridSequence", module = "kvslots", frozen, weakref)]
pub(crate) struct PyHybridSequence {
    pool: Py<PyBlockPool>,
    groups: kvslots::KvGroups,
    /// `None` once closed or retired.
    inner: SeqLock<Option<kvslots::HybridSequence>>,
}

impl PyHybridSequence {
    /// Appends `n` tokens as `Sequence::try_append_now` does: if the
    /// sequence is free now, open, needs no copy-on-write and its pool has
    /// the blocks of every group; whether it did (else nothing changed).
    pub(crate) fn try_append_now(&self, n: usize, me: ThreadToken) -> bool {
        let Some(mut guard) = self.inner.try_lock_as(me) else {
            return false;
        };
        match guard.as_mut() {
            Some(seq) if n == 0 || !seq.append_needs_copy() => seq.try_append(n).is_ok(),
            _ => false,
        }
    }

    /// Group `g`'s table from entry `start` on (`[]` past its end), as a
    /// list of ids and `None`s.
    fn table_from<'py>(
        &self,
        py: Python<'py>,
        g: usize,
        start: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let ids = self.with(py, |seq| {
            seq.blocks(g)
                .and_then(|table| table.get(start..))
                .unwrap_or(&[])
                .to_vec()
        })?;
        let items = ids
            .iter()
            .map(|id| (!id.is_null()).then(|| id.index()))
            .collect::<Vec<_>>();
        PyList::new(py, items)
    }

    /// Runs `f` on the open sequence, under its mutex. `f` must not call
    /// into Python, except to detach.
    fn with<R>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut kvslots::HybridSequence) -> R,
    ) -> PyResult<R> {
        match self.inner.lock(py)?.as_mut() {
            Some(seq) => Ok(f(seq)),
            None => Err(closed_hybrid()),
        }
    }

    fn take(&self, py: Python<'_>) -> PyResult<Option<kvslots::HybridSequence>> {
        Ok(self.inner.lock(py)?.take())
    }

    /// A call's work, in blocks, for `detached`: `tokens` in every group.
    pub(crate) fn blocks_of(&self, tokens: usize) -> usize {
        (tokens / self.pool_block_size()).saturating_mul(self.groups.len())
    }

    fn pool_block_size(&self) -> usize {
        self.pool.get().inner.block_size()
    }

    /// Group `group`, checked.
    fn group(&self, group: &Bound<'_, PyAny>) -> PyResult<usize> {
        let g: usize = convert::uint(group, "group")?;
        if g >= self.groups.len() {
            return Err(no_group(g, &self.groups));
        }
        Ok(g)
    }

    /// The core keys of `keys`, checked for this sequence's groups.
    fn keys_of(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyGroupKeys>,
    ) -> PyResult<kvslots::GroupKeys> {
        let keys = keys.get().lock(py).clone();
        if keys.groups() != &self.groups {
            return Err(hybrid_error(HybridError::OtherGroups));
        }
        Ok(keys)
    }
}

/// The Python exception for a core `HybridError`.
fn hybrid_error(err: HybridError) -> PyErr {
    match err {
        HybridError::TruncateOutsideWindow { len, min_len } => {
            errors::window_error(err.to_string(), len, min_len)
        }
        HybridError::OtherGroups => PyValueError::new_err(err.to_string()),
        // No group, a position past the length or outside a window, and
        // kinds the core may add later.
        _ => PyIndexError::new_err(err.to_string()),
    }
}

/// `(range, [BlockCopy, ...])`.
fn range_and_copies<'py>(
    py: Python<'py>,
    r: std::ops::Range<usize>,
    copies: Vec<BlockCopy>,
) -> PyResult<Bound<'py, PyTuple>> {
    let copies = PyList::new(py, copies.into_iter().map(PyBlockCopy::from))?;
    PyTuple::new(py, [range(py, r)?, copies.into_any()])
}

#[pymethods]
impl PyHybridSequence {
    #[new]
    fn new(pool: Bound<'_, PyBlockPool>, groups: &Bound<'_, PyKvGroups>) -> Self {
        let groups = groups.get().inner.clone();
        let core = kvslots::HybridSequence::new(pool.get().inner.clone(), groups.clone());
        PyHybridSequence {
            pool: pool.unbind(),
            groups,
            inner: SeqLock::new(Some(core)),
        }
    }

    /// The pool the blocks come from.
    #[getter]
    fn pool(&self, py: Python<'_>) -> Py<PyBlockPool> {
        self.pool.clone_ref(py)
    }

    /// The groups of layers.
    #[getter]
    fn groups(&self) -> PyKvGroups {
        PyKvGroups {
            inner: self.groups.clone(),
        }
    }

    /// Whether `close()` or `retire()` has been called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.inner.lock(py)?.is_none())
    }

    /// The number of tokens in the sequence (the same in every group).
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        convert::py_len(self.with(py, |seq| seq.len())?)
    }

    /// How many tokens every group's table can hold (the least over the groups).
    #[getter]
    fn capacity(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |seq| seq.capacity())
    }

    /// The blocks the sequence holds in all its tables (its KV memory, in
    /// blocks): every entry but the `None` ones.
    #[getter]
    fn held_blocks(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |seq| seq.held_blocks())
    }

    /// Group `group`'s block table: block ids, `None` for those its
    /// sliding window gave back, then any reserved blocks. Raises
    /// `IndexError` past the last group.
    fn block_ids<'py>(
        &self,
        py: Python<'py>,
        group: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let g = self.group(group)?;
        self.table_from(py, g, 0)
    }

    /// Group `group`'s table from entry `start` on: `block_ids(group)[start:]`
    /// without building the rest (`[]` from the end of the table on).
    /// Raises `IndexError` past the last group.
    fn block_ids_from<'py>(
        &self,
        py: Python<'py>,
        group: &Bound<'py, PyAny>,
        start: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let g = self.group(group)?;
        let start: usize = convert::uint(start, "start")?;
        self.table_from(py, g, start)
    }

    /// How many leading entries of group `group`'s table are `None`.
    fn null_blocks(&self, py: Python<'_>, group: &Bound<'_, PyAny>) -> PyResult<usize> {
        let g = self.group(group)?;
        self.with(py, |seq| seq.null_blocks(g).unwrap_or(0))
    }

    /// Whether a non-empty append now needs a copy-on-write in some group:
    /// `try_append` then raises `CopyRequired`, and `append_cow` returns
    /// the copies to make.
    #[getter]
    fn needs_copy(&self, py: Python<'_>) -> PyResult<bool> {
        self.with(py, |seq| seq.append_needs_copy())
    }

    /// Appends `n` tokens to every group: takes the new blocks all the
    /// groups need with one allocation, all or none; gives back the sliding
    /// groups' blocks that leave their windows; returns
    /// `range(old_len, old_len + n)`.
    ///
    /// Raises `Full`, `BehindWaiters`, `NeverFits` or `Closed`, or
    /// `CopyRequired` when a group's last block needs a copy-on-write
    /// first (use `append_cow`); nothing changes then.
    fn try_append<'py>(
        &self,
        py: Python<'py>,
        n: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let n: usize = convert::uint(n, "n")?;
        let blocks = self.blocks_of(n);
        let appended = self.with(py, |seq| {
            if n > 0 && seq.append_needs_copy() {
                return None;
            }
            Some(detached(py, blocks, || seq.try_append(n)))
        })?;
        match appended {
            None => Err(errors::CopyRequired::new_err(
                "a group's last block is shared or cached and must be copied before it is \
                 written: append with HybridSequence.append_cow, which returns the \
                 BlockCopy values to make",
            )),
            Some(Ok(r)) => range(py, r),
            Some(Err(e)) => Err(errors::reserve_error(py, e)),
        }
    }

    /// Appends `n` tokens as `try_append` does, and returns
    /// `(positions, copies)`: the `BlockCopy` of each group whose last
    /// block was partly filled and shared or cached (in group order),
    /// to make before the kernel writes the new tokens.
    fn append_cow<'py>(
        &self,
        py: Python<'py>,
        n: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let n: usize = convert::uint(n, "n")?;
        let blocks = self.blocks_of(n);
        let appended = self.with(py, |seq| {
            let mut copies = Vec::new();
            detached(py, blocks, || seq.try_append_cow(n, &mut copies)).map(|r| (r, copies))
        })?;
        match appended {
            Ok((r, copies)) => range_and_copies(py, r, copies),
            Err(e) => Err(errors::reserve_error(py, e)),
        }
    }

    /// `append_cow` for asynchronous scheduling: the blocks the windows
    /// leave behind are retired under `fence` (given back at
    /// `pool.complete(fence)`) and none is reused.
    fn append_fenced<'py>(
        &self,
        py: Python<'py>,
        n: &Bound<'py, PyAny>,
        fence: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let n: usize = convert::uint(n, "n")?;
        let fence: u64 = convert::uint(fence, "fence")?;
        let blocks = self.blocks_of(n);
        let appended = self.with(py, |seq| {
            let mut copies = Vec::new();
            detached(py, blocks, || seq.try_append_fenced(n, fence, &mut copies))
                .map(|r| (r, copies))
        })?;
        match appended {
            Ok((r, copies)) => range_and_copies(py, r, copies),
            Err(e) => Err(errors::reserve_error(py, e)),
        }
    }

    /// Makes sure every table holds blocks for `tokens` more tokens, taking
    /// the missing ones of all the groups with one allocation, all or none,
    /// only if `headroom` blocks stay free afterwards. When the blocks held
    /// already cover them, nothing is taken and nothing is checked (neither
    /// `headroom` nor whether the pool is closed).
    ///
    /// Raises `Full`, `BehindWaiters`, `NeverFits` or `Closed`; nothing
    /// changes then.
    #[pyo3(signature = (tokens, headroom = convert::Arg::Default), text_signature = "(self, tokens, headroom=0)")]
    fn try_reserve(
        &self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        headroom: convert::Arg<'_>,
    ) -> PyResult<()> {
        let (tokens, headroom) = convert::reservation(tokens, &headroom)?;
        let blocks = self.blocks_of(tokens);
        self.with(py, |seq| {
            detached(py, blocks, || seq.try_reserve(tokens, headroom))
        })?
        .map_err(|e| errors::reserve_error_with_headroom(py, e, headroom))
    }

    /// `try_reserve`, waiting in the pool's queue (GIL released) until
    /// every group's missing blocks, with `headroom` free besides, are
    /// granted together, for at most `timeout` seconds (`None`: no limit).
    ///
    /// Raises `NeverFits` at once, `Closed`, or `Full` when the timeout
    /// runs out (`SequenceBusy` if it ran out while another thread's call
    /// held this sequence); a signal handler's exception ends the wait. Nothing
    /// changes when it raises. Other calls on this sequence wait for it to
    /// return; a call on it from a signal handler (or a finalizer) that
    /// runs in this thread during the wait raises `RuntimeError` at once
    /// and changes nothing.
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
            return Err(errors::busy_sequence(py, "HybridSequence"));
        };
        let seq = guard.as_mut().ok_or_else(closed_hybrid)?;
        // The deadline passed: one last try, whose refusal is the `Full` to
        // report.
        match wait::block_on(py, seq.reserve(tokens, headroom), deadline)? {
            Some(done) => done,
            None => seq.try_reserve(tokens, headroom),
        }
        .map_err(|e| errors::reserve_error_with_headroom(py, e, headroom))
    }

    /// Rolls every group back to `len` tokens and returns how many blocks
    /// left the tables. Raises `WindowError` (nothing changed) if the
    /// window of the token at `len` reaches blocks a sliding (or chunked)
    /// group gave back; a truncate back into the last append, or to 0, never does.
    fn truncate(&self, py: Python<'_>, len: &Bound<'_, PyAny>) -> PyResult<usize> {
        let len: usize = convert::uint(len, "len")?;
        self.with(py, |seq| {
            let blocks = seq.held_blocks();
            detached(py, blocks, || seq.truncate(len))
        })?
        .map_err(hybrid_error)
    }

    /// `truncate` for a device step that may still read the blocks given
    /// back: their references are dropped at `pool.complete(fence)`.
    /// Raises `WindowError` as `truncate` does (nothing changed).
    fn truncate_fenced(
        &self,
        py: Python<'_>,
        len: &Bound<'_, PyAny>,
        fence: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let len: usize = convert::uint(len, "len")?;
        let fence: u64 = convert::uint(fence, "fence")?;
        self.with(py, |seq| {
            let blocks = seq.held_blocks();
            detached(py, blocks, || seq.truncate_fenced(len, fence))
        })?
        .map_err(hybrid_error)
    }

    /// Gives the sequence up while device step `fence` may still read its
    /// blocks: every reference is dropped at `pool.complete(fence)`.
    /// Returns how many; the sequence is closed afterwards.
    fn retire(&self, py: Python<'_>, fence: &Bound<'_, PyAny>) -> PyResult<usize> {
        let fence: u64 = convert::uint(fence, "fence")?;
        let seq = self.take(py)?.ok_or_else(|| {
            PyValueError::new_err(
                "operation on a closed HybridSequence (after close() or retire())",
            )
        })?;
        let blocks = seq.held_blocks();
        Ok(detached(py, blocks, || seq.retire(fence)))
    }

    /// Hands every group's copy-on-write source, still kept, to `fence`;
    /// returns how many.
    fn retire_copy_source(&self, py: Python<'_>, fence: &Bound<'_, PyAny>) -> PyResult<usize> {
        let fence: u64 = convert::uint(fence, "fence")?;
        self.with(py, |seq| seq.retire_copy_source(fence))
    }

    /// Gives back every group's reserved blocks that hold no token; returns
    /// how many.
    fn shrink_to_fit(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |seq| {
            let blocks = seq.held_blocks();
            detached(py, blocks, || seq.shrink_to_fit())
        })
    }

    /// Forks a child: it shares every full block of every group (a sliding
    /// group's window; its `None` entries stay `None`) and gets a private
    /// block for each group's partly filled last one, all taken with one
    /// allocation. Returns `(child, copies)`, one `BlockCopy` a group when
    /// the length is not a whole number of blocks.
    ///
    /// Raises `Full`, `BehindWaiters`, `NeverFits` or `Closed`; nothing
    /// changes then.
    fn fork<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let forked = self.with(py, |seq| {
            let mut copies = Vec::new();
            let blocks = seq.held_blocks();
            // Moved in as `&mut` (a sequence is `Send`, not `Sync`).
            let out = &mut copies;
            detached(py, blocks, move || {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| seq.try_fork(out)))
            })
            .map(|r| r.map(|child| (child, copies)))
        })?;
        match forked {
            Ok(Ok((child, copies))) => {
                let child = Py::new(
                    py,
                    PyHybridSequence {
                        pool: self.pool.clone_ref(py),
                        groups: self.groups.clone(),
                        inner: SeqLock::new(Some(child)),
                    },
                )?;
                let copies = PyList::new(py, copies.into_iter().map(PyBlockCopy::from))?;
                PyTuple::new(py, [child.into_any(), copies.into_any().unbind()])
            }
            Ok(Err(e)) => Err(errors::reserve_error(py, e)),
            Err(_) => Err(PyRuntimeError::new_err(
                "fork failed: a block of this sequence lost its reference to a BlockPool.free \
                 (a double free), or has the most references a block can have; nothing was \
                 taken",
            )),
        }
    }

    /// Takes the longest prefix every group can serve from the cache into
    /// this new sequence (a full group needs every block, a sliding group
    /// only the window ending at the hit), one reference each; sets
    /// `len(seq)` to `k * block_size` and returns `k`. Into a sequence that
    /// holds only reserved blocks (length 0) the match takes their places:
    /// each reserved block can pay for a cached block revived, and every
    /// group keeps as many blocks as it reserved beyond the hit, so
    /// `capacity` does not shrink (unless another thread's match takes a
    /// block this one let go of while the pool is full: a caller that needs
    /// the whole reservation checks `capacity` and reserves the rest); the
    /// sequence stays admitted while it holds a block: its appends are
    /// growth, which does not wait behind queued waiters. A sequence that
    /// holds tokens matches nothing and returns 0. Raises `ValueError` for
    /// keys made for other groups (nothing changes then).
    fn match_prefix(&self, py: Python<'_>, keys: &Bound<'_, PyGroupKeys>) -> PyResult<usize> {
        let keys = self.keys_of(py, keys)?;
        let blocks = keys.blocks().saturating_mul(self.groups.len());
        self.with(py, |seq| {
            detached(py, blocks, || seq.try_match_prefix(&keys))
        })?
        .map_err(hybrid_error)
    }

    /// Caches every group's full blocks under `keys` and returns how many
    /// became cached (first publish wins). Raises `ValueError` for keys
    /// made for other groups.
    fn publish(&self, py: Python<'_>, keys: &Bound<'_, PyGroupKeys>) -> PyResult<usize> {
        let keys = self.keys_of(py, keys)?;
        let blocks = keys.blocks().saturating_mul(self.groups.len());
        self.with(py, |seq| detached(py, blocks, || seq.publish(&keys)))?
            .map_err(hybrid_error)
    }

    /// Group `group`'s flat slot of token `position`, or None at or past
    /// `len(seq)` or in a block its window gave back. Raises `IndexError`
    /// past the last group.
    fn slot(
        &self,
        py: Python<'_>,
        group: &Bound<'_, PyAny>,
        position: &Bound<'_, PyAny>,
    ) -> PyResult<Option<usize>> {
        let g = self.group(group)?;
        let position: usize = convert::uint(position, "position")?;
        self.with(py, |seq| seq.slot(g, position))
    }

    /// Group `group`'s slot mapping of positions `start..stop` (`stop`
    /// defaults to `len(seq)`). Raises `IndexError` past the last group,
    /// for a non-empty range that ends past the length, or for a position
    /// whose block the group's window gave back; an empty range
    /// (`start >= stop`) maps to `[]`.
    #[pyo3(signature = (group, start = None, stop = None))]
    fn slot_mapping<'py>(
        &self,
        py: Python<'py>,
        group: &Bound<'py, PyAny>,
        start: Option<&Bound<'py, PyAny>>,
        stop: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let g = self.group(group)?;
        let start: usize = start.map_or(Ok(0), |s| convert::uint(s, "start"))?;
        let stop: Option<usize> = stop.map(|s| convert::uint(s, "stop")).transpose()?;
        let block_size = self.pool_block_size();
        let mut out = Vec::new();
        self.with(py, |seq| {
            let positions = start..stop.unwrap_or(seq.len());
            // Room for a range the group holds (its first position's block
            // is held, so are the later ones: a window gives back leading
            // blocks only), taken here so that a range too long for memory
            // is a `MemoryError` (`extend_slots` grows `out` as `Vec` does,
            // which aborts); other ranges stay `extend_slots`' errors.
            let held = positions.end <= seq.len() && seq.slot(g, positions.start).is_some();
            if held && out.try_reserve_exact(positions.len()).is_err() {
                return Err(errors::out_of_memory("a slot mapping", positions.len()));
            }
            let blocks = positions.len() / block_size;
            // Moved in as `&mut` (a sequence is `Send`, not `Sync`).
            let out = &mut out;
            detached(py, blocks, move || seq.extend_slots(g, positions, out)).map_err(hybrid_error)
        })??;
        convert::int_list(py, out.iter().map(|&slot| slot as u64))
    }

    /// Gives every block back now. Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(seq) = self.take(py)? {
            let blocks = seq.held_blocks();
            detached(py, blocks, || drop(seq));
        }
        Ok(())
    }

    /// Returns the sequence; raises `ValueError` if it is closed, as a
    /// closed file does. Never waits: a sequence that another call holds
    /// now is entered as it is.
    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        if slf.get().inner.closed_now() {
            return Err(closed_hybrid());
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
                "HybridSequence(len={}, groups={}, held_blocks={})",
                seq.len(),
                self.groups.len(),
                seq.held_blocks()
            ),
            None => "HybridSequence(closed)".to_owned(),
        })
    }
}

/// The error of a call on a closed `HybridSequence`.
fn closed_hybrid() -> PyErr {
    PyValueError::new_err("operation on a closed HybridSequence (after close() or retire())")
}
