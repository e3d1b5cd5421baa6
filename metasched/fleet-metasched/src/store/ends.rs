//! A run's own claim that its script ended (`POST /v1/jobs/{id}/end`,
//! sent by `fleet-ckpt lease-exec` with the run's checkpoint token when
//! the script exits), and what it changes for a silent cluster.
//!
//! The claim is only a claim: the target agent's report stays the
//! authority for the job's final state and output, and the claim is taken
//! only for the job's current epoch from the cluster that runs it. Its
//! uses: a run that said it ended is not moved when its cluster goes
//! silent past its grace period (moving it would run its work again, from
//! its last checkpoint); its agent's report is waited for. If the cluster
//! stays silent `[health] end_wait_s` past its grace period, the job ends
//! with the claimed exit status and one line on its stderr saying that
//! output after that point was not relayed — unless the end came after
//! Slurm's kill of the whole step (`killed_end`: then a timeout at the
//! time limit, else a death). And a report that the run died with its
//! node, or completed after such a kill, is read with the claim
//! (`claimed_signal`, `killed_success`, `timed_out`).

use fleet_api::api::{EndCause, RunEndClaim, RunEndReply};
use fleet_api::JobState;
use serde::{Deserialize, Serialize};

use super::{life_of, refresh_complete, reply_result, set_life, Caller, Job, Store, StoreError};
use crate::lifecycle::{self, transition, Effect, Event, SilentRun};

/// The end a run claimed (kept on the job, for its epoch).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EndClaim {
    pub epoch: u64,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Slurm's kill of the whole step came before the end
    /// ([`RunEndClaim::after_signal`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_signal: Option<i32>,
    /// When the claim arrived (Unix seconds).
    pub at: f64,
}

impl EndClaim {
    fn success(&self) -> bool {
        self.exit_code == Some(0) && self.signal.is_none_or(|s| s == 0)
    }

    pub(super) fn describe(&self) -> String {
        let how = match (self.signal.filter(|s| *s > 0), self.exit_code) {
            (Some(s), _) => format!("signal {s}"),
            (None, Some(c)) => format!("exit code {c}"),
            (None, None) => "no exit status".into(),
        };
        match self.after_signal {
            Some(k) => format!("{how} after signal {k} to the whole step"),
            None => how,
        }
    }
}

/// Whether the end `job`'s run claimed for epoch `epoch` (`None`: the
/// current one) was by a signal, or came once Slurm's kill of the whole
/// step began (a script that caught SIGTERM and exited, or went on to exit
/// when its child died of it): when Slurm at the target requeued the run,
/// or its node was taken away, and no user sent it, that is Slurm's kill,
/// not the script's own end (`StatusUpdate::slurm_requeued`, `disrupted`).
pub(super) fn claimed_signal(job: &Job, epoch: Option<u64>) -> bool {
    job.end_claim
        .as_ref()
        .filter(|c| c.epoch == epoch.unwrap_or(job.record.epoch))
        .is_some_and(|c| c.signal.is_some_and(|s| s > 0) || c.after_signal.is_some())
}

/// How far before its time limit (seconds) a run's end after Slurm's
/// SIGTERM is still taken as the time limit's kill: the meta-scheduler
/// learns a start from its agent's report, after the start itself, and
/// slurmctld enforces a limit only at or after it.
pub(super) const TIME_LIMIT_SLACK_S: f64 = 30.0;

/// The signal Slurm's kill of a job at its time limit begins with.
const SIGTERM: i32 = 15;

/// What an end claimed by a run at a cluster that never reported it was.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum KilledEnd {
    /// The script's own end (no kill of the whole step came first, or its
    /// user had a signal sent in this epoch): it stands as claimed.
    Own,
    /// Slurm's SIGTERM at the run's time limit (`minutes`) came first:
    /// the job timed out, as Slurm would have said.
    TimeLimit { minutes: u32 },
    /// Slurm's kill of the whole step by `signal` came first, at no time
    /// limit and on no user's request (a requeue, a preemption, a node
    /// taken away): the run died, as with its node.
    Killed { signal: i32 },
}

