//! The census of `kvslots-sim`'s bad inputs: every flag (a bad value, a
//! negative number, a value out of range, flags that contradict each other
//! or have no effect, a run too large for the host's memory) and every
//! trace malformation, CSV and JSONL. Each row names its exit code and the
//! words its message must hold (the flag, or the trace's line); every row
//! is refused before any work (nothing on stdout), and none exits 1, which
//! is kept for failed invariants.
//!
//! The rows run in this process through `cli::main_with`, the binary's own
//! path (parse, plan, run), with the output captured; a few rows run the
//! binary itself, for what only a process shows: clap's own exit, a report
//! written to `/dev/full`, `/dev/zero` as a trace, and a run under an
//! address-space limit. A new flag or trace field gets its rows here.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use clap::Parser;
use kvslots_sim::cli::{main_with, Cli, EXIT_BAD_INPUT, EXIT_OK, EXIT_UNWRITTEN};
use kvslots_sim::workload::{read_trace_limited, TraceLimits, MAX_LINE_BYTES, TRACE_HEADER};

const BIN: &str = env!("CARGO_BIN_EXE_kvslots-sim");

/// One bad command line: its arguments, exit code and the words its
/// message must hold.
struct Row {
    name: String,
    args: Vec<String>,
    code: i32,
    words: Vec<String>,
}

fn row(name: &str, args: &[&str], words: &[&str]) -> Row {
    Row {
        name: name.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
        code: EXIT_BAD_INPUT,
        words: words.iter().map(|w| w.to_string()).collect(),
    }
}

/// A fixed budget, so that a memory refusal does not depend on the machine.
const HOST: [&str; 2] = ["--host-memory-gib", "8"];

