//! Arguments from Python: every bad value becomes a Python exception
//! before anything changes (`TypeError` for a value of the wrong type,
//! `ValueError` for a negative count or a malformed key, `OverflowError`
//! for an integer too large for 64 bits), never a panic.

use std::time::Duration;

use kvslots::{BlockHash, BlockId};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyByteArray, PyBytes, PyFrozenSet, PyList, PyMemoryView, PySet, PyTuple, PyType,
};

/// An optional argument whose default is not `None` (`headroom=0`,
/// `n=1`): left out it is `Default`; passed, `None` included, it is
/// `Given` and converted as any other value (so `None` is refused as no
/// int), which an `Option` argument could not tell from leaving it out.
pub(crate) enum Arg<'py> {
    /// Left out.
    Default,
    /// Passed.
    Given(Bound<'py, PyAny>),
}

impl<'py> Arg<'py> {
    /// The value passed, if any.
    pub(crate) fn given(&self) -> Option<&Bound<'py, PyAny>> {
        match self {
            Arg::Default => None,
            Arg::Given(obj) => Some(obj),
        }
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for Arg<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Arg::Given(obj.to_owned()))
    }
}

/// A non-negative integer argument (a count, a length, a position, a
/// fence): any int or object with `__index__` (numpy integers included),
/// but not a float.
pub(crate) fn uint<T: TryFrom<u64>>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<T> {
    match obj.extract::<u64>() {
        Ok(v) => T::try_from(v).map_err(|_| too_large(what, v)),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
            // The int the object stands for, compared as an int: an object
            // with `__index__` need not support `<` itself.
            let value = index(obj)?;
            if value.lt(0)? {
                Err(PyValueError::new_err(format!(
                    "{what} must be >= 0, got {value}"
                )))
            } else {
                Err(too_large(what, value))
            }
        }
        Err(e) => Err(not_an_int(e, what, obj)),
    }
}

/// A sequence's token count as `len()` returns it: an `OverflowError`
/// that says so past `sys.maxsize` (a pool of huge blocks, or a sliding
/// window's tokens), where CPython's own has no message.
pub(crate) fn py_len(tokens: usize) -> PyResult<usize> {
    if isize::try_from(tokens).is_ok() {
        Ok(tokens)
    } else {
        Err(PyOverflowError::new_err(format!(
            "the sequence holds {tokens} tokens, more than len() can return (sys.maxsize)"
        )))
    }
}

/// `operator.index`.
static INDEX: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `array.array`.
static ARRAY: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// Imports what the conversions call, once, when the module is imported:
/// an import during the interpreter's finalization (a finalizer's call at
/// exit) fails, and would turn a bad argument's `ValueError` into an
/// `ImportError`.
pub(crate) fn import_helpers(py: Python<'_>) -> PyResult<()> {
    operator_index(py)?;
    ARRAY.import(py, "array", "array")?;
    Ok(())
}

fn operator_index(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    INDEX
        .get_or_try_init(py, || {
            py.import("operator")?.getattr("index").map(Bound::unbind)
        })
        .map(|index| index.bind(py))
}

/// `operator.index(obj)`: the int an int-like object stands for.
pub(crate) fn index<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    operator_index(obj.py())?.call1((obj,))
}

fn too_large(what: &str, value: impl std::fmt::Display) -> PyErr {
    PyOverflowError::new_err(format!("{what} {value} is too large"))
}

/// The error of an int argument that did not convert (`e`, not an
/// `OverflowError`): `e` itself when `obj` has `__index__` (what its
/// `__index__` raised, a `KeyboardInterrupt` included, or that it returned
/// no int), else a `TypeError` naming `what` and `obj`'s type.
fn not_an_int(e: PyErr, what: &str, obj: &Bound<'_, PyAny>) -> PyErr {
    if obj
        .hasattr(pyo3::intern!(obj.py(), "__index__"))
        .unwrap_or(false)
    {
        return e;
    }
    let ty = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_owned());
    PyTypeError::new_err(format!("{what} must be an int, not {ty}"))
}

/// A block id argument: `None` when the int is not the id of any block a
/// pool can have (negative, or 2**32 and above), which callers report as
/// out of range.
pub(crate) fn block_id(obj: &Bound<'_, PyAny>) -> PyResult<Option<BlockId>> {
    match obj.extract::<u32>() {
        Ok(v) => Ok(Some(BlockId::new(v))),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Ok(None),
        Err(e) => Err(not_an_int(e, "a block id", obj)),
    }
}

/// The fewest ids a list or tuple has for [`many_ids`] to read them in one
/// C call: below it, building the array costs more than it saves.
const MANY_IDS: usize = 32;

