//! Python bindings for `kvslots` (PyO3): the extension module `kvslots`.
//!
//! A thin layer over the core crate: `BlockPool` wraps an
//! `Arc<kvslots::BlockPool>`, `Sequence` a `kvslots::Sequence` and
//! `HybridSequence` a `kvslots::HybridSequence` behind a mutex (the core's
//! sequences are single-owner values; `hybrid.rs` also has `KvGroups` and
//! `GroupKeys`; `events.rs` has the pool's statistics and KV events as
//! Python values), and every core
//! error becomes a Python exception of the same name and fields
//! (`errors.rs`); `batch.rs` has the calls over many sequences at once.
//! Arguments are checked before anything changes
//! (`convert.rs`), and nothing here can panic into Python: the one core
//! call that can panic on misuse, `try_append` on a tail that needs a
//! copy, is guarded by `append_needs_copy` (of either sequence); a fork
//! after a double free is refused before it starts.
//!
//! The GIL is released around every call that waits (`wait.rs`) and every
//! call whose work grows with a number of blocks at or above
//! `DETACH_BLOCKS` (32); below that, releasing and re-taking it costs more
//! than the work. The module declares `gil_used = false`: on a
//! free-threaded CPython it keeps the interpreter's parallelism, since
//! every object is safe to share between threads.
//!
//! The Python API is documented in `python/kvslots.pyi` and
//! `python/README.md`.

use pyo3::marker::Ungil;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

mod batch;
mod convert;
mod errors;
mod events;
mod hybrid;
mod lock;
mod pool;
mod sequence;
mod wait;

/// The number of blocks (or keys, or tokens / block size) at or above
/// which a call releases the GIL while it works.
pub(crate) const DETACH_BLOCKS: usize = 32;

/// Runs `f`, with the GIL released if `blocks` (the call's work, in
/// blocks) is at least [`DETACH_BLOCKS`].
pub(crate) fn detached<T, F>(py: Python<'_>, blocks: usize, f: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    if blocks >= DETACH_BLOCKS {
        py.detach(f)
    } else {
        f()
    }
}

/// The keys of the full blocks of `tokens`, cut into blocks of
/// `block_size` tokens: `len(tokens) // block_size` keys of 32 bytes each,
/// block 0's first, identical to Rust's `kvslots::hash_blocks`.
///
/// `tokens` is a list (or any iterable) of ints in `0..2**32`, `bytes` /
/// `bytearray` of little-endian `uint32`s (or a `memoryview` of one), or a
/// buffer of integers (a numpy array, `array.array`; one token an item,
/// one-byte items included). Key `i` depends on `salt`, `block_size`
/// and every token of blocks `0..=i`. With `parent` (the key of the block
/// before `tokens[0]`), the keys continue that chain instead (decode: key
/// the blocks a sequence fills); `salt` must then be empty, since the
/// chain already holds it.
///
/// Raises `ValueError` for `block_size == 0`, a token outside
/// `0..2**32`, a `parent` that is not 32 bytes, or a `salt` with a
/// `parent`; `TypeError` for tokens that are not ints.
#[pyfunction]
#[pyo3(
    signature = (tokens, block_size, salt = b"".as_slice(), parent = None),
    text_signature = "(tokens, block_size, salt=b'', parent=None)"
)]
fn hash_blocks<'py>(
    py: Python<'py>,
    tokens: &Bound<'py, PyAny>,
    block_size: &Bound<'py, PyAny>,
    salt: &[u8],
    parent: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    let keys = block_keys(py, tokens, block_size, salt, parent)?;
    convert::key_list(py, &keys)
}

/// `hash_blocks`'s keys laid end to end in one `bytes` object (key `i` is
/// `packed[32 * i : 32 * i + 32]`), which `Sequence.match_prefix` and
/// `Sequence.publish` read in one copy: the cheaper form for a scheduler
/// that keeps a request's keys. Same arguments and errors as
/// `hash_blocks`.
#[pyfunction]
#[pyo3(
    signature = (tokens, block_size, salt = b"".as_slice(), parent = None),
    text_signature = "(tokens, block_size, salt=b'', parent=None)"
)]
fn hash_blocks_packed<'py>(
    py: Python<'py>,
    tokens: &Bound<'py, PyAny>,
    block_size: &Bound<'py, PyAny>,
    salt: &[u8],
    parent: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let keys = block_keys(py, tokens, block_size, salt, parent)?;
    PyBytes::new_with(py, keys.len() * 32, |buf| {
        for (dst, key) in buf.chunks_exact_mut(32).zip(&keys) {
            dst.copy_from_slice(&key.0);
        }
        Ok(())
    })
}