/// `args` with the fixed budget.
fn host(args: &[&'static str]) -> Vec<&'static str> {
    [args, &HOST[..]].concat()
}

/// Every flag's bad values.
fn flag_rows() -> Vec<Row> {
    vec![
        row("unknown flag", &["--frobnicate"], &["--frobnicate"]),
        row("a positional argument", &["trace.csv"], &["trace.csv"]),
        row(
            "--model: unknown",
            &["--model", "gpt-5"],
            &["--model", "gpt-5"],
        ),
        row("--model: missing value", &["--model"], &["--model"]),
        row(
            "--model with --kv-bytes-per-token",
            &["--model", "qwen2-7b", "--kv-bytes-per-token", "1024"],
            &["--model", "--kv-bytes-per-token"],
        ),
        row(
            "--kv-bytes-per-token: 0",
            &["--kv-bytes-per-token", "0"],
            &["--kv-bytes-per-token must be at least 1"],
        ),
        row(
            "--kv-bytes-per-token: -1",
            &["--kv-bytes-per-token", "-1"],
            &["--kv-bytes-per-token", "-1"],
        ),
        row(
            "--kv-bytes-per-token: 2^64",
            &["--kv-bytes-per-token", "18446744073709551616"],
            &["--kv-bytes-per-token"],
        ),
        row(
            "--kv-bytes-per-token: 1 (128 GiB of simulated KV memory)",
            &host(&["--kv-bytes-per-token", "1"]),
            &["--kv-bytes-per-token", "--host-memory-gib"],
        ),
        row(
            "--memory-gib: -1",
            &["--memory-gib", "-1"],
            &["--memory-gib", "-1"],
        ),
        row(
            "--memory-gib: NaN",
            &["--memory-gib", "NaN"],
            &["--memory-gib", "NaN"],
        ),
        row(
            "--memory-gib: inf",
            &["--memory-gib", "inf"],
            &["--memory-gib", "inf"],
        ),
        row(
            "--memory-gib: not a number",
            &["--memory-gib", "lots"],
            &["--memory-gib", "lots"],
        ),
        row(
            "--memory-gib: 0 (no block)",
            &["--memory-gib", "0"],
            &["no block", "--memory-gib"],
        ),
        row(
            "--memory-gib: 100000 (past the host budget)",
            &host(&["--memory-gib", "100000"]),
            &["--memory-gib 100000", "--host-memory-gib"],
        ),
        row(
            "--memory-gib: 1e12 (past the block id)",
            &["--memory-gib", "1e12"],
            &["u32 block id", "--memory-gib"],
        ),
        row(
            "--kv-bytes-per-token: u64::MAX (no block; the figures as given)",
            &["--kv-bytes-per-token", "18446744073709551615"],
            &[
                "no block",
                "18446744073709551615 bytes a token, 16 tokens a block",
            ],
        ),
        row(
            "--block-size: 0",
            &["--block-size", "0"],
            &["--block-size must be at least 1"],
        ),
        row(
            "--block-size: -1",
            &["--block-size", "-1"],
            &["--block-size", "-1"],
        ),
        row(
            "--block-size: 24 with prefix caching",
            &["--block-size", "24"],
            &["--block-size 24 does not divide"],
        ),
        row(
            "--block-size: 2^32 with prefix caching",
            &[
                "--block-size",
                "4294967296",
                "--kv-bytes-per-token",
                "1",
                "--host-memory-gib",
                "1000",
            ],
            &["--block-size 4294967296 does not divide"],
        ),
        row(
            "--block-size: 2^32 (no block)",
            &["--block-size", "4294967296", "--no-prefix-cache"],
            &["no block", "--block-size"],
        ),
        row(
            "--block-size: 2^32 at 1 byte a token (128 GiB of simulated KV memory)",
            &host(&[
                "--block-size",
                "4294967296",
                "--no-prefix-cache",
                "--kv-bytes-per-token",
                "1",
            ]),
            &["--block-size", "--host-memory-gib"],
        ),
        row(
            "--block-size: usize::MAX",
            &["--block-size", "18446744073709551615", "--no-prefix-cache"],
            &["no block", "--block-size"],
        ),
        row(
            "--no-prefix-cache: a value",
            &["--no-prefix-cache=yes"],
            &["--no-prefix-cache"],
        ),
        row(
            "--requests: 0",
            &["--requests", "0"],
            &["--requests must be at least 1"],
        ),
        row(
            "--requests: -3",
            &["--requests", "-3"],
            &["--requests", "-3"],
        ),
        row(
            "--requests: not a number",
            &["--requests", "x"],
            &["--requests"],
        ),
        row(
            "--requests: usize::MAX",
            &["--requests", "18446744073709551615"],
            &["--requests 18446744073709551615"],
        ),
        row(
            "--requests: 1e9 (past the host budget)",
            &host(&["--requests", "1000000000"]),
            &["--requests 1000000000", "--host-memory-gib"],
        ),
        row("--seed: -1", &["--seed", "-1"], &["--seed", "-1"]),
        row(
            "--seed: 2^64",
            &["--seed", "18446744073709551616"],
            &["--seed"],
        ),
        row(
            "--workers: 0",
            &["--workers", "0"],
            &["--workers must be between 1 and"],
        ),
        row("--workers: -1", &["--workers", "-1"], &["--workers", "-1"]),
        row(
            "--workers: 100000",
            &["--workers", "100000"],
            &["--workers must be between 1 and", "100000"],
        ),
        row(
            "--watermark: -1",
            &["--watermark", "-1"],
            &["--watermark", "-1"],
        ),
        row(
            "--watermark: the whole pool",
            &["--memory-gib", "0.25", "--watermark", "128"],
            &["--watermark 128"],
        ),
        row(
            "--watermark: usize::MAX",
            &["--watermark", "18446744073709551615"],
            &["--watermark 18446744073709551615"],
        ),
        row(
            "--memory-gib: a pool too small for every request",
            &["--memory-gib", "0.001953125", "--requests", "20"],
            &["no request", "1 blocks", "--memory-gib"],
        ),
        row(
            "--chunk: 0",
            &["--chunk", "0"],
            &["--chunk must be at least 1"],
        ),
        row("--chunk: -1", &["--chunk", "-1"], &["--chunk", "-1"]),
        row("--spec: -1", &["--spec", "-1"], &["--spec", "-1"]),
        row(
            "--spec: not a number",
            &["--spec", "four"],
            &["--spec", "four"],
        ),
        row(
            "--accept: 1.5",
            &["--accept", "1.5"],
            &["--accept must be a probability"],
        ),
        row(
            "--accept: -0.1",
            &["--accept", "-0.1"],
            &["--accept must be a probability"],
        ),
        row(
            "--accept: NaN",
            &["--accept", "NaN"],
            &["--accept must be a probability"],
        ),
        row(
            "--accept without drafts: --spec 0",
            &["--accept", "0.5", "--spec", "0"],
            &["--accept 0.5 has no effect", "--spec"],
        ),
        row(
            "--accept without drafts: --samples",
            &["--accept", "0.5", "--samples", "2"],
            &["--accept 0.5 has no effect", "--spec"],
        ),
        row(
            "--accept without drafts: --admission",
            &["--accept", "0.5", "--admission", "check"],
            &["--accept 0.5 has no effect", "--spec"],
        ),
        row(
            "--samples: 0",
            &["--samples", "0"],
            &["--samples must be at least 1"],
        ),
        row("--samples: -1", &["--samples", "-1"], &["--samples", "-1"]),
        row(
            "--samples: 1000000 (no request fits)",
            &[
                "--memory-gib",
                "0.1",
                "--samples",
                "1000000",
                "--requests",
                "20",
            ],
            &["no request", "1000000", "--samples"],
        ),
        row(
            "--admission: unknown",
            &["--admission", "maybe"],
            &["--admission", "maybe"],
        ),
        row(
            "--max-running: 0",
            &["--max-running", "0"],
            &["--max-running must be at least 1"],
        ),
        row(
            "--max-running: -1",
            &["--max-running", "-1"],
            &["--max-running", "-1"],
        ),
        row("--shards: 0", &["--shards", "0"], &["--shards", "0"]),
        row(
            "--shards: 1025",
            &["--shards", "1025"],
            &["--shards", "1025"],
        ),
        row("--shards: -1", &["--shards", "-1"], &["--shards", "-1"]),
        row(
            "--shards with --allocator mutex",
            &["--allocator", "mutex", "--shards", "4"],
            &["--shards 4 has no effect with --allocator mutex"],
        ),
        row(
            "--allocator: unknown",
            &["--allocator", "tbb"],
            &["--allocator", "tbb"],
        ),
        row(
            "--allocator with --compare",
            &["--compare", "--allocator", "mutex"],
            &["--compare", "--allocator"],
        ),
        row("--compare: a value", &["--compare=1"], &["--compare"]),
        row("--json: a value", &["--json=false"], &["--json"]),
        row(
            "--plant-fault: unknown",
            &["--plant-fault", "nope"],
            &["--plant-fault", "nope"],
        ),
        row(
            "--plant-fault early-release without --async-depth",
            &["--plant-fault", "early-release"],
            &["--plant-fault early-release", "--async-depth"],
        ),
        row(
            "--async-depth: 65",
            &["--async-depth", "65"],
            &["--async-depth must be at most 64"],
        ),
        row(
            "--async-depth: -1",
            &["--async-depth", "-1"],
            &["--async-depth", "-1"],
        ),
        row(
            "--stuck-after-ms: 0",
            &["--stuck-after-ms", "0"],
            &["--stuck-after-ms must be at least 1"],
        ),
        row(
            "--stuck-after-ms: -1",
            &["--stuck-after-ms", "-1"],
            &["--stuck-after-ms", "-1"],
        ),
        row(
            "--host-memory-gib: 0",
            &["--host-memory-gib", "0"],
            &["--host-memory-gib", "above 0"],
        ),
        row(
            "--host-memory-gib: -1",
            &["--host-memory-gib", "-1"],
            &["--host-memory-gib", "-1"],
        ),
        row(
            "--host-memory-gib: a budget below a hundredth of a GiB",
            &["--host-memory-gib", "0.001"],
            &["1.02 MiB of --host-memory-gib"],
        ),
        row(
            "--host-memory-gib: a budget of a few bytes",
            &["--host-memory-gib", "1e-8"],
            &["10 bytes of --host-memory-gib"],
        ),
        row(
            "--host-memory-gib: NaN",
            &["--host-memory-gib", "NaN"],
            &["--host-memory-gib", "NaN"],
        ),
        row(
            "--host-memory-gib: inf",
            &["--host-memory-gib", "inf"],
            &["--host-memory-gib", "inf"],
        ),
        row(
            "--host-memory-gib: less than the pool needs",
            &["--host-memory-gib", "0.0001"],
            &["--memory-gib 16", "--host-memory-gib"],
        ),
        row(
            "--events with --allocator mutex",
            &["--events", "/tmp/x.jsonl", "--allocator", "mutex"],
            &["--events", "--allocator mutex"],
        ),
        row(
            "--metrics with --allocator mutex",
            &["--metrics", "/tmp/x.prom", "--allocator", "mutex"],
            &["--metrics", "--allocator mutex"],
        ),
        row(
            "--events-capacity without --events",
            &["--events-capacity", "64"],
            &["--events-capacity 64", "--events FILE"],
        ),
        row(
            "--events-capacity: 0",
            &["--events", "/tmp/x.jsonl", "--events-capacity", "0"],
            &["--events-capacity must be at least 1"],
        ),
        row(
            "--events-capacity: -1",
            &["--events", "/tmp/x.jsonl", "--events-capacity", "-1"],
            &["--events-capacity", "-1"],
        ),
        row(
            "--events with --no-prefix-cache",
            &["--events", "/tmp/x.jsonl", "--no-prefix-cache"],
            &["--events", "--no-prefix-cache"],
        ),
        row(
            "--events: an unwritable path",
            &[
                "--requests",
                "10",
                "--events",
                "/nonexistent/dir/events.jsonl",
            ],
            &["--events /nonexistent/dir/events.jsonl"],
        ),
        row(
            "--metrics: a directory",
            &["--requests", "10", "--metrics", "/"],
            &["--metrics /"],
        ),
        row(
            "--events-capacity: past the host budget",
            &host(&[
                "--events",
                "/tmp/x.jsonl",
                "--events-capacity",
                "100000000000",
            ]),
            &["--events-capacity 100000000000", "lower --events-capacity"],
        ),
        row(
            // Rings of about 6 GiB: within the budget of 8 beside the
            // pool, but more than half of it.
            "--events-capacity: more than half the host budget",
            &host(&["--events", "/tmp/x.jsonl", "--events-capacity", "50000000"]),
            &["--events-capacity 50000000", "lower --events-capacity"],
        ),
        row(
            "--events-capacity: the most a usize holds",
            &[
                "--events",
                "/tmp/x.jsonl",
                "--events-capacity",
                "18446744073709551615",
            ],
            &[
                "--events-capacity 18446744073709551615",
                "lower --events-capacity",
            ],
        ),
        row(
            "--metrics: a device",
            &["--requests", "10", "--metrics", "/dev/null"],
            &["--metrics /dev/null", "not a regular file"],
        ),
        row(
            "--events and --metrics: one file",
            &[
                "--requests",
                "10",
                "--events",
                "/tmp/kvslots-census-same.out",
                "--metrics",
                "/tmp/kvslots-census-same.out",
            ],
            &["--metrics /tmp/kvslots-census-same.out is the file --events names"],
        ),
        row(
            "--trace: no such file",
            &["--trace", "/nonexistent/trace.csv"],
            &["--trace /nonexistent/trace.csv", "cannot read trace"],
        ),
        row(
            "--trace: a directory",
            &["--trace", "/"],
            &["--trace /", "cannot read trace"],
        ),
    ]
}

/// Where the census writes its traces.
fn dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kvslots-sim-census");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A malformed trace: written to `name.ext`, run with `--trace` (and
/// `extra`), refused with words that include the path and `line N:`.
fn trace_row(name: &str, ext: &str, text: &[u8], line: Option<usize>, words: &[&str]) -> Row {
    trace_row_with(name, ext, text, line, &[], words)
}

fn trace_row_with(
    name: &str,
    ext: &str,
    text: &[u8],
    line: Option<usize>,
    extra: &[&str],
    words: &[&str],
) -> Row {
    let file = format!(
        "{}.{ext}",
        name.replace(|c: char| !c.is_alphanumeric(), "_")
    );
    let path = dir().join(file);
    std::fs::write(&path, text).unwrap();
    let path = path.display().to_string();
    let mut all: Vec<String> = vec![format!("--trace {path}")];
    all.extend(line.map(|l| format!("line {l}:")));
    all.extend(words.iter().map(|w| w.to_string()));
    let mut args = vec!["--trace".to_string(), path];
    args.extend(extra.iter().map(|a| a.to_string()));
    Row {
        name: format!("{ext} trace: {name}"),
        args,
        code: EXIT_BAD_INPUT,
        words: all,
    }
}

/// Two good CSV rows after the header (lines 2 and 3).
fn csv_good() -> String {
    format!("{TRACE_HEADER}\n2023-11-16 18:17:03.97,4808,10\n2023-11-16 18:17:04.03,3180,8\n")
}

/// Every CSV malformation.
fn csv_rows() -> Vec<Row> {
    let line4 = |l: &str| format!("{}{l}\n", csv_good()).into_bytes();
    let long = format!("{}x,{},1\n", csv_good(), "1".repeat(MAX_LINE_BYTES));
    vec![
        // A good trace, but one that names no prompt content: no prefix
        // cache changes to report.
        trace_row_with(
            "events without prompt content",
            "csv",
            csv_good().as_bytes(),
            None,
            &["--events", "/tmp/x.jsonl"],
            &["--events", "hash_ids"],
        ),
        trace_row("empty file", "csv", b"", Some(1), &["empty file"]),
        trace_row(
            "only blank lines",
            "csv",
            b"\n  \n\n",
            Some(1),
            &["empty file"],
        ),
        trace_row(
            "no header",
            "csv",
            b"2023-11-16 18:17:03.97,4808,10\n",
            Some(1),
            &["missing header", TRACE_HEADER],
        ),
        trace_row(
            "a blank line before the header",
            "csv",
            format!("\n{}", csv_good()).as_bytes(),
            Some(1),
            &["missing header"],
        ),
        trace_row(
            "another header",
            "csv",
            b"time,prompt,output\n1,2,3\n",
            Some(1),
            &["missing header", "time,prompt,output"],
        ),
        trace_row(
            "header only",
            "csv",
            format!("{TRACE_HEADER}\n").as_bytes(),
            None,
            &["no requests"],
        ),
        trace_row(
            "two fields",
            "csv",
            &line4("x,12"),
            Some(4),
            &["expected 3 fields, found 2"],
        ),
        trace_row(
            "four fields",
            "csv",
            &line4("x,12,3,4"),
            Some(4),
            &["expected 3 fields, found 4"],
        ),
        trace_row(
            "empty timestamp",
            "csv",
            &line4(",12,3"),
            Some(4),
            &["empty field TIMESTAMP"],
        ),
        trace_row(
            "empty prompt",
            "csv",
            &line4("x,,3"),
            Some(4),
            &["empty field ContextTokens"],
        ),
        trace_row(
            "empty output",
            "csv",
            &line4("x,12,"),
            Some(4),
            &["empty field GeneratedTokens"],
        ),
        trace_row(
            "bad number",
            "csv",
            &line4("x,12x4,9"),
            Some(4),
            &["bad number in ContextTokens", "12x4"],
        ),
        trace_row(
            "fractional",
            "csv",
            &line4("x,124,9.5"),
            Some(4),
            &["bad number in GeneratedTokens", "9.5"],
        ),
        trace_row(
            "negative output",
            "csv",
            &line4("x,124,-3"),
            Some(4),
            &["negative GeneratedTokens", "-3"],
        ),
        trace_row(
            "negative prompt",
            "csv",
            &line4("x,-124,3"),
            Some(4),
            &["negative ContextTokens", "-124"],
        ),
        trace_row(
            "a count past 2^64",
            "csv",
            &line4("x,18446744073709551616,3"),
            Some(4),
            &["bad number in ContextTokens"],
        ),
        trace_row(
            "zero prompt",
            "csv",
            &line4("x,0,3"),
            Some(4),
            &["ContextTokens", "at least 1"],
        ),
        trace_row(
            "not UTF-8",
            "csv",
            &[csv_good().as_bytes(), b"x,1\xff2,3\n"].concat(),
            Some(4),
            &["not UTF-8", "byte 4"],
        ),
        trace_row(
            "a line longer than MAX_LINE_BYTES",
            "csv",
            long.as_bytes(),
            Some(4),
            &["longer than 1048576 bytes"],
        ),
        trace_row_with(
            "more requests than the host budget holds",
            "csv",
            format!("{TRACE_HEADER}\n{}", "x,16,1\n".repeat(5000)).as_bytes(),
            None,
            &["--memory-gib", "0.25", "--host-memory-gib", "0.0001"],
            &["requests before it already take", "--requests"],
        ),
    ]
}

/// Two good JSONL lines.
const JSONL_GOOD: &str = "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 5, \"hash_ids\": [0, 1]}\n{\"timestamp\": 7, \"input_length\": 1100, \"output_length\": 3, \"hash_ids\": [0, 1, 2]}\n";

/// Every JSONL malformation (on line 3, after two good lines).
fn jsonl_rows() -> Vec<Row> {
    let line3 = |l: &str| format!("{JSONL_GOOD}{l}\n").into_bytes();
    let obj = |fields: &str| line3(&format!("{{{fields}}}"));
    let bad =
        |name: &str, text: Vec<u8>, words: &[&str]| trace_row(name, "jsonl", &text, Some(3), words);
    let long = format!(
        "{JSONL_GOOD}{{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1], \"pad\": \"{}\"}}\n",
        "x".repeat(MAX_LINE_BYTES)
    );
    vec![
        trace_row("empty file", "jsonl", b"", None, &["no requests"]),
        trace_row("only blank lines", "jsonl", b"\n \n\n", None, &["no requests"]),
        bad("bad JSON", line3("{\"timestamp\": 0, \"input_length\": 12"), &["bad JSON"]),
        bad("trailing text", line3("{\"timestamp\": 0} extra"), &["bad JSON"]),
        bad("an array", line3("[0, 512, 3, [1]]"), &["expected a JSON object"]),
        bad("a number", line3("42"), &["expected a JSON object"]),
        bad("a string", line3("\"hello\""), &["expected a JSON object"]),
        bad("null", line3("null"), &["expected a JSON object"]),
        bad(
            "missing timestamp",
            obj("\"input_length\": 512, \"output_length\": 3, \"hash_ids\": [4]"),
            &["missing field `timestamp`"],
        ),
        bad(
            "missing input_length",
            obj("\"timestamp\": 1, \"output_length\": 3, \"hash_ids\": [4]"),
            &["missing field `input_length`"],
        ),
        bad(
            "missing output_length",
            obj("\"timestamp\": 1, \"input_length\": 512, \"hash_ids\": [4]"),
            &["missing field `output_length`"],
        ),
        bad(
            "missing hash_ids",
            obj("\"timestamp\": 1, \"input_length\": 512, \"output_length\": 3"),
            &["missing field `hash_ids`"],
        ),
        bad(
            "duplicate input_length",
            obj("\"timestamp\": 1, \"input_length\": 512, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [4]"),
            &["the field `input_length` is given twice"],
        ),
        bad(
            "duplicate hash_ids",
            obj("\"timestamp\": 1, \"input_length\": 512, \"output_length\": 3, \"hash_ids\": [4], \"hash_ids\": [5]"),
            &["the field `hash_ids` is given twice"],
        ),
        bad(
            "duplicate unknown field",
            obj("\"timestamp\": 1, \"input_length\": 512, \"output_length\": 3, \"hash_ids\": [4], \"x\": 1, \"x\": 2"),
            &["the field `x` is given twice"],
        ),
        bad(
            "negative input_length",
            obj("\"timestamp\": 1, \"input_length\": -512, \"output_length\": 3, \"hash_ids\": [4]"),
            &["negative input_length", "-512"],
        ),
        bad(
            "negative timestamp",
            obj("\"timestamp\": -1, \"input_length\": 512, \"output_length\": 3, \"hash_ids\": [4]"),
            &["negative timestamp"],
        ),
        bad(
            "negative hash id",
            obj("\"timestamp\": 1, \"input_length\": 512, \"output_length\": 3, \"hash_ids\": [-4]"),
            &["negative hash_ids", "-4"],
        ),
        bad(
            "fractional output_length",
            obj("\"timestamp\": 1, \"input_length\": 512, \"output_length\": 2.5, \"hash_ids\": [4]"),
            &["bad number in output_length", "2.5"],
        ),
        bad(
            "fractional timestamp",
            obj("\"timestamp\": 1.5, \"input_length\": 512, \"output_length\": 2, \"hash_ids\": [4]"),
            &["bad number in timestamp", "1.5"],
        ),
        bad(
            "a count past 2^64",
            obj("\"timestamp\": 1, \"input_length\": 1e30, \"output_length\": 2, \"hash_ids\": [4]"),
            &["bad number in input_length", "`1e30`"],
        ),
        bad(
            "a whole count in a float's form, shown as written",
            obj("\"timestamp\": 1, \"input_length\": 5.12E2, \"output_length\": 2, \"hash_ids\": [4]"),
            &["bad number in input_length", "`5.12E2`"],
        ),
        bad(
            "a hash id in a float's form, shown as written",
            obj("\"timestamp\": 1, \"input_length\": 512, \"output_length\": 2, \"hash_ids\": [4e0]"),
            &["bad number in hash_ids", "`4e0`"],
        ),
        bad(
            "a negative count in a float's form, shown as written",
            obj("\"timestamp\": 1, \"input_length\": -5e2, \"output_length\": 2, \"hash_ids\": [4]"),
            &["negative input_length", "`-5e2`"],
        ),
        bad(
            "a quoted number",
            obj("\"timestamp\": 1, \"input_length\": \"512\", \"output_length\": 2, \"hash_ids\": [4]"),
            &["bad number in input_length"],
        ),
        bad(
            "a boolean count",
            obj("\"timestamp\": 1, \"input_length\": 512, \"output_length\": true, \"hash_ids\": [4]"),
            &["bad number in output_length"],
        ),
        bad(
            "a hash id that is not a number",
            obj("\"timestamp\": 1, \"input_length\": 512, \"output_length\": 2, \"hash_ids\": [\"a\"]"),
            &["bad number in hash_ids"],
        ),
        bad(
            "hash_ids not a list",
            obj("\"timestamp\": 1, \"input_length\": 512, \"output_length\": 2, \"hash_ids\": 4"),
            &["hash_ids"],
        ),
        bad(
            "too many hash ids",
            obj("\"timestamp\": 1, \"input_length\": 1024, \"output_length\": 2, \"hash_ids\": [4, 5, 6]"),
            &["hash_ids holds 3 ids", "= 2"],
        ),
        bad(
            "too few hash ids",
            obj("\"timestamp\": 1, \"input_length\": 1025, \"output_length\": 2, \"hash_ids\": [4, 5]"),
            &["hash_ids holds 2 ids", "= 3"],
        ),
        bad(
            "zero prompt",
            obj("\"timestamp\": 1, \"input_length\": 0, \"output_length\": 2, \"hash_ids\": []"),
            &["at least 1"],
        ),
        bad(
            "not UTF-8",
            [JSONL_GOOD.as_bytes(), b"{\"timestamp\": 1, \"x\": \"\xc3\x28\"}\n"].concat(),
            &["not UTF-8", "byte 24"],
        ),
        trace_row(
            "a line longer than MAX_LINE_BYTES",
            "jsonl",
            long.as_bytes(),
            Some(3),
            &["longer than 1048576 bytes"],
        ),
        trace_row(
            "a CSV trace named .jsonl",
            "jsonl",
            csv_good().as_bytes(),
            Some(1),
            &["bad JSON"],
        ),
        trace_row(
            "JSONL told by its content, malformed",
            "txt",
            &line3("{\"timestamp\": 1}"),
            Some(3),
            &["missing field `input_length`"],
        ),
    ]
}

/// Runs `args` through the binary's path in this process: exit code,
/// stdout, stderr.
fn run_in_process(args: &[String]) -> (i32, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let argv = std::iter::once("kvslots-sim".to_string()).chain(args.iter().cloned());
    let code = main_with(argv, &mut out, &mut err);
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

/// Checks one row; returns what is wrong, if anything.
fn check(row: &Row) -> Result<(), String> {
    // A command line the plan accepts would start a run: say so at once.
    let argv = std::iter::once("kvslots-sim".to_string()).chain(row.args.iter().cloned());
    if let Ok(cli) = Cli::try_parse_from(argv) {
        if cli.plan().is_ok() {
            return Err("accepted: the run would start".into());
        }
    }
    let (code, out, err) = run_in_process(&row.args);
    if code != row.code {
        return Err(format!("exit code {code}, expected {}: {err}", row.code));
    }
    if !out.is_empty() {
        return Err(format!("wrote a report: {out}"));
    }
    match row.words.iter().find(|w| !err.contains(w.as_str())) {
        Some(w) => Err(format!("the message lacks `{w}`: {err}")),
        None => Ok(()),
    }
}

fn census(rows: Vec<Row>) {
    let mut names = std::collections::HashSet::new();
    let failed: Vec<String> = rows
        .iter()
        .inspect(|r| assert!(names.insert(r.name.clone()), "two rows named {}", r.name))
        .filter_map(|r| {
            check(r)
                .err()
                .map(|e| format!("{} ({:?}): {e}", r.name, r.args))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} rows failed:\n{}",
        failed.len(),
        rows.len(),
        failed.join("\n")
    );
}

#[test]
fn census_of_the_flags() {
    census(flag_rows());
}

#[test]
fn census_of_csv_traces() {
    census(csv_rows());
}

#[test]
fn census_of_jsonl_traces() {
    census(jsonl_rows());
}

/// `--samples` past memory, where the requests do fit the pool (prompts of
/// whole blocks and no output, so that forks need no block of their own):
/// refused naming `--samples`, not a worker's panic.
#[test]
fn census_of_samples_past_memory() {
    let path = dir().join("whole_blocks.csv");
    std::fs::write(&path, format!("{TRACE_HEADER}\nx,16,0\nx,32,0\n")).unwrap();
    let path = path.to_str().unwrap();
    census(vec![
        row(
            "1e12 samples",
            &["--trace", path, "--samples", "1000000000000"],
            &["--samples 1000000000000", "lower --samples"],
        ),
        row(
            "usize::MAX samples",
            &[
                "--trace",
                path,
                "--samples",
                "18446744073709551615",
                "--workers",
                "1",
            ],
            &["--samples 18446744073709551615", "lower --samples"],
        ),
    ]);
}

/// `--seed` where nothing is drawn (a trace, no draft tokens, no mix) is
/// refused; where something is (the mix, drafts, a synthetic workload) it
/// is accepted, and the plan carries it.
#[test]
fn census_of_a_seed_without_effect() {
    let path = dir().join("seed_trace.csv");
    std::fs::write(
        &path,
        format!(
            "{TRACE_HEADER}
x,16,4
x,32,4
"
        ),
    )
    .unwrap();
    let path = path.to_str().unwrap();
    census(vec![
        row(
            "--seed with a trace and --spec 0",
            &["--trace", path, "--spec", "0", "--seed", "7"],
            &["--seed 7 has no effect", "--spec"],
        ),
        row(
            "--seed with a trace and --samples",
            &["--trace", path, "--samples", "2", "--seed", "7"],
            &["--seed 7 has no effect", "--spec"],
        ),
    ]);
    for args in [
        vec!["--trace", path, "--seed", "7"],
        vec!["--trace", path, "--spec", "2", "--seed", "7"],
        vec!["--requests", "10", "--seed", "7"],
    ] {
        let argv = std::iter::once("kvslots-sim").chain(args.iter().copied());
        let plan = Cli::try_parse_from(argv).unwrap().plan();
        let plan = plan.unwrap_or_else(|e| panic!("{args:?}: {e:?}"));
        assert_eq!(plan.engine.seed, 7, "{args:?}");
    }
}

/// The stall guard leaves a long request the iterations it needs: the
/// limit is at least twice the longest runnable request's tokens (a worker
/// may step through one a token an iteration), else the engine's default.
#[test]
fn the_stall_limit_covers_the_longest_request() {
    let default = kvslots_sim::engine::EngineConfig::default().stall_limit;
    // A request that can never run (refused without a step) does not lift
    // it: beside a short one, the limit stays the default.
    let never = format!("0,1,5\n1,1,{}", u64::MAX);
    let cases = [
        ("short", "0,1,5".to_string(), default),
        ("long", "0,1,25000000".to_string(), 50_000_002),
        ("never_fits", never, default),
    ];
    for (name, rows, limit) in cases {
        let path = dir().join(format!("stall_limit_{name}.csv"));
        std::fs::write(&path, format!("{TRACE_HEADER}\n{rows}\n")).unwrap();
        let path = path.display().to_string();
        // A pool that holds the long request (1 byte a token).
        let argv = [
            "kvslots-sim",
            "--trace",
            path.as_str(),
            "--kv-bytes-per-token",
            "1",
            "--memory-gib",
            "0.03",
        ];
        let plan = Cli::try_parse_from(argv).unwrap().plan();
        let plan = plan.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(plan.engine.stall_limit, limit, "{name}");
    }
}

/// An export that is the trace is refused before the trace is touched.
#[test]
fn an_export_that_is_the_trace_is_refused() {
    // A Mooncake trace: `--events` needs prompts whose content is named.
    let text =
        "{\"timestamp\": 0, \"input_length\": 16, \"output_length\": 4, \"hash_ids\": [0]}\n";
    for flag in ["--events", "--metrics"] {
        let path = dir().join(format!("export_is_trace{flag}.jsonl"));
        std::fs::write(&path, text).unwrap();
        let path = path.display().to_string();
        let argv = ["kvslots-sim", "--trace", path.as_str(), flag, path.as_str()];
        let e = Cli::try_parse_from(argv).unwrap().plan().unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("{flag} {path} is the file --trace names")),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }
}

/// An export that is the trace through another name is refused too: a
/// hard link to the trace, or the trace (or the events file) as the file
/// the metrics are written through (`FILE.tmp`, renamed over `FILE`).
/// Nothing is touched.
#[cfg(unix)]
#[test]
fn an_export_that_is_the_trace_by_another_name_is_refused() {
    let text =
        "{\"timestamp\": 0, \"input_length\": 16, \"output_length\": 4, \"hash_ids\": [0]}\n";
    let trace = dir().join("export_by_another_name.jsonl");
    std::fs::write(&trace, text).unwrap();
    let link = dir().join("export_by_another_name.link.jsonl");
    let _ = std::fs::remove_file(&link);
    std::fs::hard_link(&trace, &link).unwrap();
    let (trace_s, link_s) = (trace.display().to_string(), link.display().to_string());
    for flag in ["--events", "--metrics"] {
        let argv = [
            "kvslots-sim",
            "--trace",
            trace_s.as_str(),
            flag,
            link_s.as_str(),
        ];
        let e = Cli::try_parse_from(argv).unwrap().plan().unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("{flag} {link_s} is the file --trace names")),
            "{e}"
        );
    }
    // The trace, and then the events file, at `METRICS.tmp`.
    let metrics = dir().join("export_by_another_name.prom");
    let tmp = dir().join("export_by_another_name.prom.tmp");
    std::fs::copy(&trace, &tmp).unwrap();
    let (metrics_s, tmp_s) = (metrics.display().to_string(), tmp.display().to_string());
    let as_trace = vec!["kvslots-sim", "--trace", &tmp_s, "--metrics", &metrics_s];
    let as_events = vec![
        "kvslots-sim",
        "--trace",
        &trace_s,
        "--events",
        &tmp_s,
        "--metrics",
        &metrics_s,
    ];
    for (argv, names) in [(as_trace, "--trace"), (as_events, "--events")] {
        let e = Cli::try_parse_from(argv).unwrap().plan().unwrap_err();
        assert!(
            e.to_string().contains(&format!(
                "the metrics are written through {tmp_s}, the file {names} names"
            )),
            "{e}"
        );
    }
    assert_eq!(std::fs::read_to_string(&trace).unwrap(), text);
    assert_eq!(std::fs::read_to_string(&tmp).unwrap(), text);
}

