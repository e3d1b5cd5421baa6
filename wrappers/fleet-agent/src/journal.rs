//! The agent's local journal (SQLite, WAL) in `AgentSpoolDir/journal.db`.
//!
//! * `forwards`: jobs this cluster accepted from its plugin for running
//!   elsewhere. Written *before* the plugin gets its FORWARD answer, so an
//!   accepted forward survives an agent restart and is delivered to the
//!   meta-scheduler later.
//! * `runs`: jobs this cluster runs for others: the remote (local Slurm)
//!   job id it created, output offsets relayed so far, the last state
//!   reported. Invariant: the agent only ever signals or cancels Slurm
//!   jobs recorded here (it created them).
//!
//! One connection behind a `parking_lot::Mutex`: every statement is
//! short (microseconds), so a sync lock held across no `.await` is
//! cheaper than a dedicated thread.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fleet_api::JobRequest;
use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};

pub struct Journal {
    db: Mutex<Connection>,
    /// While this lives, the checkpointer thread runs ([`checkpointer`]).
    _alive: std::sync::Arc<()>,
}

/// How often the checkpointer copies the write-ahead log into the
/// database file.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);

/// Where a write's time went: waiting for the connection, then the write.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteTiming {
    pub wait: Duration,
    pub write: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Forward {
    pub id: String,
    pub request: JobRequest,
    pub target: String,
    pub registered: bool,
}

/// A job this cluster runs for the fleet: what identifies it in Slurm
/// and how far its output and state were reported.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Run {
    pub id: String,
    /// Local Slurm job id; `None` between "accepted" and a successful sbatch.
    pub slurm_id: Option<u64>,
    /// Bytes of each output file relayed (offset in the current file).
    pub stdout_off: u64,
    pub stderr_off: u64,
    /// Last state reported to the meta-scheduler.
    pub reported: Option<String>,
    pub done: bool,
    /// Bytes relayed from earlier incarnations of the file (a requeued job
    /// restarts its output): the meta-scheduler's offset is base + off.
    pub stdout_base: u64,
    pub stderr_base: u64,
    /// The local user the job runs as.
    pub user: Option<String>,
    pub uid: Option<u32>,
    /// Slurm's submit time of `slurm_id`, learnt on first sight: with the
    /// id and owner, the job's identity.
    pub submit_time: Option<i64>,
    /// When the agent ran sbatch (epoch s).
    pub submitted_at: f64,
    pub restarts: u32,
    /// When the agent journaled the run (epoch s), before any sbatch.
    pub accepted_at: f64,
    /// The placement epoch of the assignment (0: unknown, from an older
    /// meta-scheduler or journal); sent with every report of the run.
    pub epoch: u64,
    /// The agent stopped the job itself when its lease ran out: why. The
    /// run is reported as died (the meta-scheduler moves the job), never
    /// as the cancellation Slurm shows.
    pub fenced: Option<String>,
    /// Times Slurm ran this run again, as the agent saw it (`track::
    /// observe_rerun`, `track::output_restarted`): sent with every report,
    /// kept across agent restarts so that no re-run is counted twice.
    pub reruns: u32,
    /// When the current incarnation of the run started (Slurm's start
    /// time; 0 when started at an unknown time); `None` while it has not
    /// started (or waits again after a re-run).
    pub run_start: Option<i64>,
    /// Output streams (`track::OUT_STDOUT`, `OUT_STDERR`) whose restart,
    /// still to come, belongs to a re-run already counted.
    pub rerun_out: u8,
    /// How the last re-run was seen.
    pub rerun_why: Option<String>,
    /// The last signal this agent delivered to the run on its user's
    /// request (`scancel --signal` at the origin): a script that ended by
    /// a signal after one was ended by its user, not by Slurm. Written
    /// only by [`Journal::mark_signalled`] (never by `update_run`, so a
    /// watch pass holding an older copy of the row does not erase it).
    pub user_signal: Option<String>,
}

