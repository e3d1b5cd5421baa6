//! Connection limits: a cap on open connections (in all and per peer
//! address), a deadline for the first byte of a connection and an idle
//! timeout afterwards. hyper's own `header_read_timeout` (set where the
//! server is built) covers a request head that starts but never ends.
//!
//! A connection over a cap is closed at once, before the TLS handshake,
//! so a flood costs a file descriptor for microseconds, not for the
//! length of a timeout. The per-address cap keeps one flooding source
//! from taking every slot from the agents.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// `[limits]` of metasched.toml, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    /// For the first byte of a connection (and, in hyper, for a whole
    /// request head).
    pub header_read_timeout: Duration,
    /// No byte read or written for this long closes the connection. Longer
    /// than the longest long-poll.
    pub idle_timeout: Duration,
}

/// Shared by every connection: who holds which slots.
#[derive(Debug)]
struct Gate {
    total: Arc<Semaphore>,
    // A std-style lock held for a map update only, never across an `.await`.
    per_ip: parking_lot::Mutex<HashMap<IpAddr, usize>>,
    limits: Limits,
    refused: AtomicU64,
}

/// An `axum_server` acceptor that applies [`Limits`] to TCP connections.
/// Put TLS after it (`RustlsAcceptor::new(..).acceptor(limit)`).
#[derive(Clone, Debug)]
pub struct LimitAcceptor {
    gate: Arc<Gate>,
}

impl LimitAcceptor {
    pub fn new(limits: Limits) -> LimitAcceptor {
        LimitAcceptor {
            gate: Arc::new(Gate {
                total: Arc::new(Semaphore::new(limits.max_connections)),
                per_ip: parking_lot::Mutex::new(HashMap::new()),
                limits,
                refused: AtomicU64::new(0),
            }),
        }
    }

    fn admit(&self, peer: IpAddr) -> Result<Ticket, &'static str> {
        let permit = self.gate.total.clone().try_acquire_owned().map_err(|_| "max_connections")?;
        let mut map = self.gate.per_ip.lock();
        let n = map.entry(peer).or_insert(0);
        if *n >= self.gate.limits.max_connections_per_ip {
            return Err("max_connections_per_ip");
        }
        *n += 1;
        Ok(Ticket { _permit: permit, gate: self.gate.clone(), peer })
    }
}

impl<S> axum_server::accept::Accept<TcpStream, S> for LimitAcceptor {
    type Stream = Guarded<TcpStream>;
    type Service = S;
    type Future = std::future::Ready<io::Result<(Guarded<TcpStream>, S)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let admitted = match stream.peer_addr() {
            Ok(peer) => self.admit(peer.ip()).map_err(|cap| (peer.ip(), cap)),
            Err(e) => return std::future::ready(Err(e)),
        };
        std::future::ready(match admitted {
            Ok(ticket) => Ok((Guarded::new(stream, ticket, &self.gate.limits), service)),
            Err((peer, cap)) => {
                // One line per 1,000 refusals: a flood must not flood the log.
                let n = self.gate.refused.fetch_add(1, Ordering::Relaxed);
                if n.checked_rem(1000) == Some(0) {
                    tracing::warn!(%peer, cap, refused_so_far = n + 1, "connection refused: over the connection cap");
                }
                Err(io::Error::new(io::ErrorKind::ConnectionRefused, format!("over {cap}")))
            }
        })
    }
}

/// A connection's slots; given back when the connection ends.
#[derive(Debug)]
struct Ticket {
    _permit: OwnedSemaphorePermit,
    gate: Arc<Gate>,
    peer: IpAddr,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut map = self.gate.per_ip.lock();
        if let Some(n) = map.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.peer);
            }
        }
    }
}

/// A stream that fails with `TimedOut` when its deadline passes while it
/// waits: the first byte within `header_read_timeout`, then any byte in
/// either direction within `idle_timeout` of the last.
#[derive(Debug)]
pub struct Guarded<S> {
    inner: S,
    _ticket: Ticket,
    idle: Duration,
    seen_a_byte: bool,
    deadline: Pin<Box<Sleep>>,
}

impl<S> Guarded<S> {
    fn new(inner: S, ticket: Ticket, limits: &Limits) -> Guarded<S> {
        Guarded {
            inner,
            _ticket: ticket,
            idle: limits.idle_timeout,
            seen_a_byte: false,
            deadline: Box::pin(tokio::time::sleep(limits.header_read_timeout)),
        }
    }

    fn touch(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.idle);
    }

    /// Called when the inner stream is not ready: has the deadline passed?
    fn expired(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                if self.seen_a_byte { "idle connection" } else { "no request within header_read_timeout" },
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.seen_a_byte = true;
                    this.touch();
                }
                Poll::Ready(r)
            }
            Poll::Pending => this.expired(cx).map(Err),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(r) => {
                if this.seen_a_byte && matches!(r, Ok(n) if n > 0) {
                    this.touch();
                }
                Poll::Ready(r)
            }
            Poll::Pending => this.expired(cx).map(Err),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Pending => this.expired(cx).map(Err),
            r => r,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => {
                if this.seen_a_byte && matches!(r, Ok(n) if n > 0) {
                    this.touch();
                }
                Poll::Ready(r)
            }
            Poll::Pending => this.expired(cx).map(Err),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
