//! The provisioning SLA: how long a fleet job takes from its assignment
//! to a cluster to running there, per cluster and per provider (the last
//! `[sla] window` samples, kept in the `sla_samples` table so a restart
//! keeps them), the cluster's SLA state derived from them ([`judge`], pure
//! and table-tested), and the sweeper's part: a job waiting at its target
//! past the deadline is re-placed (the lifecycle's [`Event::SlaMissed`]).
//! docs/failover.md ("Provisioning SLA") describes it.

use std::collections::{BTreeMap, VecDeque};

use fleet_api::api::{ClusterSla, FleetView};
use fleet_api::placement::{self, Placement};
use fleet_api::JobState;
use rusqlite::params;

use super::moves::PlannedMove;
use super::{life_of, set_life, Job, Store, StoreError};
use crate::config::Sla;
use crate::lifecycle::{transition, Effect, Event, Moving};

/// How long the target has to confirm the cancel of a late job before the
/// job is re-placed anyway (its copy there is fenced by the epoch).
pub const SLA_STOP_DEADLINE_S: f64 = 60.0;

/// One run's provisioning time, or a miss (the job was still waiting when
/// the deadline passed: `seconds` is its wait so far, then its real start
/// once it runs).
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub job_id: String,
    pub epoch: u64,
    pub provider: String,
    /// When it was recorded (the start, or the miss).
    pub at: f64,
    pub seconds: f64,
    pub missed: bool,
}

/// Every cluster's newest samples, newest last, at most `window` each.
#[derive(Debug, Default)]
pub struct SlaBook {
    by_cluster: BTreeMap<String, VecDeque<Sample>>,
}

pub(super) fn init(conn: &rusqlite::Connection) -> Result<(), StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS sla_samples (
             seq INTEGER PRIMARY KEY AUTOINCREMENT,
             cluster TEXT NOT NULL,
             provider TEXT NOT NULL,
             job_id TEXT NOT NULL,
             epoch INTEGER NOT NULL,
             at REAL NOT NULL,
             seconds REAL NOT NULL,
             missed INTEGER NOT NULL,
             UNIQUE (job_id, epoch)
         );
         CREATE INDEX IF NOT EXISTS sla_samples_cluster ON sla_samples(cluster, seq);",
    )?;
    Ok(())
}

impl SlaBook {
    pub(super) fn load(conn: &rusqlite::Connection, window: usize) -> Result<SlaBook, StoreError> {
        let mut book = SlaBook::default();
        let mut stmt =
            conn.prepare("SELECT cluster, provider, job_id, epoch, at, seconds, missed FROM sla_samples ORDER BY seq")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                Sample {
                    provider: r.get(1)?,
                    job_id: r.get(2)?,
                    epoch: r.get::<_, i64>(3)? as u64,
                    at: r.get(4)?,
                    seconds: r.get(5)?,
                    missed: r.get(6)?,
                },
            ))
        })?;
        for row in rows {
            let (cluster, s) = row?;
            book.push(&cluster, s, window);
        }
        Ok(book)
    }

    fn push(&mut self, cluster: &str, s: Sample, window: usize) {
        let q = self.by_cluster.entry(cluster.to_string()).or_default();
        q.push_back(s);
        while q.len() > window.max(1) {
            q.pop_front();
        }
    }

    /// `cluster`'s samples, newest first.
    pub fn newest_first(&self, cluster: &str) -> Vec<&Sample> {
        self.by_cluster.get(cluster).map(|q| q.iter().rev().collect()).unwrap_or_default()
    }

    /// Per provider, the seconds of its newest `window` samples over all
    /// its clusters, newest first. One pass over every sample: the view
    /// asks once for all clusters.
    pub fn by_provider(&self, window: usize) -> BTreeMap<&str, Vec<f64>> {
        let mut all: Vec<&Sample> = self.by_cluster.values().flatten().collect();
        all.sort_by(|a, b| b.at.total_cmp(&a.at));
        let mut out: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for s in all {
            let v = out.entry(s.provider.as_str()).or_default();
            if v.len() < window {
                v.push(s.seconds);
            }
        }
        out
    }
}

/// Nearest-rank percentile `q` (0..=1) of `v`; `None` when empty.
pub fn percentile(v: &[f64], q: f64) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let rank = (q.clamp(0.0, 1.0) * s.len() as f64).ceil().max(1.0) as usize;
    s.get(rank - 1).copied()
}

