//! The job lifecycle as a pure function: `transition(life, event)` gives
//! the next [`Life`], the [`Effect`]s the store must carry out and the
//! [`Reply`] the caller gets. No I/O, no clock, no database: the store
//! loads the job, calls this, applies the effects and saves.
//!
//! ```text
//! held ──start requested──▶ held (request) ──confirmed──▶ queued ──placed──▶ assigned
//!   │                          │ refused: held                 │ impossible: failed
//!   │                          │                               └ waits: queued
//!   └─ cancel ─▶ cancelled     assigned ──target lost (not submitted)──▶ queued
//! assigned/pending/running ──report──▶ pending ⇄ running (running → pending: a requeue)
//!                                      ──terminal report──▶ completed | failed | cancelled | lost
//! terminal: a terminal report is answered with the stored outcome, any other is a
//! `terminal` conflict.
//! signal: queued for the target while the job is pending or running there (or
//! assigned and reported); held, queued, assigned-not-submitted → conflict;
//! terminal → `terminal` conflict. A signal never changes the state.
//! rerun (a start request with a higher restart count: Slurm requeued the
//! stand-in): terminal or not yet submitted ──▶ held (request), the run's
//! details reset; submitted and still running there → cancelled there
//! first (conflict: ask again once it ended).
//! epochs: every placement (`placed`) starts a new epoch (first 1); a report
//! naming another epoch is a `terminal` conflict (the agent stops its copy).
//! died (the target stayed silent past its grace period, or reported that
//! the run died with its nodes): assigned/pending/running ──resumable──▶
//! queued (a migration: placed again, new epoch) │ not resumable ──▶ failed
//! │ being cancelled ──▶ cancelled; held, queued, terminal: nothing.
//! planned migration (a rebalancing move), a phase of a running job (its
//! state stays running for the stand-in):
//!   running ──move (checkpoints)──▶ checkpointing ──new valid checkpoint──▶ stopping
//!   running ──move (restartable, no checkpoints)──────────────────────────▶ stopping
//!   checkpointing ──deadline missed──▶ stopping (policy: resume from the previous
//!                                     valid checkpoint) │ running (policy: stay)
//!   checkpointing ──target refuses──▶ running (the move is abandoned)
//!   stopping ──the run reports cancelled──▶ queued (migrate: new epoch, placed
//!                                           at the target, resumes there)
//!   either phase: the job ends by itself ──▶ that end; scancel ──▶ cancelled
//!   (checkpointing: cancelled at the target as usual; stopping: the cancel
//!   already under way ends it cancelled); the run dies (its cluster is
//!   silent past its grace period) ──▶ the ordinary dead-run migration.
//! provisioning SLA missed (assigned or pending at its target past the
//! cluster's deadline, another cluster can run it):
//!   assigned, not submitted ──▶ queued (re-placed: new epoch; a late
//!                               submission there is stale and stopped)
//!   assigned (submitted) / pending ──▶ stopping (cancelled there first; its
//!                               end re-places it, as a planned move's does)
//!   running, held, queued, terminal, being cancelled or moved: nothing.
//! re-runs at the target (Slurm ran the job there again: `RestartCnt`, or
//! unseen by Slurm's count, after a controller crash): the target agent's
//! cumulative count for the epoch; what exceeds the count already taken
//! (running → pending reports included) is counted once in `requeues`, in
//! any placed state; the state does not change. A new placement starts
//! the count again.
//! the run's end claimed by its in-job lease client (`POST /end`, current
//! epoch only; the target agent's report stays authoritative):
//!   assigned/pending/running ──end claimed──▶ same state (claim recorded)
//!   a silent cluster past its grace period: a claimed run is not moved
//!   (`silent_run`: wait for its agent), and past the end-wait bound
//!   ──claimed end stands──▶ completed (exit 0) | failed | cancelled
//!   (being cancelled); held, queued: conflict; terminal: nothing.
//! early placement (start latency, docs/failover.md "Start latency"): a job
//! forwarded at sbatch time whose stand-in has no dependency, hold or
//! begin time is placed at once, its target submits it, and its script
//! waits at its first in-job lease until the origin confirms the stand-in
//! runs (the phase `early`, beside the state the target reports):
//!   held ──place early──▶ assigned (early: waiting) ─report─▶ pending/running (waiting)
//!   waiting ──start requested──▶ (request recorded, origin woken)
//!   waiting ──confirmed──▶ the same state, early: no (the lease is granted)
//!   waiting ──refused──▶ waiting (request dropped)
//!   waiting ──wait bound passed──▶ held (not submitted; a late submission
//!        is stale) │ withdrawing (submitted: cancelled there first)
//!   withdrawing ──its end reported──▶ held (placed when the stand-in starts)
//!   waiting/withdrawing ──the run died, ended without being cancelled, or
//!        its target was lost before submitting──▶ held (nothing ran)
//!   scancel: as for any assigned/pending/running job (the lease says stale).
//!   No signal, move or SLA re-placement while early.
//! ```

use fleet_api::JobState;

/// What the lifecycle needs to know about a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Life {
    pub state: JobState,
    /// The stand-in (its Slurm job id) the start request named, or that
    /// was confirmed.
    pub origin_job_id: Option<u64>,
    /// A start request waits for the origin agent's confirmation.
    pub start_requested: bool,
    /// The target agent has reported the job (it was submitted there).
    pub submitted: bool,
    pub cancel_requested: bool,
    /// Cancelled here, but the target reported a submission afterwards.
    pub remote_cancel_pending: bool,
    /// The stand-in's restart count of the current run (0: first run).
    pub restart: u32,
    /// The current placement's epoch (0: never placed).
    pub epoch: u64,
    /// A planned migration under way (a running job only).
    pub moving: Moving,
    /// Re-runs at the target counted in this epoch (running → pending
    /// reports and the agent's [`Event::TargetReran`] counts).
    pub target_reruns: u32,
    /// Placed before the origin confirmed the stand-in runs.
    pub early: Early,
}

/// The phase of a job placed early (before its origin confirmed that the
/// stand-in runs): its run at the target exists, its script does not run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Early {
    /// Not placed early, or the origin confirmed: the ordinary lifecycle.
    #[default]
    No,
    /// Placed early: the run's first lease is answered "wait".
    Waiting,
    /// The wait bound passed after the target submitted it: the run is
    /// being cancelled there; its end puts the job back to held.
    Withdrawing,
}

/// The phase of a planned migration (a rebalancing move) of a running job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Moving {
    #[default]
    No,
    /// Signalled (when it declares a checkpoint signal); waiting for a new
    /// valid checkpoint in the catalog, up to a deadline.
    Checkpointing,
    /// The run at the source is being cancelled; once it reports its end
    /// the job is placed again (new epoch) and resumes at the target.
    Stopping,
}

