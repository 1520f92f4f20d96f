//! `loadgen`: an open-loop load generator for OpenAI-compatible LLM servers, with a
//! built-in mock server for self-calibration. See the workspace's docs/ARCHITECTURE.md
//! ("loadgen's pipeline").
//!
//! Its wings, each importing only the wings after it: `commands` (the subcommands: parse,
//! print, exit codes) → `experiments` (sweep, compare, tune, matrix: many runs, and the server
//! process) → `mock` (the built-in server, and calibration against it) → `run` (one run:
//! prepared from its spec, then executed) → `spec` (the options, and a run's typed
//! `RunSpec`) → `wire` (how a request is sent) → `load` (what is sent and when). `units` and
//! `gate` are leaves. Folder formats and judgements live in `reports`.

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
