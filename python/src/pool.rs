//! `kvslots.BlockPool`: the core crate's `BlockPool`, shared by `Arc`.

use std::sync::Arc;

use kvslots::BlockId;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::convert;
use crate::detached;
use crate::errors::{self, FreeKind};
use crate::events::{self, PyKVEventBatch, PyPoolStats};
use crate::hybrid::{self, PyGroupKeys};
use crate::wait;

/// A lock-free pool of `num_blocks` KV-cache blocks of `block_size` token
/// slots each, with a prefix cache (and, with `kv_events`, a record of the
/// cache's changes for a KV-aware router: `drain_events`).
///
/// `try_alloc(n)` takes exactly `n` distinct block ids or none, `free(ids)`
/// drops one reference per listed id, all or nothing; every refusal raises
/// and changes nothing. Cached blocks (see `Sequence.publish`) that no one
/// holds count as free and are evicted least recently released first.
///
/// `shards` cuts the free list into that many shards (default: one per 64
/// blocks, at most 16); any thread can take every block whatever the
/// shards. `kv_events` (records in all, 128 bytes each, shared among the
/// shards' rings: `kv_events / shards` each, rounded up, at least 2)
/// turns KV events on. `prefix_cache=False` builds the core pool alone (8 bytes and two bits
/// a block instead of 78): `Sequence.publish` and `match_prefix` then
/// return 0 and change nothing. Raises `ValueError` for `block_size == 0`, `num_blocks`
/// above `BlockPool.MAX_BLOCKS`, a `num_blocks * block_size` too large,
/// `shards` outside `1..=BlockPool.MAX_SHARDS`, `kv_events == 0`, or
/// `kv_events` without the prefix cache (and for any size of `2**64` or
/// more), and
/// `MemoryError` when the pool's bookkeeping (78 bytes a block, 80 with
/// `kv_events`, and the event rings) cannot be allocated; nothing is left
/// allocated then.
///
/// Safe to share between threads: no call takes a lock while no thread
/// waits in the pool, apart from the fence table's calls and
/// `drain_events` (waiting calls, and a give-back that finds waiters
/// queued, take the wait queue's); calls that wait or walk many blocks
/// release the GIL.
#[pyclass(name = "BlockPool", module = "kvslots", frozen, weakref)]
pub(crate) struct PyBlockPool {
    pub(crate) inner: Arc<kvslots::BlockPool>,
}

impl PyBlockPool {
    /// Raises `FreeError` (out of range) for the first of `ids` that is
    /// not a block of this pool, in list order, as the core's `free` does.
    fn ids_in_range<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<BlockId>> {
        let num_blocks = self.inner.num_blocks();
        // `bytes` (and a memoryview of them) iterate as ints: a list of
        // ids in one is almost surely a key or a token buffer passed by
        // mistake.
        if convert::is_byte_string(ids)? || ids.cast::<pyo3::types::PyString>().is_ok() {
            let ty = ids.get_type().name()?;
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "block ids must be an iterable of ints, not {ty}"
            )));
        }
        if let Some(out) = convert::many_ids(py, ids, num_blocks)? {
            return Ok(out);
        }
        let mut out = Vec::new();
        convert::for_each(ids, |item| {
            match convert::block_id(&item)? {
                Some(id) if id.index() < num_blocks => out.push(id),
                _ => {
                    // `id` is an int for every kind: the int the item
                    // stands for (`block_id` read it as one).
                    let id = convert::index(&item).unwrap_or(item);
                    return Err(errors::free_error(
                        py,
                        id,
                        FreeKind::OutOfRange { num_blocks },
                    ));
                }
            }
            Ok(())
        })?;
        Ok(out)
    }
}

/// Block ids as a Python list (a `MemoryError` if it does not fit, see
/// [`convert::int_list`]).
pub(crate) fn id_list<'py>(py: Python<'py>, ids: &[BlockId]) -> PyResult<Bound<'py, PyList>> {
    convert::int_list(py, ids.iter().map(|id| id.index() as u64))
}

/// The list of `ids`, which this call has just allocated from `pool`: if
/// the list cannot be built (`MemoryError`), they go back before the error
/// is raised, so that the refused call holds nothing.
fn allocated_list<'py>(
    py: Python<'py>,
    pool: &kvslots::BlockPool,
    ids: &[BlockId],
) -> PyResult<Bound<'py, PyList>> {
    id_list(py, ids).inspect_err(|_| {
        // Blocks this call holds alone: the free cannot be refused.
        let _ = pool.free(ids);
    })
}

#[pymethods]
impl PyBlockPool {
    /// The largest number of blocks a pool can have.
    #[classattr]
    const MAX_BLOCKS: usize = kvslots::BlockPool::MAX_BLOCKS;

