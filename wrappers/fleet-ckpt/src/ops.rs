//! Save, list, verify, restore, copy and prune checkpoints.
//!
//! Layout under a job's prefix (`FLEET_CKPT_URL`): one directory per
//! checkpoint, `ckpt-<seq, 12 digits>/`, holding the files and, written
//! last, `fleet-ckpt.json`. Anything else under the prefix is ignored.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload, WriteMultipart};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::location::{Location, Stores};
use crate::manifest::{sha256_hex, FileEntry, Manifest, ManifestError, FORMAT, MANIFEST};

/// Files at most this large go up in one PUT; larger ones in parts of it.
pub const PART: usize = 8 << 20;
/// Files moved at once.
pub const CONCURRENCY: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum CkptError {
    /// What the store answered, said once: object_store nests each layer's
    /// text in the next, so its own message repeats the whole chain.
    #[error("{what}: {}", store_text(.error))]
    Store { what: String, error: object_store::Error },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{url}: {source}")]
    Manifest {
        url: String,
        #[source]
        source: ManifestError,
    },
    /// A file does not match the manifest (missing, wrong size or digest).
    #[error("torn checkpoint {url}: file {file:?} {why}")]
    Torn { url: String, file: String, why: String },
    #[error("{url}: no manifest ({MANIFEST}): the checkpoint is incomplete")]
    NoManifest { url: String },
    #[error("no valid checkpoint under {prefix}{}", tried_text(.tried))]
    NoValid { prefix: String, tried: Vec<String> },
    #[error("{0}")]
    Invalid(String),
}

fn tried_text(tried: &[String]) -> String {
    if tried.is_empty() {
        String::new()
    } else {
        format!(" (tried: {})", tried.join("; "))
    }
}

type Result<T> = std::result::Result<T, CkptError>;

fn store_err(what: impl Into<String>) -> impl FnOnce(object_store::Error) -> CkptError {
    let what = what.into();
    move |error| CkptError::Store { what, error }
}

/// A store's error in one line: a refusal names its HTTP status and the
/// store's own code and message (S3's `<Code>`, `<Message>`), what a
/// refused key means, and otherwise the innermost error of the chain.
pub fn store_text(e: &object_store::Error) -> String {
    use object_store::Error as E;
    let mut inner: &dyn std::error::Error = e;
    while let Some(s) = inner.source() {
        inner = s;
    }
    let text = inner.to_string();
    let status =
        text.split_once("status code: ").and_then(|(_, rest)| rest.get(..3)).and_then(|code| code.parse::<u16>().ok());
    let between = |open: &str, close: &str| {
        let start = text.find(open)? + open.len();
        let len = text[start..].find(close)?;
        Some(text[start..start + len].trim().to_string())
    };
    let said = match (between("<Code>", "</Code>"), between("<Message>", "</Message>")) {
        (Some(code), Some(msg)) if code != msg => format!(": {code} ({msg})"),
        (Some(code), _) => format!(": {code}"),
        (None, _) => String::new(),
    };
    match (e, status) {
        (E::PermissionDenied { .. }, _) | (_, Some(403)) => format!(
            "access denied by the store (HTTP 403{said}): the key used for this bucket (the stores file's, else AWS_*) may not do this under this prefix"
        ),
        (E::Unauthenticated { .. }, _) | (_, Some(401)) => format!(
            "the store did not accept the key (HTTP 401{said}): check access_key_id and the secret for this bucket (the stores file's, else AWS_*)"
        ),
        (E::NotFound { path, .. }, _) => format!("{path} not found"),
        (_, Some(code)) => format!("the store answered HTTP {code}{said}"),
        _ => text,
    }
}

fn io_err(path: &FsPath) -> impl FnOnce(std::io::Error) -> CkptError + '_ {
    move |source| CkptError::Io { path: path.display().to_string(), source }
}

/// `ckpt-000000000042`.
pub fn ckpt_name(seq: u64) -> String {
    format!("ckpt-{seq:012}")
}

/// The sequence number of a checkpoint directory name.
pub fn parse_ckpt_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("ckpt-")?;
    if digits.len() != 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// One checkpoint found under a job's prefix.
#[derive(Clone, Debug)]
pub struct Entry {
    pub seq: u64,
    pub location: Location,
    pub state: EntryState,
}

