//! One request/reply on the agent's Unix socket, under a hard deadline.
//!
//! `connect` is issued on a non-blocking socket: on a Unix socket whose
//! listen backlog is full a blocking connect would wait; non-blocking it
//! fails at once (`EAGAIN`), and we fail open. After that the stream is
//! blocking with read/write timeouts set to the time left before the
//! deadline, renewed before every call.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use fleet_api::wire::{PluginReply, PluginRequest, MAX_REPLY_BYTES, WIRE_VERSION};
use fleet_api::JobRequest;
use socket2::{Domain, SockAddr, Socket, Type};

/// Why the agent could not answer. Every variant means "fail open".
#[derive(Debug)]
pub enum AskError {
    Connect(io::Error),
    Io(io::Error),
    Timeout(Duration),
    Protocol(String),
    /// Not asked: it let an earlier submission time out less than this
    /// long ago (`FleetSubmit`'s breaker).
    Quiet(Duration),
}

impl std::fmt::Display for AskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AskError::Connect(e) => write!(f, "cannot connect: {e}"),
            AskError::Io(e) => write!(f, "socket error: {e}"),
            AskError::Timeout(d) => write!(f, "no answer within {} ms", d.as_millis()),
            AskError::Protocol(m) => write!(f, "bad reply: {m}"),
            AskError::Quiet(d) => {
                write!(
                    f,
                    "not asked: it did not answer in time {} ms ago (asked again after {} ms)",
                    d.as_millis(),
                    QUIET.as_millis()
                )
            }
        }
    }
}

/// After an agent's timeout, how long submissions do not ask it (each
/// would wait the whole deadline under slurmctld's locks); the first one
/// after asks again.
pub const QUIET: Duration = Duration::from_secs(5);

/// Ask the agent about `job` (taken by value and handed back, so that the
/// script is not copied and a deferred stand-in can still be made of it).
pub fn ask(socket: &Path, job: Box<JobRequest>, timeout: Duration) -> (Result<PluginReply, AskError>, Box<JobRequest>) {
    let req = PluginRequest::Submit { v: WIRE_VERSION, job };
    let reply = round_trip(socket, &req, timeout);
    let job = match req {
        PluginRequest::Submit { job, .. } => job,
        PluginRequest::Ping { .. } => Box::default(),
    };
    (reply, job)
}

/// Set the stream's timeouts to the time left; error once it is gone.
fn arm(stream: &UnixStream, deadline: Instant, timeout: Duration) -> Result<(), AskError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(AskError::Timeout(timeout));
    }
    stream.set_read_timeout(Some(left)).map_err(AskError::Io)?;
    stream.set_write_timeout(Some(left)).map_err(AskError::Io)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// Send `req`, read one reply line, all within `timeout`.
pub fn round_trip(socket: &Path, req: &PluginRequest, timeout: Duration) -> Result<PluginReply, AskError> {
    let deadline = Instant::now() + timeout;
    let mut line = serde_json::to_vec(req).map_err(|e| AskError::Protocol(e.to_string()))?;
    line.push(b'\n');

    let addr = SockAddr::unix(socket).map_err(AskError::Connect)?;
    let sock = Socket::new(Domain::UNIX, Type::STREAM.nonblocking().cloexec(), None).map_err(AskError::Connect)?;
    sock.connect(&addr).map_err(AskError::Connect)?;
    sock.set_nonblocking(false).map_err(AskError::Connect)?;
    let mut stream = UnixStream::from(std::os::fd::OwnedFd::from(sock));

    let mut sent = 0;
    while sent < line.len() {
        arm(&stream, deadline, timeout)?;
        match stream.write(&line[sent..]) {
            Ok(0) => return Err(AskError::Io(io::ErrorKind::WriteZero.into())),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(AskError::Timeout(timeout)),
            Err(e) => return Err(AskError::Io(e)),
        }
    }

    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            return serde_json::from_slice(&buf[..pos]).map_err(|e| AskError::Protocol(e.to_string()));
        }
        if buf.len() > MAX_REPLY_BYTES {
            return Err(AskError::Protocol(format!("reply longer than {MAX_REPLY_BYTES} bytes")));
        }
        arm(&stream, deadline, timeout)?;
        match stream.read(&mut chunk) {
            Ok(0) => return Err(AskError::Protocol("agent closed the connection without a reply".into())),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(AskError::Timeout(timeout)),
            Err(e) => return Err(AskError::Io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::os::unix::net::UnixListener;

    /// A fake agent that answers each connection with `reply` after `delay`.
    fn serve(reply: &'static [u8], delay: Duration) -> (tempdir::Dir, std::path::PathBuf) {
        let dir = tempdir::Dir::new();
        let path = dir.0.join("agent.sock");
        let l = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let mut r = io::BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                let _ = r.read_line(&mut line);
                std::thread::sleep(delay);
                let _ = s.write_all(reply);
            }
        });
        (dir, path)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let p = std::env::temp_dir().join(format!(
                    "fleet-client-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::SeqCst)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn ping(path: &Path, ms: u64) -> Result<PluginReply, AskError> {
        round_trip(path, &PluginRequest::Ping { v: WIRE_VERSION }, Duration::from_millis(ms))
    }

    #[test]
    fn answers_parse() {
        let (_d, p) = serve(b"{\"decision\":\"local\",\"reason\":\"x\"}\n", Duration::ZERO);
        assert_eq!(ping(&p, 1000).unwrap(), PluginReply::Local { reason: "x".into() });
    }

    #[test]
    fn no_agent_garbage_and_slowness_are_errors_within_the_deadline() {
        let d = tempdir::Dir::new();
        assert!(matches!(ping(&d.0.join("none.sock"), 50), Err(AskError::Connect(_))));

        let (_d1, p) = serve(b"\x00\xffgarbage\n", Duration::ZERO);
        assert!(matches!(ping(&p, 1000), Err(AskError::Protocol(_))));

        let (_d2, p) = serve(b"{\"decision\":\"local\"", Duration::ZERO);
        assert!(matches!(ping(&p, 1000), Err(AskError::Protocol(_))));

        let (_d3, p) = serve(b"{\"decision\":\"pong\"}\n", Duration::from_millis(500));
        let t0 = Instant::now();
        assert!(matches!(ping(&p, 50), Err(AskError::Timeout(_))));
        assert!(t0.elapsed() < Duration::from_millis(300), "{:?}", t0.elapsed());
    }
}
