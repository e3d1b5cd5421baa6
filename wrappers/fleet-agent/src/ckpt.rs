//! Checkpoints at the target (docs/checkpoints.md): what a run needs to
//! report its checkpoints, and the copy of a checkpoint from another
//! region's store before a resumed run starts.
//!
//! **The checkpoint token.** A run reports checkpoints with a token that
//! only posts checkpoints of its own fleet job, and only while this cluster
//! runs it: `fleet_api::auth::ckpt_token(<this cluster's token>, <job id>)`
//! (the meta-scheduler recomputes it). It is written into the run's private
//! directory (`<spool>/jobs/<id>/.fleet-ckpt-token`: the directory is 0700
//! with an ACL for the job's user alone, the file 0640 with the directory's
//! default ACL), and the job is told its *path* (`FLEET_CKPT_TOKEN_FILE`).
//! Not its value in the environment: the variables of a job travel on
//! sbatch's command line (`--export`, visible in `ps` to every user of
//! this host while sbatch runs), and a job's environment is inherited by
//! everything it starts.
//!
//! **The copy.** When the assignment's checkpoint lies only in another
//! region's store (`resume_copy_to` set), the agent copies it into this
//! region's store with `fleet-ckpt copy` (every digest checked, manifest
//! last) before it submits, reports the copy to the catalog with its
//! bytes and seconds (the cross-region transfer, for egress accounting),
//! and the job's `FLEET_RESUME_FROM` names the copy.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// The name of the token file in a run's directory.
pub const TOKEN_FILE: &str = ".fleet-ckpt-token";

/// Longest a copy may take before the resume is retried.
pub const COPY_TIMEOUT: Duration = Duration::from_secs(1800);

/// What every run at this cluster gets for its checkpoints.
#[derive(Clone, Debug, Default)]
pub struct JobCkpt {
    /// `MetaSchedulerUrl`, as `FLEET_METASCHED_URL`.
    pub metasched_url: String,
    /// `MetaSchedulerCaFile` (world-readable), as `FLEET_METASCHED_CA`.
    pub ca_file: Option<PathBuf>,
    /// This cluster's token: the key of the runs' checkpoint tokens.
    pub cluster_token: String,
    /// `CkptStores`: the agent's copies, and every run's
    /// `FLEET_CKPT_STORES` unless `user_stores` is set.
    pub stores: Option<PathBuf>,
    /// `CkptUserStores`: each run's own stores file, `%u` its user here.
    pub user_stores: Option<String>,
    /// `JobLeaseMs`: each run's in-job lease (`None`: runs without one).
    pub job_lease: Option<Duration>,
    /// `CkptHelper`: the `fleet-ckpt` the runs' first line names.
    pub helper: PathBuf,
}

/// The name of the job's own script in a run's directory, when the run
/// is submitted under its in-job lease.
pub const SCRIPT_FILE: &str = ".fleet-script";

/// Whether `v` travels intact in sbatch's comma-separated `--export`.
fn exportable(v: &str) -> bool {
    !v.is_empty() && v.len() <= 4096 && v.chars().all(|c| c.is_ascii_graphic() && !matches!(c, ',' | '"' | '\'' | '\\'))
}

impl JobCkpt {
    /// Runs here start under their in-job lease (`JobLeaseMs` > 0 and a
    /// helper that can be an interpreter line): what the heartbeat's
    /// `start_gate` says. A run whose script has no `#!` line still goes
    /// without; an early-placed one is then refused ([`Backend::submit`]).
    ///
    /// [`Backend::submit`]: crate::backend::Backend::submit
    pub fn gates_runs(&self) -> bool {
        let helper = self.helper.display().to_string();
        self.job_lease.is_some()
            && !self.cluster_token.is_empty()
            && exportable(&self.metasched_url)
            && self.helper.is_absolute()
            && helper.len() <= 100
            && exportable(&helper)
            && self.helper.is_file()
    }

    /// The stores file a run of local user `user` gets: its own
    /// (`CkptUserStores` with `%u` its name; `None` for a name that cannot
    /// be one path component), else `CkptStores`, every run's.
    pub fn stores_of(&self, user: &str) -> Option<PathBuf> {
        match &self.user_stores {
            None => self.stores.clone(),
            Some(_) if user.is_empty() || user == "." || user == ".." || user.contains(['/', '\0', '%']) => None,
            Some(t) => Some(PathBuf::from(t.replace("%u", user))),
        }
    }

    /// Writes the run's checkpoint token into its directory `dir` (made by
    /// `jobdir::create`) and returns the variables that tell the job where
    /// things are (none is secret): among them the stores file of `user`
    /// (the run's user here), its own where it has one
    /// ([`JobCkpt::stores_of`]: the run reads it as that user, the agent
    /// never does; one that does not exist is not named, and the run uses
    /// its own `AWS_*`). Without a cluster token (tests), no token and no
    /// report settings.
    pub fn prepare(&self, id: &str, dir: &Path, user: &str) -> Result<Vec<(&'static str, String)>> {
        let mut env = Vec::new();
        let stores = self.stores_of(user).filter(|p| {
            // The user's file may lie where the agent cannot look (its
            // home, mode 0700): only a file known to be missing is left out.
            self.user_stores.is_none()
                || std::fs::symlink_metadata(p).map_or_else(|e| e.kind() != std::io::ErrorKind::NotFound, |_| true)
        });
        if let Some(s) = stores.map(|p| p.display().to_string()).filter(|s| exportable(s)) {
            env.push(("FLEET_CKPT_STORES", s));
        }
        if self.cluster_token.is_empty() || !exportable(&self.metasched_url) {
            return Ok(env);
        }
        let path = dir.join(TOKEN_FILE);
        let shown = path.display().to_string();
        if !exportable(&shown) {
            return Ok(env);
        }
        crate::jobdir::write_private(&path, fleet_api::auth::ckpt_token(&self.cluster_token, id).as_bytes())?;
        env.push(("FLEET_METASCHED_URL", self.metasched_url.clone()));
        env.push(("FLEET_CKPT_TOKEN_FILE", shown));
        if let Some(ca) = self.ca_file.as_ref().map(|p| p.display().to_string()).filter(|s| exportable(s)) {
            env.push(("FLEET_METASCHED_CA", ca));
        }
        Ok(env)
    }
}

