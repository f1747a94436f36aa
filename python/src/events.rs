//! `BlockPool.stats()`'s `PoolStats` and `BlockPool.drain_events()`'s
//! `KVEventBatch` with its events, shaped as vLLM's `kv_events` classes
//! (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`), plus
//! `EventsDropped`.

use kvslots::{BlockHash, BlockId, KvEvent, PoolStats};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

/// A snapshot of a `BlockPool`'s gauges and counters, for metrics.
///
/// Each field is read on its own while other threads may change the pool,
/// so the fields of one snapshot need not agree with each other (exact
/// when no call is running). `events_dropped` is `None` for a pool built
/// without `kv_events`.
#[pyclass(name = "PoolStats", module = "kvslots", frozen, eq)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyPoolStats {
    /// The pool's blocks.
    #[pyo3(get)]
    num_blocks: usize,
    /// Blocks in use.
    #[pyo3(get)]
    used_blocks: usize,
    /// The high-water mark of `used_blocks`.
    #[pyo3(get)]
    peak_used_blocks: usize,
    /// Free blocks, evictable ones included.
    #[pyo3(get)]
    free_blocks: usize,
    /// Blocks holding a prefix-cache key.
    #[pyo3(get)]
    cached_blocks: usize,
    /// Cached blocks that no one holds.
    #[pyo3(get)]
    evictable_blocks: usize,
    /// Blocks whose release waits for a fence.
    #[pyo3(get)]
    pending_release_blocks: usize,
    /// Keys queried by prefix matches.
    #[pyo3(get)]
    queried_blocks: u64,
    /// Blocks those matches hit.
    #[pyo3(get)]
    hit_blocks: u64,
    /// Cached blocks evicted.
    #[pyo3(get)]
    evictions: u64,
    /// Calls waiting in `alloc` / `Sequence.reserve`.
    #[pyo3(get)]
    waiters: usize,
    /// KV events lost to full rings, or `None` without `kv_events`.
    #[pyo3(get)]
    events_dropped: Option<u64>,
    /// `used_blocks / num_blocks` (0.0 for a pool of no blocks).
    #[pyo3(get)]
    usage: f64,
}

/// The field names, in order (`__match_args__` and `as_dict`).
const STATS_FIELDS: [&str; 12] = [
    "num_blocks",
    "used_blocks",
    "peak_used_blocks",
    "free_blocks",
    "cached_blocks",
    "evictable_blocks",
    "pending_release_blocks",
    "queried_blocks",
    "hit_blocks",
    "evictions",
    "waiters",
    "events_dropped",
];

impl From<PoolStats> for PyPoolStats {
    fn from(s: PoolStats) -> Self {
        PyPoolStats {
            num_blocks: s.num_blocks,
            used_blocks: s.used_blocks,
            peak_used_blocks: s.peak_used_blocks,
            free_blocks: s.free_blocks,
            cached_blocks: s.cached_blocks,
            evictable_blocks: s.evictable_blocks,
            pending_release_blocks: s.pending_release_blocks,
            queried_blocks: s.queried_blocks,
            hit_blocks: s.hit_blocks,
            evictions: s.evictions,
            waiters: s.waiters,
            events_dropped: s.events_dropped,
            usage: s.usage(),
        }
    }
}

#[pymethods]
impl PyPoolStats {
    #[classattr]
    fn __match_args__(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
        PyTuple::new(py, STATS_FIELDS)
    }

    /// The fields as a dict (`usage` included), for a metrics exporter.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("num_blocks", self.num_blocks)?;
        dict.set_item("used_blocks", self.used_blocks)?;
        dict.set_item("peak_used_blocks", self.peak_used_blocks)?;
        dict.set_item("free_blocks", self.free_blocks)?;
        dict.set_item("cached_blocks", self.cached_blocks)?;
        dict.set_item("evictable_blocks", self.evictable_blocks)?;
        dict.set_item("pending_release_blocks", self.pending_release_blocks)?;
        dict.set_item("queried_blocks", self.queried_blocks)?;
        dict.set_item("hit_blocks", self.hit_blocks)?;
        dict.set_item("evictions", self.evictions)?;
        dict.set_item("waiters", self.waiters)?;
        dict.set_item("events_dropped", self.events_dropped)?;
        dict.set_item("usage", self.usage)?;
        Ok(dict)
    }

    fn __repr__(&self) -> String {
        let dropped = self
            .events_dropped
            .map_or_else(|| "None".to_string(), |d| d.to_string());
        format!(
            "PoolStats(num_blocks={}, used_blocks={}, peak_used_blocks={}, free_blocks={}, \
             cached_blocks={}, evictable_blocks={}, pending_release_blocks={}, \
             queried_blocks={}, hit_blocks={}, evictions={}, waiters={}, events_dropped={})",
            self.num_blocks,
            self.used_blocks,
            self.peak_used_blocks,
            self.free_blocks,
            self.cached_blocks,
            self.evictable_blocks,
            self.pending_release_blocks,
            self.queried_blocks,
            self.hit_blocks,
            self.evictions,
            self.waiters,
            dropped
        )
    }
}

