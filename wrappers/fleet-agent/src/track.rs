//! Jobs this cluster runs for the fleet, one reconcile per job.
//!
//! Each pass reads Slurm once (`squeue --json` for every journaled id, and
//! accounting for the ids the queue forgot), then reconciles each job on
//! its own: relay new output, report a state change, finish. An error in
//! one job (a refused update, an unreadable file) backs that job off
//! exponentially and never stops the others (the controller-rs error
//! policy). A 409 from the meta-scheduler is final for that update: the
//! job's record there is authoritative and the agent stops reporting it.
//!
//! Identity: a journaled Slurm id is only trusted together with the submit
//! time and owner Slurm reported on first sight. An id that slurmctld
//! handed to another job after a crash, or that no longer exists, ends the
//! fleet job as `lost` with the reason; it never lends another job's state,
//! exit code or output.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fleet_api::api::{
    Assignment, FenceRequest, OutputChunk, RunEpoch, StartCheck, StartConfirmation, StatusUpdate, Stream,
};
use fleet_api::JobState;

use crate::backend::{Backend, NativeJob};
use crate::client::Conflict;
use crate::journal::Run;
use crate::{jobdir, now, Agent, CHUNK};

/// How long a first sighting may precede the agent's own sbatch call
/// (clock steps between the agent and slurmctld).
const SUBMIT_SLACK_S: f64 = 120.0;

/// How long a started run Slurm no longer knows is watched before it is
/// reported lost: slurmctld, restarted from a state saved before it took
/// the job, forgets a job whose script runs on at its node (slurmd outlives
/// the controller). Within this the script either ends by itself (its end
/// note is then the result) or is killed as an orphan when its slurmd
/// registers again (seconds after the controller is back).
pub const FORGOTTEN_GRACE_S: f64 = 90.0;

/// Per-job backoff after errors, and what was seen of each job between
/// passes.
#[derive(Default)]
pub struct Tracker {
    failures: HashMap<String, (u32, f64)>,
    /// Jobs whose output was refused (link, FIFO, foreign owner): warned once.
    refused: HashMap<String, String>,
    /// Started runs Slurm no longer knows: since when.
    forgotten: HashMap<String, f64>,
}

impl Tracker {
    /// Notes that Slurm no longer knows the started run `id`: for how
    /// many seconds it has not known it (0 at the first sighting).
    fn forgotten_for(&mut self, id: &str, now: f64) -> f64 {
        now - *self.forgotten.entry(id.to_string()).or_insert(now)
    }

    /// Slurm knows the run (again), or it was reported: the grace starts over.
    fn known(&mut self, id: &str) {
        self.forgotten.remove(id);
    }

    fn due(&self, id: &str, now: f64) -> bool {
        self.failures.get(id).is_none_or(|&(_, at)| now >= at)
    }

    fn ok(&mut self, id: &str) {
        self.failures.remove(id);
    }

    /// Records a failure; returns the delay before the next try (1 s
    /// doubling to 60 s).
    fn failed(&mut self, id: &str, now: f64) -> Duration {
        let n = self.failures.get(id).map_or(0, |f| f.0) + 1;
        let d = Duration::from_secs((1u64 << (n - 1).min(6)).min(60));
        self.failures.insert(id.to_string(), (n, now + d.as_secs_f64()));
        d
    }
}

/// Work items handled recently: a long poll that hands back the same cancel
/// or start check before it took effect does not repeat the action.
#[derive(Default)]
pub struct Recent {
    seen: HashMap<String, Instant>,
}

impl Recent {
    const HOLD: Duration = Duration::from_secs(10);

    pub fn fresh(&mut self, key: &str) -> bool {
        let now = Instant::now();
        self.seen.retain(|_, t| now.duration_since(*t) < Self::HOLD);
        if self.seen.contains_key(key) {
            return false;
        }
        self.seen.insert(key.to_string(), now);
        true
    }
}

/// What Slurm says of a journaled run.
#[derive(Debug, PartialEq)]
pub enum Seen<'a> {
    Job(&'a NativeJob),
    /// Not this job any more (or not at all): why.
    Gone(String),
}

/// Picks the job that *is* `run` among what Slurm reported for its id.
///
/// The run's private working directory (`dir`, which names the fleet job)
/// tells it apart from a job that reused its id: Slurm keeps a job's
/// directory across requeues, which change its submit time. Only rows
/// without a directory (older accounting) fall back to the submit time.
pub fn identify<'a>(run: &Run, site: &str, dir: &str, candidates: &[&'a NativeJob]) -> Seen<'a> {
    let Some(sid) = run.slurm_id else {
        return Seen::Gone("never submitted".into());
    };
    let mine: Vec<&NativeJob> =
        candidates.iter().copied().filter(|j| run.uid.is_none_or(|u| j.user_id == Some(u))).collect();
    // The directory names the fleet job; of its rows (sacct -D lists a
    // requeued job's earlier runs too) the latest run is what it is now.
    let found =
        mine.iter().copied().filter(|j| j.work_dir == dir).max_by_key(|j| (j.restarts, j.submit_time)).or_else(|| {
            let undirected = mine.iter().copied().filter(|j| j.work_dir.is_empty());
            match run.submit_time {
                // Slurm gives a requeued job a new submit time (22.05 and 24.11
                // alike: tests/fixtures/slurm-*/), with a higher restart count:
                // that is still this job. A reused id starts again at 0
                // restarts, so it is never taken for a requeue.
                Some(t) => undirected
                    .filter(|j| {
                        j.submit_time == Some(t)
                            || (j.restarts > run.restarts && j.submit_time.is_some_and(|st| st >= t))
                    })
                    .max_by_key(|j| (j.restarts, j.submit_time)),
                None => undirected
                    .filter(|j| j.submit_time.is_some_and(|st| st as f64 >= run.submitted_at - SUBMIT_SLACK_S))
                    .max_by_key(|j| j.submit_time),
            }
        });
    match found {
        Some(j) => Seen::Job(j),
        None if candidates.is_empty() => Seen::Gone(format!("Slurm at {site} no longer knows job {sid} (lost in a controller failure or purged)")),
        None => Seen::Gone(format!(
            "Slurm job {sid} at {site} is now another job (the id was reused after a controller failure): this job was lost"
        )),
    }
}

/// The update that reports `j`.
pub fn update_for(j: &NativeJob, site: &str) -> StatusUpdate {
    let mut reason = j.reason.clone();
    // The outcomes a researcher must tell apart (TIMEOUT, OUT_OF_MEMORY,
    // NODE_FAIL, PREEMPTED, BOOT_FAIL, DEADLINE) keep Slurm's own name.
    if j.state.is_terminal() && !matches!(j.raw_state.as_str(), "COMPLETED" | "FAILED") {
        reason = if reason.is_empty() {
            format!("{} at {site}", j.raw_state)
        } else {
            format!("{} at {site}: {reason}", j.raw_state)
        };
    }
    if j.restarts > 0 {
        reason =
            format!("{reason}{}requeued {} time(s) at {site}", if reason.is_empty() { "" } else { "; " }, j.restarts);
    }
    // A limit there that will never let it start (Slurm's own reason,
    // which only slurmctld sets).
    let held_by_limit = match (j.state, crate::slurm::held_by_limit(&j.reason)) {
        (JobState::Pending, Some(what)) => {
            Some(format!("Slurm at {site} keeps it pending ({}): {what}", j.reason.trim()))
        }
        _ => None,
    };
    StatusUpdate {
        remote_job_id: Some(j.native_id),
        state: Some(j.state),
        exit_code: j.exit_code,
        signal: j.signal,
        held_by_limit,
        died: died(j, site),
        reason,
        node_list: j.node_list.clone(),
        time_limit_min: j.time_limit_min,
        ..Default::default()
    }
}

/// Why a run Slurm held after a failed launch is reported as died.
fn launch_failed_why(site: &str) -> String {
    format!("Slurm at {site} held it after a failed launch (launch failed requeued held)")
}

/// What the run's directory and relay say of a run Slurm held after a
/// launch it took for failed (`launch failed requeued held`), or forgot in
/// a controller crash. Slurm decides a launch failed when slurmd does not
/// answer its launch request in time (killed, restarted, overloaded), or
/// finds a batch job missing from its node after a restart of slurmctld:
/// the script may have started all the same, and even ended; slurmctld
/// then kills what it finds of a job it holds pending (SIGTERM, then
/// SIGKILL), when the node registers again.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LaunchEvidence {
    /// The run's script ended, as its `lease-exec` noted (for this run:
    /// Slurm job, restart count and epoch): its exit code and signal, and
    /// whether Slurm's kill of the step came first.
    pub ended: Option<crate::ckpt::NotedEnd>,
    /// This agent delivered a signal to the run on its user's request
    /// (`scancel --signal` at the origin): an end by a signal is theirs.
    pub user_signalled: bool,
    /// `lease-exec` noted that it started the script (after its first lease).
    pub started_note: bool,
    /// The run was submitted under its in-job lease (then the script
    /// starts only after `lease-exec`'s start note).
    pub under_lease: bool,
    /// Bytes of the run's stdout and stderr relayed so far.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Whether the run's stdout file exists (slurmstepd creates it just
    /// before it starts the batch script).
    pub stdout_exists: bool,
}

/// What a run held after a failed launch (or forgotten) did.
#[derive(Clone, Debug, PartialEq)]
pub enum LaunchVerdict {
    /// Its script ended by itself (an exit code; or a signal its user had
    /// this agent deliver): that end is its result.
    Ended { exit_code: Option<i32>, signal: Option<i32> },
    /// Its script started (or may have) and did not end by itself: no end
    /// noted, or `killed_by` a signal no user asked for (Slurm's own kill
    /// of a job it requeued). Slurm requeued it: it runs again.
    Started { killed_by: Option<i32> },
    /// Nothing of it started: placing it again runs nothing twice.
    NeverStarted,
}

/// Judges a run Slurm held after a failed launch from what it left. Under
/// its in-job lease the script starts only after `lease-exec` noted it
/// (what `lease-exec` prints on stderr when it refuses to start is not the
/// script's); without one, any output, or a stdout file slurmstepd made,
/// counts as a start: only a run that left nothing at all never started.
/// An end by a signal counts as the script's own end only when its user
/// had a signal delivered: otherwise the signal is Slurm's (it kills the
/// job it has just requeued), and native Slurm would run the job again.
pub fn launch_verdict(e: &LaunchEvidence) -> LaunchVerdict {
    if let Some(end) = e.ended {
        return match (end.signal, end.after_signal) {
            (signal, _) if e.user_signalled => LaunchVerdict::Ended { exit_code: end.exit_code, signal },
            (None, None) => LaunchVerdict::Ended { exit_code: end.exit_code, signal: None },
            // Killed, or ended once Slurm's kill of the step began (its
            // child died of it, or it caught it and exited).
            (Some(s), _) | (None, Some(s)) => LaunchVerdict::Started { killed_by: Some(s) },
        };
    }
    let started = if e.under_lease {
        e.started_note || e.stdout_bytes > 0
    } else {
        e.started_note || e.stdout_bytes > 0 || e.stderr_bytes > 0 || e.stdout_exists
    };
    if started {
        LaunchVerdict::Started { killed_by: None }
    } else {
        LaunchVerdict::NeverStarted
    }
}

/// The signal of Slurm's kill of the whole step that a noted end came
/// during (`lease-exec`'s sentinel saw it first), unless its user had a
/// signal delivered to the run: then it may be theirs. An end by a signal
/// alone is no sign of it (the kernel's OOM killer, the script's own
/// `kill`).
pub fn slurms_kill(end: &crate::ckpt::NotedEnd, user_signalled: bool) -> Option<i32> {
    end.after_signal.filter(|_| !user_signalled)
}

