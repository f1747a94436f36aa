//! Requests: read from a trace, or drawn from a seeded synthetic workload.
//!
//! Two trace formats are read (see [`read_trace`] for how one is told from
//! the other):
//!
//! * the Azure LLM inference CSV: the header
//!   `TIMESTAMP,ContextTokens,GeneratedTokens` and one request a row
//!   (prompt tokens, generated tokens);
//! * the Mooncake JSONL (see [`crate::mooncake`]): one JSON object a line,
//!   `{"timestamp", "input_length", "output_length", "hash_ids"}`, whose
//!   `hash_ids` name the prompt's content (see [`crate::prefix`]).
//!
//! The timestamps are read but not used: the simulator is closed-loop and
//! feeds requests as fast as the workers take them.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, LogNormal};

/// One inference request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Its index in the workload, `0..len`.
    pub id: usize,
    /// Prompt (context) tokens, at least 1.
    pub prompt: usize,
    /// Tokens to generate for each sample.
    pub output: usize,
    /// The prompt's content: one chained id per 512-token block
    /// (`ceil(prompt / 512)` of them, see [`crate::prefix`]); `None` when
    /// the workload does not say (its prompt is then never cached).
    pub hash_ids: Option<Arc<[u64]>>,
}

impl Request {
    /// A request whose content is unknown (never cached).
    pub fn new(id: usize, prompt: usize, output: usize) -> Request {
        Request {
            id,
            prompt,
            output,
            hash_ids: None,
        }
    }
}

/// The trace header, exactly.
pub const TRACE_HEADER: &str = "TIMESTAMP,ContextTokens,GeneratedTokens";

/// What is wrong with a trace file. Every variant that concerns a row names
/// its 1-based line number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceError {
    /// The file could not be read.
    Io(String),
    /// The file is empty.
    Empty,
    /// Line 1 is not the header.
    MissingHeader {
        /// What line 1 holds instead.
        found: String,
    },
    /// A row does not have exactly three fields.
    FieldCount {
        /// The 1-based line number.
        line: usize,
        /// How many fields it has.
        found: usize,
    },
    /// A field is empty.
    EmptyField {
        /// The 1-based line number.
        line: usize,
        /// The column's name.
        column: &'static str,
    },
    /// A count is negative.
    Negative {
        /// The 1-based line number.
        line: usize,
        /// The column's name.
        column: &'static str,
        /// The field as written.
        value: String,
    },
    /// A count is not a whole number (or too large).
    BadNumber {
        /// The 1-based line number.
        line: usize,
        /// The column's name.
        column: &'static str,
        /// The field as written.
        value: String,
    },
    /// A request with no prompt token.
    ZeroPrompt {
        /// The 1-based line number.
        line: usize,
    },
    /// The header is there (CSV) or the file has lines (JSONL) but no
    /// request follows.
    NoRequests,
    /// A JSONL line is not a JSON object.
    BadJson {
        /// The 1-based line number.
        line: usize,
        /// What the JSON parser said.
        msg: String,
    },
    /// A JSONL object lacks a field.
    MissingField {
        /// The 1-based line number.
        line: usize,
        /// The field's name.
        field: &'static str,
    },
    /// A JSONL object names a field twice.
    DuplicateKey {
        /// The 1-based line number.
        line: usize,
        /// The field's name (its first 40 characters).
        key: String,
    },
    /// A line is longer than [`MAX_LINE_BYTES`].
    LineTooLong {
        /// The 1-based line number.
        line: usize,
        /// [`MAX_LINE_BYTES`].
        max: usize,
    },
    /// A line is not UTF-8.
    NotUtf8 {
        /// The 1-based line number.
        line: usize,
        /// The 1-based position in the line of the first byte that is not.
        byte: usize,
    },
    /// The requests read up to this line take more host memory than the run
    /// may use ([`TraceLimits::bytes`]).
    OverBudget {
        /// The 1-based line number.
        line: usize,
        /// The requests read before it.
        requests: usize,
        /// The budget, in bytes.
        bytes: usize,
    },
    /// A JSONL object's `hash_ids` does not hold one id per 512-token block
    /// of its prompt.
    HashIdCount {
        /// The 1-based line number.
        line: usize,
        /// `ceil(input_length / 512)`.
        expected: usize,
        /// How many ids it holds.
        found: usize,
    },
}

