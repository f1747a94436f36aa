//! The thread counts of the contended benchmarks: each benchmark's own,
//! or the list in `KVSLOTS_BENCH_THREADS` (e.g. `1,2,4,8,16`) for a run on
//! a machine with more cores (`scripts/bench-threads`).

/// The environment variable that overrides the thread counts.
pub const THREADS_ENV: &str = "KVSLOTS_BENCH_THREADS";

/// The comma-separated thread counts in `$KVSLOTS_BENCH_THREADS` if it is
/// set, else `default`.
///
/// # Panics
///
/// If the variable is set to anything but a list of positive whole
/// numbers: a benchmark run on the wrong thread counts would be misread.
pub fn bench_threads(default: &[usize]) -> Vec<usize> {
    match std::env::var(THREADS_ENV) {
        Err(std::env::VarError::NotPresent) => default.to_vec(),
        Err(e) => panic!("{THREADS_ENV}: {e}"),
        Ok(list) => parse_threads(&list).unwrap_or_else(|e| panic!("{THREADS_ENV}={list:?}: {e}")),
    }
}

/// Parses a comma-separated list of positive thread counts.
pub fn parse_threads(list: &str) -> Result<Vec<usize>, String> {
    let counts = list
        .split(',')
        .map(|s| match s.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{s:?} is not a positive whole number")),
        })
        .collect::<Result<Vec<usize>, String>>()?;
    Ok(counts)
}