/// What becomes of a started run Slurm no longer knows, whose script
/// noted no end of its own.
#[derive(Debug, PartialEq)]
pub enum Forgotten {
    /// Not reported yet: its script may still run at its node (slurmd
    /// outlives slurmctld), and its own end would be its result.
    Wait,
    /// It died with its controller, as with a failed node: the
    /// meta-scheduler takes its script's claimed end if it made one (an
    /// exit it reported before it was lost), else moves it or ends it by
    /// its restart policy. Only under its job lease, which stops a copy
    /// still running there once the job is placed again.
    Died,
    /// Reported lost (or, stopped by this agent, as it stopped it).
    Lost,
}

/// [`Forgotten`] for a run: `killed_by` a signal no user sent, stopped by
/// this agent (`fenced`), `under_lease`, unknown to Slurm for `forgotten_s`.
pub fn forgotten_outcome(killed_by: Option<i32>, fenced: bool, under_lease: bool, forgotten_s: f64) -> Forgotten {
    if fenced {
        Forgotten::Lost
    } else if killed_by.is_none() && forgotten_s < FORGOTTEN_GRACE_S {
        Forgotten::Wait
    } else if under_lease {
        Forgotten::Died
    } else {
        Forgotten::Lost
    }
}

/// Did the job die with (part of) its cluster rather than end by itself?
/// Then the meta-scheduler moves it instead of ending it: a node failure
/// or a preemption Slurm did not requeue, or a launch failure after which
/// Slurm holds the job (`launch failed requeued held`, which no one here
/// would release).
pub fn died(j: &NativeJob, site: &str) -> Option<String> {
    match j.raw_state.as_str() {
        // With what the backend says of it (Kubernetes: the pod's
        // DisruptionTarget condition); Slurm leaves it empty for these.
        _ if disruption(j) && !j.description.is_empty() => {
            Some(format!("{} at {site}: {}", j.raw_state, j.description))
        }
        _ if disruption(j) => Some(format!("{} at {site}", j.raw_state)),
        _ if j.state == JobState::Pending && launch_failed_held(j) => Some(launch_failed_why(site)),
        _ => None,
    }
}

/// Slurm's (or the Kubernetes backend's) word that the job died with its
/// node: what [`died`] reports other than a held launch.
fn disruption(j: &NativeJob) -> bool {
    matches!(j.raw_state.as_str(), "NODE_FAIL" | "PREEMPTED" | "BOOT_FAIL")
}

/// A job Slurm requeued and held after its launch failed: a state
/// description only slurmctld sets (users cannot write it).
fn launch_failed_held(j: &NativeJob) -> bool {
    j.description.contains("launch failed requeued held")
}

/// Output streams in [`Run::rerun_out`].
pub const OUT_STDOUT: u8 = 1;
pub const OUT_STDERR: u8 = 2;

/// The streams that hold output of the current incarnation: their restart
/// is still to come when Slurm runs the job again.
fn streams_with_output(run: &Run) -> u8 {
    (if run.stdout_off > 0 { OUT_STDOUT } else { 0 }) | (if run.stderr_off > 0 { OUT_STDERR } else { 0 })
}

/// Did Slurm run `run` again since the agent last looked at `j`? Counts
/// each re-run once in `run.reruns` (with how it was seen in
/// `run.rerun_why`) and keeps the incarnation the agent knows
/// (`run.run_start`) up to date; returns whether it counted one. A re-run
/// shows as a higher `RestartCnt` (`scontrol requeue`, a requeue after a
/// node failure), or, where Slurm does not count it (a slurmctld that
/// recovered from older state launches the job again), as a run back to
/// pending after it started, or a later start time. A hold after a failed
/// launch is a dead run (`died`), not a re-run. `run.restarts` is the
/// count before this look (the caller records the new one).
pub fn observe_rerun(run: &mut Run, j: &NativeJob) -> bool {
    let waiting = matches!(j.raw_state.as_str(), "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED")
        && !launch_failed_held(j);
    // Started: running, or ended after it ran (a job cancelled while
    // pending has an end, not a start).
    let started = j.raw_state == "RUNNING" || (j.state.is_terminal() && j.raw_state != "CANCELLED");
    let start = j.start_time.filter(|&t| t > 0).filter(|_| started);
    let why = if j.restarts > run.restarts {
        Some((j.restarts - run.restarts, format!("Slurm requeued it (RestartCnt {} → {})", run.restarts, j.restarts)))
    } else if waiting && run.run_start.is_some() {
        Some((1, format!("it went back to pending after it ran, RestartCnt staying {}", j.restarts)))
    } else {
        match (run.run_start, start) {
            (Some(was), Some(now)) if was > 0 && now > was => {
                Some((1, format!("it started again (start time {was} → {now}), RestartCnt staying {}", j.restarts)))
            }
            _ => None,
        }
    };
    let counted = why.is_some();
    if let Some((n, why)) = why {
        run.reruns = run.reruns.saturating_add(n);
        run.rerun_why = Some(why);
        // The output of the run before is there: its restart is this re-run's.
        run.rerun_out = streams_with_output(run);
    }
    if waiting {
        run.run_start = None;
    } else if started {
        // A requeued job still completing its first run (COMPLETING, the
        // old start) has not started again: only RUNNING or an end is a start.
        run.run_start = Some(start.or(run.run_start.filter(|_| !counted)).unwrap_or(0));
    } else if counted {
        run.run_start = None;
    }
    counted
}

/// Its script started `starts` times (`lease-exec`'s start log): every
/// start after the first is a re-run, seen or not (Slurm may run a job
/// again without counting it, and both runs may pass while the agent is
/// not looking). Raises `run.reruns` to that; returns whether it did.
pub fn starts_rerun(run: &mut Run, starts: u32) -> bool {
    let seen = starts.saturating_sub(1);
    if seen <= run.reruns {
        return false;
    }
    run.reruns = seen;
    run.rerun_why = Some(format!("its script started {starts} times (lease-exec's start log)"));
    // The output of the run before is there: its restart is this re-run's.
    run.rerun_out = streams_with_output(run);
    true
}

/// A stream's output file restarted (shorter than what was relayed): a
/// new incarnation of the run opened it. Counted as a re-run unless the
/// re-run that opened it was counted already ([`observe_rerun`]); returns
/// whether it counted one.
pub fn output_restarted(run: &mut Run, stream: Stream) -> bool {
    let bit = match stream {
        Stream::Stdout => OUT_STDOUT,
        Stream::Stderr => OUT_STDERR,
    };
    if run.rerun_out & bit != 0 {
        run.rerun_out &= !bit;
        return false;
    }
    run.reruns = run.reruns.saturating_add(1);
    run.rerun_why = Some(format!("its {} file restarted (truncated by a new run)", stream.as_str()));
    // The other stream restarts with this run too.
    run.rerun_out = streams_with_output(run) & !bit;
    true
}

/// The epoch to send with a run's reports (`None`: unknown, an older journal).
pub fn epoch_of(run: &Run) -> Option<u64> {
    (run.epoch > 0).then_some(run.epoch)
}

/// Reports a job that could not be launched here.
async fn fail_launch<B: Backend>(agent: &Agent<B>, id: &str, reason: String) -> Result<()> {
    tracing::warn!(%id, "not launched: {reason}");
    let mut run = agent.journal.run(id)?.map(|r| r.0).unwrap_or_default();
    let epoch = epoch_of(&run);
    run.id = id.to_string();
    run.done = true;
    run.reported = Some("failed".into());
    agent.journal.update_run(&run)?;
    let up = StatusUpdate {
        state: Some(JobState::Failed),
        reason,
        final_stdout_len: Some(0),
        final_stderr_len: Some(0),
        epoch,
        ..Default::default()
    };
    match agent.meta.status(id, &up).await {
        Err(e) if e.downcast_ref::<Conflict>().is_some() => Ok(()),
        r => r.map(|_| ()),
    }
}

/// Submit one assigned job, as its submitter's local identity.
///
/// Exactly once across agent crashes: the run is journaled before sbatch,
/// and a journaled run without a Slurm id (the agent died between sbatch
/// and journaling its answer) is first looked for in Slurm by what only
/// this run's sbatch gives a job: its owner, its private working directory
/// and a submit time after the run was journaled. Found, it is adopted;
/// otherwise it is submitted.
pub async fn submit_one<B: Backend>(agent: &Agent<B>, a: Assignment) -> Result<()> {
    let id = a.fleet_job_id.clone();
    let journaled = agent.journal.run(&id)?.map(|r| r.0);
    let attempt = match &journaled {
        Some(_) => agent.journal.attempt(&id)?.unwrap_or(0),
        None => 0,
    };
    // Where a journaled run has no Slurm id, an sbatch may have gone
    // through before a crash: look for it (jobs after this time) first.
    let mut adopt_since = None;
    match &journaled {
        // A rerun (the stand-in was requeued at the origin) of a job that
        // ran here before: once the previous run is fully reported, the row
        // starts over and the job is submitted again.
        Some(run) if a.origin_restart > attempt || (a.epoch > run.epoch && run.epoch > 0) => {
            if !run.done {
                anyhow::bail!(
                    "run {attempt} (epoch {}) is still being reported here; run {} (epoch {}) waits for it",
                    run.epoch,
                    a.origin_restart,
                    a.epoch
                );
            }
            jobdir::remove(&agent.backend.job_dir(&id))?;
            agent.journal.rerun(&id, a.origin_restart, &a.request, a.stdout_base, a.stderr_base)?;
            agent.journal.set_epoch(&id, a.epoch)?;
            tracing::info!(%id, restart = a.origin_restart, epoch = a.epoch, "placed here again: running the job again");
        }
        Some(run) if run.done => return Ok(()),
        // Submitted already (the meta-scheduler did not hear back): report,
        // never submit twice.
        Some(Run { slurm_id: Some(sid), .. }) => return report_submitted(agent, &id, *sid).await,
        Some(run) => adopt_since = Some(run.accepted_at),
        None => {
            agent.journal.add_run(&id, &a.request)?;
            if a.origin_restart > 0 || a.stdout_base > 0 || a.stderr_base > 0 {
                agent.journal.rerun(&id, a.origin_restart, &a.request, a.stdout_base, a.stderr_base)?;
            }
            agent.journal.set_epoch(&id, a.epoch)?;
        }
    }
    let site = &agent.cfg.site;
    // Who jobs run as may change on SIGHUP (Agent::live).
    let policy = agent.live().identity.clone();
    // Through NSS this may wait on the site's directory: not on a runtime
    // thread.
    let user = {
        let (policy, origin, name, account) =
            (policy.clone(), a.request.origin.clone(), a.request.user_name.clone(), a.request.account.clone());
        tokio::task::spawn_blocking(move || {
            crate::identity::Accounts::read()
                .and_then(|acc| policy.resolve(&acc, &origin, name.as_deref(), account.as_deref()))
        })
        .await?
    };
    let user = match user {
        Ok(u) => u,
        Err(e) => {
            let how = crate::identity::describe(&policy.mapping);
            return fail_launch(agent, &id, format!("fleet: {site} has no identity for this job ({how}): {e:#}")).await;
        }
    };
    if let Some(since) = adopt_since {
        // An error here (Slurm unreachable) retries later: better late
        // than twice.
        let found = agent.backend.find_submitted(&id, user.uid, since).await?;
        if let Some(j) = adoptable(&found, since) {
            agent.journal.set_submitted(&id, j.native_id, &user.name, user.uid, since)?;
            tracing::warn!(%id, slurm_id = j.native_id, "adopted the Slurm job an interrupted submission made");
            return report_submitted(agent, &id, j.native_id).await;
        }
        jobdir::remove(&agent.backend.job_dir(&id))?;
    }
    let mut request = a.request.clone();
    request.fleet.resume_from = resume_from(agent, &id, &a, user.uid).await?;
    request.fleet.epoch = a.epoch;
    // Last look before sbatch (a checkpoint copy, other submissions of
    // the same answer, may have taken a while): a placement superseded
    // since it was handed out — the job placed again elsewhere or in a
    // newer epoch, or withdrawn — is never submitted. Unanswered: retried
    // with the assignment.
    let fence = FenceRequest { runs: vec![RunEpoch { fleet_job_id: id.clone(), epoch: a.epoch }] };
    let reply = agent.meta.fence(&fence).await.context("checking the placement is still current before sbatch")?;
    if let Some(why) = superseded(&reply, &id) {
        tracing::warn!(%id, epoch = a.epoch, "placement superseded before its submission, not submitted: {why}");
        if let Some((mut run, _)) = agent.journal.run(&id)? {
            run.done = true;
            agent.journal.update_run(&run)?;
        }
        let _ = jobdir::remove(&agent.backend.job_dir(&id));
        return Ok(());
    }
    match agent.backend.submit(&id, &request, &user).await {
        Ok(sid) => {
            crate::fault::point("exit-after-sbatch");
            agent.journal.set_submitted(&id, sid, &user.name, user.uid, now())?;
            tracing::info!(%id, slurm_id = sid, user = %user.name, origin = %a.request.origin, "submitted");
            report_submitted(agent, &id, sid).await
        }
        Err(e) => {
            let _ = jobdir::remove(&agent.backend.job_dir(&id));
            fail_launch(agent, &id, format!("fleet: sbatch at {site} refused the job: {e:#}")).await
        }
    }
}

