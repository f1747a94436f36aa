//! `HybridSequence` against a sequential reference model: random scripts of
//! new requests (a prefix match, then the rest of the prompt), appends,
//! truncates (good and too far back), forks, publishes, reservations,
//! shrinks and drops on a few live sequences over one pool, for several
//! layouts of groups (full, sliding windows of several sizes, chunked local
//! attention, mixed).
//!
//! Block sizes of 1 to 8 tokens, windows and chunks that are no multiple of
//! them, scripts of up to 120 operations and sequences of up to 160
//! tokens.
//!
//! The model knows the rules, not the code (`first_needed_block` is
//! counted from the attention pattern, and checked against the
//! library's):
//!
//! * **Shape.** Every group holds one entry per block of the sequence's
//!   length (and any reserved ones), `BlockId::NULL` for the blocks its
//!   window gave back: a sliding or chunked group's null entries are the
//!   blocks wholly before the window (or chunk) of each append's first new
//!   token (`first_needed_block(old_len)`, for a sliding window
//!   `(old_len + 1 - window) / block_size`); a truncate keeps them; a
//!   fork copies them.
//! * **Truncate.** Refused, with `TruncateOutsideWindow { min_len }` and
//!   nothing changed, exactly when the window of the token at the new
//!   length reaches a null entry (`len != 0 && len < min_len`, `min_len`
//!   the shortest length whose `first_needed_block` reaches no null
//!   entry, found by counting up).
//! * **The cache.** The model keeps which block holds which group key:
//!   first publish wins; a truncate into a cached block that only the
//!   truncating sequence holds drops its key. (The pool is large enough
//!   that nothing is evicted, which the test asserts.)
//! * **Match.** The expected hit is found by brute force: the largest `k`
//!   such that every full group's keys `0..k` and every sliding or
//!   chunked group's keys `first_needed_block(k * bs)..k` are cached. The matched tables
//!   must hold exactly the blocks the model's cache names.
//!   `BlockPool::peek_hybrid_prefix` must find the same `k` first, and
//!   change neither the statistics nor the evictable blocks.
//! * **References.** After every operation the pool's reference count of
//!   every block equals the number of live table entries holding it plus
//!   the copy-on-write sources kept; new blocks an append writes into are
//!   held by nobody else; and once every sequence is gone the pool is
//!   whole again.

use std::collections::HashMap;
use std::sync::Arc;

use kvslots::{
    hash_blocks, BlockCopy, BlockHash, BlockId, BlockPool, GroupKeys, HybridError, HybridSequence,
    KvGroup, KvGroups,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

/// Blocks in the pool: enough that no cached block is ever evicted.
const BLOCKS: usize = 16384;
/// Longest sequence.
const MAX_LEN: usize = 160;

thread_local! {
    static BS_CELL: std::cell::Cell<usize> = const { std::cell::Cell::new(4) };
}

/// Tokens per block: each case's own (1, 2, 3, 4, 5 or 8), set before it
/// runs.
fn bs() -> usize {
    BS_CELL.with(|c| c.get())
}

/// `first_needed_block` from the attention pattern, counted position by
/// position (the block of the first position the token at `len` reads),
/// and checked against the library's.
fn need(kind: KvGroup, len: usize, bs: usize) -> usize {
    let first = match kind {
        KvGroup::Full => 0,
        KvGroup::SlidingWindow { window_tokens } => {
            (0..=len).find(|&q| len - q < window_tokens).unwrap()
        }
        KvGroup::ChunkedLocal { chunk_tokens } => (0..=len)
            .find(|&q| q / chunk_tokens == len / chunk_tokens)
            .unwrap(),
        _ => unreachable!(),
    };
    let got = kind.first_needed_block(len, bs);
    assert_eq!(
        got,
        first / bs,
        "first_needed_block({len}, {bs}) of {kind:?}"
    );
    first / bs
}

/// 256 cases, or `KVSLOTS_PROPTEST_CASES`.
fn config() -> ProptestConfig {
    let cases = std::env::var("KVSLOTS_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(256);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A request of `prompt` tokens of `family`: a match, then the rest.
    New {
        family: u32,
        prompt: usize,
    },
    Append(Index, usize),
    /// Truncate by `back` tokens (may be refused).
    Truncate(Index, usize),
    Fork(Index),
    Publish(Index),
    Reserve(Index, usize),
    Shrink(Index),
    Drop(Index),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0u32..3, 1usize..100).prop_map(|(family, prompt)| Op::New { family, prompt }),
        4 => (any::<Index>(), 1usize..14).prop_map(|(i, n)| Op::Append(i, n)),
        2 => (any::<Index>(), 0usize..40).prop_map(|(i, b)| Op::Truncate(i, b)),
        1 => any::<Index>().prop_map(Op::Fork),
        2 => any::<Index>().prop_map(Op::Publish),
        1 => (any::<Index>(), 0usize..12).prop_map(|(i, t)| Op::Reserve(i, t)),
        1 => any::<Index>().prop_map(Op::Shrink),
        1 => any::<Index>().prop_map(Op::Drop),
    ]
}

