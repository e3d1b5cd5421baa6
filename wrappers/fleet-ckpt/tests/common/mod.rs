//! Real S3-compatible servers for the tests: moto's standalone server
//! (`pip install 'moto[server]'`, binary `moto_server`; FLEET_S3_SERVER
//! names another path). Each test starts its own on a free loopback port
//! and kills it when dropped.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct S3Server {
    child: Child,
    pub endpoint: String,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server binary, or `None` with the reason printed (the only case
/// in which the S3 tests do not run).
pub fn server_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FLEET_S3_SERVER") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join("moto_server");
        if p.is_file() {
            return Some(p);
        }
    }
    let why = "no S3-compatible server: moto_server is not on PATH (install it with \
               `pip install 'moto[server]'`, as .ci/run does, or set FLEET_S3_SERVER)";
    // CI installs the server: there a missing one is a failure, not a skip.
    if std::env::var_os("FLEET_CKPT_REQUIRE_S3").is_some_and(|v| v == "1") {
        panic!("FLEET_CKPT_REQUIRE_S3=1 and {why}");
    }
    // Straight to the process's stderr, past the test harness's capture, so
    // that a skip shows in every run's output.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {why}");
    None
}

impl S3Server {
    /// Start a server and create `buckets` in it.
    pub fn start(bin: &Path, buckets: &[&str]) -> S3Server {
        for _attempt in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let mut child = Command::new(bin)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
            let endpoint = format!("http://127.0.0.1:{port}");
            let deadline = Instant::now() + Duration::from_secs(60);
            let http = reqwest::blocking::Client::new();
            let mut up = false;
            while Instant::now() < deadline {
                if child.try_wait().unwrap().is_some() {
                    break; // port taken meanwhile: try another
                }
                if http.get(format!("{endpoint}/")).send().is_ok() {
                    up = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if !up {
                let _ = child.kill();
                let _ = child.wait();
                continue;
            }
            for b in buckets {
                let r = http.put(format!("{endpoint}/{b}")).send().unwrap();
                assert!(r.status().is_success(), "creating bucket {b}: {}", r.status());
            }
            return S3Server { child, endpoint };
        }
        panic!("{} did not start on a free port in 5 attempts", bin.display());
    }
}

/// A stores file naming each (bucket, endpoint).
pub fn stores_toml(entries: &[(&str, &str)]) -> String {
    entries
        .iter()
        .map(|(bucket, endpoint)| {
            format!(
                "[[store]]\nurl = \"s3://{bucket}\"\nendpoint = \"{endpoint}\"\nregion = \"us-east-1\"\n\
                 access_key_id = \"fleet\"\nsecret_access_key = \"fleet-secret\"\nallow_http = true\n"
            )
        })
        .collect()
}

/// Deterministic pseudo-random bytes (xorshift), so sizes and digests are real.
pub fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// Write `files` (relative path, contents) under `dir`.
pub fn write_tree(dir: &Path, files: &[(&str, Vec<u8>)]) {
    for (rel, data) in files {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
}