impl Default for Life {
    /// A job just forwarded: held, nothing requested.
    fn default() -> Self {
        Life {
            state: JobState::Held,
            origin_job_id: None,
            start_requested: false,
            submitted: false,
            cancel_requested: false,
            remote_cancel_pending: false,
            restart: 0,
            epoch: 0,
            moving: Moving::No,
            target_reruns: 0,
            early: Early::No,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The stand-in's `POST /start` naming its Slurm job id and its restart
    /// count (`SLURM_RESTART_COUNT`; above the job's: a rerun).
    RequestStart { origin_job_id: u64, restart: u32 },
    /// The origin agent's `POST /confirm_start`.
    ConfirmStart { origin_job_id: u64, started: bool },
    /// Placement picked a cluster.
    Placed,
    /// Placement found only silent clusters that could run it.
    PlacementWaits,
    /// No cluster of the fleet can run it.
    PlacementImpossible,
    /// The target went silent before submitting it.
    TargetLost,
    /// The stand-in, the origin agent or the admin cancels it.
    Cancel,
    /// The target agent's status report, about placement `epoch` (`None`:
    /// an older agent that does not say).
    Report { state: Option<JobState>, remote_job_id: Option<u64>, epoch: Option<u64> },
    /// The run is dead without having ended by itself: its cluster stayed
    /// silent past its grace period (`epoch: None`, the meta-scheduler's
    /// own finding), or its target reported it died (NODE_FAIL, PREEMPTED,
    /// a failed launch, its lease). `resumable`: the job has a valid
    /// checkpoint or may restart from scratch.
    Died { resumable: bool, epoch: Option<u64> },
    /// The stand-in, the origin agent or the admin signals the job
    /// (`POST /signal`).
    Signal,
    /// A planned migration starts (auto rebalancing or an approved
    /// proposal). `checkpoints`: the job checkpoints, so a fresh one is
    /// waited for; otherwise (a restartable job) it is stopped at once.
    MoveStart { checkpoints: bool },
    /// A valid checkpoint newer than the move's start is in the catalog
    /// (and the target can still take the job).
    CheckpointTaken,
    /// No new checkpoint before the deadline. `fallback`: the policy says
    /// move anyway (resuming from the previous valid checkpoint, or from
    /// the start when restartable); otherwise the job stays.
    CheckpointMissed { fallback: bool },
    /// The target can no longer take the job (full, unhealthy, excluded)
    /// before the run was stopped: the move is abandoned.
    MoveRefused,
    /// The job has waited at its target past the cluster's provisioning
    /// deadline without running, and another cluster can run it.
    SlaMissed,
    /// The target agent's count of the times Slurm ran the current run
    /// again (`StatusUpdate.reruns`, cumulative for the epoch), with the
    /// report's epoch.
    TargetReran { seen: u32, epoch: Option<u64> },
    /// The run's in-job lease client says its script ended (a claim,
    /// about placement `epoch`): recorded, the state does not change.
    EndClaimed { epoch: u64 },
    /// The run claimed its end and its cluster stayed silent past its
    /// grace period plus the end-wait bound: the job ends as claimed
    /// (`success`: exit code 0, no signal).
    ClaimedEndStands { success: bool },
    /// Placement picked a cluster for a job just forwarded whose stand-in
    /// is still to be scheduled at the origin (early placement).
    PlaceEarly,
    /// The origin has not confirmed the stand-in within the early wait
    /// bound (`[start] early_submit_wait_s`).
    EarlyTimeout,
}

/// What the store does besides saving the new [`Life`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Run placement (which feeds back a placement event).
    Place,
    /// Record the start request (`start_requested_at`).
    RecordStartRequest,
    /// Drop the start request; the refusal is logged.
    DropStartRequest,
    /// Wake the origin's long-poll (a start to confirm).
    WakeOrigin,
    /// Wake the target's long-poll (something to submit or cancel).
    WakeTarget,
    /// Running → pending at the target: count it, forget `running_since`.
    Requeue,
    /// Now running: note since when (if not yet).
    MarkRunning,
    /// Take the report's details (remote id, node list, reason).
    TakeReport,
    /// Take the report's outcome (exit code, signal, final output sizes).
    RecordOutcome,
    /// A terminal report for a terminal job: compare and log if it disagrees.
    CompareOutcome,
    /// Queue the signal for the target agent (handed out once).
    QueueSignal,
    /// A rerun: forget the previous run's target, remote id, outcome and
    /// final sizes, count it, and start the new run's output where the
    /// streams end now.
    Rerun,
    /// A new placement: the epoch grew (the store notes where it is).
    NewEpoch,
    /// A migration: the run at the target is dead; forget it (remote id,
    /// node list), remember the cluster it left (its reports are stale
    /// from now on), count it, note it on the job's stderr and start the
    /// next run's output where the streams end now.
    Migrate,
    /// The run died and the job can neither resume from a checkpoint nor
    /// restart: it fails with the reason.
    FailUnresumable,
    /// A planned move starts: note it, and signal the job for a checkpoint
    /// when it declares a signal.
    SignalCheckpoint,
    /// A planned move stops the run at its source: the target agent
    /// cancels it (its cancel work), the job is not cancelled.
    StopRun,
    /// A planned move was abandoned; the job stays (the reason is noted).
    AbandonMove,
    /// The stopped run ended: the planned move continues as a migration
    /// to the chosen target (with [`Effect::Migrate`] and [`Effect::Place`]).
    PlannedMove,
    /// The provisioning SLA was missed before the target submitted the
    /// job: forget the assignment (the cluster's late reports are stale),
    /// note it, and place the job again (with [`Effect::Place`]).
    SlaReplace,
    /// Slurm at the target ran the job again beyond what was counted:
    /// add the new re-runs (`target_reruns` grew by that many) to
    /// `requeues` and note how they were seen. The run is not reset (its
    /// lease and running time go on: it may be running again already).
    CountReruns,
    /// Keep the run's claim that its script ended (epoch, exit status).
    RecordEndClaim,
    /// The job ends with the claimed outcome; a note on its stderr says
    /// that output after that point was not relayed.
    FinishFromClaim,
    /// Placed early: note when (the wait bound's clock).
    EarlyPlaced,
    /// The origin confirmed the stand-in of a job placed early: its run's
    /// lease is granted from now (its first-lease clock starts now).
    OpenGate,
    /// Back to held from an early placement: forget the placement (the
    /// cluster's later reports of that epoch are stale) and note why.
    EarlyFallback,
}

/// How the caller is answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Ok,
    BadRequest(String),
    Conflict(String),
    /// The job is terminal here; the report cannot apply any more.
    TerminalConflict(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub life: Life,
    pub effects: Vec<Effect>,
    pub reply: Reply,
}

fn ok(life: Life, effects: Vec<Effect>) -> Outcome {
    Outcome { life, effects, reply: Reply::Ok }
}

fn refuse(life: &Life, reply: Reply) -> Outcome {
    Outcome { life: life.clone(), effects: Vec::new(), reply }
}

fn id_text(id: Option<u64>) -> String {
    id.map_or("-".to_string(), |i| i.to_string())
}

/// The next state of `life` after `event`.
pub fn transition(life: &Life, event: &Event) -> Outcome {
    use JobState as S;
    let mut next = life.clone();
    let cur = life.state;
    match *event {
        Event::RequestStart { origin_job_id, restart } if restart > life.restart => {
            rerun(life, next, origin_job_id, restart)
        }
        Event::RequestStart { origin_job_id, .. } => {
            // Held, or placed early: the origin agent still has to confirm.
            if cur != S::Held && life.early == Early::No {
                return ok(next, vec![]);
            }
            if origin_job_id == 0 {
                return refuse(
                    life,
                    Reply::BadRequest(
                        "origin_job_id is required: the stand-in's Slurm job id, which the origin agent checks".into(),
                    ),
                );
            }
            if life.start_requested {
                // The first request stands until it is answered.
                return ok(next, vec![]);
            }
            next.start_requested = true;
            next.origin_job_id = Some(origin_job_id);
            ok(next, vec![Effect::RecordStartRequest, Effect::WakeOrigin])
        }
        Event::ConfirmStart { origin_job_id, started } => {
            if cur != S::Held && life.early == Early::No {
                if cur.is_terminal() || (started && life.origin_job_id == Some(origin_job_id)) {
                    return ok(next, vec![]);
                }
                return refuse(
                    life,
                    Reply::Conflict(format!(
                        "the job is already {cur} (stand-in {}); it cannot be confirmed for stand-in {origin_job_id}",
                        id_text(life.origin_job_id)
                    )),
                );
            }
            if !life.start_requested {
                return refuse(life, Reply::Conflict("the job has no start request to confirm".into()));
            }
            if life.origin_job_id != Some(origin_job_id) {
                return refuse(
                    life,
                    Reply::Conflict(format!(
                        "the start request names stand-in {}, not {origin_job_id}",
                        id_text(life.origin_job_id)
                    )),
                );
            }
            if life.early == Early::Withdrawing {
                // Its early run is being cancelled: the request stands, and
                // is confirmed again once the job is back to held.
                return ok(next, vec![]);
            }
            next.start_requested = false;
            if started && life.early == Early::Waiting {
                next.early = Early::No;
                ok(next, vec![Effect::OpenGate])
            } else if started {
                next.state = S::Queued;
                ok(next, vec![Effect::Place])
            } else {
                next.origin_job_id = None;
                ok(next, vec![Effect::DropStartRequest])
            }
        }
        Event::Placed if cur == S::Queued => {
            next.state = S::Assigned;
            next.epoch += 1;
            next.target_reruns = 0;
            ok(next, vec![Effect::NewEpoch, Effect::WakeTarget])
        }
        Event::PlacementImpossible if cur == S::Queued => {
            next.state = S::Failed;
            ok(next, vec![])
        }
        Event::Placed | Event::PlacementWaits | Event::PlacementImpossible => ok(next, vec![]),
        Event::TargetLost => {
            if cur == S::Assigned && !life.submitted && life.early != Early::No {
                return early_fallback(life, next);
            }
            if cur == S::Assigned && !life.submitted {
                next.state = S::Queued;
                return ok(next, vec![Effect::Place]);
            }
            ok(next, vec![])
        }
        Event::Cancel => {
            if cur.is_terminal() {
                return ok(next, vec![]);
            }
            next.cancel_requested = true;
            if life.moving == Moving::Checkpointing {
                next.moving = Moving::No;
            }
            if matches!(cur, S::Held | S::Queued) || (cur == S::Assigned && !life.submitted) {
                next.state = S::Cancelled;
                next.start_requested = false;
                next.early = Early::No;
                return ok(next, vec![]);
            }
            ok(next, vec![Effect::WakeTarget])
        }
        Event::Report { state, remote_job_id, epoch } => match stale(life, epoch) {
            Some(reply) => refuse(life, reply),
            None => report(life, next, state, remote_job_id),
        },
        Event::Died { resumable, epoch } => match stale(life, epoch) {
            Some(reply) => refuse(life, reply),
            // Its script never ran: back to the ordinary start.
            None if life.early != Early::No
                && !life.cancel_requested
                && matches!(cur, S::Assigned | S::Pending | S::Running) =>
            {
                early_fallback(life, next)
            }
            None => died(life, next, resumable),
        },
        Event::Signal => signal(life),
        Event::MoveStart { checkpoints } => move_start(life, next, checkpoints),
        Event::CheckpointTaken if life.moving == Moving::Checkpointing && cur == S::Running => {
            next.moving = Moving::Stopping;
            ok(next, vec![Effect::StopRun, Effect::WakeTarget])
        }
        Event::CheckpointMissed { fallback } if life.moving == Moving::Checkpointing && cur == S::Running => {
            if fallback {
                next.moving = Moving::Stopping;
                ok(next, vec![Effect::StopRun, Effect::WakeTarget])
            } else {
                next.moving = Moving::No;
                ok(next, vec![Effect::AbandonMove])
            }
        }
        Event::MoveRefused if life.moving == Moving::Checkpointing => {
            next.moving = Moving::No;
            ok(next, vec![Effect::AbandonMove])
        }
        Event::CheckpointTaken | Event::CheckpointMissed { .. } | Event::MoveRefused => ok(next, vec![]),
        Event::SlaMissed => sla_missed(life, next),
        Event::TargetReran { seen, epoch } => match stale(life, epoch) {
            Some(reply) => refuse(life, reply),
            None => target_reran(life, next, seen),
        },
        Event::EndClaimed { epoch } => match stale(life, Some(epoch)) {
            Some(reply) => refuse(life, reply),
            None => end_claimed(life, next),
        },
        Event::ClaimedEndStands { success } => {
            if !matches!(cur, S::Assigned | S::Pending | S::Running) {
                return ok(next, vec![]);
            }
            next.state = if life.cancel_requested {
                S::Cancelled
            } else if success {
                S::Completed
            } else {
                S::Failed
            };
            next.moving = Moving::No;
            next.remote_cancel_pending = false;
            ok(next, vec![Effect::FinishFromClaim])
        }
        Event::PlaceEarly => {
            let fresh = cur == S::Held
                && !life.start_requested
                && !life.cancel_requested
                && life.early == Early::No
                && life.restart == 0;
            if !fresh {
                return ok(next, vec![]);
            }
            next.state = S::Assigned;
            next.epoch += 1;
            next.submitted = false;
            next.early = Early::Waiting;
            ok(next, vec![Effect::NewEpoch, Effect::EarlyPlaced, Effect::WakeTarget])
        }
        Event::EarlyTimeout if life.early == Early::Waiting && !life.cancel_requested => {
            if life.submitted {
                next.early = Early::Withdrawing;
                ok(next, vec![Effect::WakeTarget])
            } else {
                early_fallback(life, next)
            }
        }
        Event::EarlyTimeout => ok(next, vec![]),
    }
}

/// The run says its script ended (see [`Event::EndClaimed`]).
fn end_claimed(life: &Life, next: Life) -> Outcome {
    use JobState as S;
    match life.state {
        S::Assigned | S::Pending | S::Running => ok(next, vec![Effect::RecordEndClaim]),
        cur if cur.is_terminal() => ok(next, vec![]),
        cur => refuse(life, Reply::Conflict(format!("the job is {cur}: it has no run whose end could be claimed"))),
    }
}

/// What happens to a run whose cluster is silent past its grace period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SilentRun {
    /// The ordinary dead-run path ([`Event::Died`]): moved, failed or
    /// ended cancelled.
    Died,
    /// Its script claimed its end in this epoch: not moved (it would run
    /// its work again); its agent's report is waited for.
    Wait,
    /// Claimed, and the cluster stayed silent past the end-wait bound:
    /// the claimed end stands ([`Event::ClaimedEndStands`]).
    Finish,
}