fn layout() -> impl Strategy<Value = Vec<KvGroup>> {
    let w = |window_tokens| KvGroup::SlidingWindow { window_tokens };
    let c = |chunk_tokens| KvGroup::ChunkedLocal { chunk_tokens };
    prop_oneof![
        Just(vec![KvGroup::Full]),
        Just(vec![w(6)]),
        Just(vec![w(5), KvGroup::Full]),
        Just(vec![KvGroup::Full, w(1), w(9)]),
        Just(vec![w(4), w(4), KvGroup::Full, w(13)]),
        Just(vec![c(8), KvGroup::Full]),
        Just(vec![c(6)]),
        Just(vec![KvGroup::Full, c(1), c(10), w(7)]),
        Just(vec![c(3)]),
        Just(vec![c(5), c(5)]),
        Just(vec![c(7), KvGroup::Full]),
        Just(vec![c(2), w(3)]),
        Just(vec![c(13), w(13), KvGroup::Full]),
        Just(vec![c(1)]),
        Just(vec![c(1000), KvGroup::Full]),
        Just(vec![c(1000)]),
        Just(vec![w(2), c(12), c(16), KvGroup::Full]),
        Just(vec![c(9), c(4)]),
    ]
}

/// Token `i` of a sequence of `family`: sequences of one family share
/// their prefixes.
fn token(family: u32, i: usize) -> u32 {
    family * 1_000_000 + i as u32
}

/// One live sequence and what the model knows of it.
struct Live {
    seq: HybridSequence,
    family: u32,
    /// Per group: the leading null entries.
    null: Vec<usize>,
    /// Whether the partly filled tail may be shared or cached (after a
    /// truncate back into a block that was once full).
    tail_may_be_shared: bool,
    /// Per group: the copy-on-write source the sequence keeps.
    retired: Vec<Option<BlockId>>,
}

struct World {
    pool: Arc<BlockPool>,
    groups: KvGroups,
    live: Vec<Live>,
    /// Group key -> the block holding it, and back.
    cache: HashMap<BlockHash, BlockId>,
    cached: HashMap<BlockId, BlockHash>,
    copies: Vec<BlockCopy>,
}

impl World {
    fn kinds(&self) -> Vec<KvGroup> {
        self.groups.as_slice().to_vec()
    }

    /// The group keys of the first `blocks` full blocks of `family`.
    fn keys(&self, family: u32, blocks: usize) -> GroupKeys {
        let tokens: Vec<u32> = (0..blocks * bs()).map(|i| token(family, i)).collect();
        let mut base = Vec::new();
        hash_blocks(b"", &tokens, bs(), &mut base);
        self.groups.keys(&base)
    }

    /// The longest prefix the model's cache can serve in every group.
    fn expected_hit(&self, keys: &GroupKeys) -> usize {
        (0..=keys.blocks())
            .rev()
            .find(|&k| {
                self.kinds().iter().enumerate().all(|(g, kind)| {
                    let from = need(*kind, k * bs(), bs());
                    keys.group(g).unwrap()[from..k]
                        .iter()
                        .all(|key| self.cache.contains_key(key))
                })
            })
            .unwrap_or(0)
    }

    /// References the model expects on each block: table entries and kept
    /// copy sources.
    fn expected_refs(&self) -> HashMap<BlockId, usize> {
        let mut refs = HashMap::new();
        for l in &self.live {
            for g in 0..self.groups.len() {
                for &id in l.seq.blocks(g).unwrap() {
                    if !id.is_null() {
                        *refs.entry(id).or_insert(0) += 1;
                    }
                }
                if let Some(id) = l.retired[g] {
                    *refs.entry(id).or_insert(0) += 1;
                }
            }
        }
        refs
    }

