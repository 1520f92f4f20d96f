//! The options of a run and of the experiments made of runs: the clap types, the parsing
//! and checks of what clap cannot check alone, and a run's typed spec ([`RunSpec`]) that
//! everything below the command line reads.

pub mod bound;
pub mod compare;
pub mod matrix;
pub mod matrix_toml;
pub mod run;
pub mod run_args;
pub mod search;
pub mod sizing;
pub mod sweep;
pub mod tune;

pub use run::RunSpec;