#[derive(Clone, Debug)]
pub enum EntryState {
    /// Manifest present and sound; every file present with its size
    /// (digests are checked by [`verify`] and [`restore`]).
    Valid { manifest: Manifest, manifest_sha256: String },
    /// Files but no manifest: an upload in progress or torn.
    NoManifest,
    /// Why it is not a checkpoint.
    Invalid(String),
}

impl Entry {
    pub fn is_valid(&self) -> bool {
        matches!(self.state, EntryState::Valid { .. })
    }
}

/// A handle on the stores: opened stores are cached per store entry.
pub struct Client {
    stores: Stores,
    /// A std mutex: held only to look up or insert, never across `.await`.
    open: std::sync::Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
}

impl Client {
    pub fn new(stores: Stores) -> Client {
        Client { stores, open: Default::default() }
    }

    fn store(&self, loc: &Location) -> Result<Arc<dyn ObjectStore>> {
        // The entry that serves `loc` decides the store: cache by it.
        let key = match self.stores.entry_for(loc) {
            Some(e) => e.url.clone(),
            None => format!("{:?}://{}", loc.scheme, loc.bucket),
        };
        let mut cache = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = cache.get(&key) {
            return Ok(s.clone());
        }
        let s = self.stores.open(loc).map_err(CkptError::Invalid)?;
        cache.insert(key, s.clone());
        Ok(s)
    }

    /// The checkpoints under a job's prefix, oldest first, each checked
    /// cheaply (manifest and sizes).
    pub async fn list(&self, prefix: &Location) -> Result<Vec<Entry>> {
        let store = self.store(prefix)?;
        let listing = store
            .list_with_delimiter(Some(&prefix.dir()))
            .await
            .map_err(store_err(format!("listing {}", prefix.url())))?;
        let mut seqs: Vec<u64> =
            listing.common_prefixes.iter().filter_map(|p| p.filename().and_then(parse_ckpt_name)).collect();
        seqs.sort_unstable();
        let mut out = Vec::new();
        for seq in seqs {
            let location = prefix.join(&ckpt_name(seq));
            let state = self.check(&store, &location, seq).await?;
            out.push(Entry { seq, location, state });
        }
        Ok(out)
    }

    async fn check(&self, store: &Arc<dyn ObjectStore>, loc: &Location, seq: u64) -> Result<EntryState> {
        let (manifest, manifest_sha256) = match read_manifest(store, loc).await {
            Ok(m) => m,
            Err(CkptError::NoManifest { .. }) => return Ok(EntryState::NoManifest),
            Err(e @ CkptError::Manifest { .. }) => return Ok(EntryState::Invalid(e.to_string())),
            Err(e) => return Err(e),
        };
        if manifest.seq != seq {
            return Ok(EntryState::Invalid(format!("manifest says seq {} in {}", manifest.seq, loc.url())));
        }
        let sizes: BTreeMap<String, u64> = store
            .list(Some(&loc.dir()))
            .map_ok(|m| (m.location.as_ref().to_string(), m.size))
            .try_collect()
            .await
            .map_err(store_err(format!("listing {}", loc.url())))?;
        for f in &manifest.files {
            match sizes.get(loc.object(&f.path).as_ref()) {
                None => return Ok(EntryState::Invalid(torn(loc, f, "is missing".into()).to_string())),
                Some(&s) if s != f.size => {
                    let why = format!("has {s} bytes, the manifest says {}", f.size);
                    return Ok(EntryState::Invalid(torn(loc, f, why).to_string()));
                }
                Some(_) => {}
            }
        }
        Ok(EntryState::Valid { manifest, manifest_sha256 })
    }

    /// A checkpoint URL as given, or the latest valid one under a job prefix.
    pub async fn resolve(&self, url: &Location) -> Result<Location> {
        if parse_ckpt_name(url.name()).is_some() {
            return Ok(url.clone());
        }
        let entries = self.list(url).await?;
        entries
            .iter()
            .rev()
            .find(|e| e.is_valid())
            .map(|e| e.location.clone())
            .ok_or_else(|| CkptError::NoValid { prefix: url.url(), tried: entries.iter().map(describe).collect() })
    }

