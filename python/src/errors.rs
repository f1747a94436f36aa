//! The Python exceptions, mirroring the core crate's errors, and the
//! conversions from those errors.
//!
//! The classes are plain exception classes (abi3 before Python 3.12 cannot
//! subclass `Exception` from Rust), and the fields of a Rust error are set
//! as attributes on the instance: `Full.requested`, `Full.available`,
//! `Full.headroom`, `BehindWaiters.owed`, `NeverFits.requested`,
//! `NeverFits.headroom`, `NeverFits.capacity`, `FreeError.id`,
//! `FreeError.kind`, `FreeError.num_blocks`, `WindowError.len` and
//! `WindowError.min_len`. Attributes live in the
//! instance's `__dict__`, so they survive pickling.

use pyo3::create_exception;
use pyo3::exceptions::{
    PyException, PyIndexError, PyMemoryError, PyRuntimeError, PyTimeoutError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

create_exception!(
    kvslots,
    ReserveError,
    PyException,
    "An allocation was refused; nothing changed. Subclasses: `Full` (and its \
     subclass `BehindWaiters`), `NeverFits`, `Closed`, `SequenceBusy`."
);
create_exception!(
    kvslots,
    Full,
    ReserveError,
    "Not enough free blocks right now; retrying later may succeed.\n\n\
     Attributes: `requested` (blocks asked for), `available` (blocks free \
     when the request was refused) and `headroom` (blocks the call asked to \
     stay free besides; 0 but for `reserve` and `try_reserve`)."
);
create_exception!(
    kvslots,
    BehindWaiters,
    Full,
    "The blocks are free, but callers queued in `alloc`/`reserve` are owed \
     them first: a new caller never passes a queued waiter. Retrying later (or \
     waiting with `alloc`/`reserve`) may succeed.\n\n\
     Attributes: `requested`, `available` (blocks free when refused), \
     `headroom` (as `Full`'s) and `owed` (blocks the queued waiters are owed, \
     their headroom included)."
);
create_exception!(
    kvslots,
    NeverFits,
    ReserveError,
    "The request (plus any headroom) is larger than all the caller could ever be \
     given: it can never be admitted, so reject it instead of retrying.\n\n\
     Attributes: `requested` (blocks asked for), `headroom` (blocks the call \
     asked to stay free besides; 0 but for `reserve` and `try_reserve`: the \
     refusal compared `requested + headroom` with the capacity) and \
     `capacity` (the pool's blocks; for a sequence's calls, the pool's blocks \
     less those the sequence holds)."
);
create_exception!(
    kvslots,
    Closed,
    ReserveError,
    "The pool was closed: it admits nothing more, while frees still work."
);
create_exception!(
    kvslots,
    FreeError,
    PyValueError,
    "`BlockPool.free` (or `BlockPool.add_refs`) refused.\n\n\
     Attributes: `id` (the offending id, as an int), `kind` (`\"out_of_range\"`, \
     `\"not_allocated\"`, `\"held_by_sequence\"`, `\"over_freed\"`, \
     `\"raced\"` or `\"too_many_refs\"`) and `num_blocks` (the pool's size, \
     for `\"out_of_range\"`; else None). Every kind but `\"raced\"` changed \
     nothing; `\"raced\"` (a double free caught racing another holder's free) \
     dropped every other listed reference."
);
create_exception!(
    kvslots,
    CopyRequired,
    PyRuntimeError,
    "`Sequence.try_append` (or `HybridSequence.try_append`) refused: the last \
     block is partly filled and shared (with a fork or a matched sequence) or \
     cached, so the append needs a copy-on-write. Use `append_cow` (of the same \
     class), which returns the copies to make. Nothing changed."
);

create_exception!(
    kvslots,
    WindowError,
    PyValueError,
    "`HybridSequence.truncate` (or `truncate_fenced`) refused: the window of \
     the token at the new length reaches blocks a sliding (or chunked) group gave back (their keys \
     and values are \
     gone). Nothing changed.\n\n\
     Attributes: `len` (the length asked for) and `min_len` (the shortest length \
     accepted besides 0)."
);

/// A `WindowError` for a truncate to `len` (`min_len` the shortest
/// accepted besides 0).
pub(crate) fn window_error(message: String, len: usize, min_len: usize) -> PyErr {
    Python::attach(|py| {
        with_attrs::<WindowError>(py, message, &[("len", len), ("min_len", min_len)])
            .unwrap_or_else(|e| e)
    })
}

/// `MemoryError` for a result of `len` items that could not be allocated
/// (`what` names it), as a Python list's growth raises it.
pub(crate) fn out_of_memory(what: &str, len: usize) -> PyErr {
    PyMemoryError::new_err(format!("{what} of {len} items does not fit in memory"))
}

/// The Python exception for a configuration `BlockPool(...)` refused:
/// `MemoryError` when the pool's arrays could not be allocated,
/// `ValueError` for every bad size, with the core's message.
pub(crate) fn config_error(err: kvslots::ConfigError) -> PyErr {
    match err {
        kvslots::ConfigError::OutOfMemory { .. } => PyMemoryError::new_err(err.to_string()),
        _ => PyValueError::new_err(err.to_string()),
    }
}

/// The Python exception for a refused allocation (counts in blocks) of a
/// call that asked for no headroom.
pub(crate) fn reserve_error(py: Python<'_>, err: kvslots::ReserveError) -> PyErr {
    reserve_error_with_headroom(py, err, 0)
}

/// The Python exception for a refused allocation (counts in blocks) of a
/// call that asked for `headroom` blocks to stay free besides: the core's
/// `requested` leaves the headroom out, so the exception carries it as
/// its own attribute, and its message names it when it is not 0.
pub(crate) fn reserve_error_with_headroom(
    py: Python<'_>,
    err: kvslots::ReserveError,
    headroom: usize,
) -> PyErr {
    // The core's message, or one that names the headroom.
    let message = |with_headroom: &dyn Fn() -> String| {
        if headroom == 0 {
            err.to_string()
        } else {
            with_headroom()
        }
    };
    let built = match err {
        kvslots::ReserveError::Full {
            requested,
            available,
        } => with_attrs::<Full>(
            py,
            message(&|| {
                format!(
                    "requested {requested} with a headroom of {headroom} but only \
                     {available} available"
                )
            }),
            &[
                ("requested", requested),
                ("available", available),
                ("headroom", headroom),
            ],
        ),
        kvslots::ReserveError::BehindWaiters {
            requested,
            available,
            owed,
        } => with_attrs::<BehindWaiters>(
            py,
            message(&|| {
                format!(
                    "requested {requested} with a headroom of {headroom}; {available} \
                     available, but {owed} are owed to queued waiters"
                )
            }),
            &[
                ("requested", requested),
                ("available", available),
                ("headroom", headroom),
                ("owed", owed),
            ],
        ),
        kvslots::ReserveError::NeverFits {
            requested,
            capacity,
        } => with_attrs::<NeverFits>(
            py,
            message(&|| {
                format!(
                    "requested {requested} with a headroom of {headroom} can never fit \
                     in a capacity of {capacity}"
                )
            }),
            &[
                ("requested", requested),
                ("headroom", headroom),
                ("capacity", capacity),
            ],
        ),
        kvslots::ReserveError::Closed => Ok(Closed::new_err(err.to_string())),
        // A kind the core added after this binding (the enum is
        // `#[non_exhaustive]`): the base exception, with the core's message.
        _ => Ok(ReserveError::new_err(err.to_string())),
    };
    built.unwrap_or_else(|e| e)
}

/// An exception of type `E` with `message` and integer attributes.
fn with_attrs<E: pyo3::PyTypeInfo>(
    py: Python<'_>,
    message: String,
    attrs: &[(&str, usize)],
) -> PyResult<PyErr> {
    // Built as an instance, not as a lazy error read back with `value`:
    // reading a lazy error detaches and re-attaches, which panics during
    // the interpreter's finalization (a refusal in a finalizer at exit).
    // Raised as a lazy error whose value is the instance, so that restoring
    // it calls `PyErr_SetObject`, which chains it to the exception being
    // handled (`__context__`).
    let value = py.get_type::<E>().call1((message,))?;
    for &(name, v) in attrs {
        value.setattr(name, v)?;
    }
    Ok(PyErr::from_type(value.get_type(), value.unbind()))
}

/// What a `FreeError` says about its id.
pub(crate) enum FreeKind {
    OutOfRange { num_blocks: usize },
    NotAllocated,
    HeldBySequence,
    OverFreed,
    Raced,
    TooManyRefs,
}

/// A `FreeError` naming `id` (an int: the one the caller's item stands
/// for, or a block index).
pub(crate) fn free_error<'py>(py: Python<'py>, id: Bound<'py, PyAny>, kind: FreeKind) -> PyErr {
    let (name, message, num_blocks) = match kind {
        FreeKind::OutOfRange { num_blocks } => (
            "out_of_range",
            format!("block {id} is out of range for a pool of {num_blocks} blocks"),
            Some(num_blocks),
        ),
        FreeKind::NotAllocated => (
            "not_allocated",
            format!("block {id} is not allocated (never allocated, or a double free)"),
            None,
        ),
        FreeKind::HeldBySequence => (
            "held_by_sequence",
            format!("block {id} is held by a sequence, which gives it back itself (a double free)"),
            None,
        ),
        FreeKind::OverFreed => (
            "over_freed",
            format!("block {id} is listed more times than it has references"),
            None,
        ),
        FreeKind::TooManyRefs => (
            "too_many_refs",
            format!("block {id} has the most references a block can have"),
            None,
        ),
        FreeKind::Raced => (
            "raced",
            format!(
                "block {id} was freed by another thread during this call (a racing \
                 double free): a free dropped the other listed references, an \
                 add_refs changed nothing"
            ),
            None,
        ),
    };
    // An instance, as in `with_attrs`.
    let built = py
        .get_type::<FreeError>()
        .call1((message,))
        .and_then(|value| {
            value.setattr("id", id)?;
            value.setattr("kind", name)?;
            value.setattr("num_blocks", num_blocks)?;
            Ok(PyErr::from_type(value.get_type(), value.unbind()))
        });
    built.unwrap_or_else(|e| e)
}

