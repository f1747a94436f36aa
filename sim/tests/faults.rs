//! The check of the checker: every planted fault (`--plant-fault KIND`)
//! makes a small run fail with a non-zero exit code, promptly, naming what
//! failed; and the same run without a fault passes.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kvslots_sim::cli::Fault;

const BIN: &str = env!("CARGO_BIN_EXE_kvslots-sim");

/// A small run of the default mix (forks, drafts, check-only admission) on
/// a pool of 2,048 blocks (4 GiB of llama-3-8b: roomy enough that a leaked
/// sequence starves no request), with a short watchdog (2 s, well above
/// the time a panic's report takes).
const SMALL: &[&str] = &[
    "--requests",
    "1500",
    "--memory-gib",
    "4",
    "--workers",
    "3",
    "--stuck-after-ms",
    "2000",
    "--json",
];

/// The longest a small run may take before it counts as hung (far above
/// what one takes, even on a busy debug machine).
const HUNG: Duration = Duration::from_secs(120);

/// Runs the binary, killing it if it outlives [`HUNG`]; `None` then.
fn run_bounded(args: &[&str]) -> Option<Output> {
    // Without backtraces, a panic's report is quick (the watchdog counts
    // the time the panic hook takes as time inside the call).
    let mut child = Command::new(BIN)
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the simulator");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("poll the simulator").is_some() {
            return Some(child.wait_with_output().expect("collect its output"));
        }
        if start.elapsed() > HUNG {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        // A poll interval for a deadline, not a synchronisation.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the report must name for each fault (a leak may be named instead
/// by [`one_reference_too_many_at_a_give_back`]).
fn names(fault: Fault) -> &'static str {
    match fault {
        Fault::ShortAppend => "mapped to slot",
        Fault::SharedForkTail => "held by 2 live sequences but the pool counts 1",
        Fault::Leak => "held by 0 sequences, the pool counts 1 references",
        Fault::DoubleHandOut => "the pool counts",
        Fault::OverAllocate => "its length needs",
        Fault::LostReference => {
            "about to be given back, is held by 1 live sequences but the pool counts 0"
        }
        Fault::WorkerPanic => "panicked: planted fault: worker-panic",
        Fault::StuckCall => "livelock: worker",
        Fault::EarlyRelease => "steps in flight",
    }
}

/// Whether `err` is a give-back check finding the pool counting one
/// reference more than live tables hold: a leaked sequence's reference to
/// a block it shared with a sibling still live, caught before the sweep.
fn one_reference_too_many_at_a_give_back(err: &str) -> bool {
    let Some((_, rest)) = err.split_once("about to be given back, is held by ") else {
        return false;
    };
    let Some(held) = rest.split(' ').next().and_then(|n| n.parse::<usize>().ok()) else {
        return false;
    };
    rest.contains(&format!(
        "{held} live sequences but the pool counts {} references",
        held + 1
    ))
}

/// Whether `err` is a step's completion finding its fence short: the
/// blocks that the step retired under it went back early, so its complete
/// gave back fewer references than the step retired. (Which check sees an
/// early release first, this one or a check of the steps in flight,
/// depends on the interleaving of the workers.)
fn fence_came_back_short(err: &str) -> bool {
    let Some((_, rest)) = err.split_once(": complete gave back ") else {
        return false;
    };
    let Some((gave, rest)) = rest.split_once(" references, the step retired ") else {
        return false;
    };
    let retired = rest.split_whitespace().next().unwrap_or("");
    matches!(
        (gave.parse::<usize>(), retired.parse::<usize>()),
        (Ok(gave), Ok(retired)) if gave < retired
    )
}

#[test]
fn a_short_fence_is_read_from_the_complete_check() {
    assert!(fence_came_back_short(
        "kvslots-sim: mutex: kv memory: fence 27: complete gave back 0 references, the step \
         retired 2"
    ));
    assert!(fence_came_back_short(
        "fence 3: complete gave back 1 references, the step retired 4"
    ));
    assert!(!fence_came_back_short(
        "fence 3: complete gave back 4 references, the step retired 4"
    ));
    assert!(!fence_came_back_short(
        "fence 3: complete gave back 5 references, the step retired 4"
    ));
    assert!(!fence_came_back_short("fence 3: something else"));
}

