//! `loadgen`: an open-loop load generator for OpenAI-compatible LLM servers, with a
//! built-in mock server for self-calibration. See ARCHITECTURE.md ("Load generator").

pub mod calibrate;
pub mod cli;
pub mod client;
pub mod compare;
pub mod host;
pub mod mock;
pub mod plan_cmd;
pub mod progress;
pub mod report_cmd;
pub mod run;
pub mod schedule;
pub mod server_proc;
pub mod sse;
pub mod sweep;
pub mod units;
pub mod workload;