/// The Python exception for a core `FreeError`.
pub(crate) fn from_free_error(py: Python<'_>, err: kvslots::FreeError) -> PyErr {
    let (id, kind) = match err {
        kvslots::FreeError::OutOfRange { id, num_blocks } => {
            (id, FreeKind::OutOfRange { num_blocks })
        }
        kvslots::FreeError::NotAllocated { id } => (id, FreeKind::NotAllocated),
        kvslots::FreeError::HeldBySequence { id } => (id, FreeKind::HeldBySequence),
        kvslots::FreeError::OverFreed { id } => (id, FreeKind::OverFreed),
        kvslots::FreeError::Raced { id } => (id, FreeKind::Raced),
        kvslots::FreeError::TooManyRefs { id } => (id, FreeKind::TooManyRefs),
        // A kind the core added after this binding (the enum is
        // `#[non_exhaustive]`): the exception, with the core's message.
        _ => return FreeError::new_err(err.to_string()),
    };
    let Ok(id) = id.index().into_pyobject(py);
    free_error(py, id.into_any(), kind)
}

/// A position at or past a sequence's length.
pub(crate) fn position_error(err: kvslots::PositionError) -> PyErr {
    PyIndexError::new_err(err.to_string())
}

/// An operation on a sequence after `close()` or `retire()`.
pub(crate) fn closed_sequence() -> PyErr {
    PyValueError::new_err("operation on a closed Sequence (after close() or retire())")
}

