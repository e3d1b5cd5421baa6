//! Early placement (docs/failover.md, "Start latency"): a job forwarded at
//! sbatch time is placed at once, so that its target's Slurm schedules it
//! while the origin's Slurm schedules its stand-in, instead of one after
//! the other. The run's script is gated by its in-job lease: the first
//! lease is answered "wait" until the origin agent has confirmed that the
//! stand-in runs (the lifecycle's `Early::Waiting`). Past the wait bound
//! (`[start] early_submit_wait_s`) the early run is withdrawn and the job
//! goes back to held: the ordinary start.

use fleet_api::api::JobLeaseReply;
use fleet_api::{JobRequest, JobState};
use serde::{Deserialize, Serialize};

use super::{life_of, refresh_complete, set_life, Job, Store, StoreError};
use crate::lifecycle::{transition, Early, Effect, Event, Life};

/// A job placed early: its phase and when it was placed (the wait bound's
/// clock).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EarlyStart {
    pub phase: Early,
    pub placed_at: f64,
}

/// Default of `[start] early_submit_wait_s`.
pub const DEFAULT_EARLY_WAIT_S: f64 = 30.0;

/// Why `req` must wait for its stand-in before it is placed, if it must:
/// the origin's dependency, hold or begin time decides when the stand-in
/// starts, which may be long after now.
pub fn not_early(req: &JobRequest, now: f64) -> Option<&'static str> {
    if req.dependency.is_some() {
        Some("it has a dependency")
    } else if req.hold {
        Some("it was submitted held")
    } else if req.begin_time.is_some_and(|b| b as f64 > now) {
        Some("it has a later begin time")
    } else {
        None
    }
}

impl Store {
    /// `[start] early_submit_wait_s` (0: no early placement).
    pub fn set_early_wait(&mut self, s: f64) {
        self.early_wait_s = s;
    }

    /// Does `cluster` hold every run at its first lease (its heartbeat's
    /// `start_gate`)?
    fn gates_starts(&self, cluster: &str) -> bool {
        self.clusters.get(cluster).and_then(|c| c.last.as_ref()).is_some_and(|(hb, _)| hb.start_gate)
    }

    /// A job just forwarded at sbatch time: place it now when it may be
    /// (see the module). Leaves it held otherwise. Does not save.
    pub(super) fn place_early(&self, job: &mut Job, now: f64) {
        let id = job.record.fleet_job_id.clone();
        if self.early_wait_s <= 0.0 || self.health.job_lease_s <= 0.0 {
            return;
        }
        if let Some(why) = not_early(&job.request, now) {
            tracing::debug!(job = %id, "not placed early: {why}");
            return;
        }
        // Placement as at the stand-in's start, on a copy: only a cluster
        // that gates its runs' scripts may take it now.
        let mut trial = job.clone();
        trial.record.state = JobState::Queued;
        self.trial_assign(&mut trial, now);
        let target = match (&trial.record.state, &trial.record.target) {
            (JobState::Assigned, Some(t)) if self.gates_starts(t) => t.clone(),
            (_, t) => {
                tracing::debug!(job = %id, target = ?t, "not placed early: no cluster that gates its runs' start can take it now");
                return;
            }
        };
        let o = transition(&life_of(job), &Event::PlaceEarly);
        if !o.effects.contains(&Effect::EarlyPlaced) {
            return;
        }
        set_life(job, &o.life);
        job.early = Some(EarlyStart { phase: o.life.early, placed_at: now });
        job.assigned_at = Some(now);
        job.record.target = Some(target.clone());
        job.record.reason = format!(
            "{}; placed early: its run waits there until the origin confirms the stand-in runs",
            trial.record.reason
        );
        job.record.updated_at = now;
        self.metrics.placement("early");
        tracing::info!(job = %id, %target, epoch = job.record.epoch, "placed early (new epoch)");
    }

    /// Back to held from an early placement (the lifecycle's
    /// `EarlyFallback`, with `life`): the run at its target never ran its
    /// script; its epoch there is stale from now on. Does not save.
    pub(super) fn early_fallback(&mut self, job: &mut Job, life: &Life, why: &str, now: f64) {
        let id = job.record.fleet_job_id.clone();
        let epoch = job.record.epoch;
        let from = job.record.target.take();
        if let Some(t) = &from {
            job.left.push((epoch, t.clone()));
        }
        set_life(job, life);
        job.record.remote_job_id = None;
        job.record.node_list.clear();
        job.record.exit_code = None;
        job.record.signal = None;
        job.final_stdout_len = None;
        job.final_stderr_len = None;
        job.running_since = None;
        job.assigned_at = None;
        self.lease_until.remove(&id);
        self.lease_prev_until.remove(&id);
        self.awaiting_lease.remove(&id);
        self.metrics.placement("early-fallback");
        job.record.reason = format!(
            "held at {}: the early run{} was withdrawn ({why}); the job is placed when its stand-in starts",
            job.record.origin,
            from.as_deref().map(|t| format!(" at {t}")).unwrap_or_default()
        );
        tracing::info!(job = %id, from = ?from, epoch, "early placement withdrawn: {why}");
        job.record.updated_at = now;
        refresh_complete(job);
    }

    /// Early runs whose stand-in the origin has not confirmed within the
    /// wait bound: withdrawn (cancelled at the target first when it was
    /// submitted there), the job back to held.
    pub(super) fn early_timeouts(&mut self, now: f64) -> Result<(), StoreError> {
        // `jobs_early` indexes this expression.
        let sql = "SELECT data FROM jobs WHERE json_extract(data, '$.early.phase') = 'waiting' AND active = 1";
        for mut job in self.query(sql, [])? {
            let placed_at = job.early.as_ref().map_or(now, |e| e.placed_at);
            if now - placed_at < self.early_wait_s {
                continue;
            }
            let o = transition(&life_of(&job), &Event::EarlyTimeout);
            if o.effects.is_empty() {
                continue;
            }
            let why = format!(
                "its stand-in was not confirmed running at {} within {:.0} s ([start] early_submit_wait_s)",
                job.record.origin, self.early_wait_s
            );
            if o.effects.contains(&Effect::EarlyFallback) {
                self.early_fallback(&mut job, &o.life, &why, now);
            } else {
                set_life(&mut job, &o.life);
                tracing::info!(job = %job.record.fleet_job_id, target = ?job.record.target,
                    "withdrawing the early run: {why}");
                job.record.reason = format!("withdrawing the early run: {why}");
                job.record.updated_at = now;
            }
            self.save(&job)?;
        }
        Ok(())
    }

    /// The lease answer for a run of a job placed early, if it is one:
    /// "wait" until the origin confirms its stand-in, "stale" once it is
    /// withdrawn or cancelled (its script must never start).
    pub(super) fn early_lease(job: &Job) -> Option<JobLeaseReply> {
        let phase = job.early.as_ref()?.phase;
        let stale = |reason: String| JobLeaseReply { stale: true, reason, ..JobLeaseReply::default() };
        Some(match phase {
            Early::No => return None,
            Early::Withdrawing => {
                stale("the early run is withdrawn: the origin did not confirm its stand-in in time".into())
            }
            Early::Waiting if job.record.cancel_requested => {
                stale("the job was cancelled before its stand-in started".into())
            }
            Early::Waiting => JobLeaseReply {
                wait: true,
                reason: format!(
                    "waiting for {} to confirm that stand-in {} runs",
                    job.record.origin,
                    job.record.origin_job_id.map_or("(not started yet)".to_string(), |i| i.to_string())
                ),
                ..JobLeaseReply::default()
            },
        })
    }
}
