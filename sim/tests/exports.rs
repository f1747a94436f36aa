//! `--events FILE` and `--metrics FILE` on small runs, synthetic and the
//! Mooncake trace: the events file is one JSON batch a line, numbered
//! without a gap, each key's events alternating store and removal, and the
//! keys it leaves stored are as many as the report's cached blocks; the
//! metrics file is OpenMetrics text whose `kvslots_*` values are the
//! report's. A hybrid preset exports its hybrid layout's run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kvslots_sim::cli::{main_with, EXIT_OK};
use serde_json::Value;

fn dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kvslots-sim-exports");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `args` with `--json`, `--events` and `--metrics` to files named
/// after `name`; returns the report and the two files' text.
fn run(name: &str, args: &[&str]) -> (Value, String, String) {
    let events = dir().join(format!("{name}.jsonl"));
    let metrics = dir().join(format!("{name}.prom"));
    let mut argv: Vec<String> = ["kvslots-sim", "--json", "--events"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    argv.push(events.display().to_string());
    argv.push("--metrics".into());
    argv.push(metrics.display().to_string());
    argv.extend(args.iter().map(|s| s.to_string()));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = main_with(argv, &mut out, &mut err);
    let err = String::from_utf8_lossy(&err);
    assert_eq!(code, EXIT_OK, "{err}");
    let report: Value = serde_json::from_slice(&out).unwrap();
    (
        report,
        std::fs::read_to_string(&events).unwrap(),
        std::fs::read_to_string(&metrics).unwrap(),
    )
}

/// Checks the events file (a key's removal names its store's
/// `group_idx`); returns (stores, removals, dropped, keys stored at the
/// end).
fn check_events(text: &str) -> (u64, u64, u64, usize) {
    check_events_by_group(text).0
}

/// [`check_events`], and the `group_idx` values its events carry (`None`
/// for events without one), sorted.
fn check_events_by_group(text: &str) -> ((u64, u64, u64, usize), Vec<Option<u64>>) {
    let mut stored: HashMap<String, bool> = HashMap::new();
    let mut group_of: HashMap<String, Option<u64>> = HashMap::new();
    let mut groups: Vec<Option<u64>> = Vec::new();
    let (mut stores, mut removals, mut dropped) = (0, 0, 0);
    for (n, line) in text.lines().enumerate() {
        let batch: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("line {n}: {e}"));
        assert_eq!(batch["seq"], n as u64, "line {n}");
        assert!(
            batch["ts"].as_f64().unwrap() > 1.5e9,
            "line {n}: {}",
            batch["ts"]
        );
        let events = batch["events"].as_array().unwrap();
        assert!(!events.is_empty(), "line {n}: an empty batch");
        for (i, event) in events.iter().enumerate() {
            let kind = event["type"].as_str().unwrap();
            if n == 0 && i == 0 {
                assert_eq!(kind, "AllBlocksCleared");
                continue;
            }
            let group = event.get("group_idx").map(|g| g.as_u64().unwrap());
            if matches!(kind, "BlockStored" | "BlockRemoved") && !groups.contains(&group) {
                groups.push(group);
            }
            match kind {
                "BlockStored" => {
                    let keys = event["block_hashes"].as_array().unwrap();
                    let ids = event["block_ids"].as_array().unwrap();
                    assert_eq!(keys.len(), ids.len());
                    let bs = event["block_size"].as_u64().unwrap();
                    assert_eq!(
                        event["token_count"].as_u64().unwrap(),
                        bs * keys.len() as u64
                    );
                    let parent = &event["parent_block_hash"];
                    assert!(parent.is_null() || parent.as_str().unwrap().len() == 64);
                    for k in keys {
                        let k = k.as_str().unwrap();
                        assert_eq!(k.len(), 64);
                        if dropped == 0 {
                            let before = stored.insert(k.to_string(), true);
                            assert_ne!(before, Some(true), "line {n}: {k} stored twice");
                            group_of.insert(k.to_string(), group);
                        }
                        stores += 1;
                    }
                }
                "BlockRemoved" => {
                    for k in event["block_hashes"].as_array().unwrap() {
                        let k = k.as_str().unwrap();
                        if dropped == 0 {
                            let before = stored.insert(k.to_string(), false);
                            assert_eq!(before, Some(true), "line {n}: {k} removed unstored");
                            assert_eq!(group_of[k], group, "line {n}: {k}'s group");
                        }
                        removals += 1;
                    }
                }
                "Dropped" => dropped += event["count"].as_u64().unwrap(),
                other => panic!("line {n}: event {other}"),
            }
        }
    }
    let at_end = stored.values().filter(|&&s| s).count();
    groups.sort_unstable();
    ((stores, removals, dropped, at_end), groups)
}

/// The value of the sample `name` in OpenMetrics text.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .parse()
        .unwrap()
}

fn check_metrics(text: &str, report: &Value) {
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert_eq!(
        sample(text, "kvslots_blocks"),
        report["num_blocks"].as_f64().unwrap()
    );
    assert_eq!(
        sample(text, "kvslots_cached_blocks"),
        report["cached_blocks"].as_f64().unwrap()
    );
    assert_eq!(
        sample(text, "kvslots_evictions_total"),
        report["evictions"].as_f64().unwrap()
    );
    assert_eq!(
        sample(text, "kvslots_peak_used_blocks"),
        report["peak_blocks_used"].as_f64().unwrap()
    );
    // Every request finished and let go: nothing in use, nothing waits.
    assert_eq!(sample(text, "kvslots_used_blocks"), 0.0);
    assert_eq!(sample(text, "kvslots_waiters"), 0.0);
    assert!(text.contains("# TYPE kvslots_prefix_hit_blocks counter"));
}