impl Journal {
    pub fn open(path: &Path) -> Result<Journal> {
        {
            // Created private before SQLite opens it (SQLite creates a file
            // with the umask's mode, 0644 at most sites, and another user
            // could open it before it is made private below and keep it).
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)
                .with_context(|| format!("creating journal {}", path.display()))?;
        }
        let db = Connection::open(path).with_context(|| format!("opening journal {}", path.display()))?;
        // Job scripts and requests of every user: the agent's alone (the
        // WAL and shared-memory files SQLite adds take the same mode).
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("making {} private", path.display()))?;
        }
        // A commit is in the write-ahead log before its call returns (an
        // agent crash loses nothing it answered). Copying the log into the
        // database (a checkpoint, with its fsyncs) is left to a thread of
        // its own: SQLite would otherwise run it inside whichever commit
        // crosses 1000 pages, at times the plugin's FORWARD answer, which
        // slurmctld waits for.
        db.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             PRAGMA wal_autocheckpoint=0;
             CREATE TABLE IF NOT EXISTS forwards(
                 id TEXT PRIMARY KEY, request TEXT NOT NULL, target TEXT NOT NULL,
                 registered INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL);
             CREATE TABLE IF NOT EXISTS runs(
                 id TEXT PRIMARY KEY, slurm_id INTEGER, stdout_off INTEGER NOT NULL DEFAULT 0,
                 stderr_off INTEGER NOT NULL DEFAULT 0, reported TEXT, done INTEGER NOT NULL DEFAULT 0,
                 request TEXT NOT NULL);",
        )?;
        // Columns added since the first journal format.
        for (table, col, ty) in [
            ("runs", "stdout_base", "INTEGER NOT NULL DEFAULT 0"),
            ("runs", "stderr_base", "INTEGER NOT NULL DEFAULT 0"),
            ("runs", "user", "TEXT"),
            ("runs", "uid", "INTEGER"),
            ("runs", "submit_time", "INTEGER"),
            ("runs", "submitted_at", "REAL NOT NULL DEFAULT 0"),
            ("runs", "restarts", "INTEGER NOT NULL DEFAULT 0"),
            ("runs", "accepted_at", "REAL NOT NULL DEFAULT 0"),
            ("forwards", "standin_id", "INTEGER"),
            ("runs", "attempt", "INTEGER NOT NULL DEFAULT 0"),
            ("runs", "epoch", "INTEGER NOT NULL DEFAULT 0"),
            ("runs", "fenced", "TEXT"),
            ("runs", "reruns", "INTEGER NOT NULL DEFAULT 0"),
            ("runs", "run_start", "INTEGER"),
            ("runs", "rerun_out", "INTEGER NOT NULL DEFAULT 0"),
            ("runs", "rerun_why", "TEXT"),
            ("runs", "user_signal", "TEXT"),
            ("forwards", "early", "INTEGER NOT NULL DEFAULT 0"),
        ] {
            let has: bool = db
                .prepare(&format!("SELECT 1 FROM pragma_table_info('{table}') WHERE name = ?1"))?
                .exists(params![col])?;
            if !has {
                db.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {col} {ty}"))?;
            }
        }
        // The loops look for the few rows still to act on among every row
        // ever written (each holding a job's request): without these, a
        // scan reads the whole table under the connection's lock, the lock
        // a plugin request waits for, and grows with the journal.
        db.execute_batch(
            "CREATE INDEX IF NOT EXISTS forwards_unregistered ON forwards(created) WHERE registered = 0;
             CREATE INDEX IF NOT EXISTS runs_active ON runs(id) WHERE done = 0;",
        )?;
        let alive = std::sync::Arc::new(());
        checkpointer(path, std::sync::Arc::downgrade(&alive))?;
        Ok(Journal { db: Mutex::new(db), _alive: alive })
    }

    /// Journal a forward the plugin is about to be told of; says how long
    /// it waited for the connection and how long the write took.
    pub fn add_forward(&self, id: &str, req: &JobRequest, target: &str) -> Result<WriteTiming> {
        let json = serde_json::to_string(req)?;
        let t0 = Instant::now();
        let db = self.db.lock();
        let wait = t0.elapsed();
        db.execute(
            "INSERT INTO forwards(id, request, target, registered, created) VALUES(?1, ?2, ?3, 0, ?4)",
            params![id, json, target, crate::now()],
        )?;
        Ok(WriteTiming { wait, write: t0.elapsed() - wait })
    }

    pub fn unregistered_forwards(&self) -> Result<Vec<Forward>> {
        let t0 = Instant::now();
        // The rows are read under the lock (a plugin request may wait for
        // it), the requests parsed after it is released.
        let rows = {
            let db = self.db.lock();
            let mut st =
                db.prepare("SELECT id, request, target FROM forwards WHERE registered = 0 ORDER BY created")?;
            let rows = st
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows
        };
        let held = t0.elapsed();
        let mut out = Vec::with_capacity(rows.len());
        for (id, req, target) in rows {
            let request = serde_json::from_str(&req).with_context(|| format!("journal entry {id}"))?;
            out.push(Forward { id, request, target, registered: false });
        }
        tracing::debug!(held_us = held.as_micros() as u64, n = out.len(), "journal: unregistered forwards");
        Ok(out)
    }

    /// Drops forward `id` while it is not registered with the
    /// meta-scheduler yet (the plugin never received it); true when it was
    /// dropped. One the forwarder already sent goes on as an orphan, which
    /// the reconcile pass cancels (no stand-in exists for it).
    pub fn withdraw_forward(&self, id: &str) -> Result<bool> {
        Ok(self.db.lock().execute("DELETE FROM forwards WHERE id = ?1 AND registered = 0", params![id])? == 1)
    }

    pub fn mark_registered(&self, id: &str) -> Result<()> {
        self.db.lock().execute("UPDATE forwards SET registered = 1 WHERE id = ?1", params![id])?;
        Ok(())
    }

    /// Record that we accepted `id` to run here. Returns false when it was
    /// already known (an assignment seen twice).
    pub fn add_run(&self, id: &str, req: &JobRequest) -> Result<bool> {
        let json = serde_json::to_string(req)?;
        let n = self.db.lock().execute(
            "INSERT OR IGNORE INTO runs(id, request, accepted_at) VALUES(?1, ?2, ?3)",
            params![id, json, crate::now()],
        )?;
        Ok(n == 1)
    }

    /// Records the Slurm job a run became, and as whom it runs.
    pub fn set_submitted(&self, id: &str, slurm_id: u64, user: &str, uid: u32, at: f64) -> Result<()> {
        self.db.lock().execute(
            "UPDATE runs SET slurm_id = ?2, user = ?3, uid = ?4, submitted_at = ?5 WHERE id = ?1",
            params![id, slurm_id as i64, user, uid, at],
        )?;
        Ok(())
    }

    /// The placement epoch the run belongs to.
    pub fn set_epoch(&self, id: &str, epoch: u64) -> Result<()> {
        self.db.lock().execute("UPDATE runs SET epoch = ?2 WHERE id = ?1", params![id, epoch as i64])?;
        Ok(())
    }

    pub fn update_run(&self, r: &Run) -> Result<()> {
        self.db.lock().execute(
            "UPDATE runs SET stdout_off = ?2, stderr_off = ?3, reported = ?4, done = ?5, stdout_base = ?6,
                 stderr_base = ?7, submit_time = ?8, restarts = ?9, fenced = ?10, reruns = ?11, run_start = ?12,
                 rerun_out = ?13, rerun_why = ?14 WHERE id = ?1",
            params![
                r.id,
                r.stdout_off as i64,
                r.stderr_off as i64,
                r.reported,
                r.done,
                r.stdout_base as i64,
                r.stderr_base as i64,
                r.submit_time,
                r.restarts,
                r.fenced,
                r.reruns,
                r.run_start,
                r.rerun_out,
                r.rerun_why
            ],
        )?;
        Ok(())
    }

    /// The Slurm id of the stand-in of forward `id`, once the agent has
    /// confirmed it (the reconciler matches stand-ins by it).
    pub fn set_stand_in(&self, id: &str, slurm_id: u64) -> Result<()> {
        self.db.lock().execute("UPDATE forwards SET standin_id = ?2 WHERE id = ?1", params![id, slurm_id as i64])?;
        Ok(())
    }

    /// Forward `id` of a deferred stand-in, journaled with its stand-in's
    /// Slurm id at once. `pending`: picked up while Slurm still holds the
    /// stand-in pending, so its job may be placed early (start-gated, as a
    /// job forwarded at sbatch time); otherwise Slurm already runs it.
    pub fn add_forward_of_stand_in(
        &self,
        id: &str,
        req: &JobRequest,
        target: &str,
        slurm_id: u64,
        pending: bool,
    ) -> Result<()> {
        let json = serde_json::to_string(req)?;
        self.db.lock().execute(
            "INSERT INTO forwards(id, request, target, registered, created, standin_id, early)
             VALUES(?1, ?2, ?3, 0, ?4, ?5, ?6)",
            params![id, json, target, crate::now(), slurm_id as i64, pending],
        )?;
        Ok(())
    }

    /// Whether forward `id`'s stand-in was still to be scheduled at the
    /// origin when it was journaled (`ForwardRequest.early_start`): a
    /// forward of the plugin's round trip (no stand-in id yet) or a
    /// deferred stand-in picked up while pending.
    pub fn early_start(&self, id: &str) -> Result<bool> {
        let v: Option<bool> = self
            .db
            .lock()
            .query_row("SELECT standin_id IS NULL OR early != 0 FROM forwards WHERE id = ?1", params![id], |r| r.get(0))
            .optional()?;
        Ok(v.unwrap_or(false))
    }

    /// `None`: no forward `id`; `Some(stand-in id)` otherwise.
    pub fn stand_in_of_forward(&self, id: &str) -> Result<Option<Option<u64>>> {
        let v: Option<Option<i64>> = self
            .db
            .lock()
            .query_row("SELECT standin_id FROM forwards WHERE id = ?1", params![id], |r| r.get(0))
            .optional()?;
        Ok(v.map(|s| s.map(|n| n as u64)))
    }

    pub fn stand_in_of(&self, id: &str) -> Result<Option<u64>> {
        let v: Option<Option<i64>> = self
            .db
            .lock()
            .query_row("SELECT standin_id FROM forwards WHERE id = ?1", params![id], |r| r.get(0))
            .optional()?;
        Ok(v.flatten().map(|n| n as u64))
    }

    pub fn run(&self, id: &str) -> Result<Option<(Run, JobRequest)>> {
        let db = self.db.lock();
        let row =
            db.query_row(&format!("SELECT {RUN_COLS} FROM runs WHERE id = ?1"), params![id], row_to_run).optional()?;
        row.map(|(r, req)| Ok((r, serde_json::from_str(&req)?))).transpose()
    }

    /// Which run of the job the row is: the stand-in's restart count it
    /// was submitted for (0: the first run).
    pub fn attempt(&self, id: &str) -> Result<Option<u32>> {
        let db = self.db.lock();
        Ok(db.query_row("SELECT attempt FROM runs WHERE id = ?1", params![id], |r| r.get(0)).optional()?)
    }

    /// The job runs again here (its stand-in was requeued at the origin):
    /// the row starts over for run `attempt`, whose output continues the
    /// fleet's streams at the given offsets.
    pub fn rerun(&self, id: &str, attempt: u32, req: &JobRequest, stdout_base: u64, stderr_base: u64) -> Result<()> {
        let json = serde_json::to_string(req)?;
        self.db.lock().execute(
            "UPDATE runs SET slurm_id = NULL, stdout_off = 0, stderr_off = 0, reported = NULL, done = 0,
                 request = ?3, stdout_base = ?4, stderr_base = ?5, submit_time = NULL, restarts = 0,
                 attempt = ?2, accepted_at = ?6, fenced = NULL, reruns = 0, run_start = NULL, rerun_out = 0,
                 rerun_why = NULL, user_signal = NULL WHERE id = ?1",
            params![id, attempt, json, stdout_base as i64, stderr_base as i64, crate::now()],
        )?;
        Ok(())
    }

    /// Notes that the agent delivered `signal` to run `id` for its user.
    pub fn mark_signalled(&self, id: &str, signal: &str) -> Result<()> {
        self.db.lock().execute("UPDATE runs SET user_signal = ?2 WHERE id = ?1", params![id, signal])?;
        Ok(())
    }

    /// The runs not done that have a native job: (native id, fleet job
    /// id, epoch). Read every heartbeat: no request is parsed.
    pub fn runs_by_native_id(&self) -> Result<Vec<(u64, String, u64)>> {
        let db = self.db.lock();
        let mut st = db.prepare("SELECT slurm_id, id, epoch FROM runs WHERE done = 0 AND slurm_id IS NOT NULL")?;
        let rows =
            st.query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?, r.get::<_, i64>(2)? as u64)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    pub fn active_runs(&self) -> Result<Vec<(Run, JobRequest)>> {
        let db = self.db.lock();
        let mut st = db.prepare(&format!("SELECT {RUN_COLS} FROM runs WHERE done = 0"))?;
        let rows = st.query_map([], row_to_run)?;
        let mut out = Vec::new();
        for row in rows {
            let (r, req) = row?;
            out.push((r, serde_json::from_str(&req)?));
        }
        Ok(out)
    }
}

