//! Where checkpoints live: `s3://bucket/prefix` or `file:///abs/dir`,
//! opened through `object_store`, with per-bucket endpoints and
//! credentials from a stores file (`FLEET_CKPT_STORES`) so that two
//! regions' S3-compatible servers can be used side by side.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::ObjectStore;
use serde::Deserialize;

/// A parsed checkpoint URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub scheme: Scheme,
    /// Bucket for `s3`, empty for `file`.
    pub bucket: String,
    /// Key prefix inside the bucket (`file`: the absolute directory without
    /// its leading `/`), no leading or trailing `/`.
    pub prefix: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    S3,
    File,
}

impl Location {
    /// Parse `s3://bucket[/prefix]` or `file:///abs/dir`. The error says
    /// what is wrong and what is expected.
    pub fn parse(url: &str) -> Result<Location, String> {
        let url = url.trim();
        let bad = |why: &str| Err(format!("checkpoint URL {:?}: {why}", url.chars().take(200).collect::<String>()));
        if url.len() > 4096 {
            return bad("longer than 4096 bytes");
        }
        if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return bad("has whitespace or control characters");
        }
        let (scheme, rest) = if let Some(r) = url.strip_prefix("s3://") {
            (Scheme::S3, r)
        } else if let Some(r) = url.strip_prefix("file://") {
            (Scheme::File, r)
        } else {
            return bad("expected s3://bucket/prefix or file:///absolute/dir");
        };
        let (bucket, path) = match scheme {
            Scheme::S3 => rest.split_once('/').unwrap_or((rest, "")),
            Scheme::File => {
                if !rest.starts_with('/') {
                    return bad("a file:// URL needs an absolute path (file:///dir)");
                }
                ("", rest)
            }
        };
        if scheme == Scheme::S3
            && (bucket.len() < 3
                || bucket.len() > 63
                || !bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'))
        {
            return bad("the bucket name must be 3-63 characters of a-z, 0-9, '-' and '.'");
        }
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        if parts.iter().any(|p| *p == "." || *p == "..") {
            return bad("'.' and '..' are not allowed in the path");
        }
        Ok(Location { scheme, bucket: bucket.to_string(), prefix: parts.join("/") })
    }

    pub fn url(&self) -> String {
        match self.scheme {
            Scheme::S3 if self.prefix.is_empty() => format!("s3://{}", self.bucket),
            Scheme::S3 => format!("s3://{}/{}", self.bucket, self.prefix),
            Scheme::File => format!("file:///{}", self.prefix),
        }
    }

    /// This location with `name` appended (one or more `/` components).
    pub fn join(&self, name: &str) -> Location {
        let prefix = if self.prefix.is_empty() { name.to_string() } else { format!("{}/{name}", self.prefix) };
        Location { prefix, ..self.clone() }
    }

    /// The last component of the prefix.
    pub fn name(&self) -> &str {
        self.prefix.rsplit('/').next().unwrap_or("")
    }

    /// The parent location (the prefix less its last component).
    pub fn parent(&self) -> Location {
        let prefix = self.prefix.rsplit_once('/').map(|(p, _)| p.to_string()).unwrap_or_default();
        Location { prefix, ..self.clone() }
    }

    /// The object path of `rel` (relative, checked) under this location.
    pub fn object(&self, rel: &str) -> Path {
        if self.prefix.is_empty() {
            Path::from_iter(rel.split('/'))
        } else {
            Path::from_iter(self.prefix.split('/').chain(rel.split('/')))
        }
    }

    /// The object path of the prefix itself (for listing).
    pub fn dir(&self) -> Path {
        Path::from_iter(self.prefix.split('/').filter(|p| !p.is_empty()))
    }
}

/// One `[[store]]` of the stores file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreEntry {
    /// The URL prefix this entry serves (`s3://ckpt-east` or a deeper one);
    /// the longest matching entry wins.
    pub url: String,
    /// `http(s)://host:port` of the S3-compatible server; absent: AWS.
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub access_key_id: Option<String>,
    #[serde(default)]
    pub secret_access_key: Option<String>,
    /// A file holding the secret key (whitespace trimmed), instead of the key.
    #[serde(default)]
    pub secret_access_key_file: Option<PathBuf>,
    /// Allow an `http://` endpoint (a lab; never across a network).
    #[serde(default)]
    pub allow_http: bool,
}

/// The stores file: `[[store]]` entries.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stores {
    #[serde(default)]
    pub store: Vec<StoreEntry>,
}

impl Stores {
    /// Read a stores file; errors name the file.
    pub fn load(path: &FsPath) -> Result<Stores, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        Stores::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Stores, String> {
        let s: Stores = toml::from_str(text).map_err(|e| e.to_string())?;
        for e in &s.store {
            let l = Location::parse(&e.url)?;
            if l.scheme != Scheme::S3 {
                return Err(format!("store {:?}: only s3:// URLs take a [[store]] entry", e.url));
            }
            if e.secret_access_key.is_some() && e.secret_access_key_file.is_some() {
                return Err(format!("store {:?}: secret_access_key and secret_access_key_file both set", e.url));
            }
        }
        Ok(s)
    }