/// A run at a cluster silent for `past_grace_s` beyond its grace period.
/// `claimed`: its script claimed its end in the job's current epoch.
/// `end_wait_s`: how long such a run waits for its agent (0: not at all,
/// the claim stands at once).
pub fn silent_run(life: &Life, claimed: bool, past_grace_s: f64, end_wait_s: f64) -> SilentRun {
    let claimable = matches!(life.state, JobState::Assigned | JobState::Pending | JobState::Running);
    if !claimed || !claimable {
        return SilentRun::Died;
    }
    if past_grace_s >= end_wait_s {
        SilentRun::Finish
    } else {
        SilentRun::Wait
    }
}

/// The target's count of re-runs in this epoch: what it adds to the count
/// taken is counted once; a repeat or a lower count (running → pending was
/// counted first) changes nothing. Only a placed job has re-runs.
fn target_reran(life: &Life, mut next: Life, seen: u32) -> Outcome {
    use JobState as S;
    if matches!(life.state, S::Held | S::Queued) || seen <= life.target_reruns {
        return ok(next, vec![]);
    }
    next.target_reruns = seen;
    ok(next, vec![Effect::CountReruns])
}

/// A job placed early goes back to held (its run's script never ran):
/// the placement is forgotten, and the job starts the ordinary way when
/// the origin confirms its stand-in (a start request already made stands).
fn early_fallback(life: &Life, mut next: Life) -> Outcome {
    next.state = JobState::Held;
    next.submitted = false;
    next.remote_cancel_pending = false;
    next.moving = Moving::No;
    next.early = Early::No;
    let mut effects = vec![Effect::EarlyFallback];
    if life.start_requested {
        effects.push(Effect::WakeOrigin);
    }
    ok(next, effects)
}

/// The job waited past its target's provisioning deadline: re-placed at
/// once when the target has not submitted it, else stopped there first
/// (the planned move's stopping phase: never two copies).
fn sla_missed(life: &Life, mut next: Life) -> Outcome {
    use JobState as S;
    let waiting = matches!(life.state, S::Assigned | S::Pending);
    if !waiting || life.cancel_requested || life.moving != Moving::No || life.early != Early::No {
        return ok(next, vec![]);
    }
    if life.state == S::Assigned && !life.submitted {
        next.state = S::Queued;
        return ok(next, vec![Effect::SlaReplace, Effect::Place]);
    }
    next.moving = Moving::Stopping;
    ok(next, vec![Effect::StopRun, Effect::WakeTarget])
}

/// A planned migration of a running job starts (see the diagram above).
fn move_start(life: &Life, mut next: Life, checkpoints: bool) -> Outcome {
    use JobState as S;
    let cur = life.state;
    if cur.is_terminal() {
        return refuse(life, Reply::TerminalConflict(format!("the job is already {cur}; there is nothing to move")));
    }
    if cur != S::Running || !life.submitted {
        return refuse(life, Reply::Conflict(format!("the job is {cur}: only a running job is moved")));
    }
    if life.cancel_requested {
        return refuse(life, Reply::Conflict("the job is being cancelled".into()));
    }
    if life.moving != Moving::No {
        return refuse(life, Reply::Conflict("the job is already being moved".into()));
    }
    if life.early != Early::No {
        return refuse(life, Reply::Conflict("the job was placed early and its stand-in has not started".into()));
    }
    if checkpoints {
        next.moving = Moving::Checkpointing;
        ok(next, vec![Effect::SignalCheckpoint, Effect::WakeTarget])
    } else {
        next.moving = Moving::Stopping;
        ok(next, vec![Effect::StopRun, Effect::WakeTarget])
    }
}

/// The stand-in was requeued by Slurm at the origin and runs again (its
/// restart count grew): the job runs again from the start, as a requeued
/// native job does. A run still going at its target is cancelled first.
fn rerun(life: &Life, mut next: Life, origin_job_id: u64, restart: u32) -> Outcome {
    use JobState as S;
    if origin_job_id == 0 {
        return refuse(life, Reply::BadRequest("origin_job_id is required for a rerun".into()));
    }
    if let Some(o) = life.origin_job_id.filter(|o| *o != origin_job_id) {
        return refuse(
            life,
            Reply::Conflict(format!(
                "the job's stand-in is job {o}; a restart of job {origin_job_id} does not rerun it"
            )),
        );
    }
    let cur = life.state;
    let running_there = !cur.is_terminal() && life.submitted;
    if running_there || life.remote_cancel_pending {
        let effects = if life.cancel_requested || !running_there { vec![] } else { vec![Effect::WakeTarget] };
        next.cancel_requested |= running_there;
        return Outcome {
            life: next,
            effects,
            reply: Reply::Conflict(format!(
                "restart {restart} of stand-in {origin_job_id}: the previous run is being cancelled at its target; \
                 the job runs again once it has ended"
            )),
        };
    }
    next.state = S::Held;
    next.origin_job_id = Some(origin_job_id);
    next.start_requested = true;
    next.submitted = false;
    next.cancel_requested = false;
    next.restart = restart;
    next.moving = Moving::No;
    ok(next, vec![Effect::Rerun, Effect::RecordStartRequest, Effect::WakeOrigin])
}

/// A report about another placement than the current one. Jobs placed
/// before epochs existed (epoch 0) accept every report from their target.
fn stale(life: &Life, epoch: Option<u64>) -> Option<Reply> {
    let e = epoch?;
    (life.epoch != 0 && e != life.epoch).then(|| {
        Reply::TerminalConflict(format!(
            "epoch {e} is stale: the job's current placement is epoch {}; stop this copy",
            life.epoch
        ))
    })
}

/// The run died where it was placed (see [`Event::Died`]).
fn died(life: &Life, mut next: Life, resumable: bool) -> Outcome {
    use JobState as S;
    if !matches!(life.state, S::Assigned | S::Pending | S::Running) {
        return ok(next, vec![]);
    }
    next.submitted = false;
    next.remote_cancel_pending = false;
    next.moving = Moving::No;
    if life.cancel_requested {
        next.state = S::Cancelled;
        return ok(next, vec![]);
    }
    if resumable {
        next.state = S::Queued;
        return ok(next, vec![Effect::Migrate, Effect::Place]);
    }
    next.state = S::Failed;
    ok(next, vec![Effect::FailUnresumable])
}

/// What the meta-scheduler knows of the current run's in-job lease.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FirstLease {
    /// Its target submitted it under `fleet-ckpt lease-exec` (the report's
    /// `job_lease`): the first thing it does is ask for a lease.
    pub under_lease: bool,
    /// It asked for (and got) a lease in this epoch.
    pub asked: bool,
    /// Seconds since its target first reported it running (`None`: never).
    pub running_for_s: Option<f64>,
}