impl TraceError {
    /// A number that did not parse: `Negative` if it is a negative number,
    /// else `BadNumber`.
    pub(crate) fn number(negative: bool, line: usize, column: &'static str, value: String) -> Self {
        if negative {
            TraceError::Negative {
                line,
                column,
                value,
            }
        } else {
            TraceError::BadNumber {
                line,
                column,
                value,
            }
        }
    }

    /// The 1-based line the error is on, if it concerns one line.
    pub fn line(&self) -> Option<usize> {
        match *self {
            TraceError::MissingHeader { .. } => Some(1),
            TraceError::FieldCount { line, .. }
            | TraceError::EmptyField { line, .. }
            | TraceError::Negative { line, .. }
            | TraceError::BadNumber { line, .. }
            | TraceError::ZeroPrompt { line }
            | TraceError::BadJson { line, .. }
            | TraceError::MissingField { line, .. }
            | TraceError::DuplicateKey { line, .. }
            | TraceError::LineTooLong { line, .. }
            | TraceError::NotUtf8 { line, .. }
            | TraceError::OverBudget { line, .. }
            | TraceError::HashIdCount { line, .. } => Some(line),
            TraceError::Io(_) | TraceError::Empty | TraceError::NoRequests => None,
        }
    }
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Io(e) => write!(f, "cannot read trace: {e}"),
            TraceError::Empty => write!(f, "line 1: empty file, expected header `{TRACE_HEADER}`"),
            TraceError::MissingHeader { found } => {
                write!(
                    f,
                    "line 1: missing header: expected `{TRACE_HEADER}`, found `{found}`"
                )
            }
            TraceError::FieldCount { line, found } => {
                write!(f, "line {line}: expected 3 fields, found {found}")
            }
            TraceError::EmptyField { line, column } => {
                write!(f, "line {line}: empty field {column}")
            }
            TraceError::Negative {
                line,
                column,
                value,
            } => write!(f, "line {line}: negative {column} `{value}`"),
            TraceError::BadNumber {
                line,
                column,
                value,
            } => write!(f, "line {line}: bad number in {column}: `{value}`"),
            TraceError::ZeroPrompt { line } => {
                write!(
                    f,
                    "line {line}: the prompt (ContextTokens, input_length) must be at least 1 \
                     token, found 0"
                )
            }
            TraceError::NoRequests => f.write_str("trace has no requests"),
            TraceError::BadJson { line, msg } => write!(f, "line {line}: bad JSON: {msg}"),
            TraceError::MissingField { line, field } => {
                write!(f, "line {line}: missing field `{field}`")
            }
            TraceError::DuplicateKey { line, key } => {
                write!(f, "line {line}: the field `{key}` is given twice")
            }
            TraceError::LineTooLong { line, max } => {
                write!(f, "line {line}: longer than {max} bytes")
            }
            TraceError::NotUtf8 { line, byte } => {
                write!(f, "line {line}: not UTF-8 (byte {byte} of the line)")
            }
            TraceError::OverBudget {
                line,
                requests,
                bytes,
            } => write!(
                f,
                "line {line}: the {requests} requests before it already take the {:.2} GiB \
                 of host memory the run may use; give --requests (at most {requests}) or \
                 --host-memory-gib",
                *bytes as f64 / (1u64 << 30) as f64
            ),
            TraceError::HashIdCount {
                line,
                expected,
                found,
            } => write!(
                f,
                "line {line}: hash_ids holds {found} ids, expected ceil(input_length / 512) = \
                 {expected}"
            ),
        }
    }
}

impl std::error::Error for TraceError {}

/// The longest line a trace may hold, in bytes (without its line ending):
/// reading stops there, so that a file with no line ending (or a device
/// that never ends, such as `/dev/zero`) is refused after this much.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// A trace file's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// The Azure CSV ([`parse_trace`]).
    Csv,
    /// The Mooncake JSONL ([`crate::mooncake::parse_jsonl`]).
    Jsonl,
}