const RUN_COLS: &str =
    "id, slurm_id, stdout_off, stderr_off, reported, done, request, stdout_base, stderr_base, user, uid, submit_time, submitted_at, restarts, accepted_at, epoch, fenced, reruns, run_start, rerun_out, rerun_why, user_signal";

fn row_to_run(r: &rusqlite::Row<'_>) -> rusqlite::Result<(Run, String)> {
    Ok((
        Run {
            id: r.get(0)?,
            slurm_id: r.get::<_, Option<i64>>(1)?.map(|v| v as u64),
            stdout_off: r.get::<_, i64>(2)? as u64,
            stderr_off: r.get::<_, i64>(3)? as u64,
            reported: r.get(4)?,
            done: r.get(5)?,
            stdout_base: r.get::<_, i64>(7)? as u64,
            stderr_base: r.get::<_, i64>(8)? as u64,
            user: r.get(9)?,
            uid: r.get(10)?,
            submit_time: r.get(11)?,
            submitted_at: r.get(12)?,
            restarts: r.get(13)?,
            accepted_at: r.get(14)?,
            epoch: r.get::<_, i64>(15)? as u64,
            fenced: r.get(16)?,
            reruns: r.get(17)?,
            run_start: r.get(18)?,
            rerun_out: r.get(19)?,
            rerun_why: r.get(20)?,
            user_signal: r.get(21)?,
        },
        r.get(6)?,
    ))
}

