//! The Mooncake trace format: one JSON object a line,
//! `{"timestamp": 0, "input_length": 6758, "output_length": 500,
//! "hash_ids": [0, 1, ...]}`, with one chained id per 512-token block of
//! the prompt (see [`crate::prefix`] for what the simulator makes of them).
//!
//! Every line is checked before any request is run: it must be a JSON
//! object with the four fields (others are ignored), each count a
//! non-negative whole number, `input_length` at least 1, and `hash_ids` an
//! array of `ceil(input_length / 512)` non-negative whole numbers; no field
//! may be given twice. Blank lines are skipped; a file with no request is
//! refused. The first problem found is returned with its 1-based line
//! number.

use std::collections::HashMap;
use std::sync::Arc;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::prefix::TRACE_BLOCK;
use crate::workload::{Request, TraceError};

/// Parses a Mooncake JSONL trace (see the module's docs).
pub fn parse_jsonl(text: &str) -> Result<Vec<Request>, TraceError> {
    crate::workload::read_lines(
        text.as_bytes(),
        Some(crate::workload::TraceFormat::Jsonl),
        crate::workload::TraceLimits::NONE,
    )
}

/// The request on line `line` of a JSONL trace (`None` for a blank line),
/// with id `id`.
pub(crate) fn parse_line(line: usize, raw: &str, id: usize) -> Result<Option<Request>, TraceError> {
    let row = raw.trim_start_matches('\u{feff}').trim();
    if row.is_empty() {
        return Ok(None);
    }
    let obj = match serde_json::from_str::<Object<'_>>(row) {
        Ok(Object::Fields(obj)) => obj,
        Ok(Object::Duplicate(key)) => return Err(TraceError::DuplicateKey { line, key }),
        Err(e) => {
            return Err(TraceError::BadJson {
                line,
                msg: e.to_string(),
            })
        }
    };
    count(&obj, line, "timestamp")?;
    let prompt = count(&obj, line, "input_length")? as usize;
    let output = count(&obj, line, "output_length")? as usize;
    if prompt == 0 {
        return Err(TraceError::ZeroPrompt { line });
    }
    let Some(raw_ids) = obj.get("hash_ids") else {
        return Err(TraceError::MissingField {
            line,
            field: "hash_ids",
        });
    };
    // The ids' own texts: each is checked, and shown, as written.
    let Ok(ids) = serde_json::from_str::<Vec<&RawValue>>(raw_ids.get()) else {
        return Err(TraceError::BadNumber {
            line,
            column: "hash_ids",
            value: shown(raw_ids),
        });
    };
    let expected = prompt.div_ceil(TRACE_BLOCK);
    if ids.len() != expected {
        return Err(TraceError::HashIdCount {
            line,
            expected,
            found: ids.len(),
        });
    }
    let ids = ids
        .iter()
        .map(|v| whole(v, line, "hash_ids"))
        .collect::<Result<Arc<[u64]>, _>>()?;
    Ok(Some(Request {
        id,
        prompt,
        output,
        hash_ids: Some(ids),
    }))
}

/// A line's JSON object, each field's value as written, or the first key
/// it gives twice (JSON allows it; which value counts is the parser's
/// choice, so a trace must not).
enum Object<'a> {
    Fields(HashMap<String, &'a RawValue>),
    Duplicate(String),
}

impl<'de> Deserialize<'de> for Object<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Object<'de>, D::Error> {
        d.deserialize_any(ObjectVisitor)
    }
}

struct ObjectVisitor;

impl<'de> Visitor<'de> for ObjectVisitor {
    type Value = Object<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Object<'de>, A::Error> {
        let mut obj = HashMap::new();
        while let Some(key) = map.next_key::<String>()? {
            if obj.contains_key(&key) {
                // The rest of the object is read (and checked as JSON), not
                // kept.
                map.next_value::<IgnoredAny>()?;
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                return Ok(Object::Duplicate(key.chars().take(40).collect()));
            }
            let value = map.next_value::<&RawValue>()?;
            obj.insert(key, value);
        }
        Ok(Object::Fields(obj))
    }
}

/// A field that must be a non-negative whole number.
fn count(
    obj: &HashMap<String, &RawValue>,
    line: usize,
    field: &'static str,
) -> Result<u64, TraceError> {
    match obj.get(field) {
        None => Err(TraceError::MissingField { line, field }),
        Some(v) => whole(v, line, field),
    }
}

/// A non-negative whole number (that fits a `usize`), or a typed error
/// naming it as written.
fn whole(raw: &RawValue, line: usize, column: &'static str) -> Result<u64, TraceError> {
    let text = raw.get();
    // The common case, digits alone (JSON writes no leading zero).
    if text.bytes().all(|b| b.is_ascii_digit()) {
        if let Some(n) = text
            .parse::<u64>()
            .ok()
            .filter(|&n| usize::try_from(n).is_ok())
        {
            return Ok(n);
        }
    }
    // The text is valid JSON: the line parsed.
    let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    if let Some(n) = v.as_u64() {
        if usize::try_from(n).is_ok() {
            return Ok(n);
        }
    }
    let negative = match v {
        Value::Number(n) => n.as_f64().is_some_and(|f| f < 0.0),
        _ => false,
    };
    Err(TraceError::number(negative, line, column, shown(raw)))
}

/// A value as written, its first 40 characters.
fn shown(raw: &RawValue) -> String {
    raw.get().chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_good_lines_and_skips_blank_ones() {
        let t = "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 5, \"hash_ids\": [0, 1]}\n\n{\"timestamp\": 3, \"input_length\": 1025, \"output_length\": 0, \"hash_ids\": [0, 1, 2], \"extra\": true}";
        let r = parse_jsonl(t).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].id, r[0].prompt, r[0].output), (0, 1024, 5));
        assert_eq!(r[1].hash_ids.as_deref(), Some(&[0u64, 1, 2][..]));
    }
}
