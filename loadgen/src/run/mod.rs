//! One run's execution: sending the plan on its schedule, the clock, progress and stop, the
//! client's own CPU and host, and the merge of a sharded run's folders.

pub mod client_cpu;
pub mod clock;
pub mod execute;
pub mod host;
pub mod merge;
pub mod prepare;
pub mod progress;
pub mod send;
pub mod stop;
pub mod trace_sessions;