/// Blocks became cached: vLLM's `BlockStored`, with the pool's block ids
/// and token count.
///
/// `block_hashes` is a chain (each key's parent the key before it);
/// `parent_block_hash` is the first one's parent (`None` for a prompt's
/// first block). `token_ids` is not kept (the pool never sees tokens):
/// `token_count` is `len(block_hashes) * block_size`. `lora_id` and
/// `medium` are always `None` (LoRA adapters are folded into the keys by
/// `hash_blocks`' callers; the pool is one medium), kept for code written
/// against vLLM's class. `group_idx` is the index of the `HybridSequence`
/// group whose blocks these are (its `KvGroups`), `None` for a
/// `Sequence`'s.
#[pyclass(name = "BlockStored", module = "kvslots", frozen, eq)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyBlockStored {
    keys: Vec<BlockHash>,
    parent: Option<BlockHash>,
    ids: Vec<BlockId>,
    /// Tokens per block.
    #[pyo3(get)]
    block_size: usize,
    /// Tokens the stored blocks hold.
    #[pyo3(get)]
    token_count: usize,
    /// The group of layers (a `HybridSequence`'s group index), or `None`.
    #[pyo3(get)]
    group_idx: Option<usize>,
}

#[pymethods]
impl PyBlockStored {
    #[classattr]
    fn __match_args__() -> (&'static str, &'static str, &'static str, &'static str) {
        (
            "block_hashes",
            "parent_block_hash",
            "block_ids",
            "block_size",
        )
    }

    /// The blocks' keys (32 bytes each), in chain order.
    #[getter]
    fn block_hashes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        crate::convert::key_list(py, &self.keys)
    }

    /// The key of the block before the first one, or `None`.
    #[getter]
    fn parent_block_hash<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        self.parent
            .as_ref()
            .map(|p| crate::convert::key_bytes(py, p))
            .transpose()
    }

    /// The blocks now holding `block_hashes`, one per key.
    #[getter]
    fn block_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        crate::pool::id_list(py, &self.ids)
    }

    /// Always `None` (see the class doc).
    #[getter]
    fn lora_id(&self) -> Option<i64> {
        None
    }

    /// Always `None` (see the class doc).
    #[getter]
    fn medium(&self) -> Option<String> {
        None
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockStored(block_hashes=<{} keys>, parent_block_hash={}, block_ids={:?}, block_size={}, token_count={}, group_idx={})",
            self.keys.len(),
            if self.parent.is_some() { "<32 bytes>" } else { "None" },
            self.ids.iter().map(|id| id.index()).collect::<Vec<_>>(),
            self.block_size,
            self.token_count,
            group_repr(self.group_idx)
        )
    }
}

/// A group index as Python writes it.
fn group_repr(group: Option<usize>) -> String {
    group.map_or_else(|| "None".to_string(), |g| g.to_string())
}

/// Keys that no block holds any more: vLLM's `BlockRemoved`. `medium` is
/// always `None`; `group_idx` is the group of the publish that stored the
/// keys (as in `BlockStored`), `None` for a `Sequence`'s.
#[pyclass(name = "BlockRemoved", module = "kvslots", frozen, eq)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyBlockRemoved {
    keys: Vec<BlockHash>,
    /// The group of layers (a `HybridSequence`'s group index), or `None`.
    #[pyo3(get)]
    group_idx: Option<usize>,
}

#[pymethods]
impl PyBlockRemoved {
    #[classattr]
    fn __match_args__() -> (&'static str,) {
        ("block_hashes",)
    }

    /// The keys removed (32 bytes each).
    #[getter]
    fn block_hashes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        crate::convert::key_list(py, &self.keys)
    }

    /// Always `None`.
    #[getter]
    fn medium(&self) -> Option<String> {
        None
    }

    fn __repr__(&self) -> String {
        format!(
            "BlockRemoved(block_hashes=<{} keys>, group_idx={})",
            self.keys.len(),
            group_repr(self.group_idx)
        )
    }
}

