//! Prefix caching in the simulator: the hit rate on the Mooncake trace
//! against an independent count, the synthetic shared-prefix workload under
//! contention on both allocators, and the oracle's check of matched blocks.

use std::collections::HashSet;
use std::path::Path;

use kvslots_sim::backend::{KvBackend, KvslotsBackend, MutexBackend};
use kvslots_sim::engine::{self, Admission, EngineConfig, RunStats};
use kvslots_sim::oracle::{Oracle, Tracked, Writer};
use kvslots_sim::prefix::{block_keys, content_ids, TRACE_BLOCK};
use kvslots_sim::workload::{read_trace, Request, SharedPrefixes, Synthetic};

/// The first `n` requests of the conversation trace in the repository.
fn trace_prefix(n: usize) -> Vec<Request> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces/mooncake-conversation.jsonl");
    let mut all = read_trace(&path).expect("the trace in the repository parses");
    all.truncate(n);
    all
}

/// The reference's hits with nothing evicted, counted straight from the
/// ids: for each request in order, the longest prefix of its full-block
/// ids that earlier requests had as full blocks; then its own full blocks
/// are cached. Returns (prompt tokens, hit blocks of 512).
fn replay_without_eviction(reqs: &[Request]) -> (u64, u64) {
    let mut cached = HashSet::new();
    let (mut prompt, mut hits) = (0u64, 0u64);
    for r in reqs {
        let ids = r.hash_ids.as_deref().expect("a JSONL request has ids");
        let full = &ids[..r.prompt / TRACE_BLOCK];
        hits += full.iter().take_while(|h| cached.contains(*h)).count() as u64;
        cached.extend(full.iter().copied());
        prompt += r.prompt as u64;
    }
    (prompt, hits)
}

/// Blocks enough for every request's prompt and output at once: nothing is
/// ever evicted.
fn roomy(reqs: &[Request], bs: usize) -> usize {
    reqs.iter()
        .map(|r| (r.prompt + r.output).div_ceil(bs))
        .sum::<usize>()
        + 64
}

fn one_at_a_time() -> EngineConfig {
    EngineConfig {
        workers: 1,
        max_running: 1,
        watermark_blocks: 0,
        chunk: 2048,
        seed: 5,
        ..EngineConfig::default()
    }
}

fn assert_ok(s: &RunStats, n: usize) {
    assert!(s.invariants().ok(), "{:?} {:?}", s.invariants(), s.errors);
    assert_eq!(s.counts.requests_completed, n as u64);
}

/// One worker, one request at a time, memory for everything: the hits are
/// exactly the reference's no-eviction count (on the trace's first
/// requests; the full trace is the same command in release, see the
/// README), at a block size that cuts each trace block in four, with both
/// admissions. `make` builds the backend for a pool of that many blocks.
fn hits_equal_the_no_eviction_replay<B: KvBackend>(make: impl Fn(usize, usize) -> B) {
    let reqs = trace_prefix(1000);
    let (prompt, hit_blocks) = replay_without_eviction(&reqs);
    // The excerpt repeats prefixes, or the test would prove nothing.
    assert!(hit_blocks > 2_000, "{hit_blocks}");
    let bs = 128;
    for admission in [Admission::Reserve, Admission::Check] {
        let cfg = EngineConfig {
            admission,
            ..one_at_a_time()
        };
        let s = engine::run(&make(roomy(&reqs, bs), bs), &reqs, &cfg, None);
        assert_ok(&s, reqs.len());
        assert_eq!(s.prefix.evictions, 0);
        assert_eq!(s.counts.prompt_tokens, prompt);
        assert_eq!(s.counts.prefix_hit_tokens, hit_blocks * TRACE_BLOCK as u64);
        // Only what missed was prefilled.
        assert_eq!(
            s.counts.tokens_prefilled,
            prompt - hit_blocks * TRACE_BLOCK as u64
        );
        assert_eq!(s.prefix.hit_blocks, hit_blocks * (TRACE_BLOCK / bs) as u64);
    }
}