    /// The checks after every operation.
    fn check(&self) -> Result<(), TestCaseError> {
        let refs = self.expected_refs();
        for b in 0..BLOCKS {
            let id = BlockId::new(b as u32);
            let want = refs.get(&id).copied().unwrap_or(0);
            prop_assert_eq!(self.pool.ref_count(id), Some(want), "references of {}", id);
        }
        for l in &self.live {
            let len = l.seq.len();
            for (g, kind) in self.kinds().iter().enumerate() {
                let table = l.seq.blocks(g).unwrap();
                prop_assert!(table.len() >= len.div_ceil(bs()), "group {} short", g);
                prop_assert_eq!(
                    l.seq.null_blocks(g),
                    Some(l.null[g]),
                    "nulls of group {}",
                    g
                );
                for (i, id) in table.iter().enumerate() {
                    prop_assert_eq!(id.is_null(), i < l.null[g], "entry {} of group {}", i, g);
                }
                // The window of the next token is held.
                prop_assert!(l.null[g] <= need(*kind, len, bs()));
                // Slot mapping of every held position agrees with the table.
                let first = l.null[g] * bs();
                let mut slots = Vec::new();
                l.seq
                    .extend_slots(g, first..len, &mut slots)
                    .map_err(|e| TestCaseError::fail(format!("{e}")))?;
                for (p, &slot) in (first..len).zip(&slots) {
                    prop_assert_eq!(slot, table[p / bs()].index() * bs() + p % bs());
                    prop_assert_eq!(l.seq.slot(g, p), Some(slot));
                }
                if first > 0 && len > 0 {
                    prop_assert_eq!(l.seq.slot(g, first - 1), None);
                    prop_assert_eq!(
                        l.seq.extend_slots(g, first - 1..len, &mut slots),
                        Err(HybridError::OutsideWindow {
                            group: g,
                            position: first - 1,
                            first_held: first
                        })
                    );
                }
            }
        }
        prop_assert_eq!(self.pool.prefix_stats().evictions, 0);
        Ok(())
    }

    /// After an append that wrote `old_len..len`: the blocks written into
    /// are held by this sequence alone.
    fn check_writers(&self, i: usize, old_len: usize) -> Result<(), TestCaseError> {
        let l = &self.live[i];
        let refs = self.expected_refs();
        for g in 0..self.groups.len() {
            let table = l.seq.blocks(g).unwrap();
            for &id in &table[old_len / bs()..l.seq.len().div_ceil(bs())] {
                prop_assert_eq!(refs[&id], 1, "{} written with another holder", id);
                prop_assert!(
                    !self.cached.contains_key(&id),
                    "{} written while cached",
                    id
                );
            }
        }
        Ok(())
    }

    fn new_request(&mut self, family: u32, prompt: usize) -> Result<(), TestCaseError> {
        let mut seq = HybridSequence::new(Arc::clone(&self.pool), self.groups.clone());
        let keys = self.keys(family, prompt / bs());
        let want = self.expected_hit(&keys);
        // A peek finds the same prefix and leaves the pool as it was.
        let (stats, evictable) = (self.pool.prefix_stats(), self.pool.evictable_blocks());
        prop_assert_eq!(self.pool.peek_hybrid_prefix(&keys), want, "peek");
        prop_assert_eq!(self.pool.prefix_stats(), stats);
        prop_assert_eq!(self.pool.evictable_blocks(), evictable);
        let k = seq.try_match_prefix(&keys).unwrap();
        prop_assert_eq!(k, want, "hit");
        prop_assert_eq!(seq.len(), k * bs());
        let mut null = Vec::new();
        for (g, kind) in self.kinds().iter().enumerate() {
            let from = need(*kind, k * bs(), bs());
            let table = seq.blocks(g).unwrap();
            prop_assert_eq!(table.len(), k, "matched table of group {}", g);
            for (i, &id) in table.iter().enumerate() {
                if i < from {
                    prop_assert!(id.is_null());
                } else {
                    prop_assert_eq!(Some(&id), self.cache.get(&keys.group(g).unwrap()[i]));
                }
            }
            null.push(if k == 0 { 0 } else { from });
        }
        let groups = self.groups.len();
        self.live.push(Live {
            seq,
            family,
            null,
            tail_may_be_shared: false,
            retired: vec![None; groups],
        });
        self.check()?;
        let i = self.live.len() - 1;
        let rest = prompt - k * bs();
        self.append(i, rest)
    }

