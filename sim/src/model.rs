//! Model presets and KV-cache sizing: how many blocks a memory budget buys.
//!
//! KV bytes per token = 2 (a key and a value) x layers x KV heads x head
//! dimension x bytes per element; blocks = memory / (bytes per token x block
//! size), rounded down.
//!
//! A hybrid preset (Gemma 3 27B, gpt-oss-20b, Llama 4 Scout) has
//! sliding-window or chunked local attention layers beside its
//! full-attention ones. Its layers are grouped as vLLM groups
//! them ([`layout`]): the smallest number of layers of one kind is the
//! group size (the largest, if it is less than 1.5 times the smallest),
//! each kind's layers are cut into groups of that size (the last one padded
//! to it), and a block holds one group's layers for `block_size` tokens.
//! So its pool is sized at the group size's bytes per token, and every
//! sequence holds one table per group.

use std::fmt;

use clap::ValueEnum;
use serde::Serialize;

/// A model whose KV-cache shape the simulator knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
pub enum ModelPreset {
    /// Llama 3 8B: 32 layers, 8 KV heads (GQA), head dim 128, 2-byte KV.
    #[value(name = "llama-3-8b")]
    Llama3_8b,
    /// Llama 3 70B: 80 layers, 8 KV heads, head dim 128, 2-byte KV.
    #[value(name = "llama-3-70b")]
    Llama3_70b,
    /// Mistral 7B: 32 layers, 8 KV heads, head dim 128, 2-byte KV.
    #[value(name = "mistral-7b")]
    Mistral7b,
    /// Qwen2 7B: 28 layers, 4 KV heads, head dim 128, 2-byte KV.
    #[value(name = "qwen2-7b")]
    Qwen2_7b,
    /// Gemma 3 27B: 62 layers, 16 KV heads, head dim 128, 2-byte KV; five
    /// sliding-window layers (window 1024) to one global, 52 and 10.
    #[value(name = "gemma-3-27b")]
    Gemma3_27b,
    /// gpt-oss-20b: 24 layers, 8 KV heads, head dim 64, 2-byte KV;
    /// sliding-window (window 128) and full layers alternating, 12 and 12.
    #[value(name = "gpt-oss-20b")]
    GptOss20b,
    /// Llama 4 Scout (17B-16E): 48 layers, 8 KV heads, head dim 128, 2-byte
    /// KV; chunked local attention (chunks of 8192 tokens) in three layers
    /// of four, full attention (without RoPE) in every fourth, 36 and 12.
    #[value(name = "llama-4-scout")]
    Llama4Scout,
}

/// The attention of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// Full (global) attention.
    Full,
    /// Sliding-window attention over this many tokens (the token itself
    /// included).
    Sliding(usize),
    /// Chunked local attention in chunks of this many tokens (a token
    /// attends to its own chunk).
    Chunked(usize),
}

/// How a model's layers are grouped into one pool's block tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The groups, in order: the full ones, then the sliding ones (by
    /// window), then the chunked ones (by chunk).
    pub groups: kvslots::KvGroups,
    /// Layers a group (and so a block) holds.
    pub layers_per_group: u64,
    /// Layers of padding in the last group of each kind (memory the
    /// grouping wastes).
    pub padding_layers: u64,
}

/// vLLM's grouping of `kinds` (see the module's docs).
///
/// # Panics
///
/// Panics if `kinds` is empty.
pub fn layout(kinds: &[LayerKind]) -> Layout {
    assert!(!kinds.is_empty(), "a model has layers");
    let mut counts: Vec<(LayerKind, u64)> = Vec::new();
    for &k in kinds {
        match counts.iter_mut().find(|(kind, _)| *kind == k) {
            Some((_, n)) => *n += 1,
            None => counts.push((k, 1)),
        }
    }
    // Full first, then sliding by window, then chunked by chunk, as the
    // groups are listed.
    counts.sort_by_key(|&(k, _)| match k {
        LayerKind::Full => (0, 0),
        LayerKind::Sliding(w) => (1, w),
        LayerKind::Chunked(c) => (2, c),
    });
    let min = counts.iter().map(|&(_, n)| n).min().unwrap_or(1);
    let max = counts.iter().map(|&(_, n)| n).max().unwrap_or(1);
    let size = if 2 * max < 3 * min { max } else { min };
    let mut groups = Vec::new();
    let mut padding = 0;
    for &(k, n) in &counts {
        let g = n.div_ceil(size);
        padding += g * size - n;
        let kind = match k {
            LayerKind::Full => kvslots::KvGroup::Full,
            LayerKind::Sliding(window_tokens) => kvslots::KvGroup::SlidingWindow { window_tokens },
            LayerKind::Chunked(chunk_tokens) => kvslots::KvGroup::ChunkedLocal { chunk_tokens },
        };
        groups.extend((0..g).map(|_| kind));
    }
    Layout {
        groups: kvslots::KvGroups::new(groups)
            .expect("windows and chunks of at least 1, few groups"),
        layers_per_group: size,
        padding_layers: padding,
    }
}

