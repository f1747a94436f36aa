//! The extra keys of `hash_blocks` and `hash_blocks_packed` (LoRA
//! adapters, cache salts, multimodal inputs, custom extras), read from
//! Python into owned values that `kvslots::ExtraKey`s borrow.

use std::ops::Range;

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyString, PyTuple};

use crate::convert;

/// One extra key, owned.
pub(crate) enum Extra {
    Lora(Vec<u8>),
    CacheSalt(Vec<u8>),
    Multimodal(Vec<u8>, Range<usize>),
    Custom(Vec<u8>, Vec<u8>, Range<usize>),
}

impl Extra {
    /// The core's view of it.
    pub(crate) fn key(&self) -> kvslots::ExtraKey<'_> {
        match self {
            Extra::Lora(b) => kvslots::ExtraKey::Lora(b),
            Extra::CacheSalt(b) => kvslots::ExtraKey::CacheSalt(b),
            Extra::Multimodal(hash, positions) => kvslots::ExtraKey::Multimodal {
                hash,
                positions: positions.clone(),
            },
            Extra::Custom(tag, bytes, positions) => kvslots::ExtraKey::Custom {
                tag,
                bytes,
                positions: positions.clone(),
            },
        }
    }
}

/// The extras given as `hash_blocks`'s keyword arguments, in the order
/// the core lays them out (LoRA, cache salt, multimodal inputs in the
/// order given, custom extras in the order given).
pub(crate) fn extras(
    lora: Option<&Bound<'_, PyAny>>,
    cache_salt: Option<&Bound<'_, PyAny>>,
    multimodal: Option<&Bound<'_, PyAny>>,
    custom: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<Extra>> {
    let mut out = Vec::new();
    if let Some(obj) = lora {
        out.push(Extra::Lora(bytes_of(obj, "lora")?));
    }
    if let Some(obj) = cache_salt {
        out.push(Extra::CacheSalt(bytes_of(obj, "cache_salt")?));
    }
    if let Some(obj) = multimodal {
        convert::ordered("multimodal", obj)?;
        convert::for_each(obj, |item| {
            let [hash, offset, length] =
                fields::<3>(&item, "multimodal", "(hash, offset, length)")?;
            let positions = positions(&offset, &length, "multimodal")?;
            out.push(Extra::Multimodal(
                bytes_of(&hash, "a multimodal hash")?,
                positions,
            ));
            Ok(())
        })?;
    }
    if let Some(obj) = custom {
        convert::ordered("custom", obj)?;
        convert::for_each(obj, |item| {
            let [tag, bytes, offset, length] =
                fields::<4>(&item, "custom", "(tag, bytes, offset, length)")?;
            let positions = positions(&offset, &length, "custom")?;
            out.push(Extra::Custom(
                bytes_of(&tag, "a custom tag")?,
                bytes_of(&bytes, "a custom extra's bytes")?,
                positions,
            ));
            Ok(())
        })?;
    }
    Ok(out)
}

/// The bytes of `obj`: `bytes` or `bytearray` as they are, `str` as
/// UTF-8 (a LoRA adapter's name, a hex digest).
fn bytes_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        Ok(b.as_bytes().to_vec())
    } else if let Ok(b) = obj.cast::<PyByteArray>() {
        Ok(b.to_vec())
    } else if let Ok(s) = obj.cast::<PyString>() {
        Ok(s.to_str()?.as_bytes().to_vec())
    } else {
        Err(PyTypeError::new_err(format!(
            "{what} must be bytes, bytearray or str, not {}",
            obj.get_type().name()?
        )))
    }
}

/// The `N` fields of a tuple item of `what`, shaped as `shape`.
fn fields<'py, const N: usize>(
    item: &Bound<'py, PyAny>,
    what: &str,
    shape: &str,
) -> PyResult<[Bound<'py, PyAny>; N]> {
    let wrong = || -> PyResult<PyErr> {
        Ok(PyTypeError::new_err(format!(
            "each item of {what} must be a tuple {shape}, not {}",
            item.get_type().name()?
        )))
    };
    let Ok(tuple) = item.cast::<PyTuple>() else {
        return Err(wrong()?);
    };
    if tuple.len() != N {
        return Err(PyValueError::new_err(format!(
            "each item of {what} must be a tuple {shape}: got {} fields",
            tuple.len()
        )));
    }
    let mut fields = tuple.iter();
    Ok(std::array::from_fn(|_| fields.next().expect("N fields")))
}

/// The prompt positions `offset..offset + length`.
fn positions(
    offset: &Bound<'_, PyAny>,
    length: &Bound<'_, PyAny>,
    what: &str,
) -> PyResult<Range<usize>> {
    let offset: usize = convert::uint(offset, &format!("a {what} offset"))?;
    let length: usize = convert::uint(length, &format!("a {what} length"))?;
    if length == 0 {
        // The core refuses it too, but names it by its place in its own
        // list of every kind.
        return Err(PyValueError::new_err(format!(
            "a {what} length must be at least 1: an extra of no positions enters no key"
        )));
    }
    let end = offset.checked_add(length).ok_or_else(|| {
        PyOverflowError::new_err(format!(
            "a {what} range ends past the largest position: offset {offset}, length {length}"
        ))
    })?;
    Ok(offset..end)
}