#[test]
fn every_planted_fault_fails_the_run_promptly_naming_it() {
    for allocator in ["kvslots", "mutex"] {
        for fault in Fault::ALL {
            // A fault of fenced release has occasions only with it.
            let depth = if fault.needs_async() { "2" } else { "0" };
            let args: Vec<&str> = SMALL
                .iter()
                .copied()
                .chain(["--allocator", allocator, "--plant-fault", fault.name()])
                .chain(["--async-depth", depth])
                .collect();
            let out = run_bounded(&args)
                .unwrap_or_else(|| panic!("{allocator} {}: the run hung", fault.name()));
            let err = String::from_utf8_lossy(&out.stderr);
            // A failed invariant is exit code 1.
            assert_eq!(
                out.status.code(),
                Some(1),
                "{allocator} {}: {err}",
                fault.name()
            );
            assert!(
                err.contains(names(fault))
                    || fault == Fault::Leak && one_reference_too_many_at_a_give_back(&err)
                    || fault == Fault::EarlyRelease && fence_came_back_short(&err),
                "{allocator} {}: the failure is not named: {err}",
                fault.name()
            );
            let v: serde_json::Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{allocator} {}: no report: {e}", fault.name()));
            assert_eq!(v["invariants_ok"], false, "{}", fault.name());
            assert!(!v["errors"].as_array().unwrap().is_empty());
        }
    }
}

/// A planted fault the workload gives no chance to fire checks nothing: the
/// run says so and exits 2 (bad input), never 0 (which would read as the
/// checks missing the fault) nor 1. A fault that needs draft tokens is
/// refused before the run without them.
#[test]
fn a_fault_that_cannot_fire_is_an_error() {
    let few = ["--requests", "5", "--plant-fault", "leak", "--json"];
    let out = run_bounded(&few).expect("the run hung");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--plant-fault leak never fired") && err.contains("run more requests"),
        "{err}"
    );
    let no_drafts = [
        "--requests",
        "100",
        "--plant-fault",
        "early-release",
        "--async-depth",
        "2",
        "--spec",
        "0",
    ];
    let out = run_bounded(&no_drafts).expect("the run hung");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("rollback of rejected drafts"), "{err}");
    assert!(out.stdout.is_empty(), "refused before the run");
}

/// The small run with asynchronous scheduling passes without a fault, and
/// retires blocks under its steps' fences (the occasions `early-release`
/// waits for).
#[test]
fn the_small_async_run_passes_without_a_fault() {
    for allocator in ["kvslots", "mutex"] {
        let args: Vec<&str> = SMALL
            .iter()
            .copied()
            .chain(["--allocator", allocator, "--async-depth", "2"])
            .collect();
        let out = run_bounded(&args).expect("the run hung");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0), "{allocator}: {v}");
        assert_eq!(v["invariants_ok"], true);
        assert!(v["tokens_rolled_back"].as_u64().unwrap() > 0, "{v}");
        assert!(v["blocks_retired"].as_u64().unwrap() > 0, "{v}");
        assert!(v["pending_release_peak"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(v["settings"]["async_depth"], 2);
    }
}

#[test]
fn the_small_run_passes_without_a_fault() {
    let out = run_bounded(SMALL).expect("the run hung");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{v}");
    assert_eq!(v["invariants_ok"], true);
    // The small run meets every occasion a fault waits for.
    for key in [
        "forks",
        "block_copies",
        "multi_block_appends",
        "tokens_rolled_back",
    ] {
        assert!(v[key].as_u64().unwrap() > 0, "{key} is 0: {v}");
    }
    assert!(v["stamps_read"].as_u64().unwrap() >= v["stamps_written"].as_u64().unwrap());
}