/// A cluster's SLA state from its samples (newest first) and deadline.
///
/// * no miss in the window: `ok`;
/// * the newest `recover_runs` samples all started within the deadline:
///   `ok` (recovered);
/// * `cooldown_s` since the newest miss: `ok` (recovered);
/// * otherwise `degraded`.
///
/// Not enforced (no `[sla]`): `off`, with the same figures.
pub fn judge(samples: &[&Sample], deadline_s: f64, sla: &Sla, now: f64) -> ClusterSla {
    let secs: Vec<f64> = samples.iter().map(|s| s.seconds).collect();
    let (p50, p90) = (percentile(&secs, 0.5), percentile(&secs, 0.9));
    let missed = samples.iter().filter(|s| s.missed).count();
    let mut out = ClusterSla {
        state: "ok".into(),
        deadline_s,
        samples: samples.len() as u32,
        missed: missed as u32,
        p50_s: p50,
        p90_s: p90,
        penalty_frac: sla.penalty_frac,
        ..Default::default()
    };
    let figures = match p90 {
        Some(p) => format!(
            "missed {missed} of last {}, p90 {p:.0} s {} {deadline_s:.0} s",
            samples.len(),
            if p > deadline_s { ">" } else { "<=" }
        ),
        None => format!("no runs yet (deadline {deadline_s:.0} s)"),
    };
    if !sla.enforced {
        out.state = "off".into();
        out.why = format!("{figures} (not enforced: no [sla])");
        return out;
    }
    let Some(first_miss) = samples.iter().position(|s| s.missed) else {
        out.why = figures;
        return out;
    };
    let since_miss = now - samples[first_miss].at;
    if first_miss >= sla.recover_runs {
        out.why = format!("{figures}; recovered: the last {first_miss} runs started within the deadline");
    } else if since_miss >= sla.cooldown_s {
        out.why = format!("{figures}; recovered: no miss for {since_miss:.0} s");
    } else {
        out.state = "degraded".into();
        out.why = format!(
            "{figures}; degraded until {} runs in a row start within it or {:.0} s pass without a miss",
            sla.recover_runs,
            sla.cooldown_s - since_miss
        );
    }
    out
}

impl Store {
    /// `[sla]` as configured (the store opens measuring, not enforcing).
    pub fn set_sla(&mut self, sla: Sla) -> Result<(), StoreError> {
        self.sla_book = SlaBook::load(&self.conn, sla.window)?;
        self.sla = sla;
        Ok(())
    }

    /// The SLA summary of `cluster` (of `provider`) for the view;
    /// `providers` is [`SlaBook::by_provider`].
    pub(super) fn sla_summary(
        &self,
        cluster: &str,
        provider: &str,
        providers: &BTreeMap<&str, Vec<f64>>,
        now: f64,
    ) -> ClusterSla {
        let mine = self.sla_book.newest_first(cluster);
        let mut out = judge(&mine, self.sla.deadline(cluster, provider), &self.sla, now);
        let theirs = providers.get(provider).map(Vec::as_slice).unwrap_or_default();
        out.provider_samples = theirs.len() as u32;
        out.provider_p50_s = percentile(theirs, 0.5);
        out.provider_p90_s = percentile(theirs, 0.9);
        out
    }

    /// The provider of `cluster` as the view has it.
    fn provider_of(view: &FleetView, cluster: &str) -> String {
        view.clusters.iter().find(|c| c.name == cluster).map(|c| c.provider.clone()).unwrap_or_default()
    }

