//! Statistics, SLO checks, capacity plans, A/B tests and renderers for loadgen runs.
pub mod ab;
pub mod histograms;
pub mod latency;
pub mod metrics;
pub mod plan;
pub mod rates;
pub mod records;
pub mod render;
pub mod samples;
pub mod search;
pub mod server_metrics;
pub mod sessions;
pub mod slo;
pub mod stats;
pub mod summary;
pub mod table;
pub mod timeline;