#[test]
fn one_request_at_a_time_with_room_hits_exactly_the_no_eviction_replay() {
    hits_equal_the_no_eviction_replay(MutexBackend::new);
    hits_equal_the_no_eviction_replay(KvslotsBackend::new);
}

/// With prefix caching off, nothing is matched or published.
#[test]
fn prefix_caching_off_matches_nothing() {
    let reqs = trace_prefix(40);
    let cfg = EngineConfig {
        prefix_cache: false,
        ..one_at_a_time()
    };
    let s = engine::run(
        &MutexBackend::new(roomy(&reqs, 512), 512),
        &reqs,
        &cfg,
        None,
    );
    assert_ok(&s, reqs.len());
    assert_eq!(s.counts.prefix_hit_tokens, 0);
    assert_eq!(s.cached_blocks, 0);
    let prompt: u64 = reqs.iter().map(|r| r.prompt as u64).sum();
    assert_eq!(s.counts.tokens_prefilled, prompt);
}

/// The shared-prefix workload, shrunk to a small pool: conversations and
/// system prompts of a few trace blocks.
fn small_shared(n: usize, seed: u64) -> Vec<Request> {
    SharedPrefixes {
        lengths: Synthetic {
            prompt_mu: 6.5,
            prompt_sigma: 0.6,
            output_mu: 2.5,
            output_sigma: 0.7,
            max_prompt: 3000,
            max_output: 60,
        },
        open: 6,
        system_prompts: 2,
        user_mu: 5.5,
        user_sigma: 0.5,
        ..SharedPrefixes::default()
    }
    .generate(n, seed)
}

fn contended(mix: bool) -> EngineConfig {
    EngineConfig {
        workers: 4,
        max_running: 4,
        watermark_blocks: 2,
        chunk: 256,
        spec: 3,
        accept: 0.6,
        samples: 2,
        mix,
        seed: 9,
        ..EngineConfig::default()
    }
}

/// Four workers on a pool that holds a few prompts: matches, publishes,
/// evictions, forks and drafts all happen (preemptions too, as the
/// interleaving has it: whether one happens depends on the threads'
/// timing, so it is not asserted here; `tests/engine.rs` forces them on
/// one worker), and every matched block the oracle reads back holds its
/// prompt's content.
#[test]
fn shared_prefixes_under_contention_keep_every_invariant_on_both_allocators() {
    let reqs = small_shared(400, 3);
    for cfg in [contended(false), contended(true)] {
        let (nb, bs) = (600, 16);
        let m = engine::run(&MutexBackend::new(nb, bs), &reqs, &cfg, None);
        assert_ok(&m, reqs.len());
        assert!(m.counts.prefix_hit_tokens > 0);
        assert!(m.prefix.evictions > 0, "{:?}", m.prefix);
        assert!(m.counts.forks > 0);
        // A preempted attempt counts its whole prompt, prefilled or not.
        assert!(m.counts.tokens_prefilled + m.counts.prefix_hit_tokens <= m.counts.prompt_tokens);
        let k = engine::run(&KvslotsBackend::new(nb, bs), &reqs, &cfg, None);
        assert_ok(&k, reqs.len());
        assert!(k.counts.tokens_prefilled + k.counts.prefix_hit_tokens <= k.counts.prompt_tokens);
    }
}

fn writer(request: usize) -> Writer {
    Writer {
        request,
        sample: 0,
        attempt: 0,
        fork_len: 0,
    }
}