    /// Record a sample of `job`'s current epoch at `cluster`: a start
    /// (`started`, its time since the assignment) or a miss. A start after
    /// a miss of the same epoch updates the miss with the real time.
    fn record_sla(&mut self, job: &Job, cluster: &str, now: f64, started: bool) -> Result<(), StoreError> {
        let Some(assigned_at) = job.assigned_at else { return Ok(()) };
        let view = self.view(now);
        let provider = Self::provider_of(&view, cluster);
        let seconds = (now - assigned_at).max(0.0);
        let deadline = self.sla.deadline(cluster, &provider);
        let missed = !started || seconds > deadline;
        let id = &job.record.fleet_job_id;
        let epoch = job.record.epoch;
        let sql = if started {
            "INSERT INTO sla_samples (cluster, provider, job_id, epoch, at, seconds, missed)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (job_id, epoch) DO UPDATE SET seconds = excluded.seconds,
                 missed = MAX(missed, excluded.missed)"
        } else {
            "INSERT INTO sla_samples (cluster, provider, job_id, epoch, at, seconds, missed)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (job_id, epoch) DO NOTHING"
        };
        self.conn.execute(sql, params![cluster, provider, id, epoch as i64, now, seconds, missed])?;
        let window = self.sla.window;
        let q = self.sla_book.by_cluster.entry(cluster.to_string()).or_default();
        match q.iter_mut().find(|s| s.job_id == *id && s.epoch == epoch) {
            Some(s) if started => {
                s.seconds = seconds;
                s.missed |= missed;
            }
            Some(_) => {}
            None => self.sla_book.push(
                cluster,
                Sample { job_id: id.clone(), epoch, provider: provider.clone(), at: now, seconds, missed },
                window,
            ),
        }
        // Older rows than the window are no longer read.
        self.conn.execute(
            "DELETE FROM sla_samples WHERE cluster = ?1 AND seq NOT IN
             (SELECT seq FROM sla_samples WHERE cluster = ?1 ORDER BY seq DESC LIMIT ?2)",
            params![cluster, window as i64],
        )?;
        self.metrics.placement(if missed { "sla-missed" } else { "sla-met" });
        tracing::info!(job = %id, cluster, provider = %provider, epoch, seconds, deadline, started, missed,
            "provisioning time recorded");
        Ok(())
    }

    /// The job runs (first time in this epoch): its provisioning time.
    pub(super) fn sla_started(&mut self, job: &mut Job, now: f64) -> Result<(), StoreError> {
        let epoch = job.record.epoch;
        if job.sla_started == Some(epoch) {
            return Ok(());
        }
        let Some(cluster) = job.record.target.clone() else { return Ok(()) };
        job.sla_started = Some(epoch);
        self.record_sla(job, &cluster, now, true)
    }

    /// Clusters SLA-degraded now (by name).
    pub(super) fn sla_degraded(view: &FleetView) -> Vec<String> {
        view.clusters
            .iter()
            .filter(|c| c.sla.as_ref().is_some_and(ClusterSla::degraded))
            .map(|c| c.name.clone())
            .collect()
    }

    /// The sweeper's part: jobs assigned or pending past their target's
    /// deadline are re-placed when another cluster can run them (cancelled
    /// there first when submitted), else they stay and wait; either way
    /// the miss is recorded (the cluster is SLA-degraded).
    pub(super) fn check_sla(&mut self, now: f64) -> Result<(), StoreError> {
        if !self.sla.enforced {
            return Ok(());
        }
        let jobs = self.query(
            "SELECT data FROM jobs WHERE active = 1 AND state IN ('assigned', 'pending') ORDER BY submitted_at, id",
            [],
        )?;
        // One view for the pass, built when a job first needs it and again
        // after each job given up (its placement changes the load).
        let mut view = None;
        for mut job in jobs {
            let (Some(target), Some(assigned_at)) = (job.record.target.clone(), job.assigned_at) else { continue };
            // Started once in this placement (then requeued by Slurm
            // there): provisioned, not the SLA's business any more.
            if job.record.cancel_requested || job.planned.is_some() || job.sla_started == Some(job.record.epoch) {
                continue;
            }
            let view = view.get_or_insert_with(|| self.view(now));
            let deadline = self.sla.deadline(&target, &Self::provider_of(view, &target));
            // Time the meta-scheduler was not listening (its reports could not
            // arrive) is not the target's.
            let age = self.heard(assigned_at, now);
            if age <= deadline {
                continue;
            }
            let epoch = job.record.epoch;
            let mut changed = false;
            if job.sla_missed != Some(epoch) {
                job.sla_missed = Some(epoch);
                self.record_sla(&job, &target, now, false)?;
                changed = true;
            }
            let late = format!(
                "not running at {target} {age:.0} s after its assignment (provisioning deadline {deadline:.0} s)"
            );
            let why = format!("provisioning SLA: {late}");
            // Without the age: the reason of a job that stays is written
            // once, not at every pass.
            let waits = format!("not running at {target} within its provisioning deadline ({deadline:.0} s)");
            let gave_up = self.give_up_assignment(&mut job, &target, &late, &waits, &why, "sla", view, now)?;
            if gave_up || changed {
                self.save(&job)?;
            }
            if gave_up {
                *view = self.view(now);
            }
        }
        Ok(())
    }

