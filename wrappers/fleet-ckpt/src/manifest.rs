//! `fleet-ckpt.json`: what makes a directory of files a checkpoint.
//!
//! The manifest is written last; a checkpoint without one, with one that
//! does not parse, or whose files do not match it is not a checkpoint.
//! Every manifest read here is hostile input: its size is capped before
//! it is parsed, and every path in it must stay inside the checkpoint
//! (relative, no `..`, no `.`, no empty component, no control character).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The manifest's file name, at the top of every checkpoint.
pub const MANIFEST: &str = "fleet-ckpt.json";
/// The `format` of manifests this version writes and reads.
pub const FORMAT: &str = "fleet-ckpt/1";
/// Largest manifest read (bytes): far above 100 000 files' entries.
pub const MAX_MANIFEST_BYTES: u64 = 32 << 20;
/// Most files in one checkpoint.
pub const MAX_FILES: usize = 100_000;
/// Longest relative path of a file (bytes).
pub const MAX_PATH: usize = 1024;

/// One file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Relative to the checkpoint, `/`-separated.
    pub path: String,
    pub size: u64,
    /// Lower-case hex SHA-256 of the file's bytes.
    pub sha256: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// The Fleet job id (`FLEET_JOB_ID`), or what the caller named it.
    pub job_id: String,
    /// Position in the job's sequence of checkpoints; the newest valid one
    /// (highest `seq`) is the one a job resumes from.
    pub seq: u64,
    /// The framework's own step or iteration, when it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub files: Vec<FileEntry>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("manifest is {0} bytes, more than the {MAX_MANIFEST_BYTES} allowed")]
    TooLarge(u64),
    #[error("manifest is not valid JSON of the fleet-ckpt format: {0}")]
    Parse(String),
    #[error("manifest format {0:?} is not {FORMAT:?}")]
    Format(String),
    #[error("manifest lists {0} files, more than the {MAX_FILES} allowed")]
    TooManyFiles(usize),
    #[error("manifest path {path:?} is unsafe: {why}")]
    UnsafePath { path: String, why: &'static str },
    #[error("manifest lists {0:?} twice")]
    Duplicate(String),
    #[error("manifest lists {0:?} both as a file and as a directory")]
    FileAndDir(String),
    #[error("manifest sha256 of {path:?} is not 64 hex digits: {sha256:?}")]
    BadDigest { path: String, sha256: String },
    #[error("manifest job id {0:?} is empty, too long or has control characters")]
    BadJobId(String),
}

/// Check a relative path from a manifest (or from a directory being
/// saved) and return its components. Refuses absolute paths, `..`, `.`,
/// empty components (`a//b`, trailing `/`), backslashes, control
/// characters and the manifest's own name at the top.
pub fn safe_rel_path(path: &str) -> Result<Vec<&str>, ManifestError> {
    let bad = |why| Err(ManifestError::UnsafePath { path: path.chars().take(200).collect(), why });
    if path.is_empty() {
        return bad("empty");
    }
    if path.len() > MAX_PATH {
        return bad("longer than 1024 bytes");
    }
    if path.starts_with('/') {
        return bad("absolute");
    }
    if path.chars().any(|c| c.is_control()) {
        return bad("control character");
    }
    if path.contains('\\') {
        return bad("backslash");
    }
    let parts: Vec<&str> = path.split('/').collect();
    for p in &parts {
        match *p {
            "" => return bad("empty component"),
            "." => return bad("'.' component"),
            ".." => return bad("'..' component escapes the checkpoint"),
            _ => {}
        }
    }
    if parts.len() == 1 && parts[0] == MANIFEST {
        return bad("the manifest's own name");
    }
    Ok(parts)
}

impl Manifest {
    /// Parse and check manifest bytes (hostile input).
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge(bytes.len() as u64));
        }
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| ManifestError::Parse(e.to_string()))?;
        m.check()?;
        Ok(m)
    }

    /// The checks [`Manifest::parse`] makes, for a manifest built here too.
    pub fn check(&self) -> Result<(), ManifestError> {
        if self.format != FORMAT {
            return Err(ManifestError::Format(self.format.chars().take(100).collect()));
        }
        if self.job_id.is_empty() || self.job_id.len() > 256 || self.job_id.chars().any(|c| c.is_control()) {
            return Err(ManifestError::BadJobId(self.job_id.chars().take(100).collect()));
        }
        if self.files.len() > MAX_FILES {
            return Err(ManifestError::TooManyFiles(self.files.len()));
        }
        let mut files = BTreeSet::new();
        let mut dirs = BTreeSet::new();
        for f in &self.files {
            let parts = safe_rel_path(&f.path)?;
            if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return Err(ManifestError::BadDigest {
                    path: f.path.clone(),
                    sha256: f.sha256.chars().take(100).collect(),
                });
            }
            if !files.insert(f.path.as_str()) {
                return Err(ManifestError::Duplicate(f.path.clone()));
            }
            for i in 1..parts.len() {
                dirs.insert(parts[..i].join("/"));
            }
        }
        if let Some(both) = dirs.iter().find(|d| files.contains(d.as_str())) {
            return Err(ManifestError::FileAndDir(both.clone()));
        }
        Ok(())
    }

    /// Bytes of all files.
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("a manifest always serializes");
        v.push(b'\n');
        v
    }
}