impl JobCkpt {
    /// The run under its in-job lease (docs/failover.md, "The in-job
    /// lease"): the script sbatch is given is the job's own with its first
    /// line replaced by `#!<CkptHelper> lease-exec` (its directives, which
    /// the Slurm backend comments out before sbatch reads them, stay in
    /// place), and the job's script itself is
    /// written to the run's directory, which `lease-exec` runs with the
    /// job's own interpreter once it holds a lease and its watchdog runs.
    /// `env` is what [`JobCkpt::prepare`] returned (the lease renews with
    /// the run's checkpoint token: without one, no lease). `None`: the run
    /// goes without (leases off at this site, no token, no `#!` line, or a
    /// helper path that cannot be an interpreter line).
    pub fn wrap(
        &self,
        dir: &Path,
        script: &[u8],
        epoch: u64,
        env: &mut Vec<(&'static str, String)>,
    ) -> Result<Option<Vec<u8>>> {
        let Some(lease) = self.job_lease else { return Ok(None) };
        // An interpreter line `lease-exec` can read (UTF-8, a path after `#!`).
        let first = &script[..script.iter().position(|&b| b == b'\n').unwrap_or(script.len())];
        let readable = std::str::from_utf8(first)
            .ok()
            .and_then(|l| l.strip_prefix("#!"))
            .is_some_and(|l| !l.trim_matches([' ', '\t', '\r']).is_empty());
        if !env.iter().any(|(k, _)| *k == "FLEET_CKPT_TOKEN_FILE") || !readable {
            return Ok(None);
        }
        let helper = self.helper.display().to_string();
        if !self.helper.is_absolute() || helper.len() > 100 || !exportable(&helper) || !self.helper.is_file() {
            tracing::warn!(helper = %helper, "CkptHelper is not a program that can be a script's interpreter line: runs go without their job lease");
            return Ok(None);
        }
        let path = dir.join(SCRIPT_FILE);
        let shown = path.display().to_string();
        if !exportable(&shown) {
            return Ok(None);
        }
        crate::jobdir::write_private(&path, script)?;
        let rest = script.iter().position(|&b| b == b'\n').map(|i| &script[i..]).unwrap_or(b"\n");
        let mut wrapped = format!("#!{helper} lease-exec").into_bytes();
        wrapped.extend_from_slice(rest);
        env.push(("FLEET_JOB_SCRIPT", shown));
        env.push(("FLEET_EPOCH", epoch.to_string()));
        env.push(("FLEET_JOB_LEASE_MS", lease.as_millis().to_string()));
        Ok(Some(wrapped))
    }
}

/// Whether the run in `dir` was submitted under its in-job lease (the
/// job's script was put there for `lease-exec`; a regular file, not a link).
pub fn under_lease(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join(SCRIPT_FILE)).is_ok_and(|m| m.is_file())
}

/// The file the run's watchdog writes when it stops the run (its reason).
pub const LEASE_STOPPED_FILE: &str = ".fleet-lease-stopped";

/// Why the run in `dir` was stopped by its in-job lease, if it was: the
/// first line of its watchdog's note (a regular file, not followed
/// through a link, at most 1 KiB read, printable characters only).
pub fn lease_stopped(dir: &Path) -> Option<String> {
    let line = note(dir, LEASE_STOPPED_FILE)?;
    Some(if line.is_empty() { "its job lease ran out".to_string() } else { line })
}

/// The first line of the note `name` in the run's directory `dir`, if
/// there is one: a regular file, not followed through a link, at most
/// 1 KiB read, printable characters only (the job may write these notes).
fn note(dir: &Path, name: &str) -> Option<String> {
    let buf = read_note(dir, name, 1024)?;
    let text = String::from_utf8_lossy(&buf);
    Some(text.lines().next().unwrap_or("").chars().filter(|c| !c.is_control()).take(300).collect())
}

/// At most `limit` bytes of the file `name` in the run's directory `dir`:
/// a regular file with one link, opened without following a symbolic link
/// or blocking on a FIFO. The job may write its directory's entries: a
/// hard link there to a file only the agent may read (its token, where
/// `fs.protected_hardlinks` is off) would otherwise be read by the agent
/// and end up in the job's reason, on its stderr. The output relay's own
/// check ([`crate::jobdir::open_output`]).
fn read_note(dir: &Path, name: &str, limit: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    let crate::jobdir::Opened::File(f, _) = crate::jobdir::open_output(&dir.join(name), None).ok()? else {
        return None;
    };
    let mut buf = Vec::new();
    f.take(limit).read_to_end(&mut buf).ok()?;
    Some(buf)
}

/// The note `lease-exec` writes in the run's directory once it starts the
/// job's script (after its first lease):
/// `started job <slurm job id> restart <Slurm's restart count> epoch <fleet epoch>`.
pub const RUN_STARTED_FILE: &str = ".fleet-run-started";
/// The note `lease-exec` writes when the job's script ended by itself
/// (not stopped by its lease), before it claims that end: `exit <code>`
/// or `signal <n>`, `after <k>` when Slurm's kill of the step came first,
/// then the same run as its start note (`job <id> restart <n> epoch <e>`).
pub const RUN_ENDED_FILE: &str = ".fleet-run-ended";

/// Which run a note of `lease-exec` is of: a Slurm job runs again under
/// its id when Slurm requeues it (its restart count grows), and the run's
/// directory outlives a placement (the epoch tells them apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotedRun {
    pub slurm_id: u64,
    pub restart: u32,
    pub epoch: u64,
    /// When `lease-exec` started (Unix ms; 0: not noted): tells apart two
    /// starts Slurm did not count (a slurmctld recovered from older state
    /// launches the job again under the same restart count).
    pub at_ms: u64,
}

/// `job <id> restart <n> epoch <e> [at <unix ms>]`.
fn parse_run(w: &[&str]) -> Option<NotedRun> {
    let (head, at_ms) = match w {
        [head @ .., "at", at] => (head, at.parse().ok()?),
        _ => (w, 0),
    };
    let ["job", id, "restart", restart, "epoch", epoch] = head else { return None };
    Some(NotedRun { slurm_id: id.parse().ok()?, restart: restart.parse().ok()?, epoch: epoch.parse().ok()?, at_ms })
}