    /// The longest entry whose URL is a prefix of `loc` (on component boundaries).
    pub fn entry_for(&self, loc: &Location) -> Option<&StoreEntry> {
        let url = loc.url();
        self.store
            .iter()
            .filter(|e| {
                let p = e.url.trim_end_matches('/');
                url == p || url.starts_with(&format!("{p}/"))
            })
            .max_by_key(|e| e.url.trim_end_matches('/').len())
    }

    /// Open the object store holding `loc`.
    pub fn open(&self, loc: &Location) -> Result<Arc<dyn ObjectStore>, String> {
        match loc.scheme {
            Scheme::File => {
                let root = FsPath::new("/");
                Ok(Arc::new(LocalFileSystem::new_with_prefix(root).map_err(|e| e.to_string())?))
            }
            Scheme::S3 => {
                let mut b = match self.entry_for(loc) {
                    None => AmazonS3Builder::from_env(),
                    Some(e) => {
                        let mut b = AmazonS3Builder::new();
                        if let Some(v) = &e.endpoint {
                            b = b.with_endpoint(v);
                        }
                        if let Some(v) = &e.region {
                            b = b.with_region(v);
                        }
                        if let Some(v) = &e.access_key_id {
                            b = b.with_access_key_id(v);
                        }
                        if let Some(v) = &e.secret_access_key {
                            b = b.with_secret_access_key(v);
                        }
                        if let Some(f) = &e.secret_access_key_file {
                            let s = std::fs::read_to_string(f).map_err(|err| {
                                format!("store {:?}: reading secret_access_key_file {}: {err}", e.url, f.display())
                            })?;
                            b = b.with_secret_access_key(s.trim());
                        }
                        b.with_allow_http(e.allow_http)
                    }
                };
                b = b.with_bucket_name(&loc.bucket).with_virtual_hosted_style_request(false);
                Ok(Arc::new(b.build().map_err(|e| format!("opening {}: {e}", loc.url()))?))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(url: &str, expected: Result<(&str, &str, &str), &str>) {
        match (Location::parse(url), expected) {
            (Ok(l), Ok((bucket, prefix, back))) => {
                assert_eq!((l.bucket.as_str(), l.prefix.as_str(), l.url().as_str()), (bucket, prefix, back), "{url}")
            }
            (Err(e), Err(want)) => assert!(e.contains(want), "{url}: {e}"),
            (got, want) => panic!("{url}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn urls_table() {
        check("s3://ckpt-east/fleet/job1/", Ok(("ckpt-east", "fleet/job1", "s3://ckpt-east/fleet/job1")));
        check("s3://ckpt-east", Ok(("ckpt-east", "", "s3://ckpt-east")));
        check("file:///var/ckpt//a/", Ok(("", "var/ckpt/a", "file:///var/ckpt/a")));
        check("file://relative/dir", Err("absolute path"));
        check("gs://b/x", Err("expected s3://"));
        check("s3://UPPER/x", Err("bucket name"));
        check("s3://ab/x", Err("bucket name"));
        check("s3://bucket/a/../b", Err("'..'"));
        check("s3://bucket/a b", Err("whitespace"));
        check("", Err("expected s3://"));
    }

    #[test]
    fn join_parent_and_objects() {
        let l = Location::parse("s3://b-1/jobs/j1").unwrap();
        let c = l.join("ckpt-000000000001");
        assert_eq!(c.url(), "s3://b-1/jobs/j1/ckpt-000000000001");
        assert_eq!(c.name(), "ckpt-000000000001");
        assert_eq!(c.parent(), l);
        assert_eq!(c.object("m/w.bin").as_ref(), "jobs/j1/ckpt-000000000001/m/w.bin");
        assert_eq!(Location::parse("s3://b-1").unwrap().object("x").as_ref(), "x");
    }

    #[test]
    fn stores_file() {
        let s = Stores::parse(
            "[[store]]\nurl = \"s3://ckpt-east\"\nendpoint = \"http://127.0.0.1:1\"\nallow_http = true\n\
             [[store]]\nurl = \"s3://ckpt-east/special\"\nendpoint = \"http://127.0.0.1:2\"\n",
        )
        .unwrap();
        let at = |u: &str| s.entry_for(&Location::parse(u).unwrap()).and_then(|e| e.endpoint.clone());
        assert_eq!(at("s3://ckpt-east/j/1").as_deref(), Some("http://127.0.0.1:1"));
        assert_eq!(at("s3://ckpt-east/special/1").as_deref(), Some("http://127.0.0.1:2"));
        assert_eq!(at("s3://ckpt-east/specialist").as_deref(), Some("http://127.0.0.1:1"));
        assert_eq!(at("s3://ckpt-west/j"), None);
        assert!(Stores::parse("[[store]]\nurl = \"s3://b-1\"\nbogus = 1\n").unwrap_err().contains("bogus"));
        assert!(Stores::parse("[[store]]\nurl = \"file:///x\"\n").unwrap_err().contains("only s3://"));
    }
}