/// Block ids from a long exact `list` or `tuple` of ints, all of them
/// below `num_blocks`, read in one C call (`array.array("I", ids)`, which
/// converts each item as `int` does, and one copy of its bytes) instead of
/// one conversion per item: about a third of the cost. `Ok(None)` when
/// `ids` is anything else, or when any item is not such an id (not an int,
/// negative, too large or out of range: the array's `TypeError`,
/// `OverflowError` or `ValueError`): the caller then reads them one by one
/// and reports the first bad item, as for any iterable. Any other
/// exception (one an item's `__index__` raised, a `KeyboardInterrupt`
/// included, or a `MemoryError`) is the caller's.
pub(crate) fn many_ids(
    py: Python<'_>,
    ids: &Bound<'_, PyAny>,
    num_blocks: usize,
) -> PyResult<Option<Vec<BlockId>>> {
    let len = if let Ok(list) = ids.cast_exact::<PyList>() {
        list.len()
    } else if let Ok(tuple) = ids.cast_exact::<PyTuple>() {
        tuple.len()
    } else {
        return Ok(None);
    };
    if len < MANY_IDS {
        return Ok(None);
    }
    let array = match ARRAY.import(py, "array", "array")?.call1(("I", ids)) {
        Ok(array) => array,
        Err(e)
            if e.is_instance_of::<PyTypeError>(py)
                || e.is_instance_of::<PyOverflowError>(py)
                || e.is_instance_of::<PyValueError>(py) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let bytes = array.call_method0("tobytes")?;
    let bytes = bytes.cast::<PyBytes>()?.as_bytes();
    if bytes.len() != len * 4 {
        // An `unsigned int` of another size than 4 bytes.
        return Ok(None);
    }
    let mut out = with_room(len, "block ids")?;
    for c in bytes.chunks_exact(4) {
        let id = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
        if id as usize >= num_blocks {
            return Ok(None);
        }
        out.push(BlockId::new(id));
    }
    Ok(Some(out))
}

/// The fewest items for which [`int_list`] builds its list through
/// `array.array`, whose ints are made by fallible C calls: a list this long
/// is where a `MemoryError` is to be met (PyO3's conversion of each item
/// cannot report one; it panics).
const FALLIBLE_LIST: usize = 4096;

/// Non-negative ints (block ids, slots) as a Python list. A list of
/// [`FALLIBLE_LIST`] items or more goes through
/// `array.array("Q", ...).tolist()`, so that running out of memory is a
/// `MemoryError`, as PyO3's conversion of each item is not.
pub(crate) fn int_list<'py, I>(py: Python<'py>, values: I) -> PyResult<Bound<'py, PyList>>
where
    I: ExactSizeIterator<Item = u64> + Clone,
{
    if values.len() < FALLIBLE_LIST {
        return PyList::new(py, values);
    }
    let bytes = PyBytes::new_with(py, values.len() * 8, |buf| {
        for (chunk, v) in buf.chunks_exact_mut(8).zip(values.clone()) {
            chunk.copy_from_slice(&v.to_ne_bytes());
        }
        Ok(())
    })?;
    let array = ARRAY.import(py, "array", "array")?.call1(("Q", bytes))?;
    if array
        .getattr(pyo3::intern!(py, "itemsize"))?
        .extract::<usize>()?
        != 8
    {
        // An `unsigned long long` of another size than 8 bytes.
        return PyList::new(py, values);
    }
    Ok(array
        .call_method0(pyo3::intern!(py, "tolist"))?
        .cast_into::<PyList>()?)
}

/// A block key as a Python `bytes` object of 32 bytes; running out of
/// memory is a `MemoryError` (PyO3's `PyBytes::new` panics).
pub(crate) fn key_bytes<'py>(py: Python<'py>, key: &BlockHash) -> PyResult<Bound<'py, PyBytes>> {
    PyBytes::new_with(py, key.0.len(), |buf| {
        buf.copy_from_slice(&key.0);
        Ok(())
    })
}

/// Block keys as a Python list of 32-byte `bytes` objects, appended one
/// by one to an empty list, so that running out of memory is a
/// `MemoryError` (each key costs a SHA-256 compression to make; an append
/// is nothing beside it).
pub(crate) fn key_list<'py>(py: Python<'py>, keys: &[BlockHash]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for key in keys {
        list.append(key_bytes(py, key)?)?;
    }
    Ok(list)
}