/// Reads a start note (`started job <id> restart <n> epoch <e>`).
pub fn parse_started(line: &str) -> Option<NotedRun> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let ["started", rest @ ..] = w.as_slice() else { return None };
    parse_run(rest)
}

/// How a run's script ended, as `lease-exec` noted it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NotedEnd {
    /// Its exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Slurm's kill of the whole batch step (SIGTERM) came first: the
    /// script ended by that kill (its child died of it, or it caught it and
    /// exited), not on its own, unless a user had it sent.
    pub after_signal: Option<i32>,
}

/// Reads an end note: `exit <code>` or `signal <n>`, then `after <k>`
/// when Slurm's kill of the step came first, then the run; anything else
/// is `None`.
pub fn parse_ended(line: &str) -> Option<(NotedRun, NotedEnd)> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let [how, n, rest @ ..] = w.as_slice() else { return None };
    let (after_signal, rest) = match rest {
        ["after", k, rest @ ..] => (Some(k.parse::<i32>().ok().filter(|k| (1..=64).contains(k))?), rest),
        _ => (None, rest),
    };
    let run = parse_run(rest)?;
    let (exit_code, signal) = match (*how, n.parse::<i32>().ok()?) {
        ("exit", c @ 0..=255) => (Some(c), None),
        ("signal", s @ 1..=64) => (None, Some(s)),
        _ => return None,
    };
    Some((run, NotedEnd { exit_code, signal, after_signal }))
}

/// One line per start of the script, appended by `lease-exec`:
/// `job <slurm job id> restart <n> epoch <e>`.
pub const RUN_STARTS_FILE: &str = ".fleet-run-starts";

/// How many times `lease-exec` started the script of Slurm job `slurm_id`
/// in fleet epoch `epoch` (0: any) in `dir`, by its start log (read
/// without following links, at most 64 KiB). The job could add lines: a
/// count that only ever reports more re-runs than happened, never fewer.
pub fn run_starts(dir: &Path, slurm_id: u64, epoch: u64) -> u32 {
    let Some(buf) = read_note(dir, RUN_STARTS_FILE, 64 * 1024) else { return 0 };
    String::from_utf8_lossy(&buf)
        .lines()
        .filter_map(|l| parse_run(&l.split_whitespace().collect::<Vec<_>>()))
        .filter(|r| r.slurm_id == slurm_id && (epoch == 0 || r.epoch == epoch))
        .count()
        .try_into()
        .unwrap_or(u32::MAX)
}

/// How long ago (by its modification time) the end note in `dir` was
/// written, if there is one (a regular file, not followed through a link).
pub fn run_ended_ago(dir: &Path) -> Option<std::time::Duration> {
    let m = std::fs::symlink_metadata(dir.join(RUN_ENDED_FILE)).ok().filter(|m| m.is_file())?;
    m.modified().ok()?.elapsed().ok()
}

/// Whether `lease-exec` noted that it started the run's script in `dir`
/// (a note in any format: an older `lease-exec` wrote `started job <id>`).
pub fn run_started(dir: &Path) -> bool {
    note(dir, RUN_STARTED_FILE).is_some()
}

/// How the script of the run in `dir` ended by itself, as `lease-exec`
/// noted it. Only a note of the latest run
/// `lease-exec` started there counts (the same Slurm job, restart count
/// and epoch as the start note), of Slurm job `slurm_id` and, when known
/// (> 0), of fleet epoch `epoch`: an end noted by an earlier run (before
/// Slurm requeued the job, or of an earlier placement) says nothing of
/// this one. So does a note that does not parse (an older `lease-exec`'s).
pub fn run_ended(dir: &Path, slurm_id: u64, epoch: u64) -> Option<NotedEnd> {
    let started = parse_started(&note(dir, RUN_STARTED_FILE)?)?;
    let (run, end) = parse_ended(&note(dir, RUN_ENDED_FILE)?)?;
    (run == started && run.slurm_id == slurm_id && (epoch == 0 || run.epoch == epoch)).then_some(end)
}

/// A copy `fleet-ckpt copy --json` made.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
pub struct Copied {
    pub from: String,
    pub url: String,
    pub seq: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub manifest_sha256: String,
}

/// Reads the one JSON line `fleet-ckpt copy --json` prints.
pub fn parse_copied(stdout: &[u8]) -> Result<Copied> {
    let text = std::str::from_utf8(stdout).context("fleet-ckpt copy printed something other than UTF-8")?;
    let line =
        text.lines().rev().find(|l| l.trim_start().starts_with('{')).context("fleet-ckpt copy printed no result")?;
    let c: Copied = serde_json::from_str(line).with_context(|| format!("fleet-ckpt copy printed {line:?}"))?;
    if c.manifest_sha256.len() != 64 || !c.seconds.is_finite() || c.seconds < 0.0 {
        bail!("fleet-ckpt copy printed an implausible result: {line:?}");
    }
    Ok(c)
}

/// Copies checkpoint `src` under `dst_prefix` with `helper` (`fleet-ckpt`),
/// through the stores file `stores` when the site has one. The helper
/// runs as the agent, with a minimal environment plus the agent's `AWS_*`.
pub async fn copy(helper: &Path, stores: Option<&Path>, src: &str, dst_prefix: &str) -> Result<Copied> {
    let mut c = tokio::process::Command::new(helper);
    c.env_clear().env("PATH", "/usr/local/bin:/usr/bin:/bin");
    for (k, v) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| k.starts_with("AWS_")) {
            c.env(k, v);
        }
    }
    if let Some(s) = stores {
        c.arg("--stores").arg(s);
    }
    c.args(["--json", "copy", "--", src, dst_prefix]).kill_on_drop(true);
    let out = tokio::time::timeout(COPY_TIMEOUT, c.output())
        .await
        .with_context(|| format!("copying {src}: no answer in {} s", COPY_TIMEOUT.as_secs()))?
        .with_context(|| format!("running {}", helper.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "fleet-ckpt copy {src} {dst_prefix}: {}: {}{}",
            out.status,
            err.trim().chars().take(500).collect::<String>(),
            read_only_hint(&err, dst_prefix)
        );
    }
    parse_copied(&out.stdout)
}