/// The format of a trace: by the file's extension (`.csv`; `.jsonl` or
/// `.json`), otherwise by its content (a first non-blank character `{` is
/// JSONL, anything else CSV).
pub fn trace_format(path: &Path, text: &str) -> TraceFormat {
    format_by_extension(path).unwrap_or_else(|| format_by_content(text))
}

fn format_by_extension(path: &Path) -> Option<TraceFormat> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("csv") => Some(TraceFormat::Csv),
        Some(e) if e.eq_ignore_ascii_case("jsonl") || e.eq_ignore_ascii_case("json") => {
            Some(TraceFormat::Jsonl)
        }
        _ => None,
    }
}

fn format_by_content(text: &str) -> TraceFormat {
    if text
        .trim_start_matches('\u{feff}')
        .trim_start()
        .starts_with('{')
    {
        TraceFormat::Jsonl
    } else {
        TraceFormat::Csv
    }
}

/// Whether a line holds nothing but white space (and a byte-order mark).
fn is_blank(text: &str) -> bool {
    text.trim_start_matches('\u{feff}').trim().is_empty()
}

/// How much of a trace [`read_trace_limited`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceLimits {
    /// Reading stops once this many requests are read (the rest of the file
    /// is not read).
    pub requests: usize,
    /// The host memory the requests may take ([`request_bytes`] each): a
    /// trace whose requests pass it is refused with
    /// [`TraceError::OverBudget`].
    pub bytes: usize,
}

impl TraceLimits {
    /// No limit: the whole file.
    pub const NONE: TraceLimits = TraceLimits {
        requests: usize::MAX,
        bytes: usize::MAX,
    };
}

/// The host memory one request takes while a run holds it: the request,
/// its content ids, and the engine's record of its completion.
pub fn request_bytes(r: &Request) -> usize {
    REQUEST_BYTES
        + r.hash_ids
            .as_ref()
            .map_or(0, |ids| ARC_HEADER + 8 * ids.len())
}

/// [`request_bytes`] without content ids.
const REQUEST_BYTES: usize = std::mem::size_of::<Request>() + std::mem::size_of::<usize>() + 1;
/// The counts before an `Arc`'s data.
const ARC_HEADER: usize = 2 * std::mem::size_of::<usize>();

/// The most host memory one synthetic request takes ([`request_bytes`] of
/// a request with the longest prompt).
pub fn synthetic_request_bytes(w: &SharedPrefixes) -> usize {
    let ids = w
        .lengths
        .max_prompt
        .max(1)
        .div_ceil(crate::prefix::TRACE_BLOCK);
    REQUEST_BYTES + ARC_HEADER + 8 * ids
}

/// Reads a whole trace file, CSV or JSONL (see [`trace_format`]).
pub fn read_trace(path: &Path) -> Result<Vec<Request>, TraceError> {
    read_trace_limited(path, TraceLimits::NONE)
}

/// Reads a trace file, CSV or JSONL (see [`trace_format`]), a line at a
/// time, up to `limits`: at most `limits.requests` requests (the lines
/// after them are not read, nor checked), and an error once the requests
/// read take more than `limits.bytes`. A line longer than
/// [`MAX_LINE_BYTES`] or not UTF-8 is refused, naming it.
pub fn read_trace_limited(path: &Path, limits: TraceLimits) -> Result<Vec<Request>, TraceError> {
    let file = std::fs::File::open(path)
        .map_err(|e| TraceError::Io(format!("{}: {e}", path.display())))?;
    let reader = std::io::BufReader::new(file);
    read_lines(reader, format_by_extension(path), limits).map_err(|e| match e {
        TraceError::Io(msg) => TraceError::Io(format!("{}: {msg}", path.display())),
        other => other,
    })
}

/// Parses a trace in the Azure LLM inference format. The header is
/// required; blank lines (and a trailing newline, and `\r\n` endings) are
/// allowed; every other row must hold a timestamp and two non-negative whole
/// counts, the prompt at least 1.
pub fn parse_trace(text: &str) -> Result<Vec<Request>, TraceError> {
    read_lines(text.as_bytes(), Some(TraceFormat::Csv), TraceLimits::NONE)
}