/// Calls `f` on every item of `obj` (an exact list or tuple quickly, else
/// any iterable, through its `__iter__`: a subclass's own included).
pub(crate) fn for_each<'py>(
    obj: &Bound<'py, PyAny>,
    mut f: impl FnMut(Bound<'py, PyAny>) -> PyResult<()>,
) -> PyResult<()> {
    if let Ok(list) = obj.cast_exact::<PyList>() {
        for item in list.iter() {
            f(item)?;
        }
    } else if let Ok(tuple) = obj.cast_exact::<PyTuple>() {
        for item in tuple.iter() {
            f(item)?;
        }
    } else {
        for item in obj.try_iter()? {
            f(item?)?;
        }
    }
    Ok(())
}

/// Refuses a set (or frozenset) as `what`, an argument whose order
/// matters (tokens, keys, groups, sequences): a set's order is arbitrary,
/// so what was built from it would belong to no order in particular.
pub(crate) fn ordered(what: &str, obj: &Bound<'_, PyAny>) -> PyResult<()> {
    // The common arguments first: two pointer compares.
    if obj.is_exact_instance_of::<PyList>() || obj.is_exact_instance_of::<PyTuple>() {
        return Ok(());
    }
    if obj.is_instance_of::<PySet>() || obj.is_instance_of::<PyFrozenSet>() {
        let ty = obj.get_type().name()?;
        return Err(PyTypeError::new_err(format!(
            "{what} must be ordered (a list, a tuple), not a {ty}"
        )));
    }
    Ok(())
}

/// Block keys: a list (or any iterable but a set) of 32-byte `bytes` (or
/// `bytearray`), as `hash_blocks` returns them; or one `bytes` /
/// `bytearray` of keys laid end to end, as `hash_blocks_packed` returns
/// them, which is read in one copy instead of one conversion per key.
pub(crate) fn keys(obj: &Bound<'_, PyAny>) -> PyResult<Vec<BlockHash>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return packed_keys(b.as_bytes());
    }
    if obj.cast::<PyByteArray>().is_ok() {
        // One copy, by Python (which raises `MemoryError` if it does not
        // fit), read in place.
        let bytes = PyMemoryView::from(obj)?.call_method0("tobytes")?;
        return packed_keys(bytes.cast::<PyBytes>()?.as_bytes());
    }
    ordered("keys", obj)?;
    if let Ok(list) = obj.cast_exact::<PyList>() {
        // The common form, from `hash_blocks`: room for every key at once,
        // and an exact `bytes` item tested by its type alone.
        let mut out = with_room(list.len(), "block keys")?;
        for item in list.iter() {
            let key = match item.cast_exact::<PyBytes>() {
                Ok(b) => key_of_slice(b.as_bytes())?,
                Err(_) => key(&item)?,
            };
            // The list may have grown meanwhile (another thread).
            out.try_reserve(1)
                .map_err(|_| crate::errors::out_of_memory("block keys", out.len() + 1))?;
            out.push(key);
        }
        return Ok(out);
    }
    let mut out = Vec::new();
    for_each(obj, |item| {
        let key = key(&item)?;
        out.try_reserve(1)
            .map_err(|_| crate::errors::out_of_memory("block keys", out.len() + 1))?;
        out.push(key);
        Ok(())
    })?;
    Ok(out)
}

/// Keys laid end to end.
fn packed_keys(bytes: &[u8]) -> PyResult<Vec<BlockHash>> {
    if bytes.len() % 32 != 0 {
        return Err(PyValueError::new_err(format!(
            "packed block keys are 32 bytes each: the length {} is not a multiple of 32",
            bytes.len()
        )));
    }
    let mut out = with_room(bytes.len() / 32, "block keys")?;
    out.extend(bytes.chunks_exact(32).map(|c| {
        let mut key = [0; 32];
        key.copy_from_slice(c);
        BlockHash(key)
    }));
    Ok(out)
}

/// A peek at keys laid end to end (`bytes`, as `hash_blocks_packed`
/// returns them): `peek` counts the cached prefix of the keys it is given,
/// first of the first 16, then of twice as many each time it counts all it
/// was given, so a peek that stops early copies little more than it
/// counts (a count's peek repeats at most as many keys again). The length
/// is checked first, whole.
pub(crate) fn peek_packed(
    bytes: &[u8],
    mut peek: impl FnMut(&[BlockHash]) -> usize,
) -> PyResult<usize> {
    if bytes.len() % 32 != 0 {
        return Err(PyValueError::new_err(format!(
            "packed block keys are 32 bytes each: the length {} is not a multiple of 32",
            bytes.len()
        )));
    }
    let total = bytes.len() / 32;
    let mut keys: Vec<BlockHash> = Vec::new();
    let mut want = total.min(16);
    loop {
        keys.try_reserve_exact(want - keys.len())
            .map_err(|_| crate::errors::out_of_memory("block keys", want))?;
        keys.extend(bytes[keys.len() * 32..want * 32].chunks_exact(32).map(|c| {
            let mut key = [0; 32];
            key.copy_from_slice(c);
            BlockHash(key)
        }));
        let counted = peek(&keys);
        if counted < keys.len() || keys.len() == total {
            return Ok(counted);
        }
        want = total.min(want.saturating_mul(2));
    }
}

