//! The checkpoint catalog: which complete checkpoints each job has, where
//! (URL and region), how large, and the digest of their manifest. It owns
//! the `checkpoints` table; the rest of the store reaches it only through
//! the methods here.
//!
//! A checkpoint is reported (`POST /v1/jobs/{id}/checkpoints`) by the job
//! itself (its job token, as `fleet-ckpt save` does when given one) or by
//! the agent of the cluster running it, never by anyone else. Its URL must
//! be `<prefix>/ckpt-<seq, 12 digits>` under one of the job's checkpoint
//! prefixes: its own `--fleet-ckpt`, or a region's site default
//! `<ckpt_url>/<origin>/<user>/<job id>` ([`site_prefix`]; also
//! `<ckpt_url>/<job id>`, the default before, for runs started then). A
//! job at its target reports with its checkpoint token
//! ([`Caller::Checkpointer`], minted by that target's agent), which works
//! only while that cluster runs the job.
//!
//! Where a run resumes from is one question, [`Store::resume_point`]
//! (the newest valid checkpoint as read from a cluster, or the copy to
//! make first); every assignment to a target carries its answer
//! ([`Store::assignment_resume`]), reruns and migrations alike. A copy the
//! target agent made is reported as a row of its own with `copied_from`,
//! its bytes and `copy_seconds` (the cross-region transfer, for egress
//! accounting).

use fleet_api::api::{Checkpoint, CheckpointReport, RestorePlan};
use fleet_api::JobRequest;
use rusqlite::{params, OptionalExtension};

use super::{Caller, Job, Store, StoreError};

/// Rows kept per job (the oldest sequence numbers go first).
pub const MAX_CHECKPOINTS_PER_JOB: i64 = 1000;
/// Largest checkpoint size accepted in a report (1 PiB).
const MAX_BYTES: u64 = 1 << 50;

/// Create the table (idempotent); called when the store opens.
pub(super) fn init(conn: &rusqlite::Connection) -> Result<(), StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS checkpoints (
             job_id TEXT NOT NULL,
             seq INTEGER NOT NULL,
             url TEXT NOT NULL,
             region TEXT,
             bytes INTEGER NOT NULL,
             manifest_sha256 TEXT NOT NULL,
             step INTEGER,
             reported_at REAL NOT NULL,
             reported_by TEXT NOT NULL,
             valid INTEGER NOT NULL,
             copied_from TEXT,
             copy_seconds REAL,
             PRIMARY KEY (job_id, url)
         );
         CREATE INDEX IF NOT EXISTS checkpoints_seq ON checkpoints(job_id, seq);",
    )?;
    // A catalog from before copies were recorded gains their columns.
    let has_copy: bool = conn
        .query_row("SELECT COUNT(*) FROM pragma_table_info('checkpoints') WHERE name = 'copied_from'", [], |r| {
            r.get::<_, i64>(0)
        })
        .map(|n| n > 0)?;
    if !has_copy {
        conn.execute_batch(
            "ALTER TABLE checkpoints ADD COLUMN copied_from TEXT; ALTER TABLE checkpoints ADD COLUMN copy_seconds REAL;",
        )?;
    }
    Ok(())
}

const COLUMNS: &str =
    "job_id, seq, url, region, bytes, manifest_sha256, step, reported_at, reported_by, valid, copied_from, copy_seconds";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Checkpoint> {
    Ok(Checkpoint {
        fleet_job_id: r.get(0)?,
        seq: r.get::<_, i64>(1)? as u64,
        url: r.get(2)?,
        region: r.get(3)?,
        bytes: r.get::<_, i64>(4)? as u64,
        manifest_sha256: r.get(5)?,
        step: r.get::<_, Option<i64>>(6)?.map(|s| s as u64),
        reported_at: r.get(7)?,
        reported_by: r.get(8)?,
        valid: r.get(9)?,
        copied_from: r.get(10)?,
        copy_seconds: r.get(11)?,
    })
}