/// A metrics file whose `FILE.tmp` is there and is not a regular file (a
/// dangling link here; a pipe would block the write) is refused before any
/// work, and the link is left as it was.
#[cfg(unix)]
#[test]
fn a_metrics_tmp_that_is_not_a_regular_file_is_refused() {
    let metrics = dir().join("metrics_tmp_link.prom");
    let tmp = dir().join("metrics_tmp_link.prom.tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(dir().join("metrics_tmp_link.nowhere"), &tmp).unwrap();
    let metrics_s = metrics.display().to_string();
    let argv = [
        "kvslots-sim",
        "--requests",
        "10",
        "--metrics",
        metrics_s.as_str(),
    ];
    let e = Cli::try_parse_from(argv).unwrap().plan().unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    assert!(std::fs::symlink_metadata(&tmp).unwrap().is_symlink());
    assert!(!dir().join("metrics_tmp_link.nowhere").exists());
}

/// A metrics file that can be opened but not replaced (the file it is
/// written through cannot be created beside it) is refused before any
/// work, naming `--metrics`, not found unwritable after the run.
#[cfg(target_os = "linux")]
#[test]
fn a_metrics_file_that_cannot_be_replaced_is_refused() {
    // `/proc/version` opens for writing as root (as another user it is
    // refused at the open); nothing can be created beside it.
    let argv = [
        "kvslots-sim",
        "--requests",
        "10",
        "--metrics",
        "/proc/version",
    ];
    let e = Cli::try_parse_from(argv).unwrap().plan().unwrap_err();
    assert!(e.to_string().starts_with("--metrics /proc/version"), "{e}");
    let opens = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/version")
        .is_ok();
    if opens {
        assert!(
            e.to_string()
                .contains("written through /proc/version.tmp, which cannot be written"),
            "{e}"
        );
    }
}

/// The harness fails a row that does not hold.
#[test]
fn the_census_catches_a_wrong_row() {
    let accepted = row(
        "accepted",
        &["--requests", "1", "--memory-gib", "0.25"],
        &[],
    );
    assert_eq!(
        check(&accepted).unwrap_err(),
        "accepted: the run would start"
    );
    let wrong_words = row("wrong words", &["--chunk", "0"], &["--workers"]);
    assert!(check(&wrong_words)
        .unwrap_err()
        .contains("lacks `--workers`"));
    let wrong_code = Row {
        code: 1,
        ..row("wrong code", &["--chunk", "0"], &[])
    };
    assert!(check(&wrong_code)
        .unwrap_err()
        .contains("exit code 2, expected 1"));
}

/// `--requests N` reads a trace up to its Nth request: what comes after is
/// not read (a malformed line there is not refused), and memory stays
/// bounded by N.
#[test]
fn requests_stop_the_reading_of_a_trace() {
    let path = dir().join("stops.csv");
    std::fs::write(&path, format!("{}x,oops,1\n", csv_good())).unwrap();
    let limits = |requests| TraceLimits {
        requests,
        bytes: usize::MAX,
    };
    assert_eq!(read_trace_limited(&path, limits(2)).unwrap().len(), 2);
    let err = read_trace_limited(&path, limits(3)).unwrap_err();
    assert_eq!(err.line(), Some(4), "{err}");
}

/// What only a process shows: the binary's own exits.
#[test]
fn the_binary_agrees() {
    let bin = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // clap's own exit, in colour or not.
    let (code, out, err) = bin(&["--workers", "-1"]);
    assert_eq!((code, out.as_str()), (Some(EXIT_BAD_INPUT), ""));
    assert!(err.contains("--workers") && err.contains("-1"), "{err}");
    // A refusal of the plan.
    let (code, out, err) = bin(&["--chunk", "0"]);
    assert_eq!((code, out.as_str()), (Some(EXIT_BAD_INPUT), ""));
    assert!(err.contains("--chunk must be at least 1"), "{err}");
    // `--help` is not an error.
    let (code, out, _) = bin(&["--help"]);
    assert_eq!(code, Some(EXIT_OK));
    assert!(out.contains("--host-memory-gib"), "{out}");
}

/// A report that cannot be written: exit 3 (the run itself passed), in
/// this process and from the binary with its stdout on `/dev/full`.
#[test]
fn an_unwritable_report_exits_3() {
    struct Full;
    impl std::io::Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "full"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let args = ["--requests", "20", "--memory-gib", "0.25", "--workers", "2"];
    for json in [false, true] {
        let mut err = Vec::new();
        let argv = ["kvslots-sim"]
            .iter()
            .chain(&args)
            .chain(json.then_some(&"--json"));
        let code = main_with(argv, &mut Full, &mut err);
        let err = String::from_utf8_lossy(&err);
        assert_eq!(code, EXIT_UNWRITTEN, "{err}");
        assert!(err.contains("cannot write the report"), "{err}");
    }
    if std::path::Path::new("/dev/full").exists() {
        let out = Command::new(BIN)
            .args(args)
            .stdout(std::fs::File::create("/dev/full").unwrap())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(EXIT_UNWRITTEN));
        assert!(String::from_utf8_lossy(&out.stderr).contains("cannot write the report"));
        // Exports that cannot be written: exit 3 too, and the report is
        // written all the same.
        let out = Command::new(BIN)
            .args(args)
            .args(["--json", "--events", "/dev/full"])
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(EXIT_UNWRITTEN));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("cannot write the exports: --events /dev/full: "),
            "{stderr}"
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["invariants_ok"], true);
    }
}