    /// Upload `dir` as the next checkpoint (or `opts.seq`) under `prefix`:
    /// every file, then the manifest; then keep the last `opts.keep` valid ones.
    pub async fn save(&self, dir: &FsPath, prefix: &Location, opts: &SaveOptions) -> Result<Saved> {
        let t0 = Instant::now();
        let files = walk(dir)?;
        let store = self.store(prefix)?;
        let seq = match opts.seq {
            Some(s) => s,
            None => self.list(prefix).await?.last().map_or(1, |e| e.seq + 1),
        };
        let loc = prefix.join(&ckpt_name(seq));
        if store.head(&loc.object(MANIFEST)).await.is_ok() {
            return Err(CkptError::Invalid(format!(
                "{} already holds a checkpoint: checkpoints are never overwritten",
                loc.url()
            )));
        }
        let entries: Vec<FileEntry> = futures::stream::iter(files.into_iter().map(|rel| {
            let store = store.clone();
            let (src, dst, url) = (dir.join(&rel), loc.object(&rel), format!("{}/{rel}", loc.url()));
            async move {
                let (size, sha256) = upload_file(&store, &src, &dst, &url).await?;
                Ok::<_, CkptError>(FileEntry { path: rel, size, sha256 })
            }
        }))
        .buffered(CONCURRENCY)
        .try_collect()
        .await?;
        let manifest = Manifest {
            format: FORMAT.into(),
            job_id: opts.job_id.clone(),
            seq,
            step: opts.step,
            created_at: now_rfc3339(),
            files: entries,
        };
        manifest.check().map_err(|source| CkptError::Manifest { url: loc.url(), source })?;
        let bytes = manifest.to_bytes();
        let manifest_sha256 = sha256_hex(&bytes);
        store
            .put(&loc.object(MANIFEST), PutPayload::from(bytes))
            .await
            .map_err(store_err(format!("writing {}/{MANIFEST}", loc.url())))?;
        let secs = t0.elapsed().as_secs_f64();
        let deleted = if opts.keep > 0 { self.retain(prefix, opts.keep).await? } else { Vec::new() };
        Ok(Saved { bytes: manifest.total_bytes(), location: loc, manifest, manifest_sha256, secs, deleted })
    }

    /// Check every file of a checkpoint against its manifest (full digests).
    pub async fn verify(&self, loc: &Location) -> Result<Verified> {
        let t0 = Instant::now();
        let store = self.store(loc)?;
        let (manifest, manifest_sha256) = read_manifest(&store, loc).await?;
        let seq_ok = parse_ckpt_name(loc.name()).map_or(true, |s| s == manifest.seq);
        if !seq_ok {
            return Err(CkptError::Invalid(format!("{}: manifest says seq {}", loc.url(), manifest.seq)));
        }
        futures::stream::iter(manifest.files.iter().map(|f| {
            let store = store.clone();
            async move {
                let mut sink = HashSink::default();
                fetch_checked(&store, loc, f, &mut sink).await
            }
        }))
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
        Ok(Verified {
            bytes: manifest.total_bytes(),
            location: loc.clone(),
            manifest,
            manifest_sha256,
            secs: t0.elapsed().as_secs_f64(),
        })
    }

    /// Restore into `dest` (absent or an empty directory): the checkpoint
    /// at `url` when it names one, else the newest valid one under the
    /// prefix `url`, falling back to older ones when a file is torn.
    /// Files land in a private staging directory beside `dest` that is
    /// renamed to `dest` only once every digest matched.
    pub async fn restore(&self, url: &Location, dest: &FsPath) -> Result<Restored> {
        let t0 = Instant::now();
        check_dest(dest)?;
        let (candidates, explicit) = if parse_ckpt_name(url.name()).is_some() {
            (vec![url.clone()], true)
        } else {
            let entries = self.list(url).await?;
            let mut skipped: Vec<String> = Vec::new();
            let mut c = Vec::new();
            for e in entries.iter().rev() {
                if e.is_valid() {
                    c.push(e.location.clone());
                } else {
                    skipped.push(describe(e));
                }
            }
            if c.is_empty() {
                return Err(CkptError::NoValid { prefix: url.url(), tried: skipped });
            }
            (c, false)
        };
        let mut skipped = Vec::new();
        for loc in candidates {
            match self.restore_one(&loc, dest).await {
                Ok((manifest, manifest_sha256)) => {
                    return Ok(Restored {
                        bytes: manifest.total_bytes(),
                        location: loc,
                        manifest,
                        manifest_sha256,
                        skipped,
                        secs: t0.elapsed().as_secs_f64(),
                    })
                }
                Err(e) if explicit => return Err(e),
                Err(e @ (CkptError::Torn { .. } | CkptError::Manifest { .. } | CkptError::NoManifest { .. })) => {
                    skipped.push(e.to_string())
                }
                Err(e) => return Err(e),
            }
        }
        Err(CkptError::NoValid { prefix: url.url(), tried: skipped })
    }

