//! One module per subcommand: it parses its arguments (their clap types in `spec`), calls
//! the experiment or run that does the work, prints, and maps the outcome to an exit code
//! (`gate`). No command imports another: shared work lives in `experiments`, `run` and
//! `reports`.

pub mod calibrate;
pub mod compare;
pub mod matrix;
pub mod merge;
pub mod mock_server;
pub mod plan;
pub mod report;
pub mod run;
pub mod sweep;
pub mod tune;
