//! Experiments made of many runs: a sweep of levels (with its probe and knee search),
//! compare's alternating rounds, tune's configurations, a matrix's rows, and the server
//! process they may start. A level or a matrix row runs through `launch` (prepared,
//! calibrated when asked, executed); compare's rounds, probe steps and warm-up prefixes
//! prepare once and execute directly.

pub mod compare;
pub mod launch;
pub mod matrix;
pub mod server;
pub mod sweep;
pub mod tune;