/// A run that never started although its target reports it running: it
/// runs under its in-job lease, has reported running for `limit_s` (> 0)
/// and never asked for its lease (Slurm lost the launch and keeps the job
/// RUNNING with no process). The store then treats it as died in its
/// epoch ([`Event::Died`]): moved when resumable, failed otherwise.
/// A job being moved or cancelled is left to that path.
pub fn launch_lost(life: &Life, f: FirstLease, limit_s: f64) -> bool {
    life.state == JobState::Running
        && life.moving == Moving::No
        && life.early == Early::No
        && !life.cancel_requested
        && f.under_lease
        && !f.asked
        && limit_s > 0.0
        && f.running_for_s.is_some_and(|t| t >= limit_s)
}

/// A signal reaches a job only where Slurm runs it (or holds it pending):
/// the target's agent delivers it with `scancel --signal`.
fn signal(life: &Life) -> Outcome {
    use JobState as S;
    let not_yet = |why: &str| {
        refuse(life, Reply::Conflict(format!("{why}: no cluster runs it yet, so there is nothing to signal")))
    };
    match life.state {
        S::Held => not_yet("the job is held until its stand-in starts and the origin agent confirms the start"),
        _ if life.early != Early::No => not_yet(
            "the job is held until its stand-in starts and the origin agent confirms the start (its run at the target waits)",
        ),
        S::Queued => not_yet("the job is queued for placement"),
        S::Assigned if !life.submitted => not_yet("the job is assigned to its target but not submitted there yet"),
        S::Assigned | S::Pending | S::Running => ok(life.clone(), vec![Effect::QueueSignal, Effect::WakeTarget]),
        cur => refuse(life, Reply::TerminalConflict(format!("the job is already {cur}; there is nothing to signal"))),
    }
}

fn report(life: &Life, mut next: Life, new: Option<JobState>, remote_job_id: Option<u64>) -> Outcome {
    use JobState as S;
    let cur = life.state;
    if let Some(new) = new.filter(|n| matches!(n, S::Held | S::Queued | S::Assigned)) {
        return refuse(life, Reply::BadRequest(format!("a target agent cannot report state {new}")));
    }
    if matches!(cur, S::Held | S::Queued) {
        return refuse(life, Reply::Conflict(format!("the job is {cur}: it is not assigned to any cluster")));
    }
    // Cancelled here before the agent reported a submission: with its
    // remote id the agent is told to cancel it there.
    if cur == S::Cancelled && !life.submitted && new.is_none_or(|s| !s.is_terminal()) {
        let msg =
            Reply::TerminalConflict("the job was cancelled before it was submitted; cancel it at the target".into());
        if remote_job_id.is_some() {
            next.submitted = true;
            next.remote_cancel_pending = true;
            return Outcome { life: next, effects: vec![Effect::TakeReport, Effect::WakeTarget], reply: msg };
        }
        return refuse(life, msg);
    }
    if cur.is_terminal() {
        return match new {
            Some(n) if n.is_terminal() => {
                next.remote_cancel_pending = false;
                next.submitted = true;
                ok(next, vec![Effect::CompareOutcome])
            }
            Some(n) => refuse(life, Reply::TerminalConflict(format!("the job is already {cur}; {n} does not apply"))),
            None => refuse(life, Reply::TerminalConflict(format!("the job is already {cur}"))),
        };
    }
    // Placed early, it ended without being cancelled (its run at the
    // target could not start, or was withdrawn): its script never ran, so
    // the job goes back to held rather than end.
    if life.early != Early::No && !life.cancel_requested && new.is_some_and(|n| n.is_terminal()) {
        return early_fallback(life, next);
    }
    // The run a planned move stopped has ended cancelled: the job moves
    // (a new placement at the target, which resumes it).
    if life.moving == Moving::Stopping && new == Some(S::Cancelled) && !life.cancel_requested {
        next.state = S::Queued;
        next.submitted = false;
        next.moving = Moving::No;
        return ok(next, vec![Effect::PlannedMove, Effect::Migrate, Effect::Place]);
    }
    next.submitted = true;
    let mut effects = vec![Effect::TakeReport];
    if new.is_some_and(|n| n.is_terminal()) {
        // It ended by itself (or was cancelled) meanwhile: no move.
        next.moving = Moving::No;
        next.early = Early::No;
    }
    if let Some(n) = new {
        if cur == S::Running && n == S::Pending {
            next.target_reruns = next.target_reruns.saturating_add(1);
            effects.push(Effect::Requeue);
        }
        if n == S::Running {
            effects.push(Effect::MarkRunning);
        }
        if n.is_terminal() {
            effects.push(Effect::RecordOutcome);
        }
        next.state = n;
    }
    ok(next, effects)
}

#[cfg(test)]
mod tests {
    use super::*;
    use JobState as S;

    const STATES: [JobState; 9] =
        [S::Held, S::Queued, S::Assigned, S::Pending, S::Running, S::Completed, S::Failed, S::Cancelled, S::Lost];

    fn letter(s: JobState) -> char {
        match s {
            S::Held => 'H',
            S::Queued => 'Q',
            S::Assigned => 'A',
            S::Pending => 'P',
            S::Running => 'R',
            S::Completed => 'C',
            S::Failed => 'F',
            S::Cancelled => 'X',
            S::Lost => 'L',
        }
    }

    /// A job in `state` as it usually is there: held with a start request
    /// from stand-in 7, submitted once the target reported it.
    fn typical(state: JobState) -> Life {
        Life {
            state,
            origin_job_id: Some(7),
            start_requested: state == S::Held,
            submitted: !matches!(state, S::Held | S::Queued | S::Assigned),
            cancel_requested: false,
            remote_cancel_pending: false,
            restart: 0,
            epoch: 1,
            moving: Moving::No,
            target_reruns: 0,
            early: Early::No,
        }
    }

    /// `<state letter>` (reply Ok) or `<state letter>!<400|409|409t>`.
    fn cell(o: &Outcome) -> String {
        let code = match &o.reply {
            Reply::Ok => "",
            Reply::BadRequest(_) => "!400",
            Reply::Conflict(_) => "!409",
            Reply::TerminalConflict(_) => "!409t",
        };
        format!("{}{code}", letter(o.life.state))
    }

    fn report(state: Option<JobState>) -> Event {
        Event::Report { state, remote_job_id: Some(3), epoch: None }
    }

    /// Every event against every state; cells in the order of `STATES`
    /// (H Q A P R C F X L).
    #[test]
    fn every_state_times_every_event() {
        let table: Vec<(Event, &str)> = vec![
            (Event::RequestStart { origin_job_id: 7, restart: 0 }, "H Q A P R C F X L"),
            (Event::RequestStart { origin_job_id: 0, restart: 0 }, "H!400 Q A P R C F X L"),
            // A rerun: the stand-in restarted after a requeue.
            (Event::RequestStart { origin_job_id: 7, restart: 1 }, "H H H P!409 R!409 H H H H"),
            (
                Event::RequestStart { origin_job_id: 8, restart: 1 },
                "H!409 Q!409 A!409 P!409 R!409 C!409 F!409 X!409 L!409",
            ),
            (
                Event::RequestStart { origin_job_id: 0, restart: 1 },
                "H!400 Q!400 A!400 P!400 R!400 C!400 F!400 X!400 L!400",
            ),
            (Event::ConfirmStart { origin_job_id: 7, started: true }, "Q Q A P R C F X L"),
            (Event::ConfirmStart { origin_job_id: 7, started: false }, "H Q!409 A!409 P!409 R!409 C F X L"),
            (Event::ConfirmStart { origin_job_id: 8, started: true }, "H!409 Q!409 A!409 P!409 R!409 C F X L"),
            (Event::Placed, "H A A P R C F X L"),
            (Event::PlacementWaits, "H Q A P R C F X L"),
            (Event::PlacementImpossible, "H F A P R C F X L"),
            (Event::TargetLost, "H Q Q P R C F X L"),
            (Event::Cancel, "X X X P R C F X L"),
            (report(Some(S::Pending)), "H!409 Q!409 P P P C!409t F!409t X!409t L!409t"),
            (report(Some(S::Running)), "H!409 Q!409 R R R C!409t F!409t X!409t L!409t"),
            (report(Some(S::Completed)), "H!409 Q!409 C C C C F X L"),
            (report(Some(S::Failed)), "H!409 Q!409 F F F C F X L"),
            (report(Some(S::Lost)), "H!409 Q!409 L L L C F X L"),
            (report(Some(S::Queued)), "H!400 Q!400 A!400 P!400 R!400 C!400 F!400 X!400 L!400"),
            (report(None), "H!409 Q!409 A P R C!409t F!409t X!409t L!409t"),
            (Event::Signal, "H!409 Q!409 A!409 P R C!409t F!409t X!409t L!409t"),
            // Reports of the current epoch, of a stale one (a terminal
            // conflict wherever the job was placed: that copy stops).
            (
                Event::Report { state: Some(S::Running), remote_job_id: Some(3), epoch: Some(1) },
                "H!409 Q!409 R R R C!409t F!409t X!409t L!409t",
            ),
            (
                Event::Report { state: Some(S::Running), remote_job_id: Some(3), epoch: Some(2) },
                "H!409t Q!409t A!409t P!409t R!409t C!409t F!409t X!409t L!409t",
            ),
            (
                Event::Report { state: Some(S::Completed), remote_job_id: Some(3), epoch: Some(0) },
                "H!409t Q!409t A!409t P!409t R!409t C!409t F!409t X!409t L!409t",
            ),
            // The run died: moved when it can resume or restart, else failed.
            (Event::Died { resumable: true, epoch: None }, "H Q Q Q Q C F X L"),
            (Event::Died { resumable: false, epoch: None }, "H Q F F F C F X L"),
            (Event::Died { resumable: true, epoch: Some(1) }, "H Q Q Q Q C F X L"),
            (
                Event::Died { resumable: true, epoch: Some(7) },
                "H!409t Q!409t A!409t P!409t R!409t C!409t F!409t X!409t L!409t",
            ),
            // Planned moves start only from running; the other move events
            // do nothing to a job that is not being moved.
            (Event::MoveStart { checkpoints: true }, "H!409 Q!409 A!409 P!409 R C!409t F!409t X!409t L!409t"),
            (Event::MoveStart { checkpoints: false }, "H!409 Q!409 A!409 P!409 R C!409t F!409t X!409t L!409t"),
            (Event::CheckpointTaken, "H Q A P R C F X L"),
            (Event::CheckpointMissed { fallback: true }, "H Q A P R C F X L"),
            (Event::CheckpointMissed { fallback: false }, "H Q A P R C F X L"),
            (Event::MoveRefused, "H Q A P R C F X L"),
            // The provisioning SLA: only a job waiting at its target moves
            // (typical: assigned is not submitted yet, pending is).
            (Event::SlaMissed, "H Q Q P R C F X L"),
            // Slurm at the target ran it again: counted, the state stays
            // (terminal too: a re-run seen with the final report); a stale
            // epoch's count is that copy's.
            (Event::TargetReran { seen: 1, epoch: Some(1) }, "H Q A P R C F X L"),
            (Event::TargetReran { seen: 0, epoch: Some(1) }, "H Q A P R C F X L"),
            (
                Event::TargetReran { seen: 1, epoch: Some(2) },
                "H!409t Q!409t A!409t P!409t R!409t C!409t F!409t X!409t L!409t",
            ),
            // A run claims its end: recorded where a run can be, the state
            // stays (the agent's report decides); a stale epoch stops it.
            (Event::EndClaimed { epoch: 1 }, "H!409 Q!409 A P R C F X L"),
            (Event::EndClaimed { epoch: 2 }, "H!409t Q!409t A!409t P!409t R!409t C!409t F!409t X!409t L!409t"),
            // The claim stands (its cluster never came back).
            (Event::ClaimedEndStands { success: true }, "H Q C C C C F X L"),
            (Event::ClaimedEndStands { success: false }, "H Q F F F C F X L"),
            // Early placement: only a held job without a start request
            // (typical held jobs have one); the wait bound: no early run.
            (Event::PlaceEarly, "H Q A P R C F X L"),
            (Event::EarlyTimeout, "H Q A P R C F X L"),
        ];
        for (event, want) in table {
            let got: Vec<String> = STATES.iter().map(|s| cell(&transition(&typical(*s), &event))).collect();
            assert_eq!(got.join(" "), want, "{event:?}");
        }
    }