    /// The sweeper's other part: a job waiting at a cluster that answers
    /// but whose usable nodes cannot run it (every node it fits on drained,
    /// down or not responding) for `[health] stranded_s` is re-placed like
    /// a job past its provisioning deadline, with or without `[sla]`: a
    /// federation runs it where nodes can, as Slurm's own federation would
    /// start a sibling elsewhere. Only a job that never started in this
    /// placement moves (one Slurm requeued after it ran waits, as its
    /// restart policy is the target's); one no other cluster can run stays.
    /// The cluster is not SLA-degraded for it (its nodes are, in its view).
    pub(super) fn check_stranded(&mut self, now: f64) -> Result<(), StoreError> {
        if self.stranded_s <= 0.0 {
            self.stranded_since.clear();
            return Ok(());
        }
        // One view for the pass, taken again after each job given up (its
        // placement changes the load). Only clusters with unusable nodes
        // (`installed` is set then) can strand a job: the others' jobs are
        // not read at all, as this runs at every sweep.
        let mut view = self.view(now);
        let suspect: Vec<String> =
            view.clusters.iter().filter(|c| c.healthy && !c.installed.is_empty()).map(|c| c.name.clone()).collect();
        let mut jobs = Vec::new();
        for cluster in &suspect {
            jobs.extend(self.query(
                "SELECT data FROM jobs WHERE target = ?1 AND active = 1 AND state IN ('assigned', 'pending')
                 ORDER BY submitted_at, id",
                [cluster],
            )?);
        }
        let mut seen = BTreeMap::new();
        for mut job in jobs {
            let Some(target) = job.record.target.clone() else { continue };
            let epoch = job.record.epoch;
            let id = job.record.fleet_job_id.clone();
            if job.record.cancel_requested || job.planned.is_some() || job.sla_started == Some(epoch) {
                continue;
            }
            let Some(c) = view.clusters.iter().find(|c| c.name == target && c.healthy) else { continue };
            // A silent cluster's jobs are the failover path's.
            let Err(cannot) = placement::fits(c, &job.request) else { continue };
            let since = match self.stranded_since.get(&id) {
                Some(&(e, t)) if e == epoch => t,
                _ => now,
            };
            seen.insert(id.clone(), (epoch, since));
            let waited = self.heard(since, now);
            if waited < self.stranded_s {
                continue;
            }
            // No running count in it: the reason of a job that stays is
            // written once, not at every pass.
            let late = format!(
                "stranded at {target}: its usable nodes could not run it for {:.0} s ([health] stranded_s; {target} {cannot})",
                self.stranded_s
            );
            if self.give_up_assignment(&mut job, &target, &late, &late, &late, "stranded", &view, now)? {
                self.save(&job)?;
                view = self.view(now);
            }
        }
        self.stranded_since = seen;
        self.check_held(&mut view, now)
    }

    /// The stranded check's third part: a job whose target keeps its run
    /// pending for a limit that does not clear by itself (a per-job limit
    /// of the partition, QOS or association it runs under there:
    /// `Job::held_by_limit`, from its agent) for `[health] stranded_s` is
    /// given up there like a stranded one, and that cluster is avoided by
    /// its later placements and moves (`Job::refused_at`). A native job
    /// would wait for an admin to change the limit; a federation runs it
    /// where its limits let it run. The cluster is not SLA-degraded for it.
    fn check_held(&mut self, view: &mut FleetView, now: f64) -> Result<(), StoreError> {
        for (id, (epoch, since)) in self.held_since.clone() {
            let Ok(mut job) = self.load(&id) else {
                self.held_since.remove(&id);
                continue;
            };
            let why = match &job.held_by_limit {
                Some((e, why)) if *e == epoch && job.record.epoch == epoch => why.clone(),
                _ => {
                    self.held_since.remove(&id);
                    continue;
                }
            };
            let (Some(target), JobState::Assigned | JobState::Pending) = (job.record.target.clone(), job.record.state)
            else {
                self.held_since.remove(&id);
                continue;
            };
            if job.record.cancel_requested || job.planned.is_some() || job.sla_started == Some(epoch) {
                continue;
            }
            let Some(since) = since else {
                // Known from the database at start: the wait starts now.
                self.held_since.insert(id, (epoch, Some(now)));
                continue;
            };
            if self.heard(since, now) < self.stranded_s {
                continue;
            }
            let refused = !job.refused_at.iter().any(|(c, _)| *c == target);
            if refused {
                job.refused_at.push((target.clone(), why.clone()));
            }
            let late = format!("held at {target} for good: {why} (for {:.0} s, [health] stranded_s)", self.stranded_s);
            let gave_up = self.give_up_assignment(&mut job, &target, &late, &late, &late, "held", view, now)?;
            if gave_up || refused {
                self.save(&job)?;
            }
            if gave_up {
                *view = self.view(now);
            }
        }
        Ok(())
    }