#[test]
fn a_synthetic_run_exports_its_events_and_metrics() {
    let (report, events, metrics) = run(
        "synthetic",
        &[
            "--requests",
            "300",
            "--memory-gib",
            "1",
            "--workers",
            "2",
            // Rings larger than the run's events: nothing is lost.
            "--events-capacity",
            "1048576",
        ],
    );
    let ((stores, removals, dropped, at_end), groups) = check_events_by_group(&events);
    assert_eq!(groups, [None], "a plain model's events name no group");
    assert_eq!(dropped, 0);
    assert!(
        stores > 0 && removals > 0,
        "{stores} stores, {removals} removals"
    );
    assert_eq!(at_end as u64, report["cached_blocks"].as_u64().unwrap());
    assert_eq!(report["exported"]["events_dropped"], 0);
    assert_eq!(
        report["exported"]["event_batches"].as_u64().unwrap(),
        events.lines().count() as u64
    );
    assert_eq!(sample(&metrics, "kvslots_events_dropped_total"), 0.0);
    check_metrics(&metrics, &report);
}

#[test]
fn a_mooncake_run_exports_its_events_and_metrics() {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/mooncake-conversation.jsonl");
    let (report, events, metrics) = run(
        "mooncake",
        &[
            "--trace",
            trace.to_str().unwrap(),
            "--requests",
            "200",
            "--memory-gib",
            "2",
            "--workers",
            "2",
            "--events-capacity",
            "1048576",
        ],
    );
    let (stores, _, dropped, at_end) = check_events(&events);
    assert_eq!(dropped, 0);
    assert!(stores > 0);
    assert_eq!(at_end as u64, report["cached_blocks"].as_u64().unwrap());
    check_metrics(&metrics, &report);
}

/// A ring too small for the run loses events, and the file and the
/// metrics say how many.
#[test]
fn a_small_ring_reports_its_losses() {
    let (report, events, metrics) = run(
        "small-ring",
        &[
            "--requests",
            "300",
            "--memory-gib",
            "1",
            "--workers",
            "2",
            "--events-capacity",
            "16",
        ],
    );
    let (_, _, dropped, _) = check_events(&events);
    assert!(dropped > 0);
    assert_eq!(report["exported"]["events_dropped"], dropped);
    assert_eq!(
        sample(&metrics, "kvslots_events_dropped_total"),
        dropped as f64
    );
}

/// A hybrid preset's run exports the pool of its hybrid layout (its keys
/// are the groups'; the all-full twin runs on a pool of its own): the
/// keys left stored are that run's cached blocks, and the metrics its
/// pool's.
#[test]
fn a_hybrid_run_exports_its_hybrid_pool() {
    let (report, events, metrics) = run(
        "hybrid",
        &[
            "--model",
            "gpt-oss-20b",
            "--requests",
            "200",
            "--memory-gib",
            "1",
            "--workers",
            "2",
            "--events-capacity",
            "1048576",
        ],
    );
    let hybrid = &report["hybrid"];
    assert_eq!(hybrid["layout"], "1 full + 1 sliding 128");
    let ((stores, _, dropped, at_end), groups) = check_events_by_group(&events);
    assert_eq!(dropped, 0);
    assert!(stores > 0);
    // gpt-oss: a full group and a sliding one, each event naming its own.
    assert_eq!(groups, [Some(0), Some(1)]);
    assert_eq!(at_end as u64, hybrid["cached_blocks"].as_u64().unwrap());
    assert_eq!(
        report["exported"]["event_batches"].as_u64().unwrap(),
        events.lines().count() as u64
    );
    check_metrics(&metrics, hybrid);
}

/// The report names the metrics file as it was given (a path that is no
/// link is not rewritten).
#[test]
fn the_report_names_the_metrics_file_as_given() {
    std::fs::create_dir_all(dir().join("sub")).unwrap();
    let given = dir().join("sub").join("..").join("as_given.prom");
    let given = given.to_str().unwrap();
    let argv = [
        "kvslots-sim",
        "--requests",
        "50",
        "--memory-gib",
        "1",
        "--metrics",
        given,
    ];
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = main_with(argv, &mut out, &mut err);
    assert_eq!(code, EXIT_OK, "{}", String::from_utf8_lossy(&err));
    let out = String::from_utf8_lossy(&out);
    assert!(out.contains(&format!("to {given}")), "{out}");
}

/// A metrics file given as a link is written where the link points (the
/// file is replaced whole at each write: the link stays a link).
#[cfg(unix)]
#[test]
fn a_metrics_link_stays_a_link() {
    let target = dir().join("link_target.prom");
    let link = dir().join("link.prom");
    std::fs::write(&target, "").unwrap();
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let argv = [
        "kvslots-sim",
        "--json",
        "--requests",
        "50",
        "--memory-gib",
        "1",
        "--metrics",
        link.to_str().unwrap(),
    ];
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = main_with(argv, &mut out, &mut err);
    assert_eq!(code, EXIT_OK, "{}", String::from_utf8_lossy(&err));
    let meta = std::fs::symlink_metadata(&link).unwrap();
    assert!(meta.file_type().is_symlink(), "the link was replaced");
    let report: Value = serde_json::from_slice(&out).unwrap();
    check_metrics(&std::fs::read_to_string(&target).unwrap(), &report);
}