/// The keys of `hash_blocks` and `hash_blocks_packed`.
fn block_keys<'py>(
    py: Python<'py>,
    tokens: &Bound<'py, PyAny>,
    block_size: &Bound<'py, PyAny>,
    salt: &[u8],
    parent: Option<&Bound<'py, PyAny>>,
) -> PyResult<Vec<kvslots::BlockHash>> {
    let block_size: usize = convert::uint(block_size, "block_size")?;
    if block_size == 0 {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "block_size must be at least 1",
        ));
    }
    let parent = parent.map(convert::key).transpose()?;
    if parent.is_some() && !salt.is_empty() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "pass a salt or a parent, not both: a parent's chain already holds its salt",
        ));
    }
    let tokens = convert::tokens(tokens)?;
    let blocks = tokens.len() / block_size;
    let mut keys = convert::with_room(blocks, "block keys")?;
    Ok(detached(py, blocks, || {
        match parent {
            None => kvslots::hash_blocks(salt, &tokens, block_size, &mut keys),
            Some(parent) => {
                let mut key = parent;
                for block in tokens.chunks_exact(block_size) {
                    key = key.next(block);
                    keys.push(key);
                }
            }
        }
        keys
    }))
}

/// Lock-free, all-or-nothing KV-cache block allocation with a prefix
/// cache, for LLM inference schedulers.
///
/// `BlockPool` hands out block ids all or nothing; `Sequence` is one
/// request's block table over a pool (appends, forks, rollback, the slot
/// mapping, prefix matching and publishing); `hash_blocks` computes the
/// prefix cache's block keys; `try_append_each` makes a decode step's
/// appends in one call; `BlockPool.stats()` is a `PoolStats` for
/// metrics, and a pool built with `kv_events` reports its cache's changes
/// as vLLM-shaped events (`BlockPool.drain_events()`). Every refusal raises (`ReserveError` and its
/// subclasses `Full` (and `BehindWaiters`), `NeverFits`, `Closed`,
/// `SequenceBusy`;
/// `FreeError`; `CopyRequired`)
/// and changes nothing. Every object may be shared between threads.
#[pymodule(gil_used = false)]
#[pyo3(name = "kvslots")]
fn kvslots_python(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    convert::import_helpers(py)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<pool::PyBlockPool>()?;
    m.add_class::<sequence::PySequence>()?;
    m.add_class::<sequence::PyBlockCopy>()?;
    m.add_class::<hybrid::PyKvGroups>()?;
    m.add_class::<hybrid::PyGroupKeys>()?;
    m.add_class::<hybrid::PyHybridSequence>()?;
    m.add_class::<events::PyPoolStats>()?;
    m.add_class::<events::PyKVEventBatch>()?;
    m.add_class::<events::PyBlockStored>()?;
    m.add_class::<events::PyBlockRemoved>()?;
    m.add_class::<events::PyAllBlocksCleared>()?;
    m.add_class::<events::PyEventsDropped>()?;
    m.add_function(wrap_pyfunction!(hash_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(hash_blocks_packed, m)?)?;
    m.add_function(wrap_pyfunction!(batch::try_append_each, m)?)?;
    m.add("ReserveError", py.get_type::<errors::ReserveError>())?;
    m.add("Full", py.get_type::<errors::Full>())?;
    m.add("BehindWaiters", py.get_type::<errors::BehindWaiters>())?;
    m.add("NeverFits", py.get_type::<errors::NeverFits>())?;
    m.add("Closed", py.get_type::<errors::Closed>())?;
    m.add("SequenceBusy", errors::sequence_busy_type(py)?)?;
    m.add("FreeError", py.get_type::<errors::FreeError>())?;
    m.add("CopyRequired", py.get_type::<errors::CopyRequired>())?;
    m.add("WindowError", py.get_type::<errors::WindowError>())?;
    m.add(
        "__all__",
        [
            "__version__",
            "BlockPool",
            "Sequence",
            "BlockCopy",
            "KvGroups",
            "GroupKeys",
            "HybridSequence",
            "PoolStats",
            "KVEventBatch",
            "BlockStored",
            "BlockRemoved",
            "AllBlocksCleared",
            "EventsDropped",
            "hash_blocks",
            "hash_blocks_packed",
            "try_append_each",
            "ReserveError",
            "Full",
            "BehindWaiters",
            "NeverFits",
            "Closed",
            "SequenceBusy",
            "FreeError",
            "CopyRequired",
            "WindowError",
        ],
    )?;
    Ok(())
}