    /// `<state letter><phase>` with phase `c` (checkpointing), `s`
    /// (stopping) or nothing, then the reply code as in [`cell`].
    fn move_cell(o: &Outcome) -> String {
        let phase = match o.life.moving {
            Moving::No => "",
            Moving::Checkpointing => "c",
            Moving::Stopping => "s",
        };
        let c = cell(o);
        let (state, code) = c.split_at(1);
        format!("{state}{phase}{code}")
    }

    /// Every event against a running job in each phase of a planned
    /// move: no move, checkpointing, stopping (cells in that order).
    #[test]
    fn every_move_phase_times_every_event() {
        let phases = [Moving::No, Moving::Checkpointing, Moving::Stopping];
        let table: Vec<(Event, &str)> = vec![
            (Event::MoveStart { checkpoints: true }, "Rc Rc!409 Rs!409"),
            (Event::MoveStart { checkpoints: false }, "Rs Rc!409 Rs!409"),
            (Event::CheckpointTaken, "R Rs Rs"),
            // Deadline missed: move anyway (previous checkpoint) or stay, per policy.
            (Event::CheckpointMissed { fallback: true }, "R Rs Rs"),
            (Event::CheckpointMissed { fallback: false }, "R R Rs"),
            // The target refuses: abandoned before the stop, too late after.
            (Event::MoveRefused, "R R Rs"),
            // scancel: checkpointing ends (cancelled at the target as usual);
            // stopping keeps going, its end is then a cancel.
            (Event::Cancel, "R R Rs"),
            (report(Some(S::Running)), "R Rc Rs"),
            (report(Some(S::Pending)), "P Pc Ps"),
            // The stopped run ends cancelled: queued for its new placement.
            (report(Some(S::Cancelled)), "X X Q"),
            // It ended by itself meanwhile: that is its end.
            (report(Some(S::Completed)), "C C C"),
            (report(Some(S::Failed)), "F F F"),
            (report(Some(S::Lost)), "L L L"),
            // Its cluster died mid-move: the ordinary dead-run migration.
            (Event::Died { resumable: true, epoch: None }, "Q Q Q"),
            (Event::Died { resumable: false, epoch: None }, "F F F"),
            (Event::Died { resumable: true, epoch: Some(9) }, "R!409t Rc!409t Rs!409t"),
            (Event::Signal, "R Rc Rs"),
            (Event::Placed, "R Rc Rs"),
            (Event::TargetLost, "R Rc Rs"),
            (Event::RequestStart { origin_job_id: 7, restart: 0 }, "R Rc Rs"),
            (Event::RequestStart { origin_job_id: 7, restart: 1 }, "R!409 Rc!409 Rs!409"),
            // Running already: the provisioning SLA is met, nothing to do.
            (Event::SlaMissed, "R Rc Rs"),
            // The run ended by itself mid-move: noted; if its end stands,
            // the move is over.
            (Event::EndClaimed { epoch: 1 }, "R Rc Rs"),
            (Event::ClaimedEndStands { success: true }, "C C C"),
        ];
        for (event, want) in table {
            let got: Vec<String> = phases
                .iter()
                .map(|m| move_cell(&transition(&Life { moving: *m, ..typical(S::Running) }, &event)))
                .collect();
            assert_eq!(got.join(" "), want, "{event:?}");
        }
    }

    #[test]
    fn a_planned_move_checkpoints_stops_and_moves() {
        use Effect as E;
        let running = typical(S::Running);
        let ckpting = Life { moving: Moving::Checkpointing, ..running.clone() };
        let stopping = Life { moving: Moving::Stopping, ..running.clone() };
        check(
            running.clone(),
            Event::MoveStart { checkpoints: true },
            ckpting.clone(),
            &[E::SignalCheckpoint, E::WakeTarget],
            "ok",
        );
        check(
            running.clone(),
            Event::MoveStart { checkpoints: false },
            stopping.clone(),
            &[E::StopRun, E::WakeTarget],
            "ok",
        );
        check(ckpting.clone(), Event::MoveStart { checkpoints: true }, ckpting.clone(), &[], "already being moved");
        check(
            typical(S::Pending),
            Event::MoveStart { checkpoints: true },
            typical(S::Pending),
            &[],
            "only a running job is moved",
        );
        let cancelling = Life { cancel_requested: true, ..running.clone() };
        check(cancelling.clone(), Event::MoveStart { checkpoints: true }, cancelling, &[], "being cancelled");
        check(ckpting.clone(), Event::CheckpointTaken, stopping.clone(), &[E::StopRun, E::WakeTarget], "ok");
        check(
            ckpting.clone(),
            Event::CheckpointMissed { fallback: true },
            stopping.clone(),
            &[E::StopRun, E::WakeTarget],
            "ok",
        );
        check(ckpting.clone(), Event::CheckpointMissed { fallback: false }, running.clone(), &[E::AbandonMove], "ok");
        check(ckpting.clone(), Event::MoveRefused, running.clone(), &[E::AbandonMove], "ok");
        check(stopping.clone(), Event::MoveRefused, stopping.clone(), &[], "ok");
        // The stopped run's end: a migration to a new placement (new epoch).
        let moved = Life { state: S::Queued, submitted: false, ..running.clone() };
        check(
            stopping.clone(),
            report(Some(S::Cancelled)),
            moved.clone(),
            &[E::PlannedMove, E::Migrate, E::Place],
            "ok",
        );
        check(
            moved,
            Event::Placed,
            Life { state: S::Assigned, epoch: 2, submitted: false, ..running.clone() },
            &[E::NewEpoch, E::WakeTarget],
            "ok",
        );
        // scancel while stopping: the cancel under way ends it cancelled.
        let both = Life { cancel_requested: true, ..stopping.clone() };
        check(stopping.clone(), Event::Cancel, both.clone(), &[E::WakeTarget], "ok");
        check(
            both,
            report(Some(S::Cancelled)),
            Life { state: S::Cancelled, cancel_requested: true, ..running.clone() },
            &[E::TakeReport, E::RecordOutcome],
            "ok",
        );
        // scancel while checkpointing: the move is dropped, the cancel goes to the target.
        check(
            ckpting.clone(),
            Event::Cancel,
            Life { cancel_requested: true, ..running.clone() },
            &[E::WakeTarget],
            "ok",
        );
        // It completed by itself while checkpointing: completed, no move.
        check(ckpting, report(Some(S::Completed)), typical(S::Completed), &[E::TakeReport, E::RecordOutcome], "ok");
        // A stale report (an older epoch) does not end the stop.
        let stale = Event::Report { state: Some(S::Cancelled), remote_job_id: Some(3), epoch: Some(0) };
        check(stopping.clone(), stale, stopping, &[], "stale");
    }

    /// A job placed early: assigned and not submitted yet, or submitted
    /// (pending, running) at its target; no start request yet.
    fn early(state: JobState, submitted: bool, phase: Early) -> Life {
        Life { state, submitted, epoch: 1, early: phase, ..Life::default() }
    }