    async fn restore_one(&self, loc: &Location, dest: &FsPath) -> Result<(Manifest, String)> {
        let store = self.store(loc)?;
        let (manifest, manifest_sha256) = read_manifest(&store, loc).await?;
        let staging = staging_dir(dest)?;
        let result = async {
            futures::stream::iter(manifest.files.iter().map(|f| {
                let store = store.clone();
                let staging = staging.clone();
                async move {
                    let path = create_parents(&staging, &f.path)?;
                    let file = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o600)
                        .custom_flags(libc_o_nofollow())
                        .open(&path)
                        .map_err(io_err(&path))?;
                    let mut sink = FileSink {
                        file: tokio::fs::File::from_std(file),
                        path: path.clone(),
                        hash: Sha256::new(),
                        len: 0,
                    };
                    fetch_checked(&store, loc, f, &mut sink).await?;
                    sink.file.flush().await.map_err(io_err(&path))?;
                    sink.file.sync_all().await.map_err(io_err(&path))
                }
            }))
            .buffer_unordered(CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await?;
            let m = staging.join(MANIFEST);
            std::fs::write(&m, manifest.to_bytes()).map_err(io_err(&m))?;
            if dest.exists() {
                std::fs::remove_dir(dest).map_err(io_err(dest))?;
            }
            std::fs::rename(&staging, dest).map_err(io_err(dest))
        }
        .await;
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        result.map(|()| (manifest, manifest_sha256))
    }

    /// Copy the checkpoint `src` (or the latest valid one under the prefix
    /// `src`) to the same name under the prefix `dst`, checking every
    /// file's digest on the way; the manifest (the same bytes) goes last.
    /// A copy that fails leaves no manifest at `dst`: it is never taken for
    /// a checkpoint, and what was written is deleted.
    pub async fn copy(&self, src: &Location, dst_prefix: &Location) -> Result<Copied> {
        let t0 = Instant::now();
        let src = self.resolve(src).await?;
        let (from, to) = (self.store(&src)?, self.store(dst_prefix)?);
        let (manifest, manifest_sha256) = read_manifest(&from, &src).await?;
        let dst = dst_prefix.join(src.name());
        if to.head(&dst.object(MANIFEST)).await.is_ok() {
            return Err(CkptError::Invalid(format!("{} already holds a checkpoint", dst.url())));
        }
        let copied = futures::stream::iter(manifest.files.iter().map(|f| {
            let (from, to, src, dst) = (from.clone(), to.clone(), src.clone(), dst.clone());
            async move {
                let what = format!("writing {}/{}", dst.url(), f.path);
                if f.size < PART as u64 {
                    // One PUT (a multipart upload of an empty file has no part,
                    // which S3 refuses).
                    let mut sink = BufSink::default();
                    fetch_checked(&from, &src, f, &mut sink).await?;
                    to.put(&dst.object(&f.path), PutPayload::from(sink.buf)).await.map_err(store_err(what))?;
                    return Ok(());
                }
                let upload = to.put_multipart(&dst.object(&f.path)).await.map_err(store_err(what))?;
                let mut sink = UploadSink {
                    w: Some(WriteMultipart::new_with_chunk_size(upload, PART)),
                    hash: Sha256::new(),
                    len: 0,
                };
                match fetch_checked(&from, &src, f, &mut sink).await {
                    Ok(()) => {
                        let w = sink.w.take().expect("the upload is finished once");
                        w.finish().await.map_err(store_err(format!("writing {}/{}", dst.url(), f.path)))?;
                        Ok(())
                    }
                    Err(e) => {
                        if let Some(w) = sink.w.take() {
                            let _ = w.abort().await;
                        }
                        Err(e)
                    }
                }
            }
        }))
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await;
        if let Err(e) = copied {
            self.delete_all(&to, &dst).await;
            return Err(e);
        }
        to.put(&dst.object(MANIFEST), PutPayload::from(manifest.to_bytes()))
            .await
            .map_err(store_err(format!("writing {}/{MANIFEST}", dst.url())))?;
        Ok(Copied {
            bytes: manifest.total_bytes(),
            from: src,
            location: dst,
            manifest,
            manifest_sha256,
            secs: t0.elapsed().as_secs_f64(),
        })
    }