/// [`KilledEnd`] for claim `c` of a run first reported running at
/// `running_since` (Unix seconds), under `time_limit_min`; `signalled`:
/// a signal was queued for that run (`Job::signalled`).
pub(super) fn killed_end(
    c: &EndClaim,
    running_since: Option<f64>,
    time_limit_min: Option<u32>,
    signalled: bool,
) -> KilledEnd {
    let Some(signal) = c.after_signal.filter(|_| !signalled) else { return KilledEnd::Own };
    match (running_since, time_limit_min) {
        (Some(t), Some(m)) if signal == SIGTERM && c.at - t >= f64::from(m) * 60.0 - TIME_LIMIT_SLACK_S => {
            KilledEnd::TimeLimit { minutes: m }
        }
        _ => KilledEnd::Killed { signal },
    }
}

/// The signal of a kill of the whole step, on no one's request, that the
/// run of `epoch` (`None`: the current one) claimed its script's end came
/// after, when its target now reports it completed: a pod whose script
/// caught the SIGTERM of an eviction or a preemption and exited 0 leaves a
/// `Complete` Job, and an agent that did not see the pod taken away (it
/// was down, or restarted since) reports just that; a host shut down
/// under a Slurm job stops it the same way. Not the job's end. `None`
/// when its user or a planned move had a signal sent in that epoch
/// (`Job::signalled`), or the job is being cancelled or moved.
pub(super) fn killed_success(job: &Job, epoch: Option<u64>) -> Option<i32> {
    let c = current_claim(job, epoch)?;
    let busy = job.signalled == Some(c.epoch) || job.record.cancel_requested || job.planned.is_some();
    c.after_signal.filter(|_| !busy && c.exit_code == Some(0))
}

/// The time limit (minutes) whose kill the end claimed by the run of
/// `epoch` (`None`: the current one) came after ([`KilledEnd::TimeLimit`]).
pub(super) fn timed_out(job: &Job, epoch: Option<u64>) -> Option<u32> {
    let c = current_claim(job, epoch)?;
    match killed_end(c, job.running_since, job.request.time_limit_min, job.signalled == Some(c.epoch)) {
        KilledEnd::TimeLimit { minutes } => Some(minutes),
        _ => None,
    }
}

/// The end `job`'s current run claimed, for a report of epoch `epoch`
/// (`None`: the current one; another epoch's report has none).
fn current_claim(job: &Job, epoch: Option<u64>) -> Option<&EndClaim> {
    job.end_claim.as_ref().filter(|c| c.epoch == job.record.epoch && epoch.is_none_or(|e| e == c.epoch))
}

/// Whether `job`'s current run claimed its end.
pub(super) fn claimed(job: &Job) -> bool {
    current_claim(job, None).is_some()
}

/// The end `job`'s current run claimed, for a report of epoch `epoch`
/// (`None`: the current one): the state it ends in and how, in words.
pub(super) fn claimed_end(job: &Job, epoch: Option<u64>) -> Option<(JobState, String)> {
    let c = current_claim(job, epoch)?;
    Some((if c.success() { JobState::Completed } else { JobState::Failed }, c.describe()))
}

