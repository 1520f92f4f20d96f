//! One module per subcommand: its arguments and what it does with them. Shared work lives
//! outside: run preparation in `prepare` and `launch`, the probe and the knee search in
//! `probe` and `knee_search`; folder formats, judgements and views in `reports` (`folders`,
//! `saturation`, `tune::results`, `comparison`, `render::views`).

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
