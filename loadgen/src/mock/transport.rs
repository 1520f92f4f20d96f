//! The mock's connections: a listener that stamps each request's arrival, and TLS
//! handshakes run in each connection's own task.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;

use crate::wire::stamped_tcp::{Arrivals, StampedTcp};

/// Pending connections the listener queues: room for a thousand streams opening at once.
const LISTEN_BACKLOG: u32 = 4096;

pub(super) fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Accepts connections as [`StampedTcp`] streams (with `TCP_NODELAY`), so that a request's
/// timing starts when its bytes arrived, not when a busy mock got round to reading them;
/// with a TLS configuration, each connection's handshake runs in its own task, on its first
/// read or write, so that a thousand clients opening at once are not served one by one.
pub(super) struct StampedListener {
    pub(super) tcp: tokio::net::TcpListener,
    pub(super) tls: Option<tokio_rustls::TlsAcceptor>,
}

impl axum::serve::Listener for StampedListener {
    type Io = MockIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (MockIo, SocketAddr) {
        loop {
            match self.tcp.accept().await {
                Ok((tcp, addr)) => {
                    let _ = tcp.set_nodelay(true);
                    let stamped = StampedTcp::new(tcp);
                    let arrivals = stamped.arrivals();
                    let state = match &self.tls {
                        None => Transport::Plain(stamped),
                        Some(acceptor) => Transport::Handshake(Box::new(acceptor.accept(stamped))),
                    };
                    return (MockIo { arrivals, state }, addr);
                }
                // Out of descriptors, or a connection reset before it was accepted: the
                // listener itself is fine; wait a moment rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// An accepted connection with its arrivals: plain, or TLS over the stamped stream.
pub struct MockIo {
    arrivals: Arc<Arrivals>,
    state: Transport,
}

enum Transport {
    Plain(StampedTcp),
    /// The TLS handshake, driven by the connection's first read or write.
    Handshake(Box<tokio_rustls::Accept<StampedTcp>>),
    Tls(Box<tokio_rustls::server::TlsStream<StampedTcp>>),
}

impl MockIo {
    fn arrivals(&self) -> Arc<Arrivals> {
        self.arrivals.clone()
    }

    /// Finishes the handshake, if one is under way.
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if let Transport::Handshake(accept) = &mut self.state {
            let tls = std::task::ready!(std::future::Future::poll(
                std::pin::Pin::new(accept.as_mut()),
                cx
            ))?;
            self.state = Transport::Tls(Box::new(tls));
        }
        std::task::Poll::Ready(Ok(()))
    }
}

/// Runs `$op` on the connection's stream once its handshake (if any) is done.
macro_rules! on_stream {
    ($self:ident, $cx:ident, $io:ident => $op:expr) => {{
        let this = $self.get_mut();
        std::task::ready!(this.poll_ready($cx))?;
        match &mut this.state {
            Transport::Plain($io) => {
                let $io = std::pin::Pin::new($io);
                $op
            }
            Transport::Tls($io) => {
                let $io = std::pin::Pin::new($io.as_mut());
                $op
            }
            Transport::Handshake(_) => unreachable!("the handshake finished above"),
        }
    }};
}

impl tokio::io::AsyncRead for MockIo {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        on_stream!(self, cx, io => io.poll_read(cx, buf))
    }
}

impl tokio::io::AsyncWrite for MockIo {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        on_stream!(self, cx, io => io.poll_write(cx, buf))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        on_stream!(self, cx, io => io.poll_flush(cx))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        on_stream!(self, cx, io => io.poll_shutdown(cx))
    }
}

/// The arrivals of the connection a request came over (axum's connect info).
#[derive(Debug, Clone)]
pub(super) struct ConnectionArrivals(pub(super) Arc<Arrivals>);

impl Connected<IncomingStream<'_, StampedListener>> for ConnectionArrivals {
    fn connect_info(stream: IncomingStream<'_, StampedListener>) -> Self {
        ConnectionArrivals(stream.io().arrivals())
    }
}