/// Why the meta-scheduler's fence answer says the placement of `id` it
/// was asked about is stale (`None`: it is current).
pub fn superseded(reply: &fleet_api::api::FenceReply, id: &str) -> Option<String> {
    reply.stale.iter().find(|s| s.fleet_job_id == id).map(|s| s.reason.clone())
}

/// Of the assignments of one answer, the newest placement of each job
/// (highest epoch), in the answer's order: an older one of the same job is
/// superseded and never submitted.
pub fn newest_placements(all: Vec<Assignment>) -> Vec<Assignment> {
    let mut newest: HashMap<String, u64> = HashMap::new();
    for a in &all {
        let e = newest.entry(a.fleet_job_id.clone()).or_insert(a.epoch);
        *e = (*e).max(a.epoch);
    }
    let mut kept: Vec<Assignment> = Vec::new();
    for a in all {
        if newest.get(&a.fleet_job_id) == Some(&a.epoch) && !kept.iter().any(|k| k.fleet_job_id == a.fleet_job_id) {
            kept.push(a);
        } else {
            tracing::warn!(id = %a.fleet_job_id, epoch = a.epoch, "an older placement in the same answer: not submitted");
        }
    }
    kept
}

/// Copies the assignment's checkpoint into this region first when it
/// lies only in another's (`resume_copy_to`), reporting the copy (bytes,
/// seconds) to the catalog; returns what the job resumes from
/// (`FLEET_RESUME_FROM`). A failed copy is retried with the assignment
/// (an error here); after [`COPY_ATTEMPTS`] failures the job starts
/// without it (it restores the newest checkpoint in this region's store,
/// or starts from scratch), which the log says.
async fn resume_from<B: Backend>(agent: &Agent<B>, id: &str, a: &Assignment, uid: u32) -> Result<Option<String>> {
    let (Some(from), Some(to)) = (&a.resume_from, &a.resume_copy_to) else {
        return Ok(a.request.fleet.resume_from.clone().or_else(|| a.resume_from.clone()));
    };
    let cfg = &agent.cfg;
    let t0 = std::time::Instant::now();
    let file_copy = crate::ckpt::FileCopy::before(to);
    match crate::ckpt::copy(&cfg.ckpt_helper, cfg.ckpt_stores.as_deref(), from, to).await {
        Ok(c) => {
            agent.copy_failures.lock().remove(id);
            if let Some(fc) = file_copy {
                // The agent's copy, its user's now (ckpt::FileCopy): one
                // system call per file, off the runtime's workers.
                let url = c.url.clone();
                let given = tokio::task::spawn_blocking(move || fc.admit(&url, uid)).await;
                if let Err(e) = given.map_err(anyhow::Error::from).and_then(|r| r) {
                    tracing::warn!(%id, to = %c.url, "the copied checkpoint stays the agent's: its job cannot \
                        write its next checkpoints beside it: {e:#}");
                }
            }
            tracing::info!(%id, from = %c.from, to = %c.url, bytes = c.bytes, seconds = c.seconds,
                total_s = t0.elapsed().as_secs_f64(), "copied the checkpoint to resume from into this region");
            let rep = fleet_api::api::CheckpointReport {
                seq: c.seq,
                url: c.url.clone(),
                bytes: c.bytes,
                manifest_sha256: c.manifest_sha256.clone(),
                step: None,
                valid: true,
                copied_from: Some(c.from.clone()),
                copy_seconds: Some(c.seconds),
            };
            // The copy is complete either way; an unrecorded one costs only
            // the egress figure, so a failed report does not stop the job.
            if let Err(e) = agent.meta.report_checkpoint(id, &rep).await {
                tracing::warn!(%id, url = %c.url, "reporting the copied checkpoint: {e:#}");
            }
            Ok(Some(c.url))
        }
        Err(e) => {
            let n = {
                let mut f = agent.copy_failures.lock();
                let n = f.entry(id.to_string()).or_insert(0);
                *n += 1;
                *n
            };
            if n < COPY_ATTEMPTS {
                return Err(
                    e.context(format!("copying the checkpoint to resume from (attempt {n} of {COPY_ATTEMPTS})"))
                );
            }
            agent.copy_failures.lock().remove(id);
            tracing::warn!(%id, %from, "copying the checkpoint failed {n} times, the job starts without it: {e:#}");
            Ok(None)
        }
    }
}

/// Copies tried before a resumed job starts without its checkpoint.
pub const COPY_ATTEMPTS: u32 = 3;

async fn report_submitted<B: Backend>(agent: &Agent<B>, id: &str, sid: u64) -> Result<()> {
    let epoch = agent.journal.run(id)?.and_then(|(r, _)| epoch_of(&r));
    let up = StatusUpdate { remote_job_id: Some(sid), state: Some(JobState::Pending), epoch, ..Default::default() };
    agent.meta.status(id, &up).await?;
    Ok(())
}

/// How far Slurm's submit time of an interrupted submission may precede
/// the journal's time (Slurm stores whole seconds; the agent and slurmctld
/// clocks agree to NTP accuracy). Small, so that an earlier run of the same
/// fleet job (a rerun) is never taken for it.
const ADOPT_SLACK_S: f64 = 2.0;

/// The job an interrupted submission made, among the jobs of the run's
/// user in its directory (`Backend::find_submitted`): the first submitted
/// after the run was journaled. Later ones, if any, are the user's own.
pub fn adoptable(found: &[NativeJob], accepted_at: f64) -> Option<&NativeJob> {
    found
        .iter()
        .filter(|j| j.submit_time.is_some_and(|t| t as f64 >= accepted_at - ADOPT_SLACK_S))
        .min_by_key(|j| (j.submit_time, j.native_id))
}

/// Cancel one job this cluster runs, after checking it is still the job
/// the agent submitted.
pub async fn cancel_one<B: Backend>(agent: &Agent<B>, id: &str) -> Result<()> {
    let Some((run, _)) = agent.journal.run(id)? else {
        tracing::debug!(%id, "cancel request for a job this agent does not run");
        return Ok(());
    };
    if run.done {
        return Ok(());
    }
    let Some(sid) = run.slurm_id else {
        let up = StatusUpdate {
            state: Some(JobState::Cancelled),
            final_stdout_len: Some(0),
            final_stderr_len: Some(0),
            epoch: epoch_of(&run),
            ..Default::default()
        };
        agent.meta.status(id, &up).await?;
        return Ok(());
    };
    let jobs = agent.backend.status(&[sid]).await?;
    let candidates: Vec<&NativeJob> = jobs.iter().filter(|j| j.native_id == sid).collect();
    match identify(&run, &agent.cfg.site, &agent.backend.job_dir(id).display().to_string(), &candidates) {
        Seen::Job(j) if !j.state.is_terminal() => {
            let user = run.user.as_deref().context("journal has no user for this run")?;
            agent.backend.cancel(sid, user).await?;
            tracing::info!(%id, slurm_id = sid, "cancelled on request");
        }
        // Finished or gone: the watch pass reports it.
        _ => {}
    }
    Ok(())
}

/// Deliver a signal the origin asked for (`scancel --signal` there) to the
/// job this cluster runs, as its user, after checking it is still the job
/// the agent submitted.
pub async fn signal_one<B: Backend>(
    agent: &Agent<B>,
    id: &str,
    signal: &str,
    scope: crate::backend::SignalScope,
) -> Result<()> {
    let Some((run, _)) = agent.journal.run(id)? else { return Ok(()) };
    let (Some(sid), false) = (run.slurm_id, run.done) else { return Ok(()) };
    let jobs = agent.backend.status(&[sid]).await?;
    let candidates: Vec<&NativeJob> = jobs.iter().filter(|j| j.native_id == sid).collect();
    if let Seen::Job(j) = identify(&run, &agent.cfg.site, &agent.backend.job_dir(id).display().to_string(), &candidates)
    {
        if !j.state.is_terminal() {
            let user = run.user.as_deref().context("journal has no user for this run")?;
            // Noted first: a script this signal ends ended by its user's
            // hand, not by Slurm's (`launch_verdict`).
            agent.journal.mark_signalled(id, signal)?;
            agent.backend.signal(sid, user, signal, scope).await?;
            tracing::info!(%id, slurm_id = sid, signal, ?scope, "signalled on request");
        }
    }
    Ok(())
}

/// The origin side of a start request: the stand-in must be RUNNING in the
/// proxy partition and carry this job's tag in `AdminComment`, which only
/// the plugin (as slurmctld) can set — so a job's owner cannot start it
/// with the job token alone while the stand-in is held or waiting.
pub async fn confirm_starts<B: Backend>(agent: &Agent<B>, checks: &[StartCheck]) -> Result<()> {
    let ids: Vec<u64> = checks.iter().map(|c| c.origin_job_id).collect();
    let t0 = std::time::Instant::now();
    let stand_ins = agent.backend.stand_ins_by_id(&agent.cfg.proxy_partition, &ids).await?;
    // `fleet::start` (debug): the start path's timestamps (tests/bench/start_latency.py reads them).
    tracing::debug!(target: "fleet::start", ?ids, lookup_ms = t0.elapsed().as_millis() as u64, "stand-ins looked up");
    for c in checks {
        let found = stand_ins.iter().find(|s| s.native_id == c.origin_job_id);
        let journaled = agent.journal.stand_in_of(&c.fleet_job_id)?;
        let (started, reason) = start_verdict(c, found, &agent.cfg.proxy_partition, journaled);
        // (Not backfill's year on a stand-in it started: reconcile::stand_in_limit.)
        let time_limit_min = found.and_then(crate::reconcile::stand_in_limit);
        if started {
            agent.journal.set_stand_in(&c.fleet_job_id, c.origin_job_id)?;
            // The job starts with this limit: a later change is passed on.
            agent.time_limits.lock().started(&c.fleet_job_id, time_limit_min, now());
        } else {
            tracing::warn!(id = %c.fleet_job_id, "start request refused: {reason}");
        }
        let verdict = StartConfirmation { origin_job_id: c.origin_job_id, started, reason, time_limit_min };
        let t1 = std::time::Instant::now();
        match agent.meta.confirm_start(&c.fleet_job_id, &verdict).await {
            Err(e) => tracing::warn!(id = %c.fleet_job_id, "confirming the start: {e:#}"),
            Ok(_) => {
                if let (true, Some(m)) = (started, time_limit_min) {
                    lift_stand_in_limit(agent, &c.fleet_job_id, c.origin_job_id, m).await;
                }
            }
        }
        tracing::debug!(target: "fleet::start", id = %c.fleet_job_id, started, post_ms = t1.elapsed().as_millis() as u64,
            "start confirmation sent");
    }
    Ok(())
}