/// The lines of a trace: each without its line ending, checked for length
/// and UTF-8, numbered from 1.
struct Lines<R> {
    reader: R,
    buf: Vec<u8>,
    line: usize,
}

impl<R: std::io::BufRead> Lines<R> {
    fn next(&mut self) -> Result<Option<(usize, &str)>, TraceError> {
        use std::io::{BufRead, Read};
        self.buf.clear();
        // The longest line, and a `\r\n` ending.
        let most = MAX_LINE_BYTES as u64 + 2;
        let read = (&mut self.reader)
            .take(most)
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| TraceError::Io(e.to_string()))?;
        if read == 0 {
            return Ok(None);
        }
        self.line += 1;
        let mut end = self.buf.len();
        if self.buf[end - 1] == b'\n' {
            end -= 1;
            if end > 0 && self.buf[end - 1] == b'\r' {
                end -= 1;
            }
        }
        if end > MAX_LINE_BYTES {
            return Err(TraceError::LineTooLong {
                line: self.line,
                max: MAX_LINE_BYTES,
            });
        }
        match std::str::from_utf8(&self.buf[..end]) {
            Ok(text) => Ok(Some((self.line, text))),
            Err(e) => Err(TraceError::NotUtf8 {
                line: self.line,
                byte: e.valid_up_to() + 1,
            }),
        }
    }
}

/// A trace parser fed a line at a time.
enum Parser {
    Csv(CsvParser),
    Jsonl,
}

impl Parser {
    fn new(format: TraceFormat) -> Parser {
        match format {
            TraceFormat::Csv => Parser::Csv(CsvParser::Start),
            TraceFormat::Jsonl => Parser::Jsonl,
        }
    }

    /// The request on `text`, line `line`, if it holds one; `id` is its id.
    fn line(&mut self, line: usize, text: &str, id: usize) -> Result<Option<Request>, TraceError> {
        match self {
            Parser::Csv(p) => p.line(line, text, id),
            Parser::Jsonl => crate::mooncake::parse_line(line, text, id),
        }
    }

    /// The requests once every line is read.
    fn finish(self, requests: Vec<Request>) -> Result<Vec<Request>, TraceError> {
        match self {
            Parser::Csv(CsvParser::Start | CsvParser::BlankHeader) => Err(TraceError::Empty),
            _ if requests.is_empty() => Err(TraceError::NoRequests),
            _ => Ok(requests),
        }
    }
}

/// Where a CSV trace is.
enum CsvParser {
    /// Before line 1.
    Start,
    /// Line 1 is blank: an empty file, unless another line follows.
    BlankHeader,
    /// Past the header.
    Rows,
}

impl CsvParser {
    fn line(&mut self, line: usize, raw: &str, id: usize) -> Result<Option<Request>, TraceError> {
        match self {
            CsvParser::Start if is_blank(raw) => {
                *self = CsvParser::BlankHeader;
                return Ok(None);
            }
            CsvParser::Start => {
                let header = raw.trim_start_matches('\u{feff}').trim();
                if header != TRACE_HEADER {
                    return Err(TraceError::MissingHeader {
                        found: header.chars().take(80).collect(),
                    });
                }
                *self = CsvParser::Rows;
                return Ok(None);
            }
            CsvParser::BlankHeader if is_blank(raw) => return Ok(None),
            CsvParser::BlankHeader => {
                return Err(TraceError::MissingHeader {
                    found: String::new(),
                })
            }
            CsvParser::Rows => {}
        }
        let row = raw.trim();
        if row.is_empty() {
            return Ok(None);
        }
        let fields: Vec<&str> = row.split(',').map(str::trim).collect();
        if fields.len() != 3 {
            return Err(TraceError::FieldCount {
                line,
                found: fields.len(),
            });
        }
        if fields[0].is_empty() {
            return Err(TraceError::EmptyField {
                line,
                column: "TIMESTAMP",
            });
        }
        let prompt = parse_count(fields[1], line, "ContextTokens")?;
        let output = parse_count(fields[2], line, "GeneratedTokens")?;
        if prompt == 0 {
            return Err(TraceError::ZeroPrompt { line });
        }
        Ok(Some(Request::new(id, prompt, output)))
    }
}