    fn append(&mut self, i: usize, n: usize) -> Result<(), TestCaseError> {
        let kinds = self.kinds();
        let l = &mut self.live[i];
        let old_len = l.seq.len();
        self.copies.clear();
        let range = l.seq.try_append_cow(n, &mut self.copies).unwrap();
        prop_assert_eq!(range, old_len..old_len + n);
        if n > 0 {
            for (g, kind) in kinds.iter().enumerate() {
                l.null[g] = l.null[g].max(need(*kind, old_len, bs()));
                l.retired[g] = None;
            }
            l.tail_may_be_shared = false;
            for c in &self.copies {
                let g = (0..kinds.len())
                    .find(|&g| l.seq.blocks(g).unwrap().get(old_len / bs()) == Some(&c.dst))
                    .expect("a copy's destination is a group's tail");
                prop_assert_eq!(c.tokens, old_len % bs());
                l.retired[g] = Some(c.src);
            }
        } else {
            prop_assert!(self.copies.is_empty());
        }
        self.check()?;
        if n > 0 {
            self.check_writers(i, old_len)?;
        }
        Ok(())
    }

    fn truncate(&mut self, i: usize, back: usize) -> Result<(), TestCaseError> {
        let kinds = self.kinds();
        let len = self.live[i].seq.len().saturating_sub(back);
        let l = &self.live[i];
        let old_len = l.seq.len();
        // The shortest length whose next token reads no null entry, found
        // by counting up.
        let min_len = kinds
            .iter()
            .enumerate()
            .filter(|&(g, _)| l.null[g] > 0)
            .map(|(g, kind)| {
                (0..)
                    .find(|&len| need(*kind, len, bs()) >= l.null[g])
                    .unwrap()
            })
            .max()
            .unwrap_or(0);
        let before: Vec<Vec<BlockId>> = (0..kinds.len())
            .map(|g| l.seq.blocks(g).unwrap().to_vec())
            .collect();
        let l = &mut self.live[i];
        let result = l.seq.truncate(len);
        if len < old_len && len != 0 && len < min_len {
            prop_assert_eq!(
                result,
                Err(HybridError::TruncateOutsideWindow { len, min_len })
            );
            for (g, table) in before.iter().enumerate() {
                prop_assert_eq!(l.seq.blocks(g).unwrap(), &table[..], "refused, changed");
            }
            prop_assert_eq!(l.seq.len(), old_len);
            return self.check();
        }
        let freed = result.map_err(|e| TestCaseError::fail(format!("{e}")))?;
        if len >= old_len {
            prop_assert_eq!(freed, 0);
            return self.check();
        }
        let keep = len.div_ceil(bs());
        let want: usize = before
            .iter()
            .enumerate()
            .map(|(g, t)| t.len() - keep.max(l.null[g]))
            .sum();
        prop_assert_eq!(freed, want);
        for g in 0..kinds.len() {
            l.null[g] = l.null[g].min(keep);
        }
        // A shortening truncate gives back the kept copy sources.
        for r in l.retired.iter_mut() {
            *r = None;
        }
        l.tail_may_be_shared =
            len % bs() != 0 && (l.tail_may_be_shared || old_len >= (len / bs() + 1) * bs());
        if l.tail_may_be_shared {
            // A cached tail this sequence holds alone loses its key.
            let tails: Vec<BlockId> = (0..kinds.len())
                .map(|g| l.seq.blocks(g).unwrap()[len / bs()])
                .collect();
            let refs = self.expected_refs();
            for id in tails {
                if refs[&id] == 1 {
                    if let Some(key) = self.cached.remove(&id) {
                        self.cache.remove(&key);
                    }
                }
            }
        }
        self.check()
    }