    /// Gives up `job`'s assignment at `target` (`late`: why, for its
    /// reason and stderr; `why`: the stop's, for `job explain`): re-placed
    /// at once when `target` never had it, else cancelled there first and
    /// re-placed once the cancel is confirmed. When no other cluster can
    /// run it now it stays and waits, its reason (`waits`, the same at
    /// every pass) saying so. True when the job changed (the caller saves
    /// it).
    #[allow(clippy::too_many_arguments)]
    fn give_up_assignment(
        &mut self,
        job: &mut Job,
        target: &str,
        late: &str,
        waits: &str,
        why: &str,
        metric: &str,
        view: &FleetView,
        now: f64,
    ) -> Result<bool, StoreError> {
        let id = job.record.fleet_job_id.clone();
        // Nor where its limits held it for good.
        let mut names: Vec<&str> = job.refused_at.iter().map(|(c, _)| c.as_str()).collect();
        names.push(target);
        let without = super::without_clusters(view, &names);
        if matches!(placement::place(&without, &job.request).0, Placement::Impossible { .. }) {
            let reason = format!("{waits}; no other cluster can run it now, so it stays and waits there");
            if job.record.reason == reason {
                return Ok(false);
            }
            tracing::warn!(job = %id, "{reason}");
            job.record.reason = reason;
            job.record.updated_at = now;
            return Ok(true);
        }
        let o = transition(&life_of(job), &Event::SlaMissed);
        if o.effects.contains(&Effect::SlaReplace) {
            set_life(job, &o.life);
            self.sla_forget(job, target, late, "re-placing it elsewhere")?;
            job.record.reason = format!("re-placing: {late}");
            self.metrics.placement(&format!("{metric}-replace"));
            self.assign(job, now);
            tracing::warn!(job = %id, from = %target, to = ?job.record.target, "{}", job.record.reason);
        } else if o.effects.contains(&Effect::StopRun) {
            set_life(job, &o.life);
            job.planned = Some(PlannedMove {
                phase: Moving::Stopping,
                from: target.to_string(),
                to: String::new(),
                why: why.to_string(),
                decided_at: now,
                baseline_seq: None,
                checkpoint_by: now,
                resume_previous: false,
                stop_deadline_s: SLA_STOP_DEADLINE_S,
                stop_at: Some(now),
                stop_by: Some(now + SLA_STOP_DEADLINE_S),
                sla: true,
            });
            job.record.reason = format!("{late}: cancelling it there before it is placed elsewhere");
            self.metrics.placement(&format!("{metric}-stop"));
            tracing::warn!(job = %id, from = %target, "{}", job.record.reason);
            self.wakers.wake(target);
            job.record.updated_at = now;
        } else {
            return Ok(false);
        }
        Ok(true)
    }

    /// The assignment at `from` is given up (the SLA was missed): its
    /// epoch is stale there from now on, the next placement avoids it,
    /// and the job's stderr gets one line. The stand-in stays one job.
    pub(super) fn sla_forget(&self, job: &mut Job, from: &str, late: &str, then: &str) -> Result<(), StoreError> {
        let id = job.record.fleet_job_id.clone();
        let epoch = job.record.epoch;
        job.left.push((epoch, from.to_string()));
        job.avoid = Some(from.to_string());
        job.record.target = None;
        job.record.remote_job_id = None;
        job.record.node_list.clear();
        job.running_since = None;
        job.record.exit_code = None;
        job.record.signal = None;
        let note = format!("fleet: run {epoch} of job {id} was {late}; {then}");
        self.note_stderr(job, &note)?;
        job.record.stdout_base = job.record.stdout_len;
        job.record.stderr_base = job.record.stderr_len;
        job.final_stdout_len = None;
        job.final_stderr_len = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: f64, seconds: f64, missed: bool) -> Sample {
        Sample { job_id: format!("j{at}"), epoch: 1, provider: "aws".into(), at, seconds, missed }
    }