/// A stand-in that started with a limit (its user's pending update, or
/// its job's `--time` or `MaxWall` where Slurm enforces limits: the plugin
/// keeps them then) has handed it to its job, which runs it at its target
/// from its start there: the stand-in's own, counted from its start here,
/// would end it while its job still waits there. Lifted once the start is
/// confirmed (a confirmation that did not arrive is asked again, and must
/// read the same limit). Where the agent is no operator, Slurm refuses:
/// said, and the stand-in keeps its limit.
async fn lift_stand_in_limit<B: Backend>(agent: &Agent<B>, id: &str, stand_in: u64, minutes: u32) {
    match agent.backend.lift_stand_in_limit(stand_in).await {
        Ok(()) => {
            // No limit of its own from now on: a later one is its user's.
            agent.time_limits.lock().started(id, None, now());
            tracing::info!(%id, stand_in, minutes, "the stand-in's time limit is its job's at its target now: lifted here");
        }
        Err(e) => tracing::warn!(%id, stand_in, minutes,
            "cannot lift the stand-in's time limit; it ends its job if the job's wait at its target and its run \
             together outlast it: {e:#}"),
    }
}

/// Does Slurm run the stand-in a start request names? `found` is the job
/// of that id as `squeue -p <proxy partition> --json` printed it (22.05
/// ignores `-p` with `--json`: any job can be there), `journaled` the
/// stand-in id the journal holds for the fleet job. The job must run in
/// the proxy partition itself (which only the plugin puts jobs in: a
/// user's job elsewhere, running `fleet-proxy` with a copied token, starts
/// nothing), carry the fleet job's tag (or be its journaled stand-in: an
/// element of a deferred array carries its array's tag), be RUNNING, and
/// run the restart the request names (a finished run's token cannot rerun
/// the job). Returns whether it does and, if not, why.
pub fn start_verdict(
    c: &StartCheck,
    found: Option<&NativeJob>,
    proxy_partition: &str,
    journaled: Option<u64>,
) -> (bool, String) {
    match found {
        Some(s) if s.native_id == c.origin_job_id && s.partition == proxy_partition => {
            if fleet_api::wire::parse_admin_tag(&s.admin_comment) != Some(c.fleet_job_id.as_str())
                && journaled != Some(s.native_id)
            {
                (false, format!("job {} is not the stand-in of {}", c.origin_job_id, c.fleet_job_id))
            } else if s.raw_state != "RUNNING" {
                (false, format!("the stand-in {} is {}", s.native_id, s.raw_state))
            } else if s.restarts != c.restart {
                (false, format!("the stand-in {} runs its restart {}, not {}", s.native_id, s.restarts, c.restart))
            } else {
                (true, String::new())
            }
        }
        Some(s) if s.native_id == c.origin_job_id => {
            (false, format!("job {} runs in partition {:?}, not in {proxy_partition}", c.origin_job_id, s.partition))
        }
        _ => (false, format!("job {} is not in partition {proxy_partition}", c.origin_job_id)),
    }
}

/// Ask the meta-scheduler which of `runs` are stale (the job was placed
/// again elsewhere or in a newer epoch) and stop those: cancel the Slurm
/// job if it is still the one this agent submitted, and never report on
/// it again. Fails (and the caller reports nothing) while the
/// meta-scheduler cannot be asked.
pub async fn fence_stale<B: Backend>(agent: &Agent<B>, runs: &[(Run, fleet_api::JobRequest)]) -> Result<usize> {
    if runs.is_empty() {
        return Ok(0);
    }
    let req = FenceRequest {
        runs: runs.iter().map(|(r, _)| RunEpoch { fleet_job_id: r.id.clone(), epoch: r.epoch }).collect(),
    };
    let reply = agent.meta.fence(&req).await?;
    // The meta-scheduler answered about our runs: the lease holds, even
    // while the heartbeat fails on this cluster's own scheduler.
    agent.lease.lock().renew(std::time::Instant::now());
    let mut stopped = 0;
    for s in reply.stale {
        let Some((mut run, _)) = runs.iter().find(|(r, _)| r.id == s.fleet_job_id).cloned() else { continue };
        if let Some(sid) = run.slurm_id {
            let jobs = agent.backend.status(&[sid]).await?;
            let candidates: Vec<&NativeJob> = jobs.iter().filter(|j| j.native_id == sid).collect();
            let dir = agent.backend.job_dir(&run.id).display().to_string();
            if let Seen::Job(j) = identify(&run, &agent.cfg.site, &dir, &candidates) {
                if !j.state.is_terminal() {
                    let user = run.user.as_deref().context("journal has no user for this run")?;
                    agent.backend.cancel(sid, user).await?;
                }
            }
        }
        tracing::warn!(id = %run.id, epoch = run.epoch, slurm_id = ?run.slurm_id,
            "stale copy stopped, never reported: {}", s.reason);
        run.done = true;
        agent.journal.update_run(&run)?;
        if let Err(e) = jobdir::remove(&agent.backend.job_dir(&run.id)) {
            tracing::warn!(id = %run.id, "{e:#}");
        }
        stopped += 1;
    }
    Ok(stopped)
}

/// The lease ran out (`silent`: how long the meta-scheduler has been out
/// of reach): cancel every fleet job this cluster runs, as its user, and
/// remember why, so that the run is reported as died once contact is back
/// (the meta-scheduler then moves it, if it has not already).
pub async fn self_fence<B: Backend>(agent: &Agent<B>, silent: std::time::Duration) -> Result<usize> {
    let why = format!(
        "the agent at {} could not reach the meta-scheduler for {} s, beyond its lease, and stopped the job",
        agent.cfg.site,
        silent.as_secs()
    );
    let mut stopped = 0;
    for (mut run, _) in agent.journal.active_runs()? {
        if run.fenced.is_some() {
            continue;
        }
        if let (Some(sid), Some(user)) = (run.slurm_id, run.user.clone()) {
            let jobs = agent.backend.status(&[sid]).await?;
            let candidates: Vec<&NativeJob> = jobs.iter().filter(|j| j.native_id == sid).collect();
            let dir = agent.backend.job_dir(&run.id).display().to_string();
            if let Seen::Job(j) = identify(&run, &agent.cfg.site, &dir, &candidates) {
                if !j.state.is_terminal() {
                    agent.backend.cancel(sid, &user).await?;
                }
            }
        }
        tracing::warn!(id = %run.id, slurm_id = ?run.slurm_id, "self-fenced: {why}");
        run.fenced = Some(why.clone());
        agent.journal.update_run(&run)?;
        stopped += 1;
    }
    Ok(stopped)
}

/// One watch pass over every job this cluster runs. It first asks which
/// runs are stale and stops them: nothing is reported before.
pub async fn watch_once<B: Backend>(agent: &Agent<B>, tracker: &mut Tracker) -> Result<()> {
    let runs = agent.journal.active_runs()?;
    if fence_stale(agent, &runs).await? > 0 {
        return Ok(()); // the next pass reads the journal again
    }
    let ids: Vec<u64> = runs.iter().filter_map(|(r, _)| r.slurm_id).collect();
    if ids.is_empty() {
        return Ok(());
    }
    let mut known = agent.backend.status(&ids).await?;
    let missing: Vec<u64> = ids.iter().copied().filter(|i| !known.iter().any(|j| j.native_id == *i)).collect();
    if !missing.is_empty() {
        match agent.backend.accounting(&missing).await {
            Ok(found) => known.extend(ended_in_accounting(found)),
            Err(e) => tracing::debug!("accounting lookup: {e:#}"),
        }
    }
    let t = now();
    for (run, _req) in runs {
        let Some(sid) = run.slurm_id else { continue };
        if !tracker.due(&run.id, t) {
            continue;
        }
        let id = run.id.clone();
        let candidates: Vec<&NativeJob> = known.iter().filter(|j| j.native_id == sid).collect();
        match reconcile_run(agent, tracker, run, &candidates).await {
            Ok(()) => tracker.ok(&id),
            Err(e) => {
                let d = tracker.failed(&id, t);
                tracing::warn!(%id, slurm_id = sid, retry_in_s = d.as_secs(), "{e:#}");
            }
        }
    }
    Ok(())
}

/// What accounting says of jobs slurmctld no longer knows: only their
/// ends. A job that is not over is always in slurmctld's memory, so a row
/// still pending or running there is stale: slurmctld forgot the job (lost
/// in a crash before it saved its state, `Purged files for defunct batch
/// JobId`), and slurmdbd, which recorded its submission, never hears of an
/// end. Such a job is gone (`Seen::Gone`), not pending forever.
pub fn ended_in_accounting(rows: Vec<NativeJob>) -> Vec<NativeJob> {
    rows.into_iter().filter(|j| j.state.is_terminal()).collect()
}

/// How long a run Slurm shows running may have a noted end of its script
/// (the same start) before that end is taken as lost by Slurm.
const ENDED_BUT_RUNNING: std::time::Duration = std::time::Duration::from_secs(30);

/// How a run its in-job lease stopped is reported (`died`).
const BY_ITS_LEASE: &str = "by its job lease";

