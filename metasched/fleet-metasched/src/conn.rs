//! Connection limits: a cap on open connections (in all and per peer
//! address), a deadline for the first byte of a connection and an idle
//! timeout afterwards. hyper's own `header_read_timeout` (set where the
//! server is built) covers a request head that starts but never ends.
//!
//! A connection over a cap is closed at once, before the TLS handshake,
//! so a flood costs a file descriptor for microseconds, not for the
//! length of a timeout. The per-address cap keeps one flooding source
//! from taking every slot from the agents.
//!
//! Slots are kept for the agents and the admin: a connection on which an
//! agent's or the admin's token was presented is *trusted*
//! ([`ConnGate::trust`], from the authentication layer). When every slot
//! is taken, a new connection closes the oldest connection that is not
//! trusted and takes its slot, so that sources with no such token (a flood
//! from many addresses, a user's job tokens) can never hold every slot.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// How long a new connection waits for the slot of the one it closed.
const EVICT_WAIT: Duration = Duration::from_secs(2);

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
    /// Every open connection by its peer's address and port.
    open: parking_lot::Mutex<HashMap<SocketAddr, Arc<Conn>>>,
    limits: Limits,
    refused: AtomicU64,
}

/// One open connection, as the gate and the authentication layer see it.
#[derive(Debug)]
struct Conn {
    opened: Instant,
    trusted: std::sync::atomic::AtomicBool,
    evicted: std::sync::atomic::AtomicBool,
    wake: Arc<Notify>,
}

/// The authentication layer's handle on the gate.
#[derive(Clone, Debug)]
pub struct ConnGate(Arc<Gate>);

impl ConnGate {
    /// An agent's or the admin's token was presented on the connection
    /// from `peer`: it keeps its slot when the slots run out.
    pub fn trust(&self, peer: SocketAddr) {
        if let Some(c) = self.0.open.lock().get(&peer) {
            c.trusted.store(true, Ordering::Relaxed);
        }
    }
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
                open: parking_lot::Mutex::new(HashMap::new()),
                limits,
                refused: AtomicU64::new(0),
            }),
        }
    }

    /// hyper's deadline for a request head (`Limits`).
    pub fn header_read_timeout(&self) -> Duration {
        self.gate.limits.header_read_timeout
    }

    /// For the authentication layer ([`ConnGate::trust`]).
    pub fn gate(&self) -> ConnGate {
        ConnGate(self.gate.clone())
    }

    /// The per-address count of `peer`, taken (`Err`: over its cap).
    fn count_in(gate: &Arc<Gate>, peer: IpAddr) -> Result<IpCount, &'static str> {
        let mut map = gate.per_ip.lock();
        let n = map.entry(peer).or_insert(0);
        if *n >= gate.limits.max_connections_per_ip {
            return Err("max_connections_per_ip");
        }
        *n += 1;
        Ok(IpCount { gate: gate.clone(), peer })
    }

    /// Every slot is taken: close the oldest connection that is not
    /// trusted (its slot comes back when it ends). False when all are.
    fn evict_one(gate: &Gate) -> bool {
        let open = gate.open.lock();
        let victim = open
            .values()
            .filter(|c| !c.trusted.load(Ordering::Relaxed) && !c.evicted.load(Ordering::Relaxed))
            .min_by_key(|c| c.opened);
        match victim {
            Some(c) => {
                c.evicted.store(true, Ordering::Relaxed);
                c.wake.notify_one();
                true
            }
            None => false,
        }
    }

    async fn admit(gate: Arc<Gate>, peer: SocketAddr) -> Result<Ticket, &'static str> {
        // Given back when dropped, here on any refusal below.
        let counted = Self::count_in(&gate, peer.ip())?;
        let permit = match gate.total.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) if Self::evict_one(&gate) => {
                match tokio::time::timeout(EVICT_WAIT, gate.total.clone().acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    _ => return Err("max_connections"),
                }
            }
            Err(_) => return Err("max_connections"),
        };
        let conn = Arc::new(Conn {
            opened: Instant::now(),
            trusted: false.into(),
            evicted: false.into(),
            wake: Arc::new(Notify::new()),
        });
        gate.open.lock().insert(peer, conn.clone());
        Ok(Ticket { _permit: permit, _counted: counted, gate, peer, conn })
    }
}

impl<S: Send + 'static> axum_server::accept::Accept<TcpStream, S> for LimitAcceptor {
    type Stream = Guarded<TcpStream>;
    type Service = S;
    type Future = Pin<Box<dyn Future<Output = io::Result<(Guarded<TcpStream>, S)>> + Send>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let gate = self.gate.clone();
        Box::pin(async move {
            let peer = stream.peer_addr()?;
            match Self::admit(gate.clone(), peer).await {
                Ok(ticket) => Ok((Guarded::new(stream, ticket, &gate.limits), service)),
                Err(cap) => {
                    // One line per 1,000 refusals: a flood must not flood the log.
                    let n = gate.refused.fetch_add(1, Ordering::Relaxed);
                    if n.checked_rem(1000) == Some(0) {
                        tracing::warn!(peer = %peer.ip(), cap, refused_so_far = n + 1,
                            "connection refused: over the connection cap");
                    }
                    Err(io::Error::new(io::ErrorKind::ConnectionRefused, format!("over {cap}")))
                }
            }
        })
    }
}

/// A connection's slots; given back when the connection ends.
#[derive(Debug)]
struct Ticket {
    _permit: OwnedSemaphorePermit,
    _counted: IpCount,
    gate: Arc<Gate>,
    peer: SocketAddr,
    conn: Arc<Conn>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut open = self.gate.open.lock();
        if open.get(&self.peer).is_some_and(|o| Arc::ptr_eq(o, &self.conn)) {
            open.remove(&self.peer);
        }
    }
}

/// One connection counted against its address's cap; given back when dropped.
#[derive(Debug)]
struct IpCount {
    gate: Arc<Gate>,
    peer: IpAddr,
}

impl Drop for IpCount {
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
    /// Ready when the gate closes this connection for a new one.
    evicted: Pin<Box<OwnedNotified>>,
}

impl<S> Guarded<S> {
    fn new(inner: S, ticket: Ticket, limits: &Limits) -> Guarded<S> {
        Guarded {
            inner,
            evicted: Box::pin(ticket.conn.wake.clone().notified_owned()),
            _ticket: ticket,
            idle: limits.idle_timeout,
            seen_a_byte: false,
            deadline: Box::pin(tokio::time::sleep(limits.header_read_timeout)),
        }
    }

    fn touch(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.idle);
    }

    /// Called when the inner stream is not ready: has the deadline passed,
    /// or has the gate closed the connection for a new one?
    fn expired(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if self.evicted.as_mut().poll(cx).is_ready() {
            return Poll::Ready(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "every connection slot was taken: closed, as the oldest connection no agent's token was shown on",
            ));
        }
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
