//! What a run of the kvslots pool exports while it runs: its KV events as
//! JSON lines (`--events FILE`) and its metrics as Prometheus text
//! (`--metrics FILE`), written by one thread beside the workers.
//!
//! # The events file
//!
//! One line per batch that [`BlockPool::drain_events`] returns non-empty,
//! in order, each a JSON object (a format a router's ingester can read
//! line by line):
//!
//! ```json
//! {"seq":0,"ts":1754400000.25,"events":[{"type":"AllBlocksCleared"},{"type":"BlockStored","block_hashes":["9f0c..."],"parent_block_hash":null,"block_ids":[17],"block_size":16,"token_count":16}]}
//! ```
//!
//! `seq` is the batch's sequence number (0, 1, 2, ... with no gap), `ts`
//! the wall-clock time of the drain in seconds since the Unix epoch, and
//! `events` vLLM's KV event shapes, tagged by `type`: `BlockStored`
//! (`block_hashes`, `parent_block_hash`, `block_size`, and kvslots's
//! `block_ids` and `token_count`), `BlockRemoved` (`block_hashes`),
//! `AllBlocksCleared`, and `Dropped` (`count`: events lost because the
//! pool's rings were full; a router resyncs by treating it as
//! `AllBlocksCleared`). A block hash is its 32 bytes in lowercase hex.
//!
//! # The metrics file
//!
//! OpenMetrics text (Prometheus's text exposition, as the
//! `prometheus-client` crate writes it, ending in `# EOF`), rewritten
//! every second and at the end of the run, whole each time (written
//! beside the file and renamed over it, so a reader never sees half of
//! it): the pool's [`PoolStats`] as `kvslots_*` gauges and counters.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvslots::{BlockHash, BlockPool, KvEvent, PoolStats};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// How often the events are drained.
pub const DRAIN_EVERY: Duration = Duration::from_millis(2);

/// How often the metrics file is rewritten.
pub const METRICS_EVERY: Duration = Duration::from_secs(1);

/// The default `--events-capacity`: records in the pool's rings, 128
/// bytes each (8 MiB).
pub const DEFAULT_EVENTS_CAPACITY: usize = 1 << 16;

/// A block hash as the events file writes it: lowercase hex.
pub fn hex(key: &BlockHash) -> String {
    let mut out = Vec::with_capacity(64);
    push_hex(&mut out, key);
    String::from_utf8(out).expect("hex digits")
}

/// Appends `key` in lowercase hex, between quotes.
fn push_hex(out: &mut Vec<u8>, key: &BlockHash) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0u8; 64];
    for (pair, b) in text.chunks_exact_mut(2).zip(key.0) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 15)];
    }
    out.extend_from_slice(&text);
}

/// Appends a JSON array of `keys` in hex.
fn push_hashes(out: &mut Vec<u8>, keys: &[BlockHash]) {
    out.push(b'[');
    for (i, k) in keys.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'"');
        push_hex(out, k);
        out.push(b'"');
    }
    out.push(b']');
}