    /// Keep the newest `keep` valid checkpoints under `prefix`; delete
    /// older ones, and incomplete ones older than the oldest kept (an
    /// upload still in progress is always newer). Each goes manifest
    /// first, so a half-deleted checkpoint is never taken for a valid one.
    pub async fn retain(&self, prefix: &Location, keep: usize) -> Result<Vec<Location>> {
        let keep = keep.max(1);
        let entries = self.list(prefix).await?;
        let valid: Vec<u64> = entries.iter().filter(|e| e.is_valid()).map(|e| e.seq).collect();
        if valid.len() <= keep {
            return Ok(Vec::new());
        }
        let oldest_kept = valid[valid.len() - keep];
        let store = self.store(prefix)?;
        let mut deleted = Vec::new();
        for e in entries.iter().filter(|e| e.seq < oldest_kept) {
            store
                .delete(&e.location.object(MANIFEST))
                .await
                .or_else(|err| if matches!(err, object_store::Error::NotFound { .. }) { Ok(()) } else { Err(err) })
                .map_err(store_err(format!("deleting {}", e.location.url())))?;
            self.delete_all(&store, &e.location).await;
            deleted.push(e.location.clone());
        }
        Ok(deleted)
    }

    async fn delete_all(&self, store: &Arc<dyn ObjectStore>, loc: &Location) {
        let paths = store.list(Some(&loc.dir())).map_ok(|m| m.location).boxed();
        let _ = store.delete_stream(paths).try_collect::<Vec<Path>>().await;
    }
}

fn describe(e: &Entry) -> String {
    match &e.state {
        EntryState::Valid { .. } => format!("{}: valid", e.location.url()),
        EntryState::NoManifest => format!("{}: no manifest (incomplete)", e.location.url()),
        EntryState::Invalid(why) => format!("{}: {why}", e.location.url()),
    }
}

fn torn(loc: &Location, f: &FileEntry, why: String) -> CkptError {
    CkptError::Torn { url: loc.url(), file: f.path.clone(), why }
}

#[derive(Clone, Debug)]
pub struct SaveOptions {
    pub job_id: String,
    /// `None`: one more than the highest under the prefix.
    pub seq: Option<u64>,
    pub step: Option<u64>,
    /// Valid checkpoints kept after the save (0: keep all).
    pub keep: usize,
}

#[derive(Clone, Debug)]
pub struct Saved {
    pub location: Location,
    pub manifest: Manifest,
    pub manifest_sha256: String,
    pub bytes: u64,
    pub secs: f64,
    pub deleted: Vec<Location>,
}

#[derive(Clone, Debug)]
pub struct Verified {
    pub location: Location,
    pub manifest: Manifest,
    pub manifest_sha256: String,
    pub bytes: u64,
    pub secs: f64,
}