/// The docstring of `SequenceBusy`.
const SEQUENCE_BUSY_DOC: &str = "`Sequence.reserve` (or `HybridSequence.reserve`) refused: its \
     `timeout` ran out while another thread's call held the sequence, before \
     the reservation could start. Nothing changed; retrying later may succeed.\n\n\
     A `ReserveError`, so that `except kvslots.ReserveError` catches every \
     refusal of a reservation, and a `TimeoutError`, as a lock's timed \
     acquire reports running out of time.";

/// The class `SequenceBusy(ReserveError, TimeoutError)`, made once. Two
/// bases, which `create_exception!` cannot give, so the class is made as
/// a Python class statement makes it (`type(name, bases, namespace)`).
pub(crate) fn sequence_busy_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    TYPE.get_or_try_init(py, || {
        let bases = PyTuple::new(
            py,
            [
                py.get_type::<ReserveError>(),
                py.get_type::<PyTimeoutError>(),
            ],
        )?;
        let namespace = PyDict::new(py);
        namespace.set_item("__module__", "kvslots")?;
        namespace.set_item("__doc__", SEQUENCE_BUSY_DOC)?;
        let class = py
            .get_type::<PyType>()
            .call1(("SequenceBusy", bases, namespace))?;
        Ok(class.cast_into::<PyType>()?.unbind())
    })
    .map(|class| class.bind(py))
}

/// The error of a `reserve` whose timeout ran out while another thread's
/// call held the sequence (of type `kind`): `SequenceBusy`; nothing
/// changed.
pub(crate) fn busy_sequence(py: Python<'_>, kind: &str) -> PyErr {
    let message = format!(
        "the timeout ran out while another thread's call held this {kind}; nothing changed"
    );
    match sequence_busy_type(py) {
        Ok(class) => PyErr::from_type(class.clone(), message),
        Err(err) => err,
    }
}
