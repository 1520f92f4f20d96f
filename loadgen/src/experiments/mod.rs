//! Experiments made of many runs: a sweep of levels (with its probe and knee search),
//! compare's alternating rounds, tune's configurations, a matrix's rows, and the server
//! process they may start. Each run is `launch`ed from its options.

pub mod compare;
pub mod launch;
pub mod matrix;
pub mod server;
pub mod sweep;
pub mod tune;