/// One block key.
pub(crate) fn key(item: &Bound<'_, PyAny>) -> PyResult<BlockHash> {
    let bytes: Vec<u8>;
    let slice = if let Ok(b) = item.cast::<PyBytes>() {
        b.as_bytes()
    } else if let Ok(b) = item.cast::<PyByteArray>() {
        bytes = b.to_vec();
        &bytes
    } else {
        let ty = item.get_type().name()?;
        return Err(PyTypeError::new_err(format!(
            "a block key must be bytes, not {ty}"
        )));
    };
    key_of_slice(slice)
}

/// A key of 32 bytes, or `ValueError`.
#[inline]
fn key_of_slice(slice: &[u8]) -> PyResult<BlockHash> {
    let key: [u8; 32] = slice.try_into().map_err(|_| {
        PyValueError::new_err(format!(
            "a block key is 32 bytes, got {} bytes",
            slice.len()
        ))
    })?;
    Ok(BlockHash(key))
}

/// Token ids: a list (or any iterable but a set) of ints in `0..2**32`; `bytes` or
/// `bytearray` holding little-endian `uint32`s (also through a
/// one-dimensional `memoryview` of one, whatever its format, or a buffer
/// of `char`s, format `c`); or any other
/// one-dimensional buffer of integers (a numpy array of any byte order,
/// `array.array`) of item size 1, 2, 4 or 8, one token an item, each value
/// in `0..2**32`.
pub(crate) fn tokens(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return raw_u32(b.as_bytes());
    }
    // A `bytearray` reads as its memoryview does, below.
    if obj.cast::<PyList>().is_err() && obj.cast::<PyTuple>().is_err() {
        if let Ok(view) = PyMemoryView::from(obj) {
            // A memoryview of `bytes` or `bytearray` reads as they do.
            return buffer_tokens(&view, is_byte_string(obj)?);
        }
    }
    ordered("tokens", obj)?;
    let mut out = Vec::new();
    for_each(obj, |item| {
        let token = token(&item)?;
        out.try_reserve(1)
            .map_err(|_| crate::errors::out_of_memory("tokens", out.len() + 1))?;
        out.push(token);
        Ok(())
    })?;
    Ok(out)
}

/// Whether `obj` is `bytes`, a `bytearray`, or a `memoryview` of one:
/// raw bytes, which iterate as ints.
pub(crate) fn is_byte_string(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let bytes =
        |o: &Bound<'_, PyAny>| o.cast::<PyBytes>().is_ok() || o.cast::<PyByteArray>().is_ok();
    if bytes(obj) {
        return Ok(true);
    }
    match obj.cast::<PyMemoryView>() {
        Ok(view) => Ok(bytes(&view.getattr("obj")?)),
        Err(_) => Ok(false),
    }
}

fn token(item: &Bound<'_, PyAny>) -> PyResult<u32> {
    match item.extract::<u32>() {
        Ok(v) => Ok(v),
        Err(e) if e.is_instance_of::<PyOverflowError>(item.py()) => Err(PyValueError::new_err(
            format!("a token id must be in 0..2**32, got {item}"),
        )),
        Err(e) => Err(not_an_int(e, "a token id", item)),
    }
}

/// Little-endian `uint32`s.
fn raw_u32(bytes: &[u8]) -> PyResult<Vec<u32>> {
    if bytes.len() % 4 != 0 {
        return Err(PyValueError::new_err(format!(
            "token bytes hold little-endian uint32s: the length {} is not a multiple of 4",
            bytes.len()
        )));
    }
    let mut out = with_room(bytes.len() / 4, "tokens")?;
    out.extend(
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
    );
    Ok(out)
}

/// An empty vector with room for `n` items, or `MemoryError` (naming
/// `what`) if they do not fit: never the allocator's abort.
pub(crate) fn with_room<T>(n: usize, what: &str) -> PyResult<Vec<T>> {
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|_| crate::errors::out_of_memory(what, n))?;
    Ok(out)
}

