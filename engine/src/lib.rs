//! The engine core: model loading, tokenizer, CPU backend, paged KV cache,
//! continuous-batching scheduler and sampler. See `../shared/ARCHITECTURE.md`.

pub mod config;
pub mod model;
pub mod tokenizer;
pub mod weights;
