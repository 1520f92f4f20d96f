//! `loadgen`: an open-loop load generator for OpenAI-compatible LLM servers, with a
//! built-in mock server for self-calibration. See ARCHITECTURE.md ("Load generator").

pub mod api;
pub mod backend;
pub mod calibrate;
pub mod cli;
pub mod client;
pub mod client_cpu;
pub mod clock;
pub mod commands;
pub mod comparison;
pub mod connections;
pub mod extra_body;
pub mod folders;
pub mod gate;
pub mod host;
pub mod merge;
pub mod mock;
pub mod prepare;
pub mod probe;
pub mod progress;
pub mod run;
pub mod saturation;
pub mod schedule;
pub mod scrape;
pub mod server_proc;
pub mod shard;
pub mod sse;
pub mod stamped_tcp;
pub mod stop;
pub mod target;
pub mod tls;
pub mod units;
pub mod views;
pub mod workload;