/// The sequence number in a checkpoint URL's last component.
fn seq_of(url: &str) -> Option<(&str, u64)> {
    let (prefix, name) = url.rsplit_once('/')?;
    let digits = name.strip_prefix("ckpt-")?;
    if digits.len() != 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((prefix, digits.parse().ok()?))
}

/// The job's own checkpoint location: `--fleet-ckpt`, else `#FLEET ckpt=`
/// in its script (the option wins, as sbatch options win over `#SBATCH`).
pub(super) fn declared_ckpt(job: &Job) -> Option<String> {
    let own = job.request.fleet.ckpt.clone().or_else(|| {
        let script = job.request.script.as_deref()?;
        fleet_engine::job::Directives::parse_bytes(script).0.ckpt
    })?;
    let own = own.trim().trim_end_matches('/').to_string();
    (!own.is_empty()).then_some(own)
}

/// Whether `s` can be one component of an object path as it is: a user
/// or cluster name of letters, digits, `.`, `_` and `-` (not `.` or `..`).
fn path_component(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s != "."
        && s != ".."
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A job's site-default prefix under a region's `ckpt_url`:
/// `<ckpt_url>/<origin>/<user>/<job id>`, so that a store can give each
/// user's key the prefixes of that user alone (docs/checkpoints.md, "Who
/// can read checkpoints"); `<ckpt_url>/<job id>` when the origin did not
/// say who submitted the job or the name cannot be a path component.
pub(super) fn site_prefix(base: &str, job: &Job) -> String {
    let r = &job.record;
    match r.user.as_deref() {
        Some(user) if path_component(user) && path_component(&r.origin) => {
            format!("{}/{}/{user}/{}", base.trim_end_matches('/'), r.origin, r.fleet_job_id)
        }
        _ => id_prefix(base, job),
    }
}

/// `<ckpt_url>/<job id>`: the site default before it named the user.
fn id_prefix(base: &str, job: &Job) -> String {
    format!("{}/{}", base.trim_end_matches('/'), job.record.fleet_job_id)
}

impl Store {
    /// The job's checkpoint prefixes, each with the region whose store
    /// holds it (`None`: the job's own `--fleet-ckpt`, reachable from
    /// every cluster as far as Fleet knows).
    fn ckpt_prefixes(&self, job: &Job) -> Vec<(String, Option<String>)> {
        let mut out = Vec::new();
        if let Some(own) = declared_ckpt(job) {
            // Its own store only: the site defaults are not its prefixes
            // (a copy for a move is made into its own store, so a report
            // under a site default could only plant a checkpoint there for
            // the target agent to copy, with the site's credentials, into
            // whatever prefix the job declared, another job's included).
            out.push((own, None));
            return out;
        }
        for c in self.clusters.values() {
            if let Some(base) = &c.cfg.ckpt_url {
                // The site default, and the one of jobs placed before
                // site defaults named their user (`<ckpt_url>/<job id>`):
                // a run started then still saves there.
                for p in [site_prefix(base, job), id_prefix(base, job)] {
                    if !out.iter().any(|(q, _)| *q == p) {
                        out.push((p, Some(c.cfg.region.clone())));
                    }
                }
            }
        }
        out
    }

    /// The job's checkpoint prefix at `cluster`: its own `--fleet-ckpt`,
    /// else its region's site default.
    fn ckpt_prefix_at(&self, job: &Job, cluster: &str) -> Option<String> {
        if let Some(own) = declared_ckpt(job) {
            return Some(own);
        }
        let base = self.clusters.get(cluster)?.cfg.ckpt_url.as_deref()?;
        Some(site_prefix(base, job))
    }

    /// The job's prefix in `region`'s store (its own `--fleet-ckpt` when it has one).
    fn ckpt_prefix_in_region(&self, job: &Job, region: &str) -> Option<String> {
        let cluster = self.clusters.values().find(|c| c.cfg.region == region && c.cfg.ckpt_url.is_some())?;
        self.ckpt_prefix_at(job, &cluster.cfg.name)
    }

    /// `POST /v1/jobs/{id}/checkpoints`: record a complete checkpoint (or,
    /// with `valid: false`, that one was found torn). Only the job's token
    /// or the agent of the cluster running it may post.
    pub fn report_checkpoint(
        &mut self,
        caller: &Caller,
        id: &str,
        rep: CheckpointReport,
        now: f64,
    ) -> Result<Checkpoint, StoreError> {
        let job = self.load(id)?;
        let reported_by = match caller {
            Caller::Job { id: jid, origin } if jid == id && *origin == job.record.origin => "job".to_string(),
            Caller::Cluster(c) if job.record.target.as_deref() == Some(c.as_str()) => c.clone(),
            Caller::Checkpointer { id: jid, cluster } if jid == id && job.record.target.as_deref() == Some(cluster) => {
                "job".to_string()
            }
            Caller::Job { .. } => return Err(StoreError::Unauthorized("job token does not match this job".into())),
            Caller::Checkpointer { id: jid, cluster } if jid == id => {
                return Err(StoreError::Forbidden(format!(
                    "{id} does not run at {cluster} (target: {}): its checkpoint token there is spent",
                    job.record.target.as_deref().unwrap_or("none")
                )))
            }
            Caller::Checkpointer { .. } => {
                return Err(StoreError::Unauthorized("checkpoint token does not match this job".into()))
            }
            Caller::Cluster(c) => {
                return Err(StoreError::Forbidden(format!(
                    "cluster {c:?} does not run {id} (target: {}): only the job or its target reports checkpoints",
                    job.record.target.as_deref().unwrap_or("none")
                )))
            }
            Caller::Admin => {
                return Err(StoreError::Forbidden("only the job or its target cluster reports checkpoints".into()))
            }
        };
        let bad = |m: String| Err(StoreError::BadRequest(m));
        if rep.url.len() > 1100 || rep.url.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return bad("checkpoint url: too long, or has whitespace or control characters".into());
        }
        let Some((prefix, seq)) = seq_of(&rep.url) else {
            return bad(format!("checkpoint url {:?} does not end in /ckpt-<12 digits>", rep.url));
        };
        if seq != rep.seq {
            return bad(format!("checkpoint url {:?} names seq {seq}, the report says {}", rep.url, rep.seq));
        }
        if rep.seq > i64::MAX as u64 || rep.step.is_some_and(|s| s > i64::MAX as u64) || rep.bytes > MAX_BYTES {
            return bad("seq, step or bytes out of range".into());
        }
        if rep.copy_seconds.is_some_and(|t| !t.is_finite() || !(0.0..=1e7).contains(&t)) {
            return bad("copy_seconds must be a number of seconds between 0 and 1e7".into());
        }
        let mut step = rep.step;
        let copied_from = match &rep.copied_from {
            None => None,
            Some(src) => {
                // A copy names a checkpoint of this job the catalog holds,
                // with the same sequence number and manifest.
                let known = self.checkpoint_rows(id, false)?.into_iter().find(|c| c.url == *src);
                match known {
                    Some(c) if c.seq == rep.seq && c.manifest_sha256 == rep.manifest_sha256 => {
                        step = step.or(c.step);
                        Some(src.clone())
                    }
                    Some(_) => return bad(format!("copied_from {src:?} has another seq or manifest than this copy")),
                    None => return bad(format!("copied_from {src:?} is not a checkpoint of {id} in the catalog")),
                }
            }
        };
        if rep.manifest_sha256.len() != 64
            || !rep.manifest_sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return bad("manifest_sha256 must be 64 lower-case hex digits".into());
        }
        let prefixes = self.ckpt_prefixes(&job);
        let Some((_, region)) = prefixes.iter().find(|(p, _)| p == prefix) else {
            let known: Vec<&str> = prefixes.iter().map(|(p, _)| p.as_str()).collect();
            return Err(StoreError::Forbidden(format!(
                "checkpoint url {:?} is not under a checkpoint prefix of {id} (known: {})",
                rep.url,
                if known.is_empty() { "none: no --fleet-ckpt and no site default".into() } else { known.join(", ") }
            )));
        };
        let existing: Option<Checkpoint> = self
            .conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM checkpoints WHERE job_id = ?1 AND url = ?2"),
                params![id, rep.url],
                row,
            )
            .optional()?;
        if let Some(old) = &existing {
            if old.manifest_sha256 != rep.manifest_sha256 {
                return Err(super::conflict(format!(
                    "{} was reported with manifest sha256 {}, not {}: a checkpoint is never rewritten",
                    rep.url, old.manifest_sha256, rep.manifest_sha256
                )));
            }
            // Once found torn it stays so; a repeat of a valid report is a no-op.
            if !rep.valid && old.valid {
                self.conn.execute(
                    "UPDATE checkpoints SET valid = 0, reported_at = ?3, reported_by = ?4 WHERE job_id = ?1 AND url = ?2",
                    params![id, rep.url, now, reported_by],
                )?;
                tracing::warn!(job = %id, url = %rep.url, by = %reported_by, "checkpoint reported torn");
                return Ok(Checkpoint { valid: false, reported_at: now, reported_by, ..old.clone() });
            }
            return Ok(old.clone());
        }
        let ck = Checkpoint {
            fleet_job_id: id.to_string(),
            seq: rep.seq,
            url: rep.url,
            region: region.clone(),
            bytes: rep.bytes,
            manifest_sha256: rep.manifest_sha256,
            step,
            reported_at: now,
            reported_by,
            valid: rep.valid,
            copy_seconds: rep.copy_seconds.filter(|_| copied_from.is_some()),
            copied_from,
        };
        self.conn.execute(
            &format!("INSERT INTO checkpoints ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"),
            params![
                ck.fleet_job_id,
                ck.seq as i64,
                ck.url,
                ck.region,
                ck.bytes as i64,
                ck.manifest_sha256,
                ck.step.map(|s| s as i64),
                ck.reported_at,
                ck.reported_by,
                ck.valid,
                ck.copied_from,
                ck.copy_seconds
            ],
        )?;
        // Bound the rows per job: the oldest sequence numbers go.
        self.conn.execute(
            "DELETE FROM checkpoints WHERE job_id = ?1 AND rowid NOT IN
               (SELECT rowid FROM checkpoints WHERE job_id = ?1 ORDER BY seq DESC, reported_at DESC LIMIT ?2)",
            params![id, MAX_CHECKPOINTS_PER_JOB],
        )?;
        Ok(ck)
    }

    /// `GET /v1/jobs/{id}/checkpoints`: newest first; for whoever may read the job.
    pub fn checkpoints(&self, caller: &Caller, id: &str) -> Result<Vec<Checkpoint>, StoreError> {
        self.get(caller, id)?;
        self.checkpoint_rows(id, false)
    }

    fn checkpoint_rows(&self, id: &str, valid_only: bool) -> Result<Vec<Checkpoint>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM checkpoints WHERE job_id = ?1 {} ORDER BY seq DESC, reported_at DESC, url",
            if valid_only { "AND valid = 1" } else { "" }
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([id], row)?.collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// The newest valid checkpoint of job `id` (the first one reported,
    /// when copies of it exist in several regions).
    pub fn latest_valid_checkpoint(&self, id: &str) -> Result<Option<Checkpoint>, StoreError> {
        let rows = self.checkpoint_rows(id, true)?;
        let Some(top) = rows.first().map(|c| c.seq) else { return Ok(None) };
        Ok(rows.into_iter().filter(|c| c.seq == top).min_by(|a, b| a.reported_at.total_cmp(&b.reported_at)))
    }

    /// What resuming job `id` in `target_region` takes: its newest valid
    /// checkpoint, read in place when a copy is in that region (or in the
    /// job's own store, which every region reaches), else copied first
    /// (`copy_needed`, its bytes, and the job's prefix in that region).
    /// `None`: the job has no valid checkpoint (it starts from scratch).
    pub fn plan_restore(&self, id: &str, target_region: &str) -> Result<Option<RestorePlan>, StoreError> {
        let rows = self.checkpoint_rows(id, true)?;
        let Some(top) = rows.first().map(|c| c.seq) else { return Ok(None) };
        let newest: Vec<Checkpoint> = rows.into_iter().filter(|c| c.seq == top).collect();
        let here = newest
            .iter()
            .find(|c| c.region.as_deref() == Some(target_region))
            .or_else(|| newest.iter().find(|c| c.region.is_none()));
        if let Some(c) = here {
            return Ok(Some(RestorePlan { checkpoint: c.clone(), copy_needed: false, copy_bytes: 0, copy_to: None }));
        }
        let c = newest.into_iter().min_by(|a, b| a.reported_at.total_cmp(&b.reported_at)).expect("one row at least");
        let copy_to = match self.load(id) {
            Ok(job) => self.ckpt_prefix_in_region(&job, target_region),
            Err(StoreError::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        Ok(Some(RestorePlan { copy_bytes: c.bytes, checkpoint: c, copy_needed: true, copy_to }))
    }

    /// Where a run of job `id` at cluster `target` resumes from: the
    /// newest valid checkpoint, read in place when a copy of it is in the
    /// target's region (or in the job's own store), else to be copied
    /// first into the job's prefix there (`copy_needed`, `copy_to`).
    /// `None`: no valid checkpoint (start from scratch), or `target` is
    /// unknown. The one function reruns and migrations ask.
    pub fn resume_point(&self, id: &str, target: &str) -> Result<Option<RestorePlan>, StoreError> {
        let Some(c) = self.clusters.get(target) else { return Ok(None) };
        let region = c.cfg.region.clone();
        self.plan_restore(id, &region)
    }

    /// The resume fields of an assignment of `job` to its target
    /// (`resume_from`, `resume_copy_to`, `resume_bytes`), from
    /// [`Store::resume_point`]. A checkpoint to copy with nowhere to copy
    /// it (no site default in the target's region) is passed as is: the
    /// job may reach it (it did not, the job starts from scratch).
    pub(super) fn assignment_resume(&self, job: &Job) -> Result<(Option<String>, Option<String>, u64), StoreError> {
        let Some(target) = job.record.target.as_deref() else { return Ok((None, None, 0)) };
        Ok(match self.resume_point(&job.record.fleet_job_id, target)? {
            None => (None, None, 0),
            Some(p) => (Some(p.checkpoint.url), p.copy_to.filter(|_| p.copy_needed), p.checkpoint.bytes),
        })
    }

    /// The request as the target receives it: `fleet.ckpt` set to the
    /// job's checkpoint prefix there and `fleet.resume_from` to the newest
    /// valid checkpoint readable there without a copy, if any (the agent
    /// passes them as `FLEET_CKPT_URL` and `FLEET_RESUME_FROM`).
    pub(super) fn assignment_request(&self, job: &Job) -> Result<JobRequest, StoreError> {
        let mut req = job.request.clone();
        // Placed early: submitted only under the lease that gates its script.
        req.fleet.start_gated = job.early.is_some();
        let Some(target) = job.record.target.as_deref() else { return Ok(req) };
        req.fleet.ckpt = self.ckpt_prefix_at(job, target);
        let region = self.clusters.get(target).map(|c| c.cfg.region.as_str()).unwrap_or("");
        req.fleet.resume_from = match self.plan_restore(&job.record.fleet_job_id, region)? {
            Some(p) if !p.copy_needed => Some(p.checkpoint.url),
            _ => None,
        };
        Ok(req)
    }
}