    fn fork(&mut self, i: usize) -> Result<(), TestCaseError> {
        let len = self.live[i].seq.len();
        self.copies.clear();
        let child = self.live[i].seq.try_fork(&mut self.copies).unwrap();
        let parent = &self.live[i];
        prop_assert_eq!(child.len(), len);
        let groups = self.groups.len();
        if len % bs() == 0 {
            prop_assert!(self.copies.is_empty());
        } else {
            prop_assert_eq!(self.copies.len(), groups);
        }
        for g in 0..groups {
            let (p, c) = (parent.seq.blocks(g).unwrap(), child.blocks(g).unwrap());
            prop_assert_eq!(
                &c[..len / bs()],
                &p[..len / bs()],
                "shared blocks of group {}",
                g
            );
            if len % bs() != 0 {
                let copy = self.copies[g];
                prop_assert_eq!(copy.src, p[len / bs()]);
                prop_assert_eq!(copy.dst, c[len / bs()]);
                prop_assert_eq!(copy.tokens, len % bs());
            }
        }
        let null = parent.null.clone();
        let family = parent.family;
        self.live.push(Live {
            seq: child,
            family,
            null,
            tail_may_be_shared: false,
            retired: vec![None; groups],
        });
        self.check()
    }

    fn publish(&mut self, i: usize) -> Result<(), TestCaseError> {
        let l = &self.live[i];
        let full = l.seq.len() / bs();
        let keys = self.keys(l.family, full);
        let mut want = 0;
        for g in 0..self.groups.len() {
            let table = l.seq.blocks(g).unwrap();
            for (b, key) in keys.group(g).unwrap().iter().enumerate().skip(l.null[g]) {
                let id = table[b];
                if !self.cached.contains_key(&id) && !self.cache.contains_key(key) {
                    self.cache.insert(*key, id);
                    self.cached.insert(id, *key);
                    want += 1;
                }
            }
        }
        let got = self.live[i].seq.publish(&keys).unwrap();
        prop_assert_eq!(got, want, "published");
        self.check()
    }
}

fn run(layout: &[KvGroup], ops: &[Op]) -> Result<(), TestCaseError> {
    let mut w = World {
        pool: Arc::new(BlockPool::new(BLOCKS, bs())),
        groups: KvGroups::new(layout.iter().copied()).unwrap(),
        live: Vec::new(),
        cache: HashMap::new(),
        cached: HashMap::new(),
        copies: Vec::new(),
    };
    for op in ops {
        if w.live.is_empty() && !matches!(op, Op::New { .. }) {
            continue;
        }
        let pick = |i: &Index| i.index(w.live.len());
        match op {
            Op::New { family, prompt } => {
                if w.live.len() < 5 {
                    w.new_request(*family, *prompt)?;
                }
            }
            Op::Append(i, n) => {
                let i = pick(i);
                if w.live[i].seq.len() + n <= MAX_LEN {
                    w.append(i, *n)?;
                }
            }
            Op::Truncate(i, back) => {
                let i = pick(i);
                w.truncate(i, *back)?;
            }
            Op::Fork(i) => {
                let i = pick(i);
                if w.live.len() < 5 {
                    w.fork(i)?;
                }
            }
            Op::Publish(i) => {
                let i = pick(i);
                w.publish(i)?;
            }
            Op::Reserve(i, tokens) => {
                let i = pick(i);
                let l = &mut w.live[i];
                l.seq.try_reserve(*tokens, 0).unwrap();
                prop_assert!(l.seq.capacity() >= l.seq.len() + tokens);
                w.check()?;
            }
            Op::Shrink(i) => {
                let i = pick(i);
                let l = &mut w.live[i];
                l.seq.shrink_to_fit();
                for g in 0..w.groups.len() {
                    prop_assert_eq!(
                        l.seq.blocks(g).unwrap().len(),
                        l.seq.len().div_ceil(bs()).max(l.null[g])
                    );
                }
                w.check()?;
            }
            Op::Drop(i) => {
                let i = pick(i);
                w.live.swap_remove(i);
                w.check()?;
            }
        }
    }
    w.live.clear();
    prop_assert_eq!(w.pool.free_blocks(), BLOCKS);
    prop_assert_eq!(w.pool.used_blocks(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    /// Hybrid sequences agree with the reference model after every
    /// operation, for every layout of groups.
    #[test]
    fn hybrid_sequences_follow_the_model(
        layout in layout(),
        bs in prop_oneof![Just(1usize), Just(2), Just(3), Just(4), Just(5), Just(8)],
        ops in prop::collection::vec(op(), 1..120),
    ) {
        BS_CELL.with(|c| c.set(bs));
        run(&layout, &ops)?;
    }
}