    /// `<state letter><phase>` with phase `w` (waiting), `d` (withdrawing)
    /// or nothing, then the reply code as in [`cell`].
    fn early_cell(o: &Outcome) -> String {
        let phase = match o.life.early {
            Early::No => "",
            Early::Waiting => "w",
            Early::Withdrawing => "d",
        };
        let c = cell(o);
        let (state, code) = c.split_at(1);
        format!("{state}{phase}{code}")
    }

    /// Every event against a job placed early, in each of its states and
    /// phases: assigned (not submitted), pending, running, all waiting;
    /// pending and running withdrawing (cells in that order).
    #[test]
    fn every_early_phase_times_every_event() {
        let lives = [
            early(S::Assigned, false, Early::Waiting),
            early(S::Pending, true, Early::Waiting),
            early(S::Running, true, Early::Waiting),
            early(S::Pending, true, Early::Withdrawing),
            early(S::Running, true, Early::Withdrawing),
        ];
        let table: Vec<(Event, &str)> = vec![
            // The stand-in asks to start: recorded, the origin confirms.
            (Event::RequestStart { origin_job_id: 7, restart: 0 }, "Aw Pw Rw Pd Rd"),
            (Event::RequestStart { origin_job_id: 0, restart: 0 }, "Aw!400 Pw!400 Rw!400 Pd!400 Rd!400"),
            (Event::ConfirmStart { origin_job_id: 7, started: true }, "Aw!409 Pw!409 Rw!409 Pd!409 Rd!409"),
            (Event::PlaceEarly, "Aw Pw Rw Pd Rd"),
            // The wait bound: never submitted → held; submitted → withdrawn first.
            (Event::EarlyTimeout, "H Pd Rd Pd Rd"),
            // scancel: as for any job there (the lease says stale meanwhile).
            (Event::Cancel, "X Pw Rw Pd Rd"),
            (report(Some(S::Pending)), "Pw Pw Pw Pd Pd"),
            (report(Some(S::Running)), "Rw Rw Rw Rd Rd"),
            // It ended without being cancelled: nothing ran, back to held.
            (report(Some(S::Failed)), "H H H H H"),
            (report(Some(S::Cancelled)), "H H H H H"),
            (report(Some(S::Completed)), "H H H H H"),
            (report(None), "Aw Pw Rw Pd Rd"),
            (
                Event::Report { state: Some(S::Running), remote_job_id: Some(3), epoch: Some(2) },
                "Aw!409t Pw!409t Rw!409t Pd!409t Rd!409t",
            ),
            (Event::Died { resumable: true, epoch: None }, "H H H H H"),
            (Event::Died { resumable: false, epoch: Some(1) }, "H H H H H"),
            (Event::Signal, "Aw!409 Pw!409 Rw!409 Pd!409 Rd!409"),
            (Event::MoveStart { checkpoints: true }, "Aw!409 Pw!409 Rw!409 Pd!409 Rd!409"),
            (Event::SlaMissed, "Aw Pw Rw Pd Rd"),
            (Event::TargetLost, "H Pw Rw Pd Rd"),
            (Event::Placed, "Aw Pw Rw Pd Rd"),
            (Event::CheckpointTaken, "Aw Pw Rw Pd Rd"),
        ];
        for (event, want) in table {
            let got: Vec<String> = lives.iter().map(|l| early_cell(&transition(l, &event))).collect();
            assert_eq!(got.join(" "), want, "{event:?}");
        }
    }

    #[test]
    fn an_early_placement_waits_for_the_origin_then_runs_or_falls_back() {
        use Effect as E;
        let held = Life::default();
        let waiting = early(S::Assigned, false, Early::Waiting);
        check(held.clone(), Event::PlaceEarly, waiting.clone(), &[E::NewEpoch, E::EarlyPlaced, E::WakeTarget], "ok");
        // Not for a job whose stand-in already asked, nor a rerun, nor twice.
        let asked = Life { origin_job_id: Some(7), start_requested: true, ..held.clone() };
        check(asked.clone(), Event::PlaceEarly, asked, &[], "ok");
        let rerun = Life { restart: 1, ..held.clone() };
        check(rerun.clone(), Event::PlaceEarly, rerun, &[], "ok");
        // Submitted and running there (lease-exec waits); the stand-in starts.
        let running = early(S::Running, true, Early::Waiting);
        let requested = Life { origin_job_id: Some(7), start_requested: true, ..running.clone() };
        check(
            running.clone(),
            Event::RequestStart { origin_job_id: 7, restart: 0 },
            requested.clone(),
            &[E::RecordStartRequest, E::WakeOrigin],
            "ok",
        );
        // The first request stands.
        check(requested.clone(), Event::RequestStart { origin_job_id: 9, restart: 0 }, requested.clone(), &[], "ok");
        check(
            requested.clone(),
            Event::ConfirmStart { origin_job_id: 8, started: true },
            requested.clone(),
            &[],
            "names stand-in 7, not 8",
        );
        // Confirmed: the gate opens, the job is simply running.
        let open = Life { start_requested: false, early: Early::No, ..requested.clone() };
        check(
            requested.clone(),
            Event::ConfirmStart { origin_job_id: 7, started: true },
            open.clone(),
            &[E::OpenGate],
            "ok",
        );
        // A repeat of the confirmation changes nothing.
        check(open.clone(), Event::ConfirmStart { origin_job_id: 7, started: true }, open.clone(), &[], "ok");
        // Refused: the request is dropped, the run keeps waiting.
        check(
            requested.clone(),
            Event::ConfirmStart { origin_job_id: 7, started: false },
            running.clone(),
            &[E::DropStartRequest],
            "ok",
        );
        // The wait bound: withdrawn (cancelled there), then back to held
        // with its start request, which the origin is asked to confirm.
        let withdrawing = Life { early: Early::Withdrawing, ..requested.clone() };
        check(requested.clone(), Event::EarlyTimeout, withdrawing.clone(), &[E::WakeTarget], "ok");
        check(
            withdrawing.clone(),
            Event::ConfirmStart { origin_job_id: 7, started: true },
            withdrawing.clone(),
            &[],
            "ok",
        );
        let back = Life { state: S::Held, submitted: false, early: Early::No, ..requested.clone() };
        check(withdrawing.clone(), report(Some(S::Cancelled)), back.clone(), &[E::EarlyFallback, E::WakeOrigin], "ok");
        // Then the ordinary start: confirmed, queued, placed in a new epoch.
        let queued = Life { state: S::Queued, start_requested: false, ..back.clone() };
        check(back, Event::ConfirmStart { origin_job_id: 7, started: true }, queued.clone(), &[E::Place], "ok");
        let placed = Life { state: S::Assigned, epoch: 2, ..queued.clone() };
        check(queued, Event::Placed, placed, &[E::NewEpoch, E::WakeTarget], "ok");
        // Never submitted when the bound passed: held at once.
        check(waiting.clone(), Event::EarlyTimeout, Life { epoch: 1, ..held.clone() }, &[E::EarlyFallback], "ok");
        // scancel while it waits at the target: cancelled there as usual,
        // and its end is the job's end.
        let cancelling = Life { cancel_requested: true, ..running.clone() };
        check(running.clone(), Event::Cancel, cancelling.clone(), &[E::WakeTarget], "ok");
        check(cancelling.clone(), Event::EarlyTimeout, cancelling.clone(), &[], "ok");
        check(
            cancelling.clone(),
            report(Some(S::Cancelled)),
            Life { state: S::Cancelled, early: Early::No, ..cancelling.clone() },
            &[E::TakeReport, E::RecordOutcome],
            "ok",
        );
        // A waiting run never counts as a lost launch (it waits on purpose).
        let f = FirstLease { under_lease: true, asked: false, running_for_s: Some(1e6) };
        assert!(!launch_lost(&running, f, 24.0));
        assert!(launch_lost(&open, f, 24.0));
    }

    fn check(life: Life, event: Event, want: Life, effects: &[Effect], reply: &str) {
        let o = transition(&life, &event);
        assert_eq!(o.life, want, "{life:?} + {event:?}");
        assert_eq!(o.effects, effects, "{life:?} + {event:?}");
        let r = match &o.reply {
            Reply::Ok => "ok".to_string(),
            Reply::BadRequest(m) | Reply::Conflict(m) | Reply::TerminalConflict(m) => m.clone(),
        };
        assert!(r.contains(reply), "{life:?} + {event:?}: {r:?} lacks {reply:?}");
    }

