//! How a request reaches a server and its answer comes back: the serving APIs, the HTTP
//! client with its stamped connections and TLS, server-sent events, and the Prometheus scrape.

pub mod api;
pub mod backend;
pub mod client;
pub mod connections;
pub mod extra_body;
pub mod identify;
pub mod scrape;
pub mod sse;
pub mod stamped_tcp;
pub mod target;
pub mod tls;