/// The oracle's check of a matched block: another request with the same
/// trace prefix reads the publisher's stamps back; one whose prefix differs
/// (as a match under a wrong key would give it) fails, naming the content
/// stamp it found.
#[test]
fn a_matched_block_must_hold_the_matchers_prefix() {
    let (nb, bs) = (8, 256);
    let b = MutexBackend::new(nb, bs);
    let o = Oracle::new(nb, bs);
    let ids: [u64; 2] = [10, 11];
    let mut keys = Vec::new();
    block_keys(&ids, 1024, bs, &mut keys);
    assert_eq!(keys.len(), 4);
    // The publisher writes and publishes its prompt.
    let mut a = b.new_seq(1024);
    let mut ta = Tracked::with_content(writer(1), content_ids(&ids, 1024).into());
    a.try_append(1024).unwrap();
    o.after_call(&b, &mut ta, &a, 0, None).unwrap();
    let mut slots = Vec::new();
    a.extend_slots(0..1024, &mut slots).unwrap();
    o.write::<<MutexBackend as KvBackend>::Seq>(&ta, 0..1024, &slots)
        .unwrap();
    assert_eq!(a.publish(&keys), 4);
    // Same prefix, another request: the matched blocks read back.
    let mut c = b.new_seq(1024);
    let same: Vec<u64> = content_ids(&[10, 11, 12], 1536);
    let mut tc = Tracked::with_content(writer(2), same.into());
    tc.share(4);
    assert_eq!(c.try_match_prefix(&keys), 4);
    o.after_call(&b, &mut tc, &c, 0, None).unwrap();
    o.read::<<MutexBackend as KvBackend>::Seq>(&tc, 0..1024)
        .unwrap();
    // Another second trace block, same keys (a wrong key): the first trace
    // block reads back, the second does not.
    let mut d = b.new_seq(1024);
    let other: Vec<u64> = content_ids(&[10, 99], 1024);
    let mut td = Tracked::with_content(writer(3), other.into());
    td.share(4);
    assert_eq!(d.try_match_prefix(&keys), 4);
    o.after_call(&b, &mut td, &d, 0, None).unwrap();
    o.read::<<MutexBackend as KvBackend>::Seq>(&td, 0..512)
        .unwrap();
    let err = o
        .read::<<MutexBackend as KvBackend>::Seq>(&td, 512..1024)
        .unwrap_err();
    assert!(err.contains("request 3 sample 0 position 512"), "{err}");
    assert!(err.contains("the content stamp of content"), "{err}");
    for (mut t, s) in [(ta, a), (tc, c), (td, d)] {
        o.before_release(&b, &mut t, 0).unwrap();
        drop(s);
    }
    assert!(o.sweep(&b).is_empty());
    assert_eq!(b.cached_blocks(), 4);
    assert_eq!(b.evictable_blocks(), 4);
    assert_eq!(b.used_blocks(), 0);
}

/// A cache that matches the wrong blocks: it looks the keys up from the
/// second one on, so every matched block holds content of a later position
/// than the table puts it at. The check of the checker for matched blocks.
#[derive(Clone)]
struct WrongMatch(MutexBackend);

struct WrongSeq(<MutexBackend as KvBackend>::Seq);

type Id = <MutexBackend as KvBackend>::Id;

