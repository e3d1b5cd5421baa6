//! Planned migrations (rebalancing moves) carried out: a running job is
//! asked for a checkpoint, stopped at its source and placed again at the
//! chosen target, where it resumes from its newest valid checkpoint
//! ([`Store::resume_point`], the same path as reruns and failover). The
//! phases are the lifecycle's ([`Moving`]); this module feeds it the
//! events (the move's start, a new checkpoint, deadlines) and carries out
//! the effects. docs/failover.md ("Planned migration") describes it.

use fleet_api::api::{FleetView, JobRecord};
use fleet_api::placement::{self, Placement};
use fleet_api::{JobRequest, JobState};
use rusqlite::params;
use serde::{Deserialize, Serialize};

use super::{life_of, reply_result, set_life, Job, Store, StoreError};
use crate::lifecycle::{transition, Effect, Event, Moving};

/// How a move is carried out (`[rebalance]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MovePolicy {
    /// Wait this long for a new valid checkpoint.
    pub checkpoint_deadline_s: f64,
    /// No new checkpoint by then: move anyway from the previous valid one.
    pub resume_previous: bool,
    /// The source must confirm the stop within this long.
    pub stop_deadline_s: f64,
    /// Not moved again within this long of its last placement.
    pub min_move_interval_s: f64,
}

/// A planned move under way, kept with the job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannedMove {
    #[serde(with = "phase_serde")]
    pub phase: Moving,
    pub from: String,
    pub to: String,
    /// Why (the proposal: its saving).
    pub why: String,
    pub decided_at: f64,
    /// The newest valid checkpoint's sequence number when the move started.
    pub baseline_seq: Option<u64>,
    pub checkpoint_by: f64,
    pub resume_previous: bool,
    pub stop_deadline_s: f64,
    /// When the run was told to stop, and by when it must have.
    pub stop_at: Option<f64>,
    pub stop_by: Option<f64>,
    /// Not a rebalancing move: a pending job re-placed because its
    /// cluster missed its provisioning SLA (`to` is empty: any other).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sla: bool,
}

mod phase_serde {
    use crate::lifecycle::Moving;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &Moving, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match m {
            Moving::No => "none",
            Moving::Checkpointing => "checkpointing",
            Moving::Stopping => "stopping",
        })
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Moving, D::Error> {
        Ok(match String::deserialize(d)?.as_str() {
            "checkpointing" => Moving::Checkpointing,
            "stopping" => Moving::Stopping,
            _ => Moving::No,
        })
    }
}

/// The figures of a job's last planned move.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MoveFigures {
    pub from: String,
    pub to: String,
    pub decided_at: f64,
    /// Seconds from the decision to the new checkpoint (or the deadline).
    #[serde(default)]
    pub checkpoint_wait_s: Option<f64>,
    /// When the source's run ended and the job was placed again.
    #[serde(default)]
    pub stopped_at: Option<f64>,
    /// When it ran again (at its new target).
    #[serde(default)]
    pub running_at: Option<f64>,
}

/// A move in progress or just done, for `GET /v1/rebalance`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MoveStatus {
    pub fleet_job_id: String,
    pub from: String,
    pub to: String,
    /// `checkpointing`, `stopping`, `placed` (waiting to run at its
    /// target) or `running`.
    pub phase: String,
    pub decided_at: f64,
    #[serde(default)]
    pub checkpoint_wait_s: Option<f64>,
    /// Seconds from the decision to running at the target.
    #[serde(default)]
    pub decision_to_running_s: Option<f64>,
}

/// `want` as the placement of `req` when the first rule lets it take the
/// job now (healthy, fitting, not excluded); `None` otherwise.
pub(super) fn place_at(view: &FleetView, req: &JobRequest, origin: &str, want: &str) -> Option<Placement> {
    if !view.clusters.iter().any(|c| c.name == want && c.healthy) {
        return None;
    }
    let mut only = view.clone();
    only.clusters.iter_mut().filter(|c| c.name != want).for_each(|c| c.healthy = false);
    let (p, _) = placement::place(&only, req);
    let hit = match &p {
        Placement::Home { .. } => origin == want,
        Placement::Remote { target, .. } => target == want,
        Placement::Impossible { .. } => false,
    };
    hit.then_some(p)
}

