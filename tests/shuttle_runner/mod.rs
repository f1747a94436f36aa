//! The shuttle runners that `tests/shuttle.rs` and `tests/shuttle_wait.rs`
//! share (`mod shuttle_runner;` in each): how many schedules a test runs,
//! and the random and PCT schedulers.

use shuttle::scheduler::{PctScheduler, RandomScheduler};
use shuttle::{Config, Runner};

/// The PCT bug depth (number of priority change points).
pub const PCT_DEPTH: usize = 3;

/// `default` schedules, or `KVSLOTS_SHUTTLE_ITERATIONS`.
pub fn iterations(default: usize) -> usize {
    std::env::var("KVSLOTS_SHUTTLE_ITERATIONS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn config() -> Config {
    let mut config = Config::new();
    // Shuttle warns that its atomics are sequentially consistent; the
    // test files' docs say what that means for their models.
    config.silence_warnings = true;
    config
}

/// Runs `f` under `iterations` random schedules.
pub fn check_random<F: Fn() + Send + Sync + 'static>(f: F, iterations: usize) {
    Runner::new(RandomScheduler::new(iterations), config()).run(f);
}

/// Runs `f` under `iterations` PCT schedules of depth [`PCT_DEPTH`].
pub fn check_pct<F: Fn() + Send + Sync + 'static>(f: F, iterations: usize) {
    Runner::new(PctScheduler::new(PCT_DEPTH, iterations), config()).run(f);
}