impl kvslots_sim::backend::KvSeq for WrongSeq {
    type Id = Id;
    type Keys = Vec<kvslots::BlockHash>;
    fn index(id: Id) -> usize {
        id.index()
    }
    fn is_null(id: Id) -> bool {
        id.is_null()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn table(&self, _group: usize) -> &[Id] {
        self.0.blocks()
    }
    fn capacity(&self) -> usize {
        self.0.capacity()
    }
    fn try_reserve(&mut self, tokens: usize, headroom: usize) -> Result<(), kvslots::ReserveError> {
        self.0.try_reserve(tokens, headroom)
    }
    fn try_append(
        &mut self,
        n: usize,
        fence: Option<u64>,
        copies: &mut kvslots_sim::backend::Copies<Id>,
    ) -> Result<std::ops::Range<usize>, kvslots::ReserveError> {
        kvslots_sim::backend::KvSeq::try_append(&mut self.0, n, fence, copies)
    }
    fn truncate(&mut self, len: usize) -> usize {
        self.0.truncate(len)
    }
    fn truncate_fenced(&mut self, len: usize, fence: u64) -> usize {
        self.0.truncate_fenced(len, fence)
    }
    fn reserve_blocking(
        &mut self,
        tokens: usize,
        headroom: usize,
        timeout: Option<std::time::Duration>,
    ) -> Result<(), kvslots::ReserveError> {
        self.0.reserve_blocking(tokens, headroom, timeout)
    }
    fn retire(self, fence: u64) -> usize {
        self.0.retire(fence)
    }
    fn retire_copy_source(&mut self, fence: u64) -> usize {
        self.0.retire_copy_source(fence)
    }
    fn try_fork(
        &self,
        copies: &mut kvslots_sim::backend::Copies<Id>,
    ) -> Result<Self, kvslots::ReserveError> {
        kvslots_sim::backend::KvSeq::try_fork(&self.0, copies).map(WrongSeq)
    }
    fn extend_slots(
        &self,
        _group: usize,
        positions: std::ops::Range<usize>,
        out: &mut Vec<usize>,
    ) -> Result<(), String> {
        self.0
            .extend_slots(positions, out)
            .map_err(|e| e.to_string())
    }
    fn key_blocks(keys: &Self::Keys) -> usize {
        keys.len()
    }
    fn clear_keys(keys: &mut Self::Keys) {
        keys.clear();
    }
    fn try_match_prefix(&mut self, hashes: &Self::Keys) -> usize {
        self.0.try_match_prefix(hashes.get(1..).unwrap_or(&[]))
    }
    fn publish(&mut self, hashes: &Self::Keys) -> usize {
        self.0.publish(hashes)
    }
}

impl KvBackend for WrongMatch {
    type Seq = WrongSeq;
    type Id = Id;
    fn name(&self) -> &'static str {
        "wrong-match"
    }
    fn num_blocks(&self) -> usize {
        self.0.num_blocks()
    }
    fn block_size(&self) -> usize {
        self.0.block_size()
    }
    fn used_blocks(&self) -> usize {
        self.0.used_blocks()
    }
    fn peak_used_blocks(&self) -> usize {
        self.0.peak_used_blocks()
    }
    fn ref_count(&self, index: usize) -> Option<usize> {
        self.0.ref_count(index)
    }
    fn try_alloc_with_headroom(
        &self,
        n: usize,
        headroom: usize,
        out: &mut Vec<Id>,
    ) -> Result<(), kvslots::ReserveError> {
        self.0.try_alloc_with_headroom(n, headroom, out)
    }
    fn free(&self, ids: &[Id]) -> Result<(), String> {
        self.0.free(ids)
    }
    fn new_seq(&self, tokens: usize) -> WrongSeq {
        WrongSeq(self.0.new_seq(tokens))
    }
    fn new_keys(&self) -> Vec<kvslots::BlockHash> {
        Vec::new()
    }
    fn extend_keys(&self, keys: &mut Vec<kvslots::BlockHash>, base: &[kvslots::BlockHash]) {
        keys.extend_from_slice(base);
    }
    fn kv_groups(&self) -> &kvslots::KvGroups {
        self.0.kv_groups()
    }
    fn complete(&self, fence: u64) -> usize {
        self.0.complete(fence)
    }
    fn peak_pending_release_blocks(&self) -> usize {
        self.0.peak_pending_release_blocks()
    }
    fn cached_blocks(&self) -> usize {
        self.0.cached_blocks()
    }
    fn evictable_blocks(&self) -> usize {
        self.0.evictable_blocks()
    }
    fn prefix_stats(&self) -> kvslots_sim::backend::PrefixCounts {
        self.0.prefix_stats()
    }
}

/// A run on a cache that hands out blocks of the wrong position fails the
/// KV-memory invariant, naming the content stamp it read; the same run on
/// the right cache passes (above).
#[test]
fn a_cache_that_matches_wrong_blocks_fails_the_run() {
    let reqs = trace_prefix(60);
    let bs = 128;
    let backend = WrongMatch(MutexBackend::new(roomy(&reqs, bs), bs));
    let s = engine::run(&backend, &reqs, &one_at_a_time(), None);
    assert!(s.counts.prefix_hit_tokens > 0);
    assert!(!s.invariants().kv_memory_intact, "{:?}", s.errors);
    assert!(
        s.errors
            .iter()
            .any(|e| e.contains("the content stamp of content")),
        "{:?}",
        s.errors
    );
}