impl Store {
    /// `POST /v1/jobs/{id}/end`: the run's script ended (a claim).
    pub fn run_end(
        &mut self,
        caller: &Caller,
        id: &str,
        claim: &RunEndClaim,
        now: f64,
    ) -> Result<RunEndReply, StoreError> {
        let cluster = match caller {
            Caller::Checkpointer { id: jid, cluster } if jid == id => cluster.clone(),
            Caller::Cluster(c) => c.clone(),
            Caller::Checkpointer { .. } => {
                return Err(StoreError::Unauthorized("checkpoint token does not match this job".into()))
            }
            _ => {
                return Err(StoreError::Forbidden(
                    "only a run (its checkpoint token) or its cluster claims its end".into(),
                ))
            }
        };
        if claim.exit_code.is_some_and(|c| !(0..=255).contains(&c))
            || claim.signal.is_some_and(|s| !(0..=64).contains(&s))
            || claim.after_signal.is_some_and(|s| !(1..=64).contains(&s))
        {
            return Err(StoreError::BadRequest(format!(
                "exit_code must be in [0, 255], signal in [0, 64] and after_signal in [1, 64] (got {:?}, {:?}, {:?})",
                claim.exit_code, claim.signal, claim.after_signal
            )));
        }
        let mut job = self.load(id)?;
        if job.record.target.as_deref() != Some(cluster.as_str()) {
            return Ok(RunEndReply {
                recorded: false,
                reason: format!(
                    "the job is now epoch {} ({}{}): this run's end does not count",
                    job.record.epoch,
                    job.record.state,
                    job.record.target.as_deref().map(|t| format!(" at {t}")).unwrap_or_default()
                ),
            });
        }
        let o = transition(&life_of(&job), &Event::EndClaimed { epoch: claim.epoch });
        if let Err(e) = reply_result(id, &o.reply) {
            return match e {
                StoreError::Conflict { msg, .. } => Ok(RunEndReply { recorded: false, reason: msg }),
                e => Err(e),
            };
        }
        if !o.effects.contains(&Effect::RecordEndClaim) {
            return Ok(RunEndReply {
                recorded: false,
                reason: format!("the job has already ended ({})", job.record.state),
            });
        }
        // Whose end it was. A run its watchdog stopped says so (`lease`):
        // no end of its own. A run that says `script` knows it, even in the
        // last moment of its lease: lease-exec and the watchdog decide it
        // once, whoever first creates the run's `.fleet-run-end-cause`,
        // lease-exec after it reaped the script and the watchdog before it
        // sends any signal (docs/failover.md, "A run that ended"). A claim
        // that says neither (a lease-exec before `cause`, or one without a
        // writable run directory to decide in) may be the lease's doing
        // when it comes from a second before the lease the run surely held
        // ran out (the watchdog stops the run when the lease it holds ends,
        // counted from before each renewal was sent, and the reply to its
        // last one may have been lost: the lease held before it): not taken
        // as the script's own.
        let held = self.lease_prev_until.get(id).or_else(|| self.lease_until.get(id)).copied();
        let left = held.filter(|(e, _)| *e == claim.epoch).map(|(_, until)| until - now);
        match (claim.cause, left) {
            (Some(EndCause::Lease), _) => {
                tracing::info!(job = id, epoch = claim.epoch, at = %cluster, left_s = ?left,
                    "its run says its lease watchdog stopped it: no end of its own");
                return Ok(RunEndReply {
                    recorded: false,
                    reason: "its lease watchdog stopped it: no end of its own".into(),
                });
            }
            (None, Some(left)) if left <= super::LEASE_CLAIM_SLACK_S => {
                tracing::info!(job = id, epoch = claim.epoch, at = %cluster, left_s = left,
                    "its run's end claim is refused: its job lease ran out or was about to, and the claim does not say whose end it was");
                return Ok(RunEndReply {
                    recorded: false,
                    reason: format!(
                        "its job lease ran out (or was about to: {left:.1} s left): this end may be its lease's doing"
                    ),
                });
            }
            (Some(EndCause::Script), Some(left)) if left <= super::LEASE_CLAIM_SLACK_S => {
                tracing::info!(job = id, epoch = claim.epoch, at = %cluster, left_s = left,
                    "its run claims its script ended on its own as its job lease ran out: taken");
            }
            _ => {}
        }
        let c = EndClaim {
            epoch: claim.epoch,
            exit_code: claim.exit_code,
            signal: claim.signal,
            after_signal: claim.after_signal,
            at: now,
        };
        tracing::info!(job = id, epoch = c.epoch, at = %cluster, end = %c.describe(), "its run claims its script ended");
        job.end_claim = Some(c);
        self.save(&job)?;
        Ok(RunEndReply { recorded: true, reason: String::new() })
    }

