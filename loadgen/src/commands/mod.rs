//! One module per subcommand: its arguments and what it does with them. Shared work lives
//! outside: run preparation in `prepare`, folder formats in `folders`, analyses in
//! `saturation`, `probe`, `knee_search`, `comparison` and `tune_results`.

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