    #[test]
    fn details_and_effects() {
        use Effect as E;
        let fresh = Life { state: S::Held, ..Default::default() };
        let asked = Life { origin_job_id: Some(7), start_requested: true, ..fresh.clone() };
        check(
            fresh.clone(),
            Event::RequestStart { origin_job_id: 7, restart: 0 },
            asked.clone(),
            &[E::RecordStartRequest, E::WakeOrigin],
            "ok",
        );
        check(asked.clone(), Event::RequestStart { origin_job_id: 9, restart: 0 }, asked.clone(), &[], "ok");
        check(
            fresh.clone(),
            Event::ConfirmStart { origin_job_id: 7, started: true },
            fresh.clone(),
            &[],
            "no start request",
        );
        check(
            asked.clone(),
            Event::ConfirmStart { origin_job_id: 8, started: true },
            asked.clone(),
            &[],
            "names stand-in 7, not 8",
        );
        let queued = Life { state: S::Queued, origin_job_id: Some(7), ..fresh.clone() };
        check(
            asked.clone(),
            Event::ConfirmStart { origin_job_id: 7, started: true },
            queued.clone(),
            &[E::Place],
            "ok",
        );
        check(
            asked.clone(),
            Event::ConfirmStart { origin_job_id: 7, started: false },
            fresh.clone(),
            &[E::DropStartRequest],
            "ok",
        );
        let assigned = Life { state: S::Assigned, epoch: 1, ..queued.clone() };
        check(queued.clone(), Event::Placed, assigned.clone(), &[E::NewEpoch, E::WakeTarget], "ok");
        // Placed again: the epoch grows.
        let requeued = Life { state: S::Queued, ..assigned.clone() };
        check(assigned.clone(), Event::TargetLost, requeued.clone(), &[E::Place], "ok");
        check(requeued, Event::Placed, Life { epoch: 2, ..assigned.clone() }, &[E::NewEpoch, E::WakeTarget], "ok");
        // Submitted already: the target keeps it, a cancel goes to it.
        let submitted = Life { submitted: true, ..assigned.clone() };
        check(submitted.clone(), Event::TargetLost, submitted.clone(), &[], "ok");
        check(
            submitted.clone(),
            Event::Cancel,
            Life { cancel_requested: true, ..submitted.clone() },
            &[E::WakeTarget],
            "ok",
        );
        check(
            asked.clone(),
            Event::Cancel,
            Life { state: S::Cancelled, cancel_requested: true, start_requested: false, ..asked.clone() },
            &[],
            "ok",
        );
        // Reports.
        let running = Life { state: S::Running, ..submitted.clone() };
        let pending = Life { state: S::Pending, ..submitted.clone() };
        check(
            running.clone(),
            report(Some(S::Pending)),
            Life { target_reruns: 1, ..pending.clone() },
            &[E::TakeReport, E::Requeue],
            "ok",
        );
        check(pending.clone(), report(Some(S::Running)), running.clone(), &[E::TakeReport, E::MarkRunning], "ok");
        check(assigned.clone(), report(None), Life { submitted: true, ..assigned.clone() }, &[E::TakeReport], "ok");
        let done = Life { state: S::Completed, ..running.clone() };
        check(running.clone(), report(Some(S::Completed)), done.clone(), &[E::TakeReport, E::RecordOutcome], "ok");
        check(done.clone(), report(Some(S::Failed)), done.clone(), &[E::CompareOutcome], "ok");
        check(done.clone(), report(Some(S::Running)), done.clone(), &[], "already completed; running does not apply");
        // Cancelled before the target reported it: told to cancel it there.
        let gone = Life { state: S::Cancelled, cancel_requested: true, ..queued.clone() };
        let told = Life { submitted: true, remote_cancel_pending: true, ..gone.clone() };
        check(
            gone.clone(),
            report(Some(S::Pending)),
            told.clone(),
            &[E::TakeReport, E::WakeTarget],
            "cancel it at the target",
        );
        check(
            gone.clone(),
            Event::Report { state: Some(S::Pending), remote_job_id: None, epoch: None },
            gone.clone(),
            &[],
            "cancel it at the target",
        );
        check(
            told.clone(),
            report(Some(S::Cancelled)),
            Life { remote_cancel_pending: false, ..told.clone() },
            &[E::CompareOutcome],
            "ok",
        );
    }

    /// Re-runs at the target are counted once each, however often and in
    /// whichever order the agent's count and running → pending arrive.
    #[test]
    fn re_runs_at_the_target_count_once_each() {
        use Effect as E;
        let reran = |seen| Event::TargetReran { seen, epoch: Some(1) };
        let running = typical(S::Running);
        let once = Life { target_reruns: 1, ..running.clone() };
        // Seen only by the agent (output restarted, a new start time):
        // counted, the job keeps running.
        check(running.clone(), reran(1), once.clone(), &[E::CountReruns], "ok");
        // The same count again (a repeated report, an agent restart): nothing.
        check(once.clone(), reran(1), once.clone(), &[], "ok");
        check(once.clone(), reran(0), once.clone(), &[], "ok");
        // Two more at once (reports lost meanwhile): both, in one effect.
        check(once.clone(), reran(3), Life { target_reruns: 3, ..running.clone() }, &[E::CountReruns], "ok");
        // Running → pending counts it first; the agent's count of the same
        // re-run that comes with the report adds nothing.
        let pending = Life { state: S::Pending, target_reruns: 1, ..running.clone() };
        check(running.clone(), report(Some(S::Pending)), pending.clone(), &[E::TakeReport, E::Requeue], "ok");
        check(pending.clone(), reran(1), pending.clone(), &[], "ok");
        // A pending job never seen running (the report was lost): the
        // agent's count is what says it ran.
        let p0 = typical(S::Pending);
        check(p0.clone(), reran(1), Life { target_reruns: 1, ..p0.clone() }, &[E::CountReruns], "ok");
        // Seen with the final report: counted, the outcome stands.
        let done = typical(S::Completed);
        check(done.clone(), reran(1), Life { target_reruns: 1, ..done.clone() }, &[E::CountReruns], "ok");
        // Not placed: nothing to count. A stale epoch: that copy stops.
        check(typical(S::Queued), reran(1), typical(S::Queued), &[], "ok");
        check(once.clone(), Event::TargetReran { seen: 2, epoch: Some(2) }, once.clone(), &[], "epoch 2 is stale");
        // A new placement counts from 0 again.
        let queued = Life { state: S::Queued, target_reruns: 3, ..running.clone() };
        check(
            queued,
            Event::Placed,
            Life { state: S::Assigned, epoch: 2, target_reruns: 0, ..running.clone() },
            &[E::NewEpoch, E::WakeTarget],
            "ok",
        );
    }

    #[test]
    fn a_requeued_stand_in_reruns_the_job() {
        use Effect as E;
        let rerun = |restart| Event::RequestStart { origin_job_id: 7, restart };
        let asked1 = Life {
            state: S::Held,
            origin_job_id: Some(7),
            start_requested: true,
            restart: 1,
            epoch: 1,
            ..Default::default()
        };
        let reset = [E::Rerun, E::RecordStartRequest, E::WakeOrigin];
        // Ended (the proxy cancelled the run when Slurm requeued it, or it had
        // finished): held again with a start request for restart 1.
        for s in [S::Completed, S::Failed, S::Cancelled, S::Lost] {
            let done = Life { cancel_requested: s == S::Cancelled, ..typical(s) };
            check(done, rerun(1), asked1.clone(), &reset, "ok");
        }
        // Never submitted anywhere: simply held again.
        check(typical(S::Queued), rerun(1), asked1.clone(), &reset, "ok");
        check(typical(S::Assigned), rerun(1), asked1.clone(), &reset, "ok");
        // Still running at its target (the proxy died before it could
        // cancel): cancelled there first, once; asked again later.
        let running = typical(S::Running);
        let cancelling = Life { cancel_requested: true, ..running.clone() };
        check(running, rerun(1), cancelling.clone(), &[E::WakeTarget], "previous run is being cancelled");
        check(cancelling.clone(), rerun(1), cancelling.clone(), &[], "previous run is being cancelled");
        // Cancelled here before the target reported it: not until it is gone there.
        let told = Life { remote_cancel_pending: true, cancel_requested: true, ..typical(S::Cancelled) };
        check(told.clone(), rerun(1), told, &[], "previous run is being cancelled");
        // The same restart again (the proxy asks again, or a stale request):
        // no second rerun, the ordinary start rules apply.
        let r1 = Life { state: S::Running, restart: 1, ..typical(S::Running) };
        check(r1.clone(), rerun(1), r1.clone(), &[], "ok");
        let c1 = Life { state: S::Completed, restart: 1, ..typical(S::Completed) };
        check(c1.clone(), rerun(1), c1.clone(), &[], "ok");
        check(c1.clone(), rerun(0), c1, &[], "ok");
        // The next requeue reruns it again.
        let f1 = Life { restart: 1, ..typical(S::Failed) };
        check(f1, rerun(2), Life { restart: 2, ..asked1.clone() }, &reset, "ok");
        // Another stand-in cannot rerun it.
        let done = typical(S::Completed);
        check(
            done.clone(),
            Event::RequestStart { origin_job_id: 8, restart: 1 },
            done,
            &[],
            "stand-in is job 7; a restart of job 8",
        );
    }

    #[test]
    fn a_dead_run_migrates_fails_or_ends_cancelled() {
        use Effect as E;
        let died = |resumable| Event::Died { resumable, epoch: None };
        for s in [S::Assigned, S::Pending, S::Running] {
            let at = Life { submitted: true, ..typical(s) };
            // Resumable: queued for a new placement, the old run forgotten.
            let moved = Life { state: S::Queued, submitted: false, ..at.clone() };
            check(at.clone(), died(true), moved.clone(), &[E::Migrate, E::Place], "ok");
            // The next placement is a new epoch.
            check(
                moved,
                Event::Placed,
                Life { state: S::Assigned, epoch: 2, ..typical(S::Assigned) },
                &[E::NewEpoch, E::WakeTarget],
                "ok",
            );
            // Neither checkpoint nor restartable: failed, with the reason.
            let failed = Life { state: S::Failed, submitted: false, ..at.clone() };
            check(at.clone(), died(false), failed, &[E::FailUnresumable], "ok");
            // Being cancelled anyway: it ends cancelled, nothing moves.
            let cancelling = Life { cancel_requested: true, ..at.clone() };
            let cancelled = Life { state: S::Cancelled, submitted: false, ..cancelling.clone() };
            check(cancelling.clone(), died(true), cancelled.clone(), &[], "ok");
            check(cancelling, died(false), cancelled, &[], "ok");
            // Reported by a copy of an older epoch: refused, nothing changes.
            let old = Event::Died { resumable: true, epoch: Some(0) };
            check(at.clone(), old, at.clone(), &[], "epoch 0 is stale: the job's current placement is epoch 1");
        }
        // A job placed before epochs existed takes every report of its target.
        let legacy = Life { epoch: 0, ..typical(S::Running) };
        let o =
            transition(&legacy, &Event::Report { state: Some(S::Completed), remote_job_id: Some(3), epoch: Some(4) });
        assert_eq!((o.life.state, o.reply), (S::Completed, Reply::Ok));
    }