/// The KV-cache shape of one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModelShape {
    /// Transformer layers.
    pub layers: u64,
    /// Key/value heads per layer (after grouped-query attention).
    pub kv_heads: u64,
    /// Dimension of one head.
    pub head_dim: u64,
    /// Bytes per stored element (2 for fp16/bf16).
    pub bytes_per_elem: u64,
}

impl ModelShape {
    /// KV bytes per token: 2 x layers x KV heads x head dim x bytes per
    /// element. Saturates instead of overflowing.
    pub fn kv_bytes_per_token(&self) -> u64 {
        2u64.saturating_mul(self.layers)
            .saturating_mul(self.kv_heads)
            .saturating_mul(self.head_dim)
            .saturating_mul(self.bytes_per_elem)
    }
}

impl ModelPreset {
    /// The preset's KV-cache shape (every layer).
    pub fn shape(self) -> ModelShape {
        let (layers, kv_heads, head_dim) = match self {
            ModelPreset::Llama3_8b => (32, 8, 128),
            ModelPreset::Llama3_70b => (80, 8, 128),
            ModelPreset::Mistral7b => (32, 8, 128),
            ModelPreset::Qwen2_7b => (28, 4, 128),
            ModelPreset::Gemma3_27b => (62, 16, 128),
            ModelPreset::GptOss20b => (24, 8, 64),
            ModelPreset::Llama4Scout => (48, 8, 128),
        };
        ModelShape {
            layers,
            kv_heads,
            head_dim,
            bytes_per_elem: 2,
        }
    }

    /// Each layer's attention, in order; `None` for a model of full
    /// attention only.
    ///
    /// Gemma 3 27B (`sliding_window` 1024, `sliding_window_pattern` 6):
    /// layers 6, 12, ..., 60 (counted from 1) are global, the others
    /// local. gpt-oss-20b (`sliding_window` 128, `layer_types`): the even
    /// layers (counted from 0) slide, the odd ones are full. Llama 4 Scout
    /// (`attention_chunk_size` 8192, `no_rope_layers`): layers 4, 8, ...,
    /// 48 (counted from 1) are full attention without RoPE, the others
    /// chunked local attention.
    pub fn layer_kinds(self) -> Option<Vec<LayerKind>> {
        let layers = self.shape().layers as usize;
        match self {
            ModelPreset::Gemma3_27b => Some(
                (0..layers)
                    .map(|i| {
                        if (i + 1) % 6 == 0 {
                            LayerKind::Full
                        } else {
                            LayerKind::Sliding(1024)
                        }
                    })
                    .collect(),
            ),
            ModelPreset::GptOss20b => Some(
                (0..layers)
                    .map(|i| {
                        if i % 2 == 0 {
                            LayerKind::Sliding(128)
                        } else {
                            LayerKind::Full
                        }
                    })
                    .collect(),
            ),
            ModelPreset::Llama4Scout => Some(
                (0..layers)
                    .map(|i| {
                        if (i + 1) % 4 == 0 {
                            LayerKind::Full
                        } else {
                            LayerKind::Chunked(8192)
                        }
                    })
                    .collect(),
            ),
            _ => None,
        }
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ModelPreset::Llama3_8b => "llama-3-8b",
            ModelPreset::Llama3_70b => "llama-3-70b",
            ModelPreset::Mistral7b => "mistral-7b",
            ModelPreset::Qwen2_7b => "qwen2-7b",
            ModelPreset::Gemma3_27b => "gemma-3-27b",
            ModelPreset::GptOss20b => "gpt-oss-20b",
            ModelPreset::Llama4Scout => "llama-4-scout",
        }
    }
}