    fn sla(enforced: bool) -> Sla {
        Sla {
            enforced,
            deadline_s: 300.0,
            recover_runs: 3,
            cooldown_s: 900.0,
            window: 20,
            penalty_frac: 1.0,
            ..Default::default()
        }
    }

    /// `(newest-first samples (at, seconds, missed), now)` → (state, why part).
    fn check(samples: &[(f64, f64, bool)], now: f64, enforced: bool, state: &str, why: &str) {
        let owned: Vec<Sample> = samples.iter().map(|(a, s, m)| sample(*a, *s, *m)).collect();
        let refs: Vec<&Sample> = owned.iter().collect();
        let got = judge(&refs, 300.0, &sla(enforced), now);
        assert_eq!(got.state, state, "{samples:?}: {got:?}");
        assert!(got.why.contains(why), "{samples:?}: {:?} lacks {why:?}", got.why);
        assert_eq!(got.samples as usize, samples.len());
        assert_eq!(got.missed as usize, samples.iter().filter(|s| s.2).count());
    }

    #[test]
    fn sla_state_table() {
        check(&[], 0.0, true, "ok", "no runs yet (deadline 300 s)");
        check(&[(90.0, 40.0, false), (50.0, 20.0, false)], 100.0, true, "ok", "missed 0 of last 2, p90 40 s <= 300 s");
        // The newest run missed: degraded, with the figures of the example.
        check(
            &[(100.0, 412.0, true), (90.0, 500.0, true), (80.0, 10.0, false), (70.0, 350.0, true), (60.0, 5.0, false)],
            110.0,
            true,
            "degraded",
            "missed 3 of last 5, p90 500 s > 300 s; degraded until 3 runs in a row start within it or 890 s pass",
        );
        // Two good runs since the miss are not enough (recover_runs = 3) …
        check(&[(100.0, 10.0, false), (90.0, 20.0, false), (80.0, 400.0, true)], 110.0, true, "degraded", "degraded");
        // … three are.
        check(
            &[(100.0, 10.0, false), (95.0, 10.0, false), (90.0, 20.0, false), (80.0, 400.0, true)],
            110.0,
            true,
            "ok",
            "recovered: the last 3 runs started within the deadline",
        );
        // Or the cool-down passes without a miss.
        check(&[(100.0, 400.0, true)], 1000.0, true, "ok", "recovered: no miss for 900 s");
        check(&[(100.0, 400.0, true)], 999.0, true, "degraded", "or 1 s pass without a miss");
        // Not enforced: measured, never degraded.
        check(&[(100.0, 400.0, true)], 110.0, false, "off", "missed 1 of last 1, p90 400 s > 300 s (not enforced");
    }

    #[test]
    fn percentiles() {
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(percentile(&[7.0], 0.9), Some(7.0));
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), Some(5.0));
        assert_eq!(percentile(&v, 0.9), Some(9.0));
        assert_eq!(percentile(&[3.0, f64::NAN, 1.0], 0.9), Some(3.0));
    }

    #[test]
    fn the_book_keeps_a_window_per_cluster_and_reads_providers_across_clusters() {
        let mut b = SlaBook::default();
        for i in 0..5 {
            b.push("alpha", sample(f64::from(i), f64::from(i), false), 3);
        }
        b.push("gamma", Sample { provider: "gcp".into(), ..sample(10.0, 99.0, true) }, 3);
        b.push("delta", sample(4.5, 50.0, false), 3);
        let a: Vec<f64> = b.newest_first("alpha").iter().map(|s| s.at).collect();
        assert_eq!(a, vec![4.0, 3.0, 2.0]);
        let p = b.by_provider(3);
        assert_eq!(p["aws"], vec![50.0, 4.0, 3.0], "delta's 4.5 s sample, then alpha's newest");
        assert_eq!(p["gcp"], vec![99.0]);
        assert!(b.newest_first("nobody").is_empty());
    }
}
