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
mod extras;
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
/// block 0's first, identical to Rust's `kvslots::hash_blocks` (and, with
/// extras, `kvslots::hash_blocks_with`).
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
/// Extras (keyword only; `bytes`, `bytearray` or `str`, taken as UTF-8)
/// enter the keys of the blocks they apply to: `lora` (an adapter's name)
/// and `cache_salt` (a request's salt) every block's; `multimodal`, tuples
/// `(hash, offset, length)` (an input's content hash, and the prompt
/// positions `offset..offset + length` of its placeholder tokens), and
/// `custom`, tuples `(tag, bytes, offset, length)`, the blocks that
/// overlap their positions. With `parent` and extras, `start` is the
/// prompt position of `tokens[0]` (a positive multiple of `block_size`).
///
/// Raises `ValueError` for `block_size == 0`, a token outside
/// `0..2**32`, a `parent` that is not 32 bytes, a `salt` with a `parent`,
/// a `start` without a `parent` (or, with extras, a `parent` without a
/// `start`), a `start` that is not a positive multiple of `block_size`,
/// an extra of no positions, or a tuple of the wrong length; `TypeError`
/// for tokens that are not ints, an extra that is not bytes or str, or an
/// item that is not a tuple; `OverflowError` for positions past
/// `2**64`.
#[pyfunction]
#[pyo3(
    signature = (
        tokens, block_size, salt = b"".as_slice(), parent = None, *,
        start = None, lora = None, cache_salt = None, multimodal = None, custom = None
    ),
    text_signature = "(tokens, block_size, salt=b'', parent=None, *, start=None, lora=None, \
                      cache_salt=None, multimodal=(), custom=())"
)]
#[allow(clippy::too_many_arguments)]
fn hash_blocks<'py>(
    py: Python<'py>,
    tokens: &Bound<'py, PyAny>,
    block_size: &Bound<'py, PyAny>,
    salt: &[u8],
    parent: Option<&Bound<'py, PyAny>>,
    start: Option<&Bound<'py, PyAny>>,
    lora: Option<&Bound<'py, PyAny>>,
    cache_salt: Option<&Bound<'py, PyAny>>,
    multimodal: Option<&Bound<'py, PyAny>>,
    custom: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyList>> {
    let extras = extras::extras(lora, cache_salt, multimodal, custom)?;
    let keys = block_keys(py, tokens, block_size, salt, parent, start, &extras)?;
    convert::key_list(py, &keys)
}

/// `hash_blocks`'s keys laid end to end in one `bytes` object (key `i` is
/// `packed[32 * i : 32 * i + 32]`), which `Sequence.match_prefix` and
/// `Sequence.publish` read in one copy: the cheaper form for a scheduler
/// that keeps a request's keys. Same arguments and errors as
/// `hash_blocks`.
#[pyfunction]
#[pyo3(
    signature = (
        tokens, block_size, salt = b"".as_slice(), parent = None, *,
        start = None, lora = None, cache_salt = None, multimodal = None, custom = None
    ),
    text_signature = "(tokens, block_size, salt=b'', parent=None, *, start=None, lora=None, \
                      cache_salt=None, multimodal=(), custom=())"
)]
#[allow(clippy::too_many_arguments)]
fn hash_blocks_packed<'py>(
    py: Python<'py>,
    tokens: &Bound<'py, PyAny>,
    block_size: &Bound<'py, PyAny>,
    salt: &[u8],
    parent: Option<&Bound<'py, PyAny>>,
    start: Option<&Bound<'py, PyAny>>,
    lora: Option<&Bound<'py, PyAny>>,
    cache_salt: Option<&Bound<'py, PyAny>>,
    multimodal: Option<&Bound<'py, PyAny>>,
    custom: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let extras = extras::extras(lora, cache_salt, multimodal, custom)?;
    let keys = block_keys(py, tokens, block_size, salt, parent, start, &extras)?;
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
    start: Option<&Bound<'py, PyAny>>,
    extras: &[extras::Extra],
) -> PyResult<Vec<kvslots::BlockHash>> {
    use pyo3::exceptions::PyValueError;
    let block_size: usize = convert::uint(block_size, "block_size")?;
    if block_size == 0 {
        return Err(PyValueError::new_err("block_size must be at least 1"));
    }
    let parent = parent.map(convert::key).transpose()?;
    if parent.is_some() && !salt.is_empty() {
        return Err(PyValueError::new_err(
            "pass a salt or a parent, not both: a parent's chain already holds its salt",
        ));
    }
    let start: Option<usize> = start.map(|s| convert::uint(s, "start")).transpose()?;
    match (parent, start) {
        (None, Some(_)) => {
            return Err(PyValueError::new_err(
                "start is the prompt position of tokens[0] after a parent: pass it with parent",
            ))
        }
        (Some(_), Some(start)) if start == 0 || start % block_size != 0 => {
            return Err(PyValueError::new_err(format!(
                "start must be a positive multiple of block_size ({block_size}), got {start}"
            )))
        }
        (Some(_), None) if !extras.is_empty() => {
            return Err(PyValueError::new_err(
                "with a parent and extras, pass start: the prompt position of tokens[0]",
            ))
        }
        _ => {}
    }
    let tokens = convert::tokens(tokens)?;
    let blocks = tokens.len() / block_size;
    let mut keys = convert::with_room(blocks, "block keys")?;
    let extras: Vec<kvslots::ExtraKey<'_>> = extras.iter().map(extras::Extra::key).collect();
    detached(py, blocks, || {
        match parent {
            None if extras.is_empty() => kvslots::hash_blocks(salt, &tokens, block_size, &mut keys),
            None => kvslots::hash_blocks_with(salt, &tokens, block_size, &extras, &mut keys)?,
            Some(parent) => {
                let mut key = parent;
                let mut at = start.unwrap_or(0);
                for block in tokens.chunks_exact(block_size) {
                    key = if extras.is_empty() {
                        key.next(block)
                    } else {
                        key.next_with(at, block, &extras)?
                    };
                    keys.push(key);
                    at = at.saturating_add(block_size);
                }
            }
        }
        Ok(keys)
    })
    .map_err(|e: kvslots::ExtraKeyError| PyValueError::new_err(e.to_string()))
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