    /// The most free-list shards a pool can have.
    #[classattr]
    const MAX_SHARDS: usize = kvslots::BlockPool::MAX_SHARDS;

    #[new]
    #[pyo3(signature = (num_blocks, block_size, shards = None, kv_events = None, prefix_cache = true))]
    fn new(
        py: Python<'_>,
        num_blocks: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        shards: Option<&Bound<'_, PyAny>>,
        kv_events: Option<&Bound<'_, PyAny>>,
        prefix_cache: bool,
    ) -> PyResult<Self> {
        // A size past `2**64` is a bad size, as one past the limits below
        // it: `ValueError`, not the conversion's `OverflowError`.
        let size = |obj: &Bound<'_, PyAny>, what: &str| -> PyResult<usize> {
            convert::uint(obj, what).map_err(|e| {
                if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
                    pyo3::exceptions::PyValueError::new_err(e.value(py).to_string())
                } else {
                    e
                }
            })
        };
        let num_blocks = size(num_blocks, "num_blocks")?;
        let block_size = size(block_size, "block_size")?;
        let mut builder =
            kvslots::BlockPool::builder(num_blocks, block_size).prefix_cache(prefix_cache);
        if let Some(s) = shards {
            builder = builder.shards(size(s, "shards")?);
        }
        if let Some(capacity) = kv_events {
            builder = builder.kv_events(size(capacity, "kv_events")?);
        }
        // The builder checks the sizes before it asks for any memory, and
        // asks for all of it fallibly: bad sizes and a pool too large for
        // memory are exceptions, never an abort. Filling the arrays takes
        // time in proportion to the pool: without the GIL.
        let pool = detached(py, num_blocks, || builder.build()).map_err(errors::config_error)?;
        Ok(PyBlockPool {
            inner: Arc::new(pool),
        })
    }

    /// The total number of blocks.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }

    /// Token slots per block.
    #[getter]
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    /// How many shards the free list is cut into.
    #[getter]
    fn shards(&self) -> usize {
        self.inner.shards()
    }

    /// Free blocks now (uncached free blocks and evictable cached ones): a
    /// snapshot, exact when no call is running.
    #[getter]
    fn free_blocks(&self) -> usize {
        self.inner.free_blocks()
    }

    /// Blocks in use now (`num_blocks - free_blocks`).
    #[getter]
    fn used_blocks(&self) -> usize {
        self.inner.used_blocks()
    }

    /// The high-water mark of `used_blocks` (exact with one thread, an
    /// estimate with several).
    #[getter]
    fn peak_used_blocks(&self) -> usize {
        self.inner.peak_used_blocks()
    }

    /// Blocks holding a prefix-cache key, referenced or not (a scan of
    /// every block: O(num_blocks), GIL released for large pools).
    #[getter]
    fn cached_blocks(&self, py: Python<'_>) -> usize {
        let pool = &*self.inner;
        detached(py, pool.num_blocks(), || pool.cached_blocks())
    }

    /// Cached blocks that no one holds: evictable, and counted as free (a
    /// scan of every block, as `cached_blocks`).
    #[getter]
    fn evictable_blocks(&self, py: Python<'_>) -> usize {
        let pool = &*self.inner;
        detached(py, pool.num_blocks(), || pool.evictable_blocks())
    }

    /// Block references retired under fences not completed yet (see
    /// `Sequence.retire`): in use until `complete(fence)`.
    #[getter]
    fn pending_release_blocks(&self) -> usize {
        self.inner.pending_release_blocks()
    }

    /// The high-water mark of `pending_release_blocks`.
    #[getter]
    fn peak_pending_release_blocks(&self) -> usize {
        self.inner.peak_pending_release_blocks()
    }

    /// Calls waiting in the pool's queue (`alloc`, `reserve`) now; a
    /// `reserve` waiting for another thread's call on its sequence is not
    /// in the queue yet.
    #[getter]
    fn waiters(&self) -> usize {
        self.inner.waiters()
    }

    /// Whether `close()` has been called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Whether the pool has a prefix cache (built without
    /// `prefix_cache=False`).
    #[getter]
    fn has_prefix_cache(&self) -> bool {
        self.inner.has_prefix_cache()
    }

    /// Whether the pool records KV events (built with `kv_events`).
    #[getter]
    fn has_kv_events(&self) -> bool {
        self.inner.has_kv_events()
    }

    /// The pool's gauges and counters in one `PoolStats` snapshot, for
    /// metrics: usage, peak, free, cached, evictable, pending release,
    /// queried and hit blocks, evictions, waiters and (with `kv_events`)
    /// events dropped. A scan of every block (`O(num_blocks)`, GIL released
    /// for large pools): call it every second or so, not per step.
    fn stats(&self, py: Python<'_>) -> PyPoolStats {
        let pool = &*self.inner;
        detached(py, pool.num_blocks(), || pool.stats()).into()
    }

    /// The KV events recorded since the last call, as a `KVEventBatch`
    /// whose `events` are `BlockStored`, `BlockRemoved`, `AllBlocksCleared`
    /// (the first batch's first event) and `EventsDropped` objects, oldest
    /// first (a pool without `kv_events` returns an empty batch numbered 0).
    ///
    /// Per key, the events come in the order of the key's changes (its
    /// store before its removal, its removal from one block before its
    /// store on another), nothing is reported twice, and events lost
    /// because the rings were full are reported as an `EventsDropped` in
    /// their place. Across keys there is no order, except that a block's
    /// store comes after its parent's when both are in the batch (unless a
    /// removal of the parent's key, or lost events, come before the
    /// parent's store). Calls
    /// take turns with each other (the pool's publishes and evictions
    /// never wait for them); the GIL is released while the rings are read.
    fn drain_events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyKVEventBatch>> {
        let pool = &*self.inner;
        let (seq, ts, drained) = py.detach(|| {
            let mut drained = Vec::new();
            let seq = pool.drain_events(&mut drained);
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            (seq, ts, drained)
        });
        events::batch(py, seq, ts, drained)
    }

    /// Takes exactly `n` free blocks, all or none, and returns their
    /// distinct ids (each with one reference; give them back with `free`).
    ///
    /// Raises `Full` (fewer than `n` free), `NeverFits` (`n > num_blocks`)
    /// or `Closed`; nothing is taken then. `n == 0` returns `[]`.
    fn try_alloc<'py>(
        &self,
        py: Python<'py>,
        n: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let n: usize = convert::uint(n, "n")?;
        let pool = &*self.inner;
        let mut ids = Vec::new();
        detached(py, n, || pool.try_alloc(n, &mut ids))
            .map_err(|e| errors::reserve_error(py, e))?;
        allocated_list(py, pool, &ids)
    }

    /// Takes exactly `n` blocks, all or none, waiting in arrival order
    /// (with the GIL released) until they are free, for at most `timeout`
    /// seconds (`None`: no limit). Returns their ids.
    ///
    /// Raises `NeverFits` at once, `Closed` (also when the pool is closed
    /// while waiting), or `Full` when the timeout runs out; a signal
    /// handler's exception (Ctrl-C: `KeyboardInterrupt`) ends the wait.
    /// Nothing is taken when it raises.
    #[pyo3(signature = (n, timeout = None))]
    fn alloc<'py>(
        &self,
        py: Python<'py>,
        n: &Bound<'py, PyAny>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let n: usize = convert::uint(n, "n")?;
        let deadline = wait::deadline(convert::timeout(timeout)?);
        let pool = &*self.inner;
        let mut ids = Vec::new();
        // The deadline passed: one last try, whose refusal is the `Full` to
        // report.
        match wait::block_on(py, pool.alloc(n, &mut ids), deadline)? {
            Some(done) => done,
            None => pool.try_alloc(n, &mut ids),
        }
        .map_err(|e| errors::reserve_error(py, e))?;
        allocated_list(py, pool, &ids)
    }

    /// Drops one reference per listed id (a block listed twice loses two),
    /// all or nothing: a block whose last reference goes is free again (or,
    /// if cached, evictable).
    ///
    /// Raises `FreeError` (changing nothing) for an id that is not a block
    /// of this pool (`kind == "out_of_range"`; negative ids included), a
    /// free block (`"not_allocated"`: a double free), a block that
    /// sequences hold (`"held_by_sequence"`: they give it back themselves)
    /// or a block listed more times than it has references
    /// (`"over_freed"`). The one exception,
    /// `"raced"`, is a double free caught racing another holder's free:
    /// every other listed reference was dropped. `TypeError` for an id that
    /// is not an int, or ids given as `bytes`, `bytearray`, a `memoryview`
    /// of either, or `str`.
    fn free<'py>(&self, py: Python<'py>, ids: &Bound<'py, PyAny>) -> PyResult<()> {
        let ids = self.ids_in_range(py, ids)?;
        let pool = &*self.inner;
        detached(py, ids.len(), || pool.free(&ids)).map_err(|e| errors::from_free_error(py, e))
    }

    /// Adds one reference per listed id (a block listed twice gets two),
    /// to share raw blocks between holders, each of which gives its
    /// reference back with `free`. All or nothing.
    ///
    /// Raises `FreeError` (changing nothing) for an id that is not a block
    /// of this pool (`kind == "out_of_range"`; negative ids included), a
    /// free block (`"not_allocated"`), a block that sequences hold
    /// (`"held_by_sequence"`: a sequence shares its blocks with `fork`), a
    /// block another thread freed during the call (`"raced"`) or one at
    /// the most references a block can have (`"too_many_refs"`): in the
    /// last two cases the references this call added are dropped again.
    /// `TypeError` for an id that is not an int, or ids given as `bytes`,
    /// `bytearray`, a `memoryview` of either, or `str`.
    fn add_refs<'py>(&self, py: Python<'py>, ids: &Bound<'py, PyAny>) -> PyResult<()> {
        let ids = self.ids_in_range(py, ids)?;
        let pool = &*self.inner;
        detached(py, ids.len(), || pool.add_refs(&ids)).map_err(|e| errors::from_free_error(py, e))
    }

    /// The number of references block `id` has now (0 when free), or
    /// `None` if `id` is not a block of this pool (negative ids included).
    fn ref_count(&self, id: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        Ok(convert::block_id(id)?.and_then(|id| self.inner.ref_count(id)))
    }

    /// Closes the pool: every later allocation raises `Closed` and waiting
    /// ones are woken with it, while frees (and sequences giving blocks
    /// back) keep working so that workers can drain.
    fn close(&self) {
        self.inner.close();
    }

    /// Declares device step `fence` done: gives back every reference
    /// retired under it (`Sequence.retire`, `Sequence.truncate_fenced`) and
    /// returns how many. Fences complete in any order; an unknown fence
    /// returns 0.
    fn complete(&self, py: Python<'_>, fence: &Bound<'_, PyAny>) -> PyResult<usize> {
        let fence: u64 = convert::uint(fence, "fence")?;
        let pool = &*self.inner;
        Ok(detached(py, pool.pending_release_blocks(), || {
            pool.complete(fence)
        }))
    }

    /// Declares every fence done and returns how many references that gave
    /// back.
    fn complete_all(&self, py: Python<'_>) -> usize {
        let pool = &*self.inner;
        detached(py, pool.pending_release_blocks(), || pool.complete_all())
    }

    /// Drops the key of every evictable cached block (they become plain
    /// free blocks) and returns how many; blocks that someone holds keep
    /// theirs. A scan of every block, GIL released for large pools.
    fn reset_prefix_cache(&self, py: Python<'_>) -> usize {
        let pool = &*self.inner;
        detached(py, pool.num_blocks(), || pool.reset_prefix_cache())
    }

    /// How many blocks of the longest cached prefix of `keys` (from
    /// `hash_blocks` with the pool's block size) a `Sequence.match_prefix`
    /// would take, found without taking any: the tokens a prompt would not
    /// prefill are this times `block_size`. Takes no reference, admits
    /// nothing, leaves the eviction order and `prefix_stats` as they were:
    /// for ranking or budgeting waiting requests by their cached prefix.
    /// The answer can be out of date by the time it returns (a block it
    /// counted may be evicted before a match). A pool without a prefix
    /// cache peeks 0. Raises as `Sequence.match_prefix` does, before
    /// peeking: `TypeError` for keys that are no list of `bytes` (a set
    /// included) or packed `bytes`, `ValueError` for a key that is not 32
    /// bytes.
    fn peek_prefix(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        let pool = &*self.inner;
        if let Ok(packed) = keys.cast::<PyBytes>() {
            // Copied a growing prefix at a time: a peek that stops early
            // copies little more than it counts.
            return convert::peek_packed(packed.as_bytes(), |keys| {
                detached(py, keys.len(), || pool.peek_prefix(keys))
            });
        }
        let keys = convert::keys(keys)?;
        Ok(detached(py, keys.len(), || pool.peek_prefix(&keys)))
    }

    /// `peek_prefix` for a hybrid model: how many blocks of tokens a
    /// `HybridSequence.match_prefix` with these `keys` would match (every
    /// full group's prefix cached, each sliding group's window ending
    /// there), found without taking any block.
    fn peek_hybrid_prefix(&self, py: Python<'_>, keys: &Bound<'_, PyGroupKeys>) -> usize {
        hybrid::peek(py, &self.inner, keys.get())
    }

    /// The prefix cache's statistics so far: `queried_blocks` (keys passed
    /// to `Sequence.match_prefix` on empty sequences), `hit_blocks` (blocks
    /// those matched) and `evictions` (cached blocks reused by an
    /// allocation).
    fn prefix_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.inner.prefix_stats();
        let dict = PyDict::new(py);
        dict.set_item("queried_blocks", stats.queried_blocks)?;
        dict.set_item("hit_blocks", stats.hit_blocks)?;
        dict.set_item("evictions", stats.evictions)?;
        Ok(dict)
    }

    fn __repr__(&self) -> String {
        let pool = &self.inner;
        format!(
            "BlockPool(num_blocks={}, block_size={}, free_blocks={}, closed={})",
            pool.num_blocks(),
            pool.block_size(),
            pool.free_blocks(),
            if pool.is_closed() { "True" } else { "False" }
        )
    }
}
