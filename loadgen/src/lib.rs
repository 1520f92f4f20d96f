//! `loadgen`: an open-loop load generator for OpenAI-compatible LLM servers, with a
//! built-in mock server for self-calibration. See ARCHITECTURE.md ("Load generator").

pub mod schedule;
pub mod units;
pub mod workload;
pub mod mock;
pub mod sse;
pub mod client;
pub mod progress;
pub mod run;
pub mod host;
pub mod calibrate;
pub mod cli;