/// A checkpoint the agent copies into a `file://` store is the agent's
/// (it wrote it), under directories it may have created (the job's prefix,
/// and above it its user's and its origin's directories where they were
/// missing). Made before the copy ([`FileCopy::before`]: `None` for other
/// stores) and applied after it ([`FileCopy::admit`]):
/// * the directories it created above the job's prefix take the mode of
///   the store's own directory they were created in (a store whose users
///   make their own directories, `1777` say, stays one);
/// * the job's prefix, if the copy created it, else the copied checkpoint,
///   is its user's (`jobdir::grant_tree`: rwx, by ACL, for that user and
///   the agent, nothing for anyone else; the copied files readable), so
///   that the resumed job can write its next checkpoints beside it and no
///   other user can read it.
#[derive(Debug)]
pub struct FileCopy {
    prefix: PathBuf,
    /// The deepest directory of the prefix's path that existed before.
    existed: PathBuf,
}

impl FileCopy {
    pub fn before(dst_prefix: &str) -> Option<FileCopy> {
        let prefix = PathBuf::from(dst_prefix.strip_prefix("file://")?);
        let existed = prefix.ancestors().find(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))?;
        Some(FileCopy { existed: existed.to_path_buf(), prefix })
    }

    /// After the copy to `copied` (its URL), for the job's user `uid`.
    pub fn admit(&self, copied: &str, uid: u32) -> Result<()> {
        use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
        let store_mode = std::fs::symlink_metadata(&self.existed)
            .with_context(|| format!("reading {}", self.existed.display()))?
            .permissions()
            .mode()
            & 0o1777;
        // Strictly between the directory that was there and the prefix
        // (none when the prefix was there): never the store's own.
        let below: Vec<&Path> = if self.existed == self.prefix {
            Vec::new()
        } else {
            self.prefix.ancestors().skip(1).take_while(|p| *p != self.existed && p.starts_with(&self.existed)).collect()
        };
        for dir in below.iter().rev() {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
                .open(dir)
                .with_context(|| format!("opening {}", dir.display()))?;
            f.set_permissions(std::fs::Permissions::from_mode(store_mode))
                .with_context(|| format!("setting the mode of {}", dir.display()))?;
        }
        let top = if self.existed == self.prefix {
            PathBuf::from(copied.strip_prefix("file://").context("a copy into a file:// store named another")?)
        } else {
            self.prefix.clone()
        };
        crate::jobdir::grant_tree(&top, uid)?;
        Ok(())
    }
}

/// What to do when a copy into a `file://` store failed on a read-only
/// file system: the packaged unit runs the agent under
/// `ProtectSystem=strict`, which leaves only its own directories writable.
fn read_only_hint(stderr: &str, dst_prefix: &str) -> String {
    let Some(dir) = dst_prefix.strip_prefix("file://") else { return String::new() };
    if !stderr.contains("Read-only file system") {
        return String::new();
    }
    format!(
        " (the agent's unit runs it under ProtectSystem=strict: add `ReadWritePaths={dir}` in a drop-in, \
         `systemctl edit fleet-agent`, so that it may write that checkpoint store)"
    )
}

/// Why `CkptStores` at `path` exposes store keys to every user, if it does:
/// without `CkptUserStores` (`runs_get_it`) every run here gets the file
/// (`FLEET_CKPT_STORES`; on Kubernetes its contents, in the pod), so a key
/// in it — or in a `secret_access_key_file` it names that others may read —
/// lets any user's job read, overwrite or delete every job's checkpoints in
/// that store. `kube`: pods get the contents whatever the file's mode.
/// With `CkptUserStores` the file is the agent's alone, and only a key
/// every user can read (a world-readable file) is named. `None`: no keys
/// there, or the file cannot be read (the copy then fails and says so).
pub fn stores_exposure(path: &Path, kube: bool, runs_get_it: bool) -> Option<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let kube = kube && runs_get_it;
    let text = std::fs::read_to_string(path).ok()?;
    let doc: toml::Table = text.parse().ok()?;
    let world = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o004 != 0);
    let mut exposed = Vec::new();
    for store in doc.get("store").and_then(|s| s.as_array()).into_iter().flatten() {
        let url = store.get("url").and_then(|u| u.as_str()).unwrap_or("?");
        let inline = store.get("secret_access_key").is_some();
        let file = store.get("secret_access_key_file").and_then(|f| f.as_str()).map(Path::new);
        let shown = if inline {
            kube || world(path)
        } else {
            // A key file a pod cannot see does not travel; one every user
            // can read is theirs anyway.
            file.is_some_and(world)
        };
        if shown {
            exposed.push(url.to_string());
        }
    }
    if exposed.is_empty() {
        return None;
    }
    let how = match (kube, runs_get_it) {
        (true, _) => "every pod gets its contents",
        (false, true) => "every user can read it and every run gets it",
        (false, false) => "every user can read it",
    };
    Some(format!(
        "CkptStores={} holds the keys of {} and {how}{}: any user's job can read, overwrite \
         or delete every job's checkpoints there",
        path.display(),
        exposed.join(", "),
        if runs_get_it { " (FLEET_CKPT_STORES)" } else { "" }
    ))
}