/// Reconcile one job: relay output, report its state, finish it.
async fn reconcile_run<B: Backend>(
    agent: &Agent<B>,
    tracker: &mut Tracker,
    mut run: Run,
    candidates: &[&NativeJob],
) -> Result<()> {
    let site = agent.cfg.site.clone();
    let dir = agent.backend.job_dir(&run.id).display().to_string();
    let seen = identify(&run, &site, &dir, candidates);
    if let Seen::Job(j) = &seen {
        tracker.known(&run.id);
        if run.submit_time.is_none() {
            run.submit_time = j.submit_time;
        }
        // Before the output is read: a restarted file is then known as
        // this re-run's, not another.
        if observe_rerun(&mut run, j) {
            tracing::warn!(id = %run.id, slurm_id = j.native_id, reruns = run.reruns,
                "Slurm ran the job again: {}", run.rerun_why.as_deref().unwrap_or(""));
        }
        let starts = crate::ckpt::run_starts(&agent.backend.job_dir(&run.id), j.native_id, run.epoch);
        if starts_rerun(&mut run, starts) {
            tracing::warn!(id = %run.id, slurm_id = j.native_id, reruns = run.reruns,
                "Slurm ran the job again: {}", run.rerun_why.as_deref().unwrap_or(""));
        }
    }
    // Output that cannot go now (the meta-scheduler unreachable, or short
    // of room: 507) stays here for the next pass; the job's state is news
    // all the same (a running job reported pending would look stuck). At
    // its end it must all go first: the final lengths follow it.
    let relay_key = format!("{}:relay", run.id);
    match relay_all(agent, tracker, &mut run).await {
        Ok(()) => {
            tracker.refused.remove(&relay_key);
        }
        Err(e) => {
            let msg = format!("output not relayed yet: {e:#}");
            if tracker.refused.insert(relay_key, msg.clone()).as_ref() != Some(&msg) {
                tracing::warn!(id = %run.id, "{msg}");
            }
        }
    }
    let mut up = match &seen {
        Seen::Job(j) => {
            if j.restarts > run.restarts {
                tracing::info!(id = %run.id, restarts = j.restarts, "requeued by Slurm");
                run.restarts = j.restarts;
                // The requeue's new submit time identifies it from now on.
                run.submit_time = j.submit_time;
            }
            let mut up = update_for(j, &site);
            if run.reruns > j.restarts {
                let why = run.rerun_why.as_deref().unwrap_or("");
                up.reason = format!(
                    "{}{}Slurm at {site} re-ran it {} time(s), {} not counted by Slurm (last: {why})",
                    up.reason,
                    if up.reason.is_empty() { "" } else { "; " },
                    run.reruns,
                    run.reruns - j.restarts
                );
            }
            // Its script asks for its lease first: the meta-scheduler
            // notices a run that reports running but never started.
            up.job_lease = crate::ckpt::under_lease(&agent.backend.job_dir(&run.id));
            up
        }
        Seen::Gone(why) => StatusUpdate {
            remote_job_id: run.slurm_id,
            state: Some(JobState::Lost),
            reason: why.clone(),
            ..Default::default()
        },
    };
    if let (Seen::Job(j), None) = (&seen, &run.fenced) {
        // Stopped by its in-job lease (the meta-scheduler unreachable, or
        // this cluster silent too long): it died here, it did not fail.
        if j.state.is_terminal() && j.raw_state != "COMPLETED" {
            if let Some(why) = crate::ckpt::lease_stopped(&agent.backend.job_dir(&run.id)) {
                run.fenced = Some(format!("stopped at {site} {BY_ITS_LEASE}: {why}"));
                agent.journal.update_run(&run)?;
            }
        }
    }
    if let Some(why) = &run.fenced {
        // Stopped by this agent's lease: the job died here, whatever Slurm
        // shows for the cancellation.
        up.died = Some(why.clone());
        // Or by its in-job lease, on its watchdog's note, which the job
        // could have written itself: the meta-scheduler checks it against
        // the leases it granted.
        up.lease_stopped = why.contains(BY_ITS_LEASE);
    }
    // Died with its node (a drain, a preemption), which stops the script
    // with a signal before this report: unless its user had a signal
    // delivered to it, an end it claimed by a signal was that kill.
    up.disrupted = run.fenced.is_none()
        && run.user_signal.is_none()
        && matches!(&seen, Seen::Job(j) if up.died.is_some() && disruption(j));
    // Held after a launch Slurm took for failed (now, or before the agent
    // cancelled it), or forgotten by Slurm (lost in a controller crash):
    // what the run actually did decides the report.
    let held_now = matches!(&seen, Seen::Job(j) if j.state == JobState::Pending && launch_failed_held(j));
    let launch_why = launch_failed_why(&site);
    let held = held_now || run.fenced.as_deref().is_some_and(|f| f.starts_with(launch_why.as_str()));
    let gone = matches!(seen, Seen::Gone(_)) && run.fenced.as_deref().is_none_or(|f| !f.contains(BY_ITS_LEASE));
    if !up.lease_stopped && (held || gone) {
        let dir = agent.backend.job_dir(&run.id);
        let out = agent.backend.output_paths(&run.id);
        let evidence = LaunchEvidence {
            ended: run.slurm_id.and_then(|sid| crate::ckpt::run_ended(&dir, sid, run.epoch)),
            user_signalled: run.user_signal.is_some(),
            started_note: crate::ckpt::run_started(&dir),
            under_lease: crate::ckpt::under_lease(&dir),
            stdout_bytes: run.stdout_off,
            stderr_bytes: run.stderr_off,
            stdout_exists: std::fs::symlink_metadata(&out.stdout).is_ok(),
        };
        let forgotten_s = if gone { tracker.forgotten_for(&run.id, now()) } else { 0.0 };
        // What Slurm did: held it after a failed launch, or forgot it.
        let then = match &seen {
            Seen::Gone(why) => why.clone(),
            Seen::Job(_) => launch_why.clone(),
        };
        match launch_verdict(&evidence) {
            LaunchVerdict::Ended { exit_code, signal } => {
                if run.fenced.is_none() && held {
                    // Kept: once cancelled below, Slurm shows only CANCELLED.
                    run.fenced = Some(launch_why.clone());
                    agent.journal.update_run(&run)?;
                }
                if let (Seen::Job(j), Some(user)) = (&seen, run.user.as_deref()) {
                    if !j.state.is_terminal() {
                        // It must not run again here.
                        agent.backend.cancel(j.native_id, user).await?;
                    }
                }
                let ok = exit_code == Some(0) && signal.is_none_or(|s| s == 0);
                let how = match (signal.filter(|s| *s > 0), exit_code) {
                    (Some(s), _) => format!("signal {s}, which its user sent"),
                    (None, Some(c)) => format!("exit code {c}"),
                    (None, None) => "no exit status".into(),
                };
                tracing::warn!(id = %run.id, slurm_id = ?run.slurm_id, end = %how,
                    "Slurm held or forgot the job, but its script had ended: reporting its end ({then})");
                up.died = None;
                up.never_started = false;
                up.slurm_requeued = false;
                up.state = Some(if ok { JobState::Completed } else { JobState::Failed });
                up.exit_code = exit_code;
                up.signal = signal.filter(|s| *s > 0);
                up.reason = format!("its script ended at {site} ({how}); then {then}");
            }
            LaunchVerdict::NeverStarted => {
                // Placed again whatever its restart policy (the
                // meta-scheduler checks that it never asked for its lease).
                up.died = Some(then.clone());
                up.never_started = true;
            }
            LaunchVerdict::Started { killed_by } if held => {
                // Slurm requeued it: as native Slurm would once the hold is
                // released, it runs again (a re-run Slurm made, counted).
                let how = match killed_by {
                    Some(s) => format!("its script was killed there by signal {s}, which no user sent"),
                    None => "its script had started there, its end unknown".into(),
                };
                up.died = Some(format!("{launch_why}; {how}"));
                up.slurm_requeued = true;
            }
            // Forgotten by Slurm after it started, with no end of its own.
            LaunchVerdict::Started { killed_by } => {
                match forgotten_outcome(killed_by, run.fenced.is_some(), evidence.under_lease, forgotten_s) {
                    Forgotten::Wait => {
                        if forgotten_s == 0.0 {
                            tracing::warn!(id = %run.id, slurm_id = ?run.slurm_id,
                                "{then}; its script started and has noted no end: waiting up to {FORGOTTEN_GRACE_S} s for one");
                        }
                        // What was relayed is kept; nothing is reported yet.
                        agent.journal.update_run(&run)?;
                        return Ok(());
                    }
                    Forgotten::Died => {
                        let how = match killed_by {
                            Some(s) => format!("its script was killed there by signal {s}, which no user sent"),
                            None => format!("its script started there and noted no end in {FORGOTTEN_GRACE_S} s"),
                        };
                        up.died = Some(format!("{then}; {how}"));
                        up.disrupted = true;
                    }
                    Forgotten::Lost => {}
                }
            }
        }
    }
    // Slurm shows the run running, but its script noted its end (this
    // very start) a while ago: slurmctld recovered from a state it saved
    // before that end and lost it (`make chaos` 14:35: chaos-1-57 shown
    // RUNNING for minutes after its script exited 1 and lease-exec left).
    // The noted end is its result; the shell Slurm keeps is cancelled.
    // (A job that writes such a note itself only ends itself early.)
    if let (Seen::Job(j), None, false) = (&seen, &up.died, up.lease_stopped) {
        let dir = agent.backend.job_dir(&run.id);
        let noted = run.slurm_id.and_then(|sid| crate::ckpt::run_ended(&dir, sid, run.epoch));
        let ago = crate::ckpt::run_ended_ago(&dir);
        if let (true, Some(end), Some(ago)) = (j.raw_state == "RUNNING", noted, ago) {
            let crate::ckpt::NotedEnd { exit_code, signal, .. } = end;
            if ago <= ENDED_BUT_RUNNING {
                // Not yet: the controller may only be slow to see it.
            } else if let Some(k) = slurms_kill(&end, run.user_signal.is_some()) {
                // It ended during a kill of the whole step that no user
                // asked for (a requeue, a preemption), which the
                // controller lost with the rest: that kill, not its end.
                tracing::warn!(id = %run.id, slurm_id = j.native_id, signal = k, ago_s = ago.as_secs(),
                    "Slurm shows the job running, but its script ended during Slurm's kill of it: reporting it died");
                up.died = Some(format!(
                    "its script ended at {site} once Slurm there began to kill it with signal {k}, which no user sent, \
                     {} s before Slurm there still showed it running (its controller lost the kill)",
                    ago.as_secs()
                ));
                up.disrupted = true;
            } else {
                if let Some(user) = run.user.as_deref() {
                    agent.backend.cancel(j.native_id, user).await?;
                }
                let ok = exit_code == Some(0) && signal.is_none_or(|s| s == 0);
                let how = match (signal.filter(|s| *s > 0), exit_code) {
                    (Some(s), _) => format!("signal {s}"),
                    (None, Some(c)) => format!("exit code {c}"),
                    (None, None) => "no exit status".into(),
                };
                tracing::warn!(id = %run.id, slurm_id = j.native_id, end = %how, ago_s = ago.as_secs(),
                    "Slurm shows the job running, but its script ended: reporting its end, cancelling the job");
                up.state = Some(if ok { JobState::Completed } else { JobState::Failed });
                up.exit_code = exit_code;
                up.signal = signal.filter(|s| *s > 0);
                up.reason = format!(
                    "its script ended at {site} ({how}) {} s before Slurm there still showed it running (its controller lost the end)",
                    ago.as_secs()
                );
            }
        }
    }
    if let Some(why) = up.died.clone() {
        // A forgotten run is judged the same way again on every pass until
        // its report is taken (nothing of it is left to cancel): not kept.
        if run.fenced.is_none() && !matches!(seen, Seen::Gone(_)) {
            // Kept: once cancelled below, Slurm shows only CANCELLED.
            run.fenced = Some(why);
            agent.journal.update_run(&run)?;
        }
        if let (Seen::Job(j), Some(user)) = (&seen, run.user.as_deref()) {
            if !j.state.is_terminal() {
                // Held after a failed launch: no one would release it here.
                agent.backend.cancel(j.native_id, user).await?;
            }
        }
        up.state = Some(JobState::Failed);
    }
    up.epoch = epoch_of(&run);
    up.reruns = Some(run.reruns);
    up.rerun_why = run.rerun_why.clone().unwrap_or_default();
    let state = up.state.unwrap_or(JobState::Lost);
    if state.is_terminal() {
        // Read whatever the job wrote last, then close the streams.
        relay_all(agent, tracker, &mut run).await?;
        // A restart seen in this last read is reported too.
        up.reruns = Some(run.reruns);
        up.rerun_why = run.rerun_why.clone().unwrap_or_default();
        up.final_stdout_len = Some(run.stdout_base + run.stdout_off);
        up.final_stderr_len = Some(run.stderr_base + run.stderr_off);
    }
    // A waiting job's reason is part of what is reported (Kubernetes'
    // `Unschedulable: ...`, Slurm's `Resources`): its change is news.
    let waiting_why = if state == JobState::Pending { up.reason.as_str() } else { "" };
    // So is its limit (its stand-in's time-limit mails are shares of it).
    let limit = up.time_limit_min.map(|m| m.to_string()).unwrap_or_default();
    let label = format!("{}:{}:{}:{}:{limit}:{waiting_why}", state.as_str(), up.node_list, run.restarts, run.reruns);
    let mut finished = false;
    if run.reported.as_deref() != Some(label.as_str()) || state.is_terminal() {
        match agent.meta.status(&run.id, &up).await {
            Ok(_) => {
                if run.reported.as_deref() != Some(label.as_str()) {
                    tracing::info!(id = %run.id, slurm_id = ?run.slurm_id, state = %state, "state");
                }
                run.reported = Some(label);
                finished = state.is_terminal();
            }
            Err(e) => match e.downcast_ref::<Conflict>() {
                // The meta-scheduler's record is final (a terminal state, or
                // another remote job): nothing this agent says can change it.
                Some(c) => {
                    tracing::warn!(id = %run.id, terminal = c.terminal, "the meta-scheduler refused the update; no longer reporting this job: {}", c.body);
                    if !state.is_terminal() {
                        if let Some(user) = run.user.as_deref().filter(|_| matches!(seen, Seen::Job(_))) {
                            // It is over for the fleet: do not let it run on untracked.
                            let _ = agent.backend.cancel(run.slurm_id.unwrap_or_default(), user).await;
                        }
                    }
                    finished = true;
                }
                None => {
                    agent.journal.update_run(&run)?;
                    return Err(e);
                }
            },
        }
    }
    run.done = finished;
    agent.journal.update_run(&run)?;
    if finished {
        if let Err(e) = jobdir::remove(&agent.backend.job_dir(&run.id)) {
            tracing::warn!(id = %run.id, "{e:#}");
        }
        tracker.refused.remove(&run.id);
        tracker.known(&run.id);
    }
    Ok(())
}