/// The signal name a planned move sends for a checkpoint: `#FLEET
/// ckpt-signal=`, else the job's `--signal` number; `None`: the job only
/// checkpoints on its own schedule, so the move waits for the next one.
fn checkpoint_signal(job: &Job) -> Option<&'static str> {
    let directive =
        job.request.script.as_deref().and_then(|s| fleet_engine::job::Directives::parse_bytes(s).0.ckpt_signal);
    if let Some(d) = directive {
        return fleet_api::api::check_signal_name(&d).ok();
    }
    let name = match job.request.warn_signal? {
        1 => "HUP",
        2 => "INT",
        3 => "QUIT",
        10 => "USR1",
        12 => "USR2",
        14 => "ALRM",
        15 => "TERM",
        23 => "URG",
        24 => "XCPU",
        30 => "PWR",
        _ => return None,
    };
    Some(name)
}

impl Store {
    /// Start a planned move of running job `id` to cluster `to` (auto
    /// rebalancing or an approved proposal; the admin only). A job that
    /// checkpoints is asked for a new checkpoint first; a restartable job
    /// without checkpoints is stopped at once; any other is refused.
    pub fn start_move(
        &mut self,
        caller: &super::Caller,
        id: &str,
        to: &str,
        why: &str,
        policy: &MovePolicy,
        now: f64,
    ) -> Result<JobRecord, StoreError> {
        if *caller != super::Caller::Admin {
            return Err(StoreError::Forbidden("only the admin moves jobs".into()));
        }
        let mut job = self.load(id)?;
        let from = job.record.target.clone().unwrap_or_default();
        if from == to {
            return Err(super::conflict(format!("job {id} already runs at {to}")));
        }
        if let Some((_, why)) = job.refused_at.iter().find(|(c, _)| c == to) {
            return Err(super::conflict(format!(
                "job {id} is not moved to {to}, whose limits held it for good: {why}"
            )));
        }
        if job.record.migrations >= self.health.max_migrations {
            return Err(super::conflict(format!(
                "job {id} was already moved {} times ([health] max_migrations)",
                job.record.migrations
            )));
        }
        // Times come back from the database rounded: a run started "now"
        // may read as a fraction of a millisecond in the future.
        let placed_for = (now - job.running_since.unwrap_or(job.record.updated_at)).max(0.0);
        if job.record.migrations > 0 && placed_for < policy.min_move_interval_s {
            return Err(super::conflict(format!(
                "job {id} runs at {from} for {placed_for:.0} s only since its last move \
                 ([rebalance] min_move_interval_s = {})",
                policy.min_move_interval_s
            )));
        }
        let baseline = self.latest_valid_checkpoint(id)?;
        let checkpoints = super::catalog::declared_ckpt(&job).is_some() || baseline.is_some();
        if !checkpoints && !Self::restartable(&job) {
            return Err(super::conflict(format!(
                "job {id} neither checkpoints (--fleet-ckpt, #FLEET ckpt=, a checkpoint in the catalog) \
                 nor is restartable (--fleet-interruptible): it is not moved"
            )));
        }
        if job.record.state == JobState::Running
            && place_at(&self.view(now), &job.request, &job.record.origin, to).is_none()
        {
            return Err(super::conflict(format!("{to} cannot take job {id} now (unhealthy, full or excluded)")));
        }
        let before = life_of(&job);
        let o = transition(&before, &Event::MoveStart { checkpoints });
        reply_result(id, &o.reply)?;
        job.planned = Some(PlannedMove {
            phase: o.life.moving,
            from: from.clone(),
            to: to.to_string(),
            why: why.chars().filter(|c| !c.is_control()).take(300).collect(),
            decided_at: now,
            baseline_seq: baseline.map(|c| c.seq),
            checkpoint_by: now + policy.checkpoint_deadline_s,
            resume_previous: policy.resume_previous,
            stop_deadline_s: policy.stop_deadline_s,
            stop_at: None,
            stop_by: None,
            sla: false,
        });
        job.last_move =
            Some(MoveFigures { from: from.clone(), to: to.to_string(), decided_at: now, ..Default::default() });
        set_life(&mut job, &o.life);
        let signal = if o.effects.contains(&Effect::SignalCheckpoint) { checkpoint_signal(&job) } else { None };
        if let Some(name) = signal {
            let scope = if job.request.warn_batch_only { "batch" } else { "full" };
            self.conn.execute(
                "INSERT OR IGNORE INTO signal_orders (job_id, target, signal, scope, requested_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![id, from, name, scope, now],
            )?;
            // An end after it is the checkpoint's, not Slurm's kill.
            job.signalled = Some(job.record.epoch);
        }
        self.apply_stop(&mut job, &o.effects, now);
        job.record.reason = match o.life.moving {
            Moving::Checkpointing => format!(
                "moving to {to} ({why}): waiting for a new checkpoint{}",
                signal.map(|s| format!(" (sent SIG{s})")).unwrap_or_default()
            ),
            _ => format!("moving to {to} ({why}): stopping the run at {from} (restartable, no checkpoints)"),
        };
        job.record.updated_at = now;
        tracing::info!(job = id, from = %from, to, phase = ?o.life.moving, signal = ?signal, "planned move started");
        self.metrics.placement("move-start");
        if o.effects.contains(&Effect::WakeTarget) {
            self.wakers.wake(&from);
        }
        self.save(&job)?;
        Ok(job.record)
    }

