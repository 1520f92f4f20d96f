//! The engine: model loading, tokenizer, the forward pass over CPU and CUDA backends,
//! paged KV cache, continuous-batching scheduler, sampler and the OpenAI-compatible
//! server. See the workspace's `docs/ARCHITECTURE.md`.

pub mod backend;
pub mod bandwidth;
pub mod config;
pub mod engine;
pub mod generation;
pub mod grammar;
pub mod kv_cache;
pub mod kv_sizing;
pub mod layer_groups;
pub mod limits;
pub mod loader;
pub mod model;
pub mod reasoning;
pub mod sampler;
pub mod scheduler;
pub mod sequence;
pub mod server;
pub mod tokenizer;
pub mod weights;