/// No block holds a key: vLLM's `AllBlocksCleared`. The first event a pool
/// reports (its cache starts empty).
#[pyclass(name = "AllBlocksCleared", module = "kvslots", frozen, eq)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyAllBlocksCleared;

#[pymethods]
impl PyAllBlocksCleared {
    fn __repr__(&self) -> &'static str {
        "AllBlocksCleared()"
    }
}

/// Events were lost here because the pool's event rings were full (the
/// consumer drained too seldom): `count` blocks' stores and removals, one
/// each (a drain reports a publish's run of stored blocks as one
/// `BlockStored`). A router that must never believe a
/// key is cached when it is not treats this as `AllBlocksCleared`: the
/// events after it rebuild a view that may miss keys, never hold a removed
/// one.
#[pyclass(name = "EventsDropped", module = "kvslots", frozen, eq)]
#[derive(Clone, PartialEq)]
pub(crate) struct PyEventsDropped {
    /// How many blocks' stores and removals were lost (one each).
    #[pyo3(get)]
    count: u64,
}

#[pymethods]
impl PyEventsDropped {
    #[classattr]
    fn __match_args__() -> (&'static str,) {
        ("count",)
    }

    fn __repr__(&self) -> String {
        format!("EventsDropped(count={})", self.count)
    }
}

/// One batch of `BlockPool.drain_events()`: vLLM's `KVEventBatch`, with
/// its sequence number.
///
/// `seq` numbers the non-empty batches 0, 1, 2, ... in drain order; an
/// empty batch carries the number the next non-empty one will (so a gap
/// in the numbers a consumer forwards is a batch lost in transit). `ts` is
/// the drain's wall-clock time (`time.time()`).
#[pyclass(name = "KVEventBatch", module = "kvslots", frozen)]
pub(crate) struct PyKVEventBatch {
    /// The batch's sequence number.
    #[pyo3(get)]
    seq: u64,
    /// When it was drained, in seconds since the epoch.
    #[pyo3(get)]
    ts: f64,
    /// The events, oldest first (a new list on each read, as
    /// `BlockStored.block_hashes` is: the batch itself never changes).
    events: Py<PyTuple>,
}

#[pymethods]
impl PyKVEventBatch {
    #[classattr]
    fn __match_args__() -> (&'static str, &'static str, &'static str) {
        ("seq", "ts", "events")
    }

    /// The events, oldest first: a new list on each read.
    #[getter]
    fn events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.events.bind(py))
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.events.bind(py).len()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "KVEventBatch(seq={}, ts={}, events=<{} events>)",
            self.seq,
            self.ts,
            self.events.bind(py).len()
        )
    }
}

/// One core event as its Python object.
fn event_object<'py>(py: Python<'py>, event: KvEvent) -> PyResult<Bound<'py, PyAny>> {
    Ok(match event {
        KvEvent::BlockStored {
            keys,
            parent,
            block_ids,
            block_size,
            token_count,
            group,
        } => Bound::new(
            py,
            PyBlockStored {
                keys,
                parent,
                ids: block_ids,
                block_size,
                token_count,
                group_idx: group,
            },
        )?
        .into_any(),
        KvEvent::BlockRemoved { keys, group } => Bound::new(
            py,
            PyBlockRemoved {
                keys,
                group_idx: group,
            },
        )?
        .into_any(),
        KvEvent::AllBlocksCleared => Bound::new(py, PyAllBlocksCleared)?.into_any(),
        KvEvent::Dropped { count } => Bound::new(py, PyEventsDropped { count })?.into_any(),
        // A kind the core added after this binding (`#[non_exhaustive]`):
        // its debug form, so that nothing is silently left out.
        other => pyo3::types::PyString::new(py, &format!("{other:?}")).into_any(),
    })
}

/// A drained batch as a `KVEventBatch`.
pub(crate) fn batch<'py>(
    py: Python<'py>,
    seq: u64,
    ts: f64,
    events: Vec<KvEvent>,
) -> PyResult<Bound<'py, PyKVEventBatch>> {
    let objects = events
        .into_iter()
        .map(|event| event_object(py, event))
        .collect::<PyResult<Vec<_>>>()?;
    Bound::new(
        py,
        PyKVEventBatch {
            seq,
            ts,
            events: PyTuple::new(py, objects)?.unbind(),
        },
    )
}
