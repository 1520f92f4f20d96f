//! Which requests went over a connection opened for them, and how long opening it took.
//!
//! reqwest pools connections and says nothing of them per request. A connector layer times
//! every connection it opens and notes it by the connection's local address; a response
//! carries that address (hyper's `HttpInfo`), and the first response seen on a connection
//! claims its connect time. Later responses on it (reused from the pool) claim nothing.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use hyper_util::client::legacy::connect::{Connection, HttpInfo};

/// Connect times of the connections not yet claimed by a response, by local address.
#[derive(Debug, Clone, Default)]
pub struct ConnectLog(Arc<Mutex<HashMap<SocketAddr, f64>>>);

impl ConnectLog {
    /// The connector layer that fills this log.
    pub fn layer(&self) -> TimedConnectLayer {
        TimedConnectLayer(self.clone())
    }

    /// The connect time (ms) of the connection `resp` came over when `resp` is its first
    /// response, else `None` (a pooled connection, or one whose address is unknown).
    pub fn claim(&self, resp: &reqwest::Response) -> Option<f64> {
        let local = resp.extensions().get::<HttpInfo>()?.local_addr();
        self.0.lock().expect("connect log").remove(&local)
    }

    /// Forgets every unclaimed connection (those opened before the run).
    pub fn clear(&self) {
        self.0.lock().expect("connect log").clear();
    }

    fn note(&self, local: SocketAddr, ms: f64) {
        self.0.lock().expect("connect log").insert(local, ms);
    }
}

/// Wraps reqwest's connector service in [`TimedConnect`].
#[derive(Debug, Clone)]
pub struct TimedConnectLayer(ConnectLog);

impl<S> tower_layer::Layer<S> for TimedConnectLayer {
    type Service = TimedConnect<S>;

    fn layer(&self, inner: S) -> TimedConnect<S> {
        TimedConnect {
            inner,
            log: self.0.clone(),
        }
    }
}

/// A connector that notes how long each connection took to open.
#[derive(Debug, Clone)]
pub struct TimedConnect<S> {
    inner: S,
    log: ConnectLog,
}

impl<S, R> tower_service::Service<R> for TimedConnect<S>
where
    S: tower_service::Service<R>,
    S::Response: Connection + Send + 'static,
    S::Error: Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let started = Instant::now();
        let connecting = self.inner.call(req);
        let log = self.log.clone();
        Box::pin(async move {
            let conn = connecting.await?;
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            let mut extras = http::Extensions::new();
            conn.connected().get_extras(&mut extras);
            if let Some(info) = extras.get::<HttpInfo>() {
                log.note(info.local_addr(), ms);
            }
            Ok(conn)
        })
    }
}