/// Appends `,"group_idx":G` for an event of a group of layers (vLLM's
/// field); nothing for a plain sequence's.
fn push_group(out: &mut Vec<u8>, group: Option<usize>) {
    if let Some(g) = group {
        let _ = write!(out, r#","group_idx":{g}"#);
    }
}

/// Appends one event's JSON object.
fn push_event(out: &mut Vec<u8>, event: &KvEvent) {
    match event {
        KvEvent::BlockStored {
            keys,
            parent,
            block_ids,
            block_size,
            token_count,
            group,
        } => {
            out.extend_from_slice(br#"{"type":"BlockStored","block_hashes":"#);
            push_hashes(out, keys);
            out.extend_from_slice(br#","parent_block_hash":"#);
            match parent {
                Some(p) => {
                    out.push(b'"');
                    push_hex(out, p);
                    out.push(b'"');
                }
                None => out.extend_from_slice(b"null"),
            }
            out.extend_from_slice(br#","block_ids":["#);
            for (i, id) in block_ids.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let _ = write!(out, "{}", id.index());
            }
            let _ = write!(
                out,
                r#"],"block_size":{block_size},"token_count":{token_count}"#
            );
            push_group(out, *group);
            out.push(b'}');
        }
        KvEvent::BlockRemoved { keys, group } => {
            out.extend_from_slice(br#"{"type":"BlockRemoved","block_hashes":"#);
            push_hashes(out, keys);
            push_group(out, *group);
            out.push(b'}');
        }
        KvEvent::AllBlocksCleared => out.extend_from_slice(br#"{"type":"AllBlocksCleared"}"#),
        KvEvent::Dropped { count } => {
            let _ = write!(out, r#"{{"type":"Dropped","count":{count}}}"#);
        }
        other => {
            // A kind this build does not know: named, so that a reader
            // sees it.
            let _ = write!(
                out,
                "{}",
                serde_json::json!({ "type": format!("{other:?}") })
            );
        }
    }
}

/// Appends one batch as a line of the events file, newline included.
pub fn push_batch(out: &mut Vec<u8>, seq: u64, ts: f64, events: &[KvEvent]) {
    let _ = write!(out, r#"{{"seq":{seq},"ts":{ts:.6},"events":["#);
    for (i, event) in events.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_event(out, event);
    }
    out.extend_from_slice(b"]}\n");
}

/// The wall-clock time in seconds since the Unix epoch.
fn now_ts() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A gauge's value in a snapshot.
type GaugeOf = fn(&PoolStats) -> usize;
/// A counter's value in a snapshot.
type CounterOf = fn(&PoolStats) -> u64;

/// The pool's metrics, as registered with `prometheus-client`.
pub struct Metrics {
    registry: Registry,
    gauges: Vec<(Gauge, GaugeOf)>,
    usage: Gauge<f64, AtomicU64>,
    counters: Vec<(Counter, CounterOf)>,
    /// Each counter's value as last exported (counters only go up by the
    /// difference).
    last: Vec<u64>,
}

impl Metrics {
    /// The metrics of a pool, `events_dropped` among them if it records KV
    /// events.
    pub fn new(with_events: bool) -> Metrics {
        let mut registry = Registry::with_prefix("kvslots");
        let gauge_defs: [(&str, &str, GaugeOf); 8] = [
            ("blocks", "Blocks in the pool", |s| s.num_blocks),
            ("used_blocks", "Blocks in use", |s| s.used_blocks),
            (
                "peak_used_blocks",
                "High-water mark of blocks in use",
                |s| s.peak_used_blocks,
            ),
            ("free_blocks", "Free blocks, evictable ones included", |s| {
                s.free_blocks
            }),
            ("cached_blocks", "Blocks holding a prefix-cache key", |s| {
                s.cached_blocks
            }),
            ("evictable_blocks", "Cached blocks that no one holds", |s| {
                s.evictable_blocks
            }),
            (
                "pending_release_blocks",
                "Blocks whose release waits for a fence",
                |s| s.pending_release_blocks,
            ),
            ("waiters", "Calls waiting in the allocation queue", |s| {
                s.waiters
            }),
        ];
        let mut gauges = Vec::new();
        for (name, help, get) in gauge_defs {
            let gauge = Gauge::default();
            registry.register(name, help, gauge.clone());
            gauges.push((gauge, get));
        }
        let usage = Gauge::<f64, AtomicU64>::default();
        registry.register("usage_ratio", "Blocks in use over blocks", usage.clone());
        let mut counter_defs: Vec<(&str, &str, CounterOf)> = vec![
            (
                "prefix_queried_blocks",
                "Keys queried by prefix matches",
                |s| s.queried_blocks,
            ),
            ("prefix_hit_blocks", "Blocks prefix matches hit", |s| {
                s.hit_blocks
            }),
            ("evictions", "Cached blocks evicted", |s| s.evictions),
        ];
        if with_events {
            counter_defs.push(("events_dropped", "KV events lost to full rings", |s| {
                s.events_dropped.unwrap_or(0)
            }));
        }
        let mut counters = Vec::new();
        for (name, help, get) in counter_defs {
            let counter = Counter::default();
            registry.register(name, help, counter.clone());
            counters.push((counter, get));
        }
        let last = vec![0; counters.len()];
        Metrics {
            registry,
            gauges,
            usage,
            counters,
            last,
        }
    }

    /// The metrics of `stats`, as OpenMetrics text.
    pub fn render(&mut self, stats: &PoolStats) -> String {
        for (gauge, get) in &self.gauges {
            gauge.set(i64::try_from(get(stats)).unwrap_or(i64::MAX));
        }
        self.usage.set(stats.usage());
        for ((counter, get), last) in self.counters.iter().zip(&mut self.last) {
            let now = get(stats);
            counter.inc_by(now.saturating_sub(*last));
            *last = (*last).max(now);
        }
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String");
        text
    }
}

/// Writes `text` to `path` whole: into a file beside it ([`tmp_path`]),
/// renamed over it.
pub fn write_whole(path: &Path, text: &str) -> io::Result<()> {
    let tmp = tmp_path(path);
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// The file beside `path` that [`write_whole`] writes first: `path` with
/// `.tmp` appended.
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    PathBuf::from(tmp)
}

/// What the exports of a run wrote, for its report.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Exported {
    /// Non-empty batches written to the events file.
    pub event_batches: u64,
    /// Events written (a `BlockStored` or `BlockRemoved` counts one per
    /// key).
    pub events: u64,
    /// Events the pool lost to full rings (the `Dropped` counts).
    pub events_dropped: u64,
    /// Times the metrics file was written.
    pub metrics_writes: u64,
}

/// The files a run exports to.
#[derive(Debug, Clone, Default)]
pub struct Exports {
    /// The events file, created (emptied) before the run.
    pub events: Option<PathBuf>,
    /// The metrics file.
    pub metrics: Option<PathBuf>,
}

impl Exports {
    /// Whether anything is exported.
    pub fn any(&self) -> bool {
        self.events.is_some() || self.metrics.is_some()
    }

    /// Runs `run` while a thread exports `pool`'s events and metrics;
    /// returns what `run` returned and what was exported, or the first
    /// error writing a file (the run goes on to its end regardless).
    pub fn around<R>(
        &self,
        pool: &Arc<BlockPool>,
        run: impl FnOnce() -> R,
    ) -> (R, io::Result<Exported>) {
        let events = match self.events.as_deref().map(File::create).transpose() {
            Ok(file) => file.map(BufWriter::new),
            Err(e) => return (run(), Err(self.named_events(e))),
        };
        let done = crossbeam_channel::bounded::<()>(0);
        std::thread::scope(|scope| {
            let exporter = scope.spawn(|| self.export(pool, events, &done.1));
            let result = run();
            drop(done.0);
            let exported = exporter
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the exporter panicked")));
            (result, exported)
        })
    }

    /// `e`, an error writing the events file, naming it.
    fn named_events(&self, e: io::Error) -> io::Error {
        named("--events", self.events.as_deref(), e)
    }

    /// The exporter thread: drains and writes until `done` disconnects,
    /// then once more.
    fn export(
        &self,
        pool: &BlockPool,
        mut events: Option<BufWriter<File>>,
        done: &crossbeam_channel::Receiver<()>,
    ) -> io::Result<Exported> {
        let mut exported = Exported::default();
        let mut metrics = self
            .metrics
            .as_ref()
            .map(|path| (path, Metrics::new(pool.has_kv_events())));
        let mut batch = Vec::new();
        let mut line = Vec::new();
        let mut next_metrics = Instant::now();
        loop {
            let finished = matches!(
                done.recv_timeout(DRAIN_EVERY),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected)
            );
            if let Some(out) = events.as_mut() {
                batch.clear();
                let seq = pool.drain_events(&mut batch);
                if !batch.is_empty() {
                    line.clear();
                    push_batch(&mut line, seq, now_ts(), &batch);
                    out.write_all(&line).map_err(|e| self.named_events(e))?;
                    exported.event_batches += 1;
                    for event in &batch {
                        match event {
                            KvEvent::BlockStored { keys, .. }
                            | KvEvent::BlockRemoved { keys, .. } => {
                                exported.events += keys.len() as u64
                            }
                            KvEvent::Dropped { count } => exported.events_dropped += count,
                            _ => exported.events += 1,
                        }
                    }
                }
            }
            if let Some((path, m)) = metrics.as_mut() {
                if finished || Instant::now() >= next_metrics {
                    write_whole(path, &m.render(&pool.stats()))
                        .map_err(|e| named("--metrics", Some(path), e))?;
                    exported.metrics_writes += 1;
                    next_metrics += METRICS_EVERY;
                }
            }
            if finished {
                break;
            }
        }
        if let Some(mut out) = events {
            out.flush().map_err(|e| self.named_events(e))?;
        }
        Ok(exported)
    }
}

/// `e`, an error writing the export that `flag` names at `path`, with them
/// in its message (its kind kept).
fn named(flag: &str, path: Option<&Path>, e: io::Error) -> io::Error {
    let path = path.map(|p| p.display().to_string()).unwrap_or_default();
    io::Error::new(e.kind(), format!("{flag} {path}: {e}"))
}
