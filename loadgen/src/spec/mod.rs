//! The options of a run and of the experiments made of runs: the clap types, and the
//! parsing and checks of what clap cannot check alone.

pub mod bound;
pub mod compare;
pub mod matrix;
pub mod matrix_toml;
pub mod run_args;
pub mod search;
pub mod sizing;
pub mod sweep;
pub mod tune;