    /// A run at a silent cluster, `past_grace_s` beyond its grace period:
    /// moved (the ordinary dead-run path), kept (its script claimed its
    /// end: its agent's report is waited for), or, past the end-wait
    /// bound, ended as claimed. Saves the job when it changes.
    pub(super) fn silent_past_grace(
        &mut self,
        job: &mut Job,
        why: &str,
        past_grace_s: f64,
        now: f64,
    ) -> Result<(), StoreError> {
        let claim = job.end_claim.clone().filter(|_| claimed(job));
        match lifecycle::silent_run(&life_of(job), claim.is_some(), past_grace_s, self.end_wait_s) {
            SilentRun::Died => {
                self.died(job, why, None, false, now)?;
            }
            SilentRun::Wait => {}
            SilentRun::Finish => {
                let Some(c) = claim else { return Ok(()) };
                let signalled = job.signalled == Some(c.epoch);
                match killed_end(&c, job.running_since, job.request.time_limit_min, signalled) {
                    KilledEnd::Own => self.finish_from_claim(job, &c, None, why, now)?,
                    KilledEnd::TimeLimit { minutes } => self.finish_from_claim(job, &c, Some(minutes), why, now)?,
                    KilledEnd::Killed { signal } => {
                        // Native Slurm runs such a job again or fails it by
                        // its requeue policy: the ordinary dead-run path.
                        let why = format!(
                            "{why}; its script ended ({}) once Slurm there began to kill it with signal {signal}, \
                             at no time limit and on no user's request",
                            c.describe()
                        );
                        self.died(job, &why, None, false, now)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// The claimed end stands (`timed_out`: the time limit, in minutes,
    /// whose kill it was: the job ends as `TIMEOUT`, as Slurm says).
    fn finish_from_claim(
        &mut self,
        job: &mut Job,
        c: &EndClaim,
        timed_out: Option<u32>,
        why: &str,
        now: f64,
    ) -> Result<(), StoreError> {
        let success = c.success() && timed_out.is_none();
        let o = transition(&life_of(job), &Event::ClaimedEndStands { success });
        if !o.effects.contains(&Effect::FinishFromClaim) {
            return Ok(());
        }
        let id = job.record.fleet_job_id.clone();
        let at = job.record.target.clone().unwrap_or_default();
        set_life(job, &o.life);
        job.record.exit_code = c.exit_code;
        job.record.signal = c.signal;
        job.record.updated_at = now;
        let limit = timed_out.map(|m| format!(" at its time limit of {m} min")).unwrap_or_default();
        let note = format!(
            "fleet: run {} of job {id} at {at} said its script ended ({}){limit}, but {at} never reported it ({why}); \
             output after that point was not relayed",
            c.epoch,
            c.describe()
        );
        tracing::warn!(job = %id, at = %at, epoch = c.epoch, timed_out = ?timed_out,
            "ended as its run claimed: its cluster never came back");
        self.note_stderr(job, &note)?;
        job.record.reason = match timed_out {
            // The first word names Slurm's end, as a reported TIMEOUT's
            // does: the stand-in ends TIMEOUT too.
            Some(m) => format!(
                "TIMEOUT at {at}: its run claimed its script ended ({}) at its time limit of {m} min; {at} never reported it",
                c.describe()
            ),
            None => format!("{} as its run at {at} claimed ({}); {at} never reported it", o.life.state, c.describe()),
        };
        job.final_stdout_len = Some(job.record.stdout_len);
        job.final_stderr_len = Some(job.record.stderr_len);
        self.lease_until.remove(&id);
        self.lease_prev_until.remove(&id);
        self.awaiting_lease.remove(&id);
        refresh_complete(job);
        self.save(job)?;
        debug_assert!(job.record.state.is_terminal() && job.record.state != JobState::Lost);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_end_after_slurms_kill_is_the_time_limit_a_death_or_the_scripts_own() {
        let claim = |after_signal, at| EndClaim { epoch: 1, exit_code: Some(0), signal: None, after_signal, at };
        // Started (as reported) at 1000 under a 10-minute limit.
        let judge = |c: &EndClaim, limit, signalled| killed_end(c, Some(1000.0), limit, signalled);
        // No kill came first: the script's own end, whatever the time.
        assert_eq!(judge(&claim(None, 1700.0), Some(10), false), KilledEnd::Own);
        // SIGTERM at the limit (or within the report's lag before it): TIMEOUT.
        for at in [1600.0, 1570.0, 9999.0] {
            assert_eq!(judge(&claim(Some(15), at), Some(10), false), KilledEnd::TimeLimit { minutes: 10 }, "{at}");
        }
        // Before it, or with no limit, or by SIGKILL: Slurm's kill, a death.
        assert_eq!(judge(&claim(Some(15), 1569.0), Some(10), false), KilledEnd::Killed { signal: 15 });
        assert_eq!(judge(&claim(Some(15), 1700.0), None, false), KilledEnd::Killed { signal: 15 });
        assert_eq!(judge(&claim(Some(9), 1700.0), Some(10), false), KilledEnd::Killed { signal: 9 });
        // Never reported running: no limit can be judged.
        assert_eq!(killed_end(&claim(Some(15), 1700.0), None, Some(10), false), KilledEnd::Killed { signal: 15 });
        // A signal its user had sent in this epoch: the end may be theirs.
        assert_eq!(judge(&claim(Some(15), 1100.0), Some(10), true), KilledEnd::Own);
    }
}