    /// `StopRun`: the target agent cancels the run (its cancel work).
    fn apply_stop(&self, job: &mut Job, effects: &[Effect], now: f64) {
        if !effects.contains(&Effect::StopRun) {
            return;
        }
        if let Some(m) = job.planned.as_mut() {
            m.stop_at = Some(now);
            m.stop_by = Some(now + m.stop_deadline_s);
        }
    }

    /// The sweeper's part: moves waiting for a checkpoint or a stop.
    pub(super) fn advance_moves(&mut self, now: f64) -> Result<(), StoreError> {
        let jobs = self.query(
            "SELECT data FROM jobs WHERE active = 1 AND json_extract(data, '$.planned') IS NOT NULL ORDER BY id",
            [],
        )?;
        for mut job in jobs {
            let Some(m) = job.planned.clone() else { continue };
            let id = job.record.fleet_job_id.clone();
            match m.phase {
                Moving::Checkpointing => {
                    let newest = self.latest_valid_checkpoint(&id)?;
                    let fresh = newest.as_ref().is_some_and(|c| m.baseline_seq.is_none_or(|b| c.seq > b));
                    let (event, why) = if fresh {
                        if place_at(&self.view(now), &job.request, &job.record.origin, &m.to).is_some() {
                            (Event::CheckpointTaken, format!("checkpoint {} taken", newest.map_or(0, |c| c.seq)))
                        } else {
                            (Event::MoveRefused, format!("{} can no longer take it", m.to))
                        }
                    } else if now >= m.checkpoint_by {
                        let fallback = m.resume_previous && (newest.is_some() || Self::restartable(&job));
                        (
                            Event::CheckpointMissed { fallback },
                            format!("no new checkpoint within {:.0} s", m.checkpoint_by - m.decided_at),
                        )
                    } else {
                        continue;
                    };
                    let o = transition(&life_of(&job), &event);
                    if o.life == life_of(&job) {
                        continue;
                    }
                    set_life(&mut job, &o.life);
                    if let Some(f) = job.last_move.as_mut() {
                        f.checkpoint_wait_s = Some(now - m.decided_at);
                    }
                    self.apply_stop(&mut job, &o.effects, now);
                    job.record.reason = if o.effects.contains(&Effect::AbandonMove) {
                        self.metrics.placement("move-abandoned");
                        format!("stays at {}: the move to {} was abandoned ({why})", m.from, m.to)
                    } else {
                        format!("moving to {} ({}): {why}; stopping the run at {}", m.to, m.why, m.from)
                    };
                    tracing::info!(job = %id, to = %m.to, waited_s = now - m.decided_at, "{}", job.record.reason);
                    if o.effects.contains(&Effect::WakeTarget) {
                        self.wakers.wake(&m.from);
                    }
                    job.record.updated_at = now;
                    self.save(&job)?;
                }
                Moving::Stopping if m.sla && job.record.state != JobState::Running => {
                    if m.stop_by.is_some_and(|by| now >= by) {
                        // It never ran there: re-placed anyway, its copy
                        // there fenced by the epoch (reports are stale,
                        // a lease is never granted to it).
                        let o = transition(&life_of(&job), &Event::Died { resumable: true, epoch: None });
                        if o.life.state != JobState::Queued {
                            continue;
                        }
                        set_life(&mut job, &o.life);
                        let late = format!("{} did not confirm its cancel within {:.0} s", m.from, m.stop_deadline_s);
                        self.sla_forget(&mut job, &m.from, &late, "re-placing it elsewhere anyway")?;
                        job.record.reason = format!("re-placing: {late} ({})", m.why);
                        self.assign(&mut job, now);
                        super::refresh_complete(&mut job);
                        self.save(&job)?;
                    }
                }
                Moving::Stopping => {
                    if m.stop_by.is_some_and(|by| now >= by) {
                        let why = format!(
                            "it did not confirm the stop for its planned move within {:.0} s",
                            m.stop_deadline_s
                        );
                        job.prefer = Some(m.to.clone());
                        self.died(&mut job, &why, None, false, now)?;
                    }
                }
                Moving::No => {}
            }
        }
        Ok(())
    }