/// A report to a pipe whose reader has gone (a `| head` that exited):
/// exit 3. Standard output not open at all (`>&-`) is another case: Rust's
/// runtime opens `/dev/null` there before `main`, so the report is
/// written to it and the run exits 0 (sim/README.md says so).
#[test]
#[cfg(unix)]
fn a_report_to_a_closed_pipe_exits_3() {
    let args = ["--requests", "20", "--memory-gib", "0.25", "--workers", "2"];
    for json in [false, true] {
        let mut child = Command::new(BIN)
            .args(args)
            .args(json.then_some("--json"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(EXIT_UNWRITTEN), "{stderr}");
        assert!(
            stderr.contains("cannot write the report: Broken pipe"),
            "{stderr}"
        );
    }
    let out = Command::new("sh")
        .arg("-c")
        .arg("exec \"$0\" \"$@\" >&-")
        .arg(BIN)
        .args(args)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(EXIT_OK));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

/// `/dev/zero` as a trace (a line that never ends) and a pool the
/// allocator refuses, under an address-space limit of 1 GiB: refused with
/// exit 2 naming the flag, never an abort.
#[test]
#[cfg(target_os = "linux")]
fn memory_stays_bounded_under_an_address_space_limit() {
    let limited = |args: &[&str]| {
        let out = Command::new("sh")
            .arg("-c")
            .arg("ulimit -v 1048576 && exec \"$0\" \"$@\"")
            .arg(BIN)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = limited(&["--trace", "/dev/zero"]);
    assert_eq!(code, Some(EXIT_BAD_INPUT), "{err}");
    assert!(
        err.contains("--trace /dev/zero: line 1: longer than"),
        "{err}"
    );
    // The estimate lets 6 GiB through (the budget says 100); the allocator
    // does not.
    let (code, err) = limited(&[
        "--memory-gib",
        "100000",
        "--host-memory-gib",
        "100",
        "--requests",
        "20",
    ]);
    assert_eq!(code, Some(EXIT_BAD_INPUT), "{err}");
    assert!(
        err.contains("cannot allocate") && err.contains("--memory-gib"),
        "{err}"
    );
}

/// Every scheduler flag reaches the engine's settings, each with a value
/// other than its default (so that a flag the plan dropped would show as
/// the default).
#[test]
fn every_scheduler_flag_reaches_the_engine() {
    use kvslots_sim::engine::{Admission, EngineConfig, IdleWait};
    let argv = [
        "kvslots-sim",
        "--requests",
        "10",
        "--admission",
        "check",
        "--idle-wait",
        "poll",
        "--workers",
        "3",
        "--watermark",
        "5",
        "--chunk",
        "64",
        "--spec",
        "3",
        "--accept",
        "0.25",
        "--samples",
        "2",
        "--max-running",
        "7",
        "--seed",
        "11",
        "--async-depth",
        "2",
        "--stuck-after-ms",
        "1234",
        "--no-prefix-cache",
        "--host-memory-gib",
        "8",
    ];
    let plan = Cli::try_parse_from(argv).unwrap().plan();
    let e = plan.unwrap_or_else(|e| panic!("{e:?}")).engine;
    let default = EngineConfig::default();
    let got = (
        e.admission,
        e.idle_wait,
        e.workers,
        e.watermark_blocks,
        e.chunk,
        e.spec,
        e.accept,
        e.samples,
        e.max_running,
        e.seed,
        e.async_depth,
        e.stuck_after,
    );
    let want = (
        Admission::Check,
        IdleWait::Poll,
        3,
        5,
        64,
        3,
        0.25,
        2,
        7,
        11,
        2,
        std::time::Duration::from_millis(1234),
    );
    assert_eq!(got, want);
    assert!(!e.mix && !e.prefix_cache && !e.publish_chunks);
    assert_eq!(e.groups, default.groups);
    // The defaults this test's values differ from.
    assert_ne!(default.admission, want.0);
    assert_ne!(default.idle_wait, want.1);
    assert_ne!(
        (default.chunk, default.max_running, default.async_depth),
        (64, 7, 2)
    );
    assert_ne!(default.stuck_after, want.11);

    // The default mix, prefix caching, and a hybrid model's groups, which
    // publish every chunk.
    let argv = [
        "kvslots-sim",
        "--requests",
        "10",
        "--model",
        "gpt-oss-20b",
        "--host-memory-gib",
        "8",
    ];
    let plan = Cli::try_parse_from(argv).unwrap().plan();
    let plan = plan.unwrap_or_else(|e| panic!("{e:?}"));
    let e = plan.engine;
    assert!(e.mix && e.prefix_cache && e.publish_chunks);
    assert_eq!(e.groups, plan.hybrid.expect("a hybrid model").layout.groups);
    assert_ne!(e.groups, default.groups);

    // A trace that names no prompt content has nothing to cache: the
    // prefix cache is off, as `--help` says, and the report says so.
    let path = dir().join("engine_flags_csv.csv");
    std::fs::write(&path, format!("{TRACE_HEADER}\n0,20,4\n")).unwrap();
    let path = path.display().to_string();
    let argv = [
        "kvslots-sim",
        "--trace",
        path.as_str(),
        "--host-memory-gib",
        "8",
    ];
    let plan = Cli::try_parse_from(argv).unwrap().plan();
    assert!(!plan.unwrap_or_else(|e| panic!("{e:?}")).engine.prefix_cache);
}
