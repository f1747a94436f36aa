//! Calls over many sequences at once: a scheduler's decode step appends a
//! token or a few to every running sequence, and one Python call a
//! sequence costs more than the append itself.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::hybrid::PyHybridSequence;
use crate::lock::ThreadToken;
use crate::sequence::PySequence;
use crate::{convert, detached, DETACH_BLOCKS};

/// A sequence of either kind.
enum Target<'a> {
    Plain(&'a PySequence),
    Hybrid(&'a PyHybridSequence),
}

impl Target<'_> {
    fn try_append_now(&self, n: usize, me: ThreadToken) -> bool {
        match self {
            Target::Plain(seq) => seq.try_append_now(n, me),
            Target::Hybrid(seq) => seq.try_append_now(n, me),
        }
    }

    fn blocks_of(&self, n: usize) -> usize {
        match self {
            Target::Plain(seq) => seq.blocks_of(n),
            Target::Hybrid(seq) => seq.blocks_of(n),
        }
    }
}

/// Appends `n` tokens to each sequence of `seqs` in turn (a `Sequence` or
/// a `HybridSequence`; `n` an int for all of them, default 1, or one int a
/// sequence), each append all or nothing as in `try_append`, and stops at
/// the first sequence that cannot append now. Returns how many appended:
/// the first `k` did, the rest are unchanged.
///
/// A sequence cannot append now if its pool lacks the blocks, its last
/// block needs a copy first (`CopyRequired`), it is closed, or another
/// call (of any thread) holds it: this call never waits. Call
/// `seqs[k].try_append(n)` for the reason, raised as its exception (it
/// waits for a held sequence).
///
/// Raises `TypeError` for an item that is no sequence, a count that is no
/// int, a set as `seqs` or `n` (whose order is arbitrary), a dict as
/// `seqs` or `n` (which iterates its keys), or raw bytes as `n` (`bytes`,
/// `bytearray`: one byte is no count); `ValueError`
/// for a negative count or a list of counts whose length is not
/// `len(seqs)`; `OverflowError` for a count past `2**64`: all before any
/// append, so nothing changes.
///
/// The sequences are appended with the GIL released when there are at
/// least 32 of them, or their appends take at least 32 blocks.
#[pyfunction]
#[pyo3(signature = (seqs, n = convert::Arg::Default), text_signature = "(seqs, n=1)")]
pub(crate) fn try_append_each(
    py: Python<'_>,
    seqs: &Bound<'_, PyAny>,
    n: convert::Arg<'_>,
) -> PyResult<usize> {
    convert::ordered("seqs", seqs)?;
    not_a_dict("seqs", seqs)?;
    let items: Vec<Bound<'_, PyAny>> = seqs.try_iter()?.collect::<PyResult<_>>()?;
    let mut targets = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let target = if let Ok(seq) = item.cast::<PySequence>() {
            Target::Plain(seq.get())
        } else if let Ok(seq) = item.cast::<PyHybridSequence>() {
            Target::Hybrid(seq.get())
        } else {
            let ty = item.get_type().name()?;
            return Err(PyTypeError::new_err(format!(
                "seqs[{i}] must be a Sequence or a HybridSequence, not {ty}"
            )));
        };
        targets.push(target);
    }
    let counts = Counts::new(n.given(), targets.len())?;
    // The work: a sequence each, and the blocks their appends walk (not
    // counted past the threshold, which the sequences alone reach).
    let work = if targets.len() >= DETACH_BLOCKS {
        targets.len()
    } else {
        (0..targets.len()).fold(0usize, |work, i| {
            work.saturating_add(1)
                .saturating_add(targets[i].blocks_of(counts.get(i)))
        })
    };
    // The closure runs on this thread, detached or not.
    let me = ThreadToken::current();
    Ok(detached(py, work, || {
        (0..targets.len())
            .take_while(|&i| targets[i].try_append_now(counts.get(i), me))
            .count()
    }))
}

/// The token count of each sequence.
enum Counts {
    /// The same for all.
    All(usize),
    /// One a sequence.
    Each(Vec<usize>),
}

impl Counts {
    /// `n` (default 1) for all of `len` sequences, or one of an iterable
    /// of counts (a list, a tuple, a numpy array) of length `len`.
    fn new(n: Option<&Bound<'_, PyAny>>, len: usize) -> PyResult<Counts> {
        let Some(n) = n else {
            return Ok(Counts::All(1));
        };
        match convert::uint::<usize>(n, "n") {
            Ok(k) => Ok(Counts::All(k)),
            Err(e) if e.is_instance_of::<PyTypeError>(n.py()) => each(n, len, e).map(Counts::Each),
            Err(e) => Err(e),
        }
    }

    fn get(&self, i: usize) -> usize {
        match self {
            Counts::All(k) => *k,
            Counts::Each(counts) => counts[i],
        }
    }
}

/// The counts of `n`, which is no int (`not_int` its error): an iterable
/// of `len` of them, read no further than one count past `len` (an
/// endless iterator is refused, not drained).
fn each(n: &Bound<'_, PyAny>, len: usize, not_int: PyErr) -> PyResult<Vec<usize>> {
    let Ok(iter) = n.try_iter() else {
        return Err(not_int);
    };
    convert::ordered("n", n)?;
    not_a_dict("n", n)?;
    // Raw bytes iterate as ints, one a byte: not counts (`hash_blocks`
    // reads them as 4-byte tokens), so a `bytes` here is a mistake.
    if convert::is_byte_string(n)? {
        return Err(PyTypeError::new_err(format!(
            "n must be an int or an iterable of ints, not {}",
            n.get_type().name()?
        )));
    }
    let mut counts = Vec::with_capacity(len);
    for k in iter {
        if counts.len() == len {
            return Err(PyValueError::new_err(format!(
                "n holds more counts than the {len} sequences"
            )));
        }
        counts.push(convert::uint::<usize>(&k?, "a count in n")?);
    }
    if counts.len() != len {
        return Err(PyValueError::new_err(format!(
            "n holds {} counts for {len} sequences",
            counts.len()
        )));
    }
    Ok(counts)
}

/// Refuses a dict as `what`: it iterates its keys, so `{seq: n}` as `seqs`
/// would append the default count, and as `n` would read the keys as
/// counts, where the caller meant the values.
fn not_a_dict(what: &str, obj: &Bound<'_, PyAny>) -> PyResult<()> {
    if obj.is_instance_of::<PyDict>() {
        let ty = obj.get_type().name()?;
        return Err(PyTypeError::new_err(format!(
            "{what} must be a list or a tuple, not a {ty} (which iterates its keys): \
             pass the sequences and their counts as two lists"
        )));
    }
    Ok(())
}
