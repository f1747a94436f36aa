//! Malformed traces: each kind is refused with an error naming the line and
//! the problem, and the binary exits with code 2 before doing any work. And
//! the binary's `--json` report on a small run.

use std::path::PathBuf;
use std::process::Command;

use kvslots_sim::workload::{parse_trace, TraceError, TRACE_HEADER};

const BIN: &str = env!("CARGO_BIN_EXE_kvslots-sim");

fn good_rows() -> String {
    format!("{TRACE_HEADER}\n2023-11-16 18:17:03.97,4808,10\n2023-11-16 18:17:04.03,3180,8\n")
}

/// Each malformed file, the error it must give, and words its message
/// must hold.
fn malformed() -> Vec<(&'static str, String, TraceError, &'static [&'static str])> {
    vec![
        (
            "missing_header",
            "2023-11-16 18:17:03.97,4808,10\n".to_string(),
            TraceError::MissingHeader {
                found: "2023-11-16 18:17:03.97,4808,10".into(),
            },
            &[
                "line 1",
                "missing header",
                "TIMESTAMP,ContextTokens,GeneratedTokens",
            ],
        ),
        (
            "empty_file",
            String::new(),
            TraceError::Empty,
            &["line 1", "empty"],
        ),
        (
            "bad_number",
            format!("{}2023-11-16 18:17:05.00,12x4,9\n", good_rows()),
            TraceError::BadNumber {
                line: 4,
                column: "ContextTokens",
                value: "12x4".into(),
            },
            &["line 4", "bad number", "ContextTokens", "12x4"],
        ),
        (
            "fractional",
            format!("{}2023-11-16 18:17:05.00,124,9.5\n", good_rows()),
            TraceError::BadNumber {
                line: 4,
                column: "GeneratedTokens",
                value: "9.5".into(),
            },
            &["line 4", "bad number", "GeneratedTokens", "9.5"],
        ),
        (
            "negative",
            format!("{}2023-11-16 18:17:05.00,124,-3\n", good_rows()),
            TraceError::Negative {
                line: 4,
                column: "GeneratedTokens",
                value: "-3".into(),
            },
            &["line 4", "negative", "GeneratedTokens", "-3"],
        ),
        (
            "negative_prompt",
            format!("{TRACE_HEADER}\n2023-11-16 18:17:05.00,-124,3\n"),
            TraceError::Negative {
                line: 2,
                column: "ContextTokens",
                value: "-124".into(),
            },
            &["line 2", "negative", "ContextTokens"],
        ),
        (
            "empty_field",
            format!("{}2023-11-16 18:17:05.00,,3\n", good_rows()),
            TraceError::EmptyField {
                line: 4,
                column: "ContextTokens",
            },
            &["line 4", "empty field", "ContextTokens"],
        ),
        (
            "empty_timestamp",
            format!("{}\n,12,3\n", good_rows()),
            TraceError::EmptyField {
                line: 5,
                column: "TIMESTAMP",
            },
            &["line 5", "empty field", "TIMESTAMP"],
        ),
        (
            "field_count",
            format!("{}2023-11-16 18:17:05.00,12\n", good_rows()),
            TraceError::FieldCount { line: 4, found: 2 },
            &["line 4", "expected 3 fields, found 2"],
        ),
        (
            "zero_prompt",
            format!("{}2023-11-16 18:17:05.00,0,3\n", good_rows()),
            TraceError::ZeroPrompt { line: 4 },
            &["line 4", "ContextTokens", "at least 1"],
        ),
        (
            "header_only",
            format!("{TRACE_HEADER}\n"),
            TraceError::NoRequests,
            &["no requests"],
        ),
    ]
}

#[test]
fn each_malformed_trace_is_refused_naming_line_and_problem() {
    for (name, text, want, words) in malformed() {
        let err = parse_trace(&text).expect_err(name);
        assert_eq!(err, want, "{name}");
        let msg = err.to_string();
        for w in words {
            assert!(msg.contains(w), "{name}: `{msg}` lacks `{w}`");
        }
    }
    // The good rows alone parse.
    assert_eq!(parse_trace(&good_rows()).unwrap().len(), 2);
}

fn write_tmp(name: &str, text: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("kvslots-sim-{name}.csv"));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn the_binary_exits_2_on_each_malformed_trace_before_any_work() {
    for (name, text, want, _) in malformed() {
        let path = write_tmp(name, &text);
        let out = Command::new(BIN)
            .arg("--trace")
            .arg(&path)
            .arg("--json")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}");
        // No report: the run never started.
        assert!(
            out.stdout.is_empty(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&want.to_string()), "{name}: {err}");
        assert!(err.contains(&path.display().to_string()), "{name}: {err}");
    }
}

