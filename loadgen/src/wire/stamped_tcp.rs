//! TCP streams that know when their bytes arrived.
//!
//! A reader that is busy elsewhere reads a chunk later than it arrived: on two cores, a wave
//! of a thousand streamed chunks takes the client milliseconds to work through, and timing
//! each chunk when it is read would charge that queue to the server. The kernel stamps every
//! segment as it is received (`SO_TIMESTAMPNS`, software receive time) and each `recvmsg`
//! returns the stamp of the last buffer it consumed; each read here maps that stamp onto the
//! monotonic clock and keeps the latest such instant as the stream's latest arrival (never
//! moving back, whatever the wall clock or a retransmission does). Where the kernel gives no
//! stamp (another OS, the option refused, the kernel's deferred switch-on for the first
//! socket of the host), the read's own instant stands in.
//!
//! Whoever reads what the stream carried takes the latest arrival after each piece, clamped
//! to the present: never later than its own read. When the reader is more than one piece
//! behind, one `recvmsg` may consume two pieces (both then get the later stamp), or the
//! stream's next read may land between a piece and its lookup; either way the piece is
//! timed at a later arrival, by at most the gap between the two.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The latest arrival on one stream, shared with whoever reads what the stream carried.
#[derive(Debug, Default)]
pub struct Arrivals {
    /// Nanoseconds after [`clock_base`] plus one; 0 before the first read.
    latest: AtomicU64,
}

/// The instant arrivals are counted from: the first use in the process, less the oldest
/// stamp taken for real ([`STAMP_AGE_LIMIT`]), so that no arrival precedes it.
fn clock_base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(|| {
        let now = Instant::now();
        now.checked_sub(STAMP_AGE_LIMIT).unwrap_or(now)
    })
}

impl Arrivals {
    /// When the newest bytes read from the stream so far arrived.
    pub fn latest(&self) -> Option<Instant> {
        match self.latest.load(Ordering::Acquire) {
            0 => None,
            ns => Some(clock_base() + Duration::from_nanos(ns - 1)),
        }
    }

    fn note(&self, at: Instant) {
        let ns = at.saturating_duration_since(clock_base()).as_nanos();
        let ns = u64::try_from(ns).unwrap_or(u64::MAX - 1) + 1;
        self.latest.fetch_max(ns, Ordering::AcqRel);
    }
}

/// Stamps older than this are taken for a wall-clock step, not for data that waited.
const STAMP_AGE_LIMIT: Duration = Duration::from_secs(60);

/// The monotonic instant of a kernel receive stamp (wall clock), read at `now`.
fn arrival_instant(stamp: SystemTime, now: (Instant, SystemTime)) -> Instant {
    match now.1.duration_since(stamp) {
        Ok(age) if age <= STAMP_AGE_LIMIT => now.0.checked_sub(age).unwrap_or(now.0),
        _ => now.0,
    }
}

/// A TCP stream whose reads note their kernel receive stamps in its [`Arrivals`].
#[derive(Debug)]
pub struct StampedTcp {
    io: TcpStream,
    arrivals: Arc<Arrivals>,
}

impl StampedTcp {
    /// Wraps `io` and asks the kernel to stamp what it receives.
    pub fn new(io: TcpStream) -> StampedTcp {
        os::enable_receive_stamps(&io);
        StampedTcp {
            io,
            arrivals: Arc::default(),
        }
    }

    /// The stream's arrivals, to read beside what it carried.
    pub fn arrivals(&self) -> Arc<Arrivals> {
        self.arrivals.clone()
    }
}