/// Checkpoints the journal at `path` every [`CHECKPOINT_EVERY`] on a
/// connection and thread of its own, until `alive` is gone. PASSIVE: it
/// never waits for, nor blocks, the journal's writer.
fn checkpointer(path: &Path, alive: std::sync::Weak<()>) -> Result<()> {
    let db = Connection::open(path).with_context(|| format!("opening journal {} to checkpoint", path.display()))?;
    std::thread::Builder::new()
        .name("journal-checkpoint".into())
        .spawn(move || {
            let mut warned = false;
            while alive.strong_count() > 0 {
                std::thread::sleep(CHECKPOINT_EVERY);
                match db.execute_batch("PRAGMA wal_checkpoint(PASSIVE)") {
                    Ok(()) => warned = false,
                    Err(e) if !warned => {
                        tracing::warn!("journal checkpoint: {e}");
                        warned = true;
                    }
                    Err(e) => tracing::debug!("journal checkpoint: {e}"),
                }
            }
        })
        .context("starting the journal's checkpointer")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits stay in the write-ahead log (no checkpoint inside a
    /// write); the checkpointer thread copies them into the database file.
    #[test]
    fn the_log_is_checkpointed_apart_from_the_writes() {
        let dir = std::env::temp_dir().join(format!("fleet-journal-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("j.db");
        let _ = std::fs::remove_file(&path);
        let j = Journal::open(&path).unwrap();
        let autockpt: i64 = j.db.lock().query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0)).unwrap();
        assert_eq!(autockpt, 0);
        let size = || std::fs::metadata(&path).unwrap().len();
        let before = size();
        let req = JobRequest { origin: "beta".into(), script: Some(vec![b'x'; 64 << 10]), ..Default::default() };
        for i in 0..20 {
            j.add_forward(&format!("beta-{i}"), &req, "alpha").unwrap();
        }
        // 20 requests of 64 KiB: in the database file once checkpointed.
        let deadline = Instant::now() + Duration::from_secs(10);
        while size() < before + (20 << 16) {
            assert!(Instant::now() < deadline, "not checkpointed: {} bytes, was {before}", size());
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(j);
        assert_eq!(Journal::open(&path).unwrap().unregistered_forwards().unwrap().len(), 20);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The loops' "what is left to do" queries read the partial indexes,
    /// not every row ever journaled (a scan held the lock a plugin
    /// request waits for, longer as the journal grew).
    #[test]
    fn pending_rows_are_found_through_their_indexes() {
        let dir = std::env::temp_dir().join(format!("fleet-journal-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("j.db");
        let _ = std::fs::remove_file(&path);
        let j = Journal::open(&path).unwrap();
        let req = JobRequest { origin: "beta".into(), script: Some(vec![b'x'; 4096]), ..Default::default() };
        for i in 0..200 {
            j.add_forward(&format!("beta-{i}"), &req, "alpha").unwrap();
            j.mark_registered(&format!("beta-{i}")).unwrap();
        }
        j.add_forward("beta-new", &req, "alpha").unwrap();
        let plan = |sql: &str| -> String {
            let db = j.db.lock();
            let mut st = db.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let rows = st.query_map([], |r| r.get::<_, String>(3)).unwrap();
            rows.map(|r| r.unwrap()).collect::<Vec<_>>().join("; ")
        };
        for (sql, index) in [
            ("SELECT id, request, target FROM forwards WHERE registered = 0 ORDER BY created", "forwards_unregistered"),
            (&format!("SELECT {RUN_COLS} FROM runs WHERE done = 0"), "runs_active"),
        ] {
            let p = plan(sql);
            assert!(p.contains(index), "{sql}: {p}");
        }
        let left: Vec<String> = j.unregistered_forwards().unwrap().into_iter().map(|f| f.id).collect();
        assert_eq!(left, ["beta-new"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn survives_reopen() {
        let dir = std::env::temp_dir().join(format!("fleet-journal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("j.db");
        let _ = std::fs::remove_file(&path);
        let req = JobRequest { origin: "beta".into(), script: Some(b"#!/bin/sh\n\xff".to_vec()), ..Default::default() };
        {
            let j = Journal::open(&path).unwrap();
            j.add_forward("beta-1", &req, "alpha").unwrap();
            j.add_forward("beta-2", &req, "alpha").unwrap();
            j.mark_registered("beta-1").unwrap();
            assert!(j.add_run("gamma-7", &req).unwrap());
            assert!(!j.add_run("gamma-7", &req).unwrap());
            j.set_submitted("gamma-7", 100001, "alice", 1001, 5.0).unwrap();
            j.set_stand_in("beta-1", 77).unwrap();
        }
        let j = Journal::open(&path).unwrap();
        // A forward the plugin never received is withdrawn while unsent;
        // one already registered stays (the reconcile pass handles it).
        j.add_forward("beta-untaken", &req, "alpha").unwrap();
        assert!(j.withdraw_forward("beta-untaken").unwrap());
        assert!(!j.withdraw_forward("beta-untaken").unwrap(), "once");
        assert!(!j.withdraw_forward("beta-1").unwrap(), "registered: not withdrawn");
        let f = j.unregistered_forwards().unwrap();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].id, "beta-2");
        assert_eq!(f[0].request, req);
        let runs = j.active_runs().unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].0.slurm_id, Some(100001));
        assert_eq!(
            (runs[0].0.user.as_deref(), runs[0].0.uid, runs[0].0.submitted_at),
            (Some("alice"), Some(1001), 5.0)
        );
        assert_eq!(j.stand_in_of("beta-1").unwrap(), Some(77));
        assert_eq!(j.stand_in_of("beta-2").unwrap(), None);
        assert_eq!(j.stand_in_of_forward("beta-1").unwrap(), Some(Some(77)));
        assert_eq!(j.stand_in_of_forward("beta-9").unwrap(), None);
        j.add_forward_of_stand_in("beta-3_2", &JobRequest::default(), "alpha", 91, false).unwrap();
        assert_eq!(j.stand_in_of("beta-3_2").unwrap(), Some(91));
        assert!(j.add_forward_of_stand_in("beta-3_2", &JobRequest::default(), "alpha", 92, true).is_err(), "once");
        // Early start: the plugin's forwards and stand-ins picked up pending.
        j.add_forward_of_stand_in("beta-4", &JobRequest::default(), "alpha", 93, true).unwrap();
        assert!(j.early_start("beta-2").unwrap(), "no stand-in yet");
        assert!(!j.early_start("beta-1").unwrap(), "confirmed running");
        assert!(!j.early_start("beta-3_2").unwrap(), "asked by its running stand-in");
        assert!(j.early_start("beta-4").unwrap(), "picked up pending");
        assert!(!j.early_start("beta-9").unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A signal delivered on its user's request stays noted whatever a
    /// watch pass holding an older copy of the row writes, survives a
    /// restart, and a new placement of the job here starts over without it.
    #[test]
    fn a_users_signal_stays_noted_until_the_run_starts_over() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("j.db");
        let req = JobRequest { origin: "beta".into(), ..Default::default() };
        {
            let j = Journal::open(&path).unwrap();
            j.add_run("beta-8", &req).unwrap();
            let older = j.run("beta-8").unwrap().unwrap().0;
            assert_eq!(older.user_signal, None);
            j.mark_signalled("beta-8", "USR1").unwrap();
            j.update_run(&older).unwrap();
            assert_eq!(j.run("beta-8").unwrap().unwrap().0.user_signal.as_deref(), Some("USR1"));
        }
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.active_runs().unwrap()[0].0.user_signal.as_deref(), Some("USR1"));
        j.rerun("beta-8", 1, &req, 0, 0).unwrap();
        assert_eq!(j.run("beta-8").unwrap().unwrap().0.user_signal, None);
    }

    /// A re-run Slurm did not count is counted once: the agent's count and
    /// what it knows of the run's incarnation survive its restart, and a
    /// new placement of the job here starts them over.
    #[test]
    fn re_runs_survive_a_restart_and_start_over_with_a_rerun() {
        let dir = std::env::temp_dir().join(format!("fleet-journal-reruns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("j.db");
        let _ = std::fs::remove_file(&path);
        let req = JobRequest { origin: "beta".into(), ..Default::default() };
        {
            let j = Journal::open(&path).unwrap();
            j.add_run("beta-7", &req).unwrap();
            let mut r = j.run("beta-7").unwrap().unwrap().0;
            assert_eq!((r.reruns, r.run_start, r.rerun_out, r.rerun_why.clone()), (0, None, 0, None));
            r.reruns = 2;
            r.run_start = Some(1_700_000_124);
            r.rerun_out = 2;
            r.rerun_why = Some("it went back to pending after it ran".into());
            j.update_run(&r).unwrap();
        }
        let j = Journal::open(&path).unwrap();
        let r = j.run("beta-7").unwrap().unwrap().0;
        assert_eq!(
            (r.reruns, r.run_start, r.rerun_out, r.rerun_why.as_deref()),
            (2, Some(1_700_000_124), 2, Some("it went back to pending after it ran"))
        );
        j.rerun("beta-7", 1, &req, 10, 0).unwrap();
        let r = j.run("beta-7").unwrap().unwrap().0;
        assert_eq!((r.reruns, r.run_start, r.rerun_out, r.rerun_why), (0, None, 0, None));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn runs_by_native_id_names_the_submitted_runs_not_done() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(&dir.path().join("j.db")).unwrap();
        let req = JobRequest { origin: "beta".into(), ..Default::default() };
        for id in ["beta-1", "beta-2", "beta-3"] {
            assert!(j.add_run(id, &req).unwrap());
        }
        j.set_submitted("beta-1", 101, "alice", 1001, 5.0).unwrap();
        j.set_epoch("beta-1", 3).unwrap();
        j.set_submitted("beta-3", 103, "bob", 1002, 5.0).unwrap();
        let (mut done, _) = j.run("beta-3").unwrap().unwrap();
        done.done = true;
        j.update_run(&done).unwrap();
        // beta-2 has no Slurm job yet; beta-3 is done.
        assert_eq!(j.runs_by_native_id().unwrap(), vec![(101, "beta-1".to_string(), 3)]);
    }
}
