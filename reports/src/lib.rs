//! Statistics, SLO checks, capacity plans, A/B tests and renderers for loadgen runs; the
//! run, sweep and comparison folder formats, and the judgements on them (saturation, tune
//! results).
pub mod ab;
pub mod bound;
pub mod capacity;
pub mod classes;
pub mod comparison;
pub mod conditions;
pub mod csv_export;
pub mod diagnosis;
pub mod folders;
pub mod histograms;
pub mod knob_roles;
pub mod latency;
pub mod matrix;
pub mod metrics;
pub mod probe;
pub mod rates;
pub mod records;
pub mod render;
pub mod samples;
pub mod saturation;
pub mod search;
pub mod server_metrics;
pub mod sessions;
pub mod slo;
pub mod stats;
pub mod summary;
pub mod table;
pub mod timeline;
pub mod tune;