/// Lower-case hex SHA-256 of `bytes` (the catalog's manifest digest).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn manifest(paths: &[&str]) -> Manifest {
        Manifest {
            format: FORMAT.into(),
            job_id: "f-1".into(),
            seq: 1,
            step: None,
            created_at: "2026-01-01T00:00:00Z".into(),
            files: paths.iter().map(|p| FileEntry { path: p.to_string(), size: 1, sha256: D.into() }).collect(),
        }
    }

    fn check(paths: &[&str], expected: Result<(), &str>) {
        let bytes = serde_json::to_vec(&manifest(paths)).unwrap();
        let got = Manifest::parse(&bytes).map(|_| ()).map_err(|e| e.to_string());
        match (got, expected) {
            (Ok(()), Ok(())) => {}
            (Err(e), Err(want)) => assert!(e.contains(want), "{paths:?}: {e:?} lacks {want:?}"),
            (got, want) => panic!("{paths:?}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn paths_table() {
        check(&["model.pt", "opt/state.bin", "a/b/c/d.json"], Ok(()));
        check(&["../etc/passwd"], Err("'..' component escapes"));
        check(&["a/../../x"], Err("'..' component escapes"));
        check(&["/etc/passwd"], Err("absolute"));
        check(&["a//b"], Err("empty component"));
        check(&["a/"], Err("empty component"));
        check(&["./a"], Err("'.' component"));
        check(&[""], Err("empty"));
        check(&["a\nb"], Err("control character"));
        check(&["a\\..\\b"], Err("backslash"));
        check(&["fleet-ckpt.json"], Err("manifest's own name"));
        check(&["sub/fleet-ckpt.json"], Ok(()));
        check(&["a", "a"], Err("lists \"a\" twice"));
        check(&["a", "a/b"], Err("both as a file and as a directory"));
        check(&[&"x".repeat(1025)], Err("longer than 1024"));
    }

    #[test]
    fn hostile_documents() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "not valid JSON"),
            (b"[]", "not valid JSON"),
            (b"{\"format\":\"fleet-ckpt/2\",\"job_id\":\"j\",\"seq\":1,\"created_at\":\"t\",\"files\":[]}", "format"),
            (b"{\"format\":\"fleet-ckpt/1\",\"job_id\":\"\",\"seq\":1,\"created_at\":\"t\",\"files\":[]}", "job id"),
            (
                b"{\"format\":\"fleet-ckpt/1\",\"job_id\":\"j\",\"seq\":-1,\"created_at\":\"t\",\"files\":[]}",
                "not valid JSON",
            ),
            (
                b"{\"format\":\"fleet-ckpt/1\",\"job_id\":\"j\",\"seq\":1,\"created_at\":\"t\",\"files\":[],\"x\":1}",
                "unknown field",
            ),
            (
                b"{\"format\":\"fleet-ckpt/1\",\"job_id\":\"j\",\"seq\":1,\"created_at\":\"t\",\"files\":[{\"path\":\"a\",\"size\":1,\"sha256\":\"ZZ\"}]}",
                "not 64 hex digits",
            ),
        ];
        for (bytes, want) in cases {
            let e = Manifest::parse(bytes).unwrap_err().to_string();
            assert!(e.contains(want), "{:?}: {e}", String::from_utf8_lossy(bytes));
        }
        let big = vec![b' '; MAX_MANIFEST_BYTES as usize + 1];
        assert_eq!(Manifest::parse(&big).unwrap_err(), ManifestError::TooLarge(MAX_MANIFEST_BYTES + 1));
    }

    #[test]
    fn round_trip() {
        let m = manifest(&["a", "b/c"]);
        assert_eq!(Manifest::parse(&m.to_bytes()).unwrap(), m);
        assert_eq!(m.total_bytes(), 2);
        assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