impl fmt::Display for ModelPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the pool was sized.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sizing {
    /// The preset's name, or `"custom"` when `--kv-bytes-per-token` was given.
    pub model: String,
    /// KV bytes per token.
    pub kv_bytes_per_token: u64,
    /// The memory budget in bytes.
    pub memory_bytes: u64,
    /// Tokens per block.
    pub block_size: usize,
    /// KV bytes per block.
    pub bytes_per_block: u64,
    /// Blocks in the pool.
    pub num_blocks: usize,
}

/// Why a sizing was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizingError {
    /// The block size was zero.
    ZeroBlockSize,
    /// The KV bytes per token was zero.
    ZeroBytesPerToken,
    /// The memory budget was not a finite, non-negative number of GiB.
    BadMemory(String),
    /// More blocks than a block id can name (`u32`).
    TooManyBlocks(u64),
}

impl fmt::Display for SizingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizingError::ZeroBlockSize => f.write_str("--block-size must be at least 1"),
            SizingError::ZeroBytesPerToken => {
                f.write_str("--kv-bytes-per-token must be at least 1")
            }
            SizingError::BadMemory(m) => {
                write!(f, "--memory-gib must be a finite number >= 0, got {m}")
            }
            SizingError::TooManyBlocks(n) => {
                write!(
                    f,
                    "{n} blocks do not fit a u32 block id: lower --memory-gib, or raise \
                     --block-size or --kv-bytes-per-token"
                )
            }
        }
    }
}

impl std::error::Error for SizingError {}

/// Bytes in one GiB.
pub const GIB: f64 = (1u64 << 30) as f64;