/// Reads the lines of `reader` as a trace of `format` (by the first
/// non-blank line's content when `None`), up to `limits`.
pub(crate) fn read_lines(
    reader: impl std::io::BufRead,
    format: Option<TraceFormat>,
    limits: TraceLimits,
) -> Result<Vec<Request>, TraceError> {
    let mut lines = Lines {
        reader,
        buf: Vec::new(),
        line: 0,
    };
    let mut parser = format.map(Parser::new);
    // Blank lines before the format is known, fed to its parser once it is.
    let mut leading_blanks = 0;
    let mut requests = Vec::new();
    let mut bytes = 0usize;
    while requests.len() < limits.requests {
        let Some((line, text)) = lines.next()? else {
            break;
        };
        let parser = match &mut parser {
            Some(p) => p,
            None if is_blank(text) => {
                leading_blanks += 1;
                continue;
            }
            None => {
                let mut p = Parser::new(format_by_content(text));
                for blank in 1..=leading_blanks {
                    p.line(blank, "", 0)?;
                }
                parser.insert(p)
            }
        };
        if let Some(r) = parser.line(line, text, requests.len())? {
            bytes = bytes.saturating_add(request_bytes(&r));
            if bytes > limits.bytes {
                return Err(TraceError::OverBudget {
                    line,
                    requests: requests.len(),
                    bytes: limits.bytes,
                });
            }
            requests.push(r);
        }
    }
    parser
        .unwrap_or(Parser::new(TraceFormat::Csv))
        .finish(requests)
}

fn parse_count(field: &str, line: usize, column: &'static str) -> Result<usize, TraceError> {
    if field.is_empty() {
        return Err(TraceError::EmptyField { line, column });
    }
    match field.parse::<usize>() {
        Ok(n) => Ok(n),
        Err(_) => {
            let value = field.chars().take(40).collect();
            // A negative whole number is its own error; "-x" is a bad number.
            let negative = field.starts_with('-') && field[1..].parse::<u128>().is_ok();
            Err(TraceError::number(negative, line, column, value))
        }
    }
}

/// The synthetic workload's shape: log-normal prompt and output lengths.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Synthetic {
    /// Mean of ln(prompt tokens).
    pub prompt_mu: f64,
    /// Standard deviation of ln(prompt tokens).
    pub prompt_sigma: f64,
    /// Mean of ln(output tokens).
    pub output_mu: f64,
    /// Standard deviation of ln(output tokens).
    pub output_sigma: f64,
    /// Prompts are capped here (the code trace's longest is 7,437).
    pub max_prompt: usize,
    /// Outputs are capped here (the code trace's longest is 1,899).
    pub max_output: usize,
}

impl Default for Synthetic {
    /// Shaped like the Azure code-completion trace (2023-11-16): ln(prompt)
    /// mean 7.00 sd 1.36, ln(output) mean 2.79 sd 0.85.
    fn default() -> Self {
        Synthetic {
            prompt_mu: 7.00,
            prompt_sigma: 1.36,
            output_mu: 2.79,
            output_sigma: 0.85,
            max_prompt: 8192,
            max_output: 2048,
        }
    }
}

impl Synthetic {
    /// Draws `n` requests, reproducibly from `seed`. Lengths are rounded to
    /// whole tokens; prompts are at least 1, outputs at least 1.
    pub fn generate(&self, n: usize, seed: u64) -> Vec<Request> {
        let mut rng = StdRng::seed_from_u64(seed);
        // Both sigmas are finite and non-negative by construction of the
        // presets; a bad one is a programming error.
        let prompt = LogNormal::new(self.prompt_mu, self.prompt_sigma).expect("valid prompt sigma");
        let output = LogNormal::new(self.output_mu, self.output_sigma).expect("valid output sigma");
        (0..n)
            .map(|id| {
                let p: f64 = prompt.sample(&mut rng);
                let o: f64 = output.sample(&mut rng);
                Request::new(
                    id,
                    (p.round() as usize).clamp(1, self.max_prompt.max(1)),
                    (o.round() as usize).clamp(1, self.max_output.max(1)),
                )
            })
            .collect()
    }
}