async fn relay_all<B: Backend>(agent: &Agent<B>, tracker: &mut Tracker, run: &mut Run) -> Result<()> {
    let paths = agent.backend.output_paths(&run.id);
    let epoch = epoch_of(run);
    for (stream, path) in [(Stream::Stdout, paths.stdout), (Stream::Stderr, paths.stderr)] {
        let (base, off) = match stream {
            Stream::Stdout => (&mut run.stdout_base, &mut run.stdout_off),
            Stream::Stderr => (&mut run.stderr_base, &mut run.stderr_off),
        };
        match jobdir::open_output(&path, agent.backend.output_owner(run.uid))? {
            jobdir::Opened::Missing => {}
            jobdir::Opened::Refused(why) => {
                let msg = format!("{} not relayed: {why}", stream.as_str());
                if tracker.refused.insert(format!("{}:{}", run.id, stream.as_str()), msg.clone()).is_none() {
                    tracing::warn!(id = %run.id, "{msg}");
                }
            }
            jobdir::Opened::File(mut f, len) => {
                let restarted = len < *off;
                relay(agent, &run.id, epoch, stream, &mut f, len, base, off).await?;
                if restarted && output_restarted(run, stream) {
                    tracing::warn!(id = %run.id, reruns = run.reruns, "Slurm ran the job again: {}",
                        run.rerun_why.as_deref().unwrap_or(""));
                }
            }
        }
    }
    Ok(())
}