#[derive(Clone, Debug)]
pub struct Restored {
    pub location: Location,
    pub manifest: Manifest,
    pub manifest_sha256: String,
    pub bytes: u64,
    pub secs: f64,
    /// Newer checkpoints passed over, and why.
    pub skipped: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct Copied {
    pub from: Location,
    pub location: Location,
    pub manifest: Manifest,
    pub manifest_sha256: String,
    pub bytes: u64,
    pub secs: f64,
}

async fn read_manifest(store: &Arc<dyn ObjectStore>, loc: &Location) -> Result<(Manifest, String)> {
    let path = loc.object(MANIFEST);
    let got = match store.get(&path).await {
        Ok(g) => g,
        Err(object_store::Error::NotFound { .. }) => return Err(CkptError::NoManifest { url: loc.url() }),
        Err(e) => return Err(store_err(format!("reading {}/{MANIFEST}", loc.url()))(e)),
    };
    if got.meta.size > crate::manifest::MAX_MANIFEST_BYTES {
        return Err(CkptError::Manifest { url: loc.url(), source: ManifestError::TooLarge(got.meta.size) });
    }
    let bytes = got.bytes().await.map_err(store_err(format!("reading {}/{MANIFEST}", loc.url())))?;
    let m = Manifest::parse(&bytes).map_err(|source| CkptError::Manifest { url: loc.url(), source })?;
    Ok((m, sha256_hex(&bytes)))
}

/// Where fetched bytes go, hashed on the way.
trait Sink {
    async fn put(&mut self, chunk: Bytes) -> Result<()>;
    fn digest(&mut self) -> (u64, String);
}

#[derive(Default)]
struct HashSink {
    hash: Sha256,
    len: u64,
}

impl Sink for HashSink {
    async fn put(&mut self, chunk: Bytes) -> Result<()> {
        self.hash.update(&chunk);
        self.len += chunk.len() as u64;
        Ok(())
    }
    fn digest(&mut self) -> (u64, String) {
        (self.len, hex::encode(std::mem::take(&mut self.hash).finalize()))
    }
}

/// Collects a small file's bytes for one PUT.
#[derive(Default)]
struct BufSink {
    buf: Vec<u8>,
    hash: Sha256,
}

impl Sink for BufSink {
    async fn put(&mut self, chunk: Bytes) -> Result<()> {
        self.hash.update(&chunk);
        self.buf.extend_from_slice(&chunk);
        Ok(())
    }
    fn digest(&mut self) -> (u64, String) {
        (self.buf.len() as u64, hex::encode(std::mem::take(&mut self.hash).finalize()))
    }
}

struct FileSink {
    file: tokio::fs::File,
    path: PathBuf,
    hash: Sha256,
    len: u64,
}

impl Sink for FileSink {
    async fn put(&mut self, chunk: Bytes) -> Result<()> {
        self.hash.update(&chunk);
        self.len += chunk.len() as u64;
        self.file.write_all(&chunk).await.map_err(io_err(&self.path))
    }
    fn digest(&mut self) -> (u64, String) {
        (self.len, hex::encode(std::mem::take(&mut self.hash).finalize()))
    }
}

struct UploadSink {
    w: Option<WriteMultipart>,
    hash: Sha256,
    len: u64,
}

impl Sink for UploadSink {
    async fn put(&mut self, chunk: Bytes) -> Result<()> {
        self.hash.update(&chunk);
        self.len += chunk.len() as u64;
        let w = self.w.as_mut().expect("writing before finish");
        w.wait_for_capacity(CONCURRENCY).await.map_err(store_err("uploading a part"))?;
        w.put(chunk);
        Ok(())
    }
    fn digest(&mut self) -> (u64, String) {
        (self.len, hex::encode(std::mem::take(&mut self.hash).finalize()))
    }
}

/// Stream one file of checkpoint `loc` into `sink`, refusing more bytes
/// than the manifest says, then check its size and digest.
async fn fetch_checked(
    store: &Arc<dyn ObjectStore>,
    loc: &Location,
    f: &FileEntry,
    sink: &mut impl Sink,
) -> Result<()> {
    let too_long = || torn(loc, f, format!("has more than the {} bytes the manifest says", f.size));
    if loc.scheme == crate::location::Scheme::File {
        // A local store is read without object_store, which follows
        // symbolic links: the job wrote these files as its user, and a
        // copy runs as the agent.
        let abs = PathBuf::from(format!("/{}", loc.object(&f.path)));
        let opened = tokio::task::spawn_blocking({
            let abs = abs.clone();
            move || open_plain_file(&abs)
        })
        .await
        .map_err(|e| torn(loc, f, format!("could not be opened: {e}")))?;
        let (std_file, size) = match opened {
            Ok(o) => o,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(torn(loc, f, "is missing".into())),
            Err(e) => return Err(torn(loc, f, format!("cannot be read safely: {e}"))),
        };
        if size != f.size {
            return Err(torn(loc, f, format!("has {size} bytes, the manifest says {}", f.size)));
        }
        let mut file = tokio::fs::File::from_std(std_file);
        let mut n = 0u64;
        loop {
            let chunk = read_chunk(&mut file, &abs).await?;
            if chunk.is_empty() {
                break;
            }
            n += chunk.len() as u64;
            if n > f.size {
                return Err(too_long());
            }
            sink.put(Bytes::from(chunk)).await?;
        }
    } else {
        let got = match store.get(&loc.object(&f.path)).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Err(torn(loc, f, "is missing".into())),
            Err(e) => return Err(store_err(format!("reading {}/{}", loc.url(), f.path))(e)),
        };
        if got.meta.size != f.size {
            return Err(torn(loc, f, format!("has {} bytes, the manifest says {}", got.meta.size, f.size)));
        }
        let mut stream = got.into_stream();
        let mut n = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(store_err(format!("reading {}/{}", loc.url(), f.path)))?;
            n += chunk.len() as u64;
            if n > f.size {
                return Err(too_long());
            }
            sink.put(chunk).await?;
        }
    }
    let (len, sha) = sink.digest();
    if len != f.size {
        return Err(torn(loc, f, format!("has {len} bytes, the manifest says {}", f.size)));
    }
    if sha != f.sha256 {
        return Err(torn(loc, f, format!("has sha256 {sha}, the manifest says {}", f.sha256)));
    }
    Ok(())
}

