//! `loadgen`: an open-loop load generator for OpenAI-compatible LLM servers, with a
//! built-in mock server for self-calibration. See the workspace's docs/ARCHITECTURE.md
//! ("loadgen's pipeline").
//!
//! Its wings, each pointing only at those listed after it: `commands` (the command line's
//! subcommands: parse, print, exit codes) → `experiments` (sweep, compare, tune, matrix:
//! many runs and the server process) → `mock` (the built-in server and calibration against
//! it) → `run` (one run's execution) → `spec` (the typed options of a run) → `load` (what is
//! sent and when) → `wire` (how it is sent). Folder formats and judgements live in `reports`.

pub mod cli;
pub mod commands;
pub mod experiments;
pub mod gate;
pub mod load;
pub mod mock;
pub mod run;
pub mod spec;
pub mod units;
pub mod wire;