    #[test]
    fn a_missed_provisioning_sla_re_places_or_stops_first() {
        use Effect as E;
        // Not submitted yet: re-placed at once (a new epoch follows).
        let assigned = typical(S::Assigned);
        let queued = Life { state: S::Queued, ..assigned.clone() };
        check(assigned.clone(), Event::SlaMissed, queued.clone(), &[E::SlaReplace, E::Place], "ok");
        check(queued, Event::Placed, Life { epoch: 2, ..assigned.clone() }, &[E::NewEpoch, E::WakeTarget], "ok");
        // Submitted there (pending, or assigned and reported): cancelled
        // there first; its end is the planned move's, a new placement.
        for s in [S::Pending, S::Assigned] {
            let at = Life { submitted: true, ..typical(s) };
            let stopping = Life { moving: Moving::Stopping, ..at.clone() };
            check(at.clone(), Event::SlaMissed, stopping.clone(), &[E::StopRun, E::WakeTarget], "ok");
            // Repeated by the next sweep: nothing more.
            check(stopping.clone(), Event::SlaMissed, stopping.clone(), &[], "ok");
            // It started meanwhile: the stop under way goes on (one copy).
            let started = Life { state: S::Running, ..stopping.clone() };
            check(stopping.clone(), report(Some(S::Running)), started.clone(), &[E::TakeReport, E::MarkRunning], "ok");
            let moved = Life { state: S::Queued, submitted: false, moving: Moving::No, ..at.clone() };
            check(started, report(Some(S::Cancelled)), moved.clone(), &[E::PlannedMove, E::Migrate, E::Place], "ok");
            check(stopping.clone(), report(Some(S::Cancelled)), moved, &[E::PlannedMove, E::Migrate, E::Place], "ok");
            // scancel meanwhile: the cancel ends it cancelled, no re-placement.
            let both = Life { cancel_requested: true, ..stopping.clone() };
            check(stopping.clone(), Event::Cancel, both.clone(), &[E::WakeTarget], "ok");
            let cancelled = Life { state: S::Cancelled, moving: Moving::No, ..both.clone() };
            check(both, report(Some(S::Cancelled)), cancelled, &[E::TakeReport, E::RecordOutcome], "ok");
            // It ended by itself meanwhile: that is its end.
            let failed = Life { state: S::Failed, moving: Moving::No, ..stopping.clone() };
            check(stopping, report(Some(S::Failed)), failed, &[E::TakeReport, E::RecordOutcome], "ok");
        }
        // Being cancelled, or a planned move under way: nothing.
        let cancelling = Life { cancel_requested: true, ..typical(S::Pending) };
        check(cancelling.clone(), Event::SlaMissed, cancelling, &[], "ok");
        let ckpting = Life { moving: Moving::Checkpointing, ..typical(S::Pending) };
        check(ckpting.clone(), Event::SlaMissed, ckpting, &[], "ok");
    }

    #[test]
    fn signals_reach_only_jobs_at_a_target_and_change_nothing() {
        use Effect as E;
        let queue = [E::QueueSignal, E::WakeTarget];
        let at = |state, submitted| Life { state, submitted, ..typical(state) };
        check(at(S::Held, false), Event::Signal, at(S::Held, false), &[], "held until its stand-in starts");
        check(at(S::Queued, false), Event::Signal, at(S::Queued, false), &[], "queued for placement");
        check(at(S::Assigned, false), Event::Signal, at(S::Assigned, false), &[], "not submitted there yet");
        // Reported without a state: it exists at the target.
        check(at(S::Assigned, true), Event::Signal, at(S::Assigned, true), &queue, "ok");
        check(at(S::Pending, true), Event::Signal, at(S::Pending, true), &queue, "ok");
        check(at(S::Running, true), Event::Signal, at(S::Running, true), &queue, "ok");
        // Being cancelled there: it still runs until Slurm ends it, as a native job does.
        let cancelling = Life { cancel_requested: true, ..at(S::Running, true) };
        check(cancelling.clone(), Event::Signal, cancelling, &queue, "ok");
        for s in [S::Completed, S::Failed, S::Cancelled, S::Lost] {
            check(at(s, true), Event::Signal, at(s, true), &[], &format!("already {s}; there is nothing to signal"));
        }
    }

    #[test]
    fn a_run_that_never_asks_for_its_lease_never_started() {
        // (state, moving, cancel requested, under lease, asked, running for) -> lost
        let running = Life { state: JobState::Running, submitted: true, epoch: 2, ..Life::default() };
        let lease = |under_lease, asked, running_for_s| FirstLease { under_lease, asked, running_for_s };
        let cases: &[(Life, FirstLease, bool)] = &[
            (running.clone(), lease(true, false, Some(24.0)), true),
            (running.clone(), lease(true, false, Some(90.0)), true),
            (running.clone(), lease(true, false, Some(23.9)), false),
            (running.clone(), lease(true, false, None), false),
            (running.clone(), lease(true, true, Some(90.0)), false),
            (running.clone(), lease(false, false, Some(90.0)), false),
            (Life { state: JobState::Pending, ..running.clone() }, lease(true, false, Some(90.0)), false),
            (Life { state: JobState::Completed, ..running.clone() }, lease(true, false, Some(90.0)), false),
            (Life { moving: Moving::Stopping, ..running.clone() }, lease(true, false, Some(90.0)), false),
            (Life { cancel_requested: true, ..running.clone() }, lease(true, false, Some(90.0)), false),
        ];
        for (life, f, want) in cases {
            assert_eq!(launch_lost(life, *f, 24.0), *want, "{life:?} {f:?}");
        }
        assert!(!launch_lost(&running, lease(true, false, Some(1e9)), 0.0), "first_lease_s = 0: off");
        // Then the ordinary dead-run path, in the run's epoch: moved when
        // resumable, failed with the reason otherwise.
        let o = transition(&running, &Event::Died { resumable: true, epoch: Some(2) });
        assert_eq!((o.life.state, o.effects.clone()), (JobState::Queued, vec![Effect::Migrate, Effect::Place]));
        let o = transition(&running, &Event::Died { resumable: false, epoch: Some(2) });
        assert_eq!((o.life.state, o.effects.clone()), (JobState::Failed, vec![Effect::FailUnresumable]));
    }

    #[test]
    fn a_run_that_claimed_its_end_is_not_moved_and_its_claim_stands_only_past_the_bound() {
        use Effect as E;
        let running = typical(S::Running);
        check(running.clone(), Event::EndClaimed { epoch: 1 }, running.clone(), &[E::RecordEndClaim], "ok");
        check(running.clone(), Event::EndClaimed { epoch: 3 }, running.clone(), &[], "epoch 3 is stale");
        check(typical(S::Queued), Event::EndClaimed { epoch: 1 }, typical(S::Queued), &[], "no run whose end");
        // The agent reported first: nothing more to do.
        check(typical(S::Completed), Event::EndClaimed { epoch: 1 }, typical(S::Completed), &[], "ok");
        let ended = |state| Life { state, ..running.clone() };
        check(
            running.clone(),
            Event::ClaimedEndStands { success: true },
            ended(S::Completed),
            &[E::FinishFromClaim],
            "ok",
        );
        check(
            running.clone(),
            Event::ClaimedEndStands { success: false },
            ended(S::Failed),
            &[E::FinishFromClaim],
            "ok",
        );
        let cancelling = Life { cancel_requested: true, remote_cancel_pending: true, ..running.clone() };
        check(
            cancelling.clone(),
            Event::ClaimedEndStands { success: true },
            Life { state: S::Cancelled, remote_cancel_pending: false, ..cancelling },
            &[E::FinishFromClaim],
            "ok",
        );
        let stopping = Life { moving: Moving::Stopping, ..running.clone() };
        check(stopping, Event::ClaimedEndStands { success: true }, ended(S::Completed), &[E::FinishFromClaim], "ok");

        // A silent cluster past its grace period: (life, claimed, seconds past grace, end wait) -> what.
        use SilentRun as W;
        for (life, claimed, past, wait, want) in [
            (typical(S::Running), false, 0.0, 300.0, W::Died),
            (typical(S::Running), false, 1e6, 300.0, W::Died),
            (typical(S::Running), true, 0.0, 300.0, W::Wait),
            (typical(S::Running), true, 299.9, 300.0, W::Wait),
            (typical(S::Running), true, 300.0, 300.0, W::Finish),
            (typical(S::Running), true, 0.0, 0.0, W::Finish),
            (typical(S::Pending), true, 10.0, 300.0, W::Wait),
            (typical(S::Assigned), true, 10.0, 300.0, W::Wait),
            // Not a run any more: the claim does not matter.
            (typical(S::Completed), true, 10.0, 300.0, W::Died),
            (typical(S::Queued), true, 10.0, 300.0, W::Died),
        ] {
            assert_eq!(silent_run(&life, claimed, past, wait), want, "{:?} claimed={claimed} past={past}", life.state);
        }
    }
}