/// Upload one local file to `dst` (`url` in messages), hashing the bytes
/// sent. Returns (size, sha256).
async fn upload_file(store: &Arc<dyn ObjectStore>, src: &FsPath, dst: &Path, url: &str) -> Result<(u64, String)> {
    let std_file =
        std::fs::OpenOptions::new().read(true).custom_flags(libc_o_nofollow()).open(src).map_err(io_err(src))?;
    let mut file = tokio::fs::File::from_std(std_file);
    let mut hash = Sha256::new();
    let mut first = read_chunk(&mut file, src).await?;
    hash.update(&first);
    if first.len() < PART {
        let (n, sha) = (first.len() as u64, hex::encode(hash.finalize()));
        store.put(dst, PutPayload::from(first)).await.map_err(store_err(format!("writing {url}")))?;
        return Ok((n, sha));
    }
    let upload = store.put_multipart(dst).await.map_err(store_err(format!("writing {url}")))?;
    let mut w = WriteMultipart::new_with_chunk_size(upload, PART);
    let mut n = 0u64;
    let res: Result<()> = async {
        loop {
            if first.is_empty() {
                return Ok(());
            }
            n += first.len() as u64;
            w.wait_for_capacity(CONCURRENCY).await.map_err(store_err(format!("writing {url}")))?;
            w.put(Bytes::from(first));
            first = read_chunk(&mut file, src).await?;
            hash.update(&first);
        }
    }
    .await;
    match res {
        Ok(()) => {
            w.finish().await.map_err(store_err(format!("writing {url}")))?;
            Ok((n, hex::encode(hash.finalize())))
        }
        Err(e) => {
            let _ = w.abort().await;
            Err(e)
        }
    }
}

/// Up to [`PART`] bytes (fewer only at the end of the file).
async fn read_chunk(file: &mut tokio::fs::File, path: &FsPath) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; PART];
    let mut filled = 0;
    while filled < PART {
        let n = file.read(&mut buf[filled..]).await.map_err(io_err(path))?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    buf.truncate(filled);
    Ok(buf)
}

/// The regular files under `dir`, relative, sorted; the top-level
/// manifest (of a restored checkpoint) is left out. A symbolic link or
/// any other non-regular file is an error naming it: a checkpoint holds
/// regular files only.
pub fn walk(dir: &FsPath) -> Result<Vec<String>> {
    let meta = std::fs::symlink_metadata(dir).map_err(io_err(dir))?;
    if !meta.is_dir() {
        return Err(CkptError::Invalid(format!("{} is not a directory", dir.display())));
    }
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((abs, rel)) = stack.pop() {
        for ent in std::fs::read_dir(&abs).map_err(io_err(&abs))? {
            let ent = ent.map_err(io_err(&abs))?;
            let name = ent.file_name();
            let name = name
                .to_str()
                .ok_or_else(|| CkptError::Invalid(format!("{}: file name is not UTF-8", ent.path().display())))?;
            let r = if rel.is_empty() { name.to_string() } else { format!("{rel}/{name}") };
            let ty = ent.file_type().map_err(io_err(&ent.path()))?;
            if ty.is_dir() {
                stack.push((ent.path(), r));
            } else if ty.is_file() {
                if r == MANIFEST {
                    continue;
                }
                crate::manifest::safe_rel_path(&r).map_err(|e| CkptError::Invalid(e.to_string()))?;
                out.push(r);
            } else {
                let what = if ty.is_symlink() { "a symbolic link" } else { "not a regular file" };
                return Err(CkptError::Invalid(format!(
                    "{} is {what}: a checkpoint holds regular files only",
                    ent.path().display()
                )));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn check_dest(dest: &FsPath) -> Result<()> {
    match std::fs::symlink_metadata(dest) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(dest)(e)),
        Ok(m) if m.file_type().is_symlink() => {
            Err(CkptError::Invalid(format!("{} is a symbolic link: restore into a real directory", dest.display())))
        }
        Ok(m) if !m.is_dir() => Err(CkptError::Invalid(format!("{} exists and is not a directory", dest.display()))),
        Ok(_) => {
            if std::fs::read_dir(dest).map_err(io_err(dest))?.next().is_some() {
                Err(CkptError::Invalid(format!(
                    "{} is not empty: restore into an empty or new directory",
                    dest.display()
                )))
            } else {
                Ok(())
            }
        }
    }
}

/// A fresh private directory beside `dest` (same filesystem, so the
/// final rename is atomic).
fn staging_dir(dest: &FsPath) -> Result<PathBuf> {
    let name = dest.file_name().and_then(|n| n.to_str()).unwrap_or("restore");
    let parent = dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(FsPath::new("."));
    for i in 0..100u32 {
        let p = parent.join(format!(".{name}.fleet-ckpt-{}-{i}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err(&p)(e)),
        }
    }
    Err(CkptError::Invalid(format!("no free staging directory beside {}", dest.display())))
}

/// Create the directories of `rel` (checked) under `root`, refusing to
/// pass through anything that is not a real directory, and return the
/// file's path.
fn create_parents(root: &FsPath, rel: &str) -> Result<PathBuf> {
    let parts = crate::manifest::safe_rel_path(rel).map_err(|e| CkptError::Invalid(e.to_string()))?;
    let mut p = root.to_path_buf();
    for d in &parts[..parts.len() - 1] {
        p.push(d);
        match std::fs::DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let m = std::fs::symlink_metadata(&p).map_err(io_err(&p))?;
                if !m.is_dir() {
                    return Err(CkptError::Invalid(format!("{} is not a directory", p.display())));
                }
            }
            Err(e) => return Err(io_err(&p)(e)),
        }
    }
    p.push(parts[parts.len() - 1]);
    Ok(p)
}

/// Opens `abs` for reading with no symbolic link in any of its components
/// (`openat2`, `RESOLVE_NO_SYMLINKS`), and only as a regular file with one
/// link (no FIFO to hang on, no hard link to a file of the agent's): its
/// size beside it. A local store's path must therefore be its real one.
fn open_plain_file(abs: &FsPath) -> std::io::Result<(std::fs::File, u64)> {
    use rustix::fs::{openat2, Mode, OFlags, ResolveFlags, CWD};
    use std::os::unix::fs::MetadataExt;
    let fd = openat2(
        CWD,
        abs,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| {
        if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::XDEV {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "a symbolic link on its path")
        } else {
            std::io::Error::from(e)
        }
    })?;
    let file = std::fs::File::from(fd);
    let m = file.metadata()?;
    if !m.file_type().is_file() || m.nlink() != 1 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not a regular file with one link"));
    }
    Ok((file, m.len()))
}