/// Sizes a pool: `memory_gib` GiB of KV cache at `kv_bytes_per_token`, cut
/// into blocks of `block_size` tokens.
pub fn size_pool(
    model: &str,
    kv_bytes_per_token: u64,
    memory_gib: f64,
    block_size: usize,
) -> Result<Sizing, SizingError> {
    if block_size == 0 {
        return Err(SizingError::ZeroBlockSize);
    }
    if kv_bytes_per_token == 0 {
        return Err(SizingError::ZeroBytesPerToken);
    }
    if !memory_gib.is_finite() || memory_gib < 0.0 {
        return Err(SizingError::BadMemory(memory_gib.to_string()));
    }
    // `as` saturates for floats: a huge budget becomes u64::MAX bytes.
    let memory_bytes = (memory_gib * GIB) as u64;
    let bytes_per_block = kv_bytes_per_token.saturating_mul(block_size as u64);
    let blocks = memory_bytes / bytes_per_block;
    if blocks > u64::from(u32::MAX) {
        return Err(SizingError::TooManyBlocks(blocks));
    }
    Ok(Sizing {
        model: model.to_string(),
        kv_bytes_per_token,
        memory_bytes,
        block_size,
        bytes_per_block,
        num_blocks: blocks as usize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_3_8b_is_128_kib_per_token_and_8192_blocks_in_16_gib() {
        let shape = ModelPreset::Llama3_8b.shape();
        assert_eq!(shape.kv_bytes_per_token(), 131_072);
        let s = size_pool("llama-3-8b", shape.kv_bytes_per_token(), 16.0, 16).unwrap();
        assert_eq!(s.num_blocks, 8192);
        assert_eq!(s.bytes_per_block, 2 << 20);
    }

    #[test]
    fn presets_have_the_documented_shapes() {
        assert_eq!(
            ModelPreset::Llama3_70b.shape().kv_bytes_per_token(),
            327_680
        );
        assert_eq!(ModelPreset::Mistral7b.shape().kv_bytes_per_token(), 131_072);
        assert_eq!(ModelPreset::Qwen2_7b.shape().kv_bytes_per_token(), 57_344);
    }

    #[test]
    fn hybrid_presets_follow_their_published_configs() {
        let gemma = ModelPreset::Gemma3_27b;
        // 62 layers x 16 KV heads x head dim 128 x 2 (K and V) x 2 bytes.
        assert_eq!(gemma.shape().kv_bytes_per_token(), 62 * 8192);
        let kinds = gemma.layer_kinds().unwrap();
        assert_eq!(kinds.len(), 62);
        assert_eq!(kinds.iter().filter(|k| **k == LayerKind::Full).count(), 10);
        assert_eq!(kinds[5], LayerKind::Full);
        assert_eq!(kinds[4], LayerKind::Sliding(1024));
        let l = layout(&kinds);
        // Groups of 10 layers: 1 full, 6 sliding (52 layers, 8 of padding).
        assert_eq!((l.layers_per_group, l.padding_layers), (10, 8));
        assert_eq!(l.groups.len(), 7);
        assert_eq!(l.groups.get(0), Some(kvslots::KvGroup::Full));

        let oss = ModelPreset::GptOss20b;
        assert_eq!(oss.shape().kv_bytes_per_token(), 24 * 2048);
        let kinds = oss.layer_kinds().unwrap();
        assert_eq!(
            (kinds[0], kinds[1]),
            (LayerKind::Sliding(128), LayerKind::Full)
        );
        let l = layout(&kinds);
        assert_eq!(
            (l.layers_per_group, l.padding_layers, l.groups.len()),
            (12, 0, 2)
        );
        assert!(ModelPreset::Llama3_8b.layer_kinds().is_none());

        let scout = ModelPreset::Llama4Scout;
        // 48 layers x 8 KV heads x head dim 128 x 2 (K and V) x 2 bytes.
        assert_eq!(scout.shape().kv_bytes_per_token(), 48 * 4096);
        let kinds = scout.layer_kinds().unwrap();
        assert_eq!(kinds.iter().filter(|k| **k == LayerKind::Full).count(), 12);
        assert_eq!(
            (kinds[2], kinds[3]),
            (LayerKind::Chunked(8192), LayerKind::Full)
        );
        let l = layout(&kinds);
        // Groups of 12 layers: 1 full, 3 chunked.
        assert_eq!(
            (l.layers_per_group, l.padding_layers, l.groups.len()),
            (12, 0, 4)
        );
        assert_eq!(
            l.groups.get(3),
            Some(kvslots::KvGroup::ChunkedLocal { chunk_tokens: 8192 })
        );
    }

    #[test]
    fn vllm_grouping_pads_and_takes_the_larger_count_when_close() {
        let kinds = |full: usize, sliding: usize| {
            let mut k = vec![LayerKind::Full; full];
            k.extend(vec![LayerKind::Sliding(8); sliding]);
            k
        };
        // 10 full, 20 sliding: groups of 10, no padding.
        let l = layout(&kinds(10, 20));
        assert_eq!(
            (l.layers_per_group, l.padding_layers, l.groups.len()),
            (10, 0, 3)
        );
        // 10 and 14 (14 < 15): one group of 14 each, 4 of padding.
        let l = layout(&kinds(10, 14));
        assert_eq!(
            (l.layers_per_group, l.padding_layers, l.groups.len()),
            (14, 4, 2)
        );
        // One kind: one group.
        let l = layout(&kinds(32, 0));
        assert_eq!((l.layers_per_group, l.groups.len()), (32, 1));
    }

    #[test]
    fn bad_sizings_are_refused() {
        assert_eq!(size_pool("m", 1, 1.0, 0), Err(SizingError::ZeroBlockSize));
        assert_eq!(
            size_pool("m", 0, 1.0, 16),
            Err(SizingError::ZeroBytesPerToken)
        );
        assert!(matches!(
            size_pool("m", 1, -1.0, 16),
            Err(SizingError::BadMemory(_))
        ));
        assert!(matches!(
            size_pool("m", 1, f64::NAN, 16),
            Err(SizingError::BadMemory(_))
        ));
        assert!(matches!(
            size_pool("m", 1, 1e9, 1),
            Err(SizingError::TooManyBlocks(_))
        ));
        assert_eq!(size_pool("m", 1024, 0.0, 16).unwrap().num_blocks, 0);
    }
}
