//! A KV-aware router's view of a hybrid model's worker: worker threads
//! serve multi-turn conversations of a gpt-oss-like model (a sliding-window
//! group of 128 tokens and a full-attention group) over one pool that
//! records KV events, while a router thread drains the events and keeps,
//! per group of layers, the keys the worker caches. At the end the view is
//! checked against the pool: every key the router believes cached is,
//! on the block the events named, and no key is left out.
//!
//! Run it with `cargo run --release --example kv_router`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use kvslots::{
    hash_blocks, BlockHash, BlockId, BlockPool, HybridSequence, KvEvent, KvGroup, KvGroups,
    Sequence,
};

/// Tokens per block.
const BLOCK_SIZE: usize = 16;
/// Blocks in the pool (both groups' blocks come from it).
const BLOCKS: usize = 256;
/// The shared system prompt's length in tokens.
const SYSTEM: usize = 100;
/// Worker threads, conversations per worker, turns per conversation, and
/// tokens generated per turn.
const WORKERS: u32 = 3;
const CONVERSATIONS: u32 = 6;
const TURNS: u32 = 4;
const DECODE: usize = 24;

/// What the router believes the worker caches: each key's group and block.
#[derive(Default)]
struct View {
    keys: HashMap<BlockHash, (Option<usize>, BlockId)>,
    stores: [u64; 2],
    removals: [u64; 2],
    resyncs: u64,
}

impl View {
    /// Applies one event, as a router's indexer does.
    fn apply(&mut self, event: KvEvent) {
        match event {
            KvEvent::BlockStored {
                keys,
                block_ids,
                group,
                ..
            } => {
                for (key, id) in keys.into_iter().zip(block_ids) {
                    self.keys.insert(key, (group, id));
                    self.stores[group.unwrap_or(0)] += 1;
                }
            }
            KvEvent::BlockRemoved { keys, group } => {
                for key in keys {
                    let known = self.keys.remove(&key).map(|(g, _)| g);
                    // A removal names the group its key was stored under.
                    assert!(known.is_none() || known == Some(group), "{key:?}");
                    self.removals[group.unwrap_or(0)] += 1;
                }
            }
            // The stream's first event: the worker's cache starts empty.
            KvEvent::AllBlocksCleared => self.keys.clear(),
            // Events were lost (the router lagged): forget everything and
            // rebuild from what follows.
            KvEvent::Dropped { .. } => {
                self.keys.clear();
                self.resyncs += 1;
            }
            _ => {}
        }
    }
}

fn main() {
    let pool = Arc::new(
        BlockPool::builder(BLOCKS, BLOCK_SIZE)
            .prefix_cache(true)
            .kv_events(1 << 15)
            .build()
            .expect("a pool of 256 blocks"),
    );
    let groups = KvGroups::new([KvGroup::SlidingWindow { window_tokens: 128 }, KvGroup::Full])
        .expect("two groups");
    let done = Arc::new(AtomicBool::new(false));
    let router = {
        let (pool, done) = (Arc::clone(&pool), Arc::clone(&done));
        thread::spawn(move || {
            let (mut view, mut batch) = (View::default(), Vec::new());
            loop {
                // Acquire: pairs with the Release store after the workers
                // joined, so the drain below sees every event they made.
                let last = done.load(Ordering::Acquire);
                pool.drain_events(&mut batch);
                batch.drain(..).for_each(|e| view.apply(e));
                if last {
                    return view;
                }
                thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (pool, groups) = (Arc::clone(&pool), groups.clone());
            thread::spawn(move || {
                let (mut prompt_tokens, mut prefilled, mut keys) = (0, 0, Vec::new());
                for c in 0..CONVERSATIONS {
                    let mut history: Vec<u32> = (0..SYSTEM as u32).collect();
                    for turn in 0..TURNS {
                        let user = 1_000_000 * (w + 1) + 10_000 * c + 100 * turn;
                        history.extend(user..user + 40);
                        keys.clear();
                        hash_blocks(b"", &history, BLOCK_SIZE, &mut keys);
                        let group_keys = groups.keys(&keys);
                        let mut seq = HybridSequence::new(Arc::clone(&pool), groups.clone());
                        let hit = seq.try_match_prefix(&group_keys).expect("the model's keys");
                        // Prefill the rest (waiting for room if the other
                        // workers hold it), then cache every full block.
                        seq.reserve_blocking(history.len() + DECODE, 0, None)
                            .expect("a conversation fits the pool");
                        seq.try_append(history.len() - seq.len()).expect("reserved");
                        prompt_tokens += history.len();
                        prefilled += history.len() - hit * BLOCK_SIZE;
                        seq.publish(&group_keys).expect("the model's keys");
                        // Decode; the reply joins the history, and its full
                        // blocks are cached as they fill.
                        for t in 0..DECODE as u32 {
                            seq.try_append(1).expect("reserved");
                            history.push(user + 50 + t);
                        }
                        keys.clear();
                        hash_blocks(b"", &history, BLOCK_SIZE, &mut keys);
                        seq.publish(&groups.keys(&keys)).expect("the model's keys");
                    }
                }
                (prompt_tokens, prefilled)
            })
        })
        .collect();
    let (mut prompt_tokens, mut prefilled) = (0, 0);
    for worker in workers {
        let (p, f) = worker.join().expect("a worker");
        prompt_tokens += p;
        prefilled += f;
    }
    // Release: see the router's Acquire load.
    done.store(true, Ordering::Release);
    let view = router.join().expect("the router");

    // The router's view is the pool's cache: each key on the block named.
    let mut per_group = [0usize; 2];
    for (key, &(group, id)) in &view.keys {
        let mut probe = Sequence::new(Arc::clone(&pool));
        assert_eq!(probe.try_match_prefix(&[*key]), 1, "{key:?} is not cached");
        assert_eq!(probe.blocks(), [id], "{key:?} is on another block");
        per_group[group.expect("a hybrid model's keys name their group")] += 1;
    }
    assert_eq!(
        view.keys.len(),
        pool.cached_blocks(),
        "a cached key the router missed"
    );

    println!(
        "prompt tokens:        {prompt_tokens} ({prefilled} prefilled, {} from the cache)",
        prompt_tokens - prefilled
    );
    for (g, name) in ["sliding 128", "full"].iter().enumerate() {
        println!(
            "group {g} ({name:>11}): {:>5} stores, {:>5} removals, {:>3} keys cached now",
            view.stores[g], view.removals[g], per_group[g]
        );
    }
    println!(
        "router view:          {} keys, the pool's {} cached blocks exactly ({} resyncs)",
        view.keys.len(),
        pool.cached_blocks(),
        view.resyncs
    );
}