#[test]
fn the_binary_exits_2_on_a_missing_file_and_bad_flags() {
    let out = Command::new(BIN)
        .args(["--trace", "/nonexistent/trace.csv"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read trace"));
    // Absurd but valid values run (and reject what can never fit).
    let out = Command::new(BIN)
        .args([
            "--requests",
            "20",
            "--memory-gib",
            "0.1",
            "--spec",
            "18446744073709551615",
        ])
        .args([
            "--chunk",
            "18446744073709551615",
            "--samples",
            "2",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["invariants_ok"], true);
    assert_eq!(
        v["requests_rejected"].as_u64().unwrap() + v["requests_completed"].as_u64().unwrap(),
        20
    );
    for bad in [
        &["--chunk", "0"][..],
        &["--samples", "0"],
        &["--workers", "0"],
        &["--accept", "1.5"],
        &["--block-size", "0"],
        &["--memory-gib", "-1"],
        &["--model", "gpt-5"],
        &["--requests", "-3"],
        &["--requests", "0"],
        &["--workers", "100000"],
        &["--kv-bytes-per-token", "0"],
        &["--shards", "0"],
        &["--shards", "1025"],
        &["--shards", "-1"],
        &["--async-depth", "65"],
        &["--async-depth", "-1"],
        &["--plant-fault", "early-release"],
        &["--plant-fault", "early-release", "--async-depth", "0"],
    ] {
        let out = Command::new(BIN).args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(out.stdout.is_empty(), "{bad:?}");
    }
}

fn json_run(args: &[&str]) -> (i32, serde_json::Value) {
    let out = Command::new(BIN).args(args).arg("--json").output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
    });
    (out.status.code().unwrap(), v)
}

#[test]
fn json_report_has_the_documented_keys_and_invariants_hold() {
    // 0.25 GiB of llama-3-8b = 128 blocks: a tight pool.
    let (code, v) = json_run(&[
        "--requests",
        "300",
        "--memory-gib",
        "0.25",
        "--workers",
        "4",
        "--spec",
        "3",
        "--samples",
        "2",
    ]);
    assert_eq!(code, 0, "{v}");
    for key in [
        "requests_completed",
        "requests_rejected",
        "preemptions",
        "peak_blocks_used",
        "num_blocks",
        "alloc_ops_per_sec",
        "append_latency_ns",
        "invariants_ok",
        "prompt_tokens",
        "prefix_hit_tokens",
        "prefix_hit_rate",
        "evictions",
        "cached_blocks",
        "pending_release_peak",
        "blocks_retired",
        "device_syncs",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {v}");
    }
    for key in ["p50", "p99", "p999", "max"] {
        assert!(v["append_latency_ns"][key].is_u64(), "missing {key}");
    }
    assert_eq!(v["invariants_ok"], true);
    assert_eq!(v["settings"]["prefix_cache"], true);
    let by_kind: u64 = v["alloc_ops"]
        .as_object()
        .unwrap()
        .values()
        .map(|o| o["calls"].as_u64().unwrap())
        .sum();
    assert_eq!(by_kind, v["alloc_calls"].as_u64().unwrap());
    assert_eq!(v["num_blocks"], 128);
    assert_eq!(v["sizing"]["kv_bytes_per_token"], 131_072);
    let done = v["requests_completed"].as_u64().unwrap() + v["requests_rejected"].as_u64().unwrap();
    assert_eq!(done, 300);
    assert!(v["peak_blocks_used"].as_u64().unwrap() <= 128);
    assert!(v["alloc_ops_per_sec"].as_f64().unwrap() > 0.0);
}

/// `--async-depth 2` on the tight pool: every invariant holds, blocks are
/// retired under the steps' fences, the peak of pending releases is
/// reported, and the table names it.
#[test]
fn async_depth_reports_the_pending_release_peak() {
    let args = [
        "--requests",
        "200",
        "--memory-gib",
        "0.25",
        "--workers",
        "3",
    ];
    let (code, v) = json_run(&[&args[..], &["--async-depth", "2"]].concat());
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["invariants_ok"], true);
    assert_eq!(v["settings"]["async_depth"], 2);
    assert!(v["blocks_retired"].as_u64().unwrap() > 0, "{v}");
    let peak = v["pending_release_peak"].as_u64().unwrap();
    assert!(peak > 0, "{v}");
    assert!(v["alloc_ops"]["complete"]["calls"].as_u64().unwrap() > 0);
    let out = Command::new(BIN)
        .args(args)
        .args(["--async-depth", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("pending release peak (blocks)"), "{table}");
    assert!(table.contains("async depth 1"), "{table}");
}

/// `--shards` reaches the pool and the settings, and a tight pool gives the
/// same results (invariants, completions) with one stack, with uneven
/// stacks and with more stacks than a worker needs.
#[test]
fn shards_flag_sets_the_free_list_stacks() {
    let (code, v) = json_run(&["--requests", "50", "--memory-gib", "0.25"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["settings"]["shards"], 2, "128 blocks: one stack per 64");
    for shards in ["1", "3", "64"] {
        let (code, v) = json_run(&[
            "--requests",
            "200",
            "--memory-gib",
            "0.25",
            "--workers",
            "4",
            "--samples",
            "2",
            "--shards",
            shards,
        ]);
        assert_eq!(code, 0, "{v}");
        assert_eq!(v["settings"]["shards"].to_string(), shards);
        assert_eq!(v["invariants_ok"], true);
        let done =
            v["requests_completed"].as_u64().unwrap() + v["requests_rejected"].as_u64().unwrap();
        assert_eq!(done, 200);
    }
}

#[test]
fn compare_runs_both_allocators_on_the_same_workload() {
    let (code, v) = json_run(&[
        "--compare",
        "--requests",
        "200",
        "--memory-gib",
        "0.5",
        "--workers",
        "4",
    ]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["kvslots"]["allocator"], "kvslots");
    assert_eq!(v["mutex"]["allocator"], "mutex");
    for side in ["kvslots", "mutex"] {
        assert_eq!(v[side]["invariants_ok"], true);
        assert_eq!(v[side]["requests"], 200);
    }
    // Same workload: the same requests complete or are rejected.
    assert_eq!(
        v["kvslots"]["requests_completed"],
        v["mutex"]["requests_completed"]
    );
    assert_eq!(
        v["kvslots"]["requests_rejected"],
        v["mutex"]["requests_rejected"]
    );
    assert!(v["ratios"]["alloc_ops_per_sec"].as_f64().unwrap() > 0.0);
    assert_eq!(v["invariants_ok"], true);
}

#[test]
fn table_report_prints_sizing_and_rows() {
    let out = Command::new(BIN)
        .args([
            "--requests",
            "50",
            "--memory-gib",
            "1",
            "--model",
            "qwen2-7b",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    // 1 GiB / (57,344 bytes x 16 tokens) = 1170 blocks.
    assert!(text.contains("qwen2-7b KV 57344 bytes/token"), "{text}");
    assert!(text.contains("-> 1170 blocks"), "{text}");
    for row in [
        "requests completed",
        "preemptions",
        "prompt tokens",
        "prefix hit tokens (rate)",
        "evictions",
        "try_append p99.9",
        "invariants",
    ] {
        assert!(text.contains(row), "{row} missing: {text}");
    }
    assert!(text.contains("ok"));
}

/// A pool in which no request can ever run is bad input: exit 2 with the
/// reason, before any work (nothing on stdout).
#[test]
fn a_pool_where_nothing_can_run_exits_2_before_any_work() {
    for (args, reason) in [
        (&["--memory-gib", "0"][..], "no block"),
        (
            &["--memory-gib", "0.25", "--watermark", "128"],
            "--watermark 128",
        ),
        (
            &["--memory-gib", "0.25", "--watermark", "500"],
            "--watermark 500",
        ),
        (
            &["--memory-gib", "0.1", "--samples", "1000000"],
            "no request",
        ),
    ] {
        let out = Command::new(BIN)
            .args(["--requests", "20", "--json"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(err.contains(reason), "{args:?}: {err}");
    }
    // A high watermark that leaves room for some prompts runs.
    let (code, v) = json_run(&[
        "--requests",
        "20",
        "--memory-gib",
        "0.25",
        "--watermark",
        "100",
    ]);
    assert_eq!(code, 0, "{v}");
}

const JSONL_GOOD: &str = "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 5, \"hash_ids\": [0, 1]}\n{\"timestamp\": 7, \"input_length\": 1100, \"output_length\": 3, \"hash_ids\": [0, 1, 2]}\n";

/// Each malformed JSONL trace: its name, text, the line the error must
/// name, and words its message must hold.
fn malformed_jsonl() -> Vec<(&'static str, String, Option<usize>, &'static [&'static str])> {
    let line3 = |l: &str| format!("{JSONL_GOOD}{l}\n");
    vec![
        (
            "bad_json",
            line3("{\"timestamp\": 0, \"input_length\": 12"),
            Some(3),
            &["line 3", "bad JSON"],
        ),
        (
            "not_an_object",
            line3("[0, 512, 3, [1]]"),
            Some(3),
            &["line 3", "expected a JSON object"],
        ),
        (
            "missing_timestamp",
            line3("{\"input_length\": 512, \"output_length\": 3, \"hash_ids\": [4]}"),
            Some(3),
            &["line 3", "missing field `timestamp`"],
        ),
        (
            "missing_input_length",
            line3("{\"timestamp\": 1, \"output_length\": 3, \"hash_ids\": [4]}"),
            Some(3),
            &["line 3", "missing field `input_length`"],
        ),
        (
            "missing_output_length",
            line3("{\"timestamp\": 1, \"input_length\": 512, \"hash_ids\": [4]}"),
            Some(3),
            &["line 3", "missing field `output_length`"],
        ),
        (
            "missing_hash_ids",
            line3("{\"timestamp\": 1, \"input_length\": 512, \"output_length\": 3}"),
            Some(3),
            &["line 3", "missing field `hash_ids`"],
        ),
        (
            "negative_input_length",
            line3("{\"timestamp\": 1, \"input_length\": -512, \"output_length\": 3, \"hash_ids\": [4]}"),
            Some(3),
            &["line 3", "negative input_length", "-512"],
        ),
        (
            "negative_hash_id",
            line3("{\"timestamp\": 1, \"input_length\": 512, \"output_length\": 3, \"hash_ids\": [-4]}"),
            Some(3),
            &["line 3", "negative hash_ids", "-4"],
        ),
        (
            "fractional_output_length",
            line3("{\"timestamp\": 1, \"input_length\": 512, \"output_length\": 2.5, \"hash_ids\": [4]}"),
            Some(3),
            &["line 3", "bad number in output_length", "2.5"],
        ),
        (
            "fractional_timestamp",
            line3("{\"timestamp\": 1.5, \"input_length\": 512, \"output_length\": 2, \"hash_ids\": [4]}"),
            Some(3),
            &["line 3", "bad number in timestamp", "1.5"],
        ),
        (
            "quoted_number",
            line3("{\"timestamp\": 1, \"input_length\": \"512\", \"output_length\": 2, \"hash_ids\": [4]}"),
            Some(3),
            &["line 3", "bad number in input_length"],
        ),
        (
            "too_many_hash_ids",
            line3("{\"timestamp\": 1, \"input_length\": 1024, \"output_length\": 2, \"hash_ids\": [4, 5, 6]}"),
            Some(3),
            &["line 3", "hash_ids holds 3 ids", "= 2"],
        ),
        (
            "too_few_hash_ids",
            line3("{\"timestamp\": 1, \"input_length\": 1025, \"output_length\": 2, \"hash_ids\": [4, 5]}"),
            Some(3),
            &["line 3", "hash_ids holds 2 ids", "= 3"],
        ),
        (
            "hash_ids_not_a_list",
            line3("{\"timestamp\": 1, \"input_length\": 512, \"output_length\": 2, \"hash_ids\": 4}"),
            Some(3),
            &["line 3", "hash_ids"],
        ),
        (
            "zero_prompt",
            line3("{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 2, \"hash_ids\": []}"),
            Some(3),
            &["line 3", "at least 1"],
        ),
        ("empty", String::new(), None, &["no requests"]),
        ("blank_lines_only", "\n \n\n".to_string(), None, &["no requests"]),
    ]
}

fn write_tmp_as(name: &str, ext: &str, text: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kvslots-sim-jsonl");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.{ext}"));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn each_malformed_jsonl_trace_is_refused_naming_line_and_problem() {
    use kvslots_sim::mooncake::parse_jsonl;
    for (name, text, line, words) in malformed_jsonl() {
        let err = parse_jsonl(&text).expect_err(name);
        assert_eq!(err.line(), line, "{name}: {err}");
        let msg = err.to_string();
        for w in words {
            assert!(msg.contains(w), "{name}: `{msg}` lacks `{w}`");
        }
    }
    let good = parse_jsonl(JSONL_GOOD).unwrap();
    assert_eq!(good.len(), 2);
    assert_eq!(good[1].hash_ids.as_deref(), Some(&[0u64, 1, 2][..]));
}

#[test]
fn the_binary_exits_2_on_each_malformed_jsonl_trace_before_any_work() {
    for (name, text, line, words) in malformed_jsonl() {
        let path = write_tmp_as(name, "jsonl", &text);
        let out = Command::new(BIN)
            .arg("--trace")
            .arg(&path)
            .arg("--json")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert!(
            out.stdout.is_empty(),
            "{name}: no report, the run never started"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&path.display().to_string()), "{name}: {err}");
        if let Some(l) = line {
            assert!(err.contains(&format!("line {l}:")), "{name}: {err}");
        }
        assert!(err.contains(words[words.len() - 1]), "{name}: {err}");
    }
}

/// The format comes from the extension, else from the content.
#[test]
fn trace_format_follows_the_extension_then_the_content() {
    use kvslots_sim::workload::{trace_format, TraceFormat};
    use std::path::Path;
    let csv = good_rows();
    assert_eq!(trace_format(Path::new("t.jsonl"), &csv), TraceFormat::Jsonl);
    assert_eq!(trace_format(Path::new("t.JSON"), &csv), TraceFormat::Jsonl);
    assert_eq!(
        trace_format(Path::new("t.csv"), JSONL_GOOD),
        TraceFormat::Csv
    );
    assert_eq!(
        trace_format(Path::new("t.txt"), JSONL_GOOD),
        TraceFormat::Jsonl
    );
    assert_eq!(trace_format(Path::new("t"), &csv), TraceFormat::Csv);
    // Read through the binary: a JSONL trace without an extension runs, and
    // a CSV trace named .jsonl is refused as bad JSON on line 1.
    let path = write_tmp_as("no_extension", "txt", JSONL_GOOD);
    let (code, v) = json_run(&["--trace", path.to_str().unwrap(), "--memory-gib", "1"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["requests_completed"], 2);
    let path = write_tmp_as("csv_named_jsonl", "jsonl", &csv);
    let out = Command::new(BIN)
        .arg("--trace")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1: bad JSON"));
}

fn conversation_trace() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../traces/mooncake-conversation.jsonl")
        .display()
        .to_string()
}

/// The conversation trace under `--compare`: both allocators report the
/// prefix-cache keys, the mutex baseline hits; `--no-prefix-cache` turns
/// the cache off.
#[test]
fn the_conversation_trace_reports_prefix_hits_and_can_turn_them_off() {
    let trace = conversation_trace();
    let args = [
        "--trace",
        trace.as_str(),
        "--requests",
        "60",
        "--memory-gib",
        "2",
        "--workers",
        "2",
        "--compare",
    ];
    let (code, v) = json_run(&args);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["settings"]["prefix_cache"], true);
    for side in ["kvslots", "mutex"] {
        for key in [
            "prompt_tokens",
            "prefix_hit_tokens",
            "prefix_hit_rate",
            "evictions",
        ] {
            assert!(v[side].get(key).is_some(), "missing {key} in {side}");
        }
        assert_eq!(v[side]["invariants_ok"], true);
        let rate = v[side]["prefix_hit_rate"].as_f64().unwrap();
        let (hit, prompt) = (
            v[side]["prefix_hit_tokens"].as_f64().unwrap(),
            v[side]["prompt_tokens"].as_f64().unwrap(),
        );
        assert!(prompt > 0.0);
        assert!((rate - hit / prompt).abs() < 1e-12);
    }
    assert!(v["mutex"]["prefix_hit_tokens"].as_u64().unwrap() > 0, "{v}");
    let (code, v) = json_run(&[&args[..], &["--no-prefix-cache"]].concat());
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["settings"]["prefix_cache"], false);
    assert_eq!(v["mutex"]["prefix_hit_tokens"], 0);
    assert_eq!(v["mutex"]["evictions"], 0);
}

/// Prefix caching needs blocks that cut the 512-token trace blocks evenly.
#[test]
fn a_block_size_that_does_not_divide_512_needs_the_cache_off() {
    let out = Command::new(BIN)
        .args(["--requests", "20", "--block-size", "24", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--block-size 24 does not divide"));
    let (code, v) = json_run(&[
        "--requests",
        "20",
        "--block-size",
        "24",
        "--no-prefix-cache",
    ]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["prefix_hit_tokens"], 0);
}
