//! The measured requests' HTTP client: hyper's pooled HTTP/1.1 client over connections
//! that stamp arrivals ([`StampedTcp`]), plain or under TLS (the stamps are then those of
//! the TCP bytes that carried each TLS record), and say how long they took to open (the TLS
//! handshake included).
//!
//! Every response carries its connection's [`OpenedConnection`] (hyper's connection
//! extras): the stream's arrivals, read beside each body chunk, and its opening, which the
//! first response seen on the connection claims. Later responses on it (reused from the
//! pool) claim nothing, and neither does a first response whose request was sent after the
//! connection was open: hyper opens a connection for a waiting request but hands that
//! request an idle one when one frees first, and the new connection then goes to whichever
//! request waits next, or to the pool.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::wire::stamped_tcp::{Arrivals, StampedTcp};
use crate::wire::tls::{server_name, TlsSettings};

/// The measured requests' client.
pub type HttpClient = Client<StampedConnector, Full<Bytes>>;

/// An HTTP/1.1 keep-alive client with `TCP_NODELAY` and a pool for `pool` idle connections;
/// `tls` serves `https://` URLs.
pub fn http_client(pool: usize, tls: Option<&TlsSettings>) -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(pool.max(1))
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .build(StampedConnector {
            tls: tls.map(|t| t.config.clone()),
        })
}

/// A connection's byte stream: plain TCP, or TLS over it.
pub enum Transport {
    Plain(StampedTcp),
    Tls(Box<tokio_rustls::client::TlsStream<StampedTcp>>),
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Transport::Tls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Transport::Tls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Transport::Tls(io) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Transport::Plain(io) => io.is_write_vectored(),
            Transport::Tls(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(io) => Pin::new(io).poll_flush(cx),
            Transport::Tls(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Transport::Tls(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }
}

/// What a response knows of the connection it came over.
#[derive(Debug, Clone)]
pub struct OpenedConnection(Arc<ConnectionFacts>);

#[derive(Debug)]
struct ConnectionFacts {
    arrivals: Arc<Arrivals>,
    /// When the connector started opening it, and when it was open.
    started: Instant,
    opened: Instant,
    claimed: AtomicBool,
}

impl OpenedConnection {
    /// For the first response on the connection, whose request was sent at `sent` while the
    /// connection was still opening: how long (ms) that request waited for it to open (from
    /// `sent` or from the start of the opening, whichever is later). `None` for every other.
    pub fn claim_connect_ms(&self, sent: Instant) -> Option<f64> {
        let facts = &self.0;
        let first = !facts.claimed.swap(true, Ordering::AcqRel);
        (first && sent < facts.opened)
            .then(|| (facts.opened - sent.max(facts.started)).as_secs_f64() * 1000.0)
    }

    /// When the newest bytes read from the connection arrived.
    pub fn latest_arrival(&self) -> Option<Instant> {
        self.0.arrivals.latest()
    }
}

/// A stamped stream in hyper's IO traits, with its facts for every response.
pub struct StampedConnection {
    io: TokioIo<Transport>,
    facts: OpenedConnection,
}

impl Connection for StampedConnection {
    fn connected(&self) -> Connected {
        Connected::new().extra(self.facts.clone())
    }
}

impl hyper::rt::Read for StampedConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for StampedConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Opens connections (`http://`, and `https://` with TLS settings) and times each.
#[derive(Debug, Clone)]
pub struct StampedConnector {
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl tower_service::Service<http::Uri> for StampedConnector {
    type Response = StampedConnection;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<StampedConnection>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        Box::pin(connect(uri, self.tls.clone()))
    }
}

/// Opens one connection to `uri`'s host (a TLS handshake included for `https://`), as the
/// pool does; a failure is the error a request would meet.
pub async fn connect(
    uri: http::Uri,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> std::io::Result<StampedConnection> {
    use std::io::{Error, ErrorKind};
    let tls = match (uri.scheme_str(), tls) {
        (Some("http"), _) => None,
        (Some("https"), Some(config)) => Some(config),
        (Some("https"), None) => {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{uri}: an https:// URL needs the client's TLS settings"),
            ))
        }
        _ => {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{uri}: only http:// and https:// URLs are supported"),
            ))
        }
    };
    let host = uri
        .host()
        .ok_or_else(|| Error::new(ErrorKind::InvalidInput, format!("{uri}: no host")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri
        .port_u16()
        .unwrap_or(if tls.is_some() { 443 } else { 80 });
    let started = Instant::now();
    let mut last = Error::new(ErrorKind::NotFound, format!("{host}: no address"));
    for addr in tokio::net::lookup_host((host, port)).await? {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(tcp) => {
                tcp.set_nodelay(true)?;
                let stamped = StampedTcp::new(tcp);
                let arrivals = stamped.arrivals();
                let io = match &tls {
                    None => Transport::Plain(stamped),
                    Some(config) => {
                        let name = server_name(host)
                            .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("{e:#}")))?;
                        let tls = tokio_rustls::TlsConnector::from(config.clone())
                            .connect(name, stamped)
                            .await?;
                        Transport::Tls(Box::new(tls))
                    }
                };
                let facts = OpenedConnection(Arc::new(ConnectionFacts {
                    arrivals,
                    started,
                    opened: Instant::now(),
                    claimed: AtomicBool::new(false),
                }));
                return Ok(StampedConnection {
                    io: TokioIo::new(io),
                    facts,
                });
            }
            Err(e) => last = Error::new(e.kind(), format!("connecting to {addr}: {e}")),
        }
    }
    Err(last)
}