    /// The run a planned move stopped has ended: note it on the job's
    /// stderr, forget the run (its epoch is stale from now on) and place
    /// the job again, at the move's target when it can take it. Saves.
    pub(super) fn carry_planned_move(
        &mut self,
        job: &mut Job,
        planned: Option<PlannedMove>,
        old_epoch: u64,
        final_stdout_len: Option<u64>,
        now: f64,
    ) -> Result<(), StoreError> {
        let id = job.record.fleet_job_id.clone();
        let from = job.record.target.clone().unwrap_or_default();
        if let Some(m) = planned.as_ref().filter(|m| m.sla) {
            // A provisioning-SLA re-placement: the cancelled run never
            // counted as a move of a running job.
            let why = m.why.strip_prefix("provisioning SLA: ").unwrap_or(&m.why).to_string();
            self.sla_forget(job, &from, &why, "cancelled there, re-placing it elsewhere")?;
            job.record.reason = format!("re-placing: {why}");
            job.record.updated_at = now;
            tracing::info!(job = %id, from = %from, epoch = old_epoch, "{}", job.record.reason);
            self.assign(job, now);
            super::refresh_complete(job);
            self.save(job)?;
            return Ok(());
        }
        let (to, why) = planned.map(|m| (m.to, m.why)).unwrap_or_default();
        job.left.push((old_epoch, from.clone()));
        job.record.remote_job_id = None;
        job.record.node_list.clear();
        job.running_since = None;
        job.record.migrations += 1;
        job.record.target = None;
        job.record.exit_code = None;
        job.record.signal = None;
        job.avoid = Some(from.clone());
        job.prefer = Some(to.clone());
        if let Some(f) = job.last_move.as_mut() {
            f.stopped_at = Some(now);
        }
        if let Some(lost) = final_stdout_len.and_then(|f| f.checked_sub(job.record.stdout_len)).filter(|l| *l > 0) {
            tracing::warn!(job = %id, bytes = lost, "the stopped run's last stdout bytes had not arrived; they are dropped");
        }
        let how = match self.resume_point(&id, &to)? {
            Some(p) => format!("resuming from checkpoint {} ({})", p.checkpoint.seq, p.checkpoint.url),
            None => "restarting from the start (no valid checkpoint; the job is interruptible)".into(),
        };
        let note =
            format!("fleet: run {old_epoch} of job {id} at {from} stopped for a planned move to {to} ({why}); {how}");
        self.metrics.placement("move");
        self.note_stderr(job, &note)?;
        job.record.reason = format!("moved off {from} (epoch {old_epoch}): planned move to {to} ({why}); {how}");
        job.record.stdout_base = job.record.stdout_len;
        job.record.stderr_base = job.record.stderr_len;
        job.final_stdout_len = None;
        job.final_stderr_len = None;
        job.record.updated_at = now;
        tracing::info!(job = %id, from = %from, to = %to, epoch = old_epoch, "{}", job.record.reason);
        self.assign(job, now);
        super::refresh_complete(job);
        self.save(job)?;
        Ok(())
    }

    /// Moves in progress, and moves whose job has not run at its target
    /// yet or ran there within the last hour, newest first.
    pub fn moves(&self, now: f64) -> Result<Vec<MoveStatus>, StoreError> {
        let mut jobs =
            self.query("SELECT data FROM jobs WHERE json_extract(data, '$.last_move') IS NOT NULL ORDER BY id", [])?;
        jobs.sort_by(|a, b| {
            let t = |j: &Job| j.last_move.as_ref().map_or(0.0, |f| f.decided_at);
            t(b).total_cmp(&t(a))
        });
        let mut out = Vec::new();
        for j in jobs {
            let Some(f) = &j.last_move else { continue };
            if f.running_at.is_some_and(|r| now - r > 3600.0) {
                continue;
            }
            let phase = match (&j.planned, f.stopped_at, f.running_at) {
                (Some(m), _, _) if m.phase == Moving::Checkpointing => "checkpointing",
                (Some(_), _, _) => "stopping",
                (None, _, Some(_)) => "running",
                (None, Some(_), None) if !j.record.state.is_terminal() => "placed",
                _ => "ended",
            };
            out.push(MoveStatus {
                fleet_job_id: j.record.fleet_job_id.clone(),
                from: f.from.clone(),
                to: f.to.clone(),
                phase: phase.to_string(),
                decided_at: f.decided_at,
                checkpoint_wait_s: f.checkpoint_wait_s,
                decision_to_running_s: f.running_at.map(|r| r - f.decided_at),
            });
        }
        Ok(out)
    }
}