/// The synthetic workload with shared prompt prefixes: a few shared system
/// prompts, and multi-turn conversations that re-send their history, on
/// top of [`Synthetic`]'s lengths. Every request gets `hash_ids` (see
/// [`crate::prefix`]), so prefix caching shows without a trace.
///
/// Each request is, by a seeded draw:
///
/// * with probability `1 - turns`, a *single-shot* request with
///   [`Synthetic`]'s log-normal prompt; half of those whose prompt is
///   longer than a system prompt start with one (picked uniformly), the
///   rest of the prompt fresh content;
/// * otherwise the next *turn* of one of `open` conversations (picked
///   uniformly): a conversation's first turn is a system prompt and a user
///   message; each later turn re-sends the previous turn's prompt and
///   answer, then a new user message (log-normal, ln mean `user_mu`, sd
///   `user_sigma`). A conversation ends after a turn with probability
///   `1 / mean_turns`, or when its next prompt would pass the prompt cap;
///   a new one then takes its place.
///
/// A turn's ids are the previous turn's ids for the previous prompt's
/// full 512-token blocks, then fresh ones (its last partly filled block
/// now holds more, so it is new content); a system prompt is a whole
/// number of 512-token blocks with ids of its own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedPrefixes {
    /// Lengths of prompts and outputs (single-shot prompts, every output).
    pub lengths: Synthetic,
    /// The share of requests that are conversation turns.
    pub turns: f64,
    /// Conversations open at once.
    pub open: usize,
    /// Mean turns of a conversation.
    pub mean_turns: f64,
    /// Shared system prompts; the `i`th holds `(i + 1) * 512` tokens.
    pub system_prompts: usize,
    /// Mean of ln(user message tokens).
    pub user_mu: f64,
    /// Standard deviation of ln(user message tokens).
    pub user_sigma: f64,
}

impl Default for SharedPrefixes {
    /// Half the requests conversation turns, 32 conversations open, 4
    /// turns on average, 4 system prompts of 512 to 2,048 tokens, user
    /// messages of about e^5 = 150 tokens.
    fn default() -> Self {
        SharedPrefixes {
            lengths: Synthetic::default(),
            turns: 0.5,
            open: 32,
            mean_turns: 4.0,
            system_prompts: 4,
            user_mu: 5.0,
            user_sigma: 1.0,
        }
    }
}

/// One open conversation: its last prompt (with ids) and answer.
#[derive(Debug, Clone)]
struct Conversation {
    prompt: usize,
    output: usize,
    ids: Vec<u64>,
}