/// The users' own stores files (`CkptUserStores` `template`, `%u` in its
/// file name) that other users can read, as `(path, why)`; each should be
/// its user's (with the agent's group where the agent reads it for a pod)
/// and no one else's. Files in a directory the template names per user
/// (`/home/%u/...`) are not listed: the agent cannot know every user.
pub fn user_stores_exposure(template: &str) -> Vec<(PathBuf, String)> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let t = Path::new(template);
    let (Some(dir), Some(name)) = (t.parent(), t.file_name().and_then(|n| n.to_str())) else { return Vec::new() };
    if dir.to_str().is_some_and(|d| d.contains("%u")) {
        return Vec::new();
    }
    let Some((head, tail)) = name.split_once("%u") else { return Vec::new() };
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let accounts = crate::identity::Accounts::read().ok();
    let mut out = Vec::new();
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(user) = file.to_str().and_then(|f| f.strip_prefix(head)).and_then(|f| f.strip_suffix(tail)) else {
            continue;
        };
        let Ok(m) = std::fs::symlink_metadata(e.path()) else { continue };
        let why = if !m.file_type().is_file() {
            "is not a regular file (the agent reads only a regular file its user owns)".to_string()
        } else if m.permissions().mode() & 0o004 != 0 {
            format!(
                "every user can read it (mode {:04o}): {user}'s keys are everyone's",
                m.permissions().mode() & 0o7777
            )
        } else if accounts.as_ref().and_then(|a| a.user(user)).is_some_and(|(uid, _)| uid != m.uid()) {
            format!("it belongs to uid {}, not to {user}: {user}'s runs get another's file", m.uid())
        } else {
            continue;
        };
        out.push((e.path(), why));
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_into_a_file_store_is_its_users_and_no_one_elses() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("store");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let prefix = root.join("fleet/beta/alice/J");
        let url = |p: &Path| format!("file://{}", p.display());
        assert!(FileCopy::before("s3://b/fleet/beta/alice/J").is_none());
        let fc = FileCopy::before(&url(&prefix)).unwrap();
        // What `fleet-ckpt copy` leaves: the agent's, under its umask.
        let ck = prefix.join("ckpt-000000000001");
        std::fs::create_dir_all(&ck).unwrap();
        std::fs::write(ck.join("w.bin"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", ck.join("planted")).unwrap();
        fc.admit(&url(&ck), 4242).unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
        // Above the job's prefix: as the store's own directory.
        for p in ["fleet", "fleet/beta", "fleet/beta/alice"] {
            assert_eq!(mode(&root.join(p)), 0o1777, "{p}");
        }
        // The prefix and the copy: the user's (rwx / r by ACL; the group
        // bits are the ACL's mask), nothing for others.
        let access = |p: &Path| crate::jobdir::named_acl(p, "system.posix_acl_access");
        for dir in [&prefix, &ck] {
            assert_eq!(mode(dir), 0o770, "{}", dir.display());
            assert_eq!(access(dir), [(4242, 7)], "{}", dir.display());
            let default = crate::jobdir::named_acl(dir, "system.posix_acl_default");
            assert!(default.contains(&(4242, 7)), "{default:?}");
        }
        assert_eq!(mode(&ck.join("w.bin")), 0o640);
        assert_eq!(access(&ck.join("w.bin")), [(4242, 4)]);
        // A link is left alone, its target untouched.
        assert!(std::fs::symlink_metadata(ck.join("planted")).unwrap().file_type().is_symlink());
        assert!(access(Path::new("/etc/passwd")).is_empty());

        // What the kernel makes of it (as root, as CI runs: other uids):
        // the user writes a new checkpoint beside the copy and reads it;
        // another user can do neither.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            let as_uid = |uid: u32, cmd: &str| {
                let id = uid.to_string();
                let args = ["--reuid", &id, "--regid", &id, "--clear-groups", "sh", "-c", cmd];
                std::process::Command::new("setpriv").args(args).status().unwrap().success()
            };
            let (p, w) = (prefix.display(), ck.join("w.bin"));
            assert!(as_uid(4242, &format!("mkdir {p}/ckpt-000000000003 && cat {} >/dev/null", w.display())));
            assert!(!as_uid(4343, &format!("cat {} 2>/dev/null", w.display())), "another user read it");
            assert!(!as_uid(4343, &format!("ls {p} >/dev/null 2>&1")), "another user listed it");
        }

        // Into a prefix that was there: only the copied checkpoint changes.
        let ck2 = prefix.join("ckpt-000000000002");
        let fc = FileCopy::before(&url(&prefix)).unwrap();
        let store = std::fs::symlink_metadata(&root).unwrap().permissions().mode();
        let outer = mode(d.path());
        std::fs::create_dir(&ck2).unwrap();
        std::fs::set_permissions(&ck2, std::fs::Permissions::from_mode(0o755)).unwrap();
        fc.admit(&url(&ck2), 4343).unwrap();
        assert_eq!(access(&ck2), [(4343, 7)]);
        assert_eq!(access(&prefix), [(4242, 7)]);
        // and nothing above it: not its directories, not the store's.
        assert_eq!(mode(&prefix), 0o770);
        assert_eq!(std::fs::symlink_metadata(&root).unwrap().permissions().mode(), store);
        assert_eq!(mode(d.path()), outer);
    }

    #[test]
    fn store_keys_every_user_can_read_are_named() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, text: &str, mode: u32| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        let inline = "[[store]]\nurl = \"s3://ckpt-east\"\naccess_key_id = \"a\"\nsecret_access_key = \"s\"\n";
        let open = file("open.toml", inline, 0o644);
        let why = stores_exposure(&open, false, true).expect("a key in a world-readable file");
        assert!(why.contains("s3://ckpt-east") && why.contains("every job's checkpoints"), "{why}");
        let private = file("private.toml", inline, 0o640);
        assert_eq!(stores_exposure(&private, false, true), None, "only the agent's group reads it");
        assert!(stores_exposure(&private, true, true).is_some(), "a pod gets the contents whatever the mode");
        let secret = file("secret", "s\n", 0o644);
        let by_file = file(
            "by-file.toml",
            &format!("[[store]]\nurl = \"s3://ckpt-west\"\nsecret_access_key_file = \"{}\"\n", secret.display()),
            0o600,
        );
        assert!(stores_exposure(&by_file, false, true).is_some_and(|w| w.contains("s3://ckpt-west")));
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(stores_exposure(&by_file, false, true), None);
        let endpoints_only = file("endpoints.toml", "[[store]]\nurl = \"s3://a\"\nendpoint = \"https://x\"\n", 0o644);
        assert_eq!(stores_exposure(&endpoints_only, false, true), None, "no key: the jobs bring their own");
        // With CkptUserStores the file is the agent's: runs and pods never get it.
        assert_eq!(stores_exposure(&private, true, false), None, "pods get their users' files instead");
        let why = stores_exposure(&open, true, false).expect("a world-readable key is still everyone's");
        assert!(why.contains("every user can read it") && !why.contains("FLEET_CKPT_STORES"), "{why}");
    }

    #[test]
    fn each_run_gets_its_own_users_stores_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ckpt");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("alice.toml"), "[[store]]\nurl = \"s3://a\"\n").unwrap();
        let k = JobCkpt {
            stores: Some("/etc/fleet/agent-stores.toml".into()),
            user_stores: Some(format!("{}/%u.toml", dir.display())),
            ..JobCkpt::default()
        };
        assert_eq!(k.stores_of("alice"), Some(dir.join("alice.toml")));
        for bad in ["", ".", "..", "a/b", "a%ub"] {
            assert_eq!(k.stores_of(bad), None, "{bad:?}");
        }
        let run = |user: &str| {
            let d = tmp.path().join(format!("job-{user}"));
            std::fs::create_dir(&d).unwrap();
            k.prepare("beta-7", &d, user).unwrap()
        };
        // Alice's run gets her file, never the agent's.
        assert_eq!(run("alice"), vec![("FLEET_CKPT_STORES", dir.join("alice.toml").display().to_string())]);
        // Bob has none: his run is told of no stores file (it brings its own AWS_*).
        assert_eq!(run("bob"), vec![]);
        // Without CkptUserStores every run gets CkptStores.
        let shared = JobCkpt { user_stores: None, ..k.clone() };
        assert_eq!(shared.stores_of("bob"), Some("/etc/fleet/agent-stores.toml".into()));
    }

    #[test]
    fn users_stores_files_others_can_read_or_that_are_anothers_are_named() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let me = crate::identity::name_of_uid(crate::own_uid()).expect("the test's own user has a name");
        let put = |name: &str, mode: u32| {
            let p = tmp.path().join(name);
            std::fs::write(&p, "[[store]]\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        put(&format!("stores-{me}.toml"), 0o640);
        let open = put("stores-carol.toml", 0o644);
        put("unrelated.toml", 0o644);
        let mut want = vec![open];
        let other = if me == "nobody" { "root" } else { "nobody" };
        if crate::identity::Accounts::read().unwrap().user(other).is_some() {
            want.push(put(&format!("stores-{other}.toml"), 0o600));
        }
        want.sort();
        let got = user_stores_exposure(&format!("{}/stores-%u.toml", tmp.path().display()));
        assert_eq!(got.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(), want, "{got:?}");
        assert!(got[0].1.contains("every user can read it") || got[0].1.contains("belongs to uid"), "{got:?}");
        assert!(got.iter().any(|(_, w)| w.contains("carol's keys are everyone's")), "{got:?}");
        // A template with %u in its directory lists nothing.
        assert_eq!(user_stores_exposure("/home/%u/.fleet/stores.toml"), vec![]);
    }

    #[test]
    fn a_copy_refused_by_a_read_only_file_system_names_the_unit_setting() {
        let e = "Error: writing /ckpt/j1/2/manifest.json: Read-only file system (os error 30)";
        let hint = read_only_hint(e, "file:///ckpt/j1");
        assert!(hint.contains("ReadWritePaths=/ckpt/j1") && hint.contains("ProtectSystem=strict"), "{hint}");
        assert_eq!(read_only_hint(e, "s3://bucket/j1"), "");
        assert_eq!(read_only_hint("Error: permission denied", "file:///ckpt"), "");
    }

    #[test]
    fn the_end_lease_exec_noted_is_read_for_its_own_run_only() {
        let run = |restart, epoch| NotedRun { slurm_id: 42, restart, epoch, at_ms: 0 };
        let exit = |c| NotedEnd { exit_code: Some(c), ..Default::default() };
        let signal = |s| NotedEnd { signal: Some(s), ..Default::default() };
        for (line, want) in [
            ("exit 0 job 42 restart 0 epoch 1", Some((run(0, 1), exit(0)))),
            ("exit 3 job 42 restart 2 epoch 7", Some((run(2, 7), exit(3)))),
            ("signal 9 job 42 restart 0 epoch 1", Some((run(0, 1), signal(9)))),
            ("  exit   7  job 42 restart 0  epoch 1 ", Some((run(0, 1), exit(7)))),
            (
                "exit 1 job 42 restart 0 epoch 1 at 1796222245371",
                Some((NotedRun { at_ms: 1796222245371, ..run(0, 1) }, exit(1))),
            ),
            // Slurm's kill of the step came first.
            (
                "exit 5 after 15 job 42 restart 0 epoch 1 at 7",
                Some((NotedRun { at_ms: 7, ..run(0, 1) }, NotedEnd { after_signal: Some(15), ..exit(5) })),
            ),
            (
                "signal 9 after 15 job 42 restart 0 epoch 1",
                Some((run(0, 1), NotedEnd { after_signal: Some(15), ..signal(9) })),
            ),
            ("exit 5 after 0 job 42 restart 0 epoch 1", None),
            ("exit 5 after 65 job 42 restart 0 epoch 1", None),
            ("exit 5 after x job 42 restart 0 epoch 1", None),
            ("exit 5 after job 42 restart 0 epoch 1", None),
            ("exit 5 job 42 restart 0 epoch 1 after 15", None),
            ("exit 1 job 42 restart 0 epoch 1 at", None),
            ("exit 1 job 42 restart 0 epoch 1 at x", None),
            // An older lease-exec's note: which run it is of is unknown.
            ("exit 0 job 42", None),
            ("exit 256 job 42 restart 0 epoch 1", None),
            ("exit -1 job 42 restart 0 epoch 1", None),
            ("signal 0 job 42 restart 0 epoch 1", None),
            ("signal 65 job 42 restart 0 epoch 1", None),
            ("exit 0 job 42 restart -1 epoch 1", None),
            ("exit 0 job 42 restart 0 epoch x", None),
            ("exit 0 job 42 epoch 1 restart 0", None),
            ("exit 0 job 42 restart 0 epoch 1 extra", None),
            ("exit x job 42 restart 0 epoch 1", None),
            ("EXIT 0 job 42 restart 0 epoch 1", None),
            ("exit 0 job 99999999999999999999999 restart 0 epoch 1", None),
            ("exit 0", None),
            ("", None),
        ] {
            assert_eq!(parse_ended(line), want, "{line:?}");
        }
        assert_eq!(parse_started("started job 42 restart 1 epoch 3"), Some(run(1, 3)));
        assert_eq!(parse_started("started job 42"), None);
        assert_eq!(parse_started("exit 0 job 42 restart 1 epoch 3"), None);

        // (start note, end note, Slurm id, epoch) -> the end read.
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!((run_ended(tmp.path(), 42, 1), run_started(tmp.path())), (None, false));
        let exit3 = Some(NotedEnd { exit_code: Some(3), ..Default::default() });
        for (started, ended, sid, epoch, want) in [
            ("started job 42 restart 0 epoch 1", "exit 3 job 42 restart 0 epoch 1", 42, 1, exit3),
            ("started job 42 restart 0 epoch 1", "exit 3 job 42 restart 0 epoch 1", 42, 0, exit3),
            (
                "started job 42 restart 0 epoch 1",
                "signal 15 job 42 restart 0 epoch 1",
                42,
                1,
                Some(NotedEnd { signal: Some(15), ..Default::default() }),
            ),
            (
                "started job 42 restart 0 epoch 1",
                "exit 3 after 15 job 42 restart 0 epoch 1",
                42,
                1,
                Some(NotedEnd { exit_code: Some(3), signal: None, after_signal: Some(15) }),
            ),
            // Another Slurm job (an id reused after a crash), another placement.
            ("started job 42 restart 0 epoch 1", "exit 3 job 42 restart 0 epoch 1", 43, 1, None),
            ("started job 42 restart 0 epoch 1", "exit 3 job 42 restart 0 epoch 1", 42, 2, None),
            // The end of the run before Slurm requeued the job, which
            // started again since: not this run's end.
            ("started job 42 restart 1 epoch 1", "exit 3 job 42 restart 0 epoch 1", 42, 1, None),
            // A stale note of an earlier placement in the same directory.
            ("started job 42 restart 0 epoch 2", "exit 3 job 42 restart 0 epoch 1", 42, 2, None),
            // The run that ended is the latest that started (Slurm lost its
            // end and requeued it; the next never started): its end.
            ("started job 42 restart 1 epoch 1", "exit 3 job 42 restart 1 epoch 1", 42, 1, exit3),
            // Older notes: which run they are of is unknown.
            ("started job 42", "exit 3 job 42", 42, 1, None),
            // Started again since under the same restart count (a slurmctld
            // recovered from older state launched it anew): not this start's end.
            ("started job 42 restart 0 epoch 1 at 2000", "exit 3 job 42 restart 0 epoch 1 at 1000", 42, 1, None),
            ("started job 42 restart 0 epoch 1 at 2000", "exit 3 job 42 restart 0 epoch 1 at 2000", 42, 1, exit3),
        ] {
            std::fs::write(tmp.path().join(RUN_STARTED_FILE), format!("{started}\n")).unwrap();
            std::fs::write(tmp.path().join(RUN_ENDED_FILE), format!("{ended}\n")).unwrap();
            assert_eq!(run_ended(tmp.path(), sid, epoch), want, "{started:?} {ended:?} {sid} {epoch}");
            assert!(run_started(tmp.path()));
        }
        // Links are not followed (the job owns its directory's entries).
        let d2 = tmp.path().join("other");
        std::fs::create_dir(&d2).unwrap();
        std::fs::write(tmp.path().join(RUN_STARTED_FILE), "started job 42 restart 0 epoch 1\n").unwrap();
        std::fs::write(tmp.path().join(RUN_ENDED_FILE), "exit 3 job 42 restart 0 epoch 1\n").unwrap();
        std::os::unix::fs::symlink(tmp.path().join(RUN_ENDED_FILE), d2.join(RUN_ENDED_FILE)).unwrap();
        std::os::unix::fs::symlink(tmp.path().join(RUN_STARTED_FILE), d2.join(RUN_STARTED_FILE)).unwrap();
        assert_eq!((run_ended(&d2, 42, 1), run_started(&d2)), (None, false));
    }

    #[test]
    fn the_starts_of_a_run_are_counted_for_its_slurm_job_and_epoch() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(run_starts(tmp.path(), 42, 1), 0);
        std::fs::write(
            tmp.path().join(RUN_STARTS_FILE),
            "job 42 restart 0 epoch 1\njob 42 restart 0 epoch 1\njob 42 restart 1 epoch 1\n\
             job 43 restart 0 epoch 1\njob 42 restart 0 epoch 2\ngarbage\njob 42 restart x epoch 1\n",
        )
        .unwrap();
        assert_eq!(run_starts(tmp.path(), 42, 1), 3);
        assert_eq!(run_starts(tmp.path(), 42, 2), 1);
        assert_eq!(run_starts(tmp.path(), 42, 0), 4);
        assert_eq!(run_starts(tmp.path(), 44, 1), 0);
        let d2 = tmp.path().join("other");
        std::fs::create_dir(&d2).unwrap();
        std::os::unix::fs::symlink(tmp.path().join(RUN_STARTS_FILE), d2.join(RUN_STARTS_FILE)).unwrap();
        assert_eq!(run_starts(&d2, 42, 1), 0, "a link is not followed");
    }

    #[test]
    fn copy_results_are_read_strictly() {
        let good = br#"{"from":"s3://w/j/ckpt-000000000002","url":"s3://e/j/ckpt-000000000002","seq":2,"bytes":10,"seconds":0.5,"manifest_sha256":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}"#;
        let c = parse_copied(good).unwrap();
        assert_eq!((c.seq, c.bytes, c.url.as_str()), (2, 10, "s3://e/j/ckpt-000000000002"));
        for bad in [&b""[..], b"copied x -> y", b"{\"from\":1}", &good[..good.len() - 1], b"\xff\xfe"] {
            assert!(parse_copied(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let short = String::from_utf8_lossy(good).replace(&"a".repeat(64), "ab");
        assert!(parse_copied(short.as_bytes()).is_err());
    }

    #[test]
    fn the_token_file_is_private_and_only_its_path_is_exported() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("job");
        std::fs::create_dir(&dir).unwrap();
        let k = JobCkpt {
            metasched_url: "https://ms:8443".into(),
            ca_file: Some("/etc/fleet/ca.pem".into()),
            cluster_token: "alpha-secret".into(),
            stores: Some("/etc/fleet/ckpt,stores.toml".into()),
            ..JobCkpt::default()
        };
        let env = k.prepare("beta-7", &dir, "alice").unwrap();
        let token = fleet_api::auth::ckpt_token("alpha-secret", "beta-7");
        let path = dir.join(TOKEN_FILE);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), token);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o007, 0, "nothing for others");
        let want = vec![
            ("FLEET_METASCHED_URL", "https://ms:8443".to_string()),
            ("FLEET_CKPT_TOKEN_FILE", path.display().to_string()),
            ("FLEET_METASCHED_CA", "/etc/fleet/ca.pem".to_string()),
        ];
        assert_eq!(env, want, "a stores path with a comma cannot travel in --export");
        assert!(env.iter().all(|(_, v)| !v.contains(&token)), "the token itself is never exported");
        // A second prepare never overwrites or follows an existing entry.
        assert!(k.prepare("beta-7", &dir, "alice").is_err());
        // Without a cluster token: nothing to report with.
        let none = JobCkpt { cluster_token: String::new(), ..k.clone() };
        let d2 = tmp.path().join("j2");
        std::fs::create_dir(&d2).unwrap();
        assert_eq!(none.prepare("x", &d2, "alice").unwrap(), vec![]);
        assert!(!d2.join(TOKEN_FILE).exists());
    }

    #[test]
    fn a_run_under_its_lease_keeps_its_script_and_every_sbatch_line() {
        let tmp = tempfile::tempdir().unwrap();
        let k = JobCkpt {
            metasched_url: "https://ms:8443".into(),
            cluster_token: "alpha-secret".into(),
            job_lease: Some(Duration::from_secs(8)),
            helper: tmp.path().join("fleet-ckpt"),
            ..JobCkpt::default()
        };
        std::fs::write(&k.helper, b"").unwrap();
        // What the heartbeat's start_gate says: every run here starts gated.
        assert!(k.gates_runs());
        std::fs::write(tmp.path().join("a,b"), b"").unwrap();
        for (why, off) in [
            ("lease off", JobCkpt { job_lease: None, ..k.clone() }),
            ("no token", JobCkpt { cluster_token: String::new(), ..k.clone() }),
            ("relative helper", JobCkpt { helper: "fleet-ckpt".into(), ..k.clone() }),
            ("no helper", JobCkpt { helper: tmp.path().join("missing"), ..k.clone() }),
            ("helper with a comma", JobCkpt { helper: tmp.path().join("a,b"), ..k.clone() }),
        ] {
            assert!(!off.gates_runs(), "{why}");
        }
        let script = b"#!/bin/bash -l\n#SBATCH --signal=B:USR1@60\n#FLEET ckpt-signal=USR1\necho \xff $@\n";
        let dir = tmp.path().join("job");
        std::fs::create_dir(&dir).unwrap();
        let mut env = k.prepare("beta-7", &dir, "alice").unwrap();
        let wrapped = k.wrap(&dir, script, 3, &mut env).unwrap().unwrap();
        assert_eq!(wrapped, [format!("#!{} lease-exec", k.helper.display()).as_bytes(), &script[14..]].concat());
        assert!(wrapped.ends_with(b"\n#SBATCH --signal=B:USR1@60\n#FLEET ckpt-signal=USR1\necho \xff $@\n"));
        assert_eq!(std::fs::read(dir.join(SCRIPT_FILE)).unwrap(), script, "the job's own script, byte for byte");
        let tail: Vec<_> = env.iter().rev().take(3).cloned().collect();
        assert_eq!(
            tail,
            vec![
                ("FLEET_JOB_LEASE_MS", "8000".to_string()),
                ("FLEET_EPOCH", "3".to_string()),
                ("FLEET_JOB_SCRIPT", dir.join(SCRIPT_FILE).display().to_string()),
            ]
        );
        // Without: the site's lease off, no token to renew with, no #! line,
        // a helper that cannot be an interpreter line.
        let fresh = |name: &str| {
            let d = tmp.path().join(name);
            std::fs::create_dir(&d).unwrap();
            d
        };
        let off = JobCkpt { job_lease: None, ..k.clone() };
        let d = fresh("off");
        let mut e = off.prepare("beta-7", &d, "alice").unwrap();
        assert_eq!(off.wrap(&d, script, 1, &mut e).unwrap(), None);
        let no_token = JobCkpt { cluster_token: String::new(), ..k.clone() };
        let d = fresh("nt");
        let mut e = no_token.prepare("beta-7", &d, "alice").unwrap();
        assert_eq!(no_token.wrap(&d, script, 1, &mut e).unwrap(), None);
        let d = fresh("nb");
        let mut e = k.prepare("beta-7", &d, "alice").unwrap();
        assert_eq!(k.wrap(&d, b"echo no interpreter\n", 1, &mut e).unwrap(), None);
        assert_eq!(k.wrap(&d, b"#!/bin/\xff\necho\n", 1, &mut e).unwrap(), None);
        assert_eq!(k.wrap(&d, b"#! \necho\n", 1, &mut e).unwrap(), None);
        for helper in ["fleet-ckpt", "/opt/my tools/fleet-ckpt", "/nonexistent/fleet-ckpt"] {
            let bad = JobCkpt { helper: helper.into(), ..k.clone() };
            let d = fresh(&format!("h{}", helper.replace(['/', ' '], "_")));
            let mut e = bad.prepare("beta-7", &d, "alice").unwrap();
            assert_eq!(bad.wrap(&d, script, 1, &mut e).unwrap(), None, "{helper}");
            assert!(!d.join(SCRIPT_FILE).exists());
        }
    }

    #[test]
    fn a_run_stopped_by_its_lease_says_why() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(lease_stopped(tmp.path()), None);
        std::fs::write(tmp.path().join(LEASE_STOPPED_FILE), "its job lease ran out (8000 ms)\x1b[2J\nmore\n").unwrap();
        assert_eq!(lease_stopped(tmp.path()).as_deref(), Some("its job lease ran out (8000 ms)[2J"));
        let d2 = tmp.path().join("d2");
        std::fs::create_dir(&d2).unwrap();
        std::os::unix::fs::symlink(tmp.path().join(LEASE_STOPPED_FILE), d2.join(LEASE_STOPPED_FILE)).unwrap();
        assert_eq!(lease_stopped(&d2), None, "a link is not followed");
        // Nor a hard link to a file the job cannot read (the agent's token).
        let d3 = tmp.path().join("d3");
        std::fs::create_dir(&d3).unwrap();
        std::fs::write(tmp.path().join("agent.token"), "secret-token\n").unwrap();
        std::fs::hard_link(tmp.path().join("agent.token"), d3.join(LEASE_STOPPED_FILE)).unwrap();
        assert_eq!(lease_stopped(&d3), None, "a hard link is not read");
        std::fs::hard_link(tmp.path().join("agent.token"), d3.join(RUN_STARTS_FILE)).unwrap();
        std::fs::write(tmp.path().join("agent.token"), "job 42 restart 0 epoch 1\n").unwrap();
        assert_eq!(run_starts(&d3, 42, 1), 0, "a hard link is not read");
    }
}
