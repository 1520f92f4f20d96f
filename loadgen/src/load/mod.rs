//! What a run sends and when: the workload's requests, the arrival schedule, the request
//! plan that joins them (prepared without touching the network), and a shard's share of it.

pub mod plan;
pub mod schedule;
pub mod shard;
pub mod workload;