impl SharedPrefixes {
    /// Draws `n` requests, reproducibly from `seed`.
    pub fn generate(&self, n: usize, seed: u64) -> Vec<Request> {
        use rand::Rng;
        const B: usize = crate::prefix::TRACE_BLOCK;
        let mut rng = StdRng::seed_from_u64(seed);
        let l = &self.lengths;
        let prompt_d = LogNormal::new(l.prompt_mu, l.prompt_sigma).expect("valid prompt sigma");
        let output_d = LogNormal::new(l.output_mu, l.output_sigma).expect("valid output sigma");
        let user_d = LogNormal::new(self.user_mu, self.user_sigma).expect("valid user sigma");
        let max_prompt = l.max_prompt.max(1);
        let mut next_id = 0u64;
        let mut fresh = |k: usize, ids: &mut Vec<u64>| {
            ids.extend(next_id..next_id + k as u64);
            next_id += k as u64;
        };
        let systems: Vec<Vec<u64>> = (0..self.system_prompts)
            .map(|i| {
                let mut ids = Vec::new();
                fresh(i + 1, &mut ids);
                ids
            })
            .collect();
        let mut open: Vec<Option<Conversation>> = vec![None; self.open.max(1)];
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let id = out.len();
            let output = (output_d.sample(&mut rng).round() as usize).clamp(1, l.max_output.max(1));
            let user = (user_d.sample(&mut rng).round() as usize).max(1);
            let (prompt, ids) = if rng.random_bool(self.turns.clamp(0.0, 1.0)) {
                let slot = rng.random_range(0..open.len());
                let next = open[slot]
                    .as_ref()
                    .map(|c| (c.prompt + c.output + user, c))
                    .filter(|&(p, _)| p <= max_prompt);
                let (prompt, mut ids) = match next {
                    Some((prompt, c)) => {
                        let keep = c.prompt / B;
                        (prompt, c.ids[..keep].to_vec())
                    }
                    None if systems.is_empty() => (user.min(max_prompt), Vec::new()),
                    None => {
                        let s = &systems[rng.random_range(0..systems.len())];
                        ((s.len() * B + user).min(max_prompt), s.clone())
                    }
                };
                ids.truncate(prompt / B);
                let have = ids.len();
                fresh(prompt.div_ceil(B) - have, &mut ids);
                let ends = rng.random_bool((1.0 / self.mean_turns.max(1.0)).clamp(0.0, 1.0));
                open[slot] = (!ends).then(|| Conversation {
                    prompt,
                    output,
                    ids: ids.clone(),
                });
                (prompt, ids)
            } else {
                let prompt = (prompt_d.sample(&mut rng).round() as usize).clamp(1, max_prompt);
                let mut ids = Vec::new();
                if !systems.is_empty() && rng.random_bool(0.5) {
                    let s = &systems[rng.random_range(0..systems.len())];
                    if prompt > s.len() * B {
                        ids.extend_from_slice(s);
                    }
                }
                let have = ids.len();
                fresh(prompt.div_ceil(B) - have, &mut ids);
                (prompt, ids)
            };
            out.push(Request {
                id,
                prompt,
                output,
                hash_ids: Some(ids.into()),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_is_reproducible_and_shaped_like_the_trace() {
        let s = Synthetic::default();
        let a = s.generate(20_000, 7);
        assert_eq!(a, s.generate(20_000, 7));
        assert_ne!(a, s.generate(20_000, 8));
        assert!(a.iter().all(|r| (1..=8192).contains(&r.prompt)));
        assert!(a.iter().all(|r| (1..=2048).contains(&r.output)));
        assert!(a.iter().enumerate().all(|(i, r)| r.id == i));
        // Without the caps, the log-means are the fit's (rounding to whole
        // tokens shifts them a little; the draw is large).
        let uncapped = Synthetic {
            max_prompt: usize::MAX,
            max_output: usize::MAX,
            ..s
        }
        .generate(20_000, 7);
        let mean_ln = |f: fn(&Request) -> usize| {
            uncapped.iter().map(|r| (f(r) as f64).ln()).sum::<f64>() / uncapped.len() as f64
        };
        assert!((mean_ln(|r| r.prompt) - 7.0).abs() < 0.05);
        assert!((mean_ln(|r| r.output) - 2.79).abs() < 0.05);
    }

    #[test]
    fn shared_prefixes_are_reproducible_and_well_formed() {
        let w = SharedPrefixes::default();
        let a = w.generate(5_000, 7);
        assert_eq!(a, w.generate(5_000, 7));
        let mut seen = std::collections::HashSet::new();
        let mut repeated = 0;
        for (i, r) in a.iter().enumerate() {
            let ids = r.hash_ids.as_deref().unwrap();
            assert_eq!(r.id, i);
            assert!((1..=8192).contains(&r.prompt));
            assert_eq!(ids.len(), r.prompt.div_ceil(512));
            let full = &ids[..r.prompt / 512];
            repeated += full.iter().filter(|&&h| !seen.insert(h)).count();
        }
        // Shared system prompts and re-sent histories repeat blocks.
        assert!(repeated > 1_000, "{repeated}");
    }

    #[test]
    fn parses_a_good_trace_with_crlf_and_no_final_newline() {
        let t = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.97,4808,10\r\n\r\n2023-11-16 18:17:04.03,3180,0";
        let r = parse_trace(t).unwrap();
        assert_eq!(r, vec![Request::new(0, 4808, 10), Request::new(1, 3180, 0)]);
    }
}