fn libc_o_nofollow() -> i32 {
    libc::O_NOFOLLOW
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boxed(text: &str) -> Box<dyn std::error::Error + Send + Sync> {
        Box::new(std::io::Error::other(text.to_string()))
    }

    const DENIED: &str = "Server returned non-2xx status code: 403 Forbidden: <?xml version=\"1.0\"?>\n\
        <Error><Code>AccessDenied</Code><Message>Access Denied</Message><RequestId>x</RequestId></Error>";

    #[test]
    fn a_refused_key_is_said_once_with_the_stores_code() {
        // A 403 on a GET arrives as PermissionDenied; on a list, as Generic.
        for e in [
            object_store::Error::PermissionDenied { path: "fleet/beta/bob/j/ckpt-1/a".into(), source: boxed(DENIED) },
            object_store::Error::Generic { store: "S3", source: boxed(DENIED) },
        ] {
            let text = CkptError::Store { what: "listing s3://b/fleet/beta/bob/j".into(), error: e }.to_string();
            assert_eq!(
                text,
                "listing s3://b/fleet/beta/bob/j: access denied by the store (HTTP 403: AccessDenied (Access Denied)): \
                 the key used for this bucket (the stores file's, else AWS_*) may not do this under this prefix"
            );
        }
        let unauth = object_store::Error::Generic {
            store: "S3",
            source: boxed(
                "Server returned non-2xx status code: 401 Unauthorized: <Error><Code>InvalidAccessKeyId</Code></Error>",
            ),
        };
        assert!(store_text(&unauth).starts_with("the store did not accept the key (HTTP 401: InvalidAccessKeyId)"));
        let other = object_store::Error::Generic {
            store: "S3",
            source: boxed("Server returned non-2xx status code: 503 Service Unavailable: <Error><Code>SlowDown</Code><Message>Reduce your request rate</Message></Error>"),
        };
        assert_eq!(store_text(&other), "the store answered HTTP 503: SlowDown (Reduce your request rate)");
        let down =
            object_store::Error::Generic { store: "S3", source: boxed("error sending request: connection refused") };
        assert_eq!(store_text(&down), "error sending request: connection refused");
    }
}
