//! Model presets and KV-cache sizing: how many blocks a memory budget buys.
//!
//! KV bytes per token = 2 (a key and a value) x layers x KV heads x head
//! dimension x bytes per element; blocks = memory / (bytes per token x block
//! size), rounded down.

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
    /// The preset's KV-cache shape.
    pub fn shape(self) -> ModelShape {
        let (layers, kv_heads) = match self {
            ModelPreset::Llama3_8b => (32, 8),
            ModelPreset::Llama3_70b => (80, 8),
            ModelPreset::Mistral7b => (32, 8),
            ModelPreset::Qwen2_7b => (28, 4),
        };
        ModelShape {
            layers,
            kv_heads,
            head_dim: 128,
            bytes_per_elem: 2,
        }
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ModelPreset::Llama3_8b => "llama-3-8b",
            ModelPreset::Llama3_70b => "llama-3-70b",
            ModelPreset::Mistral7b => "mistral-7b",
            ModelPreset::Qwen2_7b => "qwen2-7b",
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