/// The integers of a buffer, by its `struct` format (any byte order:
/// native, `<`, `>` or `!`); a buffer of `bytes` (`of_bytes`, whatever
/// the view's format) or of `char`s as little-endian `uint32`s.
fn buffer_tokens(view: &Bound<'_, PyMemoryView>, of_bytes: bool) -> PyResult<Vec<u32>> {
    let format: String = view.getattr("format")?.extract()?;
    let itemsize: usize = view.getattr("itemsize")?.extract()?;
    let ndim: usize = view.getattr("ndim")?.extract()?;
    if ndim != 1 {
        return Err(PyValueError::new_err(format!(
            "a token buffer must be one-dimensional, got {ndim} dimensions"
        )));
    }
    if of_bytes {
        // Raw bytes, as `bytes` reads, whatever format a cast gave the
        // view: one copy, by Python.
        let bytes = view.call_method0("tobytes")?;
        return raw_u32(bytes.cast::<PyBytes>()?.as_bytes());
    }
    // The items' byte order, from the format's prefix (none: native).
    let native_little = cfg!(target_endian = "little");
    let (little, code) = match format.as_bytes().first() {
        Some(b'@' | b'=') => (native_little, &format[1..]),
        Some(b'<') => (true, &format[1..]),
        Some(b'>' | b'!') => (false, &format[1..]),
        _ => (native_little, &format[..]),
    };
    let signed = match code {
        "b" | "h" | "i" | "l" | "q" | "n" => true,
        "B" | "H" | "I" | "L" | "Q" | "N" | "c" => false,
        _ => {
            return Err(PyTypeError::new_err(format!(
                "a token buffer must hold integers, got format {format:?}"
            )))
        }
    };
    if !matches!(itemsize, 1 | 2 | 4 | 8) {
        return Err(PyTypeError::new_err(format!(
            "a token buffer's items must be 1, 2, 4 or 8 bytes, got {itemsize}"
        )));
    }
    // One copy, by Python (which raises `MemoryError` if it does not fit),
    // read in place.
    let bytes = view.call_method0("tobytes")?;
    let bytes = bytes.cast::<PyBytes>()?.as_bytes();
    if code == "c" {
        // Raw bytes: as `bytes`.
        return raw_u32(bytes);
    }
    let value = |c: &[u8]| -> i128 {
        // An item as an unsigned integer in native order, then
        // sign-extended from its width if the format is signed.
        let mut word = [0u8; 8];
        let raw = if little {
            word[..itemsize].copy_from_slice(c);
            u64::from_le_bytes(word)
        } else {
            word[8 - itemsize..].copy_from_slice(c);
            u64::from_be_bytes(word)
        };
        let bits = 8 * itemsize as u32;
        if signed && bits < 64 {
            let shift = 64 - bits;
            i128::from(((raw << shift) as i64) >> shift)
        } else if signed {
            i128::from(raw as i64)
        } else {
            i128::from(raw)
        }
    };
    let mut out = with_room(bytes.len() / itemsize, "tokens")?;
    for c in bytes.chunks_exact(itemsize) {
        let v = value(c);
        out.push(u32::try_from(v).map_err(|_| {
            PyValueError::new_err(format!("a token id must be in 0..2**32, got {v}"))
        })?);
    }
    Ok(out)
}

/// A timeout in seconds: `None` waits without limit; otherwise a finite
/// number of seconds, at least 0. One past `Duration`'s range (over
/// 584 billion years) is `Duration::MAX`, which no deadline can reach: no
/// limit, as `None`.
pub(crate) fn timeout(seconds: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    seconds
        .map(|obj| {
            let s = obj.extract::<f64>().map_err(|e| {
                if e.is_instance_of::<PyTypeError>(obj.py()) {
                    let ty = obj
                        .get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_else(|_| "?".to_owned());
                    let err = PyTypeError::new_err(format!(
                        "timeout must be None or a number of seconds, not {ty}"
                    ));
                    err.set_cause(obj.py(), Some(e));
                    err
                } else {
                    e
                }
            })?;
            if s.is_finite() && s >= 0.0 {
                Ok(Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX))
            } else {
                Err(PyValueError::new_err(format!(
                    "timeout must be None or a finite number of seconds >= 0, got {s}"
                )))
            }
        })
        .transpose()
}

/// A reservation's `tokens` and optional `headroom` (default 0), as
/// [`uint`]s named in their errors.
pub(crate) fn reservation(
    tokens: &Bound<'_, PyAny>,
    headroom: &Arg<'_>,
) -> PyResult<(usize, usize)> {
    let headroom = headroom.given();
    let tokens = uint(tokens, "tokens")?;
    let headroom = headroom.map_or(Ok(0), |h| uint(h, "headroom"))?;
    Ok((tokens, headroom))
}