/// Relays what `f` holds past `*off`. A file shorter than what was relayed
/// was restarted (Slurm requeued the job, truncating its output): its new
/// bytes follow the old ones in the fleet's stream, as `--open-mode=append`.
#[allow(clippy::too_many_arguments)]
async fn relay<B: Backend>(
    agent: &Agent<B>,
    id: &str,
    epoch: Option<u64>,
    stream: Stream,
    f: &mut std::fs::File,
    len: u64,
    base: &mut u64,
    off: &mut u64,
) -> Result<()> {
    if len < *off {
        tracing::info!(%id, stream = stream.as_str(), was = *off, now = len, "output file restarted (requeue)");
        *base += *off;
        *off = 0;
    }
    while *off < len {
        let want = CHUNK.min((len - *off) as usize);
        let data = jobdir::read_at(f, *off, want)?;
        if data.is_empty() {
            break;
        }
        let n = data.len() as u64;
        let chunk = OutputChunk { stream, offset: *base + *off, data, epoch };
        match agent.meta.output(id, &chunk).await? {
            None => *off += n,
            Some(held) if held >= *base => {
                // The meta-scheduler lost a tail: send it again from our copy.
                tracing::warn!(%id, stream = stream.as_str(), held, sent = *base + *off, "meta-scheduler lost output; resending from its offset");
                *off = held - *base;
            }
            Some(held) => {
                // Lost bytes of an earlier incarnation of the file, which is
                // gone: continue this one from where the fleet's stream ends.
                tracing::warn!(%id, stream = stream.as_str(), held, "meta-scheduler lost output of an earlier run; it cannot be resent");
                *base = held;
                *off = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, state: &str, submit: i64, uid: u32) -> NativeJob {
        let mut j = NativeJob::new(id, state);
        j.submit_time = Some(submit);
        j.user_id = Some(uid);
        j
    }

    #[test]
    fn a_start_is_confirmed_only_for_the_tagged_running_stand_in_in_the_proxy_partition() {
        let check = |restart| StartCheck { fleet_job_id: "beta-1".into(), origin_job_id: 7, restart };
        let stand_in = |state: &str, partition: &str, tag: &str, restarts: u32| {
            let mut j = NativeJob::new(7, state);
            j.partition = partition.into();
            j.admin_comment = tag.into();
            j.restarts = restarts;
            j
        };
        let ok = (true, String::new());
        for (found, journaled, restart, want) in [
            (Some(stand_in("RUNNING", "fleet", "fleet:beta-1", 0)), None, 0, ok.clone()),
            // An element of a deferred array: its array's tag, its own id journaled.
            (Some(stand_in("RUNNING", "fleet", "fleet:beta-0", 0)), Some(7), 0, ok.clone()),
            (Some(stand_in("RUNNING", "fleet", "fleet:beta-1", 2)), None, 2, ok),
            // A user's job elsewhere running fleet-proxy with a copied token.
            (
                Some(stand_in("RUNNING", "batch", "fleet:beta-1", 0)),
                Some(7),
                0,
                (false, "job 7 runs in partition \"batch\", not in fleet".into()),
            ),
            (
                Some(stand_in("RUNNING", "batch,fleet", "fleet:beta-1", 0)),
                None,
                0,
                (false, "job 7 runs in partition \"batch,fleet\", not in fleet".into()),
            ),
            (None, Some(7), 0, (false, "job 7 is not in partition fleet".into())),
            (
                Some(stand_in("RUNNING", "fleet", "fleet:beta-2", 0)),
                None,
                0,
                (false, "job 7 is not the stand-in of beta-1".into()),
            ),
            (
                Some(stand_in("RUNNING", "fleet", "", 0)),
                Some(8),
                0,
                (false, "job 7 is not the stand-in of beta-1".into()),
            ),
            (
                Some(stand_in("PENDING", "fleet", "fleet:beta-1", 0)),
                None,
                0,
                (false, "the stand-in 7 is PENDING".into()),
            ),
            (
                Some(stand_in("RUNNING", "fleet", "fleet:beta-1", 1)),
                None,
                0,
                (false, "the stand-in 7 runs its restart 1, not 0".into()),
            ),
        ] {
            assert_eq!(start_verdict(&check(restart), found.as_ref(), "fleet", journaled), want, "{found:?}");
        }
        // A job of another id is never this one.
        let mut other = stand_in("RUNNING", "fleet", "fleet:beta-1", 0);
        other.native_id = 8;
        assert!(!start_verdict(&check(0), Some(&other), "fleet", None).0);
    }

    #[test]
    fn an_interrupted_submission_adopts_the_first_job_after_acceptance() {
        // accepted at 1000; 90 is a job of the same user in the same
        // directory from long before (not this run's), 101 the run's sbatch,
        // 102 one the user submitted by hand later.
        let found = [job(90, "COMPLETED", 700, 1001), job(102, "PENDING", 1030, 1001), job(101, "RUNNING", 1005, 1001)];
        assert_eq!(adoptable(&found, 1000.0).map(|j| j.native_id), Some(101));
        // Nothing after acceptance: submit (the caller removes the dir).
        assert_eq!(adoptable(&found[..1], 1000.0), None);
        assert_eq!(adoptable(&[], 1000.0), None);
        // A job with no submit time is never adopted.
        let mut j = NativeJob::new(103, "PENDING");
        j.user_id = Some(1001);
        assert_eq!(adoptable(&[j], 1000.0), None);
    }

    fn run(sid: u64, submit_time: Option<i64>) -> Run {
        Run {
            id: "beta-1".into(),
            slurm_id: Some(sid),
            uid: Some(1001),
            submit_time,
            submitted_at: 1000.0,
            ..Default::default()
        }
    }

    #[test]
    fn identity_is_id_submit_time_and_owner() {
        // Rows without a working directory (older accounting): submit time.
        let mine = job(7, "RUNNING", 1001, 1001);
        let reused = job(7, "COMPLETED", 5000, 1001);
        let other_user = job(7, "RUNNING", 1001, 1002);
        let d = "/s/jobs/beta-1";
        // First sight: the job submitted after the agent's sbatch.
        assert_eq!(identify(&run(7, None), "alpha", d, &[&mine]), Seen::Job(&mine));
        // A job of the same id from long before the agent's sbatch is not it.
        let old = job(7, "COMPLETED", 10, 1001);
        assert!(matches!(identify(&run(7, None), "alpha", d, &[&old]), Seen::Gone(_)));
        // Known submit time: a reused id is another job, never this one's result.
        let Seen::Gone(why) = identify(&run(7, Some(1001)), "alpha", d, &[&reused]) else {
            panic!("reused id taken for the job")
        };
        assert!(why.contains("reused"), "{why}");
        assert_eq!(identify(&run(7, Some(1001)), "alpha", d, &[&reused, &mine]), Seen::Job(&mine));
        // Another user's job under the same id and time is not ours.
        assert!(matches!(identify(&run(7, Some(1001)), "alpha", d, &[&other_user]), Seen::Gone(_)));
        let Seen::Gone(why) = identify(&run(7, Some(1001)), "alpha", d, &[]) else { panic!() };
        assert!(why.contains("no longer knows"), "{why}");
    }

    #[test]
    fn the_job_directory_outlives_requeues_and_tells_reused_ids_apart() {
        let d = "/s/jobs/beta-1";
        let at = |submit: i64, dir: &str, uid: u32| {
            let mut j = job(7, "PENDING", submit, uid);
            j.work_dir = dir.into();
            j
        };
        // Requeued (twice, once without a restart count): Slurm gave it a
        // new submit time; it is still this job.
        let requeued = at(1090, d, 1001);
        assert_eq!(identify(&run(7, Some(1001)), "alpha", d, &[&requeued]), Seen::Job(&requeued));
        // The id reused by another fleet job of the same user, or by any job
        // of another, with the same submit time: not this job.
        let other_run = at(1001, "/s/jobs/beta-2", 1001);
        assert!(matches!(identify(&run(7, Some(1001)), "alpha", d, &[&other_run]), Seen::Gone(_)));
        let other_user = at(1001, d, 1002);
        assert!(matches!(identify(&run(7, Some(1001)), "alpha", d, &[&other_user]), Seen::Gone(_)));
    }

    #[test]
    fn a_requeued_job_with_a_new_submit_time_is_still_the_job() {
        // Rows without a working directory (older accounting).
        let d = "/s/jobs/beta-1";
        // What Slurm 22.05 and 24.11 report after `scontrol requeue`: the
        // same id and owner, a later submit time, one more restart.
        let mut requeued = job(7, "PENDING", 1005, 1001);
        requeued.restarts = 1;
        assert_eq!(identify(&run(7, Some(1001)), "alpha", d, &[&requeued]), Seen::Job(&requeued));
        // sacct -D also lists the earlier run (parse_sacct counts the
        // REQUEUED rows before a row as its restarts): the latest run wins.
        let earlier = job(7, "REQUEUED", 1001, 1001);
        assert_eq!(identify(&run(7, Some(1001)), "alpha", d, &[&earlier, &requeued]), Seen::Job(&requeued));
        // Not a requeue: no new restart (a reused id), an earlier time, another owner.
        let reused = job(7, "RUNNING", 1005, 1001);
        assert!(matches!(identify(&run(7, Some(1001)), "alpha", d, &[&reused]), Seen::Gone(_)));
        let mut before = job(7, "PENDING", 900, 1001);
        before.restarts = 1;
        assert!(matches!(identify(&run(7, Some(1001)), "alpha", d, &[&before]), Seen::Gone(_)));
        let mut other = job(7, "PENDING", 1005, 1002);
        other.restarts = 1;
        assert!(matches!(identify(&run(7, Some(1001)), "alpha", d, &[&other]), Seen::Gone(_)));
        // Once the requeue is recorded (restarts 1), another one is needed.
        let mut seen_once = run(7, Some(1005));
        seen_once.restarts = 1;
        assert_eq!(identify(&seen_once, "alpha", d, &[&requeued]), Seen::Job(&requeued));
        let mut stale = job(7, "PENDING", 1009, 1001);
        stale.restarts = 1;
        assert!(matches!(identify(&seen_once, "alpha", d, &[&stale]), Seen::Gone(_)));
    }

    /// Two starts in the script's start log, neither seen by the agent: one
    /// re-run, counted once however often it is looked at, never lowering
    /// a count made otherwise.
    #[test]
    fn every_start_of_the_script_after_the_first_is_a_rerun() {
        let mut r = run(42, Some(1700000000));
        assert!(!starts_rerun(&mut r, 0));
        assert!(!starts_rerun(&mut r, 1));
        assert_eq!(r.reruns, 0);
        r.stdout_off = 10;
        assert!(starts_rerun(&mut r, 2));
        assert_eq!((r.reruns, r.rerun_out), (1, OUT_STDOUT));
        assert!(r.rerun_why.as_deref().unwrap().contains("started 2 times"));
        assert!(!starts_rerun(&mut r, 2), "counted once");
        r.reruns = 3;
        assert!(!starts_rerun(&mut r, 3));
        assert_eq!(r.reruns, 3);
    }

    /// A job slurmctld forgot keeps a pending row in accounting (its
    /// submission was recorded, its end never will be): only ended rows
    /// count, so the run is seen gone instead of pending forever.
    #[test]
    fn accounting_rows_of_a_forgotten_job_that_never_ended_do_not_count() {
        let rows = vec![
            job(2100073, "PENDING", 1700000000, 1001),
            job(2100074, "RUNNING", 1700000000, 1001),
            job(2100075, "COMPLETED", 1700000000, 1001),
            job(2100076, "FAILED", 1700000000, 1001),
        ];
        let ids: Vec<u64> = ended_in_accounting(rows).iter().map(|j| j.native_id).collect();
        assert_eq!(ids, vec![2100075, 2100076]);
        let r = run(2100073, Some(1700000000));
        let kept = ended_in_accounting(vec![job(2100073, "PENDING", 1700000000, 1001)]);
        let candidates: Vec<&NativeJob> = kept.iter().collect();
        assert!(matches!(identify(&r, "alpha", "", &candidates), Seen::Gone(_)));
    }

    #[test]
    fn the_runs_limit_at_the_target_is_reported() {
        let mut j = job(7, "RUNNING", 1, 1);
        assert_eq!(update_for(&j, "alpha").time_limit_min, None);
        j.time_limit_min = Some(90);
        assert_eq!(update_for(&j, "alpha").time_limit_min, Some(90));
    }

    /// A pending run's reason that never clears by itself is said apart
    /// (the meta-scheduler places such a job elsewhere); the same reason
    /// on a run that is no longer pending, and a wait that clears, are not.
    #[test]
    fn a_run_held_by_a_per_job_limit_is_reported_so() {
        let mut j = job(7, "PENDING", 1, 1);
        j.reason = "AssocMaxWallDurationPerJobLimit".into();
        let up = update_for(&j, "delta");
        assert_eq!(up.reason, "AssocMaxWallDurationPerJobLimit");
        assert_eq!(
            up.held_by_limit.as_deref(),
            Some(
                "Slurm at delta keeps it pending (AssocMaxWallDurationPerJobLimit): it asks for more than a \
                 per-job limit of its association there"
            )
        );
        j.reason = "Resources".into();
        assert_eq!(update_for(&j, "delta").held_by_limit, None);
        let mut j = job(7, "CANCELLED", 1, 1);
        j.reason = "PartitionTimeLimit".into();
        assert_eq!(update_for(&j, "delta").held_by_limit, None);
    }

    #[test]
    fn terminal_states_keep_slurms_name() {
        let mut j = job(7, "TIMEOUT", 1, 1);
        j.exit_code = Some(0);
        j.signal = Some(15);
        let up = update_for(&j, "alpha");
        assert_eq!((up.state, up.exit_code, up.signal), (Some(JobState::Failed), Some(0), Some(15)));
        assert_eq!(up.reason, "TIMEOUT at alpha");
        let mut j = job(7, "OUT_OF_MEMORY", 1, 1);
        j.reason = "OutOfMemory".into();
        assert_eq!(update_for(&j, "alpha").reason, "OUT_OF_MEMORY at alpha: OutOfMemory");
        let mut j = job(7, "FAILED", 1, 1);
        j.exit_code = Some(3);
        assert_eq!(update_for(&j, "alpha").reason, "");
        let mut j = job(7, "PENDING", 1, 1);
        j.restarts = 2;
        assert_eq!(update_for(&j, "alpha").reason, "requeued 2 time(s) at alpha");
    }

    #[test]
    fn runs_that_died_with_their_nodes_are_told_from_runs_that_ended() {
        let with = |state: &str, description: &str| {
            let mut j = job(7, state, 1, 1);
            j.reason = "JobHeldAdmin".into();
            j.description = description.into();
            j
        };
        let table = [
            (with("NODE_FAIL", ""), Some("NODE_FAIL at alpha")),
            (with("PREEMPTED", ""), Some("PREEMPTED at alpha")),
            (with("BOOT_FAIL", ""), Some("BOOT_FAIL at alpha")),
            (
                with("PENDING", "launch failed requeued held"),
                Some("Slurm at alpha held it after a failed launch (launch failed requeued held)"),
            ),
            (with("PENDING", "job requeued in held state"), None),
            (with("PENDING", ""), None),
            (with("RUNNING", ""), None),
            (with("FAILED", "NonZeroExitCode"), None),
            (with("TIMEOUT", ""), None),
            (with("CANCELLED", "launch failed requeued held"), None),
        ];
        let mut evicted = with("NODE_FAIL", "EvictionByEvictionAPI: Eviction API: evicting");
        evicted.reason = evicted.description.clone();
        assert_eq!(
            died(&evicted, "gamma").as_deref(),
            Some("NODE_FAIL at gamma: EvictionByEvictionAPI: Eviction API: evicting")
        );
        for (j, want) in table {
            assert_eq!(died(&j, "alpha").as_deref(), want, "{} {}", j.raw_state, j.reason);
            assert_eq!(update_for(&j, "alpha").died.as_deref(), want);
        }
    }

    #[test]
    fn an_end_slurm_lost_is_its_kill_only_when_the_sentinel_saw_the_kill_first() {
        use crate::ckpt::NotedEnd;
        let end = |exit_code, signal, after_signal| NotedEnd { exit_code, signal, after_signal };
        // The script's own exit, or a signal to it alone (OOM, its own kill).
        assert_eq!(slurms_kill(&end(Some(1), None, None), false), None);
        assert_eq!(slurms_kill(&end(None, Some(9), None), false), None);
        // Once the kill of the whole step began: that kill.
        assert_eq!(slurms_kill(&end(Some(0), None, Some(15)), false), Some(15));
        assert_eq!(slurms_kill(&end(None, Some(9), Some(15)), false), Some(15));
        assert_eq!(slurms_kill(&end(Some(5), None, Some(9)), false), Some(9));
        // Its user had a signal delivered: the end may be theirs.
        assert_eq!(slurms_kill(&end(Some(0), None, Some(15)), true), None);
    }

    #[test]
    fn a_run_held_after_a_failed_launch_is_judged_by_what_it_left() {
        use crate::ckpt::NotedEnd;
        use LaunchVerdict::*;
        let ex = |c| Some(NotedEnd { exit_code: Some(c), ..Default::default() });
        let sg = |s| Some(NotedEnd { signal: Some(s), ..Default::default() });
        let after = |n: Option<NotedEnd>| n.map(|n| NotedEnd { after_signal: Some(libc::SIGTERM), ..n });
        let e = |ended, user_signalled, started_note, under_lease, out: u64, err: u64, exists| LaunchEvidence {
            ended,
            user_signalled,
            started_note,
            under_lease,
            stdout_bytes: out,
            stderr_bytes: err,
            stdout_exists: exists,
        };
        let started = Started { killed_by: None };
        for (ev, want) in [
            // Its script ended by itself (lease-exec's note): that end is its result.
            (e(ex(0), false, true, true, 10, 0, true), Ended { exit_code: Some(0), signal: None }),
            (e(ex(3), false, true, true, 0, 0, true), Ended { exit_code: Some(3), signal: None }),
            (e(ex(3), true, true, true, 0, 0, true), Ended { exit_code: Some(3), signal: None }),
            // Ended by a signal: its user's (scancel --signal, relayed by
            // this agent) is its end; any other is Slurm's kill of the job
            // it requeued: the run started and did not end by itself.
            (e(sg(9), true, true, true, 0, 0, true), Ended { exit_code: None, signal: Some(9) }),
            (e(sg(15), false, true, true, 0, 0, true), Started { killed_by: Some(15) }),
            (e(sg(9), false, true, true, 40, 0, true), Started { killed_by: Some(9) }),
            // Ended once Slurm's kill of the whole step began (it caught
            // SIGTERM and exited, or its child died of it and it went on
            // to exit): that kill, unless its user had it sent.
            (e(after(ex(5)), false, true, true, 0, 0, true), Started { killed_by: Some(15) }),
            (e(after(sg(9)), false, true, true, 0, 0, true), Started { killed_by: Some(9) }),
            (e(after(ex(0)), true, true, true, 0, 0, true), Ended { exit_code: Some(0), signal: None }),
            // Under its lease: the script starts only after lease-exec's note.
            (e(None, false, true, true, 0, 0, true), started.clone()),
            (e(None, false, false, true, 12, 0, true), started.clone()),
            (e(None, true, true, true, 0, 0, true), started.clone()),
            // lease-exec's own refusal on stderr, slurmstepd's stdout file: nothing ran.
            (e(None, false, false, true, 0, 80, true), NeverStarted),
            (e(None, false, false, true, 0, 0, false), NeverStarted),
            // Without a lease: any trace of a start counts.
            (e(None, false, false, false, 0, 0, true), started.clone()),
            (e(None, false, false, false, 0, 5, false), started.clone()),
            (e(None, false, false, false, 5, 0, false), started.clone()),
            (e(None, false, false, false, 0, 0, false), NeverStarted),
        ] {
            assert_eq!(launch_verdict(&ev), want, "{ev:?}");
        }
    }

    fn assignment(id: &str, epoch: u64) -> Assignment {
        Assignment {
            fleet_job_id: id.into(),
            request: fleet_api::JobRequest::default(),
            origin_restart: 0,
            stdout_base: 0,
            stderr_base: 0,
            epoch,
            resume_from: None,
            resume_copy_to: None,
            resume_bytes: 0,
        }
    }

    #[test]
    fn only_the_newest_placement_of_a_job_in_one_answer_is_submitted() {
        let got = newest_placements(vec![
            assignment("a", 1),
            assignment("b", 4),
            assignment("a", 3),
            assignment("c", 0),
            assignment("a", 2),
            assignment("b", 4),
        ]);
        let got: Vec<(&str, u64)> = got.iter().map(|a| (a.fleet_job_id.as_str(), a.epoch)).collect();
        assert_eq!(got, [("b", 4), ("a", 3), ("c", 0)]);
        assert!(newest_placements(Vec::new()).is_empty());
    }

    #[test]
    fn a_placement_the_fence_calls_stale_is_superseded() {
        use fleet_api::api::{FenceReply, StaleRun};
        let stale = |id: &str, why: &str| StaleRun { fleet_job_id: id.into(), epoch: 1, reason: why.into() };
        let reply = FenceReply { stale: vec![stale("x", "the job is now epoch 2 (assigned at delta)")] };
        assert_eq!(superseded(&reply, "x").as_deref(), Some("the job is now epoch 2 (assigned at delta)"));
        assert_eq!(superseded(&reply, "y"), None);
        assert_eq!(superseded(&FenceReply::default(), "x"), None);
    }

    #[test]
    fn a_forgotten_run_waits_for_its_own_end_then_dies_under_its_lease_or_is_lost() {
        use Forgotten::*;
        let g = FORGOTTEN_GRACE_S;
        // No end noted yet: waited for, leased or not.
        assert_eq!(forgotten_outcome(None, false, true, 0.0), Wait);
        assert_eq!(forgotten_outcome(None, false, false, g - 1.0), Wait);
        // Then: died under its lease (placed again or ended by its claim), else lost.
        assert_eq!(forgotten_outcome(None, false, true, g), Died);
        assert_eq!(forgotten_outcome(None, false, false, g), Lost);
        // Killed by a signal no user sent (an orphan kill at registration): at once.
        assert_eq!(forgotten_outcome(Some(15), false, true, 0.0), Died);
        assert_eq!(forgotten_outcome(Some(9), false, false, 0.0), Lost);
        // Stopped by this agent: reported as it stopped it, never waited for.
        assert_eq!(forgotten_outcome(None, true, true, 0.0), Lost);
        assert_eq!(forgotten_outcome(Some(15), true, true, g), Lost);
    }

    #[test]
    fn a_forgotten_run_is_timed_from_its_first_sighting_until_slurm_knows_it_again() {
        let mut t = Tracker::default();
        assert_eq!(t.forgotten_for("a", 100.0), 0.0);
        assert_eq!(t.forgotten_for("a", 130.0), 30.0);
        assert_eq!(t.forgotten_for("b", 130.0), 0.0, "per run");
        assert!(t.forgotten_for("a", 100.0 + FORGOTTEN_GRACE_S) >= FORGOTTEN_GRACE_S);
        // Seen again (slurmctld answered from a later state): starts over.
        t.known("a");
        assert_eq!(t.forgotten_for("a", 500.0), 0.0);
        assert_eq!(t.forgotten_for("b", 140.0), 10.0);
    }

    #[test]
    fn backoff_is_per_job_and_grows() {
        let mut t = Tracker::default();
        assert!(t.due("a", 0.0));
        assert_eq!(t.failed("a", 0.0), Duration::from_secs(1));
        assert!(!t.due("a", 0.5) && t.due("b", 0.5));
        assert_eq!(t.failed("a", 1.0), Duration::from_secs(2));
        for _ in 0..10 {
            t.failed("a", 1.0);
        }
        assert_eq!(t.failed("a", 1.0), Duration::from_secs(60));
        t.ok("a");
        assert!(t.due("a", 1.0));
    }

    #[test]
    fn recent_work_is_not_repeated() {
        let mut r = Recent::default();
        assert!(r.fresh("cancel:x"));
        assert!(!r.fresh("cancel:x"));
        assert!(r.fresh("cancel:y"));
    }

    /// What the agent sees of a run, pass after pass.
    enum Look {
        /// Slurm's state name, start time, RestartCnt.
        Slurm(&'static str, Option<i64>, u32),
        /// A stream's file is shorter than what was relayed.
        Truncated(Stream),
        /// The relay read new output of a stream.
        Wrote(Stream),
    }

    /// Plays `looks` as the watch pass does (state first, then output);
    /// returns the re-runs counted after each look and the last `why`.
    fn play(looks: &[Look]) -> (Vec<u32>, String) {
        let mut run = Run::default();
        let mut counts = Vec::new();
        for l in looks {
            match l {
                Look::Slurm(state, start, restarts) => {
                    let mut j = NativeJob::new(7, state);
                    j.start_time = *start;
                    j.restarts = *restarts;
                    if state.starts_with("PENDING held") {
                        j = NativeJob::new(7, "PENDING");
                        j.description = "launch failed requeued held".into();
                    }
                    observe_rerun(&mut run, &j);
                    run.restarts = run.restarts.max(j.restarts);
                }
                Look::Truncated(s) => {
                    match s {
                        Stream::Stdout => (run.stdout_base, run.stdout_off) = (run.stdout_base + run.stdout_off, 0),
                        Stream::Stderr => (run.stderr_base, run.stderr_off) = (run.stderr_base + run.stderr_off, 0),
                    }
                    output_restarted(&mut run, *s);
                }
                Look::Wrote(Stream::Stdout) => run.stdout_off += 10,
                Look::Wrote(Stream::Stderr) => run.stderr_off += 10,
            }
            counts.push(run.reruns);
        }
        (counts, run.rerun_why.unwrap_or_default())
    }

    #[test]
    fn a_run_slurm_runs_again_is_counted_once_however_it_shows() {
        use Look::*;
        use Stream::*;
        let table: Vec<(&str, Vec<Look>, Vec<u32>, &str)> = vec![
            (
                "an ordinary run",
                vec![
                    Slurm("PENDING", None, 0),
                    Slurm("RUNNING", Some(100), 0),
                    Wrote(Stdout),
                    Slurm("RUNNING", Some(100), 0),
                    Slurm("COMPLETED", Some(100), 0),
                ],
                vec![0, 0, 0, 0, 0],
                "",
            ),
            // The 2026-12-02 chaos run: slurmctld recovered the job as
            // pending from older state and ran it again, RestartCnt 0; its
            // output restarted when it did.
            (
                "pending after it ran",
                vec![
                    Slurm("RUNNING", Some(100), 0),
                    Wrote(Stdout),
                    Wrote(Stderr),
                    Slurm("PENDING", None, 0),
                    Slurm("PENDING", None, 0),
                    Slurm("RUNNING", Some(124), 0),
                    Truncated(Stdout),
                    Truncated(Stderr),
                    Wrote(Stdout),
                    Slurm("COMPLETED", Some(124), 0),
                ],
                vec![0, 0, 0, 1, 1, 1, 1, 1, 1, 1],
                "went back to pending after it ran, RestartCnt staying 0",
            ),
            // The pending phase fell between two looks: a later start.
            (
                "a later start time",
                vec![
                    Slurm("RUNNING", Some(100), 0),
                    Wrote(Stdout),
                    Slurm("RUNNING", Some(124), 0),
                    Truncated(Stdout),
                    Slurm("RUNNING", Some(124), 0),
                ],
                vec![0, 0, 1, 1, 1],
                "start time 100 → 124",
            ),
            // Only the output says it (no start time: a backend that does
            // not give one); both streams restart with one re-run.
            (
                "its output restarted",
                vec![
                    Slurm("RUNNING", None, 0),
                    Wrote(Stdout),
                    Wrote(Stderr),
                    Truncated(Stdout),
                    Truncated(Stderr),
                    Wrote(Stdout),
                    Wrote(Stderr),
                    Truncated(Stderr),
                    Truncated(Stdout),
                ],
                vec![0, 0, 0, 1, 1, 1, 1, 2, 2],
                "its stderr file restarted",
            ),
            // Ran again and ended between two looks.
            (
                "ended after a second start",
                vec![Slurm("RUNNING", Some(100), 0), Slurm("FAILED", Some(130), 0)],
                vec![0, 1],
                "start time 100 → 130",
            ),
            // scontrol requeue: RestartCnt grows while the first run is
            // still completing (its old start time), then it waits and runs.
            (
                "RestartCnt",
                vec![
                    Slurm("RUNNING", Some(100), 0),
                    Wrote(Stdout),
                    Slurm("COMPLETING", Some(100), 1),
                    Slurm("PENDING", None, 1),
                    Slurm("RUNNING", Some(300), 1),
                    Truncated(Stdout),
                    Slurm("PENDING", None, 2),
                    Slurm("RUNNING", Some(500), 2),
                ],
                vec![0, 0, 1, 1, 1, 1, 2, 2],
                "RestartCnt 1 → 2",
            ),
            // Two requeues between two looks.
            (
                "RestartCnt by two",
                vec![Slurm("RUNNING", Some(100), 0), Slurm("RUNNING", Some(900), 2)],
                vec![0, 2],
                "RestartCnt 0 → 2",
            ),
            // Not re-runs: a suspension, a run cancelled while it waited
            // again (counted as it went back to pending, not twice), and a
            // hold after a failed launch (a dead run, reported as such).
            (
                "suspended",
                vec![Slurm("RUNNING", Some(100), 0), Slurm("SUSPENDED", Some(100), 0), Slurm("RUNNING", Some(100), 0)],
                vec![0, 0, 0],
                "",
            ),
            (
                "cancelled while pending again",
                vec![Slurm("RUNNING", Some(100), 0), Slurm("PENDING", None, 0), Slurm("CANCELLED", Some(200), 0)],
                vec![0, 1, 1],
                "pending after it ran",
            ),
            (
                "held after a failed launch",
                vec![Slurm("RUNNING", Some(100), 0), Slurm("PENDING held", None, 0)],
                vec![0, 0],
                "",
            ),
            // Pending twice before it ever ran, then running: nothing.
            (
                "never ran before",
                vec![Slurm("PENDING", None, 0), Slurm("PENDING", None, 0), Slurm("RUNNING", Some(5), 0)],
                vec![0, 0, 0],
                "",
            ),
        ];
        for (name, looks, want, why) in table {
            let (got, last) = play(&looks);
            assert_eq!(got, want, "{name}");
            assert!(last.contains(why), "{name}: {last:?} lacks {why:?}");
        }
    }
}