impl AsyncRead for StampedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            ready!(this.io.poll_read_ready(cx))?;
            match this.io.try_io(tokio::io::Interest::READABLE, || {
                os::read_stamped(&this.io, buf)
            }) {
                Ok((n, stamp)) => {
                    if n > 0 {
                        let now = (Instant::now(), SystemTime::now());
                        this.arrivals
                            .note(stamp.map_or(now.0, |s| arrival_instant(s, now)));
                    }
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for StampedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(target_os = "linux")]
mod os {
    use std::io;
    use std::os::fd::AsRawFd;
    use std::time::{Duration, SystemTime};

    use tokio::io::ReadBuf;
    use tokio::net::TcpStream;

    /// `SO_TIMESTAMPNS` on: a refusal leaves the stream unstamped (reads time themselves).
    pub fn enable_receive_stamps(io: &TcpStream) {
        let on: libc::c_int = 1;
        // SAFETY: a valid socket descriptor and a c_int option value of the stated size.
        unsafe {
            libc::setsockopt(
                io.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_TIMESTAMPNS,
                (&raw const on).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }

    /// One non-blocking `recvmsg` into `buf`'s unfilled part: the bytes read and the kernel's
    /// receive stamp of the last buffer it consumed, when it gave one.
    pub fn read_stamped(
        io: &TcpStream,
        buf: &mut ReadBuf<'_>,
    ) -> io::Result<(usize, Option<SystemTime>)> {
        // SAFETY: recvmsg only writes into the unfilled bytes, which are then marked filled
        // up to what it reported.
        let unfilled = unsafe { buf.unfilled_mut() };
        let mut iov = libc::iovec {
            iov_base: unfilled.as_mut_ptr().cast(),
            iov_len: unfilled.len(),
        };
        // Room for one SCM_TIMESTAMPNS message (a timespec), aligned for cmsghdr.
        let mut control = [0u64; 8];
        // SAFETY: msghdr is plain data; every pointer set below outlives the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: `msg` describes live buffers of the stated sizes.
        let n = unsafe { libc::recvmsg(io.as_raw_fd(), &raw mut msg, libc::MSG_DONTWAIT) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        // SAFETY: the kernel wrote `n` bytes into the unfilled part.
        unsafe { buf.assume_init(n) };
        buf.advance(n);
        let mut stamp = None;
        // SAFETY: the CMSG macros walk the control buffer the kernel filled, within
        // `msg_controllen`; the data of an SCM_TIMESTAMPNS message is a timespec.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET
                    && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS
                {
                    let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                    stamp = Some(
                        SystemTime::UNIX_EPOCH + Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32),
                    );
                }
                cmsg = libc::CMSG_NXTHDR(&raw const msg, cmsg);
            }
        }
        Ok((n, stamp))
    }
}

#[cfg(not(target_os = "linux"))]
mod os {
    use std::io;
    use std::time::SystemTime;

    use tokio::io::ReadBuf;
    use tokio::net::TcpStream;

    pub fn enable_receive_stamps(_io: &TcpStream) {}

    /// A plain non-blocking read: no kernel stamp here.
    pub fn read_stamped(
        io: &TcpStream,
        buf: &mut ReadBuf<'_>,
    ) -> io::Result<(usize, Option<SystemTime>)> {
        let n = io.try_read_buf(buf)?;
        Ok((n, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Bytes that waited 150 ms in the socket before the read are stamped with their arrival,
    /// not with the read.
    #[tokio::test]
    async fn a_late_read_keeps_the_arrival_time() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let mut reader = StampedTcp::new(client.unwrap());
        let (mut writer, _) = server.unwrap();
        assert_eq!(reader.arrivals().latest(), None);
        // The kernel turns stamping on for the whole host a moment after the first socket
        // asks (a deferred static key); data received before that is stamped when read.
        tokio::time::sleep(Duration::from_millis(50)).await;
        writer.write_all(b"first").await.unwrap();
        let written = Instant::now();
        tokio::time::sleep(Duration::from_millis(150)).await;
        let mut buf = [0u8; 16];
        let n = reader.read(&mut buf).await.unwrap();
        let read_at = Instant::now();
        assert_eq!(&buf[..n], b"first");
        let arrived = reader.arrivals().latest().expect("a stamp");
        assert!(arrived <= read_at);
        if cfg!(target_os = "linux") {
            let lag = arrived.saturating_duration_since(written);
            assert!(
                arrived + Duration::from_millis(100) < read_at && lag < Duration::from_millis(50),
                "arrival {lag:?} after the write, read {:?} after the arrival",
                read_at - arrived
            );
        }
    }

    #[test]
    fn stamps_map_onto_the_monotonic_clock() {
        let now = (Instant::now(), SystemTime::now());
        let earlier = now.1 - Duration::from_millis(7);
        assert_eq!(
            arrival_instant(earlier, now),
            now.0 - Duration::from_millis(7)
        );
        let future = now.1 + Duration::from_millis(7);
        assert_eq!(arrival_instant(future, now), now.0, "a stamp ahead of now");
        let ancient = now.1 - Duration::from_secs(3600);
        assert_eq!(arrival_instant(ancient, now), now.0, "a wall-clock step");
    }
}
