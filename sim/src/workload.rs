//! Requests: read from a trace in the Azure LLM inference format, or drawn
//! from a seeded synthetic log-normal workload.
//!
//! The trace format is a CSV file with the header
//! `TIMESTAMP,ContextTokens,GeneratedTokens` and one request a row (prompt
//! tokens, generated tokens). The timestamps are read but not used: the
//! simulator is closed-loop and feeds requests as fast as the workers take
//! them.

use std::fmt;
use std::path::Path;

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, LogNormal};

/// One inference request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Its index in the workload, `0..len`.
    pub id: usize,
    /// Prompt (context) tokens, at least 1.
    pub prompt: usize,
    /// Tokens to generate for each sample.
    pub output: usize,
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
    /// The header is there but no request follows.
    NoRequests,
}

impl TraceError {
    /// The 1-based line the error is on, if it concerns one line.
    pub fn line(&self) -> Option<usize> {
        match *self {
            TraceError::MissingHeader { .. } => Some(1),
            TraceError::FieldCount { line, .. }
            | TraceError::EmptyField { line, .. }
            | TraceError::Negative { line, .. }
            | TraceError::BadNumber { line, .. }
            | TraceError::ZeroPrompt { line } => Some(line),
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
                write!(f, "line {line}: ContextTokens must be at least 1, found 0")
            }
            TraceError::NoRequests => f.write_str("trace has a header but no requests"),
        }
    }
}

impl std::error::Error for TraceError {}

/// Reads a trace file. See [`parse_trace`].
pub fn read_trace(path: &Path) -> Result<Vec<Request>, TraceError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| TraceError::Io(format!("{}: {e}", path.display())))?;
    parse_trace(&text)
}

/// Parses a trace in the Azure LLM inference format. The header is
/// required; blank lines (and a trailing newline, and `\r\n` endings) are
/// allowed; every other row must hold a timestamp and two non-negative whole
/// counts, the prompt at least 1.
pub fn parse_trace(text: &str) -> Result<Vec<Request>, TraceError> {
    let mut lines = text.lines().enumerate();
    let header = match lines.next() {
        Some((_, h)) => h.trim_start_matches('\u{feff}').trim(),
        None => return Err(TraceError::Empty),
    };
    if header.is_empty() && text.trim().is_empty() {
        return Err(TraceError::Empty);
    }
    if header != TRACE_HEADER {
        return Err(TraceError::MissingHeader {
            found: header.chars().take(80).collect(),
        });
    }
    let mut requests = Vec::new();
    for (index, raw) in lines {
        let line = index + 1;
        let row = raw.trim();
        if row.is_empty() {
            continue;
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
        requests.push(Request {
            id: requests.len(),
            prompt,
            output,
        });
    }
    if requests.is_empty() {
        return Err(TraceError::NoRequests);
    }
    Ok(requests)
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
            if field.starts_with('-') && field[1..].parse::<u128>().is_ok() {
                Err(TraceError::Negative {
                    line,
                    column,
                    value,
                })
            } else {
                Err(TraceError::BadNumber {
                    line,
                    column,
                    value,
                })
            }
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
                Request {
                    id,
                    prompt: (p.round() as usize).clamp(1, self.max_prompt.max(1)),
                    output: (o.round() as usize).clamp(1, self.max_output.max(1)),
                }
            })
            .collect()
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
    fn parses_a_good_trace_with_crlf_and_no_final_newline() {
        let t = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.97,4808,10\r\n\r\n2023-11-16 18:17:04.03,3180,0";
        let r = parse_trace(t).unwrap();
        assert_eq!(
            r,
            vec![
                Request {
                    id: 0,
                    prompt: 4808,
                    output: 10
                },
                Request {
                    id: 1,
                    prompt: 3180,
                    output: 0
                },
            ]
        );
    }
}
